//! `damascus serve`: an OpenAI-compatible HTTP server on tokio + axum.
//!
//! - [`routes`]: the HTTP surface (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/tokenize`, `/detokenize`, `/metrics`), API-key check, OpenAI-shaped errors.
//! - [`api`]: request parsing and validation into a [`worker::Job`], response JSON shapes.
//! - [`worker`]: one thread per slot, each owning a KV cache ([`damascus_runtime::sequence::Sequence`],
//!   which reuses the common prefix with the slot's previous request), fed by one bounded FIFO
//!   queue (full queue = HTTP 503). Tokens stream back over a channel; a dropped receiver (client
//!   gone) raises the generation's cancel flag.
//! - [`metrics`]: counters and gauges rendered in Prometheus text format.
//! - [`models`]: several models in one server — the registry that routes a request's `model`
//!   to a loaded model ([`AppState`]), loads on first use and unloads the least recently used.
//!
//! Model work never runs on the async runtime: handlers only validate, enqueue and forward.
#![forbid(unsafe_code)]

pub mod api;
pub mod embeddings;
pub mod engine;
pub mod metrics;
pub mod models;
pub mod routes;
pub mod structured;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use damascus_model::Model;
use damascus_tokenizer::Tokenizer;

/// Errors of the server crate (startup; request errors are [`routes::ApiError`]).
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or configuring the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Creating a slot's session or a worker thread failed.
    #[error("starting slot {slot}: {message}")]
    Slot {
        /// Slot index.
        slot: usize,
        /// What went wrong.
        message: String,
    },
    /// A model of the server could not be used (file, size, load).
    #[error("model '{id}': {message}")]
    Model {
        /// The model's id.
        id: String,
        /// What went wrong.
        message: String,
    },
    /// The tokio runtime or the server loop failed.
    #[error("server runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// A configuration value out of range.
    #[error("invalid server setting {name}: {message}")]
    Config {
        /// The setting.
        name: &'static str,
        /// Why it is invalid.
        message: String,
    },
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Most sequences generated at once (batched into one forward pass where the backend
    /// can; otherwise worker threads, each with its own KV cache).
    pub parallel: usize,
    /// KV-cache positions (`-c`): with batching, the total shared by every sequence (as
    /// llama-server's unified cache; one sequence may use up to the model's context); without,
    /// each slot's. `None` = the model's default.
    pub n_ctx: Option<usize>,
    /// Most tokens in one batched forward pass (`-b`): the decoding sequences' tokens, then
    /// prompt chunks, so a long prompt is prefilled in pieces between decode steps.
    pub batch_size: usize,
    /// Most prompt tokens in one pass while other sequences are decoding (`--prefill-chunk`);
    /// `None` = sized from the measured step times so such a pass costs about two decode
    /// steps (at least 16 tokens, at most `batch_size`; [`engine::ChunkPolicy`]).
    pub prefill_chunk: Option<usize>,
    /// Most requests waiting for a slot; more get HTTP 503.
    pub queue_size: usize,
    /// Largest accepted request body, bytes; larger gets HTTP 413.
    pub max_body_bytes: usize,
    /// Upper bound of `max_tokens` (and the default when a request gives none).
    pub max_tokens_cap: usize,
    /// When set, every route but `/health` and `/metrics` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// The model id reported by `/v1/models` and accepted in requests.
    pub model_id: String,
    /// Other accepted model names.
    pub aliases: Vec<String>,
    /// Print one log line per request to stderr.
    pub log_requests: bool,
    /// Allowed browser origin for CORS (`*` for any); `None` = no CORS headers.
    pub cors_origin: Option<String>,
    /// Longest wait for a request's headers, from the connection's start or the end of the
    /// previous reply (an idle keep-alive connection): then the connection is closed.
    pub header_timeout: std::time::Duration,
    /// Longest wait for a request's whole body (a slow sender gets 408).
    pub body_timeout: std::time::Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            parallel: 2,
            n_ctx: None,
            batch_size: 512,
            prefill_chunk: None,
            queue_size: 64,
            max_body_bytes: 1 << 20,
            max_tokens_cap: 4096,
            api_key: None,
            model_id: "damascus".into(),
            aliases: Vec::new(),
            log_requests: true,
            cors_origin: None,
            header_timeout: std::time::Duration::from_secs(30),
            body_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// What the routes share: settings, the server-wide counters and the models.
pub struct ServerState {
    /// Settings.
    pub cfg: ServerConfig,
    /// Server-wide counters (requests, errors; with one model also that model's counters).
    pub metrics: Arc<metrics::Metrics>,
    /// Every model the server knows, loaded or not.
    pub models: Arc<models::Registry>,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("cfg", &self.cfg)
            .finish()
    }
}

