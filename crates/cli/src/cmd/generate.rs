//! `damascus generate` and its alias `damascus run`: complete a prompt, streaming the text.
//!
//! ```text
//! $ damascus generate -p "The capital of France is" -n 16 --temp 0
//! $ damascus run "Write a haiku about rust" --temp 0.7 --seed 1
//! $ damascus generate -p "Hi" --json        # ids, text, stop reason and timings as JSON
//! ```
//!
//! Text goes to stdout as it is generated; timings go to stderr at the end (llama.cpp style).
//! Ctrl-C stops the generation (a second Ctrl-C exits at once).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_runtime::generate::{Completion, Event, GenerateConfig, Generator};
use damascus_runtime::sampler::{SamplerChain, SamplerConfig, SamplerKind};
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::Tokenizer;

/// KV cache element type.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (half the memory).
    #[default]
    F16,
}

/// Model and engine flags shared by `generate`, `run` and `chat`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EngineArgs {
    #[command(flatten)]
    pub model: super::ModelArg,
    #[command(flatten)]
    pub backend: super::BackendArg,
    /// Force the scalar f32 reference path (no activation quantization).
    #[arg(long)]
    pub reference: bool,
    /// Context length (KV cache positions); default min(training context, 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Threads of the CPU backend (default: one per physical core).
    #[arg(short = 't', long = "threads", conflicts_with = "reference")]
    pub threads: Option<usize>,
    /// KV cache element type [default: f16 on the fast path, f32 on --reference].
    #[arg(long, value_enum)]
    pub cache_type: Option<CacheType>,
}

impl EngineArgs {
    /// Loads the model and its tokenizer.
    pub fn load(&self) -> anyhow::Result<(Model, Tokenizer)> {
        let path = self.model.resolve()?;
        let opts = LoadOptions {
            n_ctx: self.ctx_size,
            backend: self.backend.kind(self.reference, self.threads)?,
            no_repack: self.backend.no_repack,
            kernel: super::kernel_settings()?,
            cache_type: self.cache_type.map(|t| match t {
                CacheType::F32 => KvCacheType::F32,
                CacheType::F16 => KvCacheType::F16,
            }),
        };
        let model =
            Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
        Ok((model, tokenizer))
    }
}

/// Sampling and stopping flags shared by `generate`, `run` and `chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Tokens to generate; -1 = until end of generation or a full context.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k; 0 disables.
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (nucleus); 1 disables.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p; 0 disables.
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Locally typical sampling p; 1 disables.
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical_p: f32,
    /// Repetition penalty; 1 disables.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Penalty window in tokens; 0 disables penalties.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Presence penalty; 0 disables.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty; 0 disables.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random, printed with --json).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Sampler order, `;`-separated names (default penalties;top_k;typ_p;top_p;min_p;temperature).
    #[arg(long)]
    pub samplers: Option<String>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The validated sampler configuration.
    pub fn sampler_config(&self) -> anyhow::Result<SamplerConfig> {
        let mut cfg = SamplerConfig {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplerConfig::default()
        };
        if let Some(order) = &self.samplers {
            cfg.order = SamplerKind::parse_order(order)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The generation settings (without cancellation).
    pub fn generate_config(&self) -> GenerateConfig {
        GenerateConfig {
            max_tokens: usize::try_from(self.n_predict).ok(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            ..GenerateConfig::default()
        }
    }
}

/// Flags common to `generate` and `run`.
#[derive(clap::Args, Debug, Clone)]
pub struct CommonArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print one JSON object (prompt ids, ids, text, stop reason, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
    /// Do not prepend BOS even if the model's metadata asks for it.
    #[arg(long)]
    pub no_bos: bool,
    /// Parse special-token strings (e.g. `<|im_start|>`) in the prompt as single tokens.
    #[arg(long)]
    pub special: bool,
    /// Do not print the timings to stderr.
    #[arg(long)]
    pub no_perf: bool,
}

/// Flags of `damascus generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The prompt text.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
}

/// Flags of `damascus run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The prompt text.
    pub prompt: String,
}

/// Run `damascus generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    generate(&args.common, &args.prompt)
}

/// Run `damascus run`.
pub fn run_alias(args: RunArgs) -> anyhow::Result<()> {
    generate(&args.common, &args.prompt)
}

/// A cancellation flag raised by Ctrl-C. The first Ctrl-C stops the current generation; a
/// second one while the flag is still raised exits the process.
pub fn ctrl_c_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = Arc::clone(&flag);
    // Installing can only fail if a handler exists already; generation then is not cancellable.
    let _ = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
    flag
}

/// Prints the llama.cpp-style timing summary to stderr.
pub fn print_perf(c: &Completion) {
    let reason = match &c.reason {
        damascus_runtime::generate::StopReason::StopString(s) => format!("stop string {s:?}"),
        r => r.as_str().to_string(),
    };
    eprintln!("\n[stopped: {reason}]\n{}", c.timings);
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    prompt_ids: &'a [u32],
    ids: &'a [u32],
    text: &'a str,
    stop_reason: &'static str,
    stop_string: Option<&'a str>,
    timings: &'a damascus_runtime::generate::Timings,
    seed: Option<u64>,
    sampler: String,
    backend: &'static str,
}

fn generate(args: &CommonArgs, prompt: &str) -> anyhow::Result<()> {
    let scfg = args.sampling.sampler_config()?;
    let (model, tok) = args.engine.load()?;
    let ids = tok.encode(prompt, !args.no_bos, args.special);
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    let sampler = SamplerChain::from_config(&scfg)?;
    let seed = sampler.seed();
    let desc = sampler.describe();
    let mut gcfg = args.sampling.generate_config();
    gcfg.cancel = Some(ctrl_c_flag());
    let mut seq = Sequence::new(model.session()?);
    let mut generator = Generator::new(&mut seq, &tok, gcfg, sampler, &ids);
    let mut stdout = std::io::stdout().lock();
    if !args.json {
        write!(stdout, "{prompt}")?;
        stdout.flush()?;
    }
    let done = loop {
        match generator.step()? {
            Some(Event::Token(t)) => {
                if !args.json && !t.text.is_empty() {
                    write!(stdout, "{}", t.text)?;
                    stdout.flush()?;
                }
            }
            Some(Event::Done(c)) => break c,
            None => bail!("generation ended without a result"),
        }
    };
    if args.json {
        let out = JsonOut {
            prompt_ids: &ids,
            ids: &done.ids,
            text: &done.text,
            stop_reason: done.reason.as_str(),
            stop_string: match &done.reason {
                damascus_runtime::generate::StopReason::StopString(s) => Some(s),
                _ => None,
            },
            timings: &done.timings,
            seed,
            sampler: desc,
            backend: model.backend_name(),
        };
        writeln!(stdout, "{}", serde_json::to_string(&out)?)?;
    } else {
        writeln!(stdout, "{}", done.tail)?;
        stdout.flush()?;
        if !args.no_perf {
            print_perf(&done);
        }
    }
    Ok(())
}
