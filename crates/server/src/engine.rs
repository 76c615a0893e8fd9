//! The batching engine: continuous batching of every running request through one forward pass
//! per step, over one paged KV cache shared by the whole server.
//!
//! ```text
//!  handlers ──Job──▶ bounded queue ──▶ engine thread: loop {
//!                                          admit waiting jobs (FIFO) while slots and blocks allow
//!                                          drop cancelled ones (client gone): blocks back at once
//!                                          build a step: every decoding sequence's pending token,
//!                                            then prompt chunks, oldest first, up to --batch-size
//!                                          one forward pass for all of them (PagedCache::forward)
//!                                          per sequence: sample, stream, stop, finish
//!                                      }
//! ```
//!
//! The memory is a [`BlockPool`] of `-c / BLOCK_SIZE` blocks: a sequence holds blocks for the
//! positions it has written; finished sequences give them back, and their full blocks stay in
//! the prefix cache (evicted least recently used), so a later request that starts with the
//! same tokens (a system prompt, an earlier chat turn) shares them instead of recomputing them
//! (`cache_prompt: false` opts out). When a running sequence needs a block and none is free,
//! the most recently admitted sequence is preempted: its blocks go back (their full blocks
//! stay cached) and it waits at the head of the queue, to resume where it stopped. The forward
//! pass gives every token the same result whatever shares its batch and however its prefix was
//! computed, so none of this changes a greedy reply.
//!
//! The per-request state machine (sampling, stop strings, streaming UTF-8, logprobs, timings)
//! mirrors [`damascus_runtime::generate::Generator`], which drives a single sequence.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use damascus_model::Model;
use damascus_model::backend::host_argmax;
use damascus_model::batch::{PagedCache, SeqInput};
use damascus_model::kv_pool::{BlockPool, BlockTable};
use damascus_runtime::generate::{Completion, StopReason, Timings, TokenEvent};
use damascus_runtime::sampler::{SamplerChain, token_logprob, top_logprobs};
use damascus_runtime::stop::StopMatcher;
use damascus_tokenizer::{StreamDecoder, Tokenizer};

use crate::ServerError;
use crate::metrics::Metrics;
use crate::worker::{Job, JobStats, Out, Queue, Workers};

/// Positions per KV block.
pub const BLOCK_SIZE: usize = 16;

/// Settings of the engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Most sequences running at once (`--parallel`).
    pub parallel: usize,
    /// Positions of the shared KV cache, all sequences together (`-c`).
    pub n_ctx_total: usize,
    /// Most positions of one sequence (the model's context, at most the total).
    pub n_ctx_seq: usize,
    /// Most tokens per forward pass (`-b`): every decoding sequence's token, then prompt
    /// chunks.
    pub batch_tokens: usize,
    /// Most prompt tokens of one pass while other sequences are decoding (`--prefill-chunk`;
    /// at least 1): smaller chunks bound the decoding streams' inter-token latency while a long
    /// prompt arrives, at the cost of that prompt's time to first token. Set to
    /// `batch_tokens` it changes nothing. `None`: sized from the measured step times
    /// ([`ChunkPolicy`]) so a step with a prompt chunk costs about two decode steps.
    pub prefill_chunk: Option<usize>,
    /// Most requests waiting (more get 503).
    pub queue_size: usize,
    /// One log line per request on stderr.
    pub log: bool,
}

/// Fewest prompt tokens an adaptive chunk gets (below this the matmuls leave the prompt
/// GEMM and a prompt's time to first token grows faster than its neighbours' latency falls).
pub const MIN_ADAPTIVE_CHUNK: usize = 16;

