//! Request bodies (OpenAI / llama-server shapes), their validation into sampler and generation
//! settings, and the JSON pieces of the replies.

use damascus_runtime::generate::{GenerateConfig, StopReason, Timings, TokenEvent};
use damascus_runtime::sampler::SamplerConfig;
use damascus_tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::routes::ApiError;

/// Most stop strings per request.
pub const MAX_STOP: usize = 16;
/// Most alternatives per token for `top_logprobs`.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum StopField {
    /// `"stop": "\n"`
    One(String),
    /// `"stop": ["\n", "###"]`
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with empty `choices` and the `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and stopping fields common to chat and completions.
#[derive(Debug, Default, Deserialize)]
pub struct Params {
    /// Model name; must be the served id or an alias when given.
    pub model: Option<String>,
    /// Token budget (llama-server's `n_predict` is accepted as its other name).
    #[serde(alias = "n_predict")]
    pub max_tokens: Option<i64>,
    /// Newer spelling of `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// Temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Top-k (0 disables).
    pub top_k: Option<i64>,
    /// Min-p (0 disables).
    pub min_p: Option<f32>,
    /// RNG seed (negative = random).
    pub seed: Option<i64>,
    /// Reuse the common prompt prefix left in the slot's KV cache (llama.cpp server's
    /// `cache_prompt`, default true). `false` evaluates the whole prompt afresh: slower; the
    /// logits are the same either way on the batching engine.
    pub cache_prompt: Option<bool>,
    /// Stop strings.
    pub stop: Option<StopField>,
    /// Keep generating past end-of-generation tokens (llama-server's field; serving
    /// benchmarks send it).
    pub ignore_eos: Option<bool>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (llama.cpp extension).
    pub repeat_penalty: Option<f32>,
    /// Stream the reply as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Number of choices (generated one after another in the same slot, sharing the prompt's
    /// cache).
    pub n: Option<i64>,
    /// `{"token id": bias}` (OpenAI) or `[[id or text, bias or false], ...]` (llama-server).
    pub logit_bias: Option<Value>,
    /// An end-user id (accepted and ignored, as it only labels the request).
    pub user: Option<Value>,
}

/// A chat message's content: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of content parts")]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": "..."}]`
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a content part object")]
pub struct Part {
    /// Part type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// One chat message.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a message object")]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The content (null allowed for assistant turns).
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a JSON object")]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Report log-probabilities of the sampled tokens.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per token (needs `logprobs`).
    pub top_logprobs: Option<i64>,
    /// Sampling fields.
    #[serde(flatten)]
    pub params: Params,
}

/// A completion prompt: text, token ids, or a list of either (one completion each).
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of token ids, or a list of strings / token-id lists"
)]
pub enum PromptField {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
    /// Several prompts.
    Many(Vec<PromptItem>),
}

/// One prompt of a list.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of token ids")]
pub enum PromptItem {
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a JSON object")]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: PromptField,
    /// Legacy logprobs: number of alternatives per token (0 = only the sampled token's).
    pub logprobs: Option<i64>,
    /// Echo the prompt (unsupported when true).
    #[serde(default)]
    pub echo: bool,
    /// Completions generated server-side per prompt to pick the best from; only `n` (or 1) is
    /// supported, i.e. no extra candidates.
    pub best_of: Option<i64>,
    /// Sampling fields.
    #[serde(flatten)]
    pub params: Params,
}

