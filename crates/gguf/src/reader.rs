//! Parsing and validating a GGUF file (v2 and v3, little-endian) into a [`GgufFile`].
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 kv count, the kv pairs, the tensor
//! infos, padding to `general.alignment`, then the data section. Every count and length is
//! checked against the bytes left in the file before anything is allocated from it, all offset
//! arithmetic is checked, and every slice is taken with `get`, so a hostile file ends in a
//! [`GgufError`], never a panic or an out-of-bounds read.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::{Array, GgmlType, GgufError, Metadata, Value, ValueType, keys};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted (an array of arrays is depth 2).
pub const MAX_NESTING_DEPTH: usize = 8;
/// Fewest bytes one kv pair takes: key length, value type, a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Fewest bytes one tensor info takes: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the row count, ...
    pub dims: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims; 1 for zero dims). Exact for infos from a
    /// [`GgufFile`] or [`crate::GgufWriter`] (checked there); saturates otherwise.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes of data, or `None` if the row length is not a multiple of the block size or the
    /// size overflows.
    pub fn try_n_bytes(&self) -> Option<u64> {
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        if !self
            .row_len()
            .is_multiple_of(self.dtype.block_size() as u64)
        {
            return None;
        }
        self.dtype.row_bytes(n)
    }

    /// Bytes of data. Exact for infos from a [`GgufFile`] or [`crate::GgufWriter`] (checked
    /// there); `u64::MAX` for an invalid hand-built info.
    pub fn n_bytes(&self) -> u64 {
        self.try_n_bytes().unwrap_or(u64::MAX)
    }

    /// Row length (`dims[0]`, or 1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of `dims[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.dims
            .iter()
            .skip(1)
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Bytes of one row (`None` if the row length is not a multiple of the block size).
    pub fn row_bytes(&self) -> Option<u64> {
        self.dtype.row_bytes(self.row_len())
    }
}

/// Where the file's bytes live.
enum Storage {
    /// The mapping and the open file behind it ([`GgufFile::read_tensor_range`] reads through
    /// the file, so copying a tensor out does not fault its pages into the mapping).
    Mmap(memmap2::Mmap, File),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m, _) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed, validated GGUF file. Tensor data stays in the mapping; [`tensor_data`] hands out
