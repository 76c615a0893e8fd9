//! The generation loop: prefill a prompt, then decode token by token until an end-of-generation
//! token, a user stop string, the token budget, a full context or cancellation.
//!
//! [`Generator`] does no I/O: each [`Generator::step`] returns one [`Event`] — a sampled token
//! with the text it released (UTF-8 safe, stop strings held back), or the final
//! [`Event::Done`] with the [`Completion`] (ids, text, stop reason, timings). It also implements
//! `Iterator<Item = Result<Event, RuntimeError>>`.
//!
//! ```no_run
//! # use damascus_runtime::generate::*;
//! # use damascus_runtime::sequence::Sequence;
//! # use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
//! # fn demo(model: &damascus_model::Model, tok: &damascus_tokenizer::Tokenizer)
//! #     -> Result<(), damascus_runtime::RuntimeError> {
//! let mut seq = Sequence::new(model.session()?);
//! let prompt = tok.encode("The capital of France is", true, false);
//! let sampler = SamplerChain::from_config(&SamplerConfig::greedy())?;
//! let cfg = GenerateConfig { max_tokens: Some(32), ..Default::default() };
//! for ev in Generator::new(&mut seq, tok, cfg, sampler, &prompt) {
//!     match ev? {
//!         Event::Token(t) => print!("{}", t.text),
//!         Event::Done(c) => println!("{}\n[{:?}] {}", c.tail, c.reason, c.timings),
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Speculative decoding by prompt lookup ([`GenerateConfig::draft`], [`crate::lookup`]): with
//! plain greedy sampling, each decode step drafts up to `max_draft` tokens by copying what
//! followed an earlier occurrence of the context's last n-gram, runs the last token and the
//! drafts through the model in one pass with a greedy pick after every position, keeps the
//! drafts up to the first one the model would not have picked plus the model's own next token,
//! and drops the rejected positions from the KV cache; a [`lookup::Pacer`] shortens or pauses
//! the drafts while they keep being rejected. The tokens are those of plain greedy
//! decoding, bit for bit, on backends whose multi-token passes are row-invariant (the CPU
//! backends, [`Sequence::row_invariant`]); elsewhere, and with any other sampler (temperature,
//! penalties, grammar, logprobs), drafting stays off ([`Generator::draft_off_reason`]). The
//! events still come one token per [`Generator::step`].
//!
//! Timings follow llama.cpp: prompt evaluation (tokens actually evaluated, not reused from the
//! cache) and generation are timed separately; time to first token runs from the first `step`
//! to the first sampled token.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use damascus_tokenizer::{StreamDecoder, Tokenizer};

use crate::RuntimeError;
use crate::lookup::{self, DraftConfig, Pacer};
use crate::sampler::{SamplerChain, TokenLogprob, token_logprob, top_logprobs};
use crate::sequence::Sequence;
use crate::stop::StopMatcher;

/// Per-request generation settings (sampling parameters live in the [`SamplerChain`]).
#[derive(Debug, Clone, Default)]
pub struct GenerateConfig {
    /// Most tokens to generate; `None` = until end of generation or a full context.
    pub max_tokens: Option<usize>,
    /// User stop strings, matched on the streamed text across token boundaries. The stop string
    /// itself is not part of the output.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Render control tokens (e.g. `<|im_end|>`) in the text.
    pub show_special: bool,
    /// Report each sampled token's log-probability under the raw logits.
    pub logprobs: bool,
    /// Also report this many most likely alternatives per step (0 = none).
    pub top_logprobs: usize,
    /// Set to `true` from another thread (e.g. a Ctrl-C handler) to stop at the next step.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Speculative decoding by prompt lookup (greedy only; see the module docs); `None`: off.
    pub draft: Option<DraftConfig>,
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "value")]
pub enum StopReason {
    /// An end-of-generation token (EOS / EOT) was sampled.
    Eog,
    /// A user stop string appeared in the text (the string is given).
    StopString(String),
    /// The token budget was reached.
    MaxTokens,
    /// The KV cache has no room for another position.
    ContextFull,
    /// The cancellation flag was raised.
    Cancelled,
}