/// `POST /tokenize` body.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// Text to tokenize.
    pub content: String,
    /// The model whose tokenizer to use (default: the server's default model).
    #[serde(default)]
    pub model: Option<String>,
    /// Add BOS/EOS as the model's metadata asks.
    #[serde(default)]
    pub add_special: bool,
    /// Parse control-token strings as single tokens.
    #[serde(default = "yes")]
    pub parse_special: bool,
    /// Return `{"id", "piece"}` objects instead of plain ids.
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /detokenize` body.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// The model whose tokenizer to use (default: the server's default model).
    #[serde(default)]
    pub model: Option<String>,
}

/// Request fields both generation endpoints implement.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "n_predict",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "cache_prompt",
    "ignore_eos",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "stream",
    "stream_options",
    "n",
    "logit_bias",
    "user",
];

/// The fields `POST /v1/chat/completions` implements; any other (non-null) field answers 400
/// `unsupported_parameter` naming it, never a silent 200 (structured output and tools are
/// `structured`'s fields).
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "logprobs",
    "top_logprobs",
    "response_format",
    "grammar",
    "json_schema",
    "tools",
    "tool_choice",
];

/// The fields `POST /v1/completions` implements (see [`CHAT_FIELDS`]).
pub const COMPLETION_FIELDS: &[&str] = &[
    "prompt",
    "logprobs",
    "echo",
    "best_of",
    "response_format",
    "grammar",
    "json_schema",
    "tools",
];

/// Most choices one request may ask for (`n` times the number of prompts).
pub const MAX_CHOICES: usize = 16;

/// Parses a JSON body, mapping syntax and type errors to HTTP 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })
}

/// Parses a generation request body: malformed JSON and wrong types are 400
/// `invalid_request_error`; a field outside the common ones (`COMMON_FIELDS`) and `fields` is 400
/// `unsupported_parameter` with `param` naming it. Null fields count as absent.
pub fn parse_request<T: serde::de::DeserializeOwned>(
    body: &[u8],
    fields: &[&str],
) -> Result<T, ApiError> {
    let mut v: Value = parse(body)?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ApiError::bad_request(
            "invalid request: the body must be a JSON object".into(),
            None,
        ));
    };
    obj.retain(|_, v| !v.is_null());
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    if let Some(k) = keys
        .into_iter()
        .find(|k| !COMMON_FIELDS.contains(&k.as_str()) && !fields.contains(&k.as_str()))
    {
        return Err(unsupported(
            k,
            format!("'{k}' is not supported by this server"),
        ));
    }
    serde_json::from_value(v)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
}

/// A 400 `unsupported_parameter` error for field `name`.
pub fn unsupported(name: &str, message: String) -> ApiError {
    ApiError::bad_request(message, None)
        .with_param(name.to_string())
        .with_code("unsupported_parameter")
}

fn bad(param: &'static str, msg: String) -> ApiError {
    ApiError::bad_request(msg, Some(param))
}

/// `s` cut to at most `max` characters (with `…` when cut), so errors never echo a huge input.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

impl Params {
    /// The number of choices per prompt (`n`, default 1).
    pub fn n_choices(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(bad("n", format!("n must be in 1..={MAX_CHOICES}, got {n}"))),
        }
    }

    /// `logit_bias` as `(token, bias)` pairs: OpenAI's `{"id": bias}` object (ids as strings,
    /// bias in -100..=100, -100 bans the token) or llama-server's `[[id or text, bias or
    /// false], ...]` list (a text entry biases each of its tokens; `false` bans).
    pub fn logit_bias(&self, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
        let p = "logit_bias";
        let n_vocab = tok.n_vocab();
        let id_of = |k: &str| -> Result<u32, ApiError> {
            match k.trim().parse::<u32>() {
                Ok(id) if (id as usize) < n_vocab => Ok(id),
                Ok(id) => Err(bad(
                    p,
                    format!("logit_bias: token id {id} is out of range (n_vocab = {n_vocab})"),
                )),
                Err(_) => Err(bad(
                    p,
                    format!("logit_bias: key '{}' is not a token id", clip(k, 40)),
                )),
            }
        };
        let bias_of = |v: &Value| -> Result<f32, ApiError> {
            match v {
                Value::Bool(false) => Ok(f32::NEG_INFINITY),
                Value::Number(n) => match n.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok(if b <= -100.0 {
                        f32::NEG_INFINITY
                    } else {
                        b as f32
                    }),
                    _ => Err(bad(p, format!("logit_bias: {n} is outside -100..=100"))),
                },
                _ => Err(bad(
                    p,
                    "logit_bias: a bias must be a number or false".into(),
                )),
            }
        };
        let mut out = Vec::new();
        match &self.logit_bias {
            None => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    out.push((id_of(k)?, bias_of(v)?));
                }
            }
            Some(Value::Array(items)) => {
                for item in items {
                    let pair = item.as_array().filter(|a| a.len() == 2).ok_or_else(|| {
                        bad(p, "logit_bias: list entries are [token, bias] pairs".into())
                    })?;
                    let b = bias_of(&pair[1])?;
                    match &pair[0] {
                        Value::Number(n) => out.push((id_of(&n.to_string())?, b)),
                        Value::String(t) => {
                            out.extend(tok.encode(t, false, false).into_iter().map(|id| (id, b)))
                        }
                        _ => {
                            return Err(bad(p, "logit_bias: a token is an id or a text".into()));
                        }
                    }
                }
            }
            Some(_) => {
                return Err(bad(
                    p,
                    "logit_bias must be an object of token id -> bias".into(),
                ));
            }
        }
        Ok(out)
    }

    /// Validates the fields and builds the sampler and generation settings for a prompt of
    /// `n_prompt` tokens in a slot of `n_ctx` positions, with `max_tokens` at most `cap`.
    /// `prompt_param` names the prompt field in errors (`messages` or `prompt`).
    pub fn configs(
        &self,
        n_prompt: usize,
        n_ctx: usize,
        cap: usize,
        prompt_param: &'static str,
    ) -> Result<(SamplerConfig, GenerateConfig), ApiError> {
        if n_prompt == 0 {
            return Err(bad(prompt_param, "the prompt is empty".into()));
        }
        if n_prompt >= n_ctx {
            return Err(ApiError::bad_request(
                format!(
                    "the prompt has {n_prompt} tokens but the context holds {n_ctx}; \
                     shorten the prompt or start the server with a larger --ctx-size"
                ),
                Some(prompt_param),
            )
            .with_code("context_length_exceeded"));
        }
        let room = n_ctx - n_prompt;
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            None => cap.min(room),
            Some(n) if n < 1 => {
                return Err(bad(
                    "max_tokens",
                    format!("max_tokens must be >= 1, got {n}"),
                ));
            }
            Some(n) if n as u64 > cap as u64 => {
                return Err(bad(
                    "max_tokens",
                    format!("max_tokens = {n} exceeds this server's limit of {cap}"),
                ));
            }
            Some(n) => n as usize,
        };
        let mut s = SamplerConfig::default();
        if let Some(t) = self.temperature {
            if !(t.is_finite() && t >= 0.0) {
                return Err(bad(
                    "temperature",
                    format!("temperature must be >= 0, got {t}"),
                ));
            }
            s.temp = t;
        }
        if let Some(p) = self.top_p {
            s.top_p = p;
        }
        if let Some(k) = self.top_k {
            s.top_k = usize::try_from(k)
                .map_err(|_| bad("top_k", format!("top_k must be >= 0, got {k}")))?;
        }
        if let Some(p) = self.min_p {
            s.min_p = p;
        }
        if let Some(p) = self.presence_penalty {
            s.presence_penalty = p;
        }
        if let Some(p) = self.frequency_penalty {
            s.frequency_penalty = p;
        }
        if let Some(p) = self.repeat_penalty {
            s.repeat_penalty = p;
        }
        s.seed = self.seed.and_then(|v| u64::try_from(v).ok());
        s.validate()
            .map_err(|e| ApiError::bad_request(e.to_string(), None))?;
        let stop: Vec<String> = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        if stop.len() > MAX_STOP {
            return Err(bad("stop", format!("at most {MAX_STOP} stop strings")));
        }
        let g = GenerateConfig {
            max_tokens: Some(max_tokens),
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            ..GenerateConfig::default()
        };
        Ok((s, g))
    }

    /// Whether to send a separate usage chunk at the end of a stream.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// Checks `top_logprobs` and returns it as a count.
