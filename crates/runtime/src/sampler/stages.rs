//! The sampler stages. Semantics follow llama.cpp's `src/llama-sampler.cpp` (read for facts,
//! written from scratch): truncation stages never leave fewer than one candidate.

use super::{Candidates, Rng, Stage};
use std::collections::{HashMap, VecDeque};

/// Final pick: the largest logit (ties: lowest id).
#[derive(Debug, Clone, Copy, Default)]
pub struct Greedy;

impl Stage for Greedy {
    fn name(&self) -> &'static str {
        "greedy"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        cands.selected = cands.argmax();
    }
}

/// Final pick: a random draw from the softmax of the remaining candidates, with our seeded RNG.
#[derive(Debug, Clone)]
pub struct Dist {
    seed: u64,
    rng: Rng,
}

impl Dist {
    /// A random pick seeded with `seed` (already resolved; see [`super::resolve_seed`]).
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            rng: Rng::new(seed),
        }
    }
}

impl Stage for Dist {
    fn name(&self) -> &'static str {
        "dist"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if cands.is_empty() {
            cands.selected = None;
            return;
        }
        cands.softmax();
        // Always draw once per pick so the stream stays aligned whatever the candidate count.
        let target = self.rng.next_f64();
        let mut cum = 0.0f64;
        let mut pick = None;
        for (i, d) in cands.data.iter().enumerate() {
            if d.p <= 0.0 {
                continue;
            }
            cum += f64::from(d.p);
            if pick.is_none() && cum > target {
                pick = Some(i);
                break;
            }
        }
        // Rounding can leave the cumulative sum just under `target`: take the last token with
        // non-zero probability, or the argmax when every probability underflowed.
        cands.selected = pick
            .or_else(|| cands.data.iter().rposition(|d| d.p > 0.0))
            .or_else(|| cands.argmax());
    }
    fn reset(&mut self) {
        self.rng = Rng::new(self.seed);
    }
}

/// Temperature: divides logits by `temp`. `temp <= 0` keeps only the argmax finite (llama.cpp's
/// behaviour); [`super::SamplerChain::from_config`] uses [`Greedy`] for that case instead.
#[derive(Debug, Clone, Copy)]
pub struct Temperature {
    temp: f32,
}

impl Temperature {
    /// Temperature stage.
    pub fn new(temp: f32) -> Self {
        Self { temp }
    }
}

impl Stage for Temperature {
    fn name(&self) -> &'static str {
        "temperature"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.temp <= 0.0 {
            if let Some(best) = cands.argmax() {
                for (i, d) in cands.data.iter_mut().enumerate() {
                    if i != best {
                        d.logit = f32::NEG_INFINITY;
                    }
                }
            }
            return;
        }
        let inv = 1.0 / self.temp;
        cands.data.iter_mut().for_each(|d| d.logit *= inv);
        // Dividing by a positive number keeps the order, so `sorted` stays valid.
    }
}

/// Top-k: keeps the `k` largest logits (`k == 0`: disabled).
#[derive(Debug, Clone, Copy)]
pub struct TopK {
    k: usize,
}

impl TopK {
    /// Top-k stage.
    pub fn new(k: usize) -> Self {
        Self { k }
    }
}

impl Stage for TopK {
    fn name(&self) -> &'static str {
        "top_k"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.k == 0 || cands.is_empty() {
            return;
        }
        let k = self.k.min(cands.len());
        cands.partial_sort(k);
        cands.data.truncate(k);
        cands.sorted = true;
    }
}

/// Top-p (nucleus): keeps the smallest prefix of the sorted candidates whose probability
/// reaches `p` (and at least `min_keep`).
#[derive(Debug, Clone, Copy)]
pub struct TopP {
    p: f32,
    min_keep: usize,
}

