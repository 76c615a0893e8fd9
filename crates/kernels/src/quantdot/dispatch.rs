//! Run-time choice of the dot-product variant: detected once ([`Isa::detect`],
//! which honours `DAMASCUS_ISA=scalar|avx2|avx512|vnni|amx`) and cached. AMX
//! has no dot-product kernels of its own and uses the VNNI table.

use std::sync::OnceLock;

pub use crate::cpu::Isa;

use super::{Acts, BlockQ8_0, BlockQ8_1, BlockQ8K, KernelError, WeightType, scalar};

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
        #[cfg(target_arch = "x86_64")]
        Isa::Amx => Some(&VNNI),
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

/// The process-wide kernel table for [`Isa::detect`], chosen on first use. If
/// `DAMASCUS_ISA` forces a level this CPU lacks, the best available level is
/// used instead (front ends report that error by calling `Isa::detect`).
pub fn kernels() -> &'static DotKernels {
    static CHOSEN: OnceLock<&'static DotKernels> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let isa = Isa::detect().unwrap_or_else(|_| Isa::best());
        kernels_for(isa).unwrap_or(&SCALAR)
    })
}

impl DotKernels {
    /// ISA level of this table.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Dot product of one weight row (`w`: `[k / block_elems * block_bytes]`
    /// u8, ggml layout) with quantized activations of the same length `k`.
    pub fn dot(&self, wtype: WeightType, w: &[u8], a: Acts<'_>) -> Result<f32, KernelError> {
        let k = a.n_elems();
        check_pair(wtype, a)?;
        let need = k / wtype.block_elems() * wtype.block_bytes();
        if w.len() != need {
            return Err(KernelError::BadLength {
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
pub(super) fn check_pair(wtype: WeightType, a: Acts<'_>) -> Result<(), KernelError> {
    if wtype.act_type() != a.act_type() {
        return Err(KernelError::WrongActType {
            wtype,
            expected: wtype.act_type(),
            found: a.act_type(),
        });
    }
    Ok(())
}
