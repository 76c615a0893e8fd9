//! `damascus generate` and its alias `damascus run`: complete a prompt, streaming the text.
//!
//! ```text
//! $ damascus generate -p "The capital of France is" -n 16 --temp 0
//! $ damascus run "Write a haiku about rust" --temp 0.7 --seed 1
//! $ damascus generate -p "Hi" --json        # ids, text, stop reason and timings as JSON
//! $ damascus run "What is 2+2?"              # through the model's chat template
//! $ echo "Once upon a time" | damascus generate -n 32
//! ```
//!
//! `generate` completes the raw prompt; `run` (like `ollama run`) sends it as a user message
//! through the model's chat template when it has one (`--raw`: plain completion). The prompt is
//! `-p`/the argument, `-f FILE`, or standard input. Text goes to stdout as it is generated;
//! timings go to stderr at the end (llama.cpp style). Ctrl-C stops the generation (a second
//! Ctrl-C exits at once). Sampling flags take llama.cpp's spellings and `-1` meanings.

use std::io::{IsTerminal, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_runtime::generate::{Completion, Event, GenerateConfig, Generator};
use damascus_runtime::lookup::DraftConfig;
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
    /// llama.cpp's q8_0: 32 values share one f16 scale (about 1.9x the positions of f16 in
    /// the same memory; CPU and CUDA backends).
    #[value(name = "q8_0")]
    Q8_0,
}

impl CacheType {
    fn kv(self) -> KvCacheType {
        match self {
            CacheType::F32 => KvCacheType::F32,
            CacheType::F16 => KvCacheType::F16,
            CacheType::Q8_0 => KvCacheType::Q8_0,
        }
    }
}

/// The KV cache type flags, with llama.cpp's spellings (`-ctk`/`-ctv` are rewritten to the
/// long ones before parsing). Keys and values share one type here: the flags must agree.
#[derive(clap::Args, Debug, Clone, Copy, Default)]
pub struct CacheTypeArgs {
    /// KV cache element type of keys and values [default: f16 on the fast path, f32 on
    /// --reference; CUDA: f16 or q8_0]. q8_0 needs a head size that is a multiple of 32.
    #[arg(long, value_enum, value_name = "TYPE", ignore_case = true)]
    pub cache_type: Option<CacheType>,
    /// Key cache type (llama.cpp's -ctk); must equal --cache-type-v.
    #[arg(
        long = "cache-type-k",
        value_enum,
        value_name = "TYPE",
        ignore_case = true
    )]
    pub cache_type_k: Option<CacheType>,
    /// Value cache type (llama.cpp's -ctv); must equal --cache-type-k.
    #[arg(
        long = "cache-type-v",
        value_enum,
        value_name = "TYPE",
        ignore_case = true
    )]
    pub cache_type_v: Option<CacheType>,
}

impl CacheTypeArgs {
    /// The one type the flags name (`None`: the backend's default), or an error when they
    /// disagree.
    pub fn resolve(&self) -> anyhow::Result<Option<KvCacheType>> {
        let given = [
            ("--cache-type", self.cache_type),
            ("--cache-type-k (-ctk)", self.cache_type_k),
            ("--cache-type-v (-ctv)", self.cache_type_v),
        ];
        let mut it = given.iter().filter_map(|(f, t)| t.map(|t| (*f, t.kv())));
        let Some((flag, first)) = it.next() else {
            return Ok(None);
        };
        for (other, t) in it {
            if t != first {
                bail!(
                    "{flag} {first} and {other} {t} differ: keys and values share one cache type here (give the same type, e.g. -ctk q8_0 -ctv q8_0)"
                );
            }
        }
        Ok(Some(first))
    }
}

/// Model and engine flags shared by `generate`, `run` and `chat`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EngineArgs {
    #[command(flatten)]
    pub model: super::ModelArg,
    #[command(flatten)]
    pub opts: LoadArgs,
}

/// How a model is loaded (everything of [`EngineArgs`] but the model; `serve` takes several
/// models with the same flags).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LoadArgs {
    #[command(flatten)]
    pub backend: super::BackendArg,
    /// Force the scalar f32 reference path (no activation quantization).
    #[arg(long)]
    pub reference: bool,
    /// Context length (KV cache positions; `serve`: all sequences together); default
    /// min(training context, 4096). A position holds keys and values of every layer: 2 bytes
    /// per element in f16, 34 bytes per 32 in q8_0 (about 1.9x the positions per byte).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Threads of the CPU backend (default: one per physical core; 0 = all cores; clamped to
    /// the available cores).
    #[arg(short = 't', long = "threads", conflicts_with = "reference")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub cache: CacheTypeArgs,
}

impl EngineArgs {
    /// Loads the model and its tokenizer.
    pub fn load(&self) -> anyhow::Result<(Model, Tokenizer)> {
        let path = self.model.resolve()?;
        self.opts.load(&path)
    }
}

