//! Sentence embeddings from a decoder: the final-norm hidden states of a prompt, pooled into
//! one vector and L2-normalised (`damascus embed`, `POST /v1/embeddings`).
//!
//! The pooling comes from the file's `{arch}.pooling_type` when it declares one (llama.cpp's
//! numbering: 1 mean, 2 first token, 3 last token), else mean pooling — the usual choice for a
//! decoder that was not trained as an embedder.

use damascus_gguf::Metadata;
use damascus_gguf::keys;

use crate::error::ModelError;
use crate::session::Model;

/// How the hidden states of a prompt become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over every token.
    Mean,
    /// The first token's state (BERT's `[CLS]`).
    First,
    /// The last token's state (decoder embedders such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// The pooling `{arch}.pooling_type` declares (`None` when absent, 0 = none, or unknown).
    pub fn from_metadata(md: &Metadata, arch: &str) -> Option<Pooling> {
        match md
            .get_u32(&keys::llm(arch, "pooling_type"))
            .ok()
            .flatten()?
        {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::First),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// Parses `mean`, `cls`/`first` or `last`.
    pub fn parse(s: &str) -> Option<Pooling> {
        match s.to_ascii_lowercase().as_str() {
            "mean" => Some(Pooling::Mean),
            "cls" | "first" => Some(Pooling::First),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The model's pooling: its metadata's, else mean.
    pub fn for_model(model: &Model) -> Pooling {
        Pooling::from_metadata(model.gguf().metadata(), &model.config().arch)
            .unwrap_or(Pooling::Mean)
    }
}

/// Pools `hidden` (`[n_tokens, width]` f32) into `[width]`.
///
/// # Panics
/// If `hidden` is not a whole, non-empty number of rows of `width`.
pub fn pool(hidden: &[f32], width: usize, pooling: Pooling) -> Vec<f32> {
    assert!(
        width > 0 && !hidden.is_empty() && hidden.len().is_multiple_of(width),
        "pool: {} values are not rows of {width}",
        hidden.len()
    );
    let n = hidden.len() / width;
    match pooling {
        Pooling::First => hidden[..width].to_vec(),
        Pooling::Last => hidden[(n - 1) * width..].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; width];
            for row in hidden.chunks_exact(width) {
                for (s, &v) in sum.iter_mut().zip(row) {
                    *s += f64::from(v);
                }
            }
            sum.into_iter().map(|s| (s / n as f64) as f32).collect()
        }
    }
}

/// Scales `v` to unit L2 norm (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// The embedding of `ids`: one forward pass in a fresh sequence, the final-norm states pooled
/// with `pooling`, L2-normalised when `normalize`. `[n_embd]` f32.
pub fn embed(
    model: &Model,
    ids: &[u32],
    pooling: Pooling,
    normalize: bool,
) -> Result<Vec<f32>, ModelError> {
    if ids.is_empty() {
        return Err(ModelError::EmptyInput);
    }
    let final_slot = model.params().n_layer + 1;
    let width = model.params().n_embd;
    let mut states: Option<Vec<f32>> = None;
    let mut hook = |h: &crate::decoder::Hidden<'_>| {
        if h.slot == final_slot {
            states = Some(h.data.to_vec());
        }
    };
    let mut session = model.session_with_n_ctx(ids.len())?;
    session.eval_with_hook(ids, &mut hook)?;
    let states = states.ok_or_else(|| ModelError::Tensor {
        what: "embed: the forward pass produced no final hidden state".into(),
    })?;
    let mut v = pool(&states, width, pooling);
    if v.iter().any(|x| !x.is_finite()) {
        return Err(ModelError::Tensor {
            what: "embed: the hidden states hold NaN or infinite values".into(),
        });
    }
    if normalize {
        l2_normalize(&mut v);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_rows_and_normalizes() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3 tokens × 2
        assert_eq!(pool(&h, 2, Pooling::First), vec![1.0, 2.0]);
        assert_eq!(pool(&h, 2, Pooling::Last), vec![5.0, 6.0]);
        assert_eq!(pool(&h, 2, Pooling::Mean), vec![3.0, 4.0]);
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0; 3];
        l2_normalize(&mut z);
        assert_eq!(z, vec![0.0; 3]);
        assert_eq!(Pooling::parse("CLS"), Some(Pooling::First));
        assert_eq!(Pooling::parse("max"), None);
    }
}
