//! Several models in one server (`damascus serve -m A -m B`, `--models-dir DIR`): the registry
//! that routes a request's `model` field to a loaded model, loads models on first use and
//! unloads the least recently used.
//!
//! ```text
//!  request ─ model ─▶ Registry::get ─ loaded ─▶ Arc<AppState> (engine, tokenizer); LRU stamp
//!                            │ not loaded
//!                            ▼
//!                     load task (its own tokio task, so a client that leaves does not waste
//!                     it; one load at a time): unload least recently used models until the
//!                     new one fits `max_loaded` / `max_memory_bytes`, load on a blocking
//!                     thread, publish
//! ```
//!
//! Loaded models keep serving while another loads: the table lock is held only to look up or
//! publish, and only loads wait for each other, so two first requests for one model load it
//! once. A request holds its model's `Arc<AppState>` until its reply ends (a stream included),
//! so an unloaded model finishes what it runs; its engine stops when the last request lets go.
//! The memory budget counts file sizes, and an unloaded model's memory is freed only then. A
//! failed load answers 500 `model_load_failed` and leaves the model unloaded, to be tried again
//! by the next request. Models given already in memory ([`ModelSource::Loaded`]) are never
//! unloaded.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use damascus_model::Model;
use damascus_tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::metrics::Metrics;
use crate::routes::ApiError;
use crate::{AppState, ServerConfig, ServerError, ServerState, api};

/// Loads a model file and its tokenizer (the caller's load options live in the closure).
pub type LoadFn = Arc<dyn Fn(&Path) -> Result<(Model, Tokenizer), String> + Send + Sync>;

/// Where a model comes from.
#[derive(Clone)]
pub enum ModelSource {
    /// A GGUF file, loaded through [`ModelsConfig::loader`] on first use (again after an unload).
    File(PathBuf),
    /// A model already in memory: always loaded, never unloaded.
    Loaded(Arc<Model>, Arc<Tokenizer>),
}

impl std::fmt::Debug for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::File(p) => f.debug_tuple("File").field(p).finish(),
            ModelSource::Loaded(..) => f.write_str("Loaded"),
        }
    }
}

/// One model the server knows.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The id requests name it by (and `/v1/models` lists).
    pub id: String,
    /// Other names accepted in requests.
    pub aliases: Vec<String>,
    /// Where it comes from.
    pub source: ModelSource,
}

/// The models of a server and when they are loaded.
#[derive(Clone)]
pub struct ModelsConfig {
    /// Every model; the first is the default (requests without `model`, `/tokenize`).
    pub models: Vec<ModelSpec>,
    /// Loads [`ModelSource::File`] models; needed when there is one.
    pub loader: Option<LoadFn>,
    /// Most models loaded at once (`None`: no limit); the least recently used is unloaded to
    /// make room.
    pub max_loaded: Option<usize>,
    /// Most bytes of model files loaded at once (`None`: no limit).
    pub max_memory_bytes: Option<u64>,
    /// Load the default model before serving (so a bad default file fails at startup).
    pub preload_default: bool,
}

impl std::fmt::Debug for ModelsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelsConfig")
            .field("models", &self.models)
            .field("max_loaded", &self.max_loaded)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("preload_default", &self.preload_default)
            .finish()
    }
}

impl ModelsConfig {
    /// One model already in memory, named by `cfg.model_id` and `cfg.aliases`.
    pub fn single(cfg: &ServerConfig, model: Arc<Model>, tok: Arc<Tokenizer>) -> Self {
        Self {
            models: vec![ModelSpec {
                id: cfg.model_id.clone(),
                aliases: cfg.aliases.clone(),
                source: ModelSource::Loaded(model, tok),
            }],
            loader: None,
            max_loaded: None,
            max_memory_bytes: None,
            preload_default: true,
        }
    }
}