pub fn top_logprobs(n: Option<i64>, param: &'static str) -> Result<usize, ApiError> {
    match n {
        None => Ok(0),
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(bad(
            param,
            format!("{param} must be in 0..={MAX_TOP_LOGPROBS}, got {n}"),
        )),
    }
}

/// The message roles a chat request may use.
pub const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Renders chat messages through the template and tokenizes them (BOS added when the model asks
/// and the template did not write it).
pub fn chat_prompt(
    tok: &Tokenizer,
    template: Option<&damascus_tokenizer::ChatTemplate>,
    messages: &[ChatMessage],
) -> Result<Vec<u32>, ApiError> {
    let template = template.ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template; use /v1/completions".into(),
            None,
        )
    })?;
    if messages.is_empty() {
        return Err(bad("messages", "messages must not be empty".into()));
    }
    let mut list = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(bad(
                "messages",
                format!(
                    "message #{i}: unknown role '{}' (one of: {})",
                    clip(&m.role, 40),
                    ROLES.join(", ")
                ),
            ));
        }
        let content = match &m.content {
            // An assistant turn may carry only tool calls; every other role needs content.
            None if m.role == "assistant" => String::new(),
            None => {
                return Err(bad(
                    "messages",
                    format!("message #{i} ({}): 'content' is required", m.role),
                ));
            }
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(bad(
                            "messages",
                            format!(
                                "message #{i}: content part type '{}' is not supported",
                                p.kind
                            ),
                        ));
                    }
                    s.push_str(p.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        list.push(json!({"role": m.role, "content": content}));
    }
    let text = template
        .render(&Value::Array(list), true, None)
        .map_err(|e| bad("messages", format!("chat template: {e}")))?;
    let mut ids = tok.encode(&text, false, true);
    if let Some(bos) = tok.bos().filter(|_| tok.add_bos())
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    Ok(ids)
}

