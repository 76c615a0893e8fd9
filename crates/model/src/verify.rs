//! Comparison against forward-pass fixtures dumped from Hugging Face transformers by
//! `tools/hf_fixtures.py`: per-layer hidden states and the final next-token distribution.
//!
//! A fixture is a JSON file (token ids, top-k logits of the last position, the log-sum-exp
//! over the vocabulary) plus a sibling binary of little-endian f32 hidden states laid out as
//! `[n_layer + 2 slots][positions][n_embd]`: slot 0 = embeddings, slot `i` = output of layer
//! `i - 1`, slot `n_layer + 1` = output of the final norm (see [`crate::decoder::Hidden`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::ModelError;
use crate::session::Model;

/// The JSON half of a fixture.
#[derive(Clone, Debug, Deserialize)]
pub struct FixtureMeta {
    /// Model file name the fixture was made from.
    pub model_file: String,
    /// SHA-256 of that file.
    #[serde(default)]
    pub model_sha256: Option<String>,
    /// Prompt text (informational; `ids` is what runs).
    #[serde(default)]
    pub prompt: String,
    /// Token ids of the prompt.
    pub ids: Vec<u32>,
    /// Decoder layers.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Positions whose hidden states are stored, in storage order.
    pub positions: Vec<usize>,
    /// File name of the hidden-state binary, relative to the JSON file.
    pub hidden_bin: String,
    /// `log Σ exp(logit)` over the whole vocabulary at the last position.
    pub logits_lse: f64,
    /// Ids of the top-k logits at the last position, best first.
    pub top_ids: Vec<u32>,
    /// The matching logits.
    pub top_logits: Vec<f64>,
}

/// A loaded fixture.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// Metadata and logits.
    pub meta: FixtureMeta,
    /// `[n_layer + 2][positions][n_embd]` f32 hidden states.
    pub hidden: Vec<f32>,
    /// Where it was loaded from.
    pub path: PathBuf,
}

impl Fixture {
    /// Reads `path` (the JSON file) and its hidden-state binary.
    pub fn load(path: impl AsRef<Path>) -> Result<Fixture, ModelError> {
        let path = path.as_ref().to_path_buf();
        let err = |what: String| ModelError::Fixture {
            path: path.clone(),
            what,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
        let meta: FixtureMeta = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        let bin = path.with_file_name(&meta.hidden_bin);
        let bytes = std::fs::read(&bin).map_err(|e| err(format!("{}: {e}", bin.display())))?;
        let expected = (meta.n_layer + 2) * meta.positions.len() * meta.n_embd * 4;
        if bytes.len() != expected {
            return Err(err(format!(
                "{} has {} bytes, expected {expected}",
                bin.display(),
                bytes.len()
            )));
        }
        if meta.ids.is_empty() || meta.positions.iter().any(|&p| p >= meta.ids.len()) {
            return Err(err("no ids, or a stored position beyond them".into()));
        }
        if meta.top_ids.iter().any(|&id| id as usize >= meta.n_vocab) {
            return Err(err("a top id is outside the vocabulary".into()));
        }
        if meta.top_ids.len() != meta.top_logits.len() || meta.top_ids.len() < 5 {
            return Err(err("top_ids / top_logits missing or mismatched".into()));
        }
        let hidden = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Fixture { meta, hidden, path })
    }

    /// Hidden state of `slot` at the `k`-th stored position: `[n_embd]` f32.
    pub fn hidden(&self, slot: usize, k: usize) -> &[f32] {
        let n = self.meta.n_embd;
        let at = (slot * self.meta.positions.len() + k) * n;
        &self.hidden[at..at + n]
    }
}

/// Pass/fail thresholds.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// Minimum cosine similarity of every hidden state with HF's.
    pub min_cosine: f64,
    /// Minimum cosine of the last position's logits (over HF's top-k ids) with HF's.
    pub min_logits_cosine: f64,
    /// Maximum absolute difference of any of HF's top-5 probabilities.
    pub max_top5_prob_diff: f64,
}

impl Tolerance {
    /// The reference path's bar: cosine ≥ 0.9999 everywhere, top-5 probabilities within 0.5%.
    pub const REFERENCE: Tolerance = Tolerance {
        min_cosine: 0.9999,
        min_logits_cosine: 0.9999,
        max_top5_prob_diff: 0.005,
    };