impl LoadArgs {
    /// Loads the model at `path` (a local GGUF file) and its tokenizer.
    pub fn load(&self, path: &std::path::Path) -> anyhow::Result<(Model, Tokenizer)> {
        let opts = LoadOptions {
            n_ctx: self.ctx_size.map(|c| clamp_ctx(path, c)),
            backend: self
                .backend
                .kind(self.reference, super::threads(self.threads))?,
            no_repack: self.backend.no_repack,
            kernel: super::kernel_settings()?,
            cache_type: self.cache.resolve()?,
        };
        let model =
            Model::load(path, &opts).with_context(|| format!("loading {}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
        Ok((model, tokenizer))
    }
}

/// `-c` above the model's training context: clamped to it with a warning (llama.cpp warns of a
/// "possible training context overflow"; positions past training are not meaningful here).
fn clamp_ctx(path: &std::path::Path, n_ctx: usize) -> usize {
    let train = damascus_gguf::GgufFile::open(path)
        .ok()
        .and_then(|f| damascus_model::config::LlamaConfig::from_gguf(&f).ok())
        .map(|c| c.n_ctx_train as usize);
    match train {
        Some(t) if n_ctx > t => {
            super::warn(format_args!(
                "-c {n_ctx} is above the model's training context ({t}); using {t}"
            ));
            t
        }
        _ => n_ctx,
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
    /// Temperature; 0 or less = greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k; 0 or less disables.
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i64,
    /// Top-p (nucleus); 1 (or a negative value) disables.
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
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
    /// Penalty window in tokens; 0 disables penalties, -1 = the whole context.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// Presence penalty; 0 disables.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty; 0 disables.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed; -1 (the default) = random, printed with --json.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Sampler order, `;`-separated names (default penalties;top_k;typ_p;top_p;min_p;temperature).
    #[arg(long)]
    pub samplers: Option<String>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Speculative decoding by prompt lookup: draft tokens by matching the context's last N
    /// tokens (then N-1, … down to --draft-ngram-min) earlier in the context and copying what
    /// followed; the model checks the drafts in one pass. Same output as without; greedy
    /// decoding only (--temp 0). 0 = off.
    #[arg(
        long = "draft-ngram",
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub draft_ngram: usize,
    /// Shortest n-gram --draft-ngram matches.
    #[arg(
        long = "draft-ngram-min",
        value_name = "N",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub draft_ngram_min: usize,
    /// Most tokens drafted per verify pass (1..=14; the drafts adapt below it), with
    /// --draft-ngram.
    #[arg(
        long = "draft-max",
        value_name = "K",
        default_value_t = 14,
        allow_negative_numbers = true
    )]
    pub draft_max: usize,
}

impl SamplingArgs {
    /// The validated sampler configuration for a context of `n_ctx` positions (the window of
    /// `--repeat-last-n -1`).
    pub fn sampler_config(&self, n_ctx: usize) -> anyhow::Result<SamplerConfig> {
        let repeat_last_n = match self.repeat_last_n {
            -1 => n_ctx,
            n => usize::try_from(n).map_err(|_| {
                anyhow::anyhow!("--repeat-last-n must be >= 0 or -1 (whole context), got {n}")
            })?,
        };
        let seed = match self.seed {
            None | Some(-1) => None,
            Some(s) => Some(
                u64::try_from(s)
                    .map_err(|_| anyhow::anyhow!("--seed must be >= 0 or -1 (random), got {s}"))?,
            ),
        };
        let mut cfg = SamplerConfig {
            temp: self.temp.max(0.0),
            top_k: usize::try_from(self.top_k).unwrap_or(0),
            top_p: if self.top_p < 0.0 { 1.0 } else { self.top_p },
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            ..SamplerConfig::default()
        };
        if let Some(order) = &self.samplers {
            cfg.order = SamplerKind::parse_order(order)?;
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the flags that need no model (before loading one).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.n_predict < -1 {
            bail!(
                "-n must be >= 0, or -1 to generate until the end of generation, got {}",
                self.n_predict
            );
        }
        if let Some(d) = self.draft_config() {
            d.validate()?;
        }
        self.sampler_config(1).map(|_| ())
    }

    /// The prompt-lookup drafter's settings (`None`: `--draft-ngram 0`, off).
    pub fn draft_config(&self) -> Option<DraftConfig> {
        (self.draft_ngram > 0).then_some(DraftConfig {
            ngram_max: self.draft_ngram,
            ngram_min: self.draft_ngram_min,
            max_draft: self.draft_max,
        })
    }

    /// The generation settings (without cancellation).
    pub fn generate_config(&self) -> GenerateConfig {
        GenerateConfig {
            max_tokens: usize::try_from(self.n_predict).ok(),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            draft: self.draft_config(),
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
    #[command(flatten)]
    pub grammar: GrammarArgs,
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
    /// Read the prompt from this file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
}

/// Flags of `damascus generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// The prompt text (or -f FILE, or standard input).
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
}

/// Flags of `damascus run`.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Plain completion of the prompt, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// The prompt text (or -f FILE, or standard input).
    #[arg(conflicts_with = "file")]
    pub prompt: Option<String>,
}

/// Run `damascus generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let prompt = read_prompt(&args.common, args.prompt)?;
    generate(&args.common, &prompt, false)
}

/// Run `damascus run`.
pub fn run_alias(args: RunArgs) -> anyhow::Result<()> {
    let prompt = read_prompt(&args.common, args.prompt)?;
    generate(&args.common, &prompt, !args.raw)
}

/// The prompt: the argument, else `-f FILE`, else standard input when it is not a terminal.
fn read_prompt(args: &CommonArgs, given: Option<String>) -> anyhow::Result<String> {
    if let Some(p) = given {
        return Ok(p);
    }
    if let Some(path) = &args.file {
        return std::fs::read_to_string(path)
            .with_context(|| format!("reading the prompt from {}", path.display()));
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!("give a prompt: as an argument, with -f FILE, or on standard input");
    }
    let mut s = String::new();
    stdin
        .lock()
        .read_to_string(&mut s)
        .context("reading the prompt from standard input")?;
    // A trailing newline from `echo` is not part of the prompt.
    while s.ends_with(['\n', '\r']) {
        s.pop();
    }
    Ok(s)
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
    super::err_line(format_args!("\n[stopped: {reason}]\n{}", c.timings));
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

/// The prompt's token ids: raw, or (`chat`) one user message through the model's chat
/// template with the assistant header appended, when the model has a template.
fn prompt_ids(
    args: &CommonArgs,
    tok: &Tokenizer,
    prompt: &str,
    chat: bool,
) -> anyhow::Result<(Vec<u32>, bool)> {
    let template = if chat {
        damascus_tokenizer::ChatTemplate::from_tokenizer(tok).ok()
    } else {
        None
    };
    let Some(template) = template else {
        return Ok((tok.encode(prompt, !args.no_bos, args.special), false));
    };
    let messages = serde_json::json!([{"role": "user", "content": prompt}]);
    let text = template
        .render(&messages, true, None)
        .context("rendering the chat template (--raw skips it)")?;
    let mut ids = tok.encode(&text, false, true);
    if !args.no_bos
        && tok.add_bos()
        && let Some(bos) = tok.bos()
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    Ok((ids, true))
}

fn generate(args: &CommonArgs, prompt: &str, chat: bool) -> anyhow::Result<()> {
    args.sampling.check()?;
    let grammar = args.grammar.load()?;
    let (model, tok) = args.engine.load()?;
    let scfg = args.sampling.sampler_config(model.n_ctx())?;
    let (ids, templated) = prompt_ids(args, &tok, prompt, chat)?;
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    let mut sampler = SamplerChain::from_config(&scfg)?;
    if let Some(g) = grammar {
        let vocab = std::sync::Arc::new(damascus_runtime::sampler::grammar_vocab(&tok));
        sampler.set_grammar(damascus_runtime::sampler::GrammarConstraint::new(g, vocab));
    }
    let seed = sampler.seed();
    let desc = sampler.describe();
    let mut gcfg = args.sampling.generate_config();
    gcfg.cancel = Some(ctrl_c_flag());
    let mut seq = Sequence::new(model.session()?);
    let mut generator = Generator::new(&mut seq, &tok, gcfg, sampler, &ids);
    if let Some(why) = generator.draft_off_reason() {
        super::warn(format_args!("--draft-ngram ignored: {why}"));
    }
    let mut stdout = std::io::stdout().lock();
    if !args.json && !templated {
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

/// Grammar-constrained output (llama.cpp's flags): at most one of them.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct GrammarArgs {
    /// A GBNF grammar the output must follow (e.g. 'root ::= "yes" | "no"').
    #[arg(long, value_name = "GBNF")]
    pub grammar: Option<String>,
    /// A file with a GBNF grammar.
    #[arg(long, value_name = "FILE")]
    pub grammar_file: Option<std::path::PathBuf>,
    /// A JSON schema the output must validate against (e.g. '{"type": "object"}').
    #[arg(short = 'j', long, value_name = "SCHEMA")]
    pub json_schema: Option<String>,
    /// A file with a JSON schema.
    #[arg(long, value_name = "FILE")]
    pub json_schema_file: Option<std::path::PathBuf>,
}

impl GrammarArgs {
    /// The compiled grammar, if a flag asks for one.
    pub fn load(&self) -> anyhow::Result<Option<std::sync::Arc<damascus_grammar::Grammar>>> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let given = [
            self.grammar.is_some(),
            self.grammar_file.is_some(),
            self.json_schema.is_some(),
            self.json_schema_file.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            bail!(
                "give only one of --grammar, --grammar-file, -j/--json-schema, --json-schema-file"
            );
        }
        let gbnf = if let Some(g) = &self.grammar {
            g.clone()
        } else if let Some(p) = &self.grammar_file {
            read(p)?
        } else {
            let text = match (&self.json_schema, &self.json_schema_file) {
                (Some(s), _) => s.clone(),
                (None, Some(p)) => read(p)?,
                (None, None) => return Ok(None),
            };
            let schema: serde_json::Value =
                serde_json::from_str(&text).context("--json-schema is not valid JSON")?;
            damascus_grammar::schema_to_gbnf(&schema)?
        };
        Ok(Some(std::sync::Arc::new(damascus_grammar::Grammar::parse(
            &gbnf,
        )?)))
    }
}
