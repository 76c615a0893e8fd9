//! Several models in one server (issue 29, A5): routing by the request's `model`, `/v1/models`
//! listing loaded and unloaded models, loading on first use (two concurrent first requests load
//! once), least-recently-used unloading under `max_loaded` and a memory budget (a stream running
//! on the unloaded model finishes), unknown models (404 naming the ids), a bad file (500
//! `model_load_failed`, tried again next time, the other models unharmed), per-model `/metrics`
//! and `/health`, and the settings refused at startup.
//!
//! The models are the default model (`a`), a symlink to it under another name (`b`) and a file
//! of garbage (`bad`), in a scratch directory.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use damascus_model::{LoadOptions, Model};
use damascus_server::models::{LoadFn, ModelSource, ModelSpec, ModelsConfig};
use damascus_server::{ServerConfig, ServerError, ServerHandle};
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

/// A scratch directory with `a.gguf` (the default model), `b.gguf` (a symlink to it) and
/// `bad.gguf` (not a GGUF file); removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let dir =
            std::env::temp_dir().join(format!("damascus-multimodel-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let model = damascus_hub::default_model_path().expect("default model");
        std::os::unix::fs::symlink(&model, dir.join("a.gguf")).unwrap();
        std::os::unix::fs::symlink(&model, dir.join("b.gguf")).unwrap();
        std::fs::write(dir.join("bad.gguf"), b"GGUF this is not a model file").unwrap();
        Dir(dir)
    }

    fn spec(&self, id: &str) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            aliases: Vec::new(),
            source: ModelSource::File(self.0.join(format!("{id}.gguf"))),
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loader that counts the loads of each file name.
fn loader(counts: Arc<Mutex<Vec<String>>>) -> LoadFn {
    Arc::new(move |path: &Path| {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        counts.lock().unwrap().push(name);
        let opts = LoadOptions {
            n_ctx: Some(256),
            ..Default::default()
        };
        let model = Model::load(path, &opts).map_err(|e| e.to_string())?;
        let tok = Tokenizer::from_gguf(model.gguf()).map_err(|e| e.to_string())?;
        Ok((model, tok))
    })
}

fn loads(counts: &Mutex<Vec<String>>, name: &str) -> usize {
    counts.lock().unwrap().iter().filter(|n| *n == name).count()
}

fn config() -> ServerConfig {
    ServerConfig {
        parallel: 2,
        n_ctx: Some(256),
        queue_size: 8,
        max_tokens_cap: 256,
        log_requests: false,
        ..ServerConfig::default()
    }
}

fn spawn(models: ModelsConfig) -> Result<ServerHandle, ServerError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    damascus_server::spawn_models(config(), models, listener)
}

fn models(dir: &Dir, ids: &[&str], counts: &Arc<Mutex<Vec<String>>>) -> ModelsConfig {
    ModelsConfig {
        models: ids.iter().map(|id| dir.spec(id)).collect(),
        loader: Some(loader(Arc::clone(counts))),
        max_loaded: None,
        max_memory_bytes: None,
        preload_default: true,
    }
}

struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One HTTP/1.0 request (no chunked encoding in the reply), the whole reply read.
fn request(addr: SocketAddr, method: &str, path: &str, body: &Value) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let (head, body) = raw.split_once("\r\n\r\n").expect("header end");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Reply {
        status,
        body: body.to_string(),
    }
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, &Value::Null)
}

fn chat(addr: SocketAddr, model: Option<&str>) -> Reply {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8, "temperature": 0,
    });
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    request(addr, "POST", "/v1/chat/completions", &body)
}

/// Loads `model` cheaply (a tokenize request routed to it).
fn touch(addr: SocketAddr, model: &str) -> Reply {
    let body = json!({"content": "Hello", "model": model});
    request(addr, "POST", "/tokenize", &body)
}

