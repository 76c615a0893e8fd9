//! `damascus synth`: a seeded, deterministic random-weight Llama model with real shapes and the
//! real Llama 3 tokenizer, quantized on the fly tensor by tensor (no F16 intermediate).
//!
//! Weights: every matrix is N(0, 0.02²) rounded to f16 (as if converted from a 16-bit
//! checkpoint, so `synth --type Q4_K_M` equals `quantize(synth --type F16, Q4_K_M)` byte for
//! byte); RMSNorm weights are N(1, 0.02²) in f32; `rope_freqs.weight` holds the llama3 rope
//! factors computed like llama.cpp's converter. Embeddings are tied (no `output.weight`).
//! Every row has its own random stream keyed by (seed, tensor name, row), so the file does not
//! depend on the thread count.

use std::path::Path;

use damascus_gguf::keys::tensors as tn;
use damascus_gguf::{GgmlType, GgufWriter, Value};
use damascus_quant::recipe::{self, Mix, ModelInfo, RecipeOptions, TensorDesc};

use crate::rng::SplitMix64;
use crate::rows::{RowJob, convert_rows};
use crate::vocab::{LLAMA3_CHAT_TEMPLATE, LLAMA3_SPECIAL, Vocab};
use crate::{ConvertError, Progress, keys};

/// Standard deviation of the synthetic matrix weights.
pub const WEIGHT_STD: f32 = 0.02;

/// Llama 3 rope scaling (the `rope_scaling` block of a Llama 3.x `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Rope {
    /// `factor`.
    pub factor: f32,
    /// `low_freq_factor`.
    pub low_freq_factor: f32,
    /// `high_freq_factor`.
    pub high_freq_factor: f32,
    /// `original_max_position_embeddings`.
    pub original_context: f32,
}

/// Llama 3.2's rope scaling.
pub const LLAMA32_ROPE: Llama3Rope = Llama3Rope {
    factor: 32.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_context: 8192.0,
};

/// Hyper-parameters of a synthetic model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Name used on the command line.
    pub name: &'static str,
    /// Human-readable `general.name`.
    pub display_name: &'static str,
    /// Decoder layers.
    pub n_layer: u32,
    /// Hidden size.
    pub n_embd: u64,
    /// FFN inner size.
    pub n_ff: u64,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads.
    pub n_head_kv: u32,
    /// Head dimension.
    pub head_dim: u64,
    /// Vocabulary size.
    pub n_vocab: u64,
    /// Training context length.
    pub n_ctx: u32,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// llama3 rope scaling.
    pub rope: Llama3Rope,
}

/// The built-in shapes.
pub const SHAPES: [Shape; 3] = [
    Shape {
        name: "llama-3.2-3b",
        display_name: "Damascus Synthetic Llama 3.2 3B",
        n_layer: 28,
        n_embd: 3072,
        n_ff: 8192,
        n_head: 24,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 128256,
        n_ctx: 131072,
        rope_theta: 500000.0,
        rms_eps: 1e-5,
        rope: LLAMA32_ROPE,
    },
    Shape {
        name: "llama-3.2-1b",
        display_name: "Damascus Synthetic Llama 3.2 1B",
        n_layer: 16,
        n_embd: 2048,
        n_ff: 8192,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 128256,
        n_ctx: 131072,
        rope_theta: 500000.0,
        rms_eps: 1e-5,
        rope: LLAMA32_ROPE,
    },
    Shape {
        name: "tiny-llama3",
        display_name: "Damascus Synthetic Tiny Llama 3",
        n_layer: 2,
        n_embd: 512,
        n_ff: 1536,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        n_vocab: 128256,
        n_ctx: 8192,
        rope_theta: 500000.0,
        rms_eps: 1e-5,
        rope: LLAMA32_ROPE,
    },
];

impl Shape {
    /// Look a shape up by name.
    pub fn by_name(name: &str) -> Result<Shape, ConvertError> {
        SHAPES
            .iter()
            .find(|s| s.name == name)
            .copied()
            .ok_or_else(|| ConvertError::UnknownShape(name.to_string()))
    }