/// A known model and its counters.
struct Entry {
    id: String,
    aliases: Vec<String>,
    source: ModelSource,
    /// File size (0 for a model given in memory): what the memory budget counts.
    bytes: u64,
    /// Counters of this model's engines (kept across unloads, so they only grow).
    metrics: Arc<Metrics>,
    loads: AtomicU64,
    load_failures: AtomicU64,
    unloads: AtomicU64,
}

/// Which models are loaded: `live[i]` for entry `i`.
#[derive(Default)]
struct Table {
    live: Vec<Option<Live>>,
    /// Ticks once per use; the smallest stamp is the least recently used.
    clock: u64,
    /// The entry being loaded now.
    loading: Option<usize>,
}

struct Live {
    state: Arc<AppState>,
    used: u64,
}

/// Every model the server knows, loaded or not; see the module docs.
pub struct Registry {
    entries: Vec<Entry>,
    table: Mutex<Table>,
    /// Held for the whole of a load: one at a time.
    gate: tokio::sync::Mutex<()>,
    loader: Option<LoadFn>,
    max_loaded: Option<usize>,
    max_memory: Option<u64>,
    /// Each model's settings, with its own `model_id` and `aliases`.
    cfg: ServerConfig,
    /// Unloaded models that may still run requests (stopped too at shutdown).
    retired: Mutex<Vec<Weak<AppState>>>,
    started: u64,
    /// Request numbers of every model.
    ids: Arc<AtomicU64>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.entries.iter().map(|e| e.id.as_str()).collect();
        f.debug_struct("Registry")
            .field("models", &ids)
            .field("max_loaded", &self.max_loaded)
            .field("max_memory", &self.max_memory)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded data stays consistent at every unlock, so a panic elsewhere does not
    // poison the registry.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whole mebibytes, for messages.
fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

impl Registry {
    /// Checks the models (names unique, files present, each within the memory budget) and
    /// starts those given in memory, and the default one when `preload_default`.
    /// `server_metrics` becomes the model's counters when there is only one model, so the
    /// single-model `/metrics` stays unlabelled.
    pub fn new(
        cfg: ServerConfig,
        models: ModelsConfig,
        server_metrics: Arc<Metrics>,
    ) -> Result<Self, ServerError> {
        let config = |message: String| ServerError::Config {
            name: "models",
            message,
        };
        if models.models.is_empty() {
            return Err(config("no model to serve".into()));
        }
        if models.max_loaded == Some(0) {
            return Err(ServerError::Config {
                name: "max_loaded",
                message: "must be at least 1".into(),
            });
        }
        if models.max_memory_bytes == Some(0) {
            return Err(ServerError::Config {
                name: "max_memory",
                message: "must be more than 0".into(),
            });
        }
        let mut names: Vec<&str> = Vec::new();
        for m in &models.models {
            for n in std::iter::once(&m.id).chain(&m.aliases) {
                if n.is_empty() {
                    return Err(config("a model id or alias is empty".into()));
                }
                if names.contains(&n.as_str()) {
                    return Err(config(format!("two models are named '{n}'")));
                }
                names.push(n);
            }
        }
        let single = models.models.len() == 1;
        let mut entries = Vec::with_capacity(models.models.len());
        for m in models.models {
            let bytes = match &m.source {
                ModelSource::File(p) => {
                    if models.loader.is_none() {
                        return Err(config("model files given without a loader".into()));
                    }
                    let meta = std::fs::metadata(p).map_err(|e| ServerError::Model {
                        id: m.id.clone(),
                        message: format!("{}: {e}", p.display()),
                    })?;
                    if !meta.is_file() {
                        return Err(ServerError::Model {
                            id: m.id.clone(),
                            message: format!("{} is not a file", p.display()),
                        });
                    }
                    meta.len()
                }
                ModelSource::Loaded(..) => 0,
            };
            if let Some(max) = models.max_memory_bytes
                && bytes > max
            {
                return Err(ServerError::Model {
                    id: m.id.clone(),
                    message: format!(
                        "its file ({} MiB) is larger than the memory budget ({} MiB)",
                        mib(bytes),
                        mib(max)
                    ),
                });
            }
            entries.push(Entry {
                id: m.id,
                aliases: m.aliases,
                source: m.source,
                bytes,
                metrics: if single {
                    Arc::clone(&server_metrics)
                } else {
                    Arc::default()
                },
                loads: AtomicU64::new(0),
                load_failures: AtomicU64::new(0),
                unloads: AtomicU64::new(0),
            });
        }
        let n = entries.len();
        let reg = Registry {
            entries,
            table: Mutex::new(Table {
                live: (0..n).map(|_| None).collect(),
                ..Table::default()
            }),
            gate: tokio::sync::Mutex::new(()),
            loader: models.loader,
            max_loaded: models.max_loaded,
            max_memory: models.max_memory_bytes,
            cfg,
            retired: Mutex::new(Vec::new()),
            started: crate::now_unix(),
            ids: Arc::default(),
        };
        for i in 0..n {
            let pinned = matches!(reg.entries[i].source, ModelSource::Loaded(..));
            if pinned || (i == 0 && models.preload_default) {
                reg.make_room(i);
                // A failure here is the startup's error; no log line besides.
                let state = reg.open(i, false).map_err(|message| ServerError::Model {
                    id: reg.entries[i].id.clone(),
                    message,
                })?;
                reg.publish(i, state);
            }
        }
        Ok(reg)
    }