/// Sizes the prompt chunk of a step in which other sequences decode, from the step times
/// measured so far: a pure decode step's time for `d` decoding rows (`decode_ms[d]`, moving
/// average) and a prompt token's share of a step (`token_ms`, moving average of the time a
/// step took beyond its decode part, per prompt token). The chunk is the number of prompt
/// tokens that fit in one more decode step's time, so while a long prompt arrives the
/// decoding streams' inter-token latency stays near twice a decode step instead of growing
/// with `-b`. Until those times are known for `d` (the first steps), chunks are `-b`.
///
/// The engine limits only prompts that arrived while a stream was already decoding: requests
/// that arrive together (a burst) prefill at full size, which keeps their batch together and
/// the aggregate throughput up (measured: a 16..40-token chunk during an 8-request burst cost
/// a quarter of the aggregate tok/s).
#[derive(Debug, Clone)]
pub struct ChunkPolicy {
    /// `Some(n)`: always `n` (`--prefill-chunk`).
    fixed: Option<usize>,
    /// Upper bound and fallback (`-b`).
    max: usize,
    /// `[d]`: ms of a pure decode step of `d` rows.
    decode_ms: Vec<Option<f64>>,
    token_ms: Option<f64>,
}

impl ChunkPolicy {
    /// Weight of the newest sample in the moving averages.
    const ALPHA: f64 = 0.25;

    /// A policy with chunks of at most `max` tokens; `fixed` pins the chunk.
    pub fn new(fixed: Option<usize>, max: usize) -> ChunkPolicy {
        ChunkPolicy {
            fixed: fixed.map(|n| n.max(1)),
            max: max.max(1),
            decode_ms: Vec::new(),
            token_ms: None,
        }
    }

    /// Whether chunks are sized from the step times (no `--prefill-chunk`).
    pub fn adaptive(&self) -> bool {
        self.fixed.is_none()
    }

    /// Most prompt tokens for the next step while `decode_rows` other sequences decode.
    pub fn chunk(&self, decode_rows: usize) -> usize {
        if let Some(n) = self.fixed {
            return n;
        }
        let d = self.decode_ms.get(decode_rows).copied().flatten();
        match (d, self.token_ms) {
            (Some(d), Some(t)) if t > 0.0 => {
                let n = (d / t).floor();
                // `as` saturates; both are finite and t > 0, so n is not NaN.
                (n as usize).clamp(MIN_ADAPTIVE_CHUNK.min(self.max), self.max)
            }
            _ => self.max,
        }
    }

    /// Records a step of `decode_rows` one-token rows and `prompt_tokens` prompt tokens that
    /// took `ms`.
    pub fn observe(&mut self, decode_rows: usize, prompt_tokens: usize, ms: f64) {
        let avg =
            |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + Self::ALPHA * (new - o)));
        if !ms.is_finite() || ms < 0.0 {
            return;
        }
        if prompt_tokens == 0 {
            if decode_rows > 0 {
                if self.decode_ms.len() <= decode_rows {
                    self.decode_ms.resize(decode_rows + 1, None);
                }
                self.decode_ms[decode_rows] = avg(self.decode_ms[decode_rows], ms);
            }
            return;
        }
        let decode_part = match decode_rows {
            0 => 0.0,
            d => match self.decode_ms.get(d).copied().flatten() {
                Some(t) => t,
                // Unknown for this many rows: the sample would charge their decode time to
                // the prompt tokens.
                None => return,
            },
        };
        let per = (ms - decode_part).max(0.0) / prompt_tokens as f64;
        self.token_ms = avg(self.token_ms, per);
    }
}