/// slices of it without copying.
///
/// [`tensor_data`]: GgufFile::tensor_data
pub struct GgufFile {
    storage: Storage,
    path: Option<PathBuf>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the mapping is read-only and only ever read through bounds-checked slices.
            // The one hazard of mmap — another process truncating or rewriting the file while it
            // is mapped — is outside what safe Rust can guard against; model files are treated
            // as immutable while open (the same contract llama.cpp relies on).
            #[allow(unsafe_code)]
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
            Storage::Mmap(map, file)
        };
        Self::from_storage(storage, Some(path.to_path_buf()))
    }

    /// Parses an in-memory file.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes), None)
    }

    fn from_storage(storage: Storage, path: Option<PathBuf>) -> Result<GgufFile, GgufError> {
        let parsed = parse(storage.bytes())?;
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            path,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            tensor_index,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    /// The position of the tensor named `name` in [`tensors`](Self::tensors).
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensor_index.get(name).copied()
    }

    /// The bytes of `info`'s data (zero-copy). Bounds were checked at open for this file's own
    /// infos; an info from elsewhere that does not fit yields an empty slice.
    ///
    /// For a memory-mapped file the slice starts at a multiple of [`alignment`](Self::alignment)
    /// from the page-aligned mapping; for [`from_bytes`](Self::from_bytes) the memory alignment is
    /// only that of the `Vec<u8>` (1), so reinterpret bytes with care (e.g. `from_le_bytes`).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let range = self.data_offset.checked_add(info.offset).and_then(|start| {
            let end = start.checked_add(info.try_n_bytes()?)?;
            Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
        });
        range
            .and_then(|r| self.storage.bytes().get(r))
            .unwrap_or(&[])
    }

    /// Copies `buf.len()` bytes of `info`'s data, starting `offset` bytes into it, into `buf`.
    ///
    /// A memory-mapped file is read with `pread` rather than through the mapping, so a caller
    /// that repacks a tensor into its own memory does not also keep the mapped pages resident
    /// (they stay in the page cache, not in the process). Errors when the range is not inside
    /// the tensor, or the read fails (e.g. the file was truncated after it was opened).
    pub fn read_tensor_range(
        &self,
        info: &TensorInfo,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), GgufError> {
        let len = buf.len() as u64;
        let n_bytes = info.try_n_bytes();
        let start = offset
            .checked_add(len)
            .filter(|&end| n_bytes.is_some_and(|n| end <= n))
            .and_then(|_| {
                self.data_offset
                    .checked_add(info.offset)?
                    .checked_add(offset)
            })
            .ok_or_else(|| GgufError::Stream {
                context: format!(
                    "reading bytes {offset}..{} of tensor {} ({} bytes)",
                    offset.saturating_add(len),
                    info.name,
                    n_bytes.unwrap_or(0)
                ),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            })?;
        match &self.storage {
            #[cfg(unix)]
            Storage::Mmap(_, file) => {
                use std::os::unix::fs::FileExt;
                file.read_exact_at(buf, start)
                    .map_err(|source| GgufError::Io {
                        path: self.path.clone().unwrap_or_default(),
                        source,
                    })
            }
            storage => {
                let range = usize::try_from(start)
                    .ok()
                    .and_then(|s| Some(s..s.checked_add(buf.len())?));
                let src = range.and_then(|r| storage.bytes().get(r));
                match src {
                    Some(src) => {
                        buf.copy_from_slice(src);
                        Ok(())
                    }
                    None => Err(GgufError::Stream {
                        context: format!("reading tensor {} past the end of the file", info.name),
                        source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                    }),
                }
            }
        }
    }

    /// The bytes of the tensor named `name`.
    pub fn tensor_data_by_name(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// File size in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The path this file was opened from (`None` for [`from_bytes`](Self::from_bytes)).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Result<Option<&str>, GgufError> {
        self.metadata.get_str(keys::GENERAL_ARCHITECTURE)
    }
}