impl TopP {
    /// Top-p stage.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

/// Number of leading candidates that top-p keeps, given probabilities in descending order.
/// `None` when the first `data.len()` do not reach `p` yet.
fn top_p_cut(probs: impl Iterator<Item = f32>, p: f32, min_keep: usize) -> Option<usize> {
    let mut cum = 0.0f32;
    for (i, q) in probs.enumerate() {
        cum += q;
        if cum >= p && i + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    None
}

impl Stage for TopP {
    fn name(&self) -> &'static str {
        "top_p"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.p >= 1.0 || cands.is_empty() {
            return;
        }
        cands.softmax();
        // Large unsorted lists: the nucleus is usually tiny, so look at the top 256 first and
        // grow geometrically (each step is one O(n) selection) before a full sort.
        let mut k = 256;
        while !cands.sorted && k < cands.len() / 2 {
            cands.partial_sort(k);
            let top = cands.data[..k].iter().map(|d| d.p);
            if let Some(n) = top_p_cut(top, self.p, self.min_keep) {
                cands.data.truncate(n);
                cands.sorted = true;
                return;
            }
            k *= 4;
        }
        cands.sort();
        let n =
            top_p_cut(cands.data.iter().map(|d| d.p), self.p, self.min_keep).unwrap_or(cands.len());
        cands.data.truncate(n);
    }
}

/// Min-p: drops tokens whose probability is below `p` times the top probability, i.e. whose
/// logit is below `max_logit + ln(p)` (keeps at least `max(1, min_keep)`).
#[derive(Debug, Clone, Copy)]
pub struct MinP {
    p: f32,
    min_keep: usize,
}

impl MinP {
    /// Min-p stage.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

impl Stage for MinP {
    fn name(&self) -> &'static str {
        "min_p"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.p <= 0.0 || cands.is_empty() {
            return;
        }
        let min_logit = cands.max_logit() + self.p.ln();
        let keep_at_least = self.min_keep.max(1);
        let n_pass = cands.data.iter().filter(|d| d.logit >= min_logit).count();
        if n_pass >= keep_at_least {
            // Filter in place, keeping relative order (and so `sorted`).
            cands.data.retain(|d| d.logit >= min_logit);
        } else {
            let n = keep_at_least.min(cands.len());
            cands.partial_sort(n);
            cands.data.truncate(n);
            cands.sorted = true;
        }
    }
}

/// Locally typical sampling (Meister et al.): keeps the tokens whose surprisal is closest to the
/// distribution's entropy until their mass exceeds `p`.
#[derive(Debug, Clone, Copy)]
pub struct TypicalP {
    p: f32,
    min_keep: usize,
}

impl TypicalP {
    /// Typical-p stage.
    pub fn new(p: f32, min_keep: usize) -> Self {
        Self { p, min_keep }
    }
}

impl Stage for TypicalP {
    fn name(&self) -> &'static str {
        "typ_p"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.p >= 1.0 || cands.is_empty() {
            return;
        }
        cands.sort();
        cands.softmax();
        let entropy: f32 = cands
            .data
            .iter()
            .filter(|d| d.p > 0.0)
            .map(|d| -d.p * d.p.ln())
            .sum();
        // |surprisal - entropy| per candidate; zero-probability tokens are maximally atypical.
        let mut scored: Vec<(f32, usize)> = cands
            .data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let s = if d.p > 0.0 {
                    (-d.p.ln() - entropy).abs()
                } else {
                    f32::INFINITY
                };
                (s, i)
            })
            .collect();
        // Stable: ties keep the logit order.
        scored.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cum = 0.0f32;
        let mut keep = scored.len();
        for (j, &(_, i)) in scored.iter().enumerate() {
            cum += cands.data[i].p;
            if cum > self.p && j + 1 >= self.min_keep {
                keep = j + 1;
                break;
            }
        }
        let new: Vec<_> = scored[..keep].iter().map(|&(_, i)| cands.data[i]).collect();
        cands.data = new;
        cands.sorted = false;
    }
}

/// Repetition / frequency / presence penalties over the last `last_n` accepted tokens.
///
/// For each token seen `c > 0` times in the window: a positive logit is divided by `repeat`, a
/// non-positive one multiplied by it; then `c * frequency + presence` is subtracted.
#[derive(Debug, Clone)]
pub struct Penalties {
    last_n: usize,
    repeat: f32,
    frequency: f32,
    presence: f32,
    window: VecDeque<u32>, // last accepted tokens, oldest first: [<= last_n]
    counts: HashMap<u32, usize>, // token -> occurrences in `window`
}

impl Penalties {
    /// Penalty stage; `last_n == 0` disables it.
    pub fn new(last_n: usize, repeat: f32, frequency: f32, presence: f32) -> Self {
        Self {
            last_n,
            repeat,
            frequency,
            presence,
            window: VecDeque::new(),
            counts: HashMap::new(),
        }
    }

    /// True when the stage cannot change any logit.
    pub fn is_disabled(&self) -> bool {
        self.last_n == 0 || (self.repeat == 1.0 && self.frequency == 0.0 && self.presence == 0.0)
    }

    /// How many times `token` occurs in the current window.
    pub fn count(&self, token: u32) -> usize {
        self.counts.get(&token).copied().unwrap_or(0)
    }
}

impl Stage for Penalties {
    fn name(&self) -> &'static str {
        "penalties"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        if self.is_disabled() || self.counts.is_empty() {
            return;
        }
        for (&tok, &c) in &self.counts {
            let Some(pos) = cands.position_of(tok) else {
                continue;
            };
            let d = &mut cands.data[pos];
            if d.logit <= 0.0 {
                d.logit *= self.repeat;
            } else {
                d.logit /= self.repeat;
            }
            d.logit -= c as f32 * self.frequency + self.presence;
        }
        cands.sorted = false;
    }
    fn accept(&mut self, token: u32) {
        if self.last_n == 0 {
            return;
        }
        if self.window.len() >= self.last_n
            && let Some(old) = self.window.pop_front()
            && let Some(c) = self.counts.get_mut(&old)
        {
            *c -= 1;
            if *c == 0 {
                self.counts.remove(&old);
            }
        }
        self.window.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }
    fn reset(&mut self) {
        self.window.clear();
        self.counts.clear();
    }
}

/// Adds a fixed bias to chosen tokens' logits (`-inf` bans a token). Ids outside the vocabulary
/// are ignored.
#[derive(Debug, Clone)]
pub struct LogitBias {
    biases: Vec<(u32, f32)>,
}

impl LogitBias {
    /// Logit-bias stage from `(token, bias)` pairs.
    pub fn new(biases: Vec<(u32, f32)>) -> Self {
        Self { biases }
    }
}

impl Stage for LogitBias {
    fn name(&self) -> &'static str {
        "logit_bias"
    }
    fn apply(&mut self, cands: &mut Candidates) {
        for &(tok, bias) in &self.biases {
            if let Some(pos) = cands.position_of(tok) {
                cands.data[pos].logit += bias;
            }
        }
        cands.sorted = false;
    }
}
