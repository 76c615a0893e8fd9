//! Detokenization: per-token byte pieces and a streaming decoder that never splits a UTF-8
//! character across outputs.

use crate::Tokenizer;
use crate::bpe::char_to_byte;
use crate::error::{Result, TokenizerError};
use crate::spec::{ModelKind, TokenType};
use crate::spm::{SPACE_MARK, parse_byte_token};

/// Append the bytes a token stands for to `out`.
pub(crate) fn push_piece_bytes(model: ModelKind, text: &str, ty: TokenType, out: &mut Vec<u8>) {
    match (model, ty) {
        // Control and user-defined tokens are literal text in both families.
        (_, TokenType::Control | TokenType::UserDefined) => out.extend_from_slice(text.as_bytes()),
        (ModelKind::SentencePiece, TokenType::Byte) => match parse_byte_token(text) {
            Some(b) => out.push(b),
            None => out.extend_from_slice(text.as_bytes()),
        },
        (ModelKind::SentencePiece, _) => {
            for (i, part) in text.split(SPACE_MARK).enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(part.as_bytes());
            }
        }
        (ModelKind::BytePairGpt2, _) => {
            for c in text.chars() {
                match char_to_byte(c) {
                    Some(b) => out.push(b),
                    // Outside the byte alphabet (hand-edited vocabularies): keep the character.
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        }
    }
}

/// Incremental detokenizer: feed ids, get text made only of complete UTF-8 characters.
///
/// Bytes of a character split across tokens are held back until the character is complete;
/// bytes that can never form a valid character are replaced by U+FFFD.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    show_special: bool,
    /// No text has been produced yet (SentencePiece strips the dummy-prefix space then).
    at_start: bool,
    /// Bytes of an incomplete trailing character. At most 3.
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder for tokens that continue earlier text (generation after a prompt): every
    /// token's text is kept as is, including a SentencePiece token's leading space.
    /// Control tokens are hidden unless `show_special`.
    pub fn new(tok: &'a Tokenizer, show_special: bool) -> Self {
        Self {
            tok,
            show_special,
            at_start: false,
            pending: Vec::new(),
        }
    }

    /// A decoder for a sequence that starts the text: SentencePiece's dummy-prefix space of the
    /// first text token is dropped (what [`Tokenizer::decode`] does).
    pub fn from_start(tok: &'a Tokenizer, show_special: bool) -> Self {
        Self {
            at_start: true,
            ..Self::new(tok, show_special)
        }
    }

    /// Append the raw bytes of `id` to `out` (no UTF-8 buffering).
    pub(crate) fn push_bytes(&mut self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let tok = self.tok;
        let n_vocab = tok.n_vocab();
        let piece = tok
            .token_bytes(id)
            .ok_or(TokenizerError::InvalidToken { id, n_vocab })?;
        let ty = tok.token_type(id).unwrap_or_default();
        if ty == TokenType::Control && !self.show_special {
            return Ok(());
        }
        let mut piece = piece;
        if self.at_start
            && tok.model_kind() == ModelKind::SentencePiece
            && tok.add_space_prefix()
            && ty != TokenType::Control
        {
            piece = piece.strip_prefix(b" ").unwrap_or(piece);
        }
        if ty != TokenType::Control {
            self.at_start = false;
        }
        out.extend_from_slice(piece);
        Ok(())
    }

    /// Feed one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let mut buf = std::mem::take(&mut self.pending);
        self.push_bytes(id, &mut buf)?;
        let mut out = String::new();
        let mut rest: &[u8] = &buf;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: keep it for the next token.
                        None => {
                            rest = bad;
                            break;
                        }
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Ok(out)
    }

    /// Flush what is held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes currently held back.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}
