//! Shared test helpers: a synthetic valid file built with the writer, and a raw byte builder for
//! hand-crafted (often corrupt) headers.
#![allow(dead_code)]

use damascus_gguf::{Array, GgmlType, GgufError, GgufWriter, Value, keys};

/// A small writer exercising every value type, nested arrays and several tensor types.
pub fn synthetic_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    let md: Vec<(&str, Value)> = vec![
        (keys::GENERAL_ARCHITECTURE, "llama".into()),
        ("test.u8", Value::U8(200)),
        ("test.i8", Value::I8(-100)),
        ("test.u16", Value::U16(60000)),
        ("test.i16", Value::I16(-30000)),
        ("test.u32", Value::U32(4_000_000_000)),
        ("test.i32", Value::I32(-2_000_000_000)),
        ("test.f32", Value::F32(1.5e-5)),
        ("test.bool", Value::Bool(true)),
        ("test.string", "héllo wörld ✓".into()),
        ("test.u64", Value::U64(u64::MAX - 1)),
        ("test.i64", Value::I64(i64::MIN + 1)),
        ("test.f64", Value::F64(std::f64::consts::PI)),
        (
            "test.arr.str",
            Value::Array(Array::String(vec!["a".into(), "".into(), "Ġthe".into()])),
        ),
        ("test.arr.i32", Value::Array(Array::I32(vec![-1, 0, 7]))),
        ("test.arr.f32", Value::Array(Array::F32(vec![0.25, -2.0]))),
        ("test.arr.u8", Value::Array(Array::U8(vec![1, 2, 3, 255]))),
        (
            "test.arr.bool",
            Value::Array(Array::Bool(vec![true, false])),
        ),
        ("test.arr.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        (
            "test.arr.empty",
            Value::Array(Array::empty(damascus_gguf::ValueType::F64)),
        ),
        (
            "test.arr.nested",
            Value::Array(Array::Array(vec![
                Array::I16(vec![1, -2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::U32(vec![9])]),
            ])),
        ),
        (keys::GENERAL_ALIGNMENT, Value::U32(64)),
    ];
    for (k, v) in md {
        w.add_metadata(k, v).expect("add metadata");
    }
    w.add_tensor("a.f32", vec![8, 3], GgmlType::F32).unwrap();
    w.add_tensor("b.q4_1", vec![64, 2], GgmlType::Q4_1).unwrap();
    w.add_tensor("c.f16", vec![5], GgmlType::F16).unwrap();
    w.add_tensor("d.q4_k", vec![256, 1, 1], GgmlType::Q4_K)
        .unwrap();
    w.add_tensor("e.iq2_xxs", vec![256], GgmlType::IQ2_XXS)
        .unwrap();
    w
}

/// Deterministic tensor bytes for the synthetic file.
pub fn fill(index: usize, n: u64) -> Vec<u8> {
    (0..n)
        .map(|j| (j as usize * 31 + index * 7 + 1) as u8)
        .collect()
}

/// Bytes of the synthetic file.
pub fn synthetic_bytes() -> Vec<u8> {
    let w = synthetic_writer();
    let layout = w.layout().unwrap();
    let mut out = Vec::new();
    w.write(&mut out, |i, buf| {
        buf.extend(fill(i, layout[i].n_bytes()));
        Ok::<(), GgufError>(())
    })
    .unwrap();
    out
}

/// Little-endian byte builder for hand-crafted GGUF headers.
#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// `GGUF`, version, tensor count, kv count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A u32-valued kv pair.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad(&mut self, align: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.extend(std::iter::repeat_n(0u8, n));
        self
    }
    pub fn build(&self) -> Vec<u8> {
        self.0.clone()
    }
}
