//! Model hyper-parameters read from GGUF metadata (never hard-coded), and the check that
//! every tensor in the file has the shape those hyper-parameters imply.
//!
//! Raw parse first ([`ModelConfig::from_metadata`]: keys, defaults, sanity of each value),
//! then validation against the file's tensors ([`ModelConfig::check_tensors`]). After both
//! pass, every size in the config is backed by tensor data that exists in the file, so later
//! allocations sized from the config are bounded by the file size.

use damascus_gguf::keys::{self, tensors as tn};
use damascus_gguf::{FileType, GgufFile, Metadata, TensorInfo};

use crate::error::ModelError;
pub use crate::family::SUPPORTED_ARCHS;
use crate::family::{Family, FamilySpec};

/// llama.cpp's default RoPE base when `rope.freq_base` is absent.
pub const DEFAULT_ROPE_THETA: f32 = 10_000.0;

/// Kind of RoPE context scaling declared in metadata.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScalingKind {
    /// Positions divided by `factor` (`rope.scaling.type = linear`, or legacy
    /// `rope.scale_linear`).
    Linear,
    /// YaRN.
    Yarn,
    /// LongRoPE (Phi-3).
    LongRope,
    /// Llama 3 frequency-band scaling (usually carried by `rope_freqs.weight` instead).
    Llama3,
    /// Any other value, kept verbatim.
    Other(String),
}

impl RopeScalingKind {
    /// The metadata spelling.
    pub fn name(&self) -> &str {
        match self {
            RopeScalingKind::Linear => "linear",
            RopeScalingKind::Yarn => "yarn",
            RopeScalingKind::LongRope => "longrope",
            RopeScalingKind::Llama3 => "llama3",
            RopeScalingKind::Other(s) => s,
        }
    }
}

/// RoPE scaling from `{arch}.rope.scaling.*`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeScaling {
    /// The scaling method.
    pub kind: RopeScalingKind,
    /// `rope.scaling.factor` (1.0 when absent).
    pub factor: f32,
    /// `rope.scaling.original_context_length`.
    pub original_ctx: Option<u32>,
    /// `rope.scaling.attn_factor`.
    pub attn_factor: Option<f32>,
    /// `rope.scaling.finetuned`.
    pub finetuned: Option<bool>,
    /// `rope.scaling.yarn_log_multiplier`.
    pub yarn_log_multiplier: Option<f32>,
}

/// Hyper-parameters of a decoder, as stored in the file, with the [`FamilySpec`] of its
/// architecture. Sizes are element counts.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// The family `arch` names.
    pub family: Family,
    /// What that family does differently from Llama.
    pub spec: FamilySpec,
    /// `{arch}.block_count`: decoder layers.
    pub n_layer: u32,
    /// `{arch}.embedding_length`: hidden size.
    pub n_embd: u32,
    /// `{arch}.feed_forward_length`: SwiGLU inner size.
    pub n_ff: u32,
    /// `{arch}.attention.head_count`: query heads.
    pub n_head: u32,
    /// `{arch}.attention.head_count_kv`: key/value heads (default `n_head`).
    pub n_head_kv: u32,
    /// `{arch}.attention.key_length`: elements per Q/K head (default `n_embd / n_head`).
    pub head_dim: u32,
    /// `{arch}.attention.value_length`: elements per V head (default `head_dim`).
    pub head_dim_v: u32,
    /// `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`.
    pub n_vocab: u32,
    /// `{arch}.context_length`: training context.
    pub n_ctx_train: u32,
    /// `{arch}.rope.freq_base` (default 10000).
    pub rope_theta: f32,
    /// `{arch}.rope.dimension_count`: rotated elements per head (default `head_dim`).
    pub rope_dim: u32,
    /// `{arch}.rope.scaling.*`, if any scaling is declared.
    pub rope_scaling: Option<RopeScaling>,
    /// The file has `rope_freqs.weight` (llama3 per-frequency factors).
    pub has_rope_freqs: bool,
    /// `{arch}.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// No `output.weight`: the LM head reuses `token_embd.weight`.
    pub tied_embeddings: bool,
    /// `general.file_type`, when present and known.
    pub file_type: Option<FileType>,
    /// `{arch}.attention.sliding_window`: positions a sliding-window layer sees (itself
    /// included); `None` when the file declares none.
    pub sliding_window: Option<u32>,
    /// Per layer: whether it attends through `sliding_window` (all `false` without one).
    /// From `{arch}.attention.sliding_window_pattern`, else the family's pattern.
    pub swa_layers: Vec<bool>,
    /// RoPE θ of the sliding-window layers, unscaled (`{arch}.rope.freq_base_swa`, else the
    /// family's); `None`: they rotate like every other layer.
    pub rope_theta_swa: Option<f32>,
    /// Attention score scale when it is not `1/sqrt(head_dim)` (`{arch}.attention.scale`, or
    /// the family's rule).
    pub attn_scale: Option<f32>,
    /// `{arch}.final_logit_softcapping`: logits become `cap·tanh(logit/cap)`.
    pub final_logit_softcap: Option<f32>,
    /// The file stores Q, K and V as one `attn_qkv` tensor per layer (Phi-3).
    pub fused_qkv: bool,
    /// The file has Q/K/V biases (`blk.N.attn_q.bias`, ...; Qwen 2).
    pub qkv_bias: bool,
}

