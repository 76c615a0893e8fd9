//! The rest of the OpenAI surface and the server's lifecycle and limits (issue 29, A4 and B8/B9):
//! `unsupported_parameter` for every field not implemented, `GET /v1/models/{id}`,
//! `logit_bias`, `n > 1`, lists of prompts, CORS, case-insensitive `Bearer`, clipped error
//! messages, message validation, `Retry-After` on 503, a stream cut by shutdown, idle-connection
//! and body-read timeouts, and the settings refused at startup. Each server here is spawned on
//! 127.0.0.1:0 over the default model (loaded once).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use damascus_model::{LoadOptions, Model};
use damascus_server::{ServerConfig, ServerHandle};
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

const KEY: &str = "surface-key";

fn model() -> &'static (Arc<Model>, Arc<Tokenizer>) {
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
}

fn config() -> ServerConfig {
    ServerConfig {
        parallel: 1,
        n_ctx: Some(512),
        queue_size: 8,
        max_body_bytes: 64 * 1024,
        max_tokens_cap: 256,
        api_key: Some(KEY.into()),
        model_id: "surface".into(),
        log_requests: false,
        ..ServerConfig::default()
    }
}

fn spawn(cfg: ServerConfig) -> Result<ServerHandle, damascus_server::ServerError> {
    let (m, t) = model();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    damascus_server::spawn(cfg, Arc::clone(m), Arc::clone(t), listener)
}

/// The shared server of the request-level tests.
fn server() -> SocketAddr {
    static S: OnceLock<ServerHandle> = OnceLock::new();
    S.get_or_init(|| spawn(config()).expect("spawn")).addr()
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

fn parse_reply(raw: &[u8]) -> Reply {
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
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
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

/// One HTTP/1.1 request (`Connection: close`) with extra header lines.
fn request_with(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_reply(&raw)
}

fn auth() -> String {
    format!("Authorization: Bearer {KEY}\r\n")
}

fn post_to(addr: SocketAddr, path: &str, body: &Value) -> Reply {
    request_with(addr, "POST", path, &auth(), body.to_string().as_bytes())
}

fn post(path: &str, body: &Value) -> Reply {
    post_to(server(), path, body)
}

fn error_of(r: &Reply, status: u16) -> Value {
    assert_eq!(r.status, status, "body: {}", r.body);
    r.json()["error"].clone()
}

fn chat_msgs() -> Value {
    json!([{"role": "user", "content": "What is the capital of France?"}])
}

/// The EOG tokens banned, so a generation runs to its token budget.
fn ban_eog() -> Value {
    let (_, tok) = model();
    let mut m = serde_json::Map::new();
    for id in tok.eog_ids() {
        m.insert(id.to_string(), json!(-100));
    }
    Value::Object(m)
}

#[test]
fn fields_not_implemented_are_400_unsupported_parameter() {
    let chat = "/v1/chat/completions";
    // Structured output and tools are implemented (crates/server/src/structured.rs, tested
    // in tests/structured.rs); these are not.
    let cases = [
        (chat, "frobnicate", json!(1)),
        (chat, "suffix", json!("x")),
        (chat, "functions", json!([])),
        ("/v1/completions", "suffix", json!("x")),
        ("/v1/completions", "tool_choice", json!("auto")),
    ];
    for (path, field, value) in cases {
        let mut body = json!({"max_tokens": 2, "messages": chat_msgs(), "prompt": "Hi"});
        body.as_object_mut()
            .unwrap()
            .remove(if path == chat { "prompt" } else { "messages" });
        body[field] = value;
        let e = error_of(&post(path, &body), 400);
        assert_eq!(e["code"], "unsupported_parameter", "{field}: {e}");
        assert_eq!(e["param"], field, "{e}");
    }
    let e = error_of(
        &post(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2, "best_of": 3}),
        ),
        400,
    );
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("unsupported_parameter"), Some("best_of"))
    );
    let e = error_of(
        &post(
            "/v1/completions",
            &json!({"prompt": "Hi", "max_tokens": 2, "echo": true}),
        ),
        400,
    );
    assert_eq!(e["param"], "echo");
    // Null counts as absent; best_of = n and echo = false are fine.
    let r = post(
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 2, "best_of": 1, "echo": false, "suffix": null, "user": "u1"}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn model_by_id_and_bearer_in_any_case() {
    let addr = server();
    let r = request_with(addr, "GET", "/v1/models/surface", &auth(), b"");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["id"], "surface");
    assert_eq!(r.json()["object"], "model");
    let e = error_of(
        &request_with(addr, "GET", "/v1/models/gpt-4", &auth(), b""),
        404,
    );
    assert_eq!(e["code"], "model_not_found");
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let h = format!("Authorization: {scheme} {KEY}\r\n");
        let r = request_with(addr, "GET", "/v1/models", &h, b"");
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    // Without --cors-origin no CORS header is sent and OPTIONS is not answered.
    let r = request_with(
        addr,
        "GET",
        "/v1/models",
        &format!("{}Origin: http://x.test\r\n", auth()),
        b"",
    );
    assert!(r.header("access-control-allow-origin").is_none());
}

