//! The HTTP surface: routes, API-key check, OpenAI-shaped errors, streamed (SSE) and whole
//! replies.

use std::borrow::Cow;
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

use crate::api::{self, Params};
use crate::metrics::Metrics;
use crate::structured;
use crate::worker::{Job, Out};
use crate::{AppState, ServerState, models};

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
    pub param: Option<Cow<'static, str>>,
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
            param: param.map(Cow::Borrowed),
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

    /// Sets the offending field.
    pub fn with_param(mut self, param: String) -> Self {
        self.param = Some(Cow::Owned(param));
        self
    }

    /// The JSON body; the message is clipped so a huge input is never echoed back.
    fn body(&self) -> Value {
        json!({"error": {
            "message": api::clip(&self.message, MAX_MESSAGE_CHARS),
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// Longest error message sent back, in characters.
const MAX_MESSAGE_CHARS: usize = 400;

/// Seconds a client is told to wait (`Retry-After`) when the queue is full or the server stops.
const RETRY_AFTER_S: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        }
        r
    }
}

/// The router with every route, the body limit and the auth / counting middleware.
pub fn router(state: Arc<ServerState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    Router::new()
        .route("/health", get(models::health))
        .route("/v1/health", get(models::health))
        .route("/metrics", get(models::metrics))
        .route("/v1/models", get(models::list))
        .route("/models", get(models::list))
        .route("/v1/models/{id}", get(models::one))
        .route("/models/{id}", get(models::one))
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
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            cors,
        ))
        .with_state(state)
}

/// CORS (only with `--cors-origin`): answers preflight `OPTIONS` requests (before the API-key
/// check, as browsers send no credentials there) and adds `Access-Control-Allow-Origin` to
/// replies for an allowed `Origin`. Without the setting, no CORS header is ever sent.
async fn cors(State(st): State<Arc<ServerState>>, req: Request, next: Next) -> Response {
    let Some(allowed) = st.cfg.cors_origin.as_deref() else {
        return next.run(req).await;
    };
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let ok_origin = origin.filter(|o| allowed == "*" || o == allowed);
    let preflight = req.method() == axum::http::Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = if preflight {
        let mut r = StatusCode::NO_CONTENT.into_response();
        if ok_origin.is_some() {
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            let asked = req
                .headers()
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(HeaderValue::from_static("authorization, content-type"));
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
        }
        r
    } else {
        next.run(req).await
    };
    let h = resp.headers_mut();
    h.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(v) = ok_origin.and_then(|o| HeaderValue::from_str(&o).ok()) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    resp
}

/// `Authorization: <scheme> <token>` with the scheme `Bearer` in any case.
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// Counts requests and errors; checks the API key (except on `/health` and `/metrics`).
async fn guard(State(st): State<Arc<ServerState>>, req: Request, next: Next) -> Response {
    Metrics::add(&st.metrics.http_requests, 1);
    let path = req.uri().path();
    let open = matches!(path, "/health" | "/v1/health" | "/metrics");
    if let (Some(key), false) = (&st.cfg.api_key, open) {
        let h = req.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token);
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
    // The whole body is read here, within the body-read timeout (a client sending it slowly
    // is cut off with 408), and handed on in memory.
    let (parts, body) = req.into_parts();
    let limit = st.cfg.max_body_bytes;
    let bytes =
        match tokio::time::timeout(st.cfg.body_timeout, axum::body::to_bytes(body, limit)).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => {
                Metrics::add(&st.metrics.errors, 1);
                return ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "request body too large or unreadable".into(),
                )
                .with_code("request_too_large")
                .into_response();
            }
            Err(_) => {
                Metrics::add(&st.metrics.errors, 1);
                let mut r = ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    format!(
                        "the request body was not received within {} s",
                        st.cfg.body_timeout.as_secs_f32()
                    ),
                )
                .with_code("request_timeout")
                .into_response();
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
        };
    let req = Request::from_parts(parts, Body::from(bytes));
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

