//! The batching engine on a q8_0 KV cache (`--cache-type q8_0`) over real HTTP with the default
//! model: concurrent greedy requests give their alone replies, and `/metrics` reports the
//! cache's bytes (`-c` positions at 34 bytes per 32 values, about 1.9x fewer than f16).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_server::{ServerConfig, ServerHandle};
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

fn load(cache_type: KvCacheType) -> (Arc<Model>, Arc<Tokenizer>) {
    let path = damascus_hub::default_model_path().expect("default model");
    let opts = LoadOptions {
        n_ctx: Some(512),
        cache_type: Some(cache_type),
        ..Default::default()
    };
    let model = Arc::new(Model::load(&path, &opts).expect("load model"));
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    (model, tok)
}

fn server(model: Arc<Model>, tok: Arc<Tokenizer>, n_ctx: usize) -> ServerHandle {
    let cfg = ServerConfig {
        parallel: 4,
        n_ctx: Some(n_ctx),
        batch_size: 32,
        queue_size: 64,
        max_tokens_cap: 256,
        log_requests: false,
        ..ServerConfig::default()
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    damascus_server::spawn(cfg, model, tok, listener).expect("spawn server")
}

fn request(addr: SocketAddr, head: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw).into_owned()
}

/// Greedy completion of `prompt`: the generated text.
fn complete(addr: SocketAddr, prompt: &str, n: usize) -> String {
    let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0}).to_string();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let raw = request(addr, &head, &body);
    let body = &raw[raw.find("\r\n\r\n").expect("head") + 4..];
    let start = body.find('{').unwrap_or_else(|| panic!("no JSON in {raw}"));
    let end = body.rfind('}').unwrap();
    let v: Value = serde_json::from_str(&body[start..=end]).unwrap();
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

fn metric(addr: SocketAddr, name: &str) -> f64 {
    let head = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let text = request(addr, &head, "");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("damascus_{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn q8_0_server_batches_invariantly_and_reports_its_bytes() {
    let (model, tok) = load(KvCacheType::Q8_0);
    assert_eq!(model.cache_type(), KvCacheType::Q8_0);
    let per_slot = model.kv_bytes_per_slot();
    let srv = server(Arc::clone(&model), tok, 1024);
    let addr = srv.addr();
    let prompts: Vec<String> = (0..6)
        .map(|i| {
            format!(
                "Question {i}: what is {} plus {}? The answer is",
                i * 7,
                40 - i
            )
        })
        .collect();
    let alone: Vec<String> = prompts.iter().map(|p| complete(addr, p, 12)).collect();
    let threads: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| std::thread::spawn(move || complete(addr, &p, 12)))
        .collect();
    for (i, (t, a)) in threads.into_iter().zip(&alone).enumerate() {
        assert_eq!(&t.join().unwrap(), a, "request {i}: alone vs batched");
    }
    assert_eq!(metric(addr, "kv_cache_bytes"), (1024 * per_slot) as f64);
    // The same positions in f16 take about 1.9x the bytes.
    let (f16, _) = load(KvCacheType::F16);
    let ratio = f16.kv_bytes_per_slot() as f64 / per_slot as f64;
    assert!((1.85..1.9).contains(&ratio), "{ratio}");
}