    /// The model's tensors in file order: name, ggml dims, kind.
    pub fn tensors(&self) -> Vec<(String, Vec<u64>, Kind)> {
        let (e, f, hd) = (self.n_embd, self.n_ff, self.head_dim);
        let q = u64::from(self.n_head) * hd;
        let kv = u64::from(self.n_head_kv) * hd;
        let mut v = vec![
            (tn::ROPE_FREQS.to_string(), vec![hd / 2], Kind::RopeFreqs),
            (
                tn::TOKEN_EMBD.to_string(),
                vec![e, self.n_vocab],
                Kind::Matrix,
            ),
        ];
        for l in 0..self.n_layer as usize {
            v.push((tn::blk(l, tn::ATTN_NORM), vec![e], Kind::Norm));
            v.push((tn::blk(l, tn::ATTN_Q), vec![e, q], Kind::Matrix));
            v.push((tn::blk(l, tn::ATTN_K), vec![e, kv], Kind::Matrix));
            v.push((tn::blk(l, tn::ATTN_V), vec![e, kv], Kind::Matrix));
            v.push((tn::blk(l, tn::ATTN_OUTPUT), vec![q, e], Kind::Matrix));
            v.push((tn::blk(l, tn::FFN_NORM), vec![e], Kind::Norm));
            v.push((tn::blk(l, tn::FFN_GATE), vec![e, f], Kind::Matrix));
            v.push((tn::blk(l, tn::FFN_UP), vec![e, f], Kind::Matrix));
            v.push((tn::blk(l, tn::FFN_DOWN), vec![f, e], Kind::Matrix));
        }
        v.push((tn::OUTPUT_NORM.to_string(), vec![e], Kind::Norm));
        v
    }

    /// Model hyper-parameters as GGUF metadata (the `llama.*` keys).
    fn arch_metadata(&self) -> Vec<(String, Value)> {
        let k = |s: &str| keys::llm("llama", s);
        let hd = self.head_dim as u32;
        vec![
            (k(keys::VOCAB_SIZE), Value::U32(self.n_vocab as u32)),
            (k(keys::CONTEXT_LENGTH), Value::U32(self.n_ctx)),
            (k(keys::EMBEDDING_LENGTH), Value::U32(self.n_embd as u32)),
            (k(keys::BLOCK_COUNT), Value::U32(self.n_layer)),
            (k(keys::FEED_FORWARD_LENGTH), Value::U32(self.n_ff as u32)),
            (k(keys::ATTENTION_HEAD_COUNT), Value::U32(self.n_head)),
            (k(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(self.n_head_kv)),
            (k(keys::ROPE_FREQ_BASE), Value::F32(self.rope_theta)),
            (
                k(keys::ATTENTION_LAYERNORM_RMS_EPS),
                Value::F32(self.rms_eps),
            ),
            (k(keys::ATTENTION_KEY_LENGTH), Value::U32(hd)),
            (k(keys::ATTENTION_VALUE_LENGTH), Value::U32(hd)),
            (k(keys::ROPE_DIMENSION_COUNT), Value::U32(hd)),
        ]
    }
}

/// How a synthetic tensor is filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// N(0, 0.02²), rounded to f16.
    Matrix,
    /// N(1, 0.02²), f32.
    Norm,
    /// llama3 rope frequency factors.
    RopeFreqs,
}

/// The llama3 `rope_freqs.weight` values (`[head_dim / 2]` f32), computed in f32 like
/// llama.cpp's `convert_hf_to_gguf.py` (`LlamaModel.generate_extra_tensors`).
pub fn llama3_rope_factors(head_dim: u64, theta: f32, rope: &Llama3Rope) -> Vec<f32> {
    let dim = head_dim as f32;
    let low_wavelen = rope.original_context / rope.low_freq_factor;
    let high_wavelen = rope.original_context / rope.high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0f32 / theta.powf((2 * i) as f32 / dim);
            let wavelen = std::f32::consts::TAU / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                rope.factor
            } else {
                let smooth = (rope.original_context / wavelen - rope.low_freq_factor)
                    / (rope.high_freq_factor - rope.low_freq_factor);
                1.0 / ((1.0 - smooth) / rope.factor + smooth)
            }
        })
        .collect()
}

