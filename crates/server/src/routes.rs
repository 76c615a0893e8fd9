//! The HTTP surface: routes, API-key check, OpenAI-shaped errors, streamed (SSE) and whole
//! replies.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use damascus_runtime::generate::{Completion, TokenEvent};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::AppState;
use crate::api::{self, Params};
use crate::metrics::Metrics;
use crate::worker::{Job, Out};

/// An error reply: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The offending request field, if any.
    pub param: Option<&'static str>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: String, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// Any status.
    pub fn new(status: StatusCode, kind: &'static str, message: String) -> Self {
        Self {
            status,
            message,
            kind,
            param: None,
            code: None,
        }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// The router with every route, the body limit and the auth / counting middleware.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/embeddings", post(crate::embeddings::embeddings))
        .route("/embeddings", post(crate::embeddings::embeddings))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard,
        ))
        .with_state(state)
}

/// Counts requests and errors; checks the API key (except on `/health` and `/metrics`).
async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    Metrics::add(&st.metrics.http_requests, 1);
    let path = req.uri().path();
    let open = matches!(path, "/health" | "/v1/health" | "/metrics");
    if let (Some(key), false) = (&st.cfg.api_key, open) {
        let h = req.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let xkey = h.get("x-api-key").and_then(|v| v.to_str().ok());
        if bearer != Some(key.as_str()) && xkey != Some(key.as_str()) {
            Metrics::add(&st.metrics.errors, 1);
            let msg = if bearer.is_none() && xkey.is_none() {
                "missing API key: send 'Authorization: Bearer <key>'"
            } else {
                "invalid API key"
            };
            return ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", msg.into())
                .with_code("invalid_api_key")
                .into_response();
        }
    }
    let resp = next.run(req).await;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        Metrics::add(&st.metrics.errors, 1);
    }
    resp
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("unknown route: {} {}", req.method(), req.uri().path()),
    )
    .with_code("not_found")
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!(
            "method {} not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    )
}

/// Maps a body extraction failure (too large = 413, unreadable = 400).
pub(crate) fn body_or_error(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "invalid_request_error",
                "request body too large".into(),
            )
            .with_code("request_too_large")
        } else {
            ApiError::new(status, "invalid_request_error", e.body_text())
        }
    })
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let busy = st
        .metrics
        .slots_busy
        .load(std::sync::atomic::Ordering::Relaxed);
    let queued = st
        .metrics
        .queue_depth
        .load(std::sync::atomic::Ordering::Relaxed);
    axum::Json(json!({
        "status": "ok",
        "slots_total": st.queue.slots(),
        "slots_processing": busy,
        "queue_depth": queued,
    }))
    .into_response()
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut r = st.metrics.render(st.queue.slots()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_id,
            "object": "model",
            "created": st.started,
            "owned_by": "damascus",
            "meta": {"n_ctx": st.n_ctx, "n_vocab": st.tok.n_vocab(), "aliases": st.cfg.aliases},
        }],
    }))
    .into_response()
}

async fn tokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::TokenizeRequest = api::parse(&body)?;
    let ids = st
        .tok
        .encode(&req.content, req.add_special, req.parse_special);
    let tokens: Vec<Value> = if req.with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": st.tok.token_piece(id).unwrap_or_default()}))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(axum::Json(json!({"tokens": tokens})).into_response())
}

async fn detokenize(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::DetokenizeRequest = api::parse(&body)?;
    let content = st
        .tok
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(axum::Json(json!({"content": content})).into_response())
}

fn check_model(st: &AppState, p: &Params) -> Result<(), ApiError> {
    match &p.model {
        None => Ok(()),
        Some(m) if *m == st.cfg.model_id || st.cfg.aliases.iter().any(|a| a == m) => Ok(()),
        Some(m) => Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model '{m}' does not exist; this server serves '{}'",
                st.cfg.model_id
            ),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        }),
    }
}

/// How replies are shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

