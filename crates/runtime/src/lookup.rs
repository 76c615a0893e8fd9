//! Prompt-lookup drafting for speculative decoding (`--draft-ngram N`): the next tokens are
//! guessed by finding the context's last n-gram earlier in the context (prompt and generated
//! text alike) and copying what followed it there. Code edits, quotes and retrieval answers
//! repeat long spans of their prompt, so the guesses are often right; the model verifies them
//! all in one forward pass ([`crate::generate`]), so a wrong guess costs compute, never output.
//!
//! The search tries n-gram lengths from [`DraftConfig::ngram_max`] down to
//! [`DraftConfig::ngram_min`] and takes, for the longest length that matches, the most recent
//! earlier occurrence. The copy runs like an LZ77 back-reference: when the continuation
//! reaches the end of the context it goes on through the tokens it has just drafted, so a
//! periodic tail (`a b a b a b`) drafts its period again and again.
//!
//! A verify pass costs more for every drafted row (on the CPU about a fifth of a one-token
//! step per row, [`ROW_COST`]), so a [`Pacer`] sizes the drafts by how the recent ones did:
//! long while they are kept, short while they are rejected, and not at all for a while after
//! misses in a row. Text that copies its context (code edits, quotes) drafts long; free text
//! rarely drafts.

use crate::RuntimeError;

/// Most tokens one verify pass drafts: `1 + max_draft` rows must stay below the CPU backend's
/// GEMM threshold ([`damascus_model::backend::cpu::GEMM_MIN_TOKENS`], 16) so that the verify
/// pass takes the same matmul route as one-token decode steps and its logits are bit for bit
/// those of plain decoding.
pub const MAX_DRAFT: usize = damascus_model::backend::cpu::GEMM_MIN_TOKENS - 2;

/// Longest n-gram the drafter matches.
pub const MAX_NGRAM: usize = 64;

/// Settings of the n-gram drafter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftConfig {
    /// Longest n-gram to match (tried first), `1..=`[`MAX_NGRAM`].
    pub ngram_max: usize,
    /// Shortest n-gram to match (tried last), `1..=ngram_max`.
    pub ngram_min: usize,
    /// Most tokens drafted per verify pass, `1..=`[`MAX_DRAFT`].
    pub max_draft: usize,
}

impl Default for DraftConfig {
    fn default() -> Self {
        Self {
            ngram_max: 4,
            ngram_min: 1,
            max_draft: MAX_DRAFT,
        }
    }
}

impl DraftConfig {
    /// Checks the ranges (bad user input is an error, never a panic).
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let bad = |param: &'static str, value: usize, reason: &'static str| {
            Err(RuntimeError::InvalidDraftParam {
                param,
                value,
                reason,
            })
        };
        if self.ngram_max == 0 || self.ngram_max > MAX_NGRAM {
            return bad("draft-ngram", self.ngram_max, "must be in 1..=64");
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return bad(
                "draft-ngram-min",
                self.ngram_min,
                "must be at least 1 and at most --draft-ngram",
            );
        }
        if self.max_draft == 0 || self.max_draft > MAX_DRAFT {
            return bad(
                "draft-max",
                self.max_draft,
                "must be in 1..=14 (the verify pass stays on the decode kernels)",
            );
        }
        Ok(())
    }
}

/// What one drafted row adds to a verify pass, as a fraction of a one-token decode step.
/// Measured on the CPU backend (AVX-512 VNNI, 2 threads, the default model): passes of 2, 4,
/// 8 and 15 rows cost 1.03, 1.6, 2.6 and 4.3 one-row passes — the GEMV's work grows with the
/// rows it multiplies, the second row nearly free.
pub const ROW_COST: f32 = 0.2;

/// Weight of the past per drafted-token outcome (kept or rejected) in the pacer's acceptance
/// estimate: about the last 20 outcomes count.
const DECAY: f32 = 0.95;

/// Longest pause after misses in a row, in decode steps.
const MAX_SKIP: usize = 15;

/// Sizes the drafts of one generation by how the previous ones fared (see the module docs).
///
/// The chance `p` that a drafted token is right, given that the ones before it were, is
/// estimated from recent outcomes (kept drafts vs. rejections, weighted by `DECAY` per
/// outcome, starting at ½). The `i`-th drafted token pays off when `p^i > ROW_COST`, so the cap is the
/// largest such `i` (at least 1, at most `max_draft`). After drafts rejected at their first
/// token in a row, drafting pauses for 1, 3, 7, then 15 steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Pacer {
    max_draft: usize,
    /// Decayed count of drafted tokens kept.
    hits: f32,
    /// Decayed count of rejections (passes stopped by a wrong draft).
    fails: f32,
    /// Decode steps left to skip drafting.
    skip: usize,
    /// Drafts rejected at their first token in a row.
    misses: u32,
}

