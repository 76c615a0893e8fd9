//! Run-time choice of the dot-product variant: detected once, cached, and
//! overridable with `DAMASCUS_ISA=scalar|avx2|avx512|vnni`.

use std::sync::OnceLock;

use super::{Acts, BlockQ8_0, BlockQ8_1, BlockQ8K, QuantDotError, WeightType, scalar};

/// Instruction-set level of a kernel table, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable scalar code.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512F/BW/VL (+ AVX2, FMA, F16C).
    Avx512,
    /// AVX-512 plus VNNI.
    Vnni,
}

impl Isa {
    /// Lower-case name as accepted by `DAMASCUS_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Vnni => "vnni",
        }
    }

    /// Parses a `DAMASCUS_ISA` value ("amx" maps to VNNI for dot products).
    pub fn parse(s: &str) -> Option<Isa> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "scalar" | "none" => Isa::Scalar,
            "avx2" => Isa::Avx2,
            "avx512" | "avx512bw" => Isa::Avx512,
            "vnni" | "avx512vnni" | "amx" => Isa::Vnni,
            _ => return None,
        })
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => {
                Isa::Avx512.is_available() && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Best level this CPU supports.
    pub fn best() -> Isa {
        [Isa::Vnni, Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The level to use: `DAMASCUS_ISA` if set (capped at what the CPU has),
    /// otherwise the best available.
    pub fn selected() -> Isa {
        let best = Isa::best();
        match std::env::var("DAMASCUS_ISA")
            .ok()
            .as_deref()
            .and_then(Isa::parse)
        {
            Some(want) => want.min(best),
            None => best,
        }
    }
}

type DotK = unsafe fn(&[u8], &[BlockQ8K]) -> f32;
type Dot0 = unsafe fn(&[u8], &[BlockQ8_0]) -> f32;
type Dot1 = unsafe fn(&[u8], &[BlockQ8_1]) -> f32;

/// A table of dot-product kernels for one ISA level. Only handed out (by
/// [`kernels`] / [`kernels_for`]) when the CPU supports that level, so its
/// methods are safe to call.
#[derive(Debug)]
pub struct DotKernels {
    isa: Isa,
    q4_0: Dot0,
    q4_1: Dot1,
    q5_0: Dot0,
    q8_0: Dot0,
    q4_k: DotK,
    q5_k: DotK,
    q6_k: DotK,
}

static SCALAR: DotKernels = DotKernels {
    isa: Isa::Scalar,
    q4_0: scalar::dot_q4_0,
    q4_1: scalar::dot_q4_1,
    q5_0: scalar::dot_q5_0,
    q8_0: scalar::dot_q8_0,
    q4_k: scalar::dot_q4_k,
    q5_k: scalar::dot_q5_k,
    q6_k: scalar::dot_q6_k,
};

#[cfg(target_arch = "x86_64")]
static AVX2: DotKernels = {
    use super::avx2 as m;
    DotKernels {
        isa: Isa::Avx2,
        q4_0: m::dot_q4_0,
        q4_1: m::dot_q4_1,
        q5_0: m::dot_q5_0,
        q8_0: m::dot_q8_0,
        q4_k: m::dot_q4_k,
        q5_k: m::dot_q5_k,
        q6_k: m::dot_q6_k,
    }
};

#[cfg(target_arch = "x86_64")]
static AVX512: DotKernels = {
    use super::avx512::bw as m;
    DotKernels {
        isa: Isa::Avx512,
        q4_0: m::dot_q4_0,
        q4_1: m::dot_q4_1,
        q5_0: m::dot_q5_0,
        q8_0: m::dot_q8_0,
        q4_k: m::dot_q4_k,
        q5_k: m::dot_q5_k,
        q6_k: m::dot_q6_k,
    }
};

#[cfg(target_arch = "x86_64")]
static VNNI: DotKernels = {
    use super::avx512::vnni as m;
    DotKernels {
        isa: Isa::Vnni,
        q4_0: m::dot_q4_0,
        q4_1: m::dot_q4_1,
        q5_0: m::dot_q5_0,
        q8_0: m::dot_q8_0,
        q4_k: m::dot_q4_k,
        q5_k: m::dot_q5_k,
        q6_k: m::dot_q6_k,
    }
};

/// The kernel table for `isa`, or `None` if this CPU lacks it.
pub fn kernels_for(isa: Isa) -> Option<&'static DotKernels> {
    if !isa.is_available() {
        return None;
    }
    match isa {
        Isa::Scalar => Some(&SCALAR),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(&AVX2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(&AVX512),
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni => Some(&VNNI),
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The process-wide kernel table ([`Isa::selected`]), chosen on first use.
pub fn kernels() -> &'static DotKernels {
    static CHOSEN: OnceLock<&'static DotKernels> = OnceLock::new();
    CHOSEN.get_or_init(|| kernels_for(Isa::selected()).unwrap_or(&SCALAR))
}

impl DotKernels {
    /// ISA level of this table.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Dot product of one weight row (`w`: `[k / block_elems * block_bytes]`
    /// u8, ggml layout) with quantized activations of the same length `k`.
    pub fn dot(&self, wtype: WeightType, w: &[u8], a: Acts<'_>) -> Result<f32, QuantDotError> {
        let k = a.n_elems();
        check_pair(wtype, a)?;
        let need = k / wtype.block_elems() * wtype.block_bytes();
        if w.len() != need {
            return Err(QuantDotError::BadLength {
                what: "weight row",
                expected: need,
                found: w.len(),
                unit: "bytes",
            });
        }
        Ok(self.dot_unchecked_len(wtype, w, a))
    }

    /// Like [`DotKernels::dot`] without the checks: the work is bounded by
    /// the shorter operand, and a weight/activation type mismatch yields 0.
    #[inline]
    pub fn dot_unchecked_len(&self, wtype: WeightType, w: &[u8], a: Acts<'_>) -> f32 {
        // SAFETY: a table is only reachable through kernels_for/kernels, which
        // check that the CPU supports its ISA; the kernels bound all memory
        // accesses by the lengths of `w` and `a`.
        unsafe {
            match (wtype, a) {
                (WeightType::Q4_K, Acts::Q8K(y)) => (self.q4_k)(w, y),
                (WeightType::Q5_K, Acts::Q8K(y)) => (self.q5_k)(w, y),
                (WeightType::Q6_K, Acts::Q8K(y)) => (self.q6_k)(w, y),
                (WeightType::Q8_0, Acts::Q8_0(y)) => (self.q8_0)(w, y),
                (WeightType::Q4_0, Acts::Q8_0(y)) => (self.q4_0)(w, y),
                (WeightType::Q5_0, Acts::Q8_0(y)) => (self.q5_0)(w, y),
                (WeightType::Q4_1, Acts::Q8_1(y)) => (self.q4_1)(w, y),
                _ => 0.0,
            }
        }
    }
}

/// Checks that `a` is the activation format `wtype` needs.
pub(super) fn check_pair(wtype: WeightType, a: Acts<'_>) -> Result<(), QuantDotError> {
    if wtype.act_type() != a.act_type() {
        return Err(QuantDotError::WrongActType {
            wtype,
            expected: wtype.act_type(),
            found: a.act_type(),
        });
    }
    Ok(())
}