    /// The fast paths' bar (quantized activations, f16 KV cache): logits cosine ≥ 0.999 and the
    /// same top-1; hidden states ≥ 0.995, top-5 probabilities within 2%.
    pub const FAST: Tolerance = Tolerance {
        min_cosine: 0.995,
        min_logits_cosine: 0.999,
        max_top5_prob_diff: 0.02,
    };
}

/// Agreement of one hidden-state slot.
#[derive(Clone, Debug)]
pub struct SlotDiff {
    /// Slot index (see the module docs).
    pub slot: usize,
    /// Human-readable name: `embd`, `layer 0`, …, `output_norm`.
    pub label: String,
    /// Smallest cosine over the stored positions.
    pub cosine: f64,
    /// Largest absolute difference over the stored positions.
    pub max_abs: f64,
}

/// The outcome of [`verify`].
#[derive(Clone, Debug)]
pub struct Report {
    /// One entry per hidden-state slot.
    pub slots: Vec<SlotDiff>,
    /// Cosine of our logits with HF's over HF's top-k ids.
    pub logits_cosine: f64,
    /// Our most likely next token.
    pub top1: u32,
    /// HF's most likely next token.
    pub top1_hf: u32,
    /// HF's top-5: `(id, our probability, HF probability)`.
    pub top5: Vec<(u32, f64, f64)>,
}

impl Report {
    /// Largest probability difference over HF's top 5.
    pub fn max_top5_diff(&self) -> f64 {
        self.top5
            .iter()
            .map(|&(_, a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    }

    /// Smallest hidden-state cosine.
    pub fn min_cosine(&self) -> f64 {
        self.slots
            .iter()
            .map(|s| s.cosine)
            .fold(f64::INFINITY, f64::min)
    }

    /// The first slot below the cosine bar, if any.
    pub fn first_divergence(&self, tol: &Tolerance) -> Option<&SlotDiff> {
        // NaN cosines count as diverged.
        self.slots
            .iter()
            .find(|s| s.cosine.is_nan() || s.cosine < tol.min_cosine)
    }

    /// Whether everything is within `tol` and the top-1 token matches.
    pub fn passed(&self, tol: &Tolerance) -> bool {
        self.first_divergence(tol).is_none()
            && self.logits_cosine >= tol.min_logits_cosine
            && self.top1 == self.top1_hf
            && self.max_top5_diff() <= tol.max_top5_prob_diff
    }
}

/// Cosine similarity and maximum absolute difference of two equally long vectors (f64).
pub fn compare(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut dot, mut na, mut nb, mut max_abs) = (0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        na += x * x;
        nb += y * y;
        max_abs = f64::max(max_abs, (x - y).abs());
    }
    let cosine = if na == 0.0 && nb == 0.0 {
        1.0
    } else {
        dot / (na.sqrt() * nb.sqrt())
    };
    (cosine, max_abs)
}

/// Runs the fixture's prompt through `model` in one prefill and compares every stored hidden
/// state and the last position's next-token distribution.
pub fn verify(model: &Model, fixture: &Fixture) -> Result<Report, ModelError> {
    let meta = &fixture.meta;
    let p = model.params();
    let mismatch = |what: String| ModelError::Fixture {
        path: fixture.path.clone(),
        what,
    };
    if (meta.n_layer, meta.n_embd, meta.n_vocab) != (p.n_layer, p.n_embd, p.n_vocab) {
        return Err(mismatch(format!(
            "made for n_layer {} n_embd {} n_vocab {}, model has {} {} {}",
            meta.n_layer, meta.n_embd, meta.n_vocab, p.n_layer, p.n_embd, p.n_vocab
        )));
    }
    let n_slots = meta.n_layer + 2;
    let mut ours: Vec<Vec<f32>> = vec![Vec::new(); n_slots]; // per slot: [positions][n_embd]
    let mut session = model.session()?;
    let logits = session.eval_with_hook(&meta.ids, &mut |h| {
        let n = h.data.len() / h.n_tokens.max(1);
        if let Some(buf) = ours.get_mut(h.slot) {
            for &pos in &meta.positions {
                buf.extend_from_slice(&h.data[pos * n..(pos + 1) * n]);
            }
        }
    })?;

    let mut slots = Vec::with_capacity(n_slots);
    for (slot, buf) in ours.iter().enumerate() {
        let (mut cosine, mut max_abs) = (f64::INFINITY, 0f64);
        for k in 0..meta.positions.len() {
            let mine = buf
                .get(k * meta.n_embd..(k + 1) * meta.n_embd)
                .unwrap_or(&[]);
            if mine.len() != meta.n_embd {
                return Err(mismatch(format!(
                    "no hidden state captured for slot {slot}"
                )));
            }
            let (c, m) = compare(mine, fixture.hidden(slot, k));
            cosine = cosine.min(c);
            max_abs = max_abs.max(m);
        }
        let label = match slot {
            0 => "embd".to_string(),
            s if s == n_slots - 1 => "output_norm".to_string(),
            s => format!("layer {}", s - 1),
        };
        slots.push(SlotDiff {
            slot,
            label,
            cosine,
            max_abs,
        });
    }

    // Next-token distribution: ours from the full logits, HF's from top-k and the lse.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = f64::from(max)
        + logits
            .iter()
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum::<f64>()
            .ln();
    let prob = |id: u32| (f64::from(logits[id as usize]) - lse).exp();
    let top1 = logits
        .iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |best, (i, &l)| {
            if l > best.1 { (i, l) } else { best }
        })
        .0 as u32;
    let top5 = meta
        .top_ids
        .iter()
        .zip(&meta.top_logits)
        .take(5)
        .map(|(&id, &l)| (id, prob(id), (l - meta.logits_lse).exp()))
        .collect();
    let ours_top: Vec<f32> = meta.top_ids.iter().map(|&id| logits[id as usize]).collect();
    let hf_top: Vec<f32> = meta.top_logits.iter().map(|&l| l as f32).collect();
    let (logits_cosine, _) = compare(&ours_top, &hf_top);
    Ok(Report {
        slots,
        logits_cosine,
        top1,
        top1_hf: meta.top_ids[0],
        top5,
    })
}