impl StopReason {
    /// Short name: `eog`, `stop`, `length`, `context_full`, `cancelled`.
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::Eog => "eog",
            StopReason::StopString(_) => "stop",
            StopReason::MaxTokens => "length",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// Counters and durations of one generation, like llama.cpp's `llama_perf_context_print`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens reused from the KV cache (not evaluated).
    pub prompt_cached: usize,
    /// Prompt tokens evaluated (`prompt_tokens - prompt_cached`).
    pub prompt_evaluated: usize,
    /// Wall time of the prompt evaluation, ms.
    pub prompt_ms: f64,
    /// Tokens generated (sampled), including a final end-of-generation token.
    pub generated_tokens: usize,
    /// Wall time from the end of the prompt evaluation to the end of generation, ms.
    pub generation_ms: f64,
    /// Wall time from the first step to the first sampled token, ms.
    pub ttft_ms: f64,
    /// Total wall time, ms.
    pub total_ms: f64,
    /// Speculative decoding counters; `None` when drafting was off.
    pub draft: Option<DraftStats>,
}

/// What prompt-lookup drafting did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DraftStats {
    /// Verify passes that carried at least one drafted token.
    pub passes: usize,
    /// Tokens drafted.
    pub drafted: usize,
    /// Drafted tokens the model agreed with (kept).
    pub accepted: usize,
}

impl DraftStats {
    /// `accepted / drafted` (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

impl Timings {
    /// Prompt evaluation speed, tokens/s (evaluated tokens only).
    pub fn prompt_tok_per_s(&self) -> f64 {
        per_s(self.prompt_evaluated, self.prompt_ms)
    }

    /// Generation speed, tokens/s.
    pub fn generation_tok_per_s(&self) -> f64 {
        per_s(self.generated_tokens, self.generation_ms)
    }
}

fn per_s(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

impl fmt::Display for Timings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "prompt eval: {:>8.2} ms / {:>5} tokens ({:>8.2} tok/s, {} reused from cache)",
            self.prompt_ms,
            self.prompt_evaluated,
            self.prompt_tok_per_s(),
            self.prompt_cached
        )?;
        writeln!(
            f,
            "generation:  {:>8.2} ms / {:>5} tokens ({:>8.2} tok/s)",
            self.generation_ms,
            self.generated_tokens,
            self.generation_tok_per_s()
        )?;
        write!(
            f,
            "first token: {:>8.2} ms; total {:.2} ms",
            self.ttft_ms, self.total_ms
        )?;
        if let Some(d) = &self.draft {
            write!(
                f,
                "\ndraft:       {:>5} accepted of {:>5} drafted ({:.1}%) in {} verify passes",
                d.accepted,
                d.drafted,
                100.0 * d.acceptance(),
                d.passes
            )?;
        }
        Ok(())
    }
}

/// One sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// The token id.
    pub id: u32,
    /// Text released by this token: complete UTF-8 characters only, with any text that could be
    /// the start of a stop string held back. Often empty.
    pub text: String,
    /// Log-probability of the token under the raw logits (when requested).
    pub logprob: Option<f32>,
    /// Most likely tokens at this step (when requested).
    pub top_logprobs: Vec<TokenLogprob>,
}

/// The result of a finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Why it ended.
    pub reason: StopReason,
    /// Every generated id (including a final end-of-generation token).
    pub ids: Vec<u32>,
    /// The whole generated text (stop string excluded, control tokens hidden unless asked).
    pub text: String,
    /// Text released at the end that no [`TokenEvent`] carried (held-back bytes); print it.
    pub tail: String,
    /// Counters and durations.
    pub timings: Timings,
}

/// What one [`Generator::step`] produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A token was sampled.
    Token(TokenEvent),
    /// Generation ended; no more events follow.
    Done(Completion),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Running,
    Finished,
}

