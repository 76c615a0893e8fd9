//! The ggml tensor element types: ids, names, block sizes and byte sizes.
//!
//! Facts are from ggml's `type_traits` table (`ggml/src/ggml.c`, `ggml-common.h`). Where
//! gguf-py's `GGML_QUANT_SIZES` disagrees (older gguf-py releases list Q8_1 as 40 bytes), ggml wins:
//! `block_q8_1` is two f16 plus 32 int8 = 36 bytes.

/// A ggml tensor element type, with its ggml id as discriminant.
///
/// Every type of the current GGUF spec is listed, including the ones Damascus cannot compute
/// with yet: those still parse and list by name.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half float.
    F16 = 1,
    /// 4-bit, 32-element blocks, f16 scale.
    Q4_0 = 2,
    /// 4-bit, 32-element blocks, f16 scale and min.
    Q4_1 = 3,
    /// 5-bit, 32-element blocks, f16 scale.
    Q5_0 = 6,
    /// 5-bit, 32-element blocks, f16 scale and min.
    Q5_1 = 7,
    /// 8-bit, 32-element blocks, f16 scale.
    Q8_0 = 8,
    /// 8-bit, 32-element blocks, f16 scale and f16 sum (activation type).
    Q8_1 = 9,
    /// 2-bit k-quant, 256-element super-blocks.
    Q2_K = 10,
    /// 3-bit k-quant.
    Q3_K = 11,
    /// 4-bit k-quant.
    Q4_K = 12,
    /// 5-bit k-quant.
    Q5_K = 13,
    /// 6-bit k-quant.
    Q6_K = 14,
    /// 8-bit k-quant (activation type, f32 scale and block sums).
    Q8_K = 15,
    /// i-quant 2.06 bpw.
    IQ2_XXS = 16,
    /// i-quant 2.31 bpw.
    IQ2_XS = 17,
    /// i-quant 3.06 bpw.
    IQ3_XXS = 18,
    /// i-quant 1.56 bpw.
    IQ1_S = 19,
    /// Non-linear 4-bit, 32-element blocks.
    IQ4_NL = 20,
    /// i-quant 3.44 bpw.
    IQ3_S = 21,
    /// i-quant 2.5 bpw.
    IQ2_S = 22,
    /// Non-linear 4-bit, 256-element super-blocks.
    IQ4_XS = 23,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit float.
    F64 = 28,
    /// i-quant 1.75 bpw.
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary 1.69 bpw.
    TQ1_0 = 34,
    /// Ternary 2.06 bpw.
    TQ2_0 = 35,
    /// Microscaling FP4, 32-element blocks, E8M0 scale.
    MXFP4 = 39,
    /// NVIDIA FP4, 64-element blocks, four E4M3 sub-block scales.
    NVFP4 = 40,
    /// 1-bit, 128-element blocks, f16 scale.
    Q1_0 = 41,
    /// 2-bit, 64-element blocks, f16 scale.
    Q2_0 = 42,
}

/// `(type, name, elements per block, bytes per block)` for every known type, in id order.
const TABLE: &[(GgmlType, &str, usize, usize)] = {
    use GgmlType::*;
    const QK_K: usize = 256;
    &[
        (F32, "F32", 1, 4),
        (F16, "F16", 1, 2),
        (Q4_0, "Q4_0", 32, 2 + 16),
        (Q4_1, "Q4_1", 32, 2 + 2 + 16),
        (Q5_0, "Q5_0", 32, 2 + 4 + 16),
        (Q5_1, "Q5_1", 32, 2 + 2 + 4 + 16),
        (Q8_0, "Q8_0", 32, 2 + 32),
        (Q8_1, "Q8_1", 32, 2 + 2 + 32),
        (Q2_K, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
        (Q3_K, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
        (Q4_K, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
        (Q5_K, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
        (Q6_K, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
        (Q8_K, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
        (IQ2_XXS, "IQ2_XXS", QK_K, 2 + QK_K / 4),
        (IQ2_XS, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
        (IQ3_XXS, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
        (IQ1_S, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
        (IQ4_NL, "IQ4_NL", 32, 2 + 16),
        (
            IQ3_S,
            "IQ3_S",
            QK_K,
            2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
        ),
        (IQ2_S, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
        (IQ4_XS, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
        (I8, "I8", 1, 1),
        (I16, "I16", 1, 2),
        (I32, "I32", 1, 4),
        (I64, "I64", 1, 8),
        (F64, "F64", 1, 8),
        (IQ1_M, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (BF16, "BF16", 1, 2),
        (TQ1_0, "TQ1_0", QK_K, 2 + 4 * 13),
        (TQ2_0, "TQ2_0", QK_K, 2 + 64),
        (MXFP4, "MXFP4", 32, 1 + 16),
        (NVFP4, "NVFP4", 64, 4 + 32),
        (Q1_0, "Q1_0", 128, 2 + 16),
        (Q2_0, "Q2_0", 64, 2 + 16),
    ]
};

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 35] = {
        let mut out = [GgmlType::F32; 35];
        let mut i = 0;
        while i < TABLE.len() {
            out[i] = TABLE[i].0;
            i += 1;
        }
        out
    };

    /// The type with ggml id `id`, or `None` for ids that are unknown or were removed from the
    /// format (4, 5, 31–33, 36–38).
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|row| row.0 as u32 == id).map(|row| row.0)
    }

    /// The ggml id.
    pub fn id(self) -> u32 {
        self as u32
    }

    fn row(self) -> (GgmlType, &'static str, usize, usize) {
        // Every variant has exactly one row (checked by a unit test); the fallback is unreachable.
        TABLE
            .iter()
            .copied()
            .find(|row| row.0 == self)
            .unwrap_or((self, "?", 1, 0))
    }

    /// The upper-case name gguf-py and llama.cpp's tools print, e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// Looks a type up by its [`name`](Self::name) (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        TABLE
            .iter()
            .find(|row| row.1.eq_ignore_ascii_case(name))
            .map(|row| row.0)
    }

    /// Elements per block (1 for plain scalar types).
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().3
    }

    /// Whether this is a block-quantized type (as opposed to a plain scalar type).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by `n_elems` consecutive elements; `None` if `n_elems` is not a multiple of
    /// the block size or the size overflows `u64`.
    pub fn row_bytes(self, n_elems: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elems.is_multiple_of(bs) {
            return None;
        }
        (n_elems / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(GgmlType::ALL[i], row.0);
            assert_eq!(GgmlType::from_id(row.0.id()), Some(row.0));
            assert_eq!(GgmlType::from_name(row.1), Some(row.0));
            assert_eq!(format!("{:?}", row.0), row.1);
            assert!(row.2 >= 1 && row.3 >= 1);
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
    }

    #[test]
    fn known_sizes() {
        assert_eq!(GgmlType::Q4_0.type_size(), 18);
        assert_eq!(GgmlType::Q4_1.type_size(), 20);
        assert_eq!(GgmlType::Q8_1.type_size(), 36);
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::IQ1_M.type_size(), 56);
        assert_eq!(GgmlType::MXFP4.type_size(), 17);
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
