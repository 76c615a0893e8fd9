//! [`Sequence`]: a model [`Session`] plus the token ids its KV cache holds, so a new prompt only
//! evaluates what differs from the cached prefix (multi-turn chat, regenerate, shared system
//! prompts).
//!
//! Invariant: `tokens.len() == session.n_past()`; position `i` of the cache holds `tokens[i]`.

use damascus_model::Session;

use crate::RuntimeError;

/// What [`Sequence::prefill`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Prefill {
    /// `[n_vocab]` f32 logits after the last prompt token.
    pub logits: Vec<f32>,
    /// Prompt tokens whose KV entries were already cached and kept.
    pub reused: usize,
    /// Prompt tokens evaluated by this call (`prompt.len() - reused`).
    pub evaluated: usize,
}

/// A session whose cached token ids are known.
#[derive(Debug)]
pub struct Sequence {
    session: Session,
    tokens: Vec<u32>, // [n_past] ids held by the KV cache, in position order
}

impl Sequence {
    /// Wraps an empty (or to-be-emptied) session; any cached positions are forgotten.
    pub fn new(mut session: Session) -> Self {
        session.reset();
        Self {
            session,
            tokens: Vec::new(),
        }
    }

    /// The underlying model session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Token ids in the KV cache, in position order. `[n_past]`
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions in the KV cache.
    pub fn n_past(&self) -> usize {
        self.tokens.len()
    }

    /// Capacity of the KV cache in positions.
    pub fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    /// Positions still free.
    pub fn n_free(&self) -> usize {
        self.n_ctx().saturating_sub(self.n_past())
    }

    /// Forgets every cached position.
    pub fn reset(&mut self) {
        self.session.reset();
        self.tokens.clear();
    }

    /// Keeps only the first `n` cached positions.
    pub fn truncate(&mut self, n: usize) {
        if n < self.tokens.len() {
            self.session.truncate(n);
            self.tokens.truncate(n);
        }
    }

    /// Length of the longest common prefix of the cache and `ids`.
    pub fn common_prefix(&self, ids: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(ids)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Makes the cache hold exactly `prompt` and returns the logits after its last token.
    ///
    /// The longest common prefix of the cached ids and `prompt` is kept; only the rest is
    /// evaluated. When the whole prompt is already cached its last token is re-evaluated (one
    /// position) to get fresh logits.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Prefill, RuntimeError> {
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        if prompt.len() > self.n_ctx() {
            return Err(RuntimeError::PromptTooLong {
                n_prompt: prompt.len(),
                n_ctx: self.n_ctx(),
            });
        }
        let keep = self.common_prefix(prompt).min(prompt.len() - 1);
        self.truncate(keep);
        let rest = &prompt[keep..];
        let logits = self.eval(rest)?;
        Ok(Prefill {
            logits,
            reused: keep,
            evaluated: rest.len(),
        })
    }

    /// Appends `ids` to the cache and returns the logits after the last one (`[n_vocab]` f32).
    pub fn eval(&mut self, ids: &[u32]) -> Result<Vec<f32>, RuntimeError> {
        if self.n_past() + ids.len() > self.n_ctx() {
            return Err(RuntimeError::ContextFull {
                n_ctx: self.n_ctx(),
                n_past: self.n_past(),
                n_tokens: ids.len(),
            });
        }
        match self.session.eval(ids) {
            Ok(logits) => {
                self.tokens.extend_from_slice(ids);
                Ok(logits)
            }
            Err(e) => {
                // A failed pass may have written part of the batch: drop it from the cache.
                let n = self.tokens.len();
                self.session.truncate(n);
                Err(e.into())
            }
        }
    }

    /// Like [`Sequence::eval`], returning only the greedy pick after the last id (the backend
    /// computes the argmax; see [`damascus_model::Session::eval_argmax`]).
    pub fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32, RuntimeError> {
        if self.n_past() + ids.len() > self.n_ctx() {
            return Err(RuntimeError::ContextFull {
                n_ctx: self.n_ctx(),
                n_past: self.n_past(),
                n_tokens: ids.len(),
            });
        }
        match self.session.eval_argmax(ids) {
            Ok(id) => {
                self.tokens.extend_from_slice(ids);
                Ok(id)
            }
            Err(e) => {
                let n = self.tokens.len();
                self.session.truncate(n);
                Err(e.into())
            }
        }
    }

    /// Appends `ids` and returns the greedy pick after every one of them (`ids.len()` picks):
    /// the verify pass of speculative decoding ([`damascus_model::Session::eval_all_argmax`]).
    /// Drop rejected positions afterwards with [`Sequence::truncate`].
    pub fn eval_all_argmax(&mut self, ids: &[u32]) -> Result<Vec<u32>, RuntimeError> {
        if self.n_past() + ids.len() > self.n_ctx() {
            return Err(RuntimeError::ContextFull {
                n_ctx: self.n_ctx(),
                n_past: self.n_past(),
                n_tokens: ids.len(),
            });
        }
        match self.session.eval_all_argmax(ids) {
            Ok(picks) => {
                self.tokens.extend_from_slice(ids);
                Ok(picks)
            }
            Err(e) => {
                let n = self.tokens.len();
                self.session.truncate(n);
                Err(e.into())
            }
        }
    }

    /// Whether a multi-token pass gives every row the logits of one-token passes
    /// ([`damascus_model::Session::row_invariant`]).
    pub fn row_invariant(&self) -> bool {
        self.session.row_invariant()
    }

    /// Context shift: drops cached positions `keep .. keep + n_drop` and re-positions the
    /// tokens after them by re-evaluating them (simple and exact; RoPE re-rotation of the cached
    /// keys would avoid the recompute). Returns the number of tokens re-evaluated.
    pub fn shift(&mut self, keep: usize, n_drop: usize) -> Result<usize, RuntimeError> {
        let keep = keep.min(self.tokens.len());
        let end = keep.saturating_add(n_drop).min(self.tokens.len());
        let tail: Vec<u32> = self.tokens[end..].to_vec();
        self.truncate(keep);
        if !tail.is_empty() {
            self.eval(&tail)?;
        }
        Ok(tail.len())
    }
}