/// The generation loop over one [`Sequence`]. See the module docs.
pub struct Generator<'a> {
    seq: &'a mut Sequence,
    tok: &'a Tokenizer,
    cfg: GenerateConfig,
    sampler: SamplerChain,
    decoder: StreamDecoder<'a>,
    stop: StopMatcher,
    prompt: Vec<u32>,                // [n_prompt] ids to prefill on the first step
    logits: Vec<f32>,                // [n_vocab] f32 logits for the next sample
    pending: Option<u32>,            // sampled but not yet evaluated token
    ready: VecDeque<u32>,            // verified picks to emit; all but the last already cached
    history: Vec<u32>,               // [n_prompt + n_generated] what the drafter searches
    drafts: Vec<u32>,                // [<= max_draft] scratch of one verify pass
    pacer: Option<Pacer>,            // sizes the drafts (drafting only)
    draft_off: Option<&'static str>, // why drafting is off although asked for
    finish: Option<StopReason>,      // decided during the last step, reported on the next
    ids: Vec<u32>,                   // [n_generated]
    text: String,                    // released text so far
    phase: Phase,
    timings: Timings,
    t_start: Option<Instant>,
    t_prefill_end: Option<Instant>,
}

impl fmt::Debug for Generator<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Generator")
            .field("phase", &self.phase)
            .field("n_prompt", &self.prompt.len())
            .field("n_generated", &self.ids.len())
            .field("sampler", &self.sampler.describe())
            .finish()
    }
}

impl<'a> Generator<'a> {
    /// Prepares a generation of a continuation of `prompt` (the full token sequence; the cached
    /// prefix of `seq` that matches it is reused). Nothing runs until the first
    /// [`Generator::step`]. The prompt tokens are fed to the sampler's penalty window.
    pub fn new(
        seq: &'a mut Sequence,
        tok: &'a Tokenizer,
        cfg: GenerateConfig,
        sampler: SamplerChain,
        prompt: &[u32],
    ) -> Self {
        let stop = StopMatcher::new(cfg.stop.iter().cloned());
        let decoder = tok.stream_decoder(cfg.show_special);
        let draft_off = if cfg.draft.is_none() {
            None
        } else if !sampler.is_plain_greedy() || cfg.logprobs || cfg.top_logprobs > 0 {
            Some(
                "drafting needs plain greedy decoding (temperature 0, no penalties, grammar or \
                 logprobs)",
            )
        } else if !seq.row_invariant() {
            Some("drafting needs a backend whose multi-token passes are row-invariant (CPU)")
        } else {
            None
        };
        Self {
            seq,
            tok,
            cfg,
            sampler,
            decoder,
            stop,
            prompt: prompt.to_vec(),
            logits: Vec::new(),
            pending: None,
            ready: VecDeque::new(),
            history: Vec::new(),
            drafts: Vec::new(),
            pacer: None,
            draft_off,
            finish: None,
            ids: Vec::new(),
            text: String::new(),
            phase: Phase::Start,
            timings: Timings::default(),
            t_start: None,
            t_prefill_end: None,
        }
    }

