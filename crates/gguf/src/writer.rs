//! Streaming GGUF v3 writer: declare metadata and tensors up front, then stream tensor data one
//! tensor at a time, so a multi-GB model never has to sit in memory.
//!
//! Layout matches llama.cpp's `gguf_write` and gguf-py's `GGUFWriter`: header, kv pairs, tensor
//! infos, zero padding to the alignment, then each tensor's data followed by zero padding to the
//! alignment.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::reader::check_alignment;
use crate::{
    Array, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgmlType, GgufError, GgufFile, MAX_DIMS,
    MAX_NESTING_DEPTH, Metadata, TensorInfo, Value, keys,
};

/// Version the writer emits.
pub const WRITE_VERSION: u32 = 3;

/// A GGUF file under construction. See the module docs.
///
/// ```no_run
/// # use damascus_gguf::{GgufWriter, GgmlType, Value, GgufError};
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", Value::from("llama"))?;
/// w.add_tensor("x", vec![4, 2], GgmlType::F32)?;
/// w.write_to_path("out.gguf", |_i, buf| {
///     buf.extend(std::iter::repeat_n(0u8, 32)); // [2, 4] f32
///     Ok(())
/// })?;
/// # Ok::<(), GgufError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Metadata,
    tensors: Vec<TensorInfo>, // offsets filled in by `layout`
    names: HashSet<String>,
}

