//! End-to-end tests of `damascus serve` over real HTTP on 127.0.0.1 with the default model:
//! every endpoint, streaming, stop strings, seeds, usage, greedy parity with the runtime, bad
//! inputs (each with its status, the server staying up) and a small concurrent load.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use damascus_model::{LoadOptions, Model};
use damascus_runtime::generate::{GenerateConfig, Generator};
use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
use damascus_runtime::sequence::Sequence;
use damascus_server::{ServerConfig, ServerHandle};
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

const KEY: &str = "test-key";
const MODEL_ID: &str = "smollm2-test";

struct Fixture {
    server: ServerHandle,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let path = damascus_hub::default_model_path().expect("default model");
        let opts = LoadOptions {
            n_ctx: Some(512),
            ..Default::default()
        };
        let model = Arc::new(Model::load(&path, &opts).expect("load model"));
        let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
        let cfg = ServerConfig {
            parallel: 2,
            n_ctx: Some(512),
            queue_size: 32,
            max_body_bytes: 64 * 1024,
            max_tokens_cap: 256,
            api_key: Some(KEY.into()),
            model_id: MODEL_ID.into(),
            aliases: vec!["default".into()],
            log_requests: false,
            batch_size: 512,
            ..ServerConfig::default()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let server = damascus_server::spawn(cfg, Arc::clone(&model), Arc::clone(&tok), listener)
            .expect("spawn server");
        Fixture { server, model, tok }
    })
}

/// A reply: status, headers (lower-cased names) and the de-chunked body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal HTTP/1.1 client (`Connection: close`, chunked bodies decoded).
fn request(addr: SocketAddr, method: &str, path: &str, key: Option<&str>, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    // A too-large body may be refused before it is all sent; ignore write errors then.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut rest = &raw[split + 4..];
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut out = Vec::new();
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("chunk size");
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16)
                .unwrap();
            rest = &rest[eol + 2..];
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[..n]);
            rest = &rest[n + 2..];
        }
        out
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body: String::from_utf8(body).expect("utf-8 body"),
    }
}

fn post(path: &str, body: &Value) -> Reply {
    let addr = fixture().server.addr();
    request(addr, "POST", path, Some(KEY), body.to_string().as_bytes())
}

fn get(path: &str) -> Reply {
    request(fixture().server.addr(), "GET", path, Some(KEY), b"")
}

/// The `data:` payloads of an SSE body, `[DONE]` last.
fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

fn assert_error(r: &Reply, status: u16) -> Value {
    assert_eq!(r.status, status, "body: {}", r.body);
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

fn health_ok() {
    let r = request(fixture().server.addr(), "GET", "/health", None, b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ok");
}

#[test]
fn models_health_tokenize_metrics() {
    health_ok();
    let m = get("/v1/models").json();
    assert_eq!(m["data"][0]["id"], MODEL_ID);
    let t = post("/tokenize", &json!({"content": "Hello world"})).json();
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(ids, fixture().tok.encode("Hello world", false, true));
    let d = post("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["content"], "Hello world");
    let r = request(fixture().server.addr(), "GET", "/metrics", None, b"");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("damascus_requests_total"), "{}", r.body);
    assert!(r.body.contains("damascus_queue_depth"));
}

#[test]
fn chat_whole_and_streamed_agree() {
    let body = json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0,
    });
    let r = post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());
    let u = &v["usage"];
    let completion = u["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion), "{u}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + completion
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let r = post("/v1/chat/completions", &sbody);
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = sse_events(&r.body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text, "streamed and whole greedy replies differ");
    let usage = &chunks.last().unwrap()["usage"];
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[k], u[k], "usage chunk {k}");
    }
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"].is_string())
    );
}

#[test]
fn greedy_completion_matches_runtime() {
    let prompt = "The capital of France is";
    let r = post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    let lp = &v["choices"][0]["logprobs"];
    assert!(!lp["tokens"].as_array().unwrap().is_empty(), "{lp}");

    let f = fixture();
    let ids = f.tok.encode(prompt, true, false);
    let mut seq = Sequence::new(f.model.session().unwrap());
    let sampler = SamplerChain::from_config(&SamplerConfig::greedy()).unwrap();
    let cfg = GenerateConfig {
        max_tokens: Some(12),
        ..Default::default()
    };
    let done = Generator::new(&mut seq, &f.tok, cfg, sampler, &ids)
        .run(|_| {})
        .unwrap();
    assert_eq!(text, done.text);
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap() as usize,
        done.ids.len()
    );
}