/// The result of [`parse`].
struct Parsed {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Lazily built field description for error messages.
type Field<'f> = &'f dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn take(&mut self, n: u64, field: Field<'_>) -> Result<&'a [u8], GgufError> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| Some(self.pos..self.pos.checked_add(n)?))
            .and_then(|r| self.buf.get(r));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                offset: self.offset(),
                field: field(),
                needed: n,
                available: self.remaining(),
            }),
        }
    }

    fn array<const N: usize>(&mut self, field: Field<'_>) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, field: Field<'_>) -> Result<u8, GgufError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u32(&mut self, field: Field<'_>) -> Result<u32, GgufError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: Field<'_>) -> Result<u64, GgufError> {
        self.array(field).map(u64::from_le_bytes)
    }

    fn bool(&mut self, field: Field<'_>) -> Result<bool, GgufError> {
        let offset = self.offset();
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::InvalidBool {
                offset,
                field: field(),
                byte,
            }),
        }
    }

    /// Reads a count and checks that `count * min_elem` bytes remain after it.
    fn count(&mut self, min_elem: u64, field: Field<'_>) -> Result<u64, GgufError> {
        let offset = self.offset();
        let count = self.u64(field)?;
        let needed = count.saturating_mul(min_elem);
        if needed > self.remaining() {
            return Err(GgufError::CountTooLarge {
                offset,
                field: field(),
                count,
                needed,
                available: self.remaining(),
            });
        }
        Ok(count)
    }

    fn string(&mut self, field: Field<'_>) -> Result<String, GgufError> {
        let len_field = || format!("{} (string length)", field());
        let len = self.count(1, &len_field)?;
        let offset = self.offset();
        let bytes = self.take(len, field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                offset,
                field: field(),
                valid_up_to: e.valid_up_to(),
            }),
        }
    }

    fn value_type(&mut self, field: Field<'_>) -> Result<ValueType, GgufError> {
        let offset = self.offset();
        let type_id = self.u32(field)?;
        ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            offset,
            field: field(),
            type_id,
        })
    }

    /// `count` fixed-size little-endian elements, already known to fit.
    fn fixed<const N: usize, T>(
        &mut self,
        count: u64,
        conv: fn([u8; N]) -> T,
        field: Field<'_>,
    ) -> Result<Vec<T>, GgufError> {
        let bytes = self.take(count.saturating_mul(N as u64), field)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    fn value(&mut self, ty: ValueType, field: Field<'_>, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(field)?),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(field)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::Bool => Value::Bool(self.bool(field)?),
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => Value::Array(self.array_value(field, depth + 1)?),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
        })
    }

    /// An array at nesting `depth` (1 = a top-level array value).
    fn array_value(&mut self, field: Field<'_>, depth: usize) -> Result<Array, GgufError> {
        if depth > MAX_NESTING_DEPTH {
            return Err(GgufError::NestingTooDeep {
                offset: self.offset(),
                field: field(),
                max: MAX_NESTING_DEPTH,
            });
        }
        let type_field = || format!("{} (array element type)", field());
        let elem = self.value_type(&type_field)?;
        let count_field = || format!("{} (array count)", field());
        let n = self.count(elem.min_encoded_size(), &count_field)?;
        // `count` checked n * min_size <= remaining, so n (and every capacity below) is bounded
        // by the file size.
        let cap = usize::try_from(n).unwrap_or(0);
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n, field)?.to_vec()),
            ValueType::I8 => Array::I8(self.fixed(n, i8::from_le_bytes, field)?),
            ValueType::U16 => Array::U16(self.fixed(n, u16::from_le_bytes, field)?),
            ValueType::I16 => Array::I16(self.fixed(n, i16::from_le_bytes, field)?),
            ValueType::U32 => Array::U32(self.fixed(n, u32::from_le_bytes, field)?),
            ValueType::I32 => Array::I32(self.fixed(n, i32::from_le_bytes, field)?),
            ValueType::F32 => Array::F32(self.fixed(n, f32::from_le_bytes, field)?),
            ValueType::U64 => Array::U64(self.fixed(n, u64::from_le_bytes, field)?),
            ValueType::I64 => Array::I64(self.fixed(n, i64::from_le_bytes, field)?),
            ValueType::F64 => Array::F64(self.fixed(n, f64::from_le_bytes, field)?),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(cap);
                for i in 0..n {
                    v.push(self.bool(&|| format!("{}[{i}]", field()))?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(cap);
                for i in 0..n {
                    v.push(self.string(&|| format!("{}[{i}]", field()))?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(cap);
                for i in 0..n {
                    v.push(self.array_value(&|| format!("{}[{i}]", field()), depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// Parses and validates the whole file.
fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { buf, pos: 0 };
    if buf.len() < 4 {
        return Err(GgufError::Truncated {
            offset: 0,
            field: "magic".into(),
            needed: 4,
            available: buf.len() as u64,
        });
    }
    let magic = cur.array::<4>(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = cur.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        let hint = match version {
            1 => " (GGUF v1 used 32-bit counts; re-convert the model)",
            v if matches!(v.swap_bytes(), 2 | 3) => {
                " (this looks like a big-endian file; only little-endian is supported)"
            }
            _ => "",
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    let n_tensors = cur.count(MIN_TENSOR_INFO_BYTES, &|| "tensor count".into())?;
    let n_kv = cur.count(MIN_KV_BYTES, &|| "metadata kv count".into())?;

    // Metadata.
    let mut metadata = Metadata::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kv {
        let kv_offset = cur.offset();
        let key = cur.string(&|| format!("kv[{i}] key"))?;
        let field = || format!("kv[{i}] '{key}'");
        let ty = cur.value_type(&|| format!("{} value type", field()))?;
        let value = cur.value(ty, &field, 0)?;
        if key == keys::GENERAL_ALIGNMENT {
            alignment = check_alignment(&value, kv_offset)?;
        }
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                offset: kv_offset,
                key,
            });
        }
        metadata.try_insert(key, value);
    }

    // Tensor infos.
    let cap = usize::try_from(n_tensors).unwrap_or(0);
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(cap);
    let mut sizes: Vec<u64> = Vec::with_capacity(cap); // [n_tensors] data bytes
    let mut offset_fields: Vec<u64> = Vec::with_capacity(cap); // [n_tensors] file offsets
    let mut names: HashSet<String> = HashSet::with_capacity(cap);
    for i in 0..n_tensors {
        let info_offset = cur.offset();
        let name = cur.string(&|| format!("tensor[{i}] name"))?;
        if names.contains(&name) {
            return Err(GgufError::DuplicateTensor {
                offset: info_offset,
                tensor: name,
            });
        }
        let field = |what: &str| format!("tensor[{i}] '{name}' {what}");
        let n_dims_offset = cur.offset();
        let n_dims = cur.u32(&|| field("n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                offset: n_dims_offset,
                tensor: name,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let dims_offset = cur.offset();
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(cur.u64(&|| field(&format!("dims[{d}]")))?);
        }
        let type_offset = cur.offset();
        let type_id = cur.u32(&|| field("type"))?;
        let Some(dtype) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownGgmlType {
                offset: type_offset,
                tensor: name,
                type_id,
            });
        };
        let overflow = |name: String, dims: Vec<u64>| GgufError::DimsOverflow {
            offset: dims_offset,
            tensor: name,
            dims,
        };
        // ggml stores dims as i64, so each dim and the element count must fit in i64.
        let n_elems = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64 && dims.iter().all(|&d| d <= i64::MAX as u64));
        let Some(n_elems) = n_elems else {
            return Err(overflow(name, dims));
        };
        let row_len = dims.first().copied().unwrap_or(1);
        let block_size = dtype.block_size();
        if row_len % block_size as u64 != 0 {
            return Err(GgufError::BadRowLength {
                offset: dims_offset,
                tensor: name,
                row_len,
                dtype: dtype.name(),
                block_size,
            });
        }
        let Some(size) = dtype.row_bytes(n_elems) else {
            return Err(overflow(name, dims));
        };
        let offset_field = cur.offset();
        let offset = cur.u64(&|| field("data offset"))?;
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                offset: offset_field,
                tensor: name,
                data_offset: offset,
                alignment,
            });
        }
        names.insert(name.clone());
        tensors.push(TensorInfo {
            name,
            dims,
            dtype,
            offset,
        });
        sizes.push(size);
        offset_fields.push(offset_field);
    }

    // Data section: starts at the next multiple of the alignment after the header.
    let header_end = cur.offset();
    let data_offset = header_end
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);
    let file_size = buf.len() as u64;
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(tensors.len()); // (start, end, idx)
    for (idx, ((t, &size), &field_offset)) in
        tensors.iter().zip(&sizes).zip(&offset_fields).enumerate()
    {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_size => {
                if size > 0 {
                    ranges.push((start, end, idx));
                }
            }
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    offset: field_offset,
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    size,
                    file_size,
                });
            }
        }
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if let [(a_start, a_end, a), (b_start, b_end, b)] = *pair
            && a_end > b_start
        {
            let name = |i: usize| tensors.get(i).map(|t| t.name.clone()).unwrap_or_default();
            return Err(GgufError::OverlappingTensors {
                first: name(a),
                first_start: a_start,
                first_end: a_end,
                second: name(b),
                second_start: b_start,
                second_end: b_end,
            });
        }
    }

    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// `general.alignment` must be an unsigned integer that is a non-zero power of two.
pub(crate) fn check_alignment(value: &Value, offset: u64) -> Result<u64, GgufError> {
    let a = match value {
        Value::U8(_) | Value::U16(_) | Value::U32(_) | Value::U64(_) => value.as_u64(),
        _ => None,
    };
    match a {
        Some(a) if a.is_power_of_two() && a <= u64::from(u32::MAX) => Ok(a),
        Some(a) => Err(GgufError::InvalidAlignment {
            offset,
            reason: format!("{a} is not a non-zero power of two that fits in u32"),
        }),
        None => Err(GgufError::InvalidAlignment {
            offset,
            reason: format!(
                "expected an unsigned integer, found {}",
                value.type_description()
            ),
        }),
    }
}