/// FNV-1a of a tensor name: the per-tensor key of the random streams.
fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Fill row `row` of tensor `name` (`out` is `[dims[0]] f32`).
pub fn fill_row(seed: u64, name: &str, kind: Kind, row: usize, out: &mut [f32], rope: &[f32]) {
    match kind {
        Kind::Matrix => {
            SplitMix64::for_row(seed, name_key(name), row as u64).fill_normal(out, 0.0, WEIGHT_STD);
            for x in out.iter_mut() {
                *x = half::f16::from_f32(*x).to_f32();
            }
        }
        Kind::Norm => {
            SplitMix64::for_row(seed, name_key(name), row as u64).fill_normal(out, 1.0, WEIGHT_STD);
        }
        Kind::RopeFreqs => {
            for (o, &r) in out.iter_mut().zip(rope) {
                *o = r;
            }
        }
    }
}

/// Flags of a synth run.
#[derive(Debug, Clone)]
pub struct SynthOptions<'a> {
    /// Model shape.
    pub shape: Shape,
    /// Target file type.
    pub mix: Mix,
    /// Random seed.
    pub seed: u64,
    /// The Llama 3 `tokenizer.json`.
    pub tokenizer: &'a Path,
    /// Worker threads (≥ 1).
    pub threads: usize,
}

/// What a synth run wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthSummary {
    /// Number of tensors.
    pub n_tensors: usize,
    /// Number of parameters.
    pub n_params: u64,
    /// File size in bytes.
    pub file_size: u64,
    /// `(name, type)` of every tensor, in file order.
    pub types: Vec<(String, GgmlType)>,
}

