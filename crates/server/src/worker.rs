//! Slot workers: one OS thread per slot, each owning a KV cache, fed by one bounded FIFO queue.
//!
//! A handler turns a request into a [`Job`] and [`Queue::submit`]s it (a full queue is refused at
//! once, which the handler maps to HTTP 503). The first free slot takes the oldest job, runs a
//! [`Generator`] over its own [`Sequence`] — so the common prefix with the slot's previous
//! request (a shared system prompt, an earlier chat turn) is reused from the KV cache — and sends
//! [`Out`] events back over the job's channel. When the receiver is gone (the client
//! disconnected) or the server shuts down, the generation's cancel flag is raised.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use damascus_model::Model;
use damascus_runtime::generate::{Completion, Event, GenerateConfig, Generator, TokenEvent};
use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::ServerError;
use crate::metrics::Metrics;

/// One generation request, validated and tokenized.
#[derive(Debug)]
pub struct Job {
    /// Request number (for the log).
    pub id: u64,
    /// Endpoint name (for the log).
    pub kind: &'static str,
    /// Prompt token ids, one list per prompt. `[n_prompts][n_prompt]`
    pub prompts: Vec<Vec<u32>>,
    /// Choices per prompt (`n`): generated one after another, each reusing the prompt's cache.
    pub n: usize,
    /// Sampling parameters.
    pub sampler: SamplerConfig,
    /// Stop strings, token budget, logprobs (the cancel flag is set by the worker).
    pub generate: GenerateConfig,
    /// Reuse the slot's cached prompt prefix (`cache_prompt`).
    pub cache_prompt: bool,
    /// Grammar constraint on the output (structured output, forced tool calls).
    pub grammar: Option<damascus_runtime::sampler::GrammarConstraint>,
    /// Where events go.
    pub tx: UnboundedSender<Out>,
    /// When the job was queued.
    pub enqueued: Instant,
}

/// What a worker sends back for a job. `choice` is `prompt index * n + i`.
#[derive(Debug)]
pub enum Out {
    /// A sampled token of choice `.0`.
    Token(usize, TokenEvent),
    /// Choice `.0` ended (the job is over after the last choice's `Done`).
    Done(usize, Box<Completion>, JobStats),
    /// The generation failed (message for the client); nothing follows.
    Error(String),
    /// The server shut down while choice `.0` was generating; nothing follows.
    Shutdown(usize, Box<Completion>),
}

/// Scheduling facts of one finished job.
#[derive(Debug, Clone, Copy)]
pub struct JobStats {
    /// Slot that ran it.
    pub slot: usize,
    /// Time spent waiting in the queue, ms.
    pub queue_ms: f64,
}

/// The sending side of the job queue, shared by the handlers.
#[derive(Debug)]
pub struct Queue {
    tx: SyncSender<Job>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
    next_id: std::sync::atomic::AtomicU64,
    slots: usize,
}

/// The queue is full (or the server is stopping): try again later.
#[derive(Debug)]
pub struct QueueFull;

impl Queue {
    /// The queue over `tx` (for an engine other than the slot workers).
    pub(crate) fn new(
        tx: SyncSender<Job>,
        metrics: Arc<Metrics>,
        stopping: Arc<AtomicBool>,
        slots: usize,
    ) -> Queue {
        Queue {
            tx,
            metrics,
            stopping,
            next_id: Default::default(),
            slots,
        }
    }

    /// Queues a job, or refuses it at once when `queue_size` jobs already wait.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err(QueueFull);
        }
        Metrics::add(&self.metrics.queue_depth, 1);
        match self.tx.try_send(job) {
            Ok(()) => {
                Metrics::add(&self.metrics.gen_requests, 1);
                Ok(())
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                Metrics::dec(&self.metrics.queue_depth);
                Metrics::add(&self.metrics.rejected_queue_full, 1);
                Err(QueueFull)
            }
        }
    }

    /// A fresh request number.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Refuses new jobs and cancels running ones; the workers exit once idle.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }
}

/// The slot threads.
#[derive(Debug)]
pub struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
    stopping: Arc<AtomicBool>,
}

impl Workers {
    /// Worker threads that exit once `stopping` is raised.
    pub(crate) fn new(
        threads: Vec<std::thread::JoinHandle<()>>,
        stopping: Arc<AtomicBool>,
    ) -> Workers {
        Workers { threads, stopping }
    }

