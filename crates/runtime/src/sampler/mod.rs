//! Sampler chain in the style of llama.cpp's `llama-sampler`: a list of small stages, each
//! implementing [`Stage`] (`apply`, `accept`, `reset`), run in order over a [`Candidates`] list
//! built from one row of logits. The last stage picks the token (greedy or random draw).
//!
//! Typical use by the generation loop:
//! ```
//! use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
//! let mut chain = SamplerChain::from_config(&SamplerConfig { seed: Some(1), ..Default::default() })?;
//! // Feed the prompt tokens so the repetition window sees them (llama.cpp does the same).
//! for &t in &[1u32, 2, 3] {
//!     chain.accept(t);
//! }
//! let logits = vec![0.0f32, 1.0, 5.0, 2.0]; // [n_vocab] f32
//! let token = chain.sample(&logits)?;
//! chain.accept(token);
//! # Ok::<(), damascus_runtime::RuntimeError>(())
//! ```
//!
//! Seeds: `SamplerConfig::seed = None` (or llama.cpp's sentinel [`DEFAULT_SEED`] = 0xFFFFFFFF)
//! draws a random seed from the clock, as llama.cpp does; [`SamplerChain::seed`] reports the seed
//! actually used so a run can be replayed. The same explicit seed always gives the same tokens.

mod config;
mod grammar;
mod logprobs;
mod rng;
mod stages;
#[cfg(test)]
mod tests;

pub use config::{DEFAULT_ORDER, SamplerConfig, SamplerKind};
pub use grammar::{GrammarConstraint, grammar_vocab};
pub use logprobs::{TokenLogprob, log_softmax, token_logprob, top_logprobs};
pub use rng::{DEFAULT_SEED, Rng, resolve_seed, splitmix64};
pub use stages::{Dist, Greedy, LogitBias, MinP, Penalties, Temperature, TopK, TopP, TypicalP};

use crate::RuntimeError;
use std::cmp::Ordering;

/// One candidate token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenData {
    /// Token id.
    pub id: u32,
    /// Current (possibly modified) logit.
    pub logit: f32,
    /// Probability; only meaningful right after a stage that ran [`Candidates::softmax`]
    /// (top-p, typical-p, dist).
    pub p: f32,
}

/// The working set of candidate tokens a chain narrows down.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    /// Candidates; when built from logits, `data[i].id == i`. `[n_candidates]`
    pub data: Vec<TokenData>,
    /// True when `data` is sorted by logit, descending (ties: lower id first).
    pub sorted: bool,
    /// Index into `data` of the picked token, set by the final stage.
    pub selected: Option<usize>,
}

/// NaN -> `-inf` (never picked), `+inf` -> `f32::MAX` (keeps softmax finite).
fn sanitize(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else if l == f32::INFINITY {
        f32::MAX
    } else {
        l
    }
}

/// Descending by logit, ties broken by ascending id (deterministic, argmax-compatible).
fn by_logit_desc(a: &TokenData, b: &TokenData) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

impl Candidates {
    /// Builds the full candidate list from one row of logits. NaN logits become `-inf` so they
    /// can never be picked; `+inf` becomes `f32::MAX` so softmax stays finite.
    pub fn from_logits(logits: &[f32]) -> Self {
        let mut c = Self::default();
        c.fill_from_logits(logits);
        c
    }

    /// Like [`Candidates::from_logits`] but reuses this list's allocation.
    pub fn fill_from_logits(&mut self, logits: &[f32]) {
        self.data.clear();
        self.data
            .extend(logits.iter().enumerate().map(|(i, &l)| TokenData {
                id: i as u32,
                logit: sanitize(l),
                p: 0.0,
            }));
        self.sorted = false;
        self.selected = None;
    }

    /// Number of candidates.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when no candidate is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The selected token id, if the final stage has run.
    pub fn selected_token(&self) -> Option<u32> {
        self.selected.and_then(|i| self.data.get(i)).map(|d| d.id)
    }

    /// Largest logit (`-inf` when empty).
    pub fn max_logit(&self) -> f32 {
        if self.sorted {
            return self.data.first().map_or(f32::NEG_INFINITY, |d| d.logit);
        }
        self.data.iter().fold(
            f32::NEG_INFINITY,
            |m, d| if d.logit > m { d.logit } else { m },
        )
    }