/// One loaded model: what its handlers share. A request holds an `Arc` of it until its reply
/// ends; when the last one goes (the model was unloaded), `Drop` stops its engine.
pub struct AppState {
    /// Settings (`model_id` and `aliases` are this model's).
    pub cfg: ServerConfig,
    /// The tokenizer (tokenize / detokenize / prompts).
    pub tok: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    pub template: Option<damascus_tokenizer::ChatTemplate>,
    /// Context length of each slot.
    pub n_ctx: usize,
    /// The job queue.
    pub queue: worker::Queue,
    /// This model's counters.
    pub metrics: Arc<metrics::Metrics>,
    /// Unix time the model was loaded.
    pub started: u64,
    /// The model (`/v1/embeddings` runs its own forward passes).
    pub model: Arc<Model>,
    /// The vocabulary trie of grammar-constrained requests, built on first use.
    pub grammar_vocab: std::sync::OnceLock<Arc<damascus_grammar::Vocab>>,
    /// The engine's threads; taken by [`models::Registry::join_all`] or, when the last
    /// reference goes, joined in the background.
    workers: std::sync::Mutex<Option<worker::Workers>>,
    /// Request numbers, shared by every model of the server (reply ids stay unique).
    ids: Arc<std::sync::atomic::AtomicU64>,
}

impl AppState {
    /// A fresh request number (`chatcmpl-N`), unique across the server's models.
    pub fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }

    /// Stops the engine: no new jobs, running ones cancelled.
    pub(crate) fn stop(&self) {
        self.queue.shutdown();
    }

    /// Stops the engine and waits for its threads.
    pub(crate) fn join(&self) {
        self.queue.shutdown();
        let w = self.workers.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = w {
            w.join();
        }
    }
}

impl Drop for AppState {
    fn drop(&mut self) {
        self.queue.shutdown();
        let w = self.workers.get_mut().ok().and_then(Option::take);
        if let Some(w) = w {
            // Joined on a thread of its own: the last reference may go on an async task.
            let _ = std::thread::Builder::new()
                .name("damascus-unload".into())
                .spawn(move || w.join());
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("cfg", &self.cfg)
            .field("n_ctx", &self.n_ctx)
            .finish()
    }
}

/// A server running on a background thread (tests, embedding).
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl ServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server (in-flight generations are cancelled) and waits for it.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks the settings that do not depend on a model.
fn check_config(cfg: &ServerConfig) -> Result<(), ServerError> {
    if cfg.parallel == 0 || cfg.parallel > 64 {
        return Err(ServerError::Config {
            name: "parallel",
            message: format!("{} (must be 1..=64)", cfg.parallel),
        });
    }
    let positive = [
        ("queue_size", cfg.queue_size),
        ("max_tokens", cfg.max_tokens_cap),
        ("max_body", cfg.max_body_bytes),
    ];
    for (name, v) in positive {
        if v == 0 {
            return Err(ServerError::Config {
                name,
                message: "must be at least 1".into(),
            });
        }
    }
    if cfg.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(ServerError::Config {
            name: "api_key",
            message: "is empty (leave it out to serve without a key)".into(),
        });
    }
    if cfg.header_timeout.is_zero() || cfg.body_timeout.is_zero() {
        return Err(ServerError::Config {
            name: "timeout",
            message: "must be longer than 0 s".into(),
        });
    }
    if cfg.batch_size == 0 {
        return Err(ServerError::Config {
            name: "batch_size",
            message: "must be at least 1".into(),
        });
    }
    if cfg.prefill_chunk == Some(0) {
        return Err(ServerError::Config {
            name: "prefill_chunk",
            message: "must be at least 1".into(),
        });
    }
    Ok(())
}

