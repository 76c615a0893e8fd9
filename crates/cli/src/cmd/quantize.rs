//! `damascus quantize IN.gguf OUT.gguf TYPE`: requantize a GGUF model like `llama-quantize`
//! (same per-tensor types, byte-identical data for the reference quantizers).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;
use damascus_convert::{QuantizeOptions, quantize_file};
use damascus_gguf::GgmlType;
use damascus_quant::recipe::{Mix, RecipeOptions};
use indicatif::{ProgressBar, ProgressStyle};

/// Flags of `damascus quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input GGUF model (never modified).
    pub input: PathBuf,
    /// Output GGUF path (written through a temporary file, renamed at the end).
    pub output: PathBuf,
    /// Target file type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S/M/L, Q4_K_S, Q4_K_M,
    /// Q5_K_S, Q5_K_M, Q6_K, F16, BF16, F32.
    #[arg(value_name = "TYPE")]
    pub file_type: String,
    /// Allow requantizing tensors that are already quantized (quality loss).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Keep output.weight in its current type.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Quantize every tensor to the base type (no k-quant mixture).
    #[arg(long)]
    pub pure: bool,
    /// Worker threads (default and 0: all cores; clamped to the available cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// Parse a file type name, listing the valid ones on error.
pub fn parse_mix(name: &str) -> anyhow::Result<Mix> {
    Mix::from_name(name).with_context(|| {
        let names: Vec<&str> = Mix::all().map(Mix::name).collect();
        format!("unknown file type {name:?} (one of: {})", names.join(", "))
    })
}

/// Run `damascus quantize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mix = parse_mix(&args.file_type)?;
    let threads = super::threads(args.threads)
        .unwrap_or_else(damascus_convert::default_threads)
        .max(1);
    let opts = QuantizeOptions {
        mix,
        allow_requantize: args.allow_requantize,
        threads,
        recipe: RecipeOptions {
            leave_output_tensor: args.leave_output_tensor,
            pure: args.pure,
        },
    };
    let t0 = Instant::now();
    let bar = Bar::new(args.quiet);
    let s = quantize_file(&args.input, &args.output, &opts, &bar).with_context(|| {
        format!(
            "quantizing {} -> {}",
            args.input.display(),
            args.output.display()
        )
    })?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    errln!(
        "quantized {} tensors ({} converted, {} row-length fallbacks) to {}: {:.1} MiB -> {:.1} MiB, file {:.1} MiB, {:.1} s on {} threads",
        s.n_tensors,
        s.n_converted,
        s.n_fallback,
        mix.name(),
        mib(s.bytes_in),
        mib(s.bytes_out),
        mib(s.file_size),
        t0.elapsed().as_secs_f64(),
        threads
    );
    outln!("{}", args.output.display())?;
    Ok(())
}

/// Progress over all tensor elements, with the current tensor in the message. Ctrl-C, SIGTERM
/// and SIGHUP set the cancel flag (the run stops and removes its temporary file); a second
/// signal exits at once.
pub struct Bar {
    bar: ProgressBar,
    cancelled: Arc<AtomicBool>,
}

impl Bar {
    /// A hidden bar when `quiet` (or stderr is not a terminal, which indicatif detects).
    pub fn new(quiet: bool) -> Self {
        let bar = if quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(0)
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {percent:>3}% {human_pos}/{human_len} weights, eta {eta} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&cancelled);
        // Fails only if a handler is already installed; then Ctrl-C keeps its default action.
        let _ = ctrlc::set_handler(move || {
            if flag.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
        Bar { bar, cancelled }
    }
}

impl damascus_convert::Progress for Bar {
    fn start(&self, total_elements: u64, _n_tensors: usize) {
        self.bar.set_length(total_elements);
    }

    fn tensor(&self, _index: usize, name: &str, dtype: GgmlType) {
        self.bar.set_message(format!("{name} -> {dtype}"));
    }

    fn advance(&self, n: u64) {
        self.bar.inc(n);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}