/// Write a synthetic model to `output` (through a temporary file, renamed at the end).
pub fn synth_model(
    opts: &SynthOptions<'_>,
    output: &Path,
    progress: &dyn Progress,
) -> Result<SynthSummary, ConvertError> {
    let shape = &opts.shape;
    let gguf_err = |source| ConvertError::Gguf {
        path: output.to_path_buf(),
        source,
    };
    let vocab = Vocab::from_tokenizer_json(opts.tokenizer, shape.n_vocab as usize)?;
    let list = shape.tensors();

    // Types from the recipe, as if quantizing an f32 checkpoint.
    let info = ModelInfo {
        arch: "llama".into(),
        n_layer: shape.n_layer,
        n_head: shape.n_head,
        n_head_kv: shape.n_head_kv,
        n_expert: 0,
    };
    let descs: Vec<TensorDesc<'_>> = list
        .iter()
        .map(|(name, dims, _)| TensorDesc {
            name,
            dims,
            dtype: GgmlType::F32,
        })
        .collect();
    let choices = recipe::plan(&info, opts.mix, &descs, &RecipeOptions::default())?;

    // Metadata, in the order llama.cpp's converter writes it.
    let mut w = GgufWriter::new();
    let mut md: Vec<(String, Value)> = vec![
        (keys::GENERAL_ARCHITECTURE.into(), Value::from("llama")),
        (keys::GENERAL_TYPE.into(), Value::from("model")),
        (keys::GENERAL_NAME.into(), Value::from(shape.display_name)),
        (keys::DAMASCUS_SYNTH_SHAPE.into(), Value::from(shape.name)),
        (keys::DAMASCUS_SYNTH_SEED.into(), Value::U64(opts.seed)),
    ];
    md.extend(shape.arch_metadata());
    md.push((
        keys::GENERAL_FILE_TYPE.into(),
        Value::U32(opts.mix.ftype_id()),
    ));
    md.extend(vocab.metadata(LLAMA3_SPECIAL, LLAMA3_CHAT_TEMPLATE));
    md.push((
        keys::GENERAL_QUANTIZATION_VERSION.into(),
        Value::U32(crate::quantize::QUANTIZATION_VERSION),
    ));
    for (k, v) in md {
        w.add_metadata(k, v).map_err(gguf_err)?;
    }
    for ((name, dims, _), c) in list.iter().zip(&choices) {
        w.add_tensor(name.clone(), dims.clone(), c.dtype)
            .map_err(gguf_err)?;
    }

    let rope = llama3_rope_factors(shape.head_dim, shape.rope_theta, &shape.rope);
    let n_params: u64 = list.iter().map(|(_, d, _)| d.iter().product::<u64>()).sum();
    progress.start(n_params, list.len());
    let failure = std::cell::RefCell::new(None);
    let produce = |i: usize, buf: &mut Vec<u8>| -> Result<(), damascus_gguf::GgufError> {
        let (name, dims, kind) = &list[i];
        let dtype = choices[i].dtype;
        progress.tensor(i, name, dtype);
        let n_per_row = dims[0] as usize;
        let n_rows = dims[1..].iter().product::<u64>() as usize;
        let job = RowJob {
            name,
            n_per_row,
            n_rows,
            dst_type: dtype,
            threads: opts.threads,
        };
        let row_bytes = dtype.row_bytes(dims[0]).unwrap_or(0) as usize;
        buf.resize(n_rows * row_bytes, 0); // [n_rows, row_bytes] u8
        let fill = |row: usize, out: &mut [f32]| {
            fill_row(opts.seed, name, *kind, row, out, &rope);
            Ok(())
        };
        convert_rows(&job, buf, fill, progress).map_err(|e| {
            let msg = e.to_string();
            *failure.borrow_mut() = Some(crate::quantize::cancelled_or(e, output, progress));
            damascus_gguf::GgufError::InvalidWrite(msg)
        })
    };
    let written = w.write_to_path(output, produce);
    progress.finish();
    let file_size = match written {
        Ok(n) => n,
        Err(e) => return Err(failure.into_inner().unwrap_or_else(|| gguf_err(e))),
    };
    Ok(SynthSummary {
        n_tensors: list.len(),
        n_params,
        file_size,
        types: list
            .iter()
            .zip(&choices)
            .map(|((n, _, _), c)| (n.clone(), c.dtype))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_factors_llama32() {
        let f = llama3_rope_factors(128, 500000.0, &LLAMA32_ROPE);
        assert_eq!(f.len(), 64);
        // High frequencies unscaled, low frequencies scaled by the full factor.
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 32.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "monotone: {f:?}");
        assert!(f.iter().any(|&x| x > 1.0 && x < 32.0));
    }

    #[test]
    fn shapes_have_expected_sizes() {
        let s = Shape::by_name("llama-3.2-3b").unwrap();
        let n: u64 = s
            .tensors()
            .iter()
            .map(|(_, d, _)| d.iter().product::<u64>())
            .sum();
        // Llama 3.2 3B has 3.21 B parameters (tied embeddings) plus 64 rope factors.
        assert_eq!(n, 3_212_749_888);
        let t = Shape::by_name("tiny-llama3").unwrap();
        assert_eq!(t.tensors().len(), 2 + 2 * 9 + 1);
        assert!(Shape::by_name("gpt-5").is_err());
    }

    #[test]
    fn rows_are_deterministic_f16_values() {
        let mut a = vec![0f32; 64];
        let mut b = vec![0f32; 64];
        fill_row(7, "blk.0.attn_q.weight", Kind::Matrix, 3, &mut a, &[]);
        fill_row(7, "blk.0.attn_q.weight", Kind::Matrix, 3, &mut b, &[]);
        assert_eq!(a, b);
        assert!(a.iter().all(|&x| half::f16::from_f32(x).to_f32() == x));
        fill_row(8, "blk.0.attn_q.weight", Kind::Matrix, 3, &mut b, &[]);
        assert_ne!(a, b);
        fill_row(7, "blk.0.attn_norm.weight", Kind::Norm, 0, &mut b, &[]);
        assert!(b.iter().all(|&x| (x - 1.0).abs() < 0.15));
    }
}
