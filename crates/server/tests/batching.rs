//! The batching engine over real HTTP with the default model: 16 concurrent greedy requests
//! (prompts of different lengths, some sharing a prefix, arriving together) give the same
//! tokens as each request alone; a tiny shared KV cache forces preemption without changing a
//! reply; `ignore_eos` is honoured; `/metrics` reports the batch, the pool and the prefix
//! cache; a client that disconnects gives its blocks back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use damascus_model::{LoadOptions, Model};
use damascus_server::{ServerConfig, ServerHandle};
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

fn model() -> (Arc<Model>, Arc<Tokenizer>) {
    static M: OnceLock<(Arc<Model>, Arc<Tokenizer>)> = OnceLock::new();
    M.get_or_init(|| {
        let path = damascus_hub::default_model_path().expect("default model");
        let opts = LoadOptions {
            n_ctx: Some(512),
            ..Default::default()
        };
        let model = Arc::new(Model::load(&path, &opts).expect("load model"));
        let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
        (model, tok)
    })
    .clone()
}

fn server(parallel: usize, n_ctx: usize, batch_size: usize) -> ServerHandle {
    let (model, tok) = model();
    let cfg = ServerConfig {
        parallel,
        n_ctx: Some(n_ctx),
        batch_size,
        queue_size: 64,
        max_tokens_cap: 256,
        log_requests: false,
        ..ServerConfig::default()
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    damascus_server::spawn(cfg, model, tok, listener).expect("spawn server")
}

/// POSTs `body` and returns the raw response (headers and body).
fn post(addr: SocketAddr, path: &str, body: &Value) -> String {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw).into_owned()
}

fn metrics(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    raw
}

/// Waits (up to 20 s) until every KV block is back in the pool: the engine updates its gauges
/// just after it sends the last reply.
fn wait_blocks_free(addr: SocketAddr) -> String {
    let t0 = Instant::now();
    loop {
        let m = metrics(addr);
        if metric(&m, "kv_blocks_used") == 0.0 {
            return m;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "blocks not freed: {m}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("damascus_{name} ")))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Greedy completion of `prompt` (token ids): the generated text.
fn complete(addr: SocketAddr, prompt: &[u32], n: usize, ignore_eos: bool) -> String {
    let raw = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": ignore_eos}),
    );
    let body = &raw[raw.find("\r\n\r\n").expect("head") + 4..];
    let start = body.find('{').unwrap_or_else(|| panic!("no JSON in {raw}"));
    let end = body.rfind('}').unwrap();
    let v: Value = serde_json::from_str(&body[start..=end]).unwrap();
    v["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

fn prompts() -> Vec<Vec<u32>> {
    let (_, tok) = model();
    let shared = tok.encode(
        "You are a helpful assistant. Answer briefly and precisely.",
        true,
        false,
    );
    (0..16)
        .map(|i| {
            let text = format!(
                "Question {i}: what is {} plus {}? The answer is",
                i * 7,
                40 - i
            );
            let mut p = if i % 3 == 0 {
                shared.clone()
            } else {
                Vec::new()
            };
            p.extend(tok.encode(&text, p.is_empty(), false));
            p.extend(std::iter::repeat_n(p[p.len() - 1], i % 5));
            p
        })
        .collect()
}

#[test]
fn sixteen_concurrent_greedy_requests_give_their_alone_replies() {
    let srv = server(16, 4096, 64);
    let addr = srv.addr();
    let ps = prompts();
    // A sample of them alone (with and without the shared prefix, short and long).
    let sample = [0usize, 1, 5, 10, 14];
    let alone: Vec<String> = sample
        .iter()
        .map(|&i| complete(addr, &ps[i], 10, false))
        .collect();
    let threads: Vec<_> = ps
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, p)| {
            std::thread::spawn(move || {
                // Arrivals spread over the first steps.
                std::thread::sleep(Duration::from_millis(7 * (i as u64 % 5)));
                complete(addr, &p, 10, false)
            })
        })
        .collect();
    let batched: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (a, &i) in alone.iter().zip(&sample) {
        assert_eq!(a, &batched[i], "request {i}: alone vs in a batch of 16");
    }
    let m = wait_blocks_free(addr);
    assert!(metric(&m, "prefix_hit_tokens_total") > 0.0, "{m}");
    assert!(metric(&m, "prefix_hit_rate") > 0.0);
    assert_eq!(
        metric(&m, "kv_blocks_used"),
        0.0,
        "every block comes back: {m}"
    );
    assert!(metric(&m, "kv_blocks_free") >= 4096.0 / 16.0);
}

/// Completion of `prompt` with extra request fields `extra`: the reply's first choice.
fn complete_with(addr: SocketAddr, prompt: &[u32], n: usize, extra: &Value) -> Value {
    let mut body = json!({"prompt": prompt, "max_tokens": n, "ignore_eos": true});
    for (k, v) in extra.as_object().expect("fields") {
        body[k] = v.clone();
    }
    let raw = post(addr, "/v1/completions", &body);
    let body = &raw[raw.find("\r\n\r\n").expect("head") + 4..];
    let start = body.find('{').unwrap_or_else(|| panic!("no JSON in {raw}"));
    let end = body.rfind('}').unwrap();
    let v: Value = serde_json::from_str(&body[start..=end]).unwrap();
    v["choices"][0].clone()
}

#[test]
fn greedy_picks_and_logit_rows_mix_in_one_step() {
    // Plain greedy requests take their pick from the backend's argmax; greedy requests with
    // logprobs and sampled ones read their logits: in one batch each gets its alone reply.
    let srv = server(8, 2048, 64);
    let addr = srv.addr();
    let ps: Vec<Vec<u32>> = prompts().into_iter().take(6).collect();
    let kind = |i: usize| match i % 3 {
        0 => json!({"temperature": 0}),
        1 => json!({"temperature": 0, "logprobs": 2}),
        _ => json!({"temperature": 0.9, "seed": 11 + i}),
    };
    let alone: Vec<Value> = (0..ps.len())
        .map(|i| complete_with(addr, &ps[i], 8, &kind(i)))
        .collect();
    let threads: Vec<_> = ps
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, p)| std::thread::spawn(move || complete_with(addr, &p, 8, &kind(i))))
        .collect();
    let batched: Vec<Value> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert!(a["text"].is_string(), "request {i}: {a}");
        assert_eq!(a["text"], b["text"], "request {i}: alone vs batched");
        if i % 3 == 1 {
            let n = b["logprobs"]["token_logprobs"]
                .as_array()
                .map_or(0, Vec::len);
            assert!(n > 0, "request {i}: logprobs: {b}");
            assert_eq!(a["logprobs"], b["logprobs"], "request {i}: logprobs");
        }
    }
    // Greedy with logprobs picks the same tokens as plain greedy.
    let plain = complete_with(addr, &ps[1], 8, &json!({"temperature": 0}));
    assert_eq!(plain["text"], alone[1]["text"]);
    wait_blocks_free(addr);
}

