//! Per-tensor type selection for a target file type: a port of llama.cpp's quantization
//! "mixture" recipe (`src/llama-quant.cpp`: `tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`, `llama_ftype_get_default_type`).
//!
//! Everything here is a pure function of tensor names, shapes and a few hyper-parameters, so the
//! same plan can drive `damascus quantize` (requantizing a file) and `damascus synth`
//! (quantizing freshly generated weights).
//!
//! The rules that matter for the supported file types (Q4_0 … Q8_0, Q2_K … Q6_K mixes):
//! - Only tensors with ≥ 2 non-trivial dimensions whose name ends in `weight` are quantized;
//!   `*_norm.weight`, 1-D tensors (`rope_freqs.weight`, biases) keep their type.
//! - `output.weight` (and `token_embd.weight` when the model has no `output.weight`, i.e. tied
//!   embeddings) becomes Q6_K, unless the mix's base type is Q8_0 or the row length is not a
//!   multiple of the base type's block size (then Q8_0).
//! - `attn_v` / `ffn_down` get more bits on the `use_more_bits` layer pattern (first and last
//!   eighth of the layers, every third layer in between) for Q4_K_M / Q5_K_M.
//! - A row length not divisible by the chosen type's block size falls back
//!   Q4_K→Q5_0, Q5_K→Q5_1, Q6_K→Q8_0, Q2_K/Q3_K→Q4_0, and to F16 when even that doesn't fit.
//!
//! Counters (`i_attention_wv`, `i_ffn_down`) advance in llama.cpp's tensor order: by layer
//! number (non-layer tensors first), then by name. [`llama_tensor_order`] gives that order and
//! [`plan`] applies it, so results match `llama-quantize` regardless of the input file order.

use damascus_gguf::GgmlType;

/// Errors from planning a quantization.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecipeError {
    /// The requested file type (llama.cpp `LLAMA_FTYPE_*` id) has no recipe here.
    #[error("file type {name} (id {id}) is not supported by the quantization recipe")]
    UnsupportedFileType {
        /// llama.cpp ftype id.
        id: u32,
        /// Its name, e.g. "IQ2_XXS".
        name: &'static str,
    },
    /// A layer tensor name whose `blk.N.` prefix does not parse or is out of range.
    #[error("tensor {name}: bad layer index (model has {n_layer} layers)")]
    BadLayer {
        /// Tensor name.
        name: String,
        /// Number of layers in the model.
        n_layer: u32,
    },
}

/// A target file type the recipe understands (llama.cpp `LLAMA_FTYPE_MOSTLY_*`).
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mix {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
}

/// (mix, llama.cpp ftype id, name) for every supported mix.
const MIXES: &[(Mix, u32, &str)] = &[
    (Mix::F32, 0, "F32"),
    (Mix::F16, 1, "F16"),
    (Mix::Q4_0, 2, "Q4_0"),
    (Mix::Q4_1, 3, "Q4_1"),
    (Mix::Q8_0, 7, "Q8_0"),
    (Mix::Q5_0, 8, "Q5_0"),
    (Mix::Q5_1, 9, "Q5_1"),
    (Mix::Q2_K, 10, "Q2_K"),
    (Mix::Q3_K_S, 11, "Q3_K_S"),
    (Mix::Q3_K_M, 12, "Q3_K_M"),
    (Mix::Q3_K_L, 13, "Q3_K_L"),
    (Mix::Q4_K_S, 14, "Q4_K_S"),
    (Mix::Q4_K_M, 15, "Q4_K_M"),
    (Mix::Q5_K_S, 16, "Q5_K_S"),
    (Mix::Q5_K_M, 17, "Q5_K_M"),
    (Mix::Q6_K, 18, "Q6_K"),
    (Mix::Q2_K_S, 21, "Q2_K_S"),
    (Mix::BF16, 32, "BF16"),
];

/// Names of llama.cpp ftype ids we recognise but cannot produce (for error messages).
const UNSUPPORTED: &[(u32, &str)] = &[
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
];

impl Mix {
    /// From a llama.cpp ftype id (`general.file_type`).
    pub fn from_ftype_id(id: u32) -> Result<Mix, RecipeError> {
        if let Some(&(m, _, _)) = MIXES.iter().find(|(_, i, _)| *i == id) {
            return Ok(m);
        }
        let name = UNSUPPORTED
            .iter()
            .find(|(i, _)| *i == id)
            .map_or("unknown", |(_, n)| n);
        Err(RecipeError::UnsupportedFileType { id, name })
    }

