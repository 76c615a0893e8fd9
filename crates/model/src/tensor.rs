//! Tensors: shape, dtype and strides over borrowed (memory-mapped) or owned (host) bytes.
//!
//! A [`Tensor`] is a *view*: slicing rows, narrowing a dimension or reshaping never copies.
//! [`Storage::Mapped`] borrows the bytes of a [`GgufFile`] for `'a`, so the borrow checker
//! guarantees no view outlives the mapping. [`Storage::Host`] shares an `Arc`'d buffer and can
//! be `'static`. Device memory is not a storage variant: a backend keeps its own resident copies
//! (see [`crate::backend::Backend::prepare_matrix`]) and hands out opaque handles instead.
//!
//! Shapes are written outermost first (`[n_vocab, n_embd]`): the *reverse* of GGUF's `dims`
//! order. The innermost dimension is always contiguous and, for block-quantized types, a
//! multiple of the block size; outer dimensions may have any byte stride.

use std::ops::Range;
use std::sync::Arc;

use damascus_gguf::{GgmlType, GgufFile, TensorInfo};
use damascus_kernels::reference::WeightView;

use crate::error::ModelError;

/// The bytes behind a tensor.
#[derive(Clone, Debug)]
pub enum Storage<'a> {
    /// Borrowed from a memory-mapped GGUF file (zero copy).
    Mapped(&'a [u8]),
    /// Owned host memory, shared between views.
    Host(Arc<[u8]>),
}

impl Storage<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(b) => b,
            Storage::Host(b) => b,
        }
    }
}

/// A strided view of typed elements.
#[derive(Clone, Debug)]
pub struct Tensor<'a> {
    /// Element type.
    dtype: GgmlType,
    /// Dimensions, outermost first.
    shape: Vec<usize>,
    /// Byte stride of each dimension; the innermost one is implied contiguous (its entry is
    /// the byte size of one block-row, kept for symmetry and never used to step).
    strides: Vec<usize>,
    /// Byte offset of element 0 inside `storage`.
    offset: usize,
    storage: Storage<'a>,
}

fn shape_error(what: impl Into<String>) -> ModelError {
    ModelError::Tensor { what: what.into() }
}

/// Bytes of a contiguous `[.., row_len]` innermost row, checking the block multiple.
fn row_bytes(dtype: GgmlType, row_len: usize) -> Result<usize, ModelError> {
    dtype
        .row_bytes(row_len as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            shape_error(format!(
                "a {} row of {row_len} elements is not a whole number of blocks of {}",
                dtype.name(),
                dtype.block_size()
            ))
        })
}

/// Contiguous byte strides for `shape`: dimension `d` steps over the product of the inner
/// dimensions; the innermost entry is the byte size of one row.
fn contiguous_strides(dtype: GgmlType, shape: &[usize]) -> Result<Vec<usize>, ModelError> {
    if shape.is_empty() {
        return Err(shape_error("a tensor needs at least one dimension"));
    }
    let rb = row_bytes(dtype, shape.last().copied().unwrap_or(1))?;
    let mut strides = vec![rb; shape.len()];
    let mut acc = rb;
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = acc;
        acc = acc
            .checked_mul(shape[d])
            .ok_or_else(|| shape_error(format!("shape {shape:?} overflows")))?;
    }
    Ok(strides)
}