#[test]
fn stop_strings_and_seeds() {
    // `cache_prompt: false`: every request evaluates its whole prompt, so the texts compared
    // below do not depend on which slot (and cached prefix) served each one.
    let base = json!({"prompt": "1, 2, 3, 4, 5,", "max_tokens": 16, "temperature": 0,
                      "cache_prompt": false});
    let full = post("/v1/completions", &base).json();
    let full_text = full["choices"][0]["text"].as_str().unwrap().to_string();
    // Stop at the first comma the greedy continuation produces (list form of `stop`).
    let mut b = base.clone();
    b["stop"] = json!([","]);
    let v = post("/v1/completions", &b).json();
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(!cut.contains(','), "{cut:?}");
    assert!(full_text.starts_with(cut), "{full_text:?} vs {cut:?}");

    let sampled = |seed: i64| {
        let b = json!({
            "prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed, "cache_prompt": false,
        });
        post("/v1/completions", &b).json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(sampled(42), sampled(42), "same seed, same text");
}

#[test]
fn bad_inputs_get_clear_errors() {
    let addr = fixture().server.addr();
    let chat = "/v1/chat/completions";
    let r = request(addr, "POST", chat, Some(KEY), b"{\"messages\": [");
    assert_error(&r, 400);
    let r = post(chat, &json!({"messages": "hi"}));
    assert_error(&r, 400);
    let r = post(
        chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}),
    );
    assert_eq!(assert_error(&r, 400)["error"]["param"], "max_tokens");
    let r = post(
        chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}),
    );
    assert_error(&r, 400);
    let r = post(
        chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
    );
    assert_error(&r, 400);
    let r = post(
        chat,
        &json!({"messages": [{"role": "user", "content": "hi"}], "top_p": 7}),
    );
    assert_error(&r, 400);
    let r = post(
        chat,
        &json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(assert_error(&r, 404)["error"]["code"], "model_not_found");
    let long = "word ".repeat(2000);
    let r = post("/v1/completions", &json!({"prompt": long, "max_tokens": 4}));
    assert_eq!(
        assert_error(&r, 400)["error"]["code"],
        "context_length_exceeded"
    );
    let huge = format!("{{\"prompt\": \"{}\"}}", "a".repeat(200 * 1024));
    let r = request(addr, "POST", "/v1/completions", Some(KEY), huge.as_bytes());
    assert_error(&r, 413);
    let r = request(addr, "GET", "/v1/nothing", Some(KEY), b"");
    assert_error(&r, 404);
    let r = request(addr, "GET", "/v1/models", None, b"");
    assert_error(&r, 401);
    let r = request(addr, "GET", "/v1/models", Some("wrong"), b"");
    assert_error(&r, 401);
    let r = post("/detokenize", &json!({"tokens": [u32::MAX]}));
    assert_error(&r, 400);
    health_ok();
}

#[test]
fn concurrent_clients_all_succeed() {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for j in 0..3 {
                    let stream = (i + j) % 2 == 0;
                    let r = post(
                        "/v1/chat/completions",
                        &json!({
                            "messages": [
                                {"role": "system", "content": "You are terse."},
                                {"role": "user", "content": format!("Count to {}", i + j)},
                            ],
                            "max_tokens": 4, "stream": stream, "seed": i,
                        }),
                    );
                    assert_eq!(r.status, 200, "{}", r.body);
                    if stream {
                        assert!(r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
                    } else {
                        assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("client thread");
    }
    health_ok();
}

/// The real `openai` Python client against this server (tools/server_openai_test.py). Skipped,
/// with a message, when python3 or the `openai` package is missing (`pip install openai`).
#[test]
fn openai_python_client() {
    let has_openai = std::process::Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openai {
        eprintln!(
            "SKIPPED openai_python_client: `python3 -c 'import openai'` failed (pip install openai)"
        );
        return;
    }
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tools/server_openai_test.py"
    );
    let base = format!("http://{}/v1", fixture().server.addr());
    let out = std::process::Command::new("python3")
        .args([script, "--base-url", &base, "--api-key", KEY])
        .output()
        .expect("run python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openai client checks failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("all openai client checks passed"), "{text}");
}
