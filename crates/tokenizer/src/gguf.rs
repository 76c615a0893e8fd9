//! Filling a [`TokenizerSpec`] from GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).

use damascus_gguf::{GgufFile, Metadata, keys};

use crate::Tokenizer;
use crate::error::{Result, TokenizerError};
use crate::spec::{ModelKind, PreTokenizer, TokenType, TokenizerSpec};

impl TokenizerSpec {
    /// Read the tokenizer keys of a GGUF file's metadata.
    ///
    /// Required: `tokenizer.ggml.model`, `tokenizer.ggml.tokens`; for `gpt2` also
    /// `tokenizer.ggml.merges` and `tokenizer.ggml.pre`. Missing optional flags take llama.cpp's
    /// defaults (SentencePiece: add BOS and a space prefix; byte-level: neither).
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let model_name = md
            .get_str(keys::TOKENIZER_MODEL)?
            .ok_or(TokenizerError::MissingKey(keys::TOKENIZER_MODEL))?;
        let model = ModelKind::from_name(model_name)?;
        let pre = match model {
            ModelKind::SentencePiece => PreTokenizer::None,
            ModelKind::BytePairGpt2 => {
                // llama.cpp treats a missing `pre` as "default", which we do not implement.
                let name = md.get_str(keys::TOKENIZER_PRE)?.unwrap_or("default");
                PreTokenizer::from_name(name)?
            }
        };
        let mut spec = Self::new(model, pre);
        let tokens = md
            .get_array(keys::TOKENIZER_TOKENS)?
            .ok_or(TokenizerError::MissingKey(keys::TOKENIZER_TOKENS))?;
        spec.tokens = tokens
            .as_strings()
            .ok_or_else(|| bad(keys::TOKENIZER_TOKENS, "expected an array of strings"))?
            .to_vec();
        let n = spec.tokens.len();
        if let Some(types) = md.get_array(keys::TOKENIZER_TOKEN_TYPE)? {
            let ids = types
                .as_i64_vec()
                .ok_or_else(|| bad(keys::TOKENIZER_TOKEN_TYPE, "expected an integer array"))?;
            check_len(keys::TOKENIZER_TOKEN_TYPE, n, ids.len())?;
            spec.token_types = ids.into_iter().map(TokenType::from_id).collect();
        }
        if let Some(scores) = md.get_array(keys::TOKENIZER_SCORES)? {
            let s = scores
                .as_f32_vec()
                .ok_or_else(|| bad(keys::TOKENIZER_SCORES, "expected a float array"))?;
            check_len(keys::TOKENIZER_SCORES, n, s.len())?;
            spec.scores = s;
        }
        if model == ModelKind::BytePairGpt2 {
            let merges = md
                .get_array(keys::TOKENIZER_MERGES)?
                .ok_or(TokenizerError::MissingKey(keys::TOKENIZER_MERGES))?;
            spec.merges = merges
                .as_strings()
                .ok_or_else(|| bad(keys::TOKENIZER_MERGES, "expected an array of strings"))?
                .to_vec();
            // llama.cpp (and Meta's tiktoken) look whole words up first for Llama 3.
            spec.ignore_merges = pre == PreTokenizer::Llama3;
            // Qwen 2's tokenizer.json normalizes to NFC (HF does; llama.cpp does not, so it
            // differs from HF on text that is not in NFC).
            spec.normalize_nfc = pre == PreTokenizer::Qwen2;
        }
        spec.bos = md.get_u32(keys::TOKENIZER_BOS_ID)?;
        spec.eos = md.get_u32(keys::TOKENIZER_EOS_ID)?;
        spec.eot = md.get_u32(keys::TOKENIZER_EOT_ID)?;
        spec.pad = md.get_u32(keys::TOKENIZER_PAD_ID)?;
        spec.unk = md.get_u32(keys::TOKENIZER_UNK_ID)?;
        let spm = model == ModelKind::SentencePiece;
        spec.add_bos = md.get_bool(keys::TOKENIZER_ADD_BOS)?.unwrap_or(spm);
        spec.add_eos = md.get_bool(keys::TOKENIZER_ADD_EOS)?.unwrap_or(false);
        spec.add_space_prefix = md
            .get_bool(keys::TOKENIZER_ADD_SPACE_PREFIX)?
            .unwrap_or(spm);
        spec.chat_template = md.get_str(keys::TOKENIZER_CHAT_TEMPLATE)?.map(String::from);
        // Out-of-range special ids (seen in the wild for pad) are dropped rather than fatal.
        for id in [&mut spec.pad, &mut spec.unk] {
            if id.is_some_and(|i| i as usize >= n) {
                *id = None;
            }
        }
        Ok(spec)
    }
}

impl Tokenizer {
    /// Build the tokenizer stored in a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_spec(TokenizerSpec::from_metadata(file.metadata())?)
    }
}

fn bad(key: &'static str, reason: &str) -> TokenizerError {
    TokenizerError::BadKey {
        key,
        reason: reason.to_string(),
    }
}

fn check_len(key: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(TokenizerError::LengthMismatch {
            key,
            expected,
            found,
        })
    }
}
