//! Ordered metadata map (key -> [`Value`]) with typed getters that name the key on a type error.

use std::collections::HashMap;

use crate::{Array, GgufError, Value};

/// The metadata key/value pairs of a GGUF file, in file order, with O(1) lookup by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value for `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let i = *self.index.get(key)?;
        self.entries.get(i).map(|(_, v)| v)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Appends a pair; returns `false` (and changes nothing) if `key` is already present.
    pub fn try_insert(&mut self, key: impl Into<String>, value: Value) -> bool {
        let key = key.into();
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Sets `key`: replaces the value in place if present (keeping its position), else appends.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.index.get(&key).and_then(|&i| self.entries.get_mut(i)) {
            Some(slot) => slot.1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Removes `key`, returning its value; later pairs keep their relative order.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        if i >= self.entries.len() {
            return None;
        }
        let (_, v) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(v)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match conv(v) {
                Some(t) => Ok(Some(t)),
                None => Err(GgufError::WrongType {
                    key: key.to_string(),
                    expected,
                    found: describe(v),
                }),
            },
        }
    }

    /// A non-negative integer (of any width) that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.typed(key, "an integer in u32 range", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    /// A non-negative integer of any width.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// An integer of any width that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.typed(key, "an integer in i64 range", Value::as_i64)
    }

    /// An integer of any width that fits in `i32`.
    pub fn get_i32(&self, key: &str) -> Result<Option<i32>, GgufError> {
        self.typed(key, "an integer in i32 range", |v| {
            v.as_i64().and_then(|x| i32::try_from(x).ok())
        })
    }

    /// An `f32` (or `f64`, narrowed).
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.typed(key, "a float", Value::as_f32)
    }

    /// An `f64` (or `f32`, widened).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a float", Value::as_f64)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", Value::as_str)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// An array.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.typed(key, "an array", Value::as_array)
    }
}

/// Type and (for scalars) value, for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() <= 40 => format!("string {s:?}"),
        Value::String(_) | Value::Array(_) => v.type_description(),
        Value::Bool(b) => format!("bool {b}"),
        Value::U8(x) => format!("u8 {x}"),
        Value::I8(x) => format!("i8 {x}"),
        Value::U16(x) => format!("u16 {x}"),
        Value::I16(x) => format!("i16 {x}"),
        Value::U32(x) => format!("u32 {x}"),
        Value::I32(x) => format!("i32 {x}"),
        Value::U64(x) => format!("u64 {x}"),
        Value::I64(x) => format!("i64 {x}"),
        Value::F32(x) => format!("f32 {x}"),
        Value::F64(x) => format!("f64 {x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_getters() {
        let mut m = Metadata::new();
        assert!(m.try_insert("a", Value::U32(7)));
        assert!(!m.try_insert("a", Value::U32(8)));
        m.set("b", Value::I32(-1));
        m.set("c", Value::String("x".into()));
        m.set("d", Value::F64(0.5));
        assert_eq!(m.get_u32("a").unwrap(), Some(7));
        assert_eq!(m.get_u64("a").unwrap(), Some(7));
        assert_eq!(m.get_u32("missing").unwrap(), None);
        let err = m.get_u32("b").unwrap_err().to_string();
        assert!(err.contains("'b'") && err.contains("i32 -1"), "{err}");
        assert!(m.get_str("a").is_err());
        assert_eq!(m.get_str("c").unwrap(), Some("x"));
        assert_eq!(m.get_f32("d").unwrap(), Some(0.5));
        assert_eq!(m.remove("b"), Some(Value::I32(-1)));
        assert_eq!(m.keys().collect::<Vec<_>>(), ["a", "c", "d"]);
        assert_eq!(m.get_str("c").unwrap(), Some("x"));
    }
}
