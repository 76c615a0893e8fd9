//! `damascus embed`: sentence embeddings — the final hidden states of each text, pooled (the
//! model's `pooling_type`, else mean) and L2-normalised.
//!
//! ```text
//! $ damascus embed "a cat" "a kitten" --json
//! {"model": "...", "pooling": "mean", "dim": 576, "data": [{"index": 0, "tokens": 3, "embedding": [...]}, ...]}
//! ```

use std::io::Write;

use anyhow::{Context, bail};
use damascus_model::embed::{Pooling, embed};
use damascus_model::{LoadOptions, Model};
use damascus_tokenizer::Tokenizer;

/// Flags of `damascus embed`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    #[command(flatten)]
    backend: super::BackendArg,
    /// Pooling of the token states: mean, cls (first token) or last (default: the model's
    /// `pooling_type`, else mean).
    #[arg(long, value_name = "mean|cls|last")]
    pooling: Option<String>,
    /// Keep the pooled vector as it is (by default it is scaled to unit L2 norm).
    #[arg(long)]
    no_normalize: bool,
    /// Print one JSON document instead of one line of numbers per text.
    #[arg(long)]
    json: bool,
    /// Force the scalar f32 reference path.
    #[arg(long)]
    reference: bool,
    /// The texts to embed (one embedding each).
    #[arg(required = true, value_name = "TEXT")]
    texts: Vec<String>,
}

/// Run `damascus embed`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let pooling = match args.pooling.as_deref() {
        None => None,
        Some(p) => Some(
            Pooling::parse(p)
                .with_context(|| format!("--pooling {p:?}: expected mean, cls or last"))?,
        ),
    };
    let path = args.model.resolve()?;
    let opts = LoadOptions {
        backend: args.backend.kind(args.reference, None)?,
        no_repack: args.backend.no_repack,
        kernel: super::kernel_settings()?,
        ..Default::default()
    };
    let model = Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?;
    let pooling = pooling.unwrap_or_else(|| Pooling::for_model(&model));
    let mut data = Vec::new();
    for (index, text) in args.texts.iter().enumerate() {
        let ids = tok.encode(text, true, false);
        if ids.is_empty() {
            bail!("text {index} tokenizes to nothing");
        }
        if ids.len() > model.n_ctx() {
            bail!(
                "text {index} has {} tokens, more than the context of {}",
                ids.len(),
                model.n_ctx()
            );
        }
        let v = embed(&model, &ids, pooling, !args.no_normalize)
            .with_context(|| format!("embedding text {index}"))?;
        data.push((index, ids.len(), v));
    }
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let doc = serde_json::json!({
            "model": path.display().to_string(),
            "pooling": format!("{pooling:?}").to_lowercase(),
            "normalized": !args.no_normalize,
            "dim": model.params().n_embd,
            "data": data.iter().map(|(index, tokens, v)| serde_json::json!({
                "index": index, "tokens": tokens, "embedding": v,
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{doc}")
    } else {
        data.iter().try_for_each(|(_, _, v)| {
            let line: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
            writeln!(out, "{}", line.join(" "))
        })
    };
    match written {
        // A closed pipe (`| head`) ends the output quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