    /// From a name such as "Q4_K_M" (case-insensitive; "MOSTLY_" prefix allowed).
    pub fn from_name(name: &str) -> Option<Mix> {
        let upper = name.to_ascii_uppercase();
        let bare = upper.strip_prefix("MOSTLY_").unwrap_or(&upper);
        let bare = if bare == "ALL_F32" { "F32" } else { bare };
        MIXES
            .iter()
            .find(|(_, _, n)| *n == bare)
            .map(|&(m, _, _)| m)
    }

    /// The llama.cpp ftype id, written to `general.file_type`.
    pub fn ftype_id(self) -> u32 {
        MIXES
            .iter()
            .find(|(m, _, _)| *m == self)
            .map_or(0, |&(_, i, _)| i)
    }

    /// Name as llama-quantize spells it ("Q4_K_M").
    pub fn name(self) -> &'static str {
        MIXES
            .iter()
            .find(|(m, _, _)| *m == self)
            .map_or("?", |&(_, _, n)| n)
    }

    /// All supported mixes, in ftype-id order.
    pub fn all() -> impl Iterator<Item = Mix> {
        MIXES.iter().map(|&(m, _, _)| m)
    }

    /// The base tensor type of the mix (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            Mix::F32 => GgmlType::F32,
            Mix::F16 => GgmlType::F16,
            Mix::BF16 => GgmlType::BF16,
            Mix::Q4_0 => GgmlType::Q4_0,
            Mix::Q4_1 => GgmlType::Q4_1,
            Mix::Q5_0 => GgmlType::Q5_0,
            Mix::Q5_1 => GgmlType::Q5_1,
            Mix::Q8_0 => GgmlType::Q8_0,
            Mix::Q2_K | Mix::Q2_K_S => GgmlType::Q2_K,
            Mix::Q3_K_S | Mix::Q3_K_M | Mix::Q3_K_L => GgmlType::Q3_K,
            Mix::Q4_K_S | Mix::Q4_K_M => GgmlType::Q4_K,
            Mix::Q5_K_S | Mix::Q5_K_M => GgmlType::Q5_K,
            Mix::Q6_K => GgmlType::Q6_K,
        }
    }
}

/// Broad tensor role used by the recipe (llama.cpp `tensor_category`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    TokenEmbd,
    Output,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

impl Category {
    /// Classify a tensor by name (substring rules, checked in llama.cpp's order).
    pub fn of(name: &str) -> Category {
        if name == "output.weight" {
            return Category::Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return Category::TokenEmbd;
        }
        const RULES: &[(&str, Category)] = &[
            ("attn_qkv.weight", Category::AttnQkv),
            ("attn_kv_b.weight", Category::AttnKvB),
            ("attn_v.weight", Category::AttnV),
            ("attn_k.weight", Category::AttnK),
            ("attn_q.weight", Category::AttnQ),
            ("attn_output.weight", Category::AttnOutput),
            ("ffn_up", Category::FfnUp),
            ("ffn_gate", Category::FfnGate),
            ("ffn_down", Category::FfnDown),
        ];
        RULES
            .iter()
            .find(|(pat, _)| name.contains(pat))
            .map_or(Category::Other, |&(_, c)| c)
    }

    /// attn_v-like tensors (more sensitive to quantization).
    fn is_attn_v(self) -> bool {
        matches!(
            self,
            Category::AttnV | Category::AttnQkv | Category::AttnKvB
        )
    }
}

/// Model hyper-parameters the recipe looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// `general.architecture` ("llama"); "falcon" changes a few rules.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// `{arch}.attention.head_count`.
    pub n_head: u32,
    /// `{arch}.attention.head_count_kv`.
    pub n_head_kv: u32,
    /// `{arch}.expert_count` (0 for dense models).
    pub n_expert: u32,
}

impl ModelInfo {
    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }

    /// llama.cpp's `LLM_TYPE_70B` for Llama: 80 layers with grouped-query attention.
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }
}

/// What the recipe needs to know about one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorDesc<'a> {
    /// Tensor name ("blk.3.attn_v.weight").
    pub name: &'a str,
    /// Dimensions in ggml order (`dims[0]` = row length).
    pub dims: &'a [u64],
    /// Current storage type.
    pub dtype: GgmlType,
}

/// Options that change the plan (llama-quantize flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecipeOptions {
    /// `--leave-output-tensor`: keep `output.weight` as it is.
    pub leave_output_tensor: bool,
    /// `--pure`: no k-quant mixture, every quantizable tensor gets the base type.
    pub pure: bool,
}