    /// Why speculative decoding is off although [`GenerateConfig::draft`] asks for it (the
    /// sampler or the backend cannot promise plain greedy output with it); `None` when it runs
    /// or was not asked for.
    pub fn draft_off_reason(&self) -> Option<&'static str> {
        self.draft_off
    }

    /// The drafter's settings when speculative decoding runs.
    fn drafting(&self) -> Option<DraftConfig> {
        self.cfg.draft.filter(|_| self.draft_off.is_none())
    }

    /// Ids generated so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Text released so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The sequence being extended.
    pub fn sequence(&self) -> &Sequence {
        self.seq
    }

    /// Gives the sampler back (its penalty window and RNG state continue from here).
    pub fn into_sampler(self) -> SamplerChain {
        self.sampler
    }

    /// True once [`Event::Done`] has been returned.
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }

    /// Runs until done, calling `on_token` for each token; returns the completion.
    pub fn run(
        mut self,
        mut on_token: impl FnMut(&TokenEvent),
    ) -> Result<Completion, RuntimeError> {
        loop {
            match self.step()? {
                Some(Event::Token(t)) => on_token(&t),
                Some(Event::Done(c)) => return Ok(c),
                None => return Err(RuntimeError::GeneratorFinished),
            }
        }
    }

    fn cancelled(&self) -> bool {
        self.cfg
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Advances by one token. Returns `None` after [`Event::Done`] has been returned.
    ///
    /// The first call evaluates the prompt. A sampled token is evaluated lazily at the start of
    /// the next call, so its event is returned before the model runs again.
    pub fn step(&mut self) -> Result<Option<Event>, RuntimeError> {
        match self.phase {
            Phase::Finished => return Ok(None),
            Phase::Start => {
                let t0 = Instant::now();
                self.t_start = Some(t0);
                self.phase = Phase::Running;
                if self.cancelled() {
                    return Ok(Some(self.done(StopReason::Cancelled)));
                }
                let pre = match self.seq.prefill(&self.prompt) {
                    Ok(p) => p,
                    Err(e) => {
                        self.phase = Phase::Finished;
                        return Err(e);
                    }
                };
                for &t in &self.prompt {
                    self.sampler.accept(t);
                }
                self.logits = pre.logits;
                let t1 = Instant::now();
                self.t_prefill_end = Some(t1);
                self.timings.prompt_tokens = self.prompt.len();
                self.timings.prompt_cached = pre.reused;
                self.timings.prompt_evaluated = pre.evaluated;
                self.timings.prompt_ms = ms(t1 - t0);
                if let Some(d) = self.drafting() {
                    self.history.clone_from(&self.prompt);
                    self.pacer = Some(Pacer::new(d.max_draft.min(lookup::MAX_DRAFT)));
                    self.timings.draft = Some(DraftStats::default());
                }
            }
            Phase::Running => {}
        }
        if let Some(reason) = self.finish.take() {
            return Ok(Some(self.done(reason)));
        }
        if self.cancelled() {
            return Ok(Some(self.done(StopReason::Cancelled)));
        }
        if self.cfg.max_tokens.is_some_and(|m| self.ids.len() >= m) {
            return Ok(Some(self.done(StopReason::MaxTokens)));
        }
        // Plain greedy without logprobs needs only the argmax: the backend picks it (on a
        // GPU the logits never come back).
        let argmax_only =
            self.sampler.is_plain_greedy() && !self.cfg.logprobs && self.cfg.top_logprobs == 0;
        let mut picked = self.ready.pop_front();
        if picked.is_some() {
            // Decided by the last verify pass.
        } else if let Some(t) = self.pending.take() {
            if self.seq.n_free() == 0 {
                return Ok(Some(self.done(StopReason::ContextFull)));
            }
            let r = if let Some(dcfg) = self.drafting() {
                self.verify(t, &dcfg).map(|id| picked = Some(id))
            } else if argmax_only {
                self.seq.eval_argmax(&[t]).map(|id| picked = Some(id))
            } else {
                self.seq.eval(&[t]).map(|l| self.logits = l)
            };
            if let Err(e) = r {
                self.phase = Phase::Finished;
                return Err(e);
            }
        }
        let id = match picked {
            Some(id) => id,
            None => {
                // Raw model output: any NaN or infinity means broken weights or an overflow.
                let n_bad = self.logits.iter().filter(|l| !l.is_finite()).count();
                if n_bad > 0 {
                    self.phase = Phase::Finished;
                    return Err(RuntimeError::NonFiniteLogits {
                        n_bad,
                        n_vocab: self.logits.len(),
                    });
                }
                self.sampler.sample(&self.logits)?
            }
        };
        self.sampler.accept(id);
        if self.ids.is_empty()
            && let Some(t0) = self.t_start
        {
            self.timings.ttft_ms = ms(t0.elapsed());
        }
        self.ids.push(id);
        if self.timings.draft.is_some() {
            self.history.push(id);
        }
        let logprob = self
            .cfg
            .logprobs
            .then(|| token_logprob(&self.logits, id))
            .flatten();
        let top = if self.cfg.top_logprobs > 0 {
            top_logprobs(&self.logits, self.cfg.top_logprobs)
        } else {
            Vec::new()
        };
        let mut text = String::new();
        if self.tok.is_eog(id) && !self.cfg.ignore_eos {
            self.finish = Some(StopReason::Eog);
        } else {
            let piece = self.decoder.push(id)?;
            let out = self.stop.push(&piece);
            text = out.emit;
            if let Some(i) = out.stop {
                self.finish = Some(StopReason::StopString(self.cfg.stop[i].clone()));
            } else if self.ready.is_empty() {
                self.pending = Some(id);
            }
            // Otherwise `id` was a drafted token the last verify pass kept: already cached.
        }
        self.text.push_str(&text);
        Ok(Some(Event::Token(TokenEvent {
            id,
            text,
            logprob,
            top_logprobs: top,
        })))
    }

    /// One speculative step for the sampled, not yet evaluated token `t`: drafts up to
    /// `max_draft` tokens, evaluates `[t, drafts…]` in one pass with a greedy pick after each,
    /// keeps the drafts the picks confirm, queues the confirmed picks in `ready` and returns
    /// the first. The cache then holds `t` and the kept drafts; the last pick is not cached.
    fn verify(&mut self, t: u32, dcfg: &DraftConfig) -> Result<u32, RuntimeError> {
        // Room in the cache (t plus the drafts) and in the token budget (one pick per row).
        let budget = self
            .cfg
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(self.ids.len()));
        let max_draft = dcfg.max_draft.min(lookup::MAX_DRAFT);
        let paced = self.pacer.as_mut().map_or(max_draft, |p| p.budget());
        let max = paced
            .min(self.seq.n_free().saturating_sub(1))
            .min(budget.saturating_sub(1));
        let mut drafts = std::mem::take(&mut self.drafts);
        drafts.clear();
        lookup::draft(&self.history, dcfg, max, &mut drafts);
        if drafts.is_empty() {
            self.drafts = drafts;
            return self.seq.eval_argmax(&[t]);
        }
        let n_past = self.seq.n_past();
        let mut input = Vec::with_capacity(1 + drafts.len()); // [1 + n_draft] ids
        input.push(t);
        input.extend_from_slice(&drafts);
        let picks = self.seq.eval_all_argmax(&input)?; // [1 + n_draft]
        // picks[i] follows input[i]; draft i is right when picks[i] == drafts[i].
        let kept = picks
            .iter()
            .zip(&drafts)
            .take_while(|(p, d)| p == d)
            .count();
        self.seq.truncate(n_past + 1 + kept);
        if let Some(p) = self.pacer.as_mut() {
            p.record(drafts.len(), kept);
        }
        if let Some(st) = self.timings.draft.as_mut() {
            st.passes += 1;
            st.drafted += drafts.len();
            st.accepted += kept;
        }
        self.ready.extend(&picks[1..=kept]);
        self.drafts = drafts;
        Ok(picks[0])
    }

    /// Flushes held-back text, closes the timings and builds the completion.
    fn done(&mut self, reason: StopReason) -> Event {
        self.phase = Phase::Finished;
        if self.timings.draft.is_some() {
            // Plain decoding leaves the prompt and every generated token but the last in the
            // cache; verify passes may have cached kept drafts beyond a stop: drop them.
            let plain = self.prompt.len() + self.ids.len().saturating_sub(1);
            self.seq.truncate(plain);
        }
        let mut tail = String::new();
        if !self.stop.is_stopped() {
            let rest = self.decoder.finish();
            let out = self.stop.push(&rest);
            tail.push_str(&out.emit);
            if out.stop.is_none() {
                tail.push_str(&self.stop.finish());
            }
        }
        self.text.push_str(&tail);
        let now = Instant::now();
        self.timings.generated_tokens = self.ids.len();
        if let Some(t1) = self.t_prefill_end {
            self.timings.generation_ms = ms(now - t1);
        }
        if let Some(t0) = self.t_start {
            self.timings.total_ms = ms(now - t0);
        }
        Event::Done(Completion {
            reason,
            ids: self.ids.clone(),
            text: self.text.clone(),
            tail,
            timings: self.timings.clone(),
        })
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<Event, RuntimeError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step().transpose()
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