async fn tokenize(
    State(srv): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::TokenizeRequest = api::parse(&body)?;
    let st = srv.models.get(req.model.as_deref()).await?;
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
    State(srv): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::DetokenizeRequest = api::parse(&body)?;
    let st = srv.models.get(req.model.as_deref()).await?;
    let content = st
        .tok
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(axum::Json(json!({"content": content})).into_response())
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
    /// Choices in all (`n` times the number of prompts).
    n_choices: usize,
    /// Choices per prompt.
    n: usize,
    /// Tools offered (chat): a reply that is a tool call becomes `tool_calls`.
    tools: Option<structured::ToolPlan>,
    /// The model, held until the reply ends so an unloaded model finishes this request.
    _model: Arc<AppState>,
}

async fn chat(
    State(srv): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::ChatRequest = api::parse_request(&body, api::CHAT_FIELDS)?;
    let st = srv.models.get(req.params.model.as_deref()).await?;
    let n = req.params.n_choices()?;
    let top = api::top_logprobs(req.top_logprobs, "top_logprobs")?;
    let extras: structured::Extras = api::parse(&body)?;
    let plan = structured::Plan::new(&extras, st.template.as_ref())?;
    if plan.tools.is_some() && n > 1 {
        return Err(api::unsupported(
            "n",
            "n > 1 together with tools is not supported".into(),
        ));
    }
    let prompt = if structured::needs_prompt(&extras, &plan) {
        structured::chat_prompt(&st.tok, st.template.as_ref(), &extras, &plan)?
    } else {
        api::chat_prompt(&st.tok, st.template.as_ref(), &req.messages)?
    };
    let (mut s, mut g) =
        req.params
            .configs(prompt.len(), st.n_ctx, st.cfg.max_tokens_cap, "messages")?;
    s.logit_bias = req.params.logit_bias(&st.tok)?;
    g.logprobs = req.logprobs;
    g.top_logprobs = if req.logprobs { top } else { 0 };
    let job = JobSpec {
        kind: Kind::Chat,
        prompts: vec![prompt],
        n,
        logprobs: req.logprobs,
        plan,
    };
    start(&st, job, s, g, &req.params).await
}

async fn completions(
    State(srv): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: api::CompletionRequest = api::parse_request(&body, api::COMPLETION_FIELDS)?;
    let st = srv.models.get(req.params.model.as_deref()).await?;
    if req.echo {
        return Err(api::unsupported("echo", "echo is not supported".into()));
    }
    let n = req.params.n_choices()?;
    if req.best_of.is_some_and(|b| b != 1 && b != n as i64) {
        return Err(api::unsupported(
            "best_of",
            "best_of other than 1 or n is not supported".into(),
        ));
    }
    let top = api::top_logprobs(req.logprobs, "logprobs")?;
    let extras: structured::Extras = api::parse(&body)?;
    if extras.tools.is_some() {
        return Err(ApiError::bad_request(
            "tools are only supported on /v1/chat/completions".into(),
            Some("tools"),
        ));
    }
    let plan = structured::Plan::new(&extras, None)?;
    let prompts = api::completion_prompts(&st.tok, &req.prompt)?;
    if prompts.len() * n > api::MAX_CHOICES {
        return Err(ApiError::bad_request(
            format!(
                "{} prompts x n = {n} asks for more than {} choices",
                prompts.len(),
                api::MAX_CHOICES
            ),
            Some("n"),
        ));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
    // Both bounds: an empty prompt and an over-long one are each refused.
    req.params
        .configs(shortest, st.n_ctx, st.cfg.max_tokens_cap, "prompt")?;
    let (mut s, mut g) = req
        .params
        .configs(longest, st.n_ctx, st.cfg.max_tokens_cap, "prompt")?;
    if req
        .params
        .max_completion_tokens
        .or(req.params.max_tokens)
        .is_none()
    {
        // The default budget is the room left by the shortest prompt; the generation loop
        // stops each longer one at its own full context.
        g.max_tokens = Some(st.cfg.max_tokens_cap.min(st.n_ctx - shortest));
    }
    s.logit_bias = req.params.logit_bias(&st.tok)?;
    g.logprobs = req.logprobs.is_some();
    g.top_logprobs = top;
    let job = JobSpec {
        kind: Kind::Completion,
        prompts,
        n,
        logprobs: req.logprobs.is_some(),
        plan,
    };
    start(&st, job, s, g, &req.params).await
}

/// What a handler asks the worker for.
struct JobSpec {
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    n: usize,
    logprobs: bool,
    /// Structured output / tools: the grammar constraint and the tool plan.
    plan: structured::Plan,
}

async fn start(
    st: &Arc<AppState>,
    spec: JobSpec,
    sampler: damascus_runtime::sampler::SamplerConfig,
    gen_cfg: damascus_runtime::generate::GenerateConfig,
    params: &Params,
) -> Result<Response, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let n = st.next_id();
    let kind = spec.kind;
    let n_choices = spec.prompts.len() * spec.n;
    let job = Job {
        id: n,
        kind: match kind {
            Kind::Chat => "chat",
            Kind::Completion => "completion",
        },
        prompts: spec.prompts,
        n: spec.n,
        sampler,
        generate: gen_cfg,
        cache_prompt: params.cache_prompt.unwrap_or(true),
        grammar: spec.plan.constraint(&st.grammar_vocab, &st.tok),
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
        logprobs: spec.logprobs,
        include_usage: params.include_usage(),
        n_choices,
        n: spec.n,
        tools: spec.plan.tools,
        _model: Arc::clone(st),
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

/// The error a generation cut off by shutdown ends with (a 503 or the stream's last event), so
/// a client can tell it from a normal stop.
fn shutdown_error() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "the server shut down before the generation finished".into(),
    )
    .with_code("server_shutdown")
}

