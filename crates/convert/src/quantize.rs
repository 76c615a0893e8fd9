//! `damascus quantize`: requantize a GGUF file the way `llama-quantize` does.
//!
//! Same per-tensor types (the [`recipe`]), same tensor order (llama.cpp's
//! by-layer order), same metadata edits (all pairs copied, `split.*` dropped,
//! `general.quantization_version` = 2 and `general.file_type` moved to the end), and every
//! converted row goes through `dequantize_row` → `quantize_row` (the reference quantizers), so
//! the tensor data is byte-identical to llama.cpp's output without an importance matrix.

use std::cell::RefCell;
use std::path::Path;

use damascus_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use damascus_quant::recipe::{self, Mix, ModelInfo, RecipeOptions, TensorDesc};

use crate::rows::{self, RowJob, convert_rows, decode_row};
use crate::{ConvertError, Progress, keys};

/// `GGML_QNT_VERSION`: the quantization format version llama.cpp writes.
pub const QUANTIZATION_VERSION: u32 = 2;

/// Flags of a quantization run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// Target file type.
    pub mix: Mix,
    /// Allow converting tensors that are already block-quantized (quality loss).
    pub allow_requantize: bool,
    /// Worker threads (≥ 1).
    pub threads: usize,
    /// Recipe switches (`--leave-output-tensor`, `--pure`).
    pub recipe: RecipeOptions,
}

/// What a quantization run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeSummary {
    /// Tensors in the file.
    pub n_tensors: usize,
    /// Tensors whose type changed.
    pub n_converted: usize,
    /// Tensors that needed the row-length fallback.
    pub n_fallback: usize,
    /// Tensor data bytes in the input.
    pub bytes_in: u64,
    /// Tensor data bytes in the output.
    pub bytes_out: u64,
    /// Total output file size.
    pub file_size: u64,
    /// `(name, type)` of every output tensor, in file order.
    pub types: Vec<(String, GgmlType)>,
}

/// The recipe's view of a model, from its metadata.
pub fn model_info(file: &GgufFile) -> Result<ModelInfo, ConvertError> {
    let md = file.metadata();
    let meta_err = |key: &str, reason: String| ConvertError::Metadata {
        key: key.to_string(),
        reason,
    };
    let arch = md
        .get_str(keys::GENERAL_ARCHITECTURE)
        .map_err(|e| meta_err(keys::GENERAL_ARCHITECTURE, e.to_string()))?
        .ok_or_else(|| meta_err(keys::GENERAL_ARCHITECTURE, "missing".into()))?
        .to_string();
    let u32_key = |suffix: &str| -> Result<Option<u32>, ConvertError> {
        let key = keys::llm(&arch, suffix);
        match md.get(&key) {
            None => Ok(None),
            // Some models store per-layer arrays; the recipe only needs the maximum.
            Some(Value::Array(a)) => Ok(a.as_u32_vec().and_then(|v| v.into_iter().max())),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    meta_err(
                        &key,
                        format!("expected u32, found {}", v.type_description()),
                    )
                }),
        }
    };
    let n_layer = u32_key(keys::BLOCK_COUNT)?
        .ok_or_else(|| meta_err(&keys::llm(&arch, keys::BLOCK_COUNT), "missing".into()))?;
    let n_head = u32_key(keys::ATTENTION_HEAD_COUNT)?.unwrap_or(0);
    let n_head_kv = u32_key(keys::ATTENTION_HEAD_COUNT_KV)?.unwrap_or(n_head);
    let n_expert = u32_key(keys::EXPERT_COUNT)?.unwrap_or(0);
    Ok(ModelInfo {
        arch,
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
    })
}

/// Per-tensor plan for `file`: one [`recipe::Choice`] per tensor of `file.tensors()`.
pub fn plan_file(
    file: &GgufFile,
    mix: Mix,
    opts: &RecipeOptions,
) -> Result<Vec<recipe::Choice>, ConvertError> {
    let info = model_info(file)?;
    let descs: Vec<TensorDesc<'_>> = file
        .tensors()
        .iter()
        .map(|t| TensorDesc {
            name: &t.name,
            dims: &t.dims,
            dtype: t.dtype,
        })
        .collect();
    Ok(recipe::plan(&info, mix, &descs, opts)?)
}

fn readable(t: GgmlType) -> bool {
    t == GgmlType::F32 || damascus_quant::can_dequantize(t)
}

fn writable(t: GgmlType) -> bool {
    t == GgmlType::F32 || damascus_quant::can_quantize(t)
}