/// Tokenizes completion prompts the way `damascus generate` does (BOS as the model asks,
/// control-token strings kept as text): one list of ids per prompt.
pub fn completion_prompts(
    tok: &Tokenizer,
    prompt: &PromptField,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let n = tok.n_vocab();
    let ids_ok = |ids: &[u32]| -> Result<Vec<u32>, ApiError> {
        if let Some(bad_id) = ids.iter().find(|&&i| i as usize >= n) {
            return Err(bad(
                "prompt",
                format!("token id {bad_id} is out of range (n_vocab = {n})"),
            ));
        }
        Ok(ids.to_vec())
    };
    match prompt {
        PromptField::Text(t) => Ok(vec![tok.encode(t, true, false)]),
        PromptField::Ids(ids) => Ok(vec![ids_ok(ids)?]),
        PromptField::Many(v) if v.is_empty() => {
            Err(bad("prompt", "the list of prompts is empty".into()))
        }
        PromptField::Many(v) if v.len() > MAX_CHOICES => Err(bad(
            "prompt",
            format!("at most {MAX_CHOICES} prompts per request, got {}", v.len()),
        )),
        PromptField::Many(v) => v
            .iter()
            .map(|p| match p {
                PromptItem::Text(t) => Ok(tok.encode(t, true, false)),
                PromptItem::Ids(ids) => ids_ok(ids),
            })
            .collect(),
    }
}

/// OpenAI `finish_reason` of a stop reason.
pub fn finish_reason(r: &StopReason) -> &'static str {
    match r {
        StopReason::Eog | StopReason::StopString(_) | StopReason::Cancelled => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

/// The `usage` object.
pub fn usage(t: &Timings) -> Value {
    json!({
        "prompt_tokens": t.prompt_tokens,
        "completion_tokens": t.generated_tokens,
        "total_tokens": t.prompt_tokens + t.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": t.prompt_cached},
    })
}

/// llama-server style `timings` object.
pub fn timings(t: &Timings) -> Value {
    json!({
        "prompt_n": t.prompt_evaluated,
        "prompt_cached": t.prompt_cached,
        "prompt_ms": t.prompt_ms,
        "prompt_per_second": t.prompt_tok_per_s(),
        "predicted_n": t.generated_tokens,
        "predicted_ms": t.generation_ms,
        "predicted_per_second": t.generation_tok_per_s(),
        "ttft_ms": t.ttft_ms,
    })
}

fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id).map(<[u8]>::to_vec).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// One entry of a chat `logprobs.content` list.
pub fn chat_logprob(tok: &Tokenizer, t: &TokenEvent) -> Value {
    let (text, bytes) = piece(tok, t.id);
    let top: Vec<Value> = t
        .top_logprobs
        .iter()
        .map(|a| {
            let (text, bytes) = piece(tok, a.id);
            json!({"token": text, "logprob": a.logprob, "bytes": bytes})
        })
        .collect();
    json!({
        "token": text,
        "logprob": t.logprob.unwrap_or(f32::NEG_INFINITY).max(-9999.0),
        "bytes": bytes,
        "top_logprobs": top,
    })
}

/// The legacy completions `logprobs` object for `tokens`.
pub fn completion_logprobs(tok: &Tokenizer, tokens: &[TokenEvent]) -> Value {
    let mut texts = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    let mut off = 0usize;
    for t in tokens {
        let (text, _) = piece(tok, t.id);
        offsets.push(off);
        off += text.len();
        texts.push(text);
        lps.push(t.logprob.unwrap_or(f32::NEG_INFINITY).max(-9999.0));
        let mut m = serde_json::Map::new();
        for a in &t.top_logprobs {
            m.insert(piece(tok, a.id).0, json!(a.logprob));
        }
        tops.push(Value::Object(m));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
