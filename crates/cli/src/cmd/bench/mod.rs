//! `damascus bench`: prompt-processing (pp) and generation (tg) throughput, in the spirit of
//! llama.cpp's `llama-bench`.
//!
//! * `ppN`: one forward pass of `N` random token ids on an empty context.
//! * `tgN`: `N` single-token decode steps on an empty context.
//! * With `-d D` (llama-bench's depth), both run after `D` random tokens already in the cache
//!   (`pp512 @ d4096`): the cache is filled once per test, untimed, and cut back to `D` before
//!   every run.
//! * With `--npl N` (llama-batched-bench's parallel sequences), `N` sequences run together over
//!   one shared paged cache, one batched pass per step (`pp512 x8`, `tg128 x8`; see
//!   [`parallel`]); their tokens/second count every sequence's tokens.
//!
//! Each test runs once as a warm-up (not recorded), then `-r` times; the table gives the median,
//! p5/p95 and standard deviation of the per-run tokens/second. `--json` lists every test by name
//! (`pp512`, `tg128`) with its per-run samples (`samples_ts`, `samples_ns`, as llama-bench
//! names them) and the process's peak RSS.

mod parallel;

use std::time::Instant;

use anyhow::{Context, bail};
use damascus_model::{LoadOptions, Model};

/// Flags of `damascus bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    #[command(flatten)]
    backend: super::BackendArg,
    /// Prompt lengths to test (comma-separated; 0 skips the pp tests).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0 skips the tg tests).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Context depths: tokens already in the cache before each test (comma-separated).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Sequences run together, one batched forward pass per step over a shared paged KV
    /// cache, as the server batches concurrent requests (comma-separated; llama-batched-bench's
    /// `-npl`). Throughput counts every sequence's tokens.
    #[arg(
        long = "npl",
        visible_alias = "n-parallel",
        value_delimiter = ',',
        default_value = "1"
    )]
    n_parallel: Vec<usize>,
    /// Recorded repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 10)]
    repetitions: usize,
    /// Threads (default: one per physical core).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Run on the scalar reference backend instead of the fast CPU backend.
    #[arg(long)]
    reference: bool,
    #[command(flatten)]
    cache: super::generate::CacheTypeArgs,
    /// Print JSON instead of a markdown table.
    #[arg(long)]
    json: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            model: super::ModelArg::default(),
            backend: super::BackendArg::default(),
            n_prompt: vec![512],
            n_gen: vec![128],
            n_depth: vec![0],
            n_parallel: vec![1],
            repetitions: 10,
            threads: None,
            reference: false,
            cache: Default::default(),
            json: false,
        }
    }
}

/// What one test times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// One forward pass of this many prompt tokens.
    Prompt(usize),
    /// This many decode steps.
    Gen(usize),
}

/// One test to run: its kind, after `depth` tokens already in the cache, for `parallel`
/// sequences at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Test {
    kind: Kind,
    depth: usize,
    parallel: usize,
}

/// Most tokens per forward pass while filling the cache to a test's depth, and per prefill
/// pass of `--npl` prompts.
const FILL_CHUNK: usize = 2048;

impl Test {
    /// llama-bench's spelling: `pp512`, `tg128`, `tg128 @ d4096`; `tg128 x8` for 8 sequences.
    fn name(self) -> String {
        let mut base = match self.kind {
            Kind::Prompt(n) => format!("pp{n}"),
            Kind::Gen(n) => format!("tg{n}"),
        };
        if self.parallel > 1 {
            base += &format!(" x{}", self.parallel);
        }
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    /// Tokens of one sequence.
    fn n_tokens(self) -> usize {
        match self.kind {
            Kind::Prompt(n) | Kind::Gen(n) => n,
        }
    }
}

/// Summary statistics of per-run throughputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// 5th percentile (linear interpolation between order statistics).
    pub p5: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Sample standard deviation (0 for a single sample).
    pub stddev: f64,
}

