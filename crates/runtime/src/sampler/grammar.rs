//! The grammar constraint of a sampler chain: only tokens that keep the output a valid prefix of
//! a grammar ([`damascus_grammar`]) may be picked, and end-of-generation only where the grammar
//! can end.
//!
//! Like llama.cpp's common sampler, the chain first picks as usual and checks only that one
//! token against the grammar (a walk of its few bytes); only when it is refused are the
//! candidates masked with the full token mask ([`Matcher::mask`], one trie walk, cached per
//! grammar state) and the chain run again. Greedy decoding gives exactly the argmax of the
//! allowed tokens either way; a random pick draws from the allowed tokens' renormalised
//! distribution (the truncation stages then see only allowed tokens).

use std::sync::Arc;

use damascus_grammar::{Grammar, GrammarError, Matcher, Vocab};
use damascus_tokenizer::{TokenType, Tokenizer};

use super::Candidates;

/// The vocabulary of `tok` as the grammar engine sees it: each token's bytes (control, unknown
/// and unused tokens never allowed), the end-of-generation ids. Build once per model.
pub fn grammar_vocab(tok: &Tokenizer) -> Vocab {
    let bytes = (0..tok.n_vocab() as u32)
        .map(|id| match tok.token_type(id) {
            Some(TokenType::Control | TokenType::Unknown | TokenType::Unused) => None,
            _ => tok.token_bytes(id).map(<[u8]>::to_vec),
        })
        .collect();
    Vocab::new(bytes, tok.eog_ids())
}

/// Grammar state of one generation plus the vocabulary it masks.
#[derive(Debug, Clone)]
pub struct GrammarConstraint {
    matcher: Matcher,
    vocab: Arc<Vocab>,
    masked_steps: u64,
    steps: u64,
}

impl GrammarConstraint {
    /// A constraint at the start of the output.
    pub fn new(grammar: Arc<Grammar>, vocab: Arc<Vocab>) -> Self {
        Self {
            matcher: Matcher::new(grammar),
            vocab,
            masked_steps: 0,
            steps: 0,
        }
    }

    /// Whether `id` may come next.
    pub fn allows(&self, id: u32) -> bool {
        self.matcher.allows_token(&self.vocab, id)
    }

    /// Removes every refused candidate (the full mask).
    pub fn apply(&mut self, cands: &mut Candidates) {
        self.masked_steps += 1;
        let mask = self.matcher.mask(&self.vocab);
        cands.data.retain(|d| mask.allows(d.id));
        cands.selected = None;
    }

    /// Keeps the `k` best allowed candidates (by logit), for a chain whose first stage is a
    /// top-k of the raw logits: the same result as the full mask followed by that top-k, found
    /// by checking candidates one by one in descending order, `max(4k, 64)` of them, and
    /// taking the full mask when those hold fewer than `k` allowed tokens. Inside a string
    /// almost every token is allowed and the first checks suffice; at a structural position
    /// few are, and the mask of that state (a trie walk cached per grammar state, well under a
    /// millisecond there) is cheaper than checking thousands of candidates one by one.
    pub fn apply_top_k(&mut self, cands: &mut Candidates, k: usize) {
        let n = cands.len();
        let k = k.max(1);
        let want = (4 * k).max(64).min(n);
        cands.sorted = false;
        cands.partial_sort(want);
        let mut kept = Vec::with_capacity(k);
        for d in &cands.data[..want] {
            if self.allows(d.id) {
                kept.push(*d);
                if kept.len() == k {
                    break;
                }
            }
        }
        if kept.len() == k || want == n {
            cands.data = kept;
            cands.sorted = true;
            cands.selected = None;
            return;
        }
        self.apply(cands);
        cands.partial_sort(k);
        cands.data.truncate(k);
        cands.sorted = true;
    }

    /// Commits a picked token.
    pub fn accept(&mut self, id: u32) -> Result<(), GrammarError> {
        self.steps += 1;
        self.matcher.advance_token(&self.vocab, id)
    }

    /// Back to the start of the output.
    pub fn reset(&mut self) {
        self.matcher.reset();
    }

    /// Whether the grammar is complete and only the end may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_finished()
    }

    /// `(steps, steps that needed the full mask)`.
    pub fn stats(&self) -> (u64, u64) {
        (self.steps, self.masked_steps)
    }
}