/// Everything the reply builders need.
#[derive(Debug)]
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    include_usage: bool,
}

async fn chat(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::ChatRequest = api::parse(&body)?;
    check_model(&st, &req.params)?;
    let top = api::top_logprobs(req.top_logprobs, "top_logprobs")?;
    let prompt = api::chat_prompt(&st.tok, st.template.as_ref(), &req.messages)?;
    let (s, mut g) = req
        .params
        .configs(prompt.len(), st.n_ctx, st.cfg.max_tokens_cap)?;
    g.logprobs = req.logprobs;
    g.top_logprobs = if req.logprobs { top } else { 0 };
    start(&st, Kind::Chat, prompt, s, g, &req.params, req.logprobs).await
}

async fn completions(
    State(st): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::CompletionRequest = api::parse(&body)?;
    check_model(&st, &req.params)?;
    if req.echo {
        return Err(ApiError::bad_request(
            "echo is not supported".into(),
            Some("echo"),
        ));
    }
    let top = api::top_logprobs(req.logprobs, "logprobs")?;
    let prompt = api::completion_prompt(&st.tok, &req.prompt)?;
    let (s, mut g) = req
        .params
        .configs(prompt.len(), st.n_ctx, st.cfg.max_tokens_cap)?;
    g.logprobs = req.logprobs.is_some();
    g.top_logprobs = top;
    start(
        &st,
        Kind::Completion,
        prompt,
        s,
        g,
        &req.params,
        req.logprobs.is_some(),
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn start(
    st: &AppState,
    kind: Kind,
    prompt: Vec<u32>,
    sampler: damascus_runtime::sampler::SamplerConfig,
    gen_cfg: damascus_runtime::generate::GenerateConfig,
    params: &Params,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let n = st.queue.next_id();
    let job = Job {
        id: n,
        kind: match kind {
            Kind::Chat => "chat",
            Kind::Completion => "completion",
        },
        prompt,
        sampler,
        generate: gen_cfg,
        cache_prompt: params.cache_prompt.unwrap_or(true),
        tx,
        enqueued: Instant::now(),
    };
    st.queue.submit(job).map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is busy (request queue full); retry later".into(),
        )
        .with_code("queue_full")
    })?;
    let reply = Reply {
        kind,
        id: match kind {
            Kind::Chat => format!("chatcmpl-{n}"),
            Kind::Completion => format!("cmpl-{n}"),
        },
        created: crate::now_unix(),
        model: st.cfg.model_id.clone(),
        logprobs,
        include_usage: params.include_usage(),
    };
    if params.stream {
        Ok(stream_reply(Arc::clone(&st.tok), reply, rx))
    } else {
        whole_reply(&st.tok, reply, rx).await
    }
}

fn server_error(msg: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", msg)
}

async fn whole_reply(
    tok: &damascus_tokenizer::Tokenizer,
    r: Reply,
    mut rx: UnboundedReceiver<Out>,
) -> Result<Response, ApiError> {
    let mut tokens: Vec<TokenEvent> = Vec::new();
    let done: Completion = loop {
        match rx.recv().await {
            Some(Out::Token(t)) => {
                if r.logprobs && !tok.is_eog(t.id) {
                    tokens.push(t);
                }
            }
            Some(Out::Done(c, _)) => break *c,
            Some(Out::Error(e)) => return Err(server_error(e)),
            None => return Err(server_error("the generation ended unexpectedly".into())),
        }
    };
    let finish = api::finish_reason(&done.reason);
    let body = match r.kind {
        Kind::Chat => {
            let lp = r.logprobs.then(|| {
                json!({"content": tokens.iter().map(|t| api::chat_logprob(tok, t)).collect::<Vec<_>>()})
            });
            json!({
                "id": r.id, "object": "chat.completion", "created": r.created, "model": r.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": done.text},
                    "logprobs": lp,
                    "finish_reason": finish,
                }],
                "usage": api::usage(&done.timings),
                "timings": api::timings(&done.timings),
            })
        }
        Kind::Completion => {
            let lp = r.logprobs.then(|| api::completion_logprobs(tok, &tokens));
            json!({
                "id": r.id, "object": "text_completion", "created": r.created, "model": r.model,
                "choices": [{"index": 0, "text": done.text, "logprobs": lp, "finish_reason": finish}],
                "usage": api::usage(&done.timings),
                "timings": api::timings(&done.timings),
            })
        }
    };
    Ok(axum::Json(body).into_response())
}