/// ggml's `ggml_n_dims`: trailing dimensions of size 1 do not count; at least 1.
pub fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Whether a tensor may be quantized at all (`tensor_allows_quantization`, the subset of
/// name rules that can apply to decoder-only text models plus the common exclusions).
pub fn allows_quantization(name: &str, dims: &[u64], opts: &RecipeOptions) -> bool {
    if n_dims(dims) < 2 || !name.ends_with("weight") {
        return false;
    }
    if opts.leave_output_tensor && name == "output.weight" {
        return false;
    }
    const NEVER: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    if NEVER.iter().any(|pat| name.contains(pat)) {
        return false;
    }
    // BERT positional / token-type embeddings.
    name != "position_embd.weight" && name != "token_types.weight"
}

/// Whether a ggml type is a block-quantized type (ggml's `is_quantized` trait).
pub fn is_quantized(t: GgmlType) -> bool {
    !matches!(
        t,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64
    )
}

/// llama.cpp's `use_more_bits` layer pattern: first and last eighth, and every third layer.
pub fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    // C integer division truncates toward zero and `%` keeps the dividend's sign; Rust's `/`
    // and `%` on i64 do the same.
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// Shape fallback (`tensor_type_fallback`): returns the type to use for rows of `ncols`
/// elements, and whether a fallback happened.
pub fn fallback_type(ncols: u64, target: GgmlType) -> (GgmlType, bool) {
    let bs = target.block_size() as u64;
    if ncols.is_multiple_of(bs) {
        return (target, false);
    }
    let next = match target {
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        // Already a small-block type (or one without a defined fallback): F16 below.
        other => other,
    };
    let nbs = next.block_size() as u64;
    if !ncols.is_multiple_of(nbs) {
        (GgmlType::F16, true)
    } else {
        (next, true)
    }
}

/// Parse the `N` of a `blk.N.` prefix.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find('.')?;
    rest[..end].parse().ok()
}

/// llama.cpp's processing order (its `weight_name_comparer`): by layer number, with non-layer
/// tensors (layer -1) first, then by name. Returns indices into `names`.
pub fn llama_tensor_order(names: &[&str]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..names.len()).collect();
    idx.sort_by(|&a, &b| {
        let la = layer_of(names[a]).unwrap_or(-1);
        let lb = layer_of(names[b]).unwrap_or(-1);
        la.cmp(&lb).then_with(|| names[a].cmp(names[b]))
    });
    idx
}

/// The result for one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Target storage type.
    pub dtype: GgmlType,
    /// The tensor is converted (target differs from its current type).
    pub convert: bool,
    /// The shape fallback kicked in.
    pub fell_back: bool,
}

/// Mutable counters of the recipe (llama.cpp `quantize_state_impl`).
struct State<'m> {
    model: &'m ModelInfo,
    mix: Mix,
    n_attention_wv: i64,
    n_ffn_down: i64,
    n_ffn_gate: i64,
    n_ffn_up: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
}

