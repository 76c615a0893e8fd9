//! The decoder's hyper-parameters in the form the forward pass uses them, derived from
//! [`crate::config::ModelConfig`] (which mirrors the GGUF metadata).

use damascus_kernels::reference::{
    RopeLayout, RopeScalingLlama3, llama3_freq_factors, rope_inv_freq,
};

use crate::backend::RopeParams;
use crate::config::{ModelConfig, RopeScalingKind};
use crate::error::ModelError;
use crate::family::FamilySpec;

/// Hyper-parameters of a decoder, all sizes in elements.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderParams {
    /// What the family does differently from Llama.
    pub spec: FamilySpec,
    /// Decoder layers.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// FFN inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the LM head).
    pub n_vocab: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base frequency θ.
    pub rope_theta: f32,
    /// Rotated dimensions per head (`n_rot ≤ head_dim`).
    pub rope_dim: usize,
    /// Rotary pair layout.
    pub rope_layout: RopeLayout,
    /// llama3 frequency scaling from metadata, used when the file has no `rope_freqs.weight`.
    pub rope_llama3: Option<RopeScalingLlama3>,
    /// Linear position scaling: positions are divided by this factor (1 = none).
    pub rope_linear: f32,
    /// RoPE θ of sliding-window layers, unscaled; `None`: they rotate like the others.
    pub rope_theta_swa: Option<f32>,
    /// Per layer: the sliding window (positions seen, itself included), `None` = global.
    pub windows: Vec<Option<usize>>,
    /// Attention score scale when not `1/sqrt(head_dim)`.
    pub attn_scale: Option<f32>,
    /// Token embeddings are multiplied by this (Gemma: `√n_embd`).
    pub embed_scale: Option<f32>,
    /// Logits become `cap·tanh(logit/cap)`.
    pub final_logit_softcap: Option<f32>,
    /// Q/K/V live in one `attn_qkv` tensor per layer.
    pub fused_qkv: bool,
}

impl DecoderParams {
    /// Checks internal consistency (the config loader checks against the tensors).
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |what: String| Err(ModelError::Tensor { what });
        if self.n_head == 0 || self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "n_head {} is not a positive multiple of n_head_kv {}",
                self.n_head, self.n_head_kv
            ));
        }
        if !self.rope_dim.is_multiple_of(2) || self.rope_dim > self.head_dim {
            return bad(format!(
                "rope_dim {} must be even and ≤ head_dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if self.n_layer == 0 || self.n_embd == 0 || self.n_ff == 0 || self.n_vocab == 0 {
            return bad(format!("degenerate sizes: {self:?}"));
        }
        if self.windows.len() != self.n_layer || self.windows.contains(&Some(0)) {
            return bad(format!(
                "{} sliding windows for {} layers (none may be 0)",
                self.windows.len(),
                self.n_layer
            ));
        }
        Ok(())
    }

    /// RoPE parameters of the sliding-window layers when they differ from the others:
    /// θ = `rope_theta_swa`, no scaling (as llama.cpp and Hugging Face do for Gemma 3's local
    /// layers).
    pub fn rope_params_swa(&self) -> Option<RopeParams> {
        self.rope_theta_swa.map(|theta| RopeParams {
            layout: self.rope_layout,
            head_dim: self.head_dim,
            inv_freq: rope_inv_freq(self.rope_dim, theta, None),
        })
    }

    /// RoPE parameters: `freq_factors` (`[rope_dim / 2]` from `rope_freqs.weight`) take
    /// precedence over llama3 metadata, as in llama.cpp.
    pub fn rope_params(&self, freq_factors: Option<&[f32]>) -> Result<RopeParams, ModelError> {
        let half = self.rope_dim / 2;
        let mut factors = match (freq_factors, &self.rope_llama3) {
            (Some(ff), _) => {
                if ff.len() != half {
                    return Err(ModelError::Tensor {
                        what: format!(
                            "rope_freqs.weight has {} entries, expected {half}",
                            ff.len()
                        ),
                    });
                }
                ff.to_vec()
            }
            (None, Some(s)) => llama3_freq_factors(self.rope_dim, self.rope_theta, s),
            (None, None) => vec![1.0; half],
        };
        // Dividing positions by the linear factor is dividing every frequency by it.
        for f in &mut factors {
            *f *= self.rope_linear;
        }
        Ok(RopeParams {
            layout: self.rope_layout,
            head_dim: self.head_dim,
            inv_freq: rope_inv_freq(self.rope_dim, self.rope_theta, Some(&factors)),
        })
    }
}

/// Derives the decoder's parameters from a validated [`ModelConfig`].
pub fn from_config(config: &ModelConfig) -> Result<DecoderParams, ModelError> {
    let rope_llama3 = match &config.rope_scaling {
        None => None,
        Some(s) => match s.kind {
            // ggml reads the factors from `rope_freqs.weight`; without it, use the Llama 3
            // band defaults around the declared original context.
            RopeScalingKind::Llama3 => Some(RopeScalingLlama3 {
                factor: s.factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_ctx: s.original_ctx.unwrap_or(8192) as f32,
            }),
            RopeScalingKind::Linear => None,
            _ => {
                return Err(ModelError::BadConfig {
                    key: "rope.scaling.type".into(),
                    message: format!("RoPE scaling {:?} is not supported", s.kind.name()),
                });
            }
        },
    };
    Ok(DecoderParams {
        spec: config.spec,
        n_layer: config.n_layer as usize,
        n_embd: config.n_embd as usize,
        n_ff: config.n_ff as usize,
        n_head: config.n_head as usize,
        n_head_kv: config.n_head_kv as usize,
        head_dim: config.head_dim as usize,
        n_vocab: config.n_vocab as usize,
        rms_eps: config.rms_eps,
        rope_theta: config.rope_theta,
        rope_dim: config.rope_dim as usize,
        rope_layout: config.spec.rope_layout,
        rope_llama3,
        rope_linear: match &config.rope_scaling {
            Some(s) if s.kind == RopeScalingKind::Linear => s.factor,
            _ => 1.0,
        },
        rope_theta_swa: config.rope_theta_swa,
        windows: (0..config.n_layer as usize)
            .map(|l| config.window_of(l))
            .collect(),
        attn_scale: config.attn_scale,
        embed_scale: config
            .spec
            .embed_scale_sqrt
            .then(|| (config.n_embd as f32).sqrt()),
        final_logit_softcap: config.final_logit_softcap,
        fused_qkv: config.fused_qkv,
    })
}
