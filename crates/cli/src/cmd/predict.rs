//! `damascus predict`: the next-token distribution after a prompt.
//!
//! ```text
//! $ damascus predict "The capital of France is"
//!  77.26%  " Paris"
//!   6.45%  " a"
//! ```

use anyhow::{Context, bail};
use damascus_model::{LoadOptions, Model};
use damascus_tokenizer::Tokenizer;

/// Flags of `damascus predict`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    #[command(flatten)]
    backend: super::BackendArg,
    /// How many candidates to print.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print `{"ids": [...], "top": [{"id", "p", "piece"}]}` instead of a table.
    #[arg(long)]
    json: bool,
    /// Force the scalar f32 reference path (no activation quantization).
    #[arg(long)]
    reference: bool,
    /// Context length (KV cache positions); default min(training context, 4096).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Token ids to evaluate instead of tokenizing PROMPT (comma-separated).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt")]
    ids: Option<Vec<u32>>,
    /// Do not prepend BOS even if the model's metadata asks for it.
    #[arg(long)]
    no_bos: bool,
    /// The prompt text.
    prompt: Option<String>,
}

/// One candidate of the distribution.
#[derive(serde::Serialize)]
struct Candidate {
    id: u32,
    p: f64,
    piece: String,
}

/// Softmax of `logits` in f64 (probabilities sum to 1 exactly enough to print).
fn probabilities(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Run `damascus predict`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = args.model.resolve()?;
    let opts = LoadOptions {
        n_ctx: args.ctx_size,
        backend: args.backend.kind(args.reference, None)?,
        no_repack: args.backend.no_repack,
        kernel: super::kernel_settings()?,
        ..Default::default()
    };
    let model = Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
    let ids = match (&args.ids, &args.prompt) {
        (Some(ids), _) => ids.clone(),
        (None, Some(prompt)) => tokenizer.encode(prompt, !args.no_bos, false),
        (None, None) => bail!("give a PROMPT or --ids"),
    };
    if ids.is_empty() {
        bail!("the prompt tokenizes to nothing");
    }
    let mut session = model.session()?;
    let logits = session.eval(&ids)?;
    let probs = probabilities(&logits);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let top: Vec<Candidate> = order
        .iter()
        .take(args.top)
        .map(|&i| Candidate {
            id: i as u32,
            p: probs[i],
            piece: tokenizer.token_piece(i as u32).unwrap_or_default(),
        })
        .collect();
    if args.json {
        let out = serde_json::json!({ "ids": ids, "top": top });
        println!("{out}");
    } else {
        for c in &top {
            println!("{:>6.2}%  {:?}", c.p * 100.0, c.piece);
        }
    }
    Ok(())
}