impl Pacer {
    /// A pacer for drafts of at most `max_draft` tokens.
    pub fn new(max_draft: usize) -> Self {
        Self {
            max_draft: max_draft.max(1),
            hits: 0.0,
            fails: 0.0,
            skip: 0,
            misses: 0,
        }
    }

    /// The estimated chance that a drafted token is right given the ones before it were.
    pub fn acceptance(&self) -> f32 {
        (self.hits + 1.0) / (self.hits + self.fails + 2.0)
    }

    /// Most tokens to draft at this decode step (0: do not draft now); call once per step.
    pub fn budget(&mut self) -> usize {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        let p = self.acceptance();
        let n = if p <= ROW_COST {
            1.0
        } else {
            (ROW_COST.ln() / p.ln()).floor()
        };
        // `n` is finite and at least 0 here (0 < ROW_COST < p < 1).
        (n.min(self.max_draft as f32) as usize).max(1)
    }

    /// Records a verify pass that drafted `drafted` tokens (at least one), of which the first
    /// `kept` were confirmed.
    pub fn record(&mut self, drafted: usize, kept: usize) {
        let fail = usize::from(kept < drafted);
        let w = DECAY.powi(i32::try_from(kept + fail).unwrap_or(i32::MAX));
        self.hits = self.hits * w + kept as f32;
        self.fails = self.fails * w + fail as f32;
        if kept == 0 {
            self.misses = self.misses.saturating_add(1);
            // 1 miss: try again at once; then pause 1, 3, 7, 15 steps.
            let shift = (self.misses - 1).min(4);
            self.skip = ((1usize << shift) - 1).min(MAX_SKIP);
        } else {
            self.misses = 0;
        }
    }
}