/// Starts one model's engine (or slot workers) and builds its state.
pub(crate) fn build_model(
    cfg: ServerConfig,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    metrics: Arc<metrics::Metrics>,
    ids: Arc<std::sync::atomic::AtomicU64>,
) -> Result<AppState, ServerError> {
    let n_ctx = cfg.n_ctx.unwrap_or(model.n_ctx());
    let (queue, workers, n_ctx) = if model.supports_batches() {
        // One pool of n_ctx positions for everyone; a sequence may use the model's context.
        let n_seq = n_ctx.min(model.n_ctx_train()).max(1);
        let (q, w) = engine::start(
            Arc::clone(&model),
            Arc::clone(&tok),
            engine::EngineConfig {
                parallel: cfg.parallel,
                n_ctx_total: n_ctx,
                n_ctx_seq: n_seq,
                batch_tokens: cfg.batch_size,
                prefill_chunk: cfg.prefill_chunk,
                queue_size: cfg.queue_size,
                log: cfg.log_requests,
            },
            Arc::clone(&metrics),
        )?;
        (q, w, n_seq)
    } else {
        let (q, w) = worker::start(
            Arc::clone(&model),
            Arc::clone(&tok),
            cfg.parallel,
            n_ctx,
            cfg.queue_size,
            Arc::clone(&metrics),
            cfg.log_requests,
        )?;
        (q, w, n_ctx)
    };
    // A model without `tokenizer.chat_template` (a base model) chats through the built-in
    // template of its family, as llama-server falls back to one.
    let (template, fallback) =
        damascus_tokenizer::ChatTemplate::for_model(&tok, &model.config().arch);
    if let Some(name) = fallback {
        eprintln!(
            "damascus serve: the model has no chat template; using the built-in {name:?} one"
        );
    }
    let template = Some(template);
    Ok(AppState {
        cfg,
        tok,
        template,
        n_ctx,
        queue,
        metrics,
        started: now_unix(),
        model,
        grammar_vocab: std::sync::OnceLock::new(),
        workers: std::sync::Mutex::new(Some(workers)),
        ids,
    })
}

/// Checks the settings, builds the model registry (loading the default model where asked)
/// and the routes' state.
fn build_state(
    cfg: ServerConfig,
    models: models::ModelsConfig,
) -> Result<Arc<ServerState>, ServerError> {
    check_config(&cfg)?;
    let metrics = Arc::new(metrics::Metrics::default());
    let registry = models::Registry::new(cfg.clone(), models, Arc::clone(&metrics))?;
    Ok(Arc::new(ServerState {
        cfg,
        metrics,
        models: Arc::new(registry),
    }))
}

/// Accepts connections until `shutdown`, serving each with hyper's HTTP/1 (with a header-read
/// timeout, which also closes idle keep-alive connections), then cancels the running
/// generations and waits for the open connections to finish.
async fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let app = routes::router(Arc::clone(&state));
    // Dropped on shutdown: every connection task sees it and shuts down gracefully.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    // Each connection holds a clone; `closed()` resolves when all are gone.
    let (alive_tx, alive_rx) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of file descriptors and the like: wait a moment and go on.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let svc = TowerToHyperService::new(app.clone());
        let header_timeout = state.cfg.header_timeout;
        let mut stop = stop_rx.clone();
        let alive = alive_rx.clone();
        tokio::spawn(async move {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(alive);
        });
    }
    drop(listener);
    // Cancel whatever is still generating so open streams end promptly.
    state.models.shutdown();
    drop(stop_tx);
    drop(alive_rx);
    alive_tx.closed().await;
    Ok(())
}

/// Starts a server for one model already loaded, on `listener` (e.g. bound to
/// `127.0.0.1:0`), on a background thread.
pub fn spawn(
    cfg: ServerConfig,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    listener: std::net::TcpListener,
) -> Result<ServerHandle, ServerError> {
    let models = models::ModelsConfig::single(&cfg, model, tok);
    spawn_models(cfg, models, listener)
}

/// Starts a server for several models on `listener`, on a background thread.
pub fn spawn_models(
    cfg: ServerConfig,
    models: models::ModelsConfig,
    listener: std::net::TcpListener,
) -> Result<ServerHandle, ServerError> {
    let addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let state = build_state(cfg, models)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("damascus-http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let registry = Arc::clone(&state.models);
            let res = rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                serve_on(listener, state, async move {
                    let _ = rx.await;
                })
                .await
            });
            drop(rt);
            registry.join_all();
            res
        })?;
    Ok(ServerHandle {
        addr,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// Binds `host:port`, serves one model until SIGINT or SIGTERM, then shuts down gracefully:
/// in-flight generations are cancelled, connections drained, slot threads joined. `on_ready`
/// is called with the bound address once listening.
pub fn run(
    cfg: ServerConfig,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    host: &str,
    port: u16,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let models = models::ModelsConfig::single(&cfg, model, tok);
    run_models(cfg, models, host, port, on_ready)
}

/// [`run`] for several models (the first is the default; see [`models`]).
pub fn run_models(
    cfg: ServerConfig,
    models: models::ModelsConfig,
    host: &str,
    port: u16,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let addr = format!("{host}:{port}");
    let listener = std::net::TcpListener::bind(&addr).map_err(|source| ServerError::Bind {
        addr: addr.clone(),
        source,
    })?;
    listener.set_nonblocking(true)?;
    let state = build_state(cfg, models)?;
    let registry = Arc::clone(&state.models);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        on_ready(listener.local_addr()?);
        serve_on(listener, state, shutdown_signal()).await
    });
    drop(rt);
    registry.join_all();
    res
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("damascus serve: shutting down");
}