#[test]
fn a_small_shared_cache_preempts_without_changing_replies() {
    // 6 sequences of ~30 prompt + 20 generated positions in 128 positions: they cannot all
    // run at once, so some wait and some are preempted and resumed.
    let srv = server(6, 128, 32);
    let addr = srv.addr();
    let ps: Vec<Vec<u32>> = prompts().into_iter().take(6).collect();
    let threads: Vec<_> = ps
        .iter()
        .cloned()
        .map(|p| std::thread::spawn(move || complete(addr, &p, 20, true)))
        .collect();
    let batched: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for i in [0, 1, 4] {
        let alone = complete(addr, &ps[i], 20, true);
        assert_eq!(batched[i], alone, "request {i} under a full pool");
    }
    wait_blocks_free(addr);
}

#[test]
fn ignore_eos_runs_to_max_tokens_and_disconnect_frees_blocks() {
    let srv = server(2, 1024, 512);
    let addr = srv.addr();
    let (_, tok) = model();
    let p = tok.encode(
        "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
        false,
        true,
    );
    let raw = post(
        addr,
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": 60, "temperature": 0, "ignore_eos": true}),
    );
    assert!(raw.contains("\"completion_tokens\":60"), "{raw}");
    // A streaming client that leaves after the first bytes.
    let body = json!({"prompt": p, "max_tokens": 250, "temperature": 0, "ignore_eos": true, "stream": true}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf).unwrap();
    drop(s);
    let t0 = Instant::now();
    loop {
        let m = metrics(addr);
        if metric(&m, "kv_blocks_used") == 0.0 && metric(&m, "requests_cancelled_total") >= 1.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "blocks not freed: {m}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