/// State of one SSE reply.
struct Streamer {
    tok: Arc<damascus_tokenizer::Tokenizer>,
    r: Reply,
    rx: UnboundedReceiver<Out>,
    started: bool,
    finished: bool,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Streamer {
    fn chunk(&self, text: &str, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        match self.r.kind {
            Kind::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({
                    "id": self.r.id, "object": "chat.completion.chunk", "created": self.r.created,
                    "model": self.r.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                })
            }
            Kind::Completion => json!({
                "id": self.r.id, "object": "text_completion", "created": self.r.created,
                "model": self.r.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            }),
        }
    }

    fn token_logprobs(&self, t: &TokenEvent) -> Option<Value> {
        if !self.r.logprobs {
            return None;
        }
        Some(match self.r.kind {
            Kind::Chat => json!({"content": [api::chat_logprob(&self.tok, t)]}),
            Kind::Completion => api::completion_logprobs(&self.tok, std::slice::from_ref(t)),
        })
    }

    /// The next piece of the body, or `None` when the stream is over.
    async fn next(&mut self) -> Option<String> {
        if self.finished {
            return None;
        }
        let mut out = String::new();
        if !self.started && self.r.kind == Kind::Chat {
            self.started = true;
            let mut first = self.chunk("", None, None);
            first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
            out.push_str(&sse(&first));
        }
        self.started = true;
        loop {
            match self.rx.recv().await {
                Some(Out::Token(t)) => {
                    let eog = self.tok.is_eog(t.id);
                    let lp = if eog { None } else { self.token_logprobs(&t) };
                    if !t.text.is_empty() || lp.is_some() {
                        out.push_str(&sse(&self.chunk(&t.text, lp, None)));
                        return Some(out);
                    }
                    if !out.is_empty() {
                        return Some(out);
                    }
                }
                Some(Out::Done(c, _)) => {
                    if !c.tail.is_empty() {
                        out.push_str(&sse(&self.chunk(&c.tail, None, None)));
                    }
                    let mut fin = self.chunk("", None, Some(api::finish_reason(&c.reason)));
                    fin["timings"] = api::timings(&c.timings);
                    if self.r.include_usage {
                        out.push_str(&sse(&fin));
                        let mut u = self.chunk("", None, None);
                        u["choices"] = json!([]);
                        u["usage"] = api::usage(&c.timings);
                        out.push_str(&sse(&u));
                    } else {
                        fin["usage"] = api::usage(&c.timings);
                        out.push_str(&sse(&fin));
                    }
                    out.push_str("data: [DONE]\n\n");
                    self.finished = true;
                    return Some(out);
                }
                Some(Out::Error(e)) => {
                    out.push_str(&sse(&server_error(e).body()));
                    out.push_str("data: [DONE]\n\n");
                    self.finished = true;
                    return Some(out);
                }
                None => {
                    self.finished = true;
                    return (!out.is_empty()).then_some(out);
                }
            }
        }
    }
}

fn stream_reply(
    tok: Arc<damascus_tokenizer::Tokenizer>,
    r: Reply,
    rx: UnboundedReceiver<Out>,
) -> Response {
    let s = Streamer {
        tok,
        r,
        rx,
        started: false,
        finished: false,
    };
    let body = futures_util::stream::unfold(s, |mut s| async move {
        s.next()
            .await
            .map(|chunk| (Ok::<Bytes, Infallible>(Bytes::from(chunk)), s))
    });
    let mut resp = Body::from_stream(body).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