    /// Index of the largest logit; ties go to the lowest token id (like `argmax` in torch).
    pub fn argmax(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, d) in self.data.iter().enumerate() {
            best = match best {
                Some(b) if by_logit_desc(d, &self.data[b]) != Ordering::Less => Some(b),
                _ => Some(i),
            };
        }
        best
    }

    /// Sets `p` to the softmax of the current logits (max-subtracted, f64 sum). Does not reorder.
    /// If every logit is `-inf`, probability mass goes uniformly to all candidates.
    pub fn softmax(&mut self) {
        if self.data.is_empty() {
            return;
        }
        let max_l = self.max_logit();
        if max_l == f32::NEG_INFINITY {
            let u = 1.0 / self.data.len() as f32;
            self.data.iter_mut().for_each(|d| d.p = u);
            return;
        }
        let mut sum = 0.0f64;
        for d in &mut self.data {
            d.p = (d.logit - max_l).exp();
            sum += f64::from(d.p);
        }
        let inv = (1.0 / sum) as f32;
        self.data.iter_mut().for_each(|d| d.p *= inv);
    }

    /// Sorts all candidates by logit, descending.
    pub fn sort(&mut self) {
        if !self.sorted {
            self.data.sort_unstable_by(by_logit_desc);
            self.sorted = true;
        }
    }

    /// Moves the `k` largest candidates to the front, in descending order. The rest stays after
    /// them in unspecified order. Sets `sorted` only if that covers the whole list.
    pub fn partial_sort(&mut self, k: usize) {
        if self.sorted {
            return;
        }
        let k = k.min(self.data.len());
        if k == 0 {
            return;
        }
        if k < self.data.len() {
            self.data.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        self.data[..k].sort_unstable_by(by_logit_desc);
        if k == self.data.len() {
            self.sorted = true;
        }
    }

    /// Position of token `id` in `data`: O(1) while the list is still in id order (the usual
    /// case for stages at the head of the chain), else a linear scan.
    pub fn position_of(&self, id: u32) -> Option<usize> {
        match self.data.get(id as usize) {
            Some(d) if d.id == id => Some(id as usize),
            _ => self.data.iter().position(|d| d.id == id),
        }
    }
}

/// One stage of a sampler chain (llama.cpp's `llama_sampler_i`).
pub trait Stage: Send + std::fmt::Debug {
    /// Short name, as used in `--samplers` (e.g. `top_k`).
    fn name(&self) -> &'static str;
    /// Filters / rescales the candidates; a final stage sets `cands.selected`.
    fn apply(&mut self, cands: &mut Candidates);
    /// Observes a token that was appended to the sequence (prompt or generated).
    fn accept(&mut self, _token: u32) {}
    /// Forgets all accepted history (new conversation).
    fn reset(&mut self) {}
}

/// An ordered list of [`Stage`]s ending in a token pick.
#[derive(Debug, Default)]
pub struct SamplerChain {
    stages: Vec<Box<dyn Stage>>,
    seed: Option<u64>, // the resolved seed of the random pick, if the chain has one
    cands: Candidates, // reused buffer: [n_vocab] candidates of the last sample
    grammar: Option<GrammarConstraint>,
    grammar_pick: Option<u32>, // the last pick, committed to the grammar by `accept`
    // When the chain starts with a top-k of the raw logits (or is plain greedy: k = 1), only the
    // k best allowed tokens can matter after masking.
    head_top_k: Option<usize>,
}

impl SamplerChain {
    /// An empty chain. Without a final stage, [`SamplerChain::sample`] falls back to greedy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a stage.
    pub fn push(&mut self, stage: impl Stage + 'static) {
        self.stages.push(Box::new(stage));
    }

    /// Builds the chain llama.cpp's `common_sampler_init` would build for `cfg`: logit bias,
    /// then the stages in `cfg.order` (disabled ones skipped), then a seeded random pick.
    ///
    /// `temp <= 0` means greedy: only the logit-changing stages (logit bias, penalties) are
    /// kept, then the argmax is taken, so the result equals plain greedy decoding.
    pub fn from_config(cfg: &SamplerConfig) -> Result<Self, RuntimeError> {
        cfg.validate()?;
        let mut chain = Self::new();
        if !cfg.logit_bias.is_empty() {
            chain.push(LogitBias::new(cfg.logit_bias.clone()));
        }
        let greedy = cfg.temp <= 0.0;
        for kind in &cfg.order {
            match kind {
                SamplerKind::Penalties => {
                    let p = Penalties::new(
                        cfg.repeat_last_n,
                        cfg.repeat_penalty,
                        cfg.frequency_penalty,
                        cfg.presence_penalty,
                    );
                    if !p.is_disabled() {
                        chain.push(p);
                    }
                }
                _ if greedy => {}
                SamplerKind::TopK => {
                    if cfg.top_k > 0 {
                        chain.push(TopK::new(cfg.top_k));
                    }
                }
                SamplerKind::TypicalP => {
                    if cfg.typical_p < 1.0 {
                        chain.push(TypicalP::new(cfg.typical_p, cfg.min_keep));
                    }
                }
                SamplerKind::TopP => {
                    if cfg.top_p < 1.0 {
                        chain.push(TopP::new(cfg.top_p, cfg.min_keep));
                    }
                }
                SamplerKind::MinP => {
                    if cfg.min_p > 0.0 {
                        chain.push(MinP::new(cfg.min_p, cfg.min_keep));
                    }
                }
                SamplerKind::Temperature => chain.push(Temperature::new(cfg.temp)),
            }
        }
        chain.head_top_k = match chain.stages.first().map(|s| s.name()) {
            Some("top_k") if cfg.logit_bias.is_empty() => Some(cfg.top_k),
            None if greedy => Some(1),
            _ => None,
        };
        if greedy {
            chain.push(Greedy);
        } else {
            let seed = resolve_seed(cfg.seed);
            chain.seed = Some(seed);
            chain.push(Dist::new(seed));
        }
        Ok(chain)
    }