#[test]
fn logit_bias_bans_and_forces_tokens() {
    let greedy = |bias: Option<Value>| -> Value {
        let mut b = json!({"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
                           "logprobs": 0, "cache_prompt": false});
        if let Some(bias) = bias {
            b["logit_bias"] = bias;
        }
        let r = post("/v1/completions", &b);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let (_, tok) = model();
    let plain = greedy(None);
    let first = plain["choices"][0]["logprobs"]["tokens"][0]
        .as_str()
        .unwrap()
        .to_string();
    let first_id = tok.encode(&first, false, false)[0];
    // Banned (OpenAI's -100) → another first token.
    let banned = greedy(Some(json!({first_id.to_string(): -100})));
    assert_ne!(
        banned["choices"][0]["logprobs"]["tokens"][0],
        first.as_str(),
        "{banned}"
    );
    // llama-server's list form with `false` bans too.
    let banned2 = greedy(Some(json!([[first_id, false]])));
    assert_eq!(banned2["choices"][0]["text"], banned["choices"][0]["text"]);
    // +100 forces a token.
    let forced_id = tok.encode(" London", false, false)[0];
    let forced = greedy(Some(json!({forced_id.to_string(): 100})));
    assert!(
        forced["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" London"),
        "{forced}"
    );
    for bad in [
        json!({"abc": 1}),
        json!({"99999999": 1}),
        json!({"5": 101}),
        json!("x"),
    ] {
        let e = error_of(
            &post(
                "/v1/completions",
                &json!({"prompt": "Hi", "max_tokens": 1, "logit_bias": bad}),
            ),
            400,
        );
        assert_eq!(e["param"], "logit_bias", "{e}");
    }
}

#[test]
fn several_choices_and_prompt_lists() {
    // n = 2 at temperature 0: two identical choices, usage counts the prompt once.
    let r = post(
        "/v1/chat/completions",
        &json!({"messages": chat_msgs(), "max_tokens": 4, "temperature": 0, "n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 2, "{v}");
    assert_eq!(
        (ch[0]["index"].as_u64(), ch[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(ch[0]["message"]["content"], ch[1]["message"]["content"]);
    let one = post(
        "/v1/chat/completions",
        &json!({"messages": chat_msgs(), "max_tokens": 4, "temperature": 0}),
    )
    .json();
    assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        2 * one["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // Streamed with n = 3: every index gets its finish chunk, one [DONE].
    let r = post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 3, "n": 3, "seed": 5, "stream": true}),
    );
    let events: Vec<&str> = r
        .body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", r.body);
    let mut finished = [false; 3];
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        for c in v["choices"].as_array().unwrap() {
            if c["finish_reason"].is_string() {
                finished[c["index"].as_u64().unwrap() as usize] = true;
            }
        }
    }
    assert_eq!(finished, [true; 3], "{}", r.body);
    // A list of prompts (texts and token ids): one choice each, in order.
    let (_, tok) = model();
    let ids = tok.encode("The capital of France is", true, false);
    let r = post(
        "/v1/completions",
        &json!({"prompt": ["The capital of France is", ids, "1, 2, 3,"], "max_tokens": 3, "temperature": 0,
                "cache_prompt": false}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let ch = v["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3, "{v}");
    assert_eq!(
        ch[0]["text"], ch[1]["text"],
        "text and its ids give the same greedy text"
    );
    assert_eq!(ch[2]["index"], 2);
    let r = post(
        "/v1/completions",
        &json!({"prompt": [[1, 2], [3]], "max_tokens": 1}),
    );
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
    for bad in [
        json!({"prompt": [], "max_tokens": 1}),
        json!({"prompt": "Hi", "n": 0}),
        json!({"prompt": "Hi", "n": 99}),
    ] {
        error_of(&post("/v1/completions", &bad), 400);
    }
}

#[test]
fn error_messages_are_clear_and_short() {
    let chat = "/v1/chat/completions";
    // Internal type names never show.
    for body in [
        json!([1, 2]),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": "hi"}),
    ] {
        let e = error_of(&post(chat, &body), 400);
        let m = e["message"].as_str().unwrap();
        assert!(
            !m.contains("ChatRequest") && !m.contains("untagged") && !m.contains("enum"),
            "{m}"
        );
    }
    // Unknown roles and missing content are refused.
    let e = error_of(
        &post(
            chat,
            &json!({"messages": [{"role": "wizard", "content": "hi"}]}),
        ),
        400,
    );
    assert!(e["message"].as_str().unwrap().contains("wizard"), "{e}");
    let e = error_of(&post(chat, &json!({"messages": [{"role": "user"}]})), 400);
    assert!(e["message"].as_str().unwrap().contains("content"), "{e}");
    // A 60 KB prompt is not echoed back.
    let big = "a".repeat(60_000);
    let r = post(chat, &json!({"messages": big}));
    assert_eq!(r.status, 400);
    assert!(r.body.len() < 2000, "{} bytes", r.body.len());
    // An over-long completion prompt names `prompt`.
    let e = error_of(
        &post(
            "/v1/completions",
            &json!({"prompt": "word ".repeat(2000), "max_tokens": 2}),
        ),
        400,
    );
    assert_eq!(
        (e["param"].as_str(), e["code"].as_str()),
        (Some("prompt"), Some("context_length_exceeded"))
    );
}

#[test]
fn cors_preflight_and_origin() {
    let mut cfg = config();
    cfg.cors_origin = Some("http://app.test".into());
    let s = spawn(cfg).expect("spawn");
    let pre = "Origin: http://app.test\r\nAccess-Control-Request-Method: POST\r\n\
               Access-Control-Request-Headers: authorization, content-type\r\n";
    let r = request_with(s.addr(), "OPTIONS", "/v1/chat/completions", pre, b"");
    assert_eq!(r.status, 204, "{}", r.body);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.test")
    );
    assert!(
        r.header("access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert!(
        r.header("access-control-allow-headers")
            .unwrap()
            .contains("authorization")
    );
    let h = format!("{}Origin: http://app.test\r\n", auth());
    let r = request_with(s.addr(), "GET", "/v1/models", &h, b"");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.test")
    );
    let h = format!("{}Origin: http://evil.test\r\n", auth());
    let r = request_with(s.addr(), "GET", "/v1/models", &h, b"");
    assert!(r.header("access-control-allow-origin").is_none());
}

#[test]
fn bad_settings_are_refused_at_startup() {
    let bad: [fn(&mut ServerConfig); 4] = [
        |c| c.max_tokens_cap = 0,
        |c| c.max_body_bytes = 0,
        |c| c.api_key = Some(String::new()),
        |c| c.header_timeout = Duration::ZERO,
    ];
    for f in bad {
        let mut cfg = config();
        f(&mut cfg);
        let e = spawn(cfg).expect_err("refused");
        assert!(e.to_string().contains("invalid server setting"), "{e}");
    }
}

#[test]
fn full_queue_answers_503_with_retry_after() {
    let mut cfg = config();
    cfg.queue_size = 1;
    let s = spawn(cfg).expect("spawn");
    let addr = s.addr();
    let long = json!({"prompt": "Once upon a time", "max_tokens": 200, "logit_bias": ban_eog()});
    let clients: Vec<_> = (0..5)
        .map(|_| {
            let body = long.clone();
            std::thread::spawn(move || post_to(addr, "/v1/completions", &body))
        })
        .collect();
    let replies: Vec<Reply> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    let busy: Vec<&Reply> = replies.iter().filter(|r| r.status == 503).collect();
    assert!(
        !busy.is_empty(),
        "5 requests on 1 slot + 1 queued: some must be refused"
    );
    for r in busy {
        assert_eq!(r.header("retry-after"), Some("1"), "{}", r.body);
        assert_eq!(r.json()["error"]["code"], "queue_full");
    }
}

#[test]
fn stream_cut_by_shutdown_ends_with_an_error_event() {
    let s = spawn(config()).expect("spawn");
    let mut conn = TcpStream::connect(s.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let body = json!({"prompt": "Once upon a time", "max_tokens": 256, "stream": true,
                      "logit_bias": ban_eog()})
    .to_string();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        auth(),
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(conn);
    let mut raw = Vec::new();
    // Wait for the first token, then stop the server.
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 0 {
        raw.extend_from_slice(line.as_bytes());
        if line.starts_with("data: ") {
            break;
        }
        line.clear();
    }
    let stopper = std::thread::spawn(move || s.shutdown());
    reader.read_to_end(&mut raw).unwrap();
    stopper.join().unwrap().expect("clean shutdown");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("server_shutdown"), "{text}");
    assert!(!text.contains("\"finish_reason\":\"stop\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
}

#[test]
fn idle_connections_and_slow_bodies_time_out() {
    let mut cfg = config();
    cfg.header_timeout = Duration::from_secs(1);
    cfg.body_timeout = Duration::from_secs(1);
    let s = spawn(cfg).expect("spawn");
    // A connection that sends nothing is closed.
    let t0 = Instant::now();
    let mut idle = TcpStream::connect(s.addr()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = Vec::new();
    let _ = idle.read_to_end(&mut buf);
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_secs(10),
        "idle connection held {waited:?}"
    );
    // A body sent at one byte every 300 ms gets 408 after about a second.
    let t0 = Instant::now();
    let mut slow = TcpStream::connect(s.addr()).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        slow,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n{}Content-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n",
        auth()
    )
    .unwrap();
    for _ in 0..10 {
        if slow.write_all(b" ").is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut raw = Vec::new();
    let _ = slow.read_to_end(&mut raw);
    let r = parse_reply(&raw);
    assert_eq!(r.status, 408, "{}", r.body);
    assert!(t0.elapsed() < Duration::from_secs(10));
}