    /// The entry a request's `model` names (`None`: the default), or 404 `model_not_found`
    /// listing the available ids.
    pub fn find(&self, name: Option<&str>) -> Result<usize, ApiError> {
        let Some(name) = name else { return Ok(0) };
        self.entries
            .iter()
            .position(|e| e.id == name || e.aliases.iter().any(|a| a == name))
            .ok_or_else(|| self.not_found(name))
    }

    fn not_found(&self, name: &str) -> ApiError {
        let ids: Vec<&str> = self.entries.iter().map(|e| e.id.as_str()).collect();
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model '{}' does not exist; available: {}",
                api::clip(name, 80),
                ids.join(", ")
            ),
            kind: "invalid_request_error",
            param: Some(Cow::Borrowed("model")),
            code: Some("model_not_found"),
        }
    }

    /// The model a request names (`None`: the default), loading it if needed.
    pub async fn get(self: &Arc<Self>, name: Option<&str>) -> Result<Arc<AppState>, ApiError> {
        let i = self.find(name)?;
        if let Some(s) = self.touch(i) {
            return Ok(s);
        }
        // A task of its own: the load finishes (and is published) even if this client leaves.
        let me = Arc::clone(self);
        tokio::spawn(async move { me.load(i).await })
            .await
            .map_err(|e| load_failed(&self.entries[i].id, &e.to_string()))?
    }

    /// The loaded state of entry `i`, stamped as just used.
    fn touch(&self, i: usize) -> Option<Arc<AppState>> {
        let mut t = lock(&self.table);
        t.clock += 1;
        let now = t.clock;
        let live = t.live[i].as_mut()?;
        live.used = now;
        Some(Arc::clone(&live.state))
    }

    async fn load(self: Arc<Self>, i: usize) -> Result<Arc<AppState>, ApiError> {
        let _one_at_a_time = self.gate.lock().await;
        // Loaded while this request waited for the gate.
        if let Some(s) = self.touch(i) {
            return Ok(s);
        }
        self.make_room(i);
        lock(&self.table).loading = Some(i);
        let me = Arc::clone(&self);
        let res = tokio::task::spawn_blocking(move || me.open(i, true)).await;
        lock(&self.table).loading = None;
        let id = &self.entries[i].id;
        match res {
            Ok(Ok(state)) => Ok(self.publish(i, state)),
            Ok(Err(msg)) => Err(load_failed(id, &msg)),
            Err(e) => Err(load_failed(id, &format!("the load stopped: {e}"))),
        }
    }

    /// Loads entry `i` and starts its engine (blocking); `log`: a line on stderr (with
    /// request logging on).
    fn open(&self, i: usize, log: bool) -> Result<AppState, String> {
        let e = &self.entries[i];
        let t0 = std::time::Instant::now();
        let res = match &e.source {
            ModelSource::Loaded(m, t) => Ok((Arc::clone(m), Arc::clone(t))),
            ModelSource::File(path) => match &self.loader {
                Some(load) => load(path).map(|(m, t)| (Arc::new(m), Arc::new(t))),
                None => Err("no loader for model files".into()),
            },
        };
        let res = res.and_then(|(model, tok)| {
            let mut cfg = self.cfg.clone();
            cfg.model_id = e.id.clone();
            cfg.aliases = e.aliases.clone();
            crate::build_model(
                cfg,
                model,
                tok,
                Arc::clone(&e.metrics),
                Arc::clone(&self.ids),
            )
            .map_err(|e| e.to_string())
        });
        match &res {
            Ok(_) => {
                e.loads.fetch_add(1, Ordering::Relaxed);
                if log && self.cfg.log_requests {
                    eprintln!(
                        "damascus serve: loaded model '{}' in {:.2} s",
                        e.id,
                        t0.elapsed().as_secs_f64()
                    );
                }
            }
            Err(msg) => {
                e.load_failures.fetch_add(1, Ordering::Relaxed);
                if log && self.cfg.log_requests {
                    eprintln!("damascus serve: loading model '{}' failed: {msg}", e.id);
                }
            }
        }
        res
    }

    fn publish(&self, i: usize, state: AppState) -> Arc<AppState> {
        let state = Arc::new(state);
        let mut t = lock(&self.table);
        t.clock += 1;
        let used = t.clock;
        t.live[i] = Some(Live {
            state: Arc::clone(&state),
            used,
        });
        state
    }

    /// Unloads least recently used models until entry `i` fits beside the others.
    fn make_room(&self, i: usize) {
        loop {
            let mut t = lock(&self.table);
            let others: Vec<(usize, u64)> = t
                .live
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .filter_map(|(j, l)| l.as_ref().map(|l| (j, l.used)))
                .collect();
            let bytes: u64 = others.iter().map(|&(j, _)| self.entries[j].bytes).sum();
            let over = self.max_loaded.is_some_and(|m| others.len() + 1 > m)
                || self
                    .max_memory
                    .is_some_and(|m| bytes + self.entries[i].bytes > m);
            if !over {
                return;
            }
            let victim = others
                .iter()
                .filter(|&&(j, _)| matches!(self.entries[j].source, ModelSource::File(_)))
                .min_by_key(|&&(_, used)| used)
                .map(|&(j, _)| j);
            let Some(j) = victim else { return };
            let Some(live) = t.live[j].take() else { return };
            drop(t);
            let e = &self.entries[j];
            e.unloads.fetch_add(1, Ordering::Relaxed);
            if self.cfg.log_requests {
                eprintln!(
                    "damascus serve: unloading model '{}' (least recently used)",
                    e.id
                );
            }
            let mut retired = lock(&self.retired);
            retired.retain(|w| w.strong_count() > 0);
            retired.push(Arc::downgrade(&live.state));
            // The engine stops when the last request using it lets go (maybe now).
        }
    }

    /// Stops every engine (loaded, or unloaded but still running requests): new jobs are
    /// refused and running ones cancelled.
    pub fn shutdown(&self) {
        for l in lock(&self.table).live.iter().flatten() {
            l.state.stop();
        }
        for s in lock(&self.retired).iter().filter_map(Weak::upgrade) {
            s.stop();
        }
    }

    /// Stops every engine and waits for their threads (the end of the server).
    pub fn join_all(&self) {
        let live: Vec<Arc<AppState>> = lock(&self.table)
            .live
            .iter_mut()
            .filter_map(|l| l.take().map(|l| l.state))
            .collect();
        let retired: Vec<Arc<AppState>> = lock(&self.retired)
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        for s in live.iter().chain(&retired) {
            s.join();
        }
    }

    /// `loaded`, `loading` or `unloaded`, and the state when loaded.
    fn status(&self, i: usize) -> (&'static str, Option<Arc<AppState>>) {
        let t = lock(&self.table);
        match &t.live[i] {
            Some(l) => ("loaded", Some(Arc::clone(&l.state))),
            None if t.loading == Some(i) => ("loading", None),
            None => ("unloaded", None),
        }
    }

    /// The `/v1/models` object of entry `i`, under the name `id`.
    fn model_json(&self, i: usize, id: &str) -> Value {
        let e = &self.entries[i];
        let (status, state) = self.status(i);
        let mut meta = json!({"aliases": e.aliases, "size_bytes": e.bytes});
        if let Some(s) = state {
            meta["n_ctx"] = json!(s.n_ctx);
            meta["n_vocab"] = json!(s.tok.n_vocab());
        }
        json!({
            "id": id,
            "object": "model",
            "created": self.started,
            "owned_by": "damascus",
            "status": status,
            "meta": meta,
        })
    }

    /// The Prometheus text of every model: with one model its counters unlabelled (as a
    /// single-model server always had them); with several, every model's series labelled
    /// `model="id"` (gauges of an unloaded model read 0), the server-wide `http_requests_total`
    /// and `errors_total` once, and per-model load, failure and unload counts.
    fn render_metrics(&self, server: &Metrics) -> String {
        let slots = |i: usize| self.status(i).1.map_or(0, |s| s.queue.slots());
        if self.entries.len() == 1 {
            return self.entries[0].metrics.render(slots(0));
        }
        let server_text = server.render(0);
        let texts: Vec<(String, bool)> = (0..self.entries.len())
            .map(|i| {
                let loaded = self.status(i).1.is_some();
                (self.entries[i].metrics.render(slots(i)), loaded)
            })
            .collect();
        let mut out = String::new();
        for fam in families(&server_text) {
            let _ = writeln!(out, "# HELP damascus_{} {}", fam.name, fam.help);
            let _ = writeln!(out, "# TYPE damascus_{} {}", fam.name, fam.kind);
            if SERVER_WIDE.contains(&fam.name) {
                let _ = writeln!(out, "damascus_{} {}", fam.name, fam.value);
                continue;
            }
            for (e, (text, loaded)) in self.entries.iter().zip(&texts) {
                let v = match families(text).into_iter().find(|f| f.name == fam.name) {
                    Some(_) if fam.kind == "gauge" && !loaded => "0",
                    Some(f) => f.value,
                    None => "0",
                };
                let _ = writeln!(
                    out,
                    "damascus_{}{{model=\"{}\"}} {v}",
                    fam.name,
                    label(&e.id)
                );
            }
        }
        let own: [(&str, &str, &str); 4] = [
            ("model_loaded", "gauge", "1 when the model is loaded"),
            ("model_loads_total", "counter", "Times the model was loaded"),
            (
                "model_load_failures_total",
                "counter",
                "Loads of the model that failed",
            ),
            (
                "model_unloads_total",
                "counter",
                "Times the model was unloaded to make room",
            ),
        ];
        for (name, kind, help) in own {
            let _ = writeln!(out, "# HELP damascus_{name} {help}");
            let _ = writeln!(out, "# TYPE damascus_{name} {kind}");
            for (i, e) in self.entries.iter().enumerate() {
                let v = match name {
                    "model_loaded" => u64::from(texts[i].1),
                    "model_loads_total" => e.loads.load(Ordering::Relaxed),
                    "model_load_failures_total" => e.load_failures.load(Ordering::Relaxed),
                    _ => e.unloads.load(Ordering::Relaxed),
                };
                let _ = writeln!(out, "damascus_{name}{{model=\"{}\"}} {v}", label(&e.id));
            }
        }
        out
    }
}