/// Appends to `out` up to `max` tokens guessed to follow `ctx` (nothing when no n-gram of
/// `cfg` matches). Returns the length of the n-gram that matched (0: none).
///
/// `ctx` is every token so far, prompt and generated, oldest first. The match must end
/// before the last token (the tail itself is not a match); see the module docs.
pub fn draft(ctx: &[u32], cfg: &DraftConfig, max: usize, out: &mut Vec<u32>) -> usize {
    let len = ctx.len();
    if max == 0 {
        return 0;
    }
    for n in (cfg.ngram_min.max(1)..=cfg.ngram_max).rev() {
        if len < n + 1 {
            continue;
        }
        let tail = &ctx[len - n..];
        // Candidate starts s with s + n <= len - 1: at least one token follows the match.
        let Some(s) = (0..len - n).rev().find(|&s| &ctx[s..s + n] == tail) else {
            continue;
        };
        let first = out.len();
        for i in 0..max {
            let src = s + n + i;
            // src - len < i: a copy past the end reads a token drafted just before.
            let t = if src < len {
                ctx[src]
            } else {
                out[first + src - len]
            };
            out.push(t);
        }
        return n;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(ngram_max: usize, ngram_min: usize) -> DraftConfig {
        DraftConfig {
            ngram_max,
            ngram_min,
            max_draft: MAX_DRAFT,
        }
    }

    fn run(ctx: &[u32], c: DraftConfig, max: usize) -> (usize, Vec<u32>) {
        let mut out = Vec::new();
        let n = draft(ctx, &c, max, &mut out);
        (n, out)
    }

    /// The same search written the slow, obvious way: every (n, start) pair, longest n first,
    /// latest start first; the continuation read from `ctx ++ drafted`.
    fn draft_ref(ctx: &[u32], c: &DraftConfig, max: usize) -> (usize, Vec<u32>) {
        for n in (c.ngram_min..=c.ngram_max).rev() {
            for s in (0..ctx.len().saturating_sub(n)).rev() {
                if ctx[s..s + n] == ctx[ctx.len() - n..] {
                    let mut ext = ctx.to_vec();
                    for i in 0..max {
                        ext.push(ext[s + n + i]);
                    }
                    return (n, ext[ctx.len()..].to_vec());
                }
            }
        }
        (0, Vec::new())
    }

    #[test]
    fn no_match_drafts_nothing() {
        assert_eq!(run(&[], cfg(3, 1), 8), (0, vec![]));
        assert_eq!(run(&[7], cfg(3, 1), 8), (0, vec![]));
        assert_eq!(run(&[1, 2, 3, 4, 5], cfg(3, 1), 8), (0, vec![]));
        // A 2-gram that repeats does not match when only 3-grams are allowed.
        assert_eq!(run(&[1, 2, 9, 1, 2], cfg(3, 3), 8), (0, vec![]));
        // max = 0 drafts nothing even where a match exists.
        assert_eq!(run(&[1, 2, 1], cfg(3, 1), 0), (0, vec![]));
    }

    #[test]
    fn copies_the_continuation() {
        // "1 2 3 4 5 ... 1 2" → the 2-gram "1 2" matched at 0, continuation 3 4 5 9 1 2 ...
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2];
        assert_eq!(run(&ctx, cfg(3, 1), 3), (2, vec![3, 4, 5]));
        // The longest n-gram wins over a more recent shorter one.
        let ctx = [5, 1, 2, 7, 8, 2, 6, 5, 1, 2];
        assert_eq!(run(&ctx, cfg(3, 1), 2), (3, vec![7, 8]));
        // Of equal lengths the most recent occurrence wins.
        let ctx = [1, 2, 3, 1, 2, 4, 1, 2];
        assert_eq!(run(&ctx, cfg(2, 2), 1), (2, vec![4]));
    }

    #[test]
    fn match_at_the_end_runs_through_the_draft() {
        // The match ends right before the tail: the copy continues through what it drafted.
        let ctx = [4, 4];
        assert_eq!(run(&ctx, cfg(1, 1), 5), (1, vec![4, 4, 4, 4, 4]));
        // Period 2.
        let ctx = [1, 2, 1, 2, 1];
        assert_eq!(run(&ctx, cfg(3, 1), 5), (3, vec![2, 1, 2, 1, 2]));
        // Period 3, a 1-gram.
        let ctx = [1, 2, 3, 1];
        assert_eq!(run(&ctx, cfg(1, 1), 7), (1, vec![2, 3, 1, 2, 3, 1, 2]));
    }

    #[test]
    fn matches_the_reference_on_awkward_sizes() {
        // Pseudo-random contexts over a small alphabet (many matches) of awkward lengths.
        let mut x = 0x2545_f491_u32;
        for len in [1, 2, 3, 7, 33, 1023] {
            for alphabet in [2, 3, 7, 50] {
                let ctx: Vec<u32> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x % alphabet
                    })
                    .collect();
                for (hi, lo) in [(1, 1), (3, 1), (4, 2), (7, 7)] {
                    for max in [1, 3, MAX_DRAFT] {
                        let c = cfg(hi, lo);
                        assert_eq!(
                            run(&ctx, c, max),
                            draft_ref(&ctx, &c, max),
                            "len {len} alphabet {alphabet} n {hi}..{lo} max {max}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn appends_after_existing_tokens() {
        let mut out = vec![99, 98];
        let n = draft(&[1, 2, 1], &cfg(1, 1), 3, &mut out);
        assert_eq!((n, out), (1, vec![99, 98, 2, 1, 2]));
    }

    #[test]
    fn pacer_drafts_longer_as_drafts_get_kept() {
        let mut p = Pacer::new(14);
        // The prior ½: two tokens (½² > ROW_COST > ½³).
        assert_eq!(p.budget(), 2);
        let mut last = 2;
        for _ in 0..12 {
            let n = p.budget();
            assert!(n >= last, "{n} < {last}");
            p.record(n, n);
            last = n;
        }
        assert_eq!(p.budget(), 14);
        // Rejections shorten the drafts again.
        for _ in 0..6 {
            let n = p.budget();
            p.record(n, n / 4);
        }
        let n = p.budget();
        assert!((1..14).contains(&n), "{n}");
        // The cap bounds the budget; a tiny cap stays at least 1.
        let mut p = Pacer::new(3);
        for _ in 0..10 {
            p.record(3, 3);
        }
        assert_eq!(p.budget(), 3);
        assert_eq!(Pacer::new(0).budget(), 1);
    }

    #[test]
    fn pacer_pauses_after_misses_in_a_row() {
        let mut p = Pacer::new(8);
        // Misses in a row pause 0, 1, 3, 7, 15, 15 steps, then draft one token.
        for (i, pause) in [0, 1, 3, 7, 15, 15].into_iter().enumerate() {
            p.record(1, 0);
            for _ in 0..pause {
                assert_eq!(p.budget(), 0, "miss {i}");
            }
            assert_eq!(p.budget(), 1, "miss {i}");
        }
        assert!(p.acceptance() < ROW_COST);
        // A kept draft ends the pauses.
        p.record(1, 1);
        assert!(p.budget() >= 1);
        p.record(2, 1);
        assert!(p.budget() >= 1);
    }

    #[test]
    fn validate_refuses_bad_settings() {
        assert!(DraftConfig::default().validate().is_ok());
        for c in [cfg(0, 0), cfg(2, 3), cfg(65, 1), cfg(3, 0)] {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let mut c = DraftConfig {
            max_draft: 0,
            ..DraftConfig::default()
        };
        assert!(c.validate().is_err());
        c.max_draft = MAX_DRAFT + 1;
        assert!(c.validate().is_err());
        c.max_draft = MAX_DRAFT;
        assert!(c.validate().is_ok());
    }
}