impl<'a> Tensor<'a> {
    /// A zero-copy view of a tensor stored in `file`.
    pub fn from_gguf(file: &'a GgufFile, info: &TensorInfo) -> Result<Self, ModelError> {
        let shape: Vec<usize> = info
            .dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                shape_error(format!(
                    "tensor {}: dims {:?} overflow",
                    info.name, info.dims
                ))
            })?;
        let strides = contiguous_strides(info.dtype, &shape)?;
        Ok(Self {
            dtype: info.dtype,
            shape,
            strides,
            offset: 0,
            storage: Storage::Mapped(file.tensor_data(info)),
        })
    }

    /// A view over host bytes holding a contiguous tensor of `shape`.
    pub fn from_host(
        dtype: GgmlType,
        shape: &[usize],
        bytes: Arc<[u8]>,
    ) -> Result<Tensor<'static>, ModelError> {
        let strides = contiguous_strides(dtype, shape)?;
        let need = shape.iter().rev().skip(1).product::<usize>() * strides[shape.len() - 1];
        if bytes.len() != need {
            return Err(shape_error(format!(
                "{} tensor {shape:?} needs {need} bytes, found {}",
                dtype.name(),
                bytes.len()
            )));
        }
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            strides,
            offset: 0,
            storage: Storage::Host(bytes),
        })
    }

    /// A host f32 tensor of `shape` owning `data`.
    pub fn from_f32(shape: &[usize], data: &[f32]) -> Result<Tensor<'static>, ModelError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::from_host(GgmlType::F32, shape, bytes.into())
    }

    /// Element type.
    pub fn dtype(&self) -> GgmlType {
        self.dtype
    }

    /// Dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Byte strides, outermost first (the innermost is the byte size of one row).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements per innermost row.
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of innermost rows (product of the outer dimensions).
    pub fn n_rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }

    /// Whether the rows are packed back to back (no gaps from narrowing).
    pub fn is_contiguous(&self) -> bool {
        contiguous_strides(self.dtype, &self.shape).is_ok_and(|s| s == self.strides)
    }

    /// The bytes of a contiguous tensor.
    pub fn bytes(&self) -> Result<&[u8], ModelError> {
        if !self.is_contiguous() {
            return Err(shape_error(format!(
                "tensor {:?} is not contiguous",
                self.shape
            )));
        }
        let len = self.n_rows() * self.strides[self.shape.len() - 1];
        Ok(&self.storage.bytes()[self.offset..self.offset + len])
    }

    /// Narrows dimension `dim` to `range` (not the innermost one: its blocks are indivisible).
    pub fn narrow(&self, dim: usize, range: Range<usize>) -> Result<Tensor<'a>, ModelError> {
        if dim + 1 >= self.shape.len() || range.start > range.end || range.end > self.shape[dim] {
            return Err(shape_error(format!(
                "cannot narrow dim {dim} of {:?} to {range:?}",
                self.shape
            )));
        }
        let mut t = self.clone();
        t.offset += range.start * self.strides[dim];
        t.shape[dim] = range.len();
        Ok(t)
    }

    /// Rows `range` of the outermost dimension.
    pub fn rows(&self, range: Range<usize>) -> Result<Tensor<'a>, ModelError> {
        self.narrow(0, range)
    }

    /// The same elements under a new shape (contiguous tensors only; the new innermost
    /// dimension must still be a whole number of blocks).
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<'a>, ModelError> {
        if !self.is_contiguous()
            || shape.is_empty()
            || shape.iter().product::<usize>() != self.n_elements()
        {
            return Err(shape_error(format!(
                "cannot reshape {:?} to {shape:?}",
                self.shape
            )));
        }
        let strides = contiguous_strides(self.dtype, shape)?;
        Ok(Tensor {
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
            storage: self.storage.clone(),
        })
    }

    /// This tensor as a `[rows, cols]` weight matrix for the kernels (contiguous; a 1-D
    /// tensor is one row).
    pub fn as_weight(&self) -> Result<WeightView<'_>, ModelError> {
        let cols = self.row_len();
        let rows = self.n_rows();
        Ok(WeightView::new(self.dtype, rows, cols, self.bytes()?)?)
    }

    /// All elements dequantized to f32 in row-major order.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>, ModelError> {
        let cols = self.row_len();
        let rows = self.n_rows();
        let mut out = vec![0f32; rows * cols]; // [n_rows, row_len] f32
        if self.is_contiguous() {
            let w = self.as_weight()?;
            for r in 0..rows {
                w.dequantize_row(r, &mut out[r * cols..(r + 1) * cols])?;
            }
            return Ok(out);
        }
        // Strided: walk every row through the outer strides.
        let rb = row_bytes(self.dtype, cols)?;
        let outer = &self.shape[..self.shape.len() - 1];
        let bytes = self.storage.bytes();
        for r in 0..rows {
            let (mut rem, mut off) = (r, self.offset);
            for d in (0..outer.len()).rev() {
                off += (rem % outer[d]) * self.strides[d];
                rem /= outer[d];
            }
            let w = WeightView::new(self.dtype, 1, cols, &bytes[off..off + rb])?;
            w.dequantize_row(0, &mut out[r * cols..(r + 1) * cols])?;
        }
        Ok(out)
    }
}