/// `id → status` of `/v1/models`.
fn statuses(addr: SocketAddr) -> Vec<(String, String)> {
    let v = get(addr, "/v1/models").json();
    assert_eq!(v["object"], "list");
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            (
                m["id"].as_str().unwrap().to_string(),
                m["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn status(addr: SocketAddr, id: &str) -> String {
    statuses(addr)
        .into_iter()
        .find(|(i, _)| i == id)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("{id} not listed"))
}

fn error_code(r: &Reply, status: u16) -> String {
    assert_eq!(r.status, status, "{}", r.body);
    let v = r.json();
    assert!(v["error"]["message"].is_string(), "{v}");
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

fn content(r: &Reply) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn routes_by_model_and_lists_every_model() {
    let dir = Dir::new("route");
    let counts = Arc::new(Mutex::new(Vec::new()));
    let server = spawn(models(&dir, &["a", "b", "bad"], &counts)).expect("spawn");
    let addr = server.addr();

    // The default is loaded at startup, the others on first use.
    assert_eq!(
        statuses(addr),
        [("a", "loaded"), ("b", "unloaded"), ("bad", "unloaded")]
            .map(|(i, s)| (i.to_string(), s.to_string()))
    );
    assert_eq!(loads(&counts, "a"), 1);

    // Two first requests for b at once load it once; both are answered by b.
    let replies: Vec<Reply> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2).map(|_| s.spawn(|| chat(addr, Some("b")))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(loads(&counts, "b"), 1);
    for r in &replies {
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["model"], "b");
    }
    assert_eq!(status(addr, "b"), "loaded");
    let meta = &get(addr, "/v1/models").json()["data"][1]["meta"];
    assert_eq!(meta["n_ctx"], 256, "{meta}");

    // Same weights under two names, and the default for a request without `model`: one reply.
    let via_a = chat(addr, Some("a"));
    assert_eq!(via_a.json()["model"], "a");
    let default = chat(addr, None);
    assert_eq!(default.json()["model"], "a");
    assert_eq!(content(&via_a), content(&replies[0]));
    assert_eq!(content(&default), content(&via_a));
    // Reply ids are unique across the models.
    let mut ids: Vec<String> = [&replies[0], &replies[1], &via_a, &default]
        .iter()
        .map(|r| r.json()["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4, "{ids:?}");

    // One model by id; unknown ids are 404 `model_not_found`, naming the available ones.
    let one = get(addr, "/v1/models/b");
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(one.json()["id"], "b");
    assert_eq!(one.json()["status"], "loaded");
    assert_eq!(
        error_code(&get(addr, "/v1/models/nope"), 404),
        "model_not_found"
    );
    let r = chat(addr, Some("nope"));
    assert_eq!(error_code(&r, 404), "model_not_found");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("'nope'") && msg.contains("a, b, bad"), "{msg}");
    assert_eq!(r.json()["error"]["param"], "model");
    let emb = json!({"input": "hi", "model": "nope"});
    let r = request(addr, "POST", "/v1/embeddings", &emb);
    assert_eq!(error_code(&r, 404), "model_not_found");

    // A bad file: a clear 500 each time it is asked for (tried again, not poisoned); the
    // other models keep serving.
    for attempt in 1..=2 {
        let r = chat(addr, Some("bad"));
        assert_eq!(error_code(&r, 500), "model_load_failed");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains("'bad'"), "{msg}");
        assert_eq!(loads(&counts, "bad"), attempt);
        assert_eq!(status(addr, "bad"), "unloaded");
    }
    assert_eq!(content(&chat(addr, Some("b"))), content(&via_a));

    // /health sums the loaded models; /metrics labels each model's series.
    let h = get(addr, "/health").json();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["slots_total"], 4, "{h}");
    assert_eq!(h["models"][2]["status"], "unloaded");
    let m = get(addr, "/metrics").body;
    for line in [
        "damascus_requests_completed_total{model=\"b\"} 3",
        "damascus_requests_completed_total{model=\"a\"} 2",
        "damascus_slots_total{model=\"bad\"} 0",
        "damascus_model_loaded{model=\"b\"} 1",
        "damascus_model_load_failures_total{model=\"bad\"} 2",
        "damascus_model_loads_total{model=\"a\"} 1",
    ] {
        assert!(m.lines().any(|l| l == line), "no {line} in\n{m}");
    }
    assert_eq!(m.matches("# TYPE damascus_requests_total ").count(), 1);
    assert!(
        m.lines()
            .any(|l| l.starts_with("damascus_http_requests_total "))
    );
    server.shutdown().expect("shutdown");
}

/// The lines of an SSE stream up to `[DONE]`, read as they come.
struct Stream {
    r: BufReader<TcpStream>,
}

impl Stream {
    fn open(addr: SocketAddr, body: &Value) -> Stream {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST /v1/chat/completions HTTP/1.0\r\nHost: {addr}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        Stream {
            r: BufReader::new(s),
        }
    }

    /// The next `data:` payload (`None` at the end of the body).
    fn next(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(d) = line.trim().strip_prefix("data: ") {
                return Some(d.to_string());
            }
        }
    }
}