impl GgufWriter {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding a copy of `file`'s metadata and tensor declarations (same order), ready
    /// to be written with a producer that copies or transforms `file`'s tensor data.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, GgufError> {
        let mut w = GgufWriter {
            metadata: file.metadata().clone(),
            ..Self::default()
        };
        for t in file.tensors() {
            w.add_tensor(t.name.clone(), t.dims.clone(), t.dtype)?;
        }
        Ok(w)
    }

    /// The metadata declared so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Appends a metadata pair; a duplicate key is an error.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        let key = key.into();
        check_value(&key, &value)?;
        if !self.metadata.try_insert(key.clone(), value) {
            return Err(GgufError::InvalidWrite(format!(
                "duplicate metadata key '{key}'"
            )));
        }
        Ok(())
    }

    /// Sets a metadata pair, replacing an existing value in place.
    pub fn set_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        let key = key.into();
        check_value(&key, &value)?;
        self.metadata.set(key, value);
        Ok(())
    }

    /// Removes a metadata pair.
    pub fn remove_metadata(&mut self, key: &str) -> Option<Value> {
        self.metadata.remove(key)
    }

    /// Declares the next tensor; returns its index (the index the producer will be called with).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: Vec<u64>,
        dtype: GgmlType,
    ) -> Result<usize, GgufError> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(GgufError::InvalidWrite(format!(
                "duplicate tensor name '{name}'"
            )));
        }
        if dims.len() > MAX_DIMS {
            return Err(GgufError::InvalidWrite(format!(
                "tensor '{name}': {} dims exceed the maximum of {MAX_DIMS}",
                dims.len()
            )));
        }
        let info = TensorInfo {
            name,
            dims,
            dtype,
            offset: 0,
        };
        let fits_i64 = info
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_some_and(|n| n <= i64::MAX as u64);
        if !fits_i64 || info.try_n_bytes().is_none() {
            return Err(GgufError::InvalidWrite(format!(
                "tensor '{}': dims {:?} overflow or row length is not a multiple of the {} block size {}",
                info.name,
                info.dims,
                dtype,
                dtype.block_size()
            )));
        }
        self.names.insert(info.name.clone());
        self.tensors.push(info);
        Ok(self.tensors.len() - 1)
    }

    /// Number of declared tensors.
    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The alignment the file will use (`general.alignment` if set, else 32).
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.get(keys::GENERAL_ALIGNMENT) {
            Some(v) => check_alignment(v, 0),
            None => Ok(DEFAULT_ALIGNMENT),
        }
    }

    /// The declared tensors with the data offsets they will be written at.
    pub fn layout(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let alignment = self.alignment()?;
        let mut offset = 0u64;
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let mut t = t.clone();
            t.offset = offset;
            offset = offset
                .checked_add(t.n_bytes())
                .and_then(|end| end.checked_next_multiple_of(alignment))
                .ok_or_else(|| GgufError::InvalidWrite("total data size overflows".into()))?;
            out.push(t);
        }
        Ok(out)
    }

    /// Writes the file to `out`. `produce(i, buf)` is called once per tensor, in declaration
    /// order, with an empty `buf`; it must append exactly that tensor's bytes
    /// ([`TensorInfo::n_bytes`]). Returns the number of bytes written.
    pub fn write<W: Write>(
        &self,
        out: W,
        mut produce: impl FnMut(usize, &mut Vec<u8>) -> Result<(), GgufError>,
    ) -> Result<u64, GgufError> {
        let alignment = self.alignment()?;
        let layout = self.layout()?;
        let mut w = Counting {
            inner: BufWriter::with_capacity(1 << 20, out),
            written: 0,
        };
        let io = |context: &str| {
            let context = context.to_string();
            move |source| GgufError::Stream { context, source }
        };

        // Header.
        let mut head: Vec<u8> = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        head.extend_from_slice(&(layout.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in self.metadata.iter() {
            put_string(&mut head, key);
            head.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut head, value);
            if head.len() >= 1 << 20 {
                w.write_all(&head).map_err(io("writing metadata"))?;
                head.clear();
            }
        }
        for t in &layout {
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.dtype.id().to_le_bytes());
            head.extend_from_slice(&t.offset.to_le_bytes());
        }
        w.write_all(&head).map_err(io("writing header"))?;
        pad(&mut w, alignment).map_err(io("writing header padding"))?;

        // Data.
        let mut buf: Vec<u8> = Vec::new();
        for (index, t) in layout.iter().enumerate() {
            buf.clear();
            produce(index, &mut buf).map_err(|e| GgufError::Produce {
                index,
                tensor: t.name.clone(),
                source: Box::new(e),
            })?;
            let expected = t.n_bytes();
            if buf.len() as u64 != expected {
                return Err(GgufError::DataSizeMismatch {
                    index,
                    tensor: t.name.clone(),
                    expected,
                    found: buf.len() as u64,
                });
            }
            w.write_all(&buf).map_err(|source| GgufError::Stream {
                context: format!("writing tensor '{}'", t.name),
                source,
            })?;
            pad(&mut w, alignment).map_err(io("writing tensor padding"))?;
        }
        w.inner.flush().map_err(io("flushing"))?;
        Ok(w.written)
    }

    /// Writes to `path` atomically: into a temporary file beside it, synced, then renamed over
    /// `path`. On error the temporary file is removed and `path` is untouched.
    pub fn write_to_path(
        &self,
        path: impl AsRef<Path>,
        produce: impl FnMut(usize, &mut Vec<u8>) -> Result<(), GgufError>,
    ) -> Result<u64, GgufError> {
        let path = path.as_ref();
        let tmp = temp_path(path);
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| GgufError::Io { path: p, source }
        };
        let result = (|| {
            let file = File::create(&tmp).map_err(io(&tmp))?;
            let n = self.write(&file, produce)?;
            file.sync_all().map_err(io(&tmp))?;
            std::fs::rename(&tmp, path).map_err(io(path))?;
            Ok(n)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// `dir/.name.tmp-<pid>` beside `path`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out.gguf".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Rejects values the reader would reject (bad alignment, nesting too deep).
fn check_value(key: &str, value: &Value) -> Result<(), GgufError> {
    if key == keys::GENERAL_ALIGNMENT {
        check_alignment(value, 0)?;
    }
    fn depth(a: &Array) -> usize {
        match a {
            Array::Array(v) => 1 + v.iter().map(depth).max().unwrap_or(0),
            _ => 1,
        }
    }
    if let Value::Array(a) = value
        && depth(a) > MAX_NESTING_DEPTH
    {
        return Err(GgufError::InvalidWrite(format!(
            "metadata key '{key}': arrays nested deeper than {MAX_NESTING_DEPTH}"
        )));
    }
    Ok(())
}

/// A writer that counts bytes, for padding and the returned total.
struct Counting<W: Write> {
    inner: BufWriter<W>,
    written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes zeros up to the next multiple of `alignment`, from a fixed buffer (an alignment of up to
/// 2^31 must not allocate that much).
fn pad<W: Write>(w: &mut Counting<W>, alignment: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut left = (alignment - w.written % alignment) % alignment;
    while left > 0 {
        let n = left.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}
