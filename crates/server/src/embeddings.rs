//! `POST /v1/embeddings`: OpenAI-shaped sentence embeddings (pooled final hidden states,
//! L2-normalised; pooling from the model's `pooling_type`, else mean).
//!
//! `input` is a string, a list of strings, a list of token ids or a list of such lists;
//! `encoding_format` is `float` (default) or `base64` (little-endian f32 bytes, as the OpenAI
//! Python client asks for by default). The forward passes run on a blocking thread beside the
//! generation slots.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use damascus_model::embed::{Pooling, embed};
use serde_json::{Value, json};

use crate::routes::{ApiError, body_or_error};
use crate::{AppState, ServerState};

/// Fields this route understands; any other answers 400 `unsupported_parameter`.
const FIELDS: &[&str] = &["input", "model", "encoding_format", "user"];

/// The texts or token lists of `input`, tokenized.
fn inputs(st: &AppState, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m.to_string(), Some("input"));
    let ids = |v: &[Value]| -> Option<Vec<u32>> {
        v.iter()
            .map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect()
    };
    let text = |s: &str| st.tok.encode(s, true, false);
    let lists = match input {
        Value::String(s) => vec![text(s)],
        Value::Array(a) if a.is_empty() => return Err(bad("`input` is an empty list")),
        Value::Array(a) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| text(s.as_str().unwrap_or_default()))
            .collect(),
        Value::Array(a) if a.iter().all(Value::is_number) => {
            vec![ids(a).ok_or_else(|| bad("token ids must be integers in u32 range"))?]
        }
        Value::Array(a) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|l| ids(l.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("token ids must be integers in u32 range"))?,
        _ => {
            return Err(bad(
                "`input` must be a string, a list of strings, a list of token ids or a list of such lists",
            ));
        }
    };
    let n_vocab = st.tok.n_vocab() as u32;
    for (i, l) in lists.iter().enumerate() {
        if l.is_empty() {
            return Err(bad(&format!("input {i} is empty")));
        }
        if let Some(&id) = l.iter().find(|&&id| id >= n_vocab) {
            return Err(bad(&format!(
                "input {i}: token id {id} is outside the vocabulary"
            )));
        }
        if l.len() > st.n_ctx {
            return Err(ApiError::bad_request(
                format!(
                    "input {i} has {} tokens, more than the context of {}",
                    l.len(),
                    st.n_ctx
                ),
                Some("input"),
            )
            .with_code("context_length_exceeded"));
        }
    }
    Ok(lists)
}

/// Standard base64 (with padding) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(ABC[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(srv): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_or_error(body)?;
    let req: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"), None)
    })?;
    let obj = req.as_object().ok_or_else(|| {
        ApiError::bad_request("the request body must be a JSON object".into(), None)
    })?;
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(
            format!("the field `{k}` is not supported by this server"),
            None,
        )
        .with_code("unsupported_parameter"));
    }
    let st = srv
        .models
        .get(obj.get("model").and_then(Value::as_str))
        .await?;
    let b64 = match obj.get("encoding_format").map(|v| v.as_str()) {
        None | Some(Some("float")) => false,
        Some(Some("base64")) => true,
        _ => {
            return Err(ApiError::bad_request(
                "`encoding_format` must be \"float\" or \"base64\"".into(),
                Some("encoding_format"),
            ));
        }
    };
    let input = obj
        .get("input")
        .ok_or_else(|| ApiError::bad_request("`input` is required".into(), Some("input")))?;
    let lists = inputs(&st, input)?;
    let n_tokens: usize = lists.iter().map(Vec::len).sum();
    let model = Arc::clone(&st.model);
    let vectors = tokio::task::spawn_blocking(move || {
        let pooling = Pooling::for_model(&model);
        lists
            .iter()
            .map(|ids| embed(&model, ids, pooling, true))
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    })?
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            e.to_string(),
        )
    })?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": st.cfg.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
    }
}
