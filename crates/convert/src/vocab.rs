//! Llama 3 tokenizer metadata from a Hugging Face `tokenizer.json`, the way llama.cpp's
//! `convert_hf_to_gguf.py` writes it for Llama 3.x ("gpt2" BPE, pre-tokenizer "llama-bpe").
//!
//! Token types follow the converter: added tokens marked `special` are CONTROL (3), other added
//! tokens USER_DEFINED (4), the rest NORMAL (1); ids missing from the file become `[PAD{id}]`
//! USER_DEFINED. The vocabulary is cut to `n_vocab`, which drops the vision model's extra
//! `<|image|>` token (id 128256) for text models.

use std::path::Path;

use damascus_gguf::{Array, Value};
use serde_json::Value as Json;

use crate::ConvertError;
use crate::keys;

/// llama.cpp token types (`llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_CONTROL: i32 = 3;

/// The official Llama 3.2 Instruct chat template (Meta's `tokenizer_config.json`).
pub const LLAMA3_CHAT_TEMPLATE: &str = include_str!("llama3_chat_template.jinja");

/// Special token ids of the Llama 3 instruct tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// `<|begin_of_text|>`.
    pub bos: u32,
    /// `<|eot_id|>` (end of turn, the instruct models' EOS).
    pub eos: u32,
    /// `<|finetune_right_pad_id|>`.
    pub pad: u32,
}

/// Llama 3.x special ids.
pub const LLAMA3_SPECIAL: SpecialIds = SpecialIds {
    bos: 128000,
    eos: 128009,
    pad: 128004,
};

/// A parsed BPE vocabulary, ready to be written as GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocab {
    /// Token strings by id, `n_vocab` of them.
    pub tokens: Vec<String>,
    /// llama.cpp token type per id.
    pub token_types: Vec<i32>,
    /// Merge rules as "left right".
    pub merges: Vec<String>,
}

impl Vocab {
    /// Read `tokenizer.json` and cut or pad the vocabulary to `n_vocab` entries.
    pub fn from_tokenizer_json(path: &Path, n_vocab: usize) -> Result<Vocab, ConvertError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConvertError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_json_str(&text, n_vocab).map_err(|reason| ConvertError::Tokenizer {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parse the JSON text of a `tokenizer.json` (errors as plain strings, wrapped by the caller).
    pub fn from_json_str(text: &str, n_vocab: usize) -> Result<Vocab, String> {
        let json: Json = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
        let model = json.get("model").ok_or("no \"model\" object")?;
        if model.get("type").and_then(Json::as_str) != Some("BPE") {
            return Err("model.type is not \"BPE\"".into());
        }
        let vocab = model
            .get("vocab")
            .and_then(Json::as_object)
            .ok_or("no model.vocab object")?;

        let mut tokens: Vec<Option<String>> = vec![None; n_vocab];
        let mut types = vec![TOKEN_NORMAL; n_vocab];
        for (tok, id) in vocab {
            let id = id
                .as_u64()
                .ok_or_else(|| format!("vocab entry {tok:?} has a non-integer id"))?;
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = Some(tok.clone());
            }
        }
        if let Some(added) = json.get("added_tokens").and_then(Json::as_array) {
            for t in added {
                let id = t
                    .get("id")
                    .and_then(Json::as_u64)
                    .ok_or("added token without an integer id")? as usize;
                let content = t
                    .get("content")
                    .and_then(Json::as_str)
                    .ok_or("added token without content")?;
                let special = t.get("special").and_then(Json::as_bool).unwrap_or(false);
                if id < n_vocab {
                    tokens[id] = Some(content.to_string());
                    types[id] = if special {
                        TOKEN_CONTROL
                    } else {
                        TOKEN_USER_DEFINED
                    };
                }
            }
        }
        let tokens: Vec<String> = tokens
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                t.unwrap_or_else(|| {
                    types[i] = TOKEN_USER_DEFINED;
                    format!("[PAD{i}]")
                })
            })
            .collect();

        let merges = model
            .get("merges")
            .and_then(Json::as_array)
            .ok_or("no model.merges array")?
            .iter()
            .map(|m| match m {
                // Old format: "a b"; new format: ["a", "b"].
                Json::String(s) => Ok(s.clone()),
                Json::Array(pair) => match pair.as_slice() {
                    [Json::String(a), Json::String(b)] => Ok(format!("{a} {b}")),
                    _ => Err("merge pair is not two strings".to_string()),
                },
                _ => Err("merge entry is neither a string nor a pair".to_string()),
            })
            .collect::<Result<Vec<_>, _>>()?;

        Ok(Vocab {
            tokens,
            token_types: types,
            merges,
        })
    }

    /// The `tokenizer.*` metadata pairs (model, pre, tokens, types, merges, special ids,
    /// chat template), in the order llama.cpp's converter writes them.
    pub fn metadata(&self, special: SpecialIds, chat_template: &str) -> Vec<(String, Value)> {
        vec![
            (keys::TOKENIZER_MODEL.into(), Value::from("gpt2")),
            (keys::TOKENIZER_PRE.into(), Value::from("llama-bpe")),
            (
                keys::TOKENIZER_TOKENS.into(),
                Value::Array(Array::String(self.tokens.clone())),
            ),
            (
                keys::TOKENIZER_TOKEN_TYPE.into(),
                Value::Array(Array::I32(self.token_types.clone())),
            ),
            (
                keys::TOKENIZER_MERGES.into(),
                Value::Array(Array::String(self.merges.clone())),
            ),
            (keys::TOKENIZER_BOS_ID.into(), Value::U32(special.bos)),
            (keys::TOKENIZER_EOS_ID.into(), Value::U32(special.eos)),
            (keys::TOKENIZER_PAD_ID.into(), Value::U32(special.pad)),
            (keys::TOKENIZER_ADD_BOS.into(), Value::Bool(true)),
            (
                keys::TOKENIZER_CHAT_TEMPLATE.into(),
                Value::from(chat_template),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"{
      "added_tokens": [
        {"id": 4, "content": "<|begin|>", "special": true},
        {"id": 5, "content": "<x>", "special": false},
        {"id": 7, "content": "<|image|>", "special": true}
      ],
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                "merges": ["a b", ["ab", "b"]]}
    }"#;

    #[test]
    fn parses_types_pads_and_truncates() {
        let v = Vocab::from_json_str(MINI, 6).unwrap();
        assert_eq!(v.tokens, ["a", "b", "ab", "[PAD3]", "<|begin|>", "<x>"]);
        assert_eq!(v.token_types, [1, 1, 1, 4, 3, 4]);
        assert_eq!(v.merges, ["a b", "ab b"]);
    }

    #[test]
    fn rejects_non_bpe() {
        let e = Vocab::from_json_str(r#"{"model":{"type":"Unigram"}}"#, 3).unwrap_err();
        assert!(e.contains("BPE"), "{e}");
    }

    #[test]
    fn chat_template_is_llama3() {
        assert!(LLAMA3_CHAT_TEMPLATE.contains("<|start_header_id|>"));
        assert!(LLAMA3_CHAT_TEMPLATE.contains("<|eot_id|>"));
    }
}