/// The former name of [`ModelConfig`], from when Damascus ran Llama only.
pub type LlamaConfig = ModelConfig;

/// Reads typed keys under one architecture prefix, turning absence into a named error.
struct Keys<'a> {
    md: &'a Metadata,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, suffix: &str) -> String {
        keys::llm(self.arch, suffix)
    }

    fn opt_u32(&self, suffix: &str) -> Result<Option<u32>, ModelError> {
        Ok(self.md.get_u32(&self.key(suffix))?)
    }

    fn req_u32(&self, suffix: &str) -> Result<u32, ModelError> {
        self.opt_u32(suffix)?.ok_or_else(|| ModelError::MissingKey {
            key: self.key(suffix),
            hint: String::new(),
        })
    }

    fn opt_f32(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.md.get_f32(&self.key(suffix))?)
    }

    fn positive(&self, suffix: &str, v: u32) -> Result<u32, ModelError> {
        if v == 0 {
            return Err(ModelError::BadConfig {
                key: self.key(suffix),
                message: "must be positive, found 0".into(),
            });
        }
        Ok(v)
    }

    fn positive_f32(&self, suffix: &str, v: f32) -> Result<f32, ModelError> {
        if !(v.is_finite() && v > 0.0) {
            return Err(ModelError::BadConfig {
                key: self.key(suffix),
                message: format!("must be a positive finite number, found {v}"),
            });
        }
        Ok(v)
    }
}

