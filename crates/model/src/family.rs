//! What differs between the decoder families Damascus runs, in one place.
//!
//! Every supported family is the same pre-norm decoder (`embed → ×L (norm → attention →
//! residual → norm → gated FFN → residual) → norm → LM head`); a [`FamilySpec`] names only the
//! differences, and [`crate::decoder`] reads it. Adding a family means one entry in
//! [`Family::spec`] (plus its tensor names in `damascus_gguf::keys::tensors`, if new), not a
//! change to any backend.
//!
//! | family (`general.architecture`) | RoPE | FFN | extras |
//! | --- | --- | --- | --- |
//! | `llama` (Llama, Mistral, SmolLM) | adjacent pairs | SwiGLU | optional Q/K/V biases, sliding window if declared |
//! | `qwen2` | NEOX halves | SwiGLU | Q/K/V biases |
//! | `qwen3` | NEOX halves | SwiGLU | per-head Q/K RMSNorm |
//! | `phi3` | NEOX halves | SwiGLU | fused `attn_qkv`, `ffn_up` holding gate and up |
//! | `gemma3` | NEOX halves | GeGLU (tanh GELU) | embeddings × √n_embd, per-head Q/K RMSNorm, post-attention and post-FFN norms, 5 local (window, θ = 10k) : 1 global layers, optional final-logit soft-cap, two-level q8 activations on CUDA |
//!
//! GGUF files written by llama.cpp's converter already fold Gemma's `1 + weight` into every
//! norm weight, so every norm here is a plain RMSNorm.

use damascus_kernels::reference::RopeLayout;
use damascus_kernels::settings::KernelSettings;

/// A decoder family Damascus runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama`: Llama 2/3, Mistral, SmolLM and other files that declare this architecture.
    Llama,
    /// `qwen2`: Qwen 2 and 2.5.
    Qwen2,
    /// `qwen3`: Qwen 3 (dense).
    Qwen3,
    /// `phi3`: Phi-3 and Phi-3.5 (mini).
    Phi3,
    /// `gemma3`: Gemma 3 (text).
    Gemma3,
}

/// The `general.architecture` values Damascus runs, in the order error messages list them.
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "phi3", "gemma3"];

/// The gated activation of the FFN: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Which layers attend through a sliding window, when the file declares one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowLayers {
    /// Every layer (Mistral, Phi-3, Qwen 2 with `use_sliding_window`).
    All,
    /// Every layer except each `n`-th (`layer % n == n - 1` is global): Gemma 3's 5 local :
    /// 1 global, unless the file carries its own pattern.
    AllButEvery(u32),
}

/// What a family's decoder does differently from plain Llama.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FamilySpec {
    /// Rotary pair layout of Q and K as the GGUF converter stores them.
    pub rope_layout: RopeLayout,
    /// The FFN's gated activation.
    pub activation: Activation,
    /// Per-head RMSNorm of Q and K (`attn_q_norm`, `attn_k_norm`, `[head_dim]`) before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Token embeddings are multiplied by `√n_embd`.
    pub embed_scale_sqrt: bool,
    /// Which layers use the declared sliding window.
    pub window_layers: WindowLayers,
    /// RoPE θ of sliding-window layers when the file does not say (`rope.freq_base_swa`);
    /// `None`: the same θ as every other layer.
    pub swa_rope_theta: Option<f32>,
    /// `ffn_up` holds `[gate; up]` stacked (`2·n_ff` rows) and there is no `ffn_gate`.
    pub fused_gate_up: bool,
    /// Activations with outliers that one q8 level rounds too coarsely: on CUDA every
    /// quantized decode GEMV takes two-level q8 activations, not only Q/K/V
    /// ([`FamilySpec::kernel_settings`]). Gemma 3: one level put the real 270M 0.038 from HF's
    /// next-token probabilities ("東京は日本の"), two levels 0.0005 (BENCHMARKS.md, H100).
    pub two_level_all: bool,
}

impl Family {
    /// The family of a `general.architecture` value, `None` when unsupported.
    pub fn from_arch(arch: &str) -> Option<Family> {
        Some(match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "phi3" => Family::Phi3,
            "gemma3" => Family::Gemma3,
            _ => return None,
        })
    }

    /// Its `general.architecture` spelling.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Phi3 => "phi3",
            Family::Gemma3 => "gemma3",
        }
    }

    /// What this family does differently from plain Llama.
    pub fn spec(self) -> FamilySpec {
        let llama = FamilySpec {
            rope_layout: RopeLayout::Normal,
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            embed_scale_sqrt: false,
            window_layers: WindowLayers::All,
            swa_rope_theta: None,
            fused_gate_up: false,
            two_level_all: false,
        };
        let neox = FamilySpec {
            rope_layout: RopeLayout::Neox,
            ..llama
        };
        match self {
            Family::Llama => llama,
            Family::Qwen2 => neox,
            Family::Qwen3 => FamilySpec {
                qk_norm: true,
                ..neox
            },
            Family::Phi3 => FamilySpec {
                fused_gate_up: true,
                ..neox
            },
            Family::Gemma3 => FamilySpec {
                activation: Activation::GeluTanh,
                qk_norm: true,
                post_norms: true,
                embed_scale_sqrt: true,
                window_layers: WindowLayers::AllButEvery(6),
                swa_rope_theta: Some(10_000.0),
                two_level_all: true,
                ..neox
            },
        }
    }
}

impl FamilySpec {
    /// The kernel settings this family runs under, given the user's: a family that needs
    /// two-level activations everywhere gets them unless two levels were turned off
    /// (`DAMASCUS_TWO_LEVEL=0`).
    pub fn kernel_settings(&self, user: &KernelSettings) -> KernelSettings {
        let mut s = user.clone();
        s.two_level_all |= self.two_level_all && user.two_level_qkv;
        s
    }
}

impl WindowLayers {
    /// Whether layer `layer` uses the sliding window.
    pub fn is_local(self, layer: usize) -> bool {
        match self {
            WindowLayers::All => true,
            WindowLayers::AllButEvery(0) => true,
            WindowLayers::AllButEvery(n) => layer % n as usize != n as usize - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemma3_takes_two_level_activations_unless_turned_off() {
        let user = KernelSettings::default();
        assert!(Family::Gemma3.spec().kernel_settings(&user).two_level_all);
        assert!(!Family::Llama.spec().kernel_settings(&user).two_level_all);
        let off = KernelSettings {
            two_level_qkv: false,
            ..user
        };
        assert!(!Family::Gemma3.spec().kernel_settings(&off).two_level_all);
    }

    #[test]
    fn every_supported_arch_has_a_family() {
        for &a in SUPPORTED_ARCHS {
            assert_eq!(Family::from_arch(a).map(Family::arch), Some(a));
        }
        assert_eq!(Family::from_arch("mamba"), None);
    }

    #[test]
    fn gemma3_pattern_is_five_local_one_global() {
        let w = Family::Gemma3.spec().window_layers;
        let local: Vec<bool> = (0..12).map(|l| w.is_local(l)).collect();
        let mut want = vec![true; 12];
        want[5] = false;
        want[11] = false;
        assert_eq!(local, want);
        assert!(WindowLayers::All.is_local(7));
    }
}