/// Starts the engine thread.
pub fn start(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
) -> Result<(Queue, Workers), ServerError> {
    let n_blocks = cfg.n_ctx_total.div_ceil(BLOCK_SIZE);
    let cache = model
        .paged_cache(n_blocks, BLOCK_SIZE)
        .map_err(|e| ServerError::Slot {
            slot: 0,
            message: e.to_string(),
        })?;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(cfg.queue_size);
    let stopping = Arc::new(AtomicBool::new(false));
    Metrics::set(&metrics.kv_blocks_free, n_blocks as u64);
    let kv_bytes = n_blocks * BLOCK_SIZE * model.kv_bytes_per_slot();
    Metrics::set(&metrics.kv_cache_bytes, kv_bytes as u64);
    if cfg.log {
        eprintln!(
            "damascus serve: KV cache of {} positions in {} ({:.1} MiB), shared by {} sequences",
            n_blocks * BLOCK_SIZE,
            model.cache_type(),
            kv_bytes as f64 / (1u64 << 20) as f64,
            cfg.parallel
        );
    }
    let engine = Engine {
        cfg: cfg.clone(),
        pool: BlockPool::new(n_blocks, BLOCK_SIZE),
        cache,
        rx: Mutex::new(rx),
        metrics: Arc::clone(&metrics),
        stopping: Arc::clone(&stopping),
    };
    let thread = std::thread::Builder::new()
        .name("damascus-engine".into())
        .spawn(move || engine.run(&tok))
        .map_err(|e| ServerError::Slot {
            slot: 0,
            message: e.to_string(),
        })?;
    let queue = Queue::new(tx, metrics, Arc::clone(&stopping), cfg.parallel);
    Ok((queue, Workers::new(vec![thread], stopping)))
}

struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    cache: PagedCache,
    rx: Mutex<Receiver<Job>>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
}

/// One choice of a request in the engine (a request of `p` prompts × `n` choices is `p · n`
/// sequences sharing its [`Job`]).
struct Seq<'t> {
    job: Arc<Job>,
    /// `prompt index * n + i`, the index the reply uses.
    choice: usize,
    /// Prompt, then every sampled token: `[n_prompt + n_generated]`; the positions
    /// `0..n_past` are in the cache, the rest is still to be fed.
    all: Vec<u32>,
    n_prompt: usize,
    n_past: usize,
    /// Blocks holding positions `0..n_past`; `None` while waiting (new or preempted).
    table: Option<BlockTable>,
    sampler: SamplerChain,
    stop: StopMatcher,
    decoder: StreamDecoder<'t>,
    text: String,
    timings: Timings,
    admitted: Option<Instant>,
    prefill_end: Option<Instant>,
    queue_ms: f64,
    /// Decided after a sample; the sequence leaves after this step.
    finish: Option<StopReason>,
    /// Order of admission (preemption takes the latest).
    admit_seq: u64,
}

impl<'t> Seq<'t> {
    /// The sequences of a new request, one per choice, or the job back with the reason it
    /// cannot run.
    fn for_job(job: Job, tok: &'t Tokenizer) -> Result<Vec<Seq<'t>>, Box<(Job, String)>> {
        let mut seqs = Vec::with_capacity(job.prompts.len() * job.n);
        let job = Arc::new(job);
        for (p, prompt) in job.prompts.iter().enumerate() {
            for i in 0..job.n {
                // Distinct choices from one request: a given seed moves on by one per choice.
                let mut scfg = job.sampler.clone();
                if job.n > 1 {
                    scfg.seed = scfg.seed.map(|s| s.wrapping_add(i as u64));
                }
                let mut sampler = match SamplerChain::from_config(&scfg) {
                    Ok(s) => s,
                    Err(e) => {
                        drop(seqs);
                        let job = Arc::try_unwrap(job)
                            .unwrap_or_else(|_| unreachable!("no sequence holds the job any more"));
                        return Err(Box::new((job, e.to_string())));
                    }
                };
                // Every choice starts the grammar afresh.
                if let Some(g) = &job.grammar {
                    sampler.set_grammar(g.clone());
                }
                seqs.push(Seq::new(
                    Arc::clone(&job),
                    p * job.n + i,
                    prompt,
                    sampler,
                    tok,
                ));
            }
        }
        Ok(seqs)
    }

    fn new(
        job: Arc<Job>,
        choice: usize,
        prompt: &[u32],
        sampler: SamplerChain,
        tok: &'t Tokenizer,
    ) -> Seq<'t> {
        let stop = StopMatcher::new(job.generate.stop.iter().cloned());
        let decoder = tok.stream_decoder(job.generate.show_special);
        let all = prompt.to_vec();
        let queue_ms = job.enqueued.elapsed().as_secs_f64() * 1000.0;
        Seq {
            n_prompt: all.len(),
            all,
            n_past: 0,
            table: None,
            sampler,
            stop,
            decoder,
            text: String::new(),
            timings: Timings::default(),
            admitted: None,
            prefill_end: None,
            queue_ms,
            finish: None,
            admit_seq: 0,
            job,
            choice,
        }
    }