/// Agreement of two models (typically the same file on a new backend and on the reference):
/// per hidden-state slot, the smallest cosine and largest absolute difference over every
/// position, and the same for the last position's logits.
#[derive(Clone, Debug)]
pub struct BackendDiff {
    /// One entry per hidden-state slot.
    pub slots: Vec<SlotDiff>,
    /// Cosine of the two `[n_vocab]` logit vectors.
    pub logits_cosine: f64,
    /// Largest absolute logit difference.
    pub logits_max_abs: f64,
    /// Whether both pick the same most likely token.
    pub same_top1: bool,
}

/// Runs `ids` through `a` and `b` (fresh sessions) and compares every hidden state and the
/// final logits: how each faster backend is checked against the reference.
pub fn compare_models(a: &Model, b: &Model, ids: &[u32]) -> Result<BackendDiff, ModelError> {
    let capture = |m: &Model| -> Result<(Vec<Vec<f32>>, Vec<f32>), ModelError> {
        let mut slots: Vec<Vec<f32>> = Vec::new();
        let logits = m.session()?.eval_with_hook(ids, &mut |h| {
            if slots.len() <= h.slot {
                slots.resize(h.slot + 1, Vec::new());
            }
            slots[h.slot] = h.data.to_vec();
        })?;
        Ok((slots, logits))
    };
    let (sa, la) = capture(a)?;
    let (sb, lb) = capture(b)?;
    if sa.len() != sb.len() || la.len() != lb.len() {
        return Err(ModelError::Tensor {
            what: format!(
                "models differ in shape: {} vs {} hidden slots, {} vs {} logits",
                sa.len(),
                sb.len(),
                la.len(),
                lb.len()
            ),
        });
    }
    let n_slots = sa.len();
    let slots = sa
        .iter()
        .zip(&sb)
        .enumerate()
        .map(|(slot, (x, y))| {
            let n = x.len() / ids.len().max(1);
            // Smallest per-position cosine, so one bad row cannot hide in the average.
            let (mut cosine, mut max_abs) = (f64::INFINITY, 0f64);
            for (rx, ry) in x.chunks(n.max(1)).zip(y.chunks(n.max(1))) {
                let (c, m) = compare(rx, ry);
                cosine = cosine.min(c);
                max_abs = max_abs.max(m);
            }
            let label = match slot {
                0 => "embd".to_string(),
                s if s == n_slots - 1 => "output_norm".to_string(),
                s => format!("layer {}", s - 1),
            };
            SlotDiff {
                slot,
                label,
                cosine,
                max_abs,
            }
        })
        .collect();
    let (logits_cosine, logits_max_abs) = compare(&la, &lb);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
            )
            .0
    };
    Ok(BackendDiff {
        slots,
        logits_cosine,
        logits_max_abs,
        same_top1: argmax(&la) == argmax(&lb),
    })
}