/// 500 `model_load_failed`: the model's file could not be loaded.
fn load_failed(id: &str, msg: &str) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("loading the model '{id}' failed: {msg}"),
    )
    .with_code("model_load_failed")
}

/// Series counted by the server, not per model.
const SERVER_WIDE: [&str; 2] = ["http_requests_total", "errors_total"];

/// One metric of [`Metrics::render`]'s text.
struct Family<'a> {
    name: &'a str,
    help: &'a str,
    kind: &'a str,
    value: &'a str,
}

/// The metrics of a [`Metrics::render`] text, in order (`# HELP`, `# TYPE`, one sample each).
fn families(text: &str) -> Vec<Family<'_>> {
    let mut out: Vec<Family<'_>> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP damascus_") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push(Family {
                name,
                help,
                kind: "untyped",
                value: "0",
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE damascus_") {
            if let (Some(f), Some((_, kind))) = (out.last_mut(), rest.split_once(' ')) {
                f.kind = kind;
            }
        } else if let Some(rest) = line.strip_prefix("damascus_")
            && let Some((_, v)) = rest.split_once(' ')
            && let Some(f) = out.last_mut()
        {
            f.value = v;
        }
    }
    out
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `GET /v1/models`: every known model, loaded or not (`status`: `loaded`, `loading`,
/// `unloaded`, as llama-swap and ollama report it).
pub(crate) async fn list(State(st): State<Arc<ServerState>>) -> Response {
    let r = &st.models;
    let data: Vec<Value> = (0..r.entries.len())
        .map(|i| r.model_json(i, &r.entries[i].id))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: one model (by id or alias), 404 `model_not_found` otherwise.
pub(crate) async fn one(
    State(st): State<Arc<ServerState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let i = st.models.find(Some(&id))?;
    Ok(axum::Json(st.models.model_json(i, &id)).into_response())
}

/// `GET /health`: liveness, slots and queue summed over the loaded models, and each model's
/// status.
pub(crate) async fn health(State(st): State<Arc<ServerState>>) -> Response {
    let r = &st.models;
    let (mut slots, mut busy, mut queued) = (0, 0, 0);
    let mut models = Vec::with_capacity(r.entries.len());
    for (i, e) in r.entries.iter().enumerate() {
        let (status, state) = r.status(i);
        if let Some(s) = state {
            slots += s.queue.slots();
            busy += s.metrics.slots_busy.load(Ordering::Relaxed);
            queued += s.metrics.queue_depth.load(Ordering::Relaxed);
        }
        models.push(json!({"id": e.id, "status": status}));
    }
    axum::Json(json!({
        "status": "ok",
        "slots_total": slots,
        "slots_processing": busy,
        "queue_depth": queued,
        "models": models,
    }))
    .into_response()
}

/// `GET /metrics`: Prometheus text (see [`Registry::render_metrics`]).
pub(crate) async fn metrics(State(st): State<Arc<ServerState>>) -> Response {
    let mut r = st.models.render_metrics(&st.metrics).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_read_back_render() {
        let m = Metrics::default();
        Metrics::add(&m.gen_requests, 3);
        let text = m.render(2);
        let fams = families(&text);
        let req = fams.iter().find(|f| f.name == "requests_total").unwrap();
        assert_eq!((req.kind, req.value), ("counter", "3"));
        let slots = fams.iter().find(|f| f.name == "slots_total").unwrap();
        assert_eq!((slots.kind, slots.value), ("gauge", "2"));
        assert_eq!(fams.len(), text.lines().count() / 3);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
    }
}