impl ModelConfig {
    /// Read the config from a GGUF file's metadata and tensor names.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        Self::from_metadata(file.metadata(), |name| file.tensor(name).is_some())
    }

    /// Read the config from metadata; `has_tensor` answers whether a tensor name exists
    /// (for tied embeddings and `rope_freqs.weight`).
    pub fn from_metadata(
        md: &Metadata,
        has_tensor: impl Fn(&str) -> bool,
    ) -> Result<ModelConfig, ModelError> {
        let arch =
            md.get_str(keys::GENERAL_ARCHITECTURE)?
                .ok_or_else(|| ModelError::MissingKey {
                    key: keys::GENERAL_ARCHITECTURE.into(),
                    hint: String::new(),
                })?;
        let family = Family::from_arch(arch).ok_or_else(|| ModelError::UnsupportedArch {
            arch: arch.to_string(),
        })?;
        let spec = family.spec();
        let k = Keys { md, arch };

        let n_layer = k.positive(keys::BLOCK_COUNT, k.req_u32(keys::BLOCK_COUNT)?)?;
        let n_embd = k.positive(keys::EMBEDDING_LENGTH, k.req_u32(keys::EMBEDDING_LENGTH)?)?;
        let n_ff = k.positive(
            keys::FEED_FORWARD_LENGTH,
            k.req_u32(keys::FEED_FORWARD_LENGTH)?,
        )?;
        let n_head = k.positive(
            keys::ATTENTION_HEAD_COUNT,
            k.req_u32(keys::ATTENTION_HEAD_COUNT)?,
        )?;
        let n_head_kv = k.positive(
            keys::ATTENTION_HEAD_COUNT_KV,
            k.opt_u32(keys::ATTENTION_HEAD_COUNT_KV)?.unwrap_or(n_head),
        )?;
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadConfig {
                key: format!(
                    "{} / {}",
                    k.key(keys::ATTENTION_HEAD_COUNT),
                    k.key(keys::ATTENTION_HEAD_COUNT_KV)
                ),
                message: format!("{n_head} query heads are not a multiple of {n_head_kv} kv heads"),
            });
        }
        let head_dim = match k.opt_u32(keys::ATTENTION_KEY_LENGTH)? {
            Some(d) => k.positive(keys::ATTENTION_KEY_LENGTH, d)?,
            None => {
                if n_embd % n_head != 0 {
                    return Err(ModelError::BadConfig {
                        key: k.key(keys::EMBEDDING_LENGTH),
                        message: format!(
                            "{n_embd} is not divisible by {n_head} heads and {} is absent",
                            k.key(keys::ATTENTION_KEY_LENGTH)
                        ),
                    });
                }
                n_embd / n_head
            }
        };
        let head_dim_v = k.positive(
            keys::ATTENTION_VALUE_LENGTH,
            k.opt_u32(keys::ATTENTION_VALUE_LENGTH)?.unwrap_or(head_dim),
        )?;
        let n_ctx_train = k.positive(keys::CONTEXT_LENGTH, k.req_u32(keys::CONTEXT_LENGTH)?)?;
        let rope_theta = k.positive_f32(
            keys::ROPE_FREQ_BASE,
            k.opt_f32(keys::ROPE_FREQ_BASE)?
                .unwrap_or(DEFAULT_ROPE_THETA),
        )?;
        let rope_dim = k.opt_u32(keys::ROPE_DIMENSION_COUNT)?.unwrap_or(head_dim);
        if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(ModelError::BadConfig {
                key: k.key(keys::ROPE_DIMENSION_COUNT),
                message: format!(
                    "must be even, positive and at most the head size {head_dim}, found {rope_dim}"
                ),
            });
        }
        let rms_key = keys::ATTENTION_LAYERNORM_RMS_EPS;
        let rms_eps = k.positive_f32(
            rms_key,
            k.opt_f32(rms_key)?.ok_or_else(|| ModelError::MissingKey {
                key: k.key(rms_key),
                hint: String::new(),
            })?,
        )?;

        let n_vocab = match k.opt_u32(keys::VOCAB_SIZE)? {
            Some(v) => v,
            None => match md.get_array(keys::TOKENIZER_TOKENS)? {
                Some(a) => u32::try_from(a.len()).map_err(|_| ModelError::BadConfig {
                    key: keys::TOKENIZER_TOKENS.into(),
                    message: format!("{} tokens do not fit in u32", a.len()),
                })?,
                None => {
                    return Err(ModelError::MissingKey {
                        key: k.key(keys::VOCAB_SIZE),
                        hint: format!("; no {} array either", keys::TOKENIZER_TOKENS),
                    });
                }
            },
        };
        let n_vocab = k.positive(keys::VOCAB_SIZE, n_vocab)?;

        let file_type = md
            .get_u32(keys::GENERAL_FILE_TYPE)?
            .and_then(FileType::from_id);
        let sliding_window = match k.opt_u32(keys::ATTENTION_SLIDING_WINDOW)? {
            Some(0) | None => None,
            Some(w) => Some(w),
        };
        let swa_layers = match sliding_window {
            None => vec![false; n_layer as usize],
            Some(_) => read_swa_pattern(&k, &spec, n_layer as usize)?,
        };
        let rope_theta_swa = match k.opt_f32(keys::ROPE_FREQ_BASE_SWA)? {
            Some(t) => Some(k.positive_f32(keys::ROPE_FREQ_BASE_SWA, t)?),
            None => spec.swa_rope_theta,
        };
        let attn_scale = match k.opt_f32(keys::ATTENTION_SCALE)? {
            Some(s) => Some(k.positive_f32(keys::ATTENTION_SCALE, s)?),
            // Gemma 3 27B scales by query_pre_attn_scalar = n_embd / n_head, which GGUF does not
            // carry; llama.cpp recognises it by its 62 layers, and so do we.
            None if family == Family::Gemma3 && n_layer == 62 => {
                Some(1.0 / ((n_embd / n_head) as f32).sqrt())
            }
            None => None,
        };
        if let Some(c) = k.opt_f32(keys::ATTN_LOGIT_SOFTCAPPING)?
            && c != 0.0
        {
            return Err(ModelError::BadConfig {
                key: k.key(keys::ATTN_LOGIT_SOFTCAPPING),
                message: "soft-capping of attention scores is not supported".into(),
            });
        }
        let final_logit_softcap = match k.opt_f32(keys::FINAL_LOGIT_SOFTCAPPING)? {
            Some(c) if c != 0.0 => Some(k.positive_f32(keys::FINAL_LOGIT_SOFTCAPPING, c)?),
            _ => None,
        };
        Ok(ModelConfig {
            arch: arch.to_string(),
            family,
            spec,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_vocab,
            n_ctx_train,
            rope_theta,
            rope_dim,
            rope_scaling: read_rope_scaling(&k)?,
            has_rope_freqs: has_tensor(tn::ROPE_FREQS),
            rms_eps,
            tied_embeddings: !has_tensor(tn::OUTPUT),
            file_type,
            sliding_window,
            swa_layers,
            rope_theta_swa,
            attn_scale,
            final_logit_softcap,
            fused_qkv: has_tensor(&tn::blk(0, tn::ATTN_QKV)),
            qkv_bias: has_tensor(&tn::blk_bias(0, tn::ATTN_Q)),
        })
    }

    /// The FFN's name: `SwiGLU` or `GeGLU`.
    pub fn ffn_name(&self) -> &'static str {
        match self.spec.activation {
            crate::family::Activation::Silu => "SwiGLU",
            crate::family::Activation::GeluTanh => "GeGLU (tanh)",
        }
    }

    /// What this model does beyond a plain Llama decoder, one short phrase each (for `load`).
    pub fn features(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.qkv_bias {
            f.push("Q/K/V biases".to_string());
        }
        if self.fused_qkv {
            f.push("fused attn_qkv".into());
        }
        if self.spec.fused_gate_up {
            f.push("fused gate/up".into());
        }
        if self.spec.qk_norm {
            f.push("per-head Q/K norm".into());
        }
        if self.spec.post_norms {
            f.push("post-attention/FFN norms".into());
        }
        if self.spec.embed_scale_sqrt {
            f.push("embeddings ×√n_embd".into());
        }
        if let Some(w) = self.sliding_window {
            let n = self.swa_layers.iter().filter(|&&l| l).count();
            let mut s = format!("sliding window {w} on {n}/{} layers", self.n_layer);
            if let Some(t) = self.rope_theta_swa {
                s.push_str(&format!(" (rope theta {t})"));
            }
            f.push(s);
        }
        if let Some(s) = self.attn_scale {
            f.push(format!("attention scale {s}"));
        }
        if let Some(c) = self.final_logit_softcap {
            f.push(format!("logit soft-cap {c}"));
        }
        f
    }

    /// Grouped-query attention: fewer KV heads than query heads.
    pub fn is_gqa(&self) -> bool {
        self.n_head_kv < self.n_head
    }

    /// The shape (ggml order: row length first) every tensor of this config must have, with
    /// a short reason naming the config values involved. `None` for names this config does
    /// not know.
    pub fn expected_shape(&self, name: &str) -> Option<(Vec<u64>, String)> {
        let (e, v) = (self.n_embd as u64, self.n_vocab as u64);
        let q = self.n_head as u64 * self.head_dim as u64;
        let kv = self.n_head_kv as u64 * self.head_dim as u64;
        let kv_v = self.n_head_kv as u64 * self.head_dim_v as u64;
        let o_in = self.n_head as u64 * self.head_dim_v as u64;
        let ff = self.n_ff as u64;
        let hd = self.head_dim as u64;
        let r = |dims: Vec<u64>, why: &str| Some((dims, why.to_string()));
        match name {
            tn::TOKEN_EMBD | tn::OUTPUT => r(vec![e, v], "[n_embd, n_vocab]"),
            tn::OUTPUT_NORM => r(vec![e], "[n_embd]"),
            tn::ROPE_FREQS => r(vec![self.rope_dim as u64 / 2], "[rope_dim / 2]"),
            _ => {
                let (layer, suffix, bias) = parse_block_name(name)?;
                if layer >= self.n_layer as u64 {
                    return None;
                }
                if bias {
                    return match suffix {
                        tn::ATTN_Q => r(vec![q], "[n_head * head_dim]"),
                        tn::ATTN_K => r(vec![kv], "[n_head_kv * head_dim]"),
                        tn::ATTN_V => r(vec![kv_v], "[n_head_kv * head_dim_v]"),
                        tn::ATTN_QKV => r(
                            vec![q + kv + kv_v],
                            "[(n_head + n_head_kv) * head_dim + n_head_kv * head_dim_v]",
                        ),
                        tn::ATTN_OUTPUT => r(vec![e], "[n_embd]"),
                        _ => None,
                    };
                }
                match suffix {
                    tn::ATTN_NORM | tn::FFN_NORM => r(vec![e], "[n_embd]"),
                    tn::ATTN_POST_NORM | tn::FFN_POST_NORM => r(vec![e], "[n_embd]"),
                    tn::ATTN_Q_NORM | tn::ATTN_K_NORM => r(vec![hd], "[head_dim]"),
                    tn::ATTN_QKV => r(
                        vec![e, q + kv + kv_v],
                        "[n_embd, (n_head + n_head_kv) * head_dim + n_head_kv * head_dim_v]",
                    ),
                    tn::FFN_UP if self.spec.fused_gate_up => {
                        r(vec![e, 2 * ff], "[n_embd, 2 * n_ff] (gate and up stacked)")
                    }
                    tn::ATTN_Q => r(vec![e, q], "[n_embd, n_head * head_dim]"),
                    tn::ATTN_K => r(vec![e, kv], "[n_embd, n_head_kv * head_dim]"),
                    tn::ATTN_V => r(vec![e, kv_v], "[n_embd, n_head_kv * head_dim_v]"),
                    tn::ATTN_OUTPUT => r(vec![o_in, e], "[n_head * head_dim_v, n_embd]"),
                    tn::FFN_GATE | tn::FFN_UP => r(vec![e, ff], "[n_embd, n_ff]"),
                    tn::FFN_DOWN => r(vec![ff, e], "[n_ff, n_embd]"),
                    _ => None,
                }
            }
        }
    }

    /// Names of the tensors this config requires (biases are optional everywhere).
    pub fn required_tensors(&self) -> Vec<String> {
        let mut names = vec![tn::TOKEN_EMBD.to_string(), tn::OUTPUT_NORM.to_string()];
        let attn: &[&str] = if self.fused_qkv {
            &[tn::ATTN_QKV]
        } else {
            &[tn::ATTN_Q, tn::ATTN_K, tn::ATTN_V]
        };
        let ffn: &[&str] = if self.spec.fused_gate_up {
            &[tn::FFN_UP, tn::FFN_DOWN]
        } else {
            &[tn::FFN_GATE, tn::FFN_UP, tn::FFN_DOWN]
        };
        let qk_norm: &[&str] = if self.spec.qk_norm {
            &[tn::ATTN_Q_NORM, tn::ATTN_K_NORM]
        } else {
            &[]
        };
        let post: &[&str] = if self.spec.post_norms {
            &[tn::ATTN_POST_NORM, tn::FFN_POST_NORM]
        } else {
            &[]
        };
        for l in 0..self.n_layer as usize {
            let all = [
                &[tn::ATTN_NORM][..],
                attn,
                qk_norm,
                &[tn::ATTN_OUTPUT],
                post,
            ]
            .into_iter()
            .chain([&[tn::FFN_NORM][..], ffn]);
            names.extend(all.flatten().map(|s| tn::blk(l, s)));
        }
        names
    }

    /// Whether layer `layer` attends through the sliding window, and its size.
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        match (self.sliding_window, self.swa_layers.get(layer)) {
            (Some(w), Some(true)) => Some(w as usize),
            _ => None,
        }
    }

    /// Check that every required tensor exists and that every tensor this config knows has
    /// the shape it implies. Errors name the tensor with expected and found shapes.
    pub fn check_tensors(&self, file: &GgufFile) -> Result<(), ModelError> {
        self.check_tensor_infos(file.tensors())
    }

    /// [`ModelConfig::check_tensors`] over a list of tensor infos.
    pub fn check_tensor_infos(&self, infos: &[TensorInfo]) -> Result<(), ModelError> {
        let find = |name: &str| infos.iter().find(|t| t.name == name);
        for name in self.required_tensors() {
            if find(&name).is_none() {
                return Err(ModelError::MissingTensor { name });
            }
        }
        for t in infos {
            match self.expected_shape(&t.name) {
                Some((expected, why)) => {
                    if trim_dims(&t.dims) != expected.as_slice() {
                        return Err(ModelError::TensorShape {
                            name: t.name.clone(),
                            expected,
                            found: t.dims.clone(),
                            why,
                        });
                    }
                }
                None => {
                    if let Some((layer, _, _)) = parse_block_name(&t.name)
                        && layer >= self.n_layer as u64
                    {
                        return Err(ModelError::UnexpectedTensor {
                            name: t.name.clone(),
                            why: format!("the model has {} layers (block_count)", self.n_layer),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// `blk.N.suffix.weight` -> `(N, suffix, false)`, `blk.N.suffix.bias` -> `(N, suffix, true)`.
fn parse_block_name(name: &str) -> Option<(u64, &str, bool)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    let (suffix, bias) = match rest.strip_suffix(".weight") {
        Some(s) => (s, false),
        None => (rest.strip_suffix(".bias")?, true),
    };
    Some((n.parse().ok()?, suffix, bias))
}

/// Which layers use the sliding window: `{arch}.attention.sliding_window_pattern` as a
/// period (every `n`-th layer global) or a per-layer bool array, else the family's pattern.
fn read_swa_pattern(
    k: &Keys<'_>,
    spec: &FamilySpec,
    n_layer: usize,
) -> Result<Vec<bool>, ModelError> {
    let key = k.key(keys::ATTENTION_SLIDING_WINDOW_PATTERN);
    if let Some(damascus_gguf::Value::Array(a)) = k.md.get(&key) {
        return match a.as_bools() {
            Some(f) if f.len() == n_layer => Ok(f.to_vec()),
            _ => Err(ModelError::BadConfig {
                key,
                message: format!("expected {n_layer} booleans, one per layer"),
            }),
        };
    }
    let layers = match k.opt_u32(keys::ATTENTION_SLIDING_WINDOW_PATTERN)? {
        Some(n) => crate::family::WindowLayers::AllButEvery(n),
        None => spec.window_layers,
    };
    Ok((0..n_layer).map(|l| layers.is_local(l)).collect())
}

/// Dims without trailing 1s (some writers pad 1-D tensors to `[n, 1]`), keeping at least one.
fn trim_dims(dims: &[u64]) -> &[u64] {
    let mut n = dims.len();
    while n > 1 && dims[n - 1] == 1 {
        n -= 1;
    }
    &dims[..n]
}

fn read_rope_scaling(k: &Keys<'_>) -> Result<Option<RopeScaling>, ModelError> {
    let kind = k.md.get_str(&k.key(keys::ROPE_SCALING_TYPE))?;
    let factor = k.opt_f32(keys::ROPE_SCALING_FACTOR)?;
    let legacy_linear = k.opt_f32(keys::ROPE_SCALE_LINEAR)?;
    let kind = match kind.map(str::to_ascii_lowercase).as_deref() {
        Some("none") => return Ok(None),
        Some("linear") => RopeScalingKind::Linear,
        Some("yarn") => RopeScalingKind::Yarn,
        Some("longrope") => RopeScalingKind::LongRope,
        Some("llama3") => RopeScalingKind::Llama3,
        Some(other) => RopeScalingKind::Other(other.to_string()),
        None => match legacy_linear {
            Some(f) if f != 1.0 => {
                let f = k.positive_f32(keys::ROPE_SCALE_LINEAR, f)?;
                return Ok(Some(RopeScaling {
                    kind: RopeScalingKind::Linear,
                    factor: f,
                    original_ctx: None,
                    attn_factor: None,
                    finetuned: None,
                    yarn_log_multiplier: None,
                }));
            }
            _ => return Ok(None),
        },
    };
    let factor = match factor {
        Some(f) if f != 0.0 => k.positive_f32(keys::ROPE_SCALING_FACTOR, f)?,
        _ => 1.0,
    };
    Ok(Some(RopeScaling {
        kind,
        factor,
        original_ctx: k.opt_u32(keys::ROPE_SCALING_ORIG_CTX_LEN)?,
        attn_factor: k.opt_f32(keys::ROPE_SCALING_ATTN_FACTOR)?,
        finetuned: k.md.get_bool(&k.key(keys::ROPE_SCALING_FINETUNED))?,
        yarn_log_multiplier: k.opt_f32(keys::ROPE_SCALING_YARN_LOG_MUL)?,
    }))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