    /// Whether the chain is exactly one greedy pick (no logit bias, no penalties): then the
    /// argmax of the raw logits is the answer and a backend may compute it.
    pub fn is_plain_greedy(&self) -> bool {
        self.grammar.is_none() && matches!(self.stages.as_slice(), [s] if s.name() == "greedy")
    }

    /// The seed of the random pick (resolved, so a random seed can be replayed); `None` for a
    /// greedy chain.
    pub fn seed(&self) -> Option<u64> {
        self.seed
    }

    /// Stage names in order, e.g. `penalties -> top_k -> top_p -> min_p -> temperature -> dist`.
    pub fn describe(&self) -> String {
        let mut names: Vec<&str> = self.stages.iter().map(|s| s.name()).collect();
        if self.grammar.is_some() {
            names.push("grammar");
        }
        names.join(" -> ")
    }

    /// Runs every stage over `logits` (`[n_vocab] f32`, raw model output) and returns the picked
    /// token. Does not call [`SamplerChain::accept`]; the caller does once the token is used.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, RuntimeError> {
        if logits.is_empty() {
            return Err(RuntimeError::EmptyLogits);
        }
        self.cands.fill_from_logits(logits);
        self.run_stages();
        let mut pick = self.cands.selected_token();
        if let Some(g) = &mut self.grammar
            && !pick.is_some_and(|t| g.allows(t))
        {
            // The pick breaks the grammar: mask every refused token and pick again.
            self.cands.fill_from_logits(logits);
            match self.head_top_k {
                Some(k) => g.apply_top_k(&mut self.cands, k),
                None => g.apply(&mut self.cands),
            }
            if self.cands.is_empty() {
                return Err(RuntimeError::NoCandidates {
                    chain: "grammar (it allows no token of the vocabulary here)".into(),
                });
            }
            self.run_stages();
            pick = self.cands.selected_token();
        }
        self.grammar_pick = pick;
        pick.ok_or_else(|| RuntimeError::NoCandidates {
            chain: self.describe(),
        })
    }

    fn run_stages(&mut self) {
        for stage in &mut self.stages {
            stage.apply(&mut self.cands);
        }
        if self.cands.selected.is_none() {
            self.cands.selected = self.cands.argmax();
        }
    }

    /// Constrains every later pick to `grammar` (see [`GrammarConstraint`]). Only tokens picked
    /// by [`SamplerChain::sample`] and then [`SamplerChain::accept`]ed advance it, so prompt
    /// tokens fed to the penalty window do not.
    pub fn set_grammar(&mut self, grammar: GrammarConstraint) {
        self.grammar = Some(grammar);
    }

    /// The grammar constraint, if any.
    pub fn grammar(&self) -> Option<&GrammarConstraint> {
        self.grammar.as_ref()
    }

    /// [`SamplerChain::sample`] followed by [`SamplerChain::accept`] of the picked token.
    pub fn sample_and_accept(&mut self, logits: &[f32]) -> Result<u32, RuntimeError> {
        let t = self.sample(logits)?;
        self.accept(t);
        Ok(t)
    }

    /// Tells every stage that `token` was appended (prompt tokens too, for the penalty window).
    pub fn accept(&mut self, token: u32) {
        for stage in &mut self.stages {
            stage.accept(token);
        }
        if let Some(g) = &mut self.grammar
            && self.grammar_pick.take() == Some(token)
        {
            // The pick was checked against the grammar, so this cannot fail.
            let _ = g.accept(token);
        }
    }

    /// Resets every stage (penalty history, RNG back to the chain's seed).
    pub fn reset(&mut self) {
        for stage in &mut self.stages {
            stage.reset();
        }
        if let Some(g) = &mut self.grammar {
            g.reset();
        }
        self.grammar_pick = None;
    }

    /// The candidates left after the last [`SamplerChain::sample`] (with `selected` set).
    pub fn candidates(&self) -> &Candidates {
        &self.cands
    }
}