/// `q`-quantile (0..=1) of sorted `v`, interpolating linearly (numpy's default).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Statistics of `samples` (any order).
pub fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    let mean = s.iter().sum::<f64>() / n;
    let var = if s.len() > 1 {
        s.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    Stats {
        mean,
        median: quantile(&s, 0.5),
        p5: quantile(&s, 0.05),
        p95: quantile(&s, 0.95),
        stddev: var.sqrt(),
    }
}

/// xorshift64*: reproducible random token ids without a dependency.
struct Rng(u64);

impl Rng {
    fn next_below(&mut self, n: usize) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        (r % n.max(1) as u64) as u32
    }

    /// `n` random ids below `n_vocab`.
    fn ids(&mut self, n: usize, n_vocab: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_below(n_vocab)).collect()
    }
}

/// Fills `session` with `depth` random tokens (untimed), in passes of [`FILL_CHUNK`].
fn fill(
    session: &mut damascus_model::Session,
    depth: usize,
    rng: &mut Rng,
    n_vocab: usize,
) -> anyhow::Result<()> {
    session.reset();
    let ids = rng.ids(depth, n_vocab);
    for chunk in ids.chunks(FILL_CHUNK) {
        session.eval(chunk)?;
    }
    Ok(())
}

/// Runs `run` once as `test`'s warm-up and `reps` times more, printing progress; returns each
/// recorded run's nanoseconds (at least 1).
fn timed_runs(
    test: Test,
    reps: usize,
    mut run: impl FnMut() -> anyhow::Result<u64>,
) -> anyhow::Result<Vec<u64>> {
    eprint!("{}: warm-up", test.name());
    run()?;
    let mut samples_ns = Vec::with_capacity(reps);
    for r in 0..reps {
        eprint!(" {}", r + 1);
        samples_ns.push(run()?.max(1));
    }
    eprintln!();
    Ok(samples_ns)
}

/// Runs `test` once on a session cut back to the test's depth (filled by [`fill`]); returns
/// the elapsed nanoseconds.
fn run_once(
    session: &mut damascus_model::Session,
    test: Test,
    rng: &mut Rng,
    n_vocab: usize,
) -> anyhow::Result<u64> {
    session.truncate(test.depth);
    // [n] token ids, drawn before the clock starts.
    let ids = rng.ids(test.n_tokens(), n_vocab);
    let t0 = Instant::now();
    match test.kind {
        Kind::Prompt(_) => {
            session.eval(&ids)?;
        }
        Kind::Gen(_) => {
            // Greedy decoding's work: the backend's argmax of each step's logits.
            for &id in &ids {
                session.eval_argmax(&[id])?;
            }
        }
    }
    Ok(t0.elapsed().as_nanos() as u64)
}

/// Runs one-sequence `test` once as a warm-up and `reps` times on a session of its own;
/// returns each run's elapsed nanoseconds.
fn samples(
    model: &Model,
    test: Test,
    reps: usize,
    rng: &mut Rng,
    n_vocab: usize,
) -> anyhow::Result<Vec<u64>> {
    let mut session = model.session_with_n_ctx(test.depth + test.n_tokens())?;
    if test.depth > 0 {
        eprint!("{}: filling {} tokens,", test.name(), test.depth);
        fill(&mut session, test.depth, rng, n_vocab)?;
    } else {
        session.reset();
    }
    timed_runs(test, reps, || run_once(&mut session, test, rng, n_vocab))
}

/// Peak resident set size of this process in bytes (`VmHWM`), if the OS reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Results of one test.
struct Outcome {
    test: Test,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
    stats: Stats,
}