/// Quantize `input` to `output` with `opts`. `output` is written through a temporary file in
/// its directory and renamed at the end; `input` is never written.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    opts: &QuantizeOptions,
    progress: &dyn Progress,
) -> Result<QuantizeSummary, ConvertError> {
    crate::output::ensure_distinct(input, output)?;
    let gguf_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConvertError::Gguf { path, source }
    };
    let file = GgufFile::open(input).map_err(gguf_err(input))?;
    let choices = plan_file(&file, opts.mix, &opts.recipe)?;
    let tensors = file.tensors();

    // Check everything before creating any file.
    for (t, c) in tensors.iter().zip(&choices) {
        if !c.convert {
            continue;
        }
        if recipe::is_quantized(t.dtype) && !opts.allow_requantize {
            return Err(ConvertError::RequantizeDisabled {
                tensor: t.name.clone(),
                from: t.dtype,
                to: c.dtype,
            });
        }
        if !readable(t.dtype) || !writable(c.dtype) {
            return Err(ConvertError::Unsupported {
                tensor: t.name.clone(),
                from: t.dtype,
                to: c.dtype,
            });
        }
    }

    // Metadata: copy all, then re-append the two keys llama-quantize sets (its `gguf_set_val`
    // removes and appends), and drop split information.
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        let skip = [
            keys::GENERAL_QUANTIZATION_VERSION,
            keys::GENERAL_FILE_TYPE,
            keys::SPLIT_NO,
            keys::SPLIT_COUNT,
            keys::SPLIT_TENSORS_COUNT,
        ];
        if !skip.contains(&key) {
            w.add_metadata(key, value.clone())
                .map_err(gguf_err(output))?;
        }
    }
    w.add_metadata(
        keys::GENERAL_QUANTIZATION_VERSION,
        Value::U32(QUANTIZATION_VERSION),
    )
    .map_err(gguf_err(output))?;
    w.add_metadata(keys::GENERAL_FILE_TYPE, Value::U32(opts.mix.ftype_id()))
        .map_err(gguf_err(output))?;

    // Tensors in llama.cpp's order.
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let order = recipe::llama_tensor_order(&names);
    for &i in &order {
        let t = &tensors[i];
        w.add_tensor(t.name.clone(), t.dims.clone(), choices[i].dtype)
            .map_err(gguf_err(output))?;
    }

    let total: u64 = tensors.iter().map(|t| t.n_elements()).sum();
    progress.start(total, tensors.len());
    let failure: RefCell<Option<ConvertError>> = RefCell::new(None);
    let produce = |k: usize, buf: &mut Vec<u8>| -> Result<(), damascus_gguf::GgufError> {
        let i = order[k];
        let t = &tensors[i];
        let c = choices[i];
        progress.tensor(k, &t.name, c.dtype);
        if progress.is_cancelled() {
            *failure.borrow_mut() = Some(ConvertError::Cancelled {
                output: output.to_path_buf(),
            });
            return Err(damascus_gguf::GgufError::InvalidWrite(
                rows::CANCELLED.into(),
            ));
        }
        let src = file.tensor_data(t);
        if !c.convert {
            buf.extend_from_slice(src);
            progress.advance(t.n_elements());
            return Ok(());
        }
        let r = convert_tensor(t, src, c.dtype, opts.threads, buf, progress);
        r.map_err(|e| {
            let msg = e.to_string();
            *failure.borrow_mut() = Some(cancelled_or(e, output, progress));
            damascus_gguf::GgufError::InvalidWrite(msg)
        })
    };
    let written = w.write_to_path(output, produce);
    progress.finish();
    let file_size = match written {
        Ok(n) => n,
        Err(e) => return Err(failure.into_inner().unwrap_or_else(|| gguf_err(output)(e))),
    };

    let bytes_in = tensors.iter().map(|t| t.n_bytes()).sum();
    let layout = w.layout().map_err(gguf_err(output))?;
    Ok(QuantizeSummary {
        n_tensors: tensors.len(),
        n_converted: choices.iter().filter(|c| c.convert).count(),
        n_fallback: choices.iter().filter(|c| c.fell_back).count(),
        bytes_in,
        bytes_out: layout.iter().map(|t| t.n_bytes()).sum(),
        file_size,
        types: layout.into_iter().map(|t| (t.name, t.dtype)).collect(),
    })
}

/// Convert one tensor's data `src` (stored as `t.dtype`) to `dst_type`, appending to `buf`.
fn convert_tensor(
    t: &damascus_gguf::TensorInfo,
    src: &[u8],
    dst_type: GgmlType,
    threads: usize,
    buf: &mut Vec<u8>,
    progress: &dyn Progress,
) -> Result<(), ConvertError> {
    let shape_err = |reason: String| ConvertError::Shape {
        tensor: t.name.clone(),
        reason,
    };
    let n_per_row = t.row_len() as usize;
    let n_rows = t.n_rows() as usize;
    let src_row_bytes = t
        .dtype
        .row_bytes(n_per_row as u64)
        .ok_or_else(|| shape_err(format!("row length {n_per_row} does not fit {}", t.dtype)))?
        as usize;
    let dst_row_bytes = dst_type
        .row_bytes(n_per_row as u64)
        .ok_or_else(|| shape_err(format!("row length {n_per_row} does not fit {dst_type}")))?
        as usize;
    buf.resize(n_rows * dst_row_bytes, 0); // [n_rows, dst_row_bytes] u8
    let job = RowJob {
        name: &t.name,
        n_per_row,
        n_rows,
        dst_type,
        threads,
    };
    let fill = |row: usize, out: &mut [f32]| {
        let s = src
            .get(row * src_row_bytes..(row + 1) * src_row_bytes)
            .ok_or("source row out of bounds")?;
        decode_row(t.dtype, s, out)
    };
    convert_rows(&job, buf, fill, progress)
}

/// A row error caused by cancellation becomes [`ConvertError::Cancelled`].
pub(crate) fn cancelled_or(
    e: ConvertError,
    output: &Path,
    progress: &dyn Progress,
) -> ConvertError {
    if progress.is_cancelled() {
        ConvertError::Cancelled {
            output: output.to_path_buf(),
        }
    } else {
        e
    }
}
