//! Metadata values: the 13 GGUF value types, including (nested) arrays.
//!
//! Arrays are stored as typed vectors (`Array::U32(Vec<u32>)`, `Array::String(Vec<String>)`, ...),
//! so memory stays proportional to the file and an empty array keeps its element type.

use crate::GgufError;

/// A GGUF metadata value type id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// `bool` (one byte, 0 or 1).
    Bool = 7,
    /// UTF-8 string (u64 length + bytes).
    String = 8,
    /// Array (u32 element type + u64 count + elements).
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short lower-case name (`"u32"`, `"string"`, `"array"`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type takes in a file (string: its length field;
    /// array: its type and count fields). Used to reject counts the file cannot hold.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Typed array, possibly nested.
    Array(Array),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// This value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any non-negative integer, widened to `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// An `f32`, or an `f64` narrowed to `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64`, or an `f32` widened.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short human-readable description of the type, e.g. `"u32"` or `"array<string>[49152]"`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array<{}>[{}]", a.elem_type(), a.len()),
            v => v.value_type().name().to_string(),
        }
    }
}

impl From<u8> for Value {
    fn from(v: u8) -> Self {
        Value::U8(v)
    }
}
impl From<i8> for Value {
    fn from(v: i8) -> Self {
        Value::I8(v)
    }
}
impl From<u16> for Value {
    fn from(v: u16) -> Self {
        Value::U16(v)
    }
}
impl From<i16> for Value {
    fn from(v: i16) -> Self {
        Value::I16(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::U32(v)
    }
}
impl From<i32> for Value {
    fn from(v: i32) -> Self {
        Value::I32(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Self {
        Value::F32(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_string())
    }
}
impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::U64(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::I64(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::F64(v)
    }
}

/// A typed GGUF array. Elements of an `Array::Array` may each have their own element type.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of element type `elem`.
    pub fn empty(elem: ValueType) -> Array {
        match elem {
            ValueType::U8 => Array::U8(Vec::new()),
            ValueType::I8 => Array::I8(Vec::new()),
            ValueType::U16 => Array::U16(Vec::new()),
            ValueType::I16 => Array::I16(Vec::new()),
            ValueType::U32 => Array::U32(Vec::new()),
            ValueType::I32 => Array::I32(Vec::new()),
            ValueType::F32 => Array::F32(Vec::new()),
            ValueType::Bool => Array::Bool(Vec::new()),
            ValueType::String => Array::String(Vec::new()),
            ValueType::Array => Array::Array(Vec::new()),
            ValueType::U64 => Array::U64(Vec::new()),
            ValueType::I64 => Array::I64(Vec::new()),
            ValueType::F64 => Array::F64(Vec::new()),
        }
    }

    /// Builds an array of `elem` from values that must all have that type.
    pub fn from_values(elem: ValueType, values: Vec<Value>) -> Result<Array, GgufError> {
        let mut out = Array::empty(elem);
        for (index, v) in values.into_iter().enumerate() {
            let found = v.value_type();
            match (&mut out, v) {
                (Array::U8(a), Value::U8(x)) => a.push(x),
                (Array::I8(a), Value::I8(x)) => a.push(x),
                (Array::U16(a), Value::U16(x)) => a.push(x),
                (Array::I16(a), Value::I16(x)) => a.push(x),
                (Array::U32(a), Value::U32(x)) => a.push(x),
                (Array::I32(a), Value::I32(x)) => a.push(x),
                (Array::F32(a), Value::F32(x)) => a.push(x),
                (Array::Bool(a), Value::Bool(x)) => a.push(x),
                (Array::String(a), Value::String(x)) => a.push(x),
                (Array::Array(a), Value::Array(x)) => a.push(x),
                (Array::U64(a), Value::U64(x)) => a.push(x),
                (Array::I64(a), Value::I64(x)) => a.push(x),
                (Array::F64(a), Value::F64(x)) => a.push(x),
                _ => {
                    return Err(GgufError::MixedArray {
                        expected: elem.name(),
                        index,
                        found: found.name(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Element `i` as an owned [`Value`] (clones strings and nested arrays).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// Iterates over the elements as owned [`Value`]s.
    pub fn iter(&self) -> impl Iterator<Item = Value> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// String elements as `&str`s (`None` unless this is a string array).
    pub fn as_strs(&self) -> Option<Vec<&str>> {
        match self {
            Array::String(v) => Some(v.iter().map(String::as_str).collect()),
            _ => None,
        }
    }

    /// String elements, borrowed (`None` unless this is a string array).
    pub fn as_strings(&self) -> Option<&[String]> {
        match self {
            Array::String(v) => Some(v),
            _ => None,
        }
    }

    /// Float elements as `f32` (`f32` arrays, or `f64` arrays narrowed).
    pub fn as_f32_vec(&self) -> Option<Vec<f32>> {
        match self {
            Array::F32(v) => Some(v.clone()),
            Array::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// Integer elements as `i32` (any integer array whose values all fit).
    pub fn as_i32_vec(&self) -> Option<Vec<i32>> {
        self.ints()?.map(|x| i32::try_from(x).ok()).collect()
    }

    /// Integer elements as `u32` (any integer array whose values all fit).
    pub fn as_u32_vec(&self) -> Option<Vec<u32>> {
        self.ints()?.map(|x| u32::try_from(x).ok()).collect()
    }

    /// Integer elements as `i64` (any integer array whose values all fit).
    pub fn as_i64_vec(&self) -> Option<Vec<i64>> {
        self.ints()?.map(|x| i64::try_from(x).ok()).collect()
    }

    /// Integer elements as `u64` (any integer array whose values are all non-negative).
    pub fn as_u64_vec(&self) -> Option<Vec<u64>> {
        self.ints()?.map(|x| u64::try_from(x).ok()).collect()
    }

    /// Bool elements (`None` unless this is a bool array).
    pub fn as_bools(&self) -> Option<&[bool]> {
        match self {
            Array::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// Nested arrays (`None` unless this is an array of arrays).
    pub fn as_arrays(&self) -> Option<&[Array]> {
        match self {
            Array::Array(v) => Some(v),
            _ => None,
        }
    }

    /// Integer elements widened to `i128`, or `None` for non-integer arrays.
    fn ints(&self) -> Option<Box<dyn Iterator<Item = i128> + '_>> {
        Some(match self {
            Array::U8(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::I8(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::U16(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::I16(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::U32(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::I32(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::U64(v) => Box::new(v.iter().map(|&x| x.into())),
            Array::I64(v) => Box::new(v.iter().map(|&x| x.into())),
            _ => return None,
        })
    }
}
