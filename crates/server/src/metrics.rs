//! Server counters and gauges, rendered in Prometheus text exposition format by `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every counter the server keeps. All fields are monotonic counters unless named a gauge.
#[derive(Debug, Default)]
pub struct Metrics {
    /// HTTP requests received (all routes).
    pub http_requests: AtomicU64,
    /// Generation requests (chat + completions) accepted into the queue.
    pub gen_requests: AtomicU64,
    /// Generation requests finished successfully.
    pub gen_completed: AtomicU64,
    /// Generations cancelled (client disconnect, shutdown).
    pub gen_cancelled: AtomicU64,
    /// Generations that failed in the model.
    pub gen_failed: AtomicU64,
    /// Requests rejected because the queue was full (503).
    pub rejected_queue_full: AtomicU64,
    /// Error responses (4xx/5xx) sent.
    pub errors: AtomicU64,
    /// Prompt tokens of finished generations.
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens reused from a slot's KV cache (prefix cache hits).
    pub prompt_cached_tokens: AtomicU64,
    /// Generated tokens.
    pub generated_tokens: AtomicU64,
    /// Prompt evaluation time, microseconds.
    pub prompt_us: AtomicU64,
    /// Generation time, microseconds.
    pub generation_us: AtomicU64,
    /// Gauge: jobs waiting for a slot.
    pub queue_depth: AtomicU64,
    /// Gauge: slots busy generating.
    pub slots_busy: AtomicU64,
    /// Gauge: tokens in the last forward pass of the batching engine.
    pub batch_tokens: AtomicU64,
    /// Gauge: KV-cache blocks held by sequences.
    pub kv_blocks_used: AtomicU64,
    /// Gauge: KV-cache blocks free or evictable.
    pub kv_blocks_free: AtomicU64,
    /// Gauge: bytes of the shared KV cache (`-c` positions in `--cache-type`).
    pub kv_cache_bytes: AtomicU64,
    /// Prompt tokens looked up in the prefix cache (a counter, set from the pool).
    pub prefix_lookup_tokens: AtomicU64,
    /// Of those, tokens found there (a counter, set from the pool).
    pub prefix_hit_tokens: AtomicU64,
    /// Gauge: prompt tokens per second over the last second or so.
    pub prompt_tok_per_s: AtomicU64,
    /// Gauge: generated tokens per second over the last second or so.
    pub generation_tok_per_s: AtomicU64,
}

impl Metrics {
    /// Adds `n` to a counter.
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Sets a gauge.
    pub fn set(c: &AtomicU64, v: u64) {
        c.store(v, Ordering::Relaxed);
    }

    /// Decrements a gauge (saturating at 0).
    pub fn dec(c: &AtomicU64) {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(1))
        });
    }

    /// The Prometheus text exposition of every metric; `slots` is the number of slots.
    pub fn render(&self, slots: usize) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let rows: [(&str, &str, &str, f64); 15] = [
            (
                "http_requests_total",
                "counter",
                "HTTP requests received",
                g(&self.http_requests) as f64,
            ),
            (
                "requests_total",
                "counter",
                "Generation requests accepted",
                g(&self.gen_requests) as f64,
            ),
            (
                "requests_completed_total",
                "counter",
                "Generations finished",
                g(&self.gen_completed) as f64,
            ),
            (
                "requests_cancelled_total",
                "counter",
                "Generations cancelled (disconnect, shutdown)",
                g(&self.gen_cancelled) as f64,
            ),
            (
                "requests_failed_total",
                "counter",
                "Generations failed in the model",
                g(&self.gen_failed) as f64,
            ),
            (
                "requests_rejected_total",
                "counter",
                "Requests rejected with 503 (queue full)",
                g(&self.rejected_queue_full) as f64,
            ),
            (
                "errors_total",
                "counter",
                "Error responses sent",
                g(&self.errors) as f64,
            ),
            (
                "prompt_tokens_total",
                "counter",
                "Prompt tokens processed",
                g(&self.prompt_tokens) as f64,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from the slot KV cache",
                g(&self.prompt_cached_tokens) as f64,
            ),
            (
                "tokens_generated_total",
                "counter",
                "Tokens generated",
                g(&self.generated_tokens) as f64,
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Prompt evaluation time",
                g(&self.prompt_us) as f64 / 1e6,
            ),
            (
                "generation_seconds_total",
                "counter",
                "Generation time",
                g(&self.generation_us) as f64 / 1e6,
            ),
            (
                "queue_depth",
                "gauge",
                "Requests waiting for a slot",
                g(&self.queue_depth) as f64,
            ),
            (
                "slots_busy",
                "gauge",
                "Slots generating",
                g(&self.slots_busy) as f64,
            ),
            (
                "slots_total",
                "gauge",
                "Slots (parallel sequences)",
                slots as f64,
            ),
        ];
        let lookups = g(&self.prefix_lookup_tokens);
        let hit_rate = if lookups == 0 {
            0.0
        } else {
            g(&self.prefix_hit_tokens) as f64 / lookups as f64
        };
        let batch: [(&str, &str, &str, f64); 9] = [
            (
                "batch_tokens",
                "gauge",
                "Tokens in the last forward pass",
                g(&self.batch_tokens) as f64,
            ),
            (
                "kv_blocks_used",
                "gauge",
                "KV-cache blocks held by sequences",
                g(&self.kv_blocks_used) as f64,
            ),
            (
                "kv_blocks_free",
                "gauge",
                "KV-cache blocks free or evictable",
                g(&self.kv_blocks_free) as f64,
            ),
            (
                "kv_cache_bytes",
                "gauge",
                "Bytes of the shared KV cache (-c positions in --cache-type)",
                g(&self.kv_cache_bytes) as f64,
            ),
            (
                "prefix_lookup_tokens_total",
                "counter",
                "Prompt tokens looked up in the prefix cache",
                lookups as f64,
            ),
            (
                "prefix_hit_tokens_total",
                "counter",
                "Prompt tokens found in the prefix cache",
                g(&self.prefix_hit_tokens) as f64,
            ),
            (
                "prefix_hit_rate",
                "gauge",
                "Share of looked-up prompt tokens found in the prefix cache",
                hit_rate,
            ),
            (
                "prompt_tokens_per_second",
                "gauge",
                "Prompt tokens per second (last second)",
                g(&self.prompt_tok_per_s) as f64,
            ),
            (
                "generation_tokens_per_second",
                "gauge",
                "Generated tokens per second (last second)",
                g(&self.generation_tok_per_s) as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in rows.into_iter().chain(batch) {
            let _ = writeln!(out, "# HELP damascus_{name} {help}");
            let _ = writeln!(out, "# TYPE damascus_{name} {kind}");
            let _ = writeln!(out, "damascus_{name} {v}");
        }
        out
    }
}
