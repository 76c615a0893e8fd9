//! Causal grouped-query attention over a KV cache.

use super::matmul::dot;
use super::ops::softmax;

/// Head geometry of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads; `n_head` must be a multiple (GQA group size `n_head / n_head_kv`).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// Causal attention for `n_tokens` new queries against the cached keys and values.
///
/// * `q`: `[n_tokens, n_head, head_dim]` f32, already rotated; token `t` sits at `pos0 + t`
/// * `k`, `v`: `[n_kv, n_head_kv, head_dim]` f32 cache, `n_kv ≥ pos0 + n_tokens`, rows
///   `0..pos0 + n_tokens` valid (the new tokens' keys/values already written)
/// * `out`: `[n_tokens, n_head, head_dim]` f32 (overwritten)
///
/// Query head `h` reads key/value head `h / (n_head / n_head_kv)`, and token `t` attends to
/// positions `0..=pos0 + t` with scale `1 / sqrt(head_dim)`.
pub fn attention(q: &[f32], k: &[f32], v: &[f32], shape: AttnShape, pos0: usize, out: &mut [f32]) {
    attention_window(q, k, v, shape, pos0, None, out);
}

/// [`attention`] with an optional sliding window: with `Some(w)`, token `t` attends to
/// positions `max(0, pos0 + t + 1 - w)..=pos0 + t` only (the `w` most recent, itself
/// included, as Hugging Face's `sliding_window`).
pub fn attention_window(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    pos0: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    let AttnShape {
        n_head,
        n_head_kv,
        head_dim,
    } = shape;
    assert!(
        n_head_kv > 0 && n_head % n_head_kv == 0,
        "attention: n_head % n_head_kv != 0"
    );
    let q_width = n_head * head_dim;
    let kv_width = n_head_kv * head_dim;
    assert!(
        q.len().is_multiple_of(q_width),
        "attention: q is not [n_tokens, {n_head}, {head_dim}]"
    );
    let n_tokens = q.len() / q_width;
    assert_eq!(out.len(), q.len(), "attention: out and q differ in shape");
    assert_eq!(
        k.len(),
        v.len(),
        "attention: k and v caches differ in shape"
    );
    assert!(
        k.len() >= (pos0 + n_tokens) * kv_width,
        "attention: cache shorter than pos0 + n_tokens"
    );
    let group = n_head / n_head_kv;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scores = Vec::with_capacity(pos0 + n_tokens); // [n_visible] f32
    for t in 0..n_tokens {
        let n_visible = pos0 + t + 1;
        let first = window.map_or(0, |w| n_visible.saturating_sub(w));
        for h in 0..n_head {
            let kvh = h / group;
            let qh = &q[t * q_width + h * head_dim..][..head_dim];
            scores.clear();
            for p in first..n_visible {
                let kp = &k[p * kv_width + kvh * head_dim..][..head_dim];
                scores.push(dot(qh, kp) * scale);
            }
            softmax(&mut scores);
            let oh = &mut out[t * q_width + h * head_dim..][..head_dim];
            oh.fill(0.0);
            for (p, &s) in (first..).zip(&scores) {
                let vp = &v[p * kv_width + kvh * head_dim..][..head_dim];
                for (o, &vv) in oh.iter_mut().zip(vp) {
                    *o += s * vv;
                }
            }
        }
    }
}
