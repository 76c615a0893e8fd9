//! [`TokenizerSpec`]: everything a tokenizer is built from, as plain data.
//!
//! A spec is filled from GGUF metadata (`Tokenizer::from_gguf`) or from a Hugging Face
//! `tokenizer.json` ([`TokenizerSpec::from_hf_json`], used by tests and tools), then validated and
//! compiled by `Tokenizer::from_spec`.

use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};

/// Kind of a vocabulary entry, with llama.cpp's `tokenizer.ggml.token_type` ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TokenType {
    /// 0: type not given.
    Undefined,
    /// 1: an ordinary piece.
    #[default]
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<s>`, `<|eot_id|>`); only matched in text when special parsing is on.
    Control,
    /// 4: a user-defined token, matched as a whole in text when special parsing is on.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a SentencePiece byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenType {
    /// Map a `tokenizer.ggml.token_type` value; unknown values become [`TokenType::Undefined`].
    pub fn from_id(id: i64) -> Self {
        match id {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }

    /// The llama.cpp id of this type.
    pub fn id(self) -> i32 {
        match self {
            Self::Undefined => 0,
            Self::Normal => 1,
            Self::Unknown => 2,
            Self::Control => 3,
            Self::UserDefined => 4,
            Self::Unused => 5,
            Self::Byte => 6,
        }
    }
}

/// Tokenizer family (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `gpt2`: byte-level BPE with ranked merges (Llama 3, SmolLM, Qwen2, GPT-2).
    BytePairGpt2,
    /// `llama`: SentencePiece BPE with scores, `▁` and byte fallback (Llama 2, Mistral).
    SentencePiece,
}

impl ModelKind {
    /// Parse a `tokenizer.ggml.model` value.
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "gpt2" => Ok(Self::BytePairGpt2),
            "llama" => Ok(Self::SentencePiece),
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }
}

/// Pre-tokenizer: how text is split into words before BPE (`tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's byte-level regex:
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Llama 3's regex (digits in groups of 1-3, case-insensitive contractions):
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// Qwen2: Llama 3's regex with single digits (`\p{N}`).
    Qwen2,
    /// SmolLM: every digit isolated, then GPT-2's regex.
    Smollm,
    /// No pre-tokenization (SentencePiece models).
    None,
}

impl PreTokenizer {
    /// Parse a `tokenizer.ggml.pre` value (llama.cpp's names, a few aliases included).
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" | "falcon3" | "pixtral" => {
                Ok(Self::Llama3)
            }
            "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "roberta-bpe" => Ok(Self::Gpt2),
            "qwen2" | "deepseek-r1-qwen" | "megrez" => Ok(Self::Qwen2),
            "smollm" => Ok(Self::Smollm),
            other => Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        }
    }

    /// llama.cpp's canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Gpt2 => "gpt-2",
            Self::Llama3 => "llama-bpe",
            Self::Qwen2 => "qwen2",
            Self::Smollm => "smollm",
            Self::None => "default",
        }
    }
}

/// Everything a [`crate::Tokenizer`] is built from, as plain data.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// Tokenizer family.
    pub model: ModelKind,
    /// Pre-tokenizer (byte-level BPE only; [`PreTokenizer::None`] for SentencePiece).
    pub pre: PreTokenizer,
    /// Token strings, indexed by id. Byte-level BPE tokens are in GPT-2's byte→unicode alphabet.
    pub tokens: Vec<String>,
    /// Per-token type; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// BPE merges `"left right"` in rank order (byte-level BPE only).
    pub merges: Vec<String>,
    /// Per-token scores (SentencePiece only; higher merges first). Empty means all zero.
    pub scores: Vec<f32>,
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// End-of-turn token (`<|eot_id|>`, `<|im_end|>`), if any.
    pub eot: Option<u32>,
    /// Padding token.
    pub pad: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Prepend BOS when encoding with special tokens.
    pub add_bos: bool,
    /// Append EOS when encoding with special tokens.
    pub add_eos: bool,
    /// SentencePiece: prepend `▁` to the text (the "dummy prefix").
    pub add_space_prefix: bool,
    /// Byte-level BPE: a word that is itself a token is emitted without merging (Llama 3).
    pub ignore_merges: bool,
    /// Normalize text to Unicode NFC before pre-tokenizing (Qwen 2's `tokenizer.json`).
    pub normalize_nfc: bool,
    /// Jinja chat template (`tokenizer.chat_template`).
    pub chat_template: Option<String>,
}

impl TokenizerSpec {
    /// An empty spec of the given family; fill the fields you need.
    pub fn new(model: ModelKind, pre: PreTokenizer) -> Self {
        Self {
            model,
            pre,
            tokens: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            scores: Vec::new(),
            bos: None,
            eos: None,
            eot: None,
            pad: None,
            unk: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
            ignore_merges: false,
            normalize_nfc: false,
            chat_template: None,
        }
    }