    fn n_generated(&self) -> usize {
        self.all.len() - self.n_prompt
    }

    fn cancelled(&self, stopping: &AtomicBool) -> bool {
        self.job.tx.is_closed() || stopping.load(Ordering::Relaxed)
    }

    /// Samples from `logits` (the last fed position's), streams the token, decides whether
    /// to stop. Mirrors `Generator::step`.
    fn take_logits(&mut self, logits: &[f32], tok: &Tokenizer) -> Result<(), String> {
        if self.prefill_end.is_none() {
            let now = Instant::now();
            self.prefill_end = Some(now);
            for &t in &self.all[..self.n_prompt] {
                self.sampler.accept(t);
            }
            let t0 = self.admitted.unwrap_or(now);
            self.timings.prompt_ms = ms(now - t0);
        }
        let cfg = &self.job.generate;
        // Plain greedy without logprobs needs only the argmax (as the generator's
        // `eval_argmax`): no candidate list of the whole vocabulary on the engine thread.
        let id = if self.sampler.is_plain_greedy() && !cfg.logprobs && cfg.top_logprobs == 0 {
            host_argmax(logits)
        } else {
            self.sampler.sample(logits).map_err(|e| e.to_string())?
        };
        self.sampler.accept(id);
        if self.n_generated() == 0
            && let Some(t0) = self.admitted
        {
            self.timings.ttft_ms = ms(t0.elapsed());
        }
        self.all.push(id);
        let logprob = cfg.logprobs.then(|| token_logprob(logits, id)).flatten();
        let top = if cfg.top_logprobs > 0 {
            top_logprobs(logits, cfg.top_logprobs)
        } else {
            Vec::new()
        };
        let mut text = String::new();
        if tok.is_eog(id) && !cfg.ignore_eos {
            self.finish = Some(StopReason::Eog);
        } else {
            let piece = self.decoder.push(id).map_err(|e| e.to_string())?;
            let out = self.stop.push(&piece);
            text = out.emit;
            if let Some(i) = out.stop {
                self.finish = Some(StopReason::StopString(cfg.stop[i].clone()));
            }
        }
        if self.finish.is_none() && cfg.max_tokens.is_some_and(|m| self.n_generated() >= m) {
            self.finish = Some(StopReason::MaxTokens);
        }
        self.text.push_str(&text);
        let ev = TokenEvent {
            id,
            text,
            logprob,
            top_logprobs: top,
        };
        if self.job.tx.send(Out::Token(self.choice, ev)).is_err() {
            self.finish = Some(StopReason::Cancelled);
        }
        Ok(())
    }

