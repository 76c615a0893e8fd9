//! llama.cpp's model file types (`LLAMA_FTYPE_*`, stored in `general.file_type`).

/// The "mostly" quantization of a model file, with llama.cpp's ids.
///
/// [`name`](FileType::name) gives the short name llama-quantize uses (`"Q4_K_M"`, `"Q4_1"`,
/// `"F16"`), without the `MOSTLY_` prefix.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FileType {
    /// All tensors f32.
    ALL_F32 = 0,
    /// Mostly f16.
    MOSTLY_F16 = 1,
    /// Mostly Q4_0.
    Q4_0 = 2,
    /// Mostly Q4_1.
    Q4_1 = 3,
    /// Mostly Q8_0.
    Q8_0 = 7,
    /// Mostly Q5_0.
    Q5_0 = 8,
    /// Mostly Q5_1.
    Q5_1 = 9,
    /// Q2_K (medium).
    Q2_K = 10,
    /// Q3_K small.
    Q3_K_S = 11,
    /// Q3_K medium.
    Q3_K_M = 12,
    /// Q3_K large.
    Q3_K_L = 13,
    /// Q4_K small.
    Q4_K_S = 14,
    /// Q4_K medium.
    Q4_K_M = 15,
    /// Q5_K small.
    Q5_K_S = 16,
    /// Q5_K medium.
    Q5_K_M = 17,
    /// Q6_K.
    Q6_K = 18,
    /// IQ2_XXS.
    IQ2_XXS = 19,
    /// IQ2_XS.
    IQ2_XS = 20,
    /// Q2_K small.
    Q2_K_S = 21,
    /// IQ3_XS.
    IQ3_XS = 22,
    /// IQ3_XXS.
    IQ3_XXS = 23,
    /// IQ1_S.
    IQ1_S = 24,
    /// IQ4_NL.
    IQ4_NL = 25,
    /// IQ3_S.
    IQ3_S = 26,
    /// IQ3_M (IQ3_S mix).
    IQ3_M = 27,
    /// IQ2_S.
    IQ2_S = 28,
    /// IQ2_M.
    IQ2_M = 29,
    /// IQ4_XS.
    IQ4_XS = 30,
    /// IQ1_M.
    IQ1_M = 31,
    /// Mostly bf16.
    BF16 = 32,
    /// TQ1_0 ternary.
    TQ1_0 = 36,
    /// TQ2_0 ternary.
    TQ2_0 = 37,
    /// MXFP4 for MoE experts.
    MXFP4_MOE = 38,
    /// NVFP4.
    NVFP4 = 39,
    /// Q1_0.
    Q1_0 = 40,
    /// Q2_0.
    Q2_0 = 41,
}

const TABLE: &[(FileType, &str)] = {
    use FileType::*;
    &[
        (ALL_F32, "F32"),
        (MOSTLY_F16, "F16"),
        (Q4_0, "Q4_0"),
        (Q4_1, "Q4_1"),
        (Q8_0, "Q8_0"),
        (Q5_0, "Q5_0"),
        (Q5_1, "Q5_1"),
        (Q2_K, "Q2_K"),
        (Q3_K_S, "Q3_K_S"),
        (Q3_K_M, "Q3_K_M"),
        (Q3_K_L, "Q3_K_L"),
        (Q4_K_S, "Q4_K_S"),
        (Q4_K_M, "Q4_K_M"),
        (Q5_K_S, "Q5_K_S"),
        (Q5_K_M, "Q5_K_M"),
        (Q6_K, "Q6_K"),
        (IQ2_XXS, "IQ2_XXS"),
        (IQ2_XS, "IQ2_XS"),
        (Q2_K_S, "Q2_K_S"),
        (IQ3_XS, "IQ3_XS"),
        (IQ3_XXS, "IQ3_XXS"),
        (IQ1_S, "IQ1_S"),
        (IQ4_NL, "IQ4_NL"),
        (IQ3_S, "IQ3_S"),
        (IQ3_M, "IQ3_M"),
        (IQ2_S, "IQ2_S"),
        (IQ2_M, "IQ2_M"),
        (IQ4_XS, "IQ4_XS"),
        (IQ1_M, "IQ1_M"),
        (BF16, "BF16"),
        (TQ1_0, "TQ1_0"),
        (TQ2_0, "TQ2_0"),
        (MXFP4_MOE, "MXFP4_MOE"),
        (NVFP4, "NVFP4"),
        (Q1_0, "Q1_0"),
        (Q2_0, "Q2_0"),
    ]
};

/// Flag llama.cpp ORs into a file type it guessed rather than read.
pub const FILE_TYPE_GUESSED: u32 = 1024;

impl FileType {
    /// The file type with llama.cpp id `id` (the [`FILE_TYPE_GUESSED`] flag is ignored).
    pub fn from_id(id: u32) -> Option<Self> {
        let id = id & !FILE_TYPE_GUESSED;
        TABLE.iter().find(|r| r.0 as u32 == id).map(|r| r.0)
    }

    /// The llama.cpp id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Short name as llama-quantize spells it: `"Q4_K_M"`, `"Q4_1"`, `"F16"`, `"F32"`.
    pub fn name(self) -> &'static str {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .map(|r| r.1)
            .unwrap_or("?")
    }

    /// Looks a file type up by its short name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        TABLE
            .iter()
            .find(|r| r.1.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }

    /// Every file type, in id order.
    pub fn all() -> impl Iterator<Item = FileType> {
        TABLE.iter().map(|r| r.0)
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names() {
        assert_eq!(FileType::from_id(15), Some(FileType::Q4_K_M));
        assert_eq!(FileType::Q4_K_M.name(), "Q4_K_M");
        assert_eq!(FileType::from_id(3).map(FileType::name), Some("Q4_1"));
        assert_eq!(FileType::from_id(1).map(FileType::name), Some("F16"));
        assert_eq!(FileType::from_id(0).map(FileType::name), Some("F32"));
        assert_eq!(FileType::from_id(32).map(FileType::name), Some("BF16"));
        assert_eq!(FileType::from_id(1024 | 7), Some(FileType::Q8_0));
        assert_eq!(FileType::from_id(4), None);
        for ft in FileType::all() {
            assert_eq!(FileType::from_id(ft.id()), Some(ft));
            assert_eq!(FileType::from_name(ft.name()), Some(ft));
        }
    }
}
