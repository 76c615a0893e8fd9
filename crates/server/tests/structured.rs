//! Structured output and tool calls end to end: `damascus serve` on the default model and on
//! the real Gemma 3 270M (a base model: no chat template in its GGUF, so the built-in Gemma turn
//! format), driven by the real `openai` Python client (tools/server_structured_test.py): 20 runs per check at
//! temperature 0.8, every reply parsed and validated with `jsonschema`. Skipped, with a message,
//! when python3, `openai`, `pydantic` or `jsonschema` is missing.

use std::sync::Arc;

use damascus_model::{LoadOptions, Model};
use damascus_server::ServerConfig;
use damascus_tokenizer::Tokenizer;

#[test]
fn openai_structured_output_and_tools() {
    let path = damascus_hub::default_model_path().expect("default model");
    check(&path, "smollm2-structured");
}

#[test]
fn openai_structured_output_and_tools_on_gemma3() {
    let path = damascus_hub::known_model_path("gemma3-270m").expect("Gemma 3 270M");
    check(&path, "gemma3-structured");
}

/// Serves `path` as `id` and runs every check of the Python script against it.
fn check(path: &std::path::Path, id: &str) {
    let has = std::process::Command::new("python3")
        .args(["-c", "import openai, pydantic, jsonschema"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!("SKIPPED: `python3 -c 'import openai, pydantic, jsonschema'` failed");
        return;
    }
    let opts = LoadOptions {
        n_ctx: Some(1024),
        ..Default::default()
    };
    let model = Arc::new(Model::load(path, &opts).expect("load model"));
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let cfg = ServerConfig {
        parallel: 1,
        n_ctx: Some(1024),
        max_tokens_cap: 256,
        api_key: Some("k".into()),
        model_id: id.into(),
        ..ServerConfig::default()
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = damascus_server::spawn(cfg, model, tok, listener).expect("spawn server");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tools/server_structured_test.py"
    );
    let base = format!("http://{}/v1", server.addr());
    // DAMASCUS_STRUCTURED_RUNS overrides the run count (debugging).
    let runs = std::env::var("DAMASCUS_STRUCTURED_RUNS").unwrap_or_else(|_| "20".into());
    let out = std::process::Command::new("python3")
        .args([
            script,
            "--base-url",
            &base,
            "--api-key",
            "k",
            "--runs",
            &runs,
        ])
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{id}: structured output checks failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("all structured output checks passed"),
        "{text}"
    );
}