/// Usage summed over choices: the prompt of each prompt counted once, completions all.
#[derive(Default)]
struct UsageSum {
    prompt: usize,
    cached: usize,
    completion: usize,
}

impl UsageSum {
    fn add(&mut self, t: &damascus_runtime::generate::Timings, first_of_prompt: bool) {
        if first_of_prompt {
            self.prompt += t.prompt_tokens;
            self.cached += t.prompt_cached;
        }
        self.completion += t.generated_tokens;
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

async fn whole_reply(
    tok: &damascus_tokenizer::Tokenizer,
    r: Reply,
    mut rx: UnboundedReceiver<Out>,
) -> Result<Response, ApiError> {
    let mut tokens: Vec<Vec<TokenEvent>> = (0..r.n_choices).map(|_| Vec::new()).collect();
    let mut done: Vec<Option<Completion>> = (0..r.n_choices).map(|_| None).collect();
    let mut left = r.n_choices;
    while left > 0 {
        match rx.recv().await {
            Some(Out::Token(i, t)) => {
                if r.logprobs && !tok.is_eog(t.id) {
                    tokens[i].push(t);
                }
            }
            Some(Out::Done(i, c, _)) => {
                done[i] = Some(*c);
                left -= 1;
            }
            Some(Out::Error(e)) => return Err(server_error(e)),
            Some(Out::Shutdown(..)) => return Err(shutdown_error()),
            None => return Err(server_error("the generation ended unexpectedly".into())),
        }
    }
    let done: Vec<Completion> = done.into_iter().flatten().collect();
    let mut usage = UsageSum::default();
    let mut choices = Vec::with_capacity(done.len());
    let mut last_timings = None;
    for (i, (c, toks)) in done.iter().zip(&tokens).enumerate() {
        // Choices of one prompt follow each other; the first of each counts the prompt.
        usage.add(&c.timings, i % r.n == 0);
        let finish = api::finish_reason(&c.reason);
        choices.push(match r.kind {
            Kind::Chat => {
                let lp = r.logprobs.then(|| {
                    json!({"content": toks.iter().map(|t| api::chat_logprob(tok, t)).collect::<Vec<_>>()})
                });
                json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": lp,
                    "finish_reason": finish,
                })
            }
            Kind::Completion => {
                let lp = r.logprobs.then(|| api::completion_logprobs(tok, toks));
                json!({"index": i, "text": c.text, "logprobs": lp, "finish_reason": finish})
            }
        });
        last_timings = Some(&c.timings);
    }
    let object = match r.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    let mut body = json!({
        "id": r.id, "object": object, "created": r.created, "model": r.model,
        "choices": choices,
        "usage": usage.json(),
        "timings": last_timings.map(api::timings),
    });
    if let Some(tp) = &r.tools {
        // With tools there is one choice (n > 1 is refused).
        structured::tool_reply(&mut body, tp, &r.id);
    }
    Ok(axum::Json(body).into_response())
}
/// State of one SSE reply.
struct Streamer {
    tok: Arc<damascus_tokenizer::Tokenizer>,
    r: Reply,
    rx: UnboundedReceiver<Out>,
    /// Choices whose first chunk (the role, for chat) went out.
    started: Vec<bool>,
    left: usize,
    usage: UsageSum,
    finished: bool,
    /// Text held back while a tool call may be forming (with tools: one choice).
    held: String,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Streamer {
    fn chunk(&self, i: usize, text: &str, logprobs: Option<Value>, finish: Option<&str>) -> Value {
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
                    "choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                })
            }
            Kind::Completion => json!({
                "id": self.r.id, "object": "text_completion", "created": self.r.created,
                "model": self.r.model,
                "choices": [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}],
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

    /// The role chunk that opens choice `i` of a chat stream (once).
    fn open(&mut self, i: usize, out: &mut String) {
        if self.r.kind == Kind::Chat && !self.started[i] {
            let mut first = self.chunk(i, "", None, None);
            first["choices"][0]["delta"] = json!({"role": "assistant", "content": ""});
            out.push_str(&sse(&first));
        }
        self.started[i] = true;
    }

    /// The next piece of the body, or `None` when the stream is over.
    async fn next(&mut self) -> Option<String> {
        if self.finished {
            return None;
        }
        let mut out = String::new();
        if self.r.n_choices > 0 && !self.started[0] {
            self.open(0, &mut out);
        }
        loop {
            match self.rx.recv().await {
                Some(Out::Token(i, t)) if self.r.tools.is_some() => {
                    self.open(i, &mut out);
                    self.held.push_str(&t.text);
                    if !out.is_empty() {
                        return Some(out);
                    }
                }
                Some(Out::Token(i, t)) => {
                    self.open(i, &mut out);
                    let eog = self.tok.is_eog(t.id);
                    let lp = if eog { None } else { self.token_logprobs(&t) };
                    if !t.text.is_empty() || lp.is_some() {
                        out.push_str(&sse(&self.chunk(i, &t.text, lp, None)));
                        return Some(out);
                    }
                    if !out.is_empty() {
                        return Some(out);
                    }
                }
                Some(Out::Done(i, c, _)) => {
                    self.open(i, &mut out);
                    let mut finish = api::finish_reason(&c.reason);
                    if let Some(tp) = &self.r.tools {
                        // The held text is a tool call (streamed as OpenAI's deltas) or plain
                        // content after all.
                        let text = std::mem::take(&mut self.held) + &c.tail;
                        if let Some(calls) = structured::tool_calls(&text, tp, &self.r.id) {
                            for d in structured::tool_deltas(&calls) {
                                let mut ch = self.chunk(i, "", None, None);
                                ch["choices"][0]["delta"] = d;
                                out.push_str(&sse(&ch));
                            }
                            finish = "tool_calls";
                        } else if !text.is_empty() {
                            out.push_str(&sse(&self.chunk(i, &text, None, None)));
                        }
                    } else if !c.tail.is_empty() {
                        out.push_str(&sse(&self.chunk(i, &c.tail, None, None)));
                    }
                    self.usage.add(&c.timings, i % self.r.n == 0);
                    self.left -= 1;
                    let mut fin = self.chunk(i, "", None, Some(finish));
                    fin["timings"] = api::timings(&c.timings);
                    if self.left > 0 {
                        out.push_str(&sse(&fin));
                        return Some(out);
                    }
                    if self.r.include_usage {
                        out.push_str(&sse(&fin));
                        let mut u = self.chunk(i, "", None, None);
                        u["choices"] = json!([]);
                        u["usage"] = self.usage.json();
                        out.push_str(&sse(&u));
                    } else {
                        fin["usage"] = self.usage.json();
                        out.push_str(&sse(&fin));
                    }
                    out.push_str("data: [DONE]\n\n");
                    self.finished = true;
                    return Some(out);
                }
                Some(Out::Shutdown(i, c)) => {
                    // The text generated so far, then an error event (not a finish_reason),
                    // so the client can tell the reply was cut off.
                    if !c.tail.is_empty() {
                        out.push_str(&sse(&self.chunk(i, &c.tail, None, None)));
                    }
                    out.push_str(&sse(&shutdown_error().body()));
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
        started: vec![false; r.n_choices],
        left: r.n_choices,
        r,
        rx,
        usage: UsageSum::default(),
        finished: false,
        held: String::new(),
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
