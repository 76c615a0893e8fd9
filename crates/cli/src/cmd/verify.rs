//! `damascus verify`: compare our forward pass with a Hugging Face fixture, layer by layer.
//!
//! Fixtures come from `tools/hf_fixtures.py`. One line per hidden state (embeddings, every
//! layer, the final norm) with the cosine and max abs diff, then the verdict:
//! `forward pass ✓ cosine … vs HF · top-1 exact`, or ✗ naming the first diverging layer.

use std::path::PathBuf;

use anyhow::{Context, bail};
use damascus_model::verify::{Fixture, Tolerance, verify};
use damascus_model::{LoadOptions, Model};

/// Flags of `damascus verify`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    #[command(flatten)]
    backend: super::BackendArg,
    /// Fixture JSON written by tools/hf_fixtures.py (its .bin sits beside it).
    #[arg(long)]
    fixture: PathBuf,
    /// Check the scalar f32 reference path (tolerance: cosine ≥ 0.9999 everywhere, top-5
    /// probabilities within 0.5%). Without it the fastest path runs and is held to the fast-path
    /// tolerance (logits cosine ≥ 0.999, hidden states ≥ 0.995, top-5 within 2%).
    #[arg(long)]
    reference: bool,
    /// Minimum per-layer hidden-state cosine (overrides the path's default).
    #[arg(long)]
    min_cosine: Option<f64>,
    /// Minimum logits cosine (overrides the path's default).
    #[arg(long)]
    min_logits_cosine: Option<f64>,
    /// Maximum absolute difference of HF's top-5 probabilities (overrides the path's default).
    #[arg(long)]
    max_prob_diff: Option<f64>,
}

/// Run `damascus verify`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let fixture = Fixture::load(&args.fixture)?;
    let path = args.model.resolve()?;
    let opts = LoadOptions {
        n_ctx: Some(fixture.meta.ids.len().max(1)),
        backend: args.backend.kind(args.reference, None)?,
        no_repack: args.backend.no_repack,
        kernel: super::kernel_settings()?,
        ..Default::default()
    };
    let model = Model::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
    let base = if args.reference {
        Tolerance::REFERENCE
    } else {
        Tolerance::FAST
    };
    let tol = Tolerance {
        min_cosine: args.min_cosine.unwrap_or(base.min_cosine),
        min_logits_cosine: args.min_logits_cosine.unwrap_or(base.min_logits_cosine),
        max_top5_prob_diff: args.max_prob_diff.unwrap_or(base.max_top5_prob_diff),
    };
    let report = verify(&model, &fixture)?;

    println!(
        "{} · {} tokens · {} backend · fixture {}",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        fixture.meta.ids.len(),
        model.backend_name(),
        args.fixture.display()
    );
    for s in &report.slots {
        let mark = if s.cosine >= tol.min_cosine {
            ' '
        } else {
            '✗'
        };
        println!(
            "{mark} {:<12} cosine {:.7}  max|Δ| {:.3e}",
            s.label, s.cosine, s.max_abs
        );
    }
    println!(
        "  logits       cosine {:.7}  (over HF's top {})",
        report.logits_cosine,
        fixture.meta.top_ids.len()
    );
    for (id, ours, hf) in &report.top5 {
        println!(
            "  top-5 id {id:>6}  ours {:>6.2}%  HF {:>6.2}%",
            ours * 100.0,
            hf * 100.0
        );
    }
    if report.passed(&tol) {
        println!(
            "forward pass ✓ cosine {:.6} vs HF · top-1 exact · top-5 Δp ≤ {:.3}%",
            report.min_cosine(),
            report.max_top5_diff() * 100.0
        );
        return Ok(());
    }
    let mut why = Vec::new();
    if let Some(s) = report.first_divergence(&tol) {
        why.push(format!(
            "first diverging: {} (cosine {:.6} < {})",
            s.label, s.cosine, tol.min_cosine
        ));
    }
    if report.logits_cosine < tol.min_logits_cosine {
        why.push(format!(
            "logits cosine {:.6} < {}",
            report.logits_cosine, tol.min_logits_cosine
        ));
    }
    if report.top1 != report.top1_hf {
        why.push(format!("top-1 {} vs HF {}", report.top1, report.top1_hf));
    }
    if report.max_top5_diff() > tol.max_top5_prob_diff {
        why.push(format!(
            "top-5 Δp {:.3}% > {:.3}%",
            report.max_top5_diff() * 100.0,
            tol.max_top5_prob_diff * 100.0
        ));
    }
    println!("forward pass ✗ {}", why.join(" · "));
    bail!("forward pass does not match the fixture")
}
