//! The crate's single error type. Every message is one line and names the file offset and the
//! field or tensor it concerns, so a corrupt file can be diagnosed from the error alone.

use std::path::PathBuf;

/// Everything that can go wrong while reading, validating or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, mapped, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// An I/O error on a stream without a path (e.g. the writer's output).
    #[error("i/o error while {context}: {source}")]
    Stream {
        /// What was being done.
        context: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The first four bytes are not `GGUF`.
    #[error(
        "offset 0: bad magic \"{}\" (expected \"GGUF\"): not a GGUF file",
        .found.as_slice().escape_ascii()
    )]
    BadMagic {
        /// The four bytes found (fewer if the file is shorter).
        found: Vec<u8>,
    },

    /// The version field holds something other than 2 or 3.
    #[error("offset 4: unsupported GGUF version {version} (supported: 2, 3){hint}")]
    UnsupportedVersion {
        /// The version read (little-endian).
        version: u32,
        /// Extra explanation (e.g. a big-endian file), possibly empty.
        hint: &'static str,
    },

    /// The file ends before a field that must be there.
    #[error(
        "offset {offset}: truncated file reading {field}: need {needed} bytes, {available} left"
    )]
    Truncated {
        /// Where the field starts.
        offset: u64,
        /// Which field.
        field: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },

    /// A count or length from the header cannot fit in the rest of the file.
    #[error(
        "offset {offset}: {field} = {count} is impossible: needs at least {needed} bytes, only {available} left in the file"
    )]
    CountTooLarge {
        /// Where the count starts.
        offset: u64,
        /// Which count (string length, array count, tensor count, kv count).
        field: String,
        /// The count read.
        count: u64,
        /// Minimum bytes the count implies (saturated).
        needed: u64,
        /// Bytes left in the file.
        available: u64,
    },

    /// A string is not valid UTF-8.
    #[error("offset {offset}: {field}: invalid UTF-8 at byte {valid_up_to} of the string")]
    InvalidUtf8 {
        /// Where the string bytes start.
        offset: u64,
        /// Which field.
        field: String,
        /// Length of the valid prefix.
        valid_up_to: usize,
    },

    /// A metadata value type id outside the spec.
    #[error("offset {offset}: {field}: unknown metadata value type id {type_id}")]
    UnknownValueType {
        /// Where the type id is.
        offset: u64,
        /// Which field.
        field: String,
        /// The id read.
        type_id: u32,
    },

    /// A bool byte that is neither 0 nor 1.
    #[error("offset {offset}: {field}: invalid bool byte {byte} (expected 0 or 1)")]
    InvalidBool {
        /// Where the byte is.
        offset: u64,
        /// Which field.
        field: String,
        /// The byte read.
        byte: u8,
    },

    /// Arrays nested deeper than [`crate::MAX_NESTING_DEPTH`].
    #[error("offset {offset}: {field}: arrays nested deeper than {max}")]
    NestingTooDeep {
        /// Where the offending array starts.
        offset: u64,
        /// Which field.
        field: String,
        /// The cap.
        max: usize,
    },

    /// The same metadata key appears twice.
    #[error("offset {offset}: duplicate metadata key '{key}'")]
    DuplicateKey {
        /// Where the second occurrence starts.
        offset: u64,
        /// The key.
        key: String,
    },

    /// `general.alignment` is not a non-zero power of two `u32`.
    #[error("offset {offset}: general.alignment: {reason}")]
    InvalidAlignment {
        /// Where the key/value pair starts.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// A tensor's ggml type id is not one this crate knows.
    #[error("offset {offset}: tensor '{tensor}': unknown ggml type id {type_id}")]
    UnknownGgmlType {
        /// Where the type id is.
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// The id read.
        type_id: u32,
    },

    /// The same tensor name appears twice.
    #[error("offset {offset}: duplicate tensor name '{tensor}'")]
    DuplicateTensor {
        /// Where the second tensor info starts.
        offset: u64,
        /// The name.
        tensor: String,
    },

    /// More than [`crate::MAX_DIMS`] dimensions.
    #[error("offset {offset}: tensor '{tensor}': n_dims = {n_dims} exceeds the maximum of {max}")]
    TooManyDims {
        /// Where n_dims is.
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// The count read.
        n_dims: u32,
        /// The cap (GGML_MAX_DIMS).
        max: usize,
    },

    /// The product of the dimensions (or the byte size) overflows, or a dim exceeds i64.
    #[error(
        "offset {offset}: tensor '{tensor}': dims {dims:?} overflow (element count or byte size)"
    )]
    DimsOverflow {
        /// Where the dims start.
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// The dims read.
        dims: Vec<u64>,
    },

    /// The row length is not a multiple of the type's block size.
    #[error(
        "offset {offset}: tensor '{tensor}': row length dims[0] = {row_len} is not a multiple of the {dtype} block size {block_size}"
    )]
    BadRowLength {
        /// Where the dims start (0 for writer-side checks).
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// `dims[0]`.
        row_len: u64,
        /// The type name.
        dtype: &'static str,
        /// The type's block size.
        block_size: usize,
    },

    /// A tensor's offset is not a multiple of the alignment.
    #[error(
        "offset {offset}: tensor '{tensor}': data offset {data_offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// Where the tensor's offset field is.
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// The offset read (relative to the data section).
        data_offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// A tensor's bytes lie (partly) outside the file.
    #[error(
        "offset {offset}: tensor '{tensor}': data [{start}, {start}+{size}) lies outside the file ({file_size} bytes)"
    )]
    TensorOutOfBounds {
        /// Where the tensor's offset field is.
        offset: u64,
        /// The tensor's name.
        tensor: String,
        /// Absolute start of the data (saturated).
        start: u64,
        /// Bytes the tensor needs.
        size: u64,
        /// The file's size.
        file_size: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error(
        "tensors '{first}' [{first_start}, {first_end}) and '{second}' [{second_start}, {second_end}) overlap (absolute file offsets)"
    )]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// Its absolute start.
        first_start: u64,
        /// Its absolute end.
        first_end: u64,
        /// The other tensor.
        second: String,
        /// Its absolute start.
        second_start: u64,
        /// Its absolute end.
        second_end: u64,
    },

    /// A metadata value has a different type than the getter asked for.
    #[error("metadata key '{key}': expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller wanted.
        expected: &'static str,
        /// What the file holds (type name, and the value if it was out of range).
        found: String,
    },

    /// An array was built from values that do not all have the declared element type.
    #[error("array of {expected}: element {index} is {found}")]
    MixedArray {
        /// The declared element type.
        expected: &'static str,
        /// The first offending element.
        index: usize,
        /// Its type.
        found: &'static str,
    },

    /// The writer's producer returned the wrong number of bytes for a tensor.
    #[error("tensor '{tensor}' (index {index}): producer wrote {found} bytes, expected {expected}")]
    DataSizeMismatch {
        /// Tensor index in declaration order.
        index: usize,
        /// The tensor's name.
        tensor: String,
        /// Bytes expected from dims and dtype.
        expected: u64,
        /// Bytes produced.
        found: u64,
    },

    /// The writer's producer failed.
    #[error("tensor '{tensor}' (index {index}): producing data failed: {source}")]
    Produce {
        /// Tensor index in declaration order.
        index: usize,
        /// The tensor's name.
        tensor: String,
        /// The producer's error.
        #[source]
        source: Box<GgufError>,
    },

    /// A free-form error from outside this crate (e.g. a quantizer inside a writer producer).
    #[error("{0}")]
    Custom(Box<dyn std::error::Error + Send + Sync + 'static>),

    /// An invalid request to the writer (duplicate names, bad dims, ...).
    #[error("writer: {0}")]
    InvalidWrite(String),
}

impl GgufError {
    /// Wraps any error, e.g. inside a [`crate::GgufWriter::write`] producer:
    /// `quantize(..).map_err(GgufError::custom)?`.
    pub fn custom(err: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        GgufError::Custom(err.into())
    }
}