    /// Stops the workers (after their current job) and waits for them.
    pub fn join(self) {
        self.stopping.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Creates `parallel` slots of `n_ctx` positions and their threads.
pub fn start(
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    parallel: usize,
    n_ctx: usize,
    queue_size: usize,
    metrics: Arc<Metrics>,
    log: bool,
) -> Result<(Queue, Workers), ServerError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(queue_size);
    let rx = Arc::new(Mutex::new(rx));
    let stopping = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::with_capacity(parallel);
    for slot in 0..parallel {
        let session = model
            .session_with_n_ctx(n_ctx)
            .map_err(|e| ServerError::Slot {
                slot,
                message: e.to_string(),
            })?;
        let seq = Sequence::new(session);
        let w = Worker {
            slot,
            seq,
            tok: Arc::clone(&tok),
            rx: Arc::clone(&rx),
            metrics: Arc::clone(&metrics),
            stopping: Arc::clone(&stopping),
            log,
        };
        let t = std::thread::Builder::new()
            .name(format!("damascus-slot-{slot}"))
            .spawn(move || w.run())
            .map_err(|e| ServerError::Slot {
                slot,
                message: e.to_string(),
            })?;
        threads.push(t);
    }
    let queue = Queue {
        tx,
        metrics,
        stopping: Arc::clone(&stopping),
        next_id: Default::default(),
        slots: parallel,
    };
    Ok((queue, Workers { threads, stopping }))
}

struct Worker {
    slot: usize,
    seq: Sequence,
    tok: Arc<Tokenizer>,
    rx: Arc<Mutex<Receiver<Job>>>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
    log: bool,
}

impl Worker {
    fn next_job(&self) -> Option<Job> {
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return None;
            }
            let got = match self.rx.lock() {
                Ok(rx) => rx.recv_timeout(Duration::from_millis(50)),
                Err(_) => return None,
            };
            match got {
                Ok(job) => return Some(job),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => continue,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    fn run(mut self) {
        while let Some(job) = self.next_job() {
            Metrics::dec(&self.metrics.queue_depth);
            Metrics::add(&self.metrics.slots_busy, 1);
            self.run_job(job);
            Metrics::dec(&self.metrics.slots_busy);
        }
    }

    fn run_job(&mut self, job: Job) {
        let queue_ms = job.enqueued.elapsed().as_secs_f64() * 1000.0;
        if !job.cache_prompt {
            self.seq.reset();
        }
        let stats = JobStats {
            slot: self.slot,
            queue_ms,
        };
        let mut choice = 0;
        for prompt in &job.prompts {
            for i in 0..job.n {
                // Distinct choices from one request: a given seed moves on by one per choice.
                let mut scfg = job.sampler.clone();
                if job.n > 1 {
                    scfg.seed = scfg.seed.map(|s| s.wrapping_add(i as u64));
                }
                if !self.run_choice(&job, choice, prompt, &scfg, stats) {
                    return;
                }
                choice += 1;
            }
        }
    }

    /// Generates one choice; false when the job must stop (error, shutdown, client gone).
    fn run_choice(
        &mut self,
        job: &Job,
        choice: usize,
        prompt: &[u32],
        scfg: &SamplerConfig,
        stats: JobStats,
    ) -> bool {
        let m = &self.metrics;
        let sampler = match SamplerChain::from_config(scfg) {
            Ok(mut s) => {
                // Every choice starts the grammar afresh.
                if let Some(g) = &job.grammar {
                    s.set_grammar(g.clone());
                }
                s
            }
            Err(e) => {
                Metrics::add(&m.gen_failed, 1);
                let _ = job.tx.send(Out::Error(e.to_string()));
                return false;
            }
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let mut gcfg = job.generate.clone();
        gcfg.cancel = Some(Arc::clone(&cancel));
        let mut generator = Generator::new(&mut self.seq, &self.tok, gcfg, sampler, prompt);
        loop {
            if job.tx.is_closed() || self.stopping.load(Ordering::Relaxed) {
                cancel.store(true, Ordering::Relaxed);
            }
            match generator.step() {
                Ok(Some(Event::Token(t))) => {
                    if job.tx.send(Out::Token(choice, t)).is_err() {
                        cancel.store(true, Ordering::Relaxed);
                    }
                }
                Ok(Some(Event::Done(c))) => {
                    let t = &c.timings;
                    Metrics::add(&m.prompt_tokens, t.prompt_tokens as u64);
                    Metrics::add(&m.prompt_cached_tokens, t.prompt_cached as u64);
                    Metrics::add(&m.generated_tokens, t.generated_tokens as u64);
                    Metrics::add(&m.prompt_us, (t.prompt_ms * 1000.0) as u64);
                    Metrics::add(&m.generation_us, (t.generation_ms * 1000.0) as u64);
                    let cancelled = c.reason == damascus_runtime::generate::StopReason::Cancelled;
                    if cancelled {
                        Metrics::add(&m.gen_cancelled, 1);
                    } else {
                        Metrics::add(&m.gen_completed, 1);
                    }
                    if self.log {
                        log_line(format_args!(
                            "[req {} {}] slot {} queue {:.1} ms | prompt {} tok ({} cached) {:.1} ms | \
                             gen {} tok {:.1} ms ({:.1} tok/s) ttft {:.1} ms | {}",
                            job.id,
                            job.kind,
                            self.slot,
                            stats.queue_ms,
                            t.prompt_tokens,
                            t.prompt_cached,
                            t.prompt_ms,
                            t.generated_tokens,
                            t.generation_ms,
                            t.generation_tok_per_s(),
                            t.ttft_ms,
                            c.reason.as_str()
                        ));
                    }
                    if cancelled && self.stopping.load(Ordering::Relaxed) {
                        let _ = job.tx.send(Out::Shutdown(choice, Box::new(c)));
                        return false;
                    }
                    let _ = job.tx.send(Out::Done(choice, Box::new(c), stats));
                    return !cancelled;
                }
                Ok(None) => return false,
                Err(e) => {
                    Metrics::add(&m.gen_failed, 1);
                    if self.log {
                        log_line(format_args!(
                            "[req {} {}] slot {} failed: {e}",
                            job.id, job.kind, self.slot
                        ));
                    }
                    let _ = job.tx.send(Out::Error(e.to_string()));
                    // The cache may be in any state after a failure: start clean.
                    drop(generator);
                    self.seq.reset();
                    return false;
                }
            }
        }
    }
}

/// One log line on stderr; a closed stderr is ignored (never a panic).
fn log_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
