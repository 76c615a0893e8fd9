//! Tokenizers built from GGUF metadata: byte-level BPE (gpt2), SentencePiece-style
//! BPE (llama), special tokens, streaming decode and chat templates.
//!
//! Pipeline of [`Tokenizer::encode`]: optional BOS → split around special tokens (when special
//! parsing is allowed) → per text fragment: pre-tokenizer splits ([`PreTokenizer`], byte-level
//! BPE only) → BPE merges per word (`bpe.rs`) or SentencePiece merges (`spm.rs`) → optional EOS.
//!
//! Semantics worth knowing:
//! - User-defined token strings (Gemma's `\n\n`, whitespace runs) are always matched as single
//!   tokens, leftmost-longest, as Hugging Face does for non-special added tokens and llama.cpp for
//!   `USER_DEFINED` ones; control tokens (`<|eot_id|>`) only with special parsing
//!   (`parse_special`), else they are plain text. HF's per-token `lstrip`/`rstrip`/
//!   `single_word` flags are not modelled (none of the supported vocabularies set them).
//! - `normalize_nfc` (Qwen 2's `tokenizer.json` normalizer) turns each text fragment into NFC
//!   before pre-tokenizing, as Hugging Face does (llama.cpp does not normalize).
//! - Byte-level BPE bytes missing from the vocabulary are dropped, as HF does without `unk`.
//! - `ignore_merges` (whole word looked up first) is on for `llama-bpe` from GGUF, as in
//!   llama.cpp; from a `tokenizer.json` it follows the file.
//! - SentencePiece adds its `▁` dummy prefix at the start of the text and after each special
//!   token (llama.cpp's rule) and strips one leading space when decoding.
//!
//! Invariants: encoding never fails or panics on any `&str`; byte-level decoding is byte-exact
//! (`decode(encode(x)) == x` when special parsing is off and the text is in NFC or the vocabulary
//! does not normalize); the streaming decoder never emits a
//! partial UTF-8 sequence.
#![forbid(unsafe_code)]

mod bpe;
mod decode;
mod error;
mod fxhash;
mod gguf;
mod pretok;
mod spec;
mod special;
mod spm;
pub mod template;
mod unicode;

use std::sync::Mutex;

pub use decode::StreamDecoder;
pub use error::{Result, TokenizerError};
pub use spec::{ModelKind, PreTokenizer, TokenType, TokenizerSpec};
pub use template::{ChatTemplate, strftime};

use bpe::{BpeScratch, BytePairModel};
use special::{Fragment, SpecialMatcher};
use spm::SentencePieceModel;

/// The encoding algorithm behind a [`Tokenizer`].
enum Model {
    Bpe(Box<BytePairModel>),
    Spm(Box<SentencePieceModel>),
}

/// Per-call options of [`Tokenizer::encode_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS / EOS as the model's metadata says (`add_bos_token`, `add_eos_token`).
    pub add_special: bool,
    /// Match control and user-defined token strings in the text as single tokens.
    pub parse_special: bool,
}

/// A ready-to-use tokenizer. Cheap to share across threads (`Sync`).
pub struct Tokenizer {
    model: Model,
    pre: PreTokenizer,
    /// Token strings as stored in the model. `[n_vocab]`
    tokens: Vec<String>,
    /// `[n_vocab]`
    types: Vec<TokenType>,
    /// Decoded bytes of every token (byte alphabet / `▁` / `<0xNN>` undone), concatenated.
    /// `[sum of piece lengths]`
    piece_bytes: Vec<u8>,
    /// Start of token i's bytes in `piece_bytes`; i + 1 ends it. `[n_vocab + 1]`
    piece_offs: Vec<u32>,
    /// Control and user-defined tokens (special parsing on). `specials` ⊇ `user_defined`.
    specials: SpecialMatcher,
    /// User-defined tokens only (always matched).
    user_defined: SpecialMatcher,
    /// Normalize text fragments to NFC before pre-tokenizing (Qwen 2).
    normalize_nfc: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// End-of-generation ids (eos, eot and known end-of-turn control tokens), sorted.
    eog: Vec<u32>,
    chat_template: Option<String>,
    /// Spare scratch buffers (taken by one encode call at a time).
    scratch: Mutex<Vec<Scratch>>,
}

/// Buffers reused across encode calls.
#[derive(Default)]
struct Scratch {
    splitter: pretok::Splitter,
    words: Vec<(usize, usize)>,
    bpe: BpeScratch,
}

/// Control-token strings that end a turn in common chat formats.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