/// Run `damascus bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    if args.threads == Some(0) {
        bail!("-t must be at least 1");
    }
    if args.n_parallel.contains(&0) {
        bail!("--npl must be at least 1");
    }
    let kinds: Vec<Kind> = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Kind::Prompt(n))
        .chain(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| Kind::Gen(n)))
        .collect();
    if kinds.is_empty() {
        bail!("nothing to run: every -p and -n is 0");
    }
    let tests: Vec<Test> = kinds
        .iter()
        .flat_map(|&kind| args.n_depth.iter().map(move |&depth| (kind, depth)))
        .flat_map(|(kind, depth)| {
            args.n_parallel.iter().map(move |&parallel| Test {
                kind,
                depth,
                parallel,
            })
        })
        .collect();
    let path = args.model.resolve()?;
    let n_ctx = tests
        .iter()
        .map(|t| t.depth + t.n_tokens())
        .max()
        .unwrap_or(1);
    // Clamped to the available cores (with a warning) like every command's -t, so the table's
    // threads column says what ran.
    let threads =
        super::threads(args.threads).unwrap_or_else(damascus_kernels::pool::physical_cores);
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        backend: args.backend.kind(args.reference, Some(threads))?,
        no_repack: args.backend.no_repack,
        kernel: super::kernel_settings()?,
        cache_type: args.cache.resolve()?,
    };
    let t_load = Instant::now();
    let model = Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let load_s = t_load.elapsed().as_secs_f64();
    let load_note = model.load_note();
    let n_vocab = model.params().n_vocab;
    let file = model.gguf();
    let file_type = model
        .config()
        .file_type
        .map_or_else(|| "unknown".to_string(), |f| f.name().to_string());
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let (decode_bytes, prompt_ops) = work_per_token(file.tensors(), model.config().tied_embeddings);
    let size = file.file_size();
    let model_name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let backend = model.backend_name();
    let cache_type = model.cache_type();
    let threads = if args.reference { 1 } else { threads };

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut outcomes = Vec::new();
    for &test in &tests {
        let samples_ns = if test.parallel > 1 {
            parallel::samples(&model, test, args.repetitions, &mut rng, n_vocab)?
        } else {
            samples(&model, test, args.repetitions, &mut rng, n_vocab)?
        };
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| (test.parallel * test.n_tokens()) as f64 * 1e9 / ns as f64)
            .collect();
        let stats = stats(&samples_ts);
        outcomes.push(Outcome {
            test,
            samples_ns,
            samples_ts,
            stats,
        });
    }
    let peak_rss = peak_rss_bytes();

    if args.json {
        let tests: Vec<_> = outcomes
            .iter()
            .map(|o| {
                let (n_prompt, n_gen) = match o.test.kind {
                    Kind::Prompt(n) => (n, 0),
                    Kind::Gen(n) => (0, n),
                };
                serde_json::json!({
                    "name": o.test.name(),
                    "n_prompt": n_prompt,
                    "n_gen": n_gen,
                    "n_depth": o.test.depth,
                    "n_parallel": o.test.parallel,
                    "samples_ns": o.samples_ns,
                    "samples_ts": o.samples_ts,
                    "avg_ts": o.stats.mean,
                    "median_ts": o.stats.median,
                    "p5_ts": o.stats.p5,
                    "p95_ts": o.stats.p95,
                    "stddev_ts": o.stats.stddev,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "model_filename": path.display().to_string(),
            "model_type": model_name,
            "file_type": file_type,
            "model_size": size,
            "model_n_params": n_params,
            "backend": backend,
            "n_threads": threads,
            "type_k": cache_type.name(),
            "type_v": cache_type.name(),
            "repetitions": args.repetitions,
            "peak_rss_bytes": peak_rss,
            "load_s": load_s,
            "load_note": load_note,
            "decode_bytes_per_token": decode_bytes,
            "prompt_ops_per_token": prompt_ops,
            "tests": tests,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "| model | file type | size | params | backend | threads | test | t/s median | p5 | p95 | stddev |"
    );
    println!("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for o in &outcomes {
        println!(
            "| {model_name} | {file_type} | {:.2} GiB | {:.2} M | {backend} | {threads} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            size as f64 / (1u64 << 30) as f64,
            n_params as f64 / 1e6,
            o.test.name(),
            o.stats.median,
            o.stats.p5,
            o.stats.p95,
            o.stats.stddev,
        );
    }
    println!();
    if let Some(b) = peak_rss {
        println!(
            "peak RSS {:.1} MiB · {} runs per test after one warm-up · KV cache {cache_type}",
            b as f64 / (1u64 << 20) as f64,
            args.repetitions
        );
    }
    match load_note {
        Some(n) => println!("loaded in {load_s:.2} s · {n}"),
        None => println!("loaded in {load_s:.2} s"),
    }
    Ok(())
}

/// Work one token costs, from the file's tensor table: the weight bytes one decode step reads
/// (every tensor but `rope_freqs`, and but the embedding table unless it doubles as the LM head,
/// `tied`) and the integer ops of one prompt token in the decoder's linear layers (2 · Σ rows ·
/// cols over the 2-D `blk.*` weights; the LM head runs for the last position only).
fn work_per_token(tensors: &[damascus_gguf::TensorInfo], tied: bool) -> (u64, u64) {
    use damascus_gguf::keys::tensors::{ROPE_FREQS, TOKEN_EMBD};
    let bytes = tensors
        .iter()
        .filter(|t| t.name != ROPE_FREQS && (tied || t.name != TOKEN_EMBD))
        .map(|t| t.n_bytes())
        .sum();
    let ops = tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.") && t.dims.len() == 2)
        .map(|t| 2 * t.n_elements())
        .sum();
    (bytes, ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_match_numpy() {
        // numpy: median 3, percentile 5 → 1.2, 95 → 4.8, std(ddof=1) → 1.5811
        let s = stats(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median, 3.0);
        assert!((s.p5 - 1.2).abs() < 1e-12);
        assert!((s.p95 - 4.8).abs() < 1e-12);
        assert!((s.stddev - 1.581_138_830_084).abs() < 1e-9);
        assert_eq!(s.mean, 3.0);
        let one = stats(&[7.0]);
        assert_eq!(
            (one.median, one.p5, one.p95, one.stddev),
            (7.0, 7.0, 7.0, 0.0)
        );
    }

    #[test]
    fn test_names() {
        let t = |kind, depth| Test {
            kind,
            depth,
            parallel: 1,
        };
        assert_eq!(t(Kind::Prompt(512), 0).name(), "pp512");
        assert_eq!(t(Kind::Gen(128), 0).name(), "tg128");
        assert_eq!(t(Kind::Gen(128), 4096).name(), "tg128 @ d4096");
        let x8 = Test {
            parallel: 8,
            ..t(Kind::Gen(128), 4096)
        };
        assert_eq!(x8.name(), "tg128 x8 @ d4096");
        assert_eq!(t(Kind::Prompt(512), 16384).n_tokens(), 512);
    }

    #[test]
    fn work_per_token_counts_the_lm_head_once() {
        use damascus_gguf::{GgmlType, TensorInfo};
        let t = |name: &str, dims: &[u64]| TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            dtype: GgmlType::Q8_0,
            offset: 0,
        };
        // Q8_0: 34 bytes per 32 weights.
        let mut tensors = vec![
            t("token_embd.weight", &[64, 10]),
            t("blk.0.attn_q.weight", &[64, 64]),
            t("blk.0.attn_norm.weight", &[64]),
            t("rope_freqs.weight", &[32]),
        ];
        // Tied: the embedding table is the LM head and is read every step.
        assert_eq!(
            work_per_token(&tensors, true),
            ((20 + 128 + 2) * 34, 2 * 64 * 64)
        );
        tensors.push(t("output.weight", &[64, 10]));
        assert_eq!(
            work_per_token(&tensors, false),
            ((128 + 2 + 20) * 34, 2 * 64 * 64)
        );
    }

    #[test]
    fn random_ids_stay_in_range() {
        let mut r = Rng(1);
        assert!((0..10_000).all(|_| r.next_below(49_152) < 49_152));
    }
}