    /// Build a byte-level BPE spec from a Hugging Face `tokenizer.json` (and optionally its
    /// `tokenizer_config.json`, for the chat template and BOS/EOS names).
    ///
    /// Only the shapes used by Llama 3, SmolLM, Qwen2 and GPT-2 are understood; anything else is
    /// an error rather than a silently different tokenizer.
    pub fn from_hf_json(tokenizer_json: &str, config_json: Option<&str>) -> Result<Self> {
        let bad = |m: &str| TokenizerError::HfJson(m.to_string());
        let j: Json = serde_json::from_str(tokenizer_json).map_err(|e| bad(&e.to_string()))?;
        let model = &j["model"];
        if model["type"] != "BPE" {
            return Err(bad("only BPE models are supported"));
        }
        let pre = detect_pre(&j["pre_tokenizer"])?;
        let normalize_nfc = match &j["normalizer"] {
            Json::Null => false,
            n if n["type"] == "NFC" => true,
            n => return Err(bad(&format!("unsupported normalizer {n}"))),
        };
        let vocab = model["vocab"]
            .as_object()
            .ok_or_else(|| bad("model.vocab missing"))?;
        let mut n_vocab = 0usize;
        for v in vocab.values() {
            let id = v
                .as_u64()
                .ok_or_else(|| bad("vocab id is not an integer"))?;
            n_vocab = n_vocab.max(id as usize + 1);
        }
        let added = j["added_tokens"].as_array().cloned().unwrap_or_default();
        for a in &added {
            let id = a["id"]
                .as_u64()
                .ok_or_else(|| bad("added token without id"))?;
            n_vocab = n_vocab.max(id as usize + 1);
        }
        let mut tokens = vec![String::new(); n_vocab];
        let mut types = vec![TokenType::Undefined; n_vocab];
        for (s, v) in vocab {
            let id = v.as_u64().unwrap_or(0) as usize;
            tokens[id] = s.clone();
            types[id] = TokenType::Normal;
        }
        for a in &added {
            let id = a["id"].as_u64().unwrap_or(0) as usize;
            tokens[id] = a["content"].as_str().unwrap_or("").to_string();
            types[id] = if a["special"].as_bool().unwrap_or(false) {
                TokenType::Control
            } else {
                TokenType::UserDefined
            };
        }
        let mut merges = Vec::new();
        for m in model["merges"].as_array().into_iter().flatten() {
            match m {
                Json::String(s) => merges.push(s.clone()),
                Json::Array(pair) if pair.len() == 2 => merges.push(format!(
                    "{} {}",
                    pair[0].as_str().unwrap_or(""),
                    pair[1].as_str().unwrap_or("")
                )),
                _ => return Err(bad("merge is neither \"a b\" nor [a, b]")),
            }
        }
        let mut spec = Self::new(ModelKind::BytePairGpt2, pre);
        spec.ignore_merges = model["ignore_merges"].as_bool().unwrap_or(false);
        spec.normalize_nfc = normalize_nfc;
        let id_of = |s: &str| tokens.iter().position(|t| t == s).map(|i| i as u32);
        // BOS is added when the post-processor template starts with a special token.
        if let Some(first) = find_template_first_special(&j["post_processor"]) {
            spec.bos = id_of(&first);
            spec.add_bos = spec.bos.is_some();
        }
        if let Some(cfg) = config_json {
            let c: Json = serde_json::from_str(cfg).map_err(|e| bad(&e.to_string()))?;
            let name = |k: &str| match &c[k] {
                Json::String(s) => Some(s.clone()),
                Json::Object(o) => o.get("content").and_then(|v| v.as_str()).map(String::from),
                _ => None,
            };
            if let Some(b) = name("bos_token") {
                spec.bos = spec.bos.or(id_of(&b));
            }
            if let Some(e) = name("eos_token") {
                spec.eos = id_of(&e);
            }
            if let Some(p) = name("pad_token") {
                spec.pad = id_of(&p);
            }
            if let Some(t) = c["chat_template"].as_str() {
                spec.chat_template = Some(t.to_string());
            }
        }
        spec.tokens = tokens;
        spec.token_types = types;
        spec.merges = merges;
        Ok(spec)
    }
}

/// The first special token of a `TemplateProcessing` post-processor's `single` template.
fn find_template_first_special(pp: &Json) -> Option<String> {
    match pp["type"].as_str()? {
        "TemplateProcessing" => pp["single"].as_array()?.first()?["SpecialToken"]["id"]
            .as_str()
            .map(String::from),
        "Sequence" => pp["processors"]
            .as_array()?
            .iter()
            .find_map(find_template_first_special),
        _ => None,
    }
}

const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Recognise the pre-tokenizer of a `tokenizer.json` among the ones we implement.
fn detect_pre(p: &Json) -> Result<PreTokenizer> {
    let bad = |m: String| TokenizerError::HfJson(m);
    let parts: Vec<&Json> = match p["type"].as_str() {
        Some("Sequence") => p["pretokenizers"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![p],
        None => return Err(bad("no pre_tokenizer".into())),
    };
    let byte_level_regex = |q: &Json| q["type"] == "ByteLevel" && q["use_regex"] != false;
    let byte_level_plain = |q: &Json| q["type"] == "ByteLevel" && q["use_regex"] == false;
    match parts.as_slice() {
        [b] if byte_level_regex(b) => Ok(PreTokenizer::Gpt2),
        [d, b]
            if d["type"] == "Digits" && d["individual_digits"] == true && byte_level_regex(b) =>
        {
            Ok(PreTokenizer::Smollm)
        }
        [s, b] if s["type"] == "Split" && byte_level_plain(b) => {
            match s["pattern"]["Regex"].as_str() {
                Some(LLAMA3_RE) => Ok(PreTokenizer::Llama3),
                Some(QWEN2_RE) => Ok(PreTokenizer::Qwen2),
                other => Err(bad(format!("unknown split regex {other:?}"))),
            }
        }
        _ => Err(bad(format!("unsupported pre_tokenizer {p}"))),
    }
}