impl Tokenizer {
    /// Validate and compile a spec.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Self> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::BadVocab("no tokens".into()));
        }
        let mut types = spec.token_types;
        if types.is_empty() {
            types = vec![TokenType::Normal; n];
        } else if types.len() != n {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.token_type",
                expected: n,
                found: types.len(),
            });
        }
        if !spec.scores.is_empty() && spec.scores.len() != n {
            return Err(TokenizerError::LengthMismatch {
                key: "tokenizer.ggml.scores",
                expected: n,
                found: spec.scores.len(),
            });
        }
        for (name, id) in [
            ("bos", spec.bos),
            ("eos", spec.eos),
            ("eot", spec.eot),
            ("pad", spec.pad),
            ("unk", spec.unk),
        ] {
            if let Some(id) = id
                && id as usize >= n
            {
                return Err(TokenizerError::BadSpecialId {
                    name,
                    id,
                    n_vocab: n,
                });
            }
        }
        let model = match spec.model {
            ModelKind::BytePairGpt2 => {
                if spec.pre == PreTokenizer::None {
                    return Err(TokenizerError::UnsupportedPreTokenizer("default".into()));
                }
                let m = BytePairModel::new(&spec.tokens, &spec.merges, spec.ignore_merges)?;
                Model::Bpe(Box::new(m))
            }
            ModelKind::SentencePiece => Model::Spm(Box::new(SentencePieceModel::new(
                &spec.tokens,
                &spec.scores,
                &types,
                spec.unk,
            ))),
        };
        // One buffer for all pieces: no allocation per token (262k in Gemma's vocabulary).
        let mut piece_bytes = Vec::with_capacity(spec.tokens.iter().map(String::len).sum());
        let mut piece_offs = Vec::with_capacity(n + 1);
        piece_offs.push(0u32);
        for (t, &ty) in spec.tokens.iter().zip(&types) {
            decode::push_piece_bytes(spec.model, t, ty, &mut piece_bytes);
            let end = u32::try_from(piece_bytes.len())
                .map_err(|_| TokenizerError::BadVocab("token strings exceed 4 GiB".into()))?;
            piece_offs.push(end);
        }
        let matchable = |keep: fn(TokenType) -> bool| {
            SpecialMatcher::new(
                spec.tokens
                    .iter()
                    .zip(&types)
                    .enumerate()
                    .filter(|(_, (_, ty))| keep(**ty))
                    .map(|(i, (t, _))| (t.clone(), i as u32)),
            )
        };
        let specials = matchable(|ty| matches!(ty, TokenType::Control | TokenType::UserDefined));
        let user_defined = matchable(|ty| ty == TokenType::UserDefined);
        // Control tokens by text (a few thousand in Gemma's vocabulary), for the EOG lookups.
        let controls: std::collections::HashMap<&str, u32> = spec
            .tokens
            .iter()
            .zip(&types)
            .enumerate()
            .rev() // the lowest id wins for duplicates
            .filter(|(_, (_, ty))| **ty == TokenType::Control)
            .map(|(i, (t, _))| (t.as_str(), i as u32))
            .collect();
        let control_id = |text: &str| controls.get(text).copied();
        let eot = spec.eot.or_else(|| {
            ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"]
                .iter()
                .find_map(|t| control_id(t))
        });
        let mut eog: Vec<u32> = EOG_TEXTS.iter().filter_map(|t| control_id(t)).collect();
        eog.extend(spec.eos);
        eog.extend(eot);
        eog.sort_unstable();
        eog.dedup();
        drop(controls);
        Ok(Self {
            model,
            pre: spec.pre,
            tokens: spec.tokens,
            types,
            piece_bytes,
            piece_offs,
            specials,
            user_defined,
            normalize_nfc: spec.normalize_nfc,
            bos: spec.bos,
            eos: spec.eos,
            eot,
            pad: spec.pad,
            unk: spec.unk,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            add_space_prefix: spec.add_space_prefix,
            eog,
            chat_template: spec.chat_template,
            scratch: Mutex::new(Vec::new()),
        })
    }

    /// Encode text: BOS/EOS per the model's metadata when `add_special`, and special-token
    /// strings matched as single tokens when `parse_special`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_with(
            text,
            EncodeOptions {
                add_special,
                parse_special,
            },
        )
    }

    /// [`Tokenizer::encode`] with an options struct.
    pub fn encode_with(&self, text: &str, opts: EncodeOptions) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if opts.add_special && self.add_bos {
            out.extend(self.bos);
        }
        let mut frags = Vec::new();
        let matcher = if opts.parse_special {
            &self.specials
        } else {
            &self.user_defined
        };
        if !matcher.is_empty() {
            matcher.split(text, &mut frags);
        } else if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        let mut scratch = self
            .scratch
            .lock()
            .ok()
            .and_then(|mut s| s.pop())
            .unwrap_or_default();
        let mut prev_special = true;
        for f in frags {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    self.encode_text(t, prev_special, &mut scratch, &mut out);
                    prev_special = false;
                }
            }
        }
        if let Ok(mut s) = self.scratch.lock() {
            s.push(scratch);
        }
        if opts.add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Encode a fragment without special tokens. `after_special`: the fragment starts the text or
    /// follows a special token (SentencePiece then adds its dummy `▁` prefix).
    fn encode_text(&self, text: &str, after_special: bool, s: &mut Scratch, out: &mut Vec<u32>) {
        let normalized;
        let text = if self.normalize_nfc
            && unicode_normalization::is_nfc_quick(text.chars())
                != unicode_normalization::IsNormalized::Yes
        {
            normalized = unicode_normalization::UnicodeNormalization::nfc(text).collect::<String>();
            normalized.as_str()
        } else {
            text
        };
        match &self.model {
            Model::Spm(m) => m.encode(
                &self.tokens,
                text,
                self.add_space_prefix && after_special,
                out,
            ),
            Model::Bpe(m) => {
                s.words.clear();
                s.splitter.split(self.pre, text, &mut s.words);
                for &(a, b) in &s.words {
                    m.encode_word(&text.as_bytes()[a..b], &mut s.bpe, out);
                }
            }
        }
    }

    /// Decode ids to bytes. Control tokens are skipped unless `show_special`. Fails on ids outside
    /// the vocabulary.
    pub fn decode_bytes(&self, ids: &[u32], show_special: bool) -> Result<Vec<u8>> {
        let mut d = StreamDecoder::from_start(self, show_special);
        let mut out = Vec::new();
        for &id in ids {
            d.push_bytes(id, &mut out)?;
        }
        Ok(out)
    }

    /// Decode ids to text (invalid UTF-8, e.g. a cut multi-byte character, becomes U+FFFD).
    pub fn decode(&self, ids: &[u32], show_special: bool) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids, show_special)?).into_owned())
    }

    /// A streaming decoder that only ever returns complete UTF-8 characters, for tokens that
    /// continue a prompt (see [`StreamDecoder::new`]; [`StreamDecoder::from_start`] for a whole
    /// sequence).
    pub fn stream_decoder(&self, show_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, show_special)
    }

    /// The token that stands for a single raw byte (byte-level alphabet token or `<0xNN>`), if
    /// the vocabulary has one. Bytes without one are dropped (BPE) or become `unk` (SentencePiece).
    pub fn byte_token(&self, byte: u8) -> Option<u32> {
        match &self.model {
            Model::Bpe(m) => m.byte_token(byte),
            Model::Spm(m) => m.byte_token(byte),
        }
    }

    /// The bytes one token decodes to (control tokens included), or `None` if out of range.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (a, b) = (*self.piece_offs.get(i)?, *self.piece_offs.get(i + 1)?);
        Some(&self.piece_bytes[a as usize..b as usize])
    }

    /// A token's text for display: its decoded bytes, lossily as UTF-8.
    pub fn token_piece(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// The token string as stored in the model (`Ġthe`, `▁the`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The token's type.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of a token string, if present (linear scan; not for hot paths).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == text).map(|i| i as u32)
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The tokenizer family.
    pub fn model_kind(&self) -> ModelKind {
        match self.model {
            Model::Bpe(_) => ModelKind::BytePairGpt2,
            Model::Spm(_) => ModelKind::SentencePiece,
        }
    }

    /// The pre-tokenizer (byte-level BPE).
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from metadata, else a known control token such as `<|eot_id|>`).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Unknown token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether encoding with special tokens prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether encoding with special tokens appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether SentencePiece decoding strips the dummy-prefix space.
    pub(crate) fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// Whether generation should stop at this token (eos, eot, or a known end-of-turn token).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// The model's chat template (`tokenizer.chat_template`), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The text of the BOS token ("" if none), for chat templates.
    pub fn bos_text(&self) -> &str {
        self.bos.and_then(|i| self.token_text(i)).unwrap_or("")
    }

    /// The text of the EOS token ("" if none), for chat templates.
    pub fn eos_text(&self) -> &str {
        self.eos.and_then(|i| self.token_text(i)).unwrap_or("")
    }
}