/// An owned handle to one tensor of a shared, memory-mapped GGUF file (or a range of its
/// rows: how fused tensors such as Phi-3's `attn_qkv` are split at load): `'static`, cheap to
/// clone, and able to hand out borrowed [`Tensor`] views. Backends that read weights straight
/// from the mapping keep these.
#[derive(Clone)]
pub struct FileTensor {
    file: Arc<GgufFile>,
    index: usize,
    /// Outermost rows of the file's tensor this handle covers (`None`: all of them).
    rows: Option<Range<usize>>,
}

impl std::fmt::Debug for FileTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTensor")
            .field("name", &self.info().name)
            .field("rows", &self.rows)
            .finish()
    }
}

impl FileTensor {
    /// The tensor named `name` in `file`.
    pub fn new(file: &Arc<GgufFile>, name: &str) -> Result<Self, ModelError> {
        let index = file
            .tensors()
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        Ok(Self {
            file: Arc::clone(file),
            index,
            rows: None,
        })
    }

    /// Rows `range` of this tensor's outermost dimension (for a matrix `[rows, cols]`: a
    /// block of output rows), still read from the file without copying.
    pub fn slice_rows(&self, range: Range<usize>) -> Result<FileTensor, ModelError> {
        let n = self.view()?.shape()[0];
        if range.start > range.end || range.end > n {
            return Err(shape_error(format!(
                "{}: rows {range:?} outside 0..{n}",
                self.name()
            )));
        }
        let base = self.rows.as_ref().map_or(0, |r| r.start);
        Ok(FileTensor {
            file: Arc::clone(&self.file),
            index: self.index,
            rows: Some(base + range.start..base + range.end),
        })
    }

    /// The file's header entry of the whole tensor (its dims ignore [`FileTensor::slice_rows`]).
    pub fn info(&self) -> &TensorInfo {
        &self.file.tensors()[self.index]
    }

    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.info().name
    }

    /// A zero-copy view borrowing the mapping.
    pub fn view(&self) -> Result<Tensor<'_>, ModelError> {
        let t = Tensor::from_gguf(&self.file, self.info())?;
        match &self.rows {
            None => Ok(t),
            Some(r) => t.rows(r.clone()),
        }
    }

    /// Copies `buf.len()` bytes of the tensor's data from `offset` into `buf`, reading the
    /// file rather than the mapping (so repacking does not keep the mapped pages resident).
    pub fn read_bytes(&self, offset: usize, buf: &mut [u8]) -> Result<(), ModelError> {
        let skip = match &self.rows {
            None => 0,
            Some(r) => {
                let whole = Tensor::from_gguf(&self.file, self.info())?;
                let end = (r.end - r.start) * whole.strides()[0];
                if offset + buf.len() > end {
                    return Err(shape_error(format!(
                        "{}: read of {} bytes at {offset} past the {end}-byte row slice",
                        self.name(),
                        buf.len()
                    )));
                }
                r.start * whole.strides()[0]
            }
        };
        Ok(self
            .file
            .read_tensor_range(self.info(), (skip + offset) as u64, buf)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_do_not_copy_and_keep_values() {
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let t = Tensor::from_f32(&[2, 3, 4], &data).unwrap();
        assert_eq!(t.n_rows(), 6);
        let r = t.reshape(&[6, 4]).unwrap().rows(2..4).unwrap();
        assert_eq!(r.shape(), &[2, 4]);
        assert!(r.is_contiguous());
        assert_eq!(
            r.to_f32_vec().unwrap(),
            (8..16).map(|v| v as f32).collect::<Vec<_>>()
        );
        let n = t.narrow(1, 1..2).unwrap(); // [2, 1, 4], strided
        assert!(!n.is_contiguous());
        assert!(n.bytes().is_err());
        let want: Vec<f32> = [4, 5, 6, 7, 16, 17, 18, 19].map(|v| v as f32).to_vec();
        assert_eq!(n.to_f32_vec().unwrap(), want);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let t = Tensor::from_f32(&[2, 4], &[0.0; 8]).unwrap();
        assert!(t.reshape(&[3, 3]).is_err());
        assert!(t.rows(1..3).is_err());
        assert!(t.narrow(1, 0..2).is_err()); // innermost dim
        assert!(Tensor::from_f32(&[3, 4], &[0.0; 8]).is_err());
        // 40 elements is not a whole number of Q8_0 blocks.
        assert!(Tensor::from_host(GgmlType::Q8_0, &[1, 40], vec![0u8; 42].into()).is_err());
    }
}