impl State<'_> {
    /// Layer index for per-layer rules: the running counter for dense models, the name's
    /// `blk.N.` for mixtures of experts.
    fn layer_info(&self, counter: i64, n: i64, name: &str) -> Result<(i64, i64), RecipeError> {
        if self.model.n_expert > 1 {
            match layer_of(name) {
                Some(l) if (0..n).contains(&l) => Ok((l, n)),
                _ => Err(RecipeError::BadLayer {
                    name: name.to_string(),
                    n_layer: self.model.n_layer,
                }),
            }
        } else {
            Ok((counter, n))
        }
    }

    /// `llama_tensor_get_type_impl` for the non-IQ mixes.
    fn mixture_type(
        &mut self,
        mut t: GgmlType,
        name: &str,
        ncols: u64,
        cat: Category,
    ) -> Result<GgmlType, RecipeError> {
        use GgmlType as G;
        use Mix as M;
        let mix = self.mix;
        let model = self.model;
        let falcon = model.is_falcon();
        let n_expert = model.n_expert;

        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            let bs = t.block_size() as u64;
            if falcon || !ncols.is_multiple_of(bs) {
                t = G::Q8_0;
            } else if t != G::Q8_0 {
                t = G::Q6_K;
            }
        } else if cat == Category::TokenEmbd {
            // Untied token embeddings keep the base type for the supported mixes.
        } else if cat.is_attn_v() {
            let n_gqa = model.n_gqa();
            let i = self.i_attention_wv;
            match mix {
                M::Q2_K => t = if n_gqa >= 4 { G::Q4_K } else { G::Q3_K },
                M::Q2_K_S if n_gqa >= 4 => t = G::Q4_K,
                M::Q3_K_M => t = if i < 2 { G::Q5_K } else { G::Q4_K },
                M::Q3_K_L => t = G::Q5_K,
                M::Q4_K_M | M::Q5_K_M if use_more_bits(i, self.n_attention_wv) => t = G::Q6_K,
                M::Q4_K_S if i < 4 => t = G::Q5_K,
                _ => {}
            }
            if model.is_70b() && (t == G::Q3_K || t == G::Q4_K) {
                t = G::Q5_K;
            }
            if n_expert == 8 {
                t = G::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if n_expert == 8 {
                t = G::Q8_0;
            }
        } else if cat == Category::AttnQ {
            // Only IQ mixes change attn_q.
        } else if cat == Category::FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, self.n_ffn_down, name)?;
            match mix {
                M::Q2_K => t = G::Q3_K,
                M::Q2_K_S if i < n / 8 => t = G::Q4_K,
                M::Q3_K_M => {
                    t = if i < n / 16 {
                        G::Q5_K
                    } else if !falcon || use_more_bits(i, n) {
                        G::Q4_K
                    } else {
                        G::Q3_K
                    };
                }
                M::Q3_K_L => t = if falcon { G::Q4_K } else { G::Q5_K },
                M::Q4_K_M => {
                    if falcon {
                        t = if i < n / 16 {
                            G::Q6_K
                        } else if use_more_bits(i, n) {
                            G::Q5_K
                        } else {
                            G::Q4_K
                        };
                    } else if use_more_bits(i, n) {
                        t = G::Q6_K;
                    }
                }
                M::Q5_K_M if use_more_bits(i, n) => t = G::Q6_K,
                M::Q4_K_S if !falcon && i < n / 8 => t = G::Q5_K,
                // (Q4_0/Q5_0 bump to Q4_1/Q5_1 only with an importance matrix.)
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !falcon {
                if n_expert == 8 {
                    if matches!(mix, M::Q2_K | M::Q3_K_S | M::Q3_K_M | M::Q4_K_S | M::Q4_K_M) {
                        t = G::Q5_K;
                    }
                } else {
                    match mix {
                        M::Q2_K => t = G::Q3_K,
                        M::Q3_K_M => t = G::Q4_K,
                        M::Q3_K_L => t = G::Q5_K,
                        _ => {}
                    }
                }
            } else if mix == M::Q3_K_L {
                t = G::Q4_K;
            }
        } else if cat == Category::AttnQkv {
            match mix {
                M::Q3_K_M | M::Q3_K_L => t = G::Q4_K,
                M::Q4_K_M => t = G::Q5_K,
                M::Q5_K_M => t = G::Q6_K,
                _ => {}
            }
        } else if cat == Category::FfnGate {
            self.layer_info(self.i_ffn_gate, self.n_ffn_gate, name)?;
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.layer_info(self.i_ffn_up, self.n_ffn_up, name)?;
            self.i_ffn_up += 1;
        }
        Ok(t)
    }
}

/// Choose the storage type of every tensor for `mix`. Returns one [`Choice`] per input tensor,
/// in input order (internally the tensors are visited in [`llama_tensor_order`]).
pub fn plan(
    model: &ModelInfo,
    mix: Mix,
    tensors: &[TensorDesc<'_>],
    opts: &RecipeOptions,
) -> Result<Vec<Choice>, RecipeError> {
    let cats: Vec<Category> = tensors.iter().map(|t| Category::of(t.name)).collect();
    let n_layer = i64::from(model.n_layer);
    let mut st = State {
        model,
        mix,
        n_attention_wv: cats.iter().filter(|c| c.is_attn_v()).count() as i64,
        n_ffn_down: n_layer,
        n_ffn_gate: n_layer,
        n_ffn_up: n_layer,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        has_tied_embeddings: !cats.contains(&Category::Output),
    };
    let base = mix.default_type();
    let names: Vec<&str> = tensors.iter().map(|t| t.name).collect();
    let mut out: Vec<Option<Choice>> = vec![None; tensors.len()];
    for i in llama_tensor_order(&names) {
        let t = &tensors[i];
        let mut dtype = t.dtype;
        let mut fell_back = false;
        if allows_quantization(t.name, t.dims, opts) {
            dtype = base;
            if is_quantized(base) {
                let ncols = t.dims.first().copied().unwrap_or(0);
                if !opts.pure {
                    dtype = st.mixture_type(dtype, t.name, ncols, cats[i])?;
                }
                (dtype, fell_back) = fallback_type(ncols, dtype);
            }
        }
        out[i] = Some(Choice {
            dtype,
            convert: dtype != t.dtype,
            fell_back,
        });
    }
    Ok(out
        .into_iter()
        .map(|c| {
            c.unwrap_or(Choice {
                dtype: GgmlType::F32,
                convert: false,
                fell_back: false,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests;