#[test]
fn least_recently_used_is_unloaded_and_running_streams_finish() {
    let dir = Dir::new("lru");
    let counts = Arc::new(Mutex::new(Vec::new()));
    let mut cfg = models(&dir, &["a", "b"], &counts);
    cfg.max_loaded = Some(1);
    let server = spawn(cfg).expect("spawn");
    let addr = server.addr();
    let first = content(&chat(addr, Some("a")));

    // A, B, A: B unloads A, A unloads B and is loaded again.
    assert_eq!(touch(addr, "b").status, 200);
    assert_eq!(
        statuses(addr),
        [("a", "unloaded"), ("b", "loaded")].map(|(i, s)| (i.to_string(), s.to_string()))
    );
    assert_eq!(content(&chat(addr, Some("a"))), first);
    assert_eq!(status(addr, "b"), "unloaded");
    assert_eq!((loads(&counts, "a"), loads(&counts, "b")), (2, 1));

    // A stream on A keeps going while a request for B unloads A.
    let mut s = Stream::open(
        addr,
        &json!({
            "model": "a", "stream": true, "max_tokens": 160, "temperature": 0,
            "ignore_eos": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Tell me a long story."}],
        }),
    );
    let opening = s.next().expect("first chunk");
    assert!(opening.contains("chat.completion.chunk"), "{opening}");
    let b = chat(addr, Some("b"));
    assert_eq!(b.json()["model"], "b");
    assert_eq!(status(addr, "a"), "unloaded");
    let mut events = vec![opening];
    while let Some(e) = s.next() {
        events.push(e);
    }
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(
        chunks.iter().all(|c| c.get("error").is_none()),
        "{events:?}"
    );
    let finish = chunks
        .iter()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str())
        .unwrap_or_default();
    assert_eq!(finish, "length", "{events:?}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 160, "{usage}");

    let m = get(addr, "/metrics").body;
    assert!(
        m.lines()
            .any(|l| l == "damascus_model_unloads_total{model=\"a\"} 2"),
        "{m}"
    );
    assert!(
        m.lines().any(|l| l == "damascus_slots_busy{model=\"a\"} 0"),
        "{m}"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn memory_budget_unloads_to_fit() {
    let dir = Dir::new("budget");
    let counts = Arc::new(Mutex::new(Vec::new()));
    let size = std::fs::metadata(dir.0.join("a.gguf")).unwrap().len();
    let mut cfg = models(&dir, &["a", "b"], &counts);
    // Room for one file and a half.
    cfg.max_memory_bytes = Some(size + size / 2);
    let server = spawn(cfg).expect("spawn");
    let addr = server.addr();
    assert_eq!(touch(addr, "b").status, 200);
    assert_eq!(status(addr, "a"), "unloaded");
    assert_eq!(touch(addr, "a").status, 200);
    assert_eq!(status(addr, "b"), "unloaded");
    assert_eq!(touch(addr, "a").status, 200);
    assert_eq!((loads(&counts, "a"), loads(&counts, "b")), (2, 1));
    server.shutdown().expect("shutdown");
}

#[test]
fn bad_settings_are_refused_at_startup() {
    let dir = Dir::new("settings");
    let counts = Arc::new(Mutex::new(Vec::new()));
    let refused = |cfg: ModelsConfig| match spawn(cfg) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };

    let mut cfg = models(&dir, &["a", "b"], &counts);
    cfg.max_loaded = Some(0);
    assert!(refused(cfg).contains("max_loaded"));

    let mut cfg = models(&dir, &["a", "b"], &counts);
    cfg.models[1].aliases.push("a".into());
    assert!(refused(cfg).contains("two models are named 'a'"));

    let mut cfg = models(&dir, &["a"], &counts);
    cfg.models.push(ModelSpec {
        id: "gone".into(),
        aliases: Vec::new(),
        source: ModelSource::File(dir.0.join("gone.gguf")),
    });
    let e = refused(cfg);
    assert!(e.contains("'gone'") && e.contains("gone.gguf"), "{e}");

    let mut cfg = models(&dir, &["a"], &counts);
    cfg.max_memory_bytes = Some(1 << 20);
    assert!(refused(cfg).contains("larger than the memory budget"));

    // A bad default fails at startup with the loader's message; nothing else was loaded.
    let e = refused(models(&dir, &["bad", "a"], &counts));
    assert!(e.contains("model 'bad'"), "{e}");
    assert_eq!(loads(&counts, "a"), 0);

    // Ids must be unique.
    let cfg = models(&dir, &["a", "a"], &counts);
    assert!(refused(cfg).contains("two models are named"));
    assert_eq!(*counts.lock().unwrap(), ["bad"], "only 'bad' was tried");
}