    /// Flushes held-back text and sends the completion (a shutdown event when `shutdown`: the
    /// client can tell a cut-off reply from a normal stop).
    fn done(mut self, reason: StopReason, metrics: &Metrics, log: bool, shutdown: bool) {
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
        let t = &mut self.timings;
        t.prompt_tokens = self.n_prompt;
        t.prompt_evaluated = self.n_prompt - t.prompt_cached.min(self.n_prompt);
        t.generated_tokens = self.all.len() - self.n_prompt;
        if let Some(t1) = self.prefill_end {
            t.generation_ms = ms(now - t1);
        }
        if let Some(t0) = self.admitted {
            t.total_ms = ms(now - t0);
        }
        Metrics::add(&metrics.prompt_tokens, t.prompt_tokens as u64);
        Metrics::add(&metrics.prompt_cached_tokens, t.prompt_cached as u64);
        Metrics::add(&metrics.generated_tokens, t.generated_tokens as u64);
        Metrics::add(&metrics.prompt_us, (t.prompt_ms * 1000.0) as u64);
        Metrics::add(&metrics.generation_us, (t.generation_ms * 1000.0) as u64);
        if reason == StopReason::Cancelled {
            Metrics::add(&metrics.gen_cancelled, 1);
        } else {
            Metrics::add(&metrics.gen_completed, 1);
        }
        if log {
            eprintln!(
                "[req {} {}] queue {:.1} ms | prompt {} tok ({} cached) {:.1} ms | gen {} tok \
                 {:.1} ms ({:.1} tok/s) ttft {:.1} ms | {}",
                self.job.id,
                self.job.kind,
                self.queue_ms,
                t.prompt_tokens,
                t.prompt_cached,
                t.prompt_ms,
                t.generated_tokens,
                t.generation_ms,
                t.generation_tok_per_s(),
                t.ttft_ms,
                reason.as_str()
            );
        }
        let ids = self.all[self.n_prompt..].to_vec();
        let c = Completion {
            reason,
            ids,
            text: self.text,
            tail,
            timings: self.timings,
        };
        let stats = JobStats {
            slot: 0,
            queue_ms: self.queue_ms,
        };
        let out = if shutdown {
            Out::Shutdown(self.choice, Box::new(c))
        } else {
            Out::Done(self.choice, Box::new(c), stats)
        };
        let _ = self.job.tx.send(out);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Tokens and seconds of the last window, for the tok/s gauges.
struct Rate {
    since: Instant,
    prompt: u64,
    generated: u64,
}

impl Engine {
    /// The next job from the queue: waits up to 50 ms when `block`, else only takes one that
    /// is there.
    fn recv(&self, block: bool) -> Option<Job> {
        let rx = self.rx.lock().ok()?;
        let got = if block {
            rx.recv_timeout(Duration::from_millis(50))
        } else {
            rx.try_recv().map_err(|e| match e {
                std::sync::mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                std::sync::mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            })
        };
        got.ok()
    }

    fn run(mut self, tok: &Tokenizer) {
        // Waiting sequences, the head first (preempted ones are put back at the head).
        let mut waiting: VecDeque<Seq<'_>> = VecDeque::new();
        let mut running: Vec<Seq<'_>> = Vec::new();
        let mut admits = 0u64;
        let mut chunk_policy = ChunkPolicy::new(self.cfg.prefill_chunk, self.cfg.batch_tokens);
        let mut rate = Rate {
            since: Instant::now(),
            prompt: 0,
            generated: 0,
        };
        loop {
            let stopping = self.stopping.load(Ordering::Relaxed);
            if stopping && running.is_empty() && waiting.is_empty() {
                // Answer what is still queued, then leave.
                while let Some(job) = self.recv(false) {
                    Metrics::dec(&self.metrics.queue_depth);
                    for s in Seq::for_job(job, tok).unwrap_or_default() {
                        s.done(StopReason::Cancelled, &self.metrics, self.cfg.log, true);
                    }
                }
                return;
            }
            // New jobs: as many as free slots (all that arrived together join the same step),
            // never more, so the bounded channel stays the queue that 503s. Blocks only when
            // there is nothing else to do.
            let mut block = running.is_empty() && waiting.is_empty();
            while running.len() + waiting.len() < self.cfg.parallel
                && let Some(job) = self.recv(block)
            {
                block = false;
                match Seq::for_job(job, tok) {
                    Ok(seqs) => waiting.extend(seqs),
                    Err(failed) => {
                        let (job, e) = *failed;
                        Metrics::dec(&self.metrics.queue_depth);
                        Metrics::add(&self.metrics.gen_failed, 1);
                        let _ = job.tx.send(Out::Error(e));
                    }
                }
            }
            // Cancelled (client gone, shutdown): blocks back at once.
            let mut i = 0;
            while i < running.len() {
                if running[i].cancelled(&self.stopping) {
                    let s = running.swap_remove(i);
                    self.finish(s, StopReason::Cancelled);
                } else {
                    i += 1;
                }
            }
            // Admit, first come first served.
            while running.len() < self.cfg.parallel
                && let Some(mut s) = waiting.pop_front()
            {
                let fresh = s.admitted.is_none();
                let lookup = s.job.cache_prompt || !fresh;
                let (mut table, hit) = self.pool.start(&s.all, lookup);
                // Room for what is known now plus the next token, leaving a block of headroom
                // per running sequence so admissions do not force preemptions.
                let fits = self.pool.reserve(&mut table, s.all.len() + 1).is_ok()
                    && self.pool.n_available() >= running.len();
                if !fits {
                    self.pool.release(table);
                    waiting.push_front(s);
                    break;
                }
                if fresh {
                    if s.choice == 0 {
                        Metrics::dec(&self.metrics.queue_depth);
                    }
                    s.admitted = Some(Instant::now());
                    s.timings.prompt_cached = hit;
                    s.queue_ms = s.job.enqueued.elapsed().as_secs_f64() * 1000.0;
                }
                s.n_past = hit;
                s.table = Some(table);
                admits += 1;
                s.admit_seq = admits;
                running.push(s);
            }
            Metrics::set(&self.metrics.slots_busy, running.len() as u64);
            if running.is_empty() {
                // With nothing running the whole pool is available; a request that still does
                // not fit can never run.
                if let Some(s) = waiting.pop_front() {
                    Metrics::add(&self.metrics.gen_failed, 1);
                    let msg = format!(
                        "{} positions do not fit the KV cache of {} positions",
                        s.all.len() + 1,
                        self.pool.n_blocks() * self.pool.block_size()
                    );
                    let _ = s.job.tx.send(Out::Error(msg));
                }
                self.gauges(0);
                continue;
            }
            // The step: decode tokens first (one per sequence), then prompt chunks by age.
            running.sort_by_key(|s| s.admit_seq);
            let mut budget = self.cfg.batch_tokens.max(running.len());
            let mut chunks = vec![0usize; running.len()];
            for (c, s) in chunks.iter_mut().zip(&running) {
                if s.all.len() - s.n_past == 1 {
                    *c = 1;
                    budget -= 1;
                }
            }
            // While streams decode, prompts get at most a chunk of the pass: `prefill_chunk`,
            // or, sized from the step times, for prompts that arrived after a stream had
            // started decoding (a burst of requests prefills at full size).
            let decoding = chunks.iter().filter(|&&c| c == 1).count();
            let first_decoder = running
                .iter()
                .zip(&chunks)
                .filter(|(_, c)| **c == 1)
                .filter_map(|(s, _)| s.prefill_end)
                .min();
            if decoding > 0 && !chunk_policy.adaptive() {
                budget = budget.min(chunk_policy.chunk(decoding));
            }
            for (c, s) in chunks.iter_mut().zip(&running) {
                let left = s.all.len() - s.n_past;
                if left > 1 && budget > 0 {
                    let cap = match first_decoder {
                        Some(t) if chunk_policy.adaptive() && t < s.job.enqueued => {
                            chunk_policy.chunk(decoding)
                        }
                        _ => budget,
                    };
                    *c = left.min(budget).min(cap);
                    budget -= *c;
                }
            }
            // Blocks for the step; when the pool is dry, preempt the latest admitted.
            let mut i = 0;
            while i < running.len() {
                if chunks[i] == 0 {
                    i += 1;
                    continue;
                }
                let need = running[i].n_past + chunks[i] + 1;
                let table = running[i]
                    .table
                    .as_mut()
                    .expect("running sequences hold a table");
                if self.pool.reserve(table, need).is_ok() {
                    i += 1;
                    continue;
                }
                let victim = (0..running.len())
                    .max_by_key(|&j| running[j].admit_seq)
                    .expect("not empty");
                let mut v = running.remove(victim);
                chunks.remove(victim);
                if let Some(t) = v.table.take() {
                    self.pool.release(t);
                }
                v.n_past = 0;
                waiting.push_front(v);
                if victim < i {
                    i -= 1;
                }
            }
            if running.is_empty() {
                continue;
            }
            let inputs: Vec<SeqInput<'_>> = running
                .iter()
                .zip(&chunks)
                .filter(|(_, c)| **c > 0)
                .map(|(s, &c)| SeqInput {
                    ids: &s.all[s.n_past..s.n_past + c],
                    pos0: s.n_past,
                    table: &s.table.as_ref().expect("admitted").blocks,
                    logits: s.n_past + c == s.all.len(),
                })
                .collect();
            let n_rows: usize = chunks.iter().sum();
            let decode_rows = chunks.iter().filter(|&&c| c == 1).count();
            let t0 = Instant::now();
            let result = self.cache.forward(&inputs);
            chunk_policy.observe(decode_rows, n_rows - decode_rows, ms(t0.elapsed()));
            drop(inputs);
            let logits = match result {
                Ok(l) => l,
                Err(e) => {
                    // A failed pass: every sequence in it fails; the cache is not trusted.
                    for s in running.drain(..) {
                        Metrics::add(&self.metrics.gen_failed, 1);
                        let _ = s.job.tx.send(Out::Error(e.to_string()));
                        if let Some(t) = s.table {
                            self.pool.release(t);
                        }
                    }
                    continue;
                }
            };
            // Logits go to the sequences in the order they were asked for.
            let mut outs = logits.into_iter();
            let mut gen_now = 0u64;
            let mut prompt_now = 0u64;
            let step: Vec<(Seq<'_>, usize)> = running.drain(..).zip(chunks).collect();
            for (mut s, c) in step {
                if c > 0 {
                    prompt_now += s.n_prompt.saturating_sub(s.n_past).min(c) as u64;
                    s.n_past += c;
                    let table = s.table.as_mut().expect("admitted");
                    self.pool.commit(table, &s.all[..s.n_past]);
                    if s.n_past == s.all.len() {
                        let l = outs.next().unwrap_or_default();
                        if let Err(e) = s.take_logits(&l, tok) {
                            Metrics::add(&self.metrics.gen_failed, 1);
                            let _ = s.job.tx.send(Out::Error(e));
                            if let Some(t) = s.table.take() {
                                self.pool.release(t);
                            }
                            continue;
                        }
                        gen_now += 1;
                    }
                }
                let full = s.finish.is_none() && s.all.len() > self.cfg.n_ctx_seq;
                if let Some(reason) = s.finish.clone() {
                    self.finish(s, reason);
                } else if full {
                    self.finish(s, StopReason::ContextFull);
                } else {
                    running.push(s);
                }
            }
            rate.prompt += prompt_now;
            rate.generated += gen_now;
            let secs = rate.since.elapsed().as_secs_f64();
            if secs >= 1.0 {
                Metrics::set(
                    &self.metrics.prompt_tok_per_s,
                    (rate.prompt as f64 / secs) as u64,
                );
                Metrics::set(
                    &self.metrics.generation_tok_per_s,
                    (rate.generated as f64 / secs) as u64,
                );
                rate = Rate {
                    since: Instant::now(),
                    prompt: 0,
                    generated: 0,
                };
            }
            self.gauges(n_rows);
        }
    }

    /// Gives a sequence's blocks back and sends its completion.
    fn finish(&mut self, mut s: Seq<'_>, reason: StopReason) {
        if let Some(t) = s.table.take() {
            self.pool.release(t);
        }
        let shutdown = reason == StopReason::Cancelled && self.stopping.load(Ordering::Relaxed);
        s.done(reason, &self.metrics, self.cfg.log, shutdown);
    }

    fn gauges(&self, batch_rows: usize) {
        let m = &self.metrics;
        Metrics::set(&m.batch_tokens, batch_rows as u64);
        Metrics::set(&m.kv_blocks_used, self.pool.n_used() as u64);
        Metrics::set(&m.kv_blocks_free, self.pool.n_available() as u64);
        let st = self.pool.stats();
        Metrics::set(&m.prefix_lookup_tokens, st.lookup_tokens);
        Metrics::set(&m.prefix_hit_tokens, st.hit_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_chunk_wins() {
        let mut p = ChunkPolicy::new(Some(64), 512);
        p.observe(16, 0, 10.0);
        p.observe(16, 64, 40.0);
        assert_eq!(p.chunk(16), 64);
        assert!(!p.adaptive());
        assert_eq!(ChunkPolicy::new(Some(0), 512).chunk(1), 1);
    }

    #[test]
    fn adaptive_chunk_fits_one_decode_step() {
        let mut p = ChunkPolicy::new(None, 512);
        assert!(p.adaptive());
        // Nothing measured yet: the whole budget, as before.
        assert_eq!(p.chunk(16), 512);
        p.observe(16, 0, 12.0);
        assert_eq!(p.chunk(16), 512, "no prompt step seen yet");
        // 16 decode rows + 512 prompt tokens in 268 ms: 0.5 ms per prompt token.
        p.observe(16, 512, 268.0);
        assert_eq!(p.chunk(16), 24);
        // Step times are per decode-row count: 8 rows were never timed alone.
        assert_eq!(p.chunk(8), 512);
        // A prompt-only step (no decode part) updates the token cost too.
        let mut q = ChunkPolicy::new(None, 512);
        q.observe(0, 512, 256.0);
        q.observe(4, 0, 100.0);
        assert_eq!(q.chunk(4), 200);
        // A mixed step whose decode part is unknown teaches nothing.
        q.observe(3, 10, 1000.0);
        assert_eq!(q.chunk(4), 200);
        // Clamped to [16, max].
        let mut r = ChunkPolicy::new(None, 100);
        r.observe(0, 100, 100.0);
        r.observe(1, 0, 2.0);
        assert_eq!(r.chunk(1), MIN_ADAPTIVE_CHUNK);
        r.observe(1, 0, 1e6);
        assert_eq!(r.chunk(1), 100);
        // A max below the floor stays the max.
        let mut s = ChunkPolicy::new(None, 8);
        s.observe(0, 8, 8.0);
        s.observe(1, 0, 1.0);
        assert_eq!(s.chunk(1), 8);
    }

    #[test]
    fn adaptive_chunk_follows_the_moving_averages() {
        let mut p = ChunkPolicy::new(None, 512);
        p.observe(8, 0, 10.0);
        p.observe(0, 100, 100.0); // 1 ms per token
        assert_eq!(p.chunk(8), 16, "10 ms / 1 ms = 10, floored at 16");
        for _ in 0..40 {
            p.observe(8, 0, 40.0);
        }
        // decode_ms[8] → 40 from below (39.999…): 39 tokens per chunk.
        assert_eq!(p.chunk(8), 39);
        // Bad samples are ignored.
        p.observe(8, 0, f64::NAN);
        p.observe(8, 10, -1.0);
        assert_eq!(p.chunk(8), 39);
        // A step faster than its decode part counts as free prompt tokens, never negative.
        let mut q = ChunkPolicy::new(None, 512);
        q.observe(8, 0, 10.0);
        q.observe(8, 10, 5.0);
        assert_eq!(q.chunk(8), 512, "a zero token cost leaves the budget alone");
    }
}
