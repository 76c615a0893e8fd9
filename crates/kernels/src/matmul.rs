//! The CPU matmul policy: which kernel multiplies a prepared weight matrix.
//!
//! [`Plan`] is chosen once per backend from the [`KernelSettings`] and the CPU: the prompt
//! GEMM's micro-kernel, the int8 GEMM, the kernels of repacked matrices, whether weights are
//! repacked at all and whether file-layout weights may take the prompt GEMM. Per matmul,
//! [`Plan::packed_route`] / [`Plan::file_route`] pick a [`Route`] from the matrix's layout and
//! the token count, and [`run`] is the one call that multiplies a matrix on a GEMM route (the
//! repacked GEMV with its row split is [`run_panels`]). What stays with a backend is
//! model-specific: which matrices share a fork/join (fused Q/K/V, gate/up with their SwiGLU),
//! which take two-level activations, profiling labels and the per-token dot products.

use std::ops::Range;

use crate::cpu::Isa;
use crate::gemm::int8::{self, Int8Path, QActs};
use crate::gemm::packed::PackedMatrix;
use crate::gemm::{self, GemmPath, PackedActs, WeightRef};
use crate::pool::ThreadPool;
use crate::quantdot::KernelError;
use crate::settings::KernelSettings;

/// Fewest tokens a matmul sends through a prompt GEMM; fewer go through the GEMV or the
/// per-token dot products, which read each weight block once without unpacking it.
pub const GEMM_MIN_TOKENS: usize = 16;

/// Fewest tokens a repacked matrix sends through its int8 GEMM off AMX tiles; fewer go
/// through its GEMV (the same bits). The GEMM expands each weight panel before it multiplies,
/// the GEMV streams the packed panel with prefetching: with the weights coming from memory (a
/// model larger than the last-level cache, as in a batched decode step) the GEMV is faster up
/// to about 64 rows (2-core Zen 5, one thread, 1536×576 Q4_1 at 16 rows: 65 against 94 µs;
/// 3072×3072 Q4_K at 32 rows: 1.15 against 1.42 ms; equal at 64).
pub const PACKED_GEMM_MIN_TOKENS: usize = 64;

/// The kernels a backend multiplies with, chosen once from the settings and the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The prompt GEMM's micro-kernel (`None`: `KernelSettings::gemm` off, or no SIMD GEMM).
    pub gemm: Option<GemmPath>,
    /// Prompts multiply in int8 (AMX-INT8 tiles where `KernelSettings::amx_int8` asks for
    /// them on AMX CPUs; VNNI, or AVX2 `vpmaddubsw`, on CPUs without AMX) where the weight
    /// type allows; `None`: the bf16-panel f32 GEMM (AMX-BF16 tiles on AMX CPUs).
    pub int8: Option<Int8Path>,
    /// The int8 kernels of repacked matrices: `int8`, or on AMX CPUs with bf16 prompts (AMX
    /// tiles from the packed panels) the VNNI path for decode. The decode GEMV of
    /// [`Int8Path::Amx`] is VNNI's ([`Int8Path::gemv`]).
    pub packed: Option<Int8Path>,
    /// Weights the packed kernels take are repacked at load (needs `packed`).
    pub repack: bool,
    /// File-layout weights take the prompt GEMM (off: every row through the dot products, the
    /// same bits at any row count).
    pub file_layout_gemm: bool,
}

impl Plan {
    /// The plan for `settings` on this CPU, with `isa` the dot-product table's level (AMX
    /// shares the VNNI dot products).
    pub fn new(settings: &KernelSettings, isa: Isa) -> Plan {
        let gemm = settings
            .gemm
            // The chosen level, not the dot table's.
            .then(|| GemmPath::for_isa(Isa::detect().unwrap_or(isa)))
            .filter(|p| p.is_available());
        let int8 = match (gemm, isa) {
            (_, _) if !settings.int8 => None,
            (Some(GemmPath::Amx), Isa::Vnni | Isa::Amx) if settings.amx_int8 => Some(Int8Path::Amx),
            (Some(GemmPath::Avx512), Isa::Vnni) => Some(Int8Path::Vnni),
            (Some(GemmPath::Avx512 | GemmPath::Avx2), Isa::Avx512 | Isa::Avx2) => {
                Some(Int8Path::Avx2)
            }
            _ => None,
        }
        .filter(|p| p.is_available());
        // AMX CPUs repack too (measured on a 2-core AMX VM, `-t 2`, synthetic 3B Q4_K_M:
        // tg128 +11 %, pp512 +6 % over the file layout; BENCHMARKS.md, 2026-12-06).
        let packed = int8.or_else(|| {
            (gemm == Some(GemmPath::Amx) && matches!(isa, Isa::Vnni | Isa::Amx))
                .then_some(Int8Path::Vnni)
                .filter(|p| p.is_available())
        });
        Plan {
            gemm,
            int8,
            packed,
            repack: packed.is_some() && settings.repack,
            file_layout_gemm: settings.file_layout_gemm,
        }
    }

    /// The path `w` is repacked for at load, if it is repacked.
    pub fn repack_path(&self, w: &WeightRef<'_>) -> Option<Int8Path> {
        self.packed.filter(|p| {
            self.repack && p.supports(w.dtype) && PackedMatrix::unsupported(w).is_none()
        })
    }

    /// How a repacked matrix multiplies `n_tokens` rows (`None` without a packed path).
    pub fn packed_route(&self, n_tokens: usize) -> Option<Route> {
        let path = self.packed?;
        Some(match self.gemm {
            Some(GemmPath::Amx) if n_tokens >= GEMM_MIN_TOKENS && path != Int8Path::Amx => {
                Route::PackedAmx
            }
            Some(_) if n_tokens >= GEMM_MIN_TOKENS && path == Int8Path::Amx => {
                Route::PackedGemm(path)
            }
            Some(_) if n_tokens >= PACKED_GEMM_MIN_TOKENS => Route::PackedGemm(path),
            _ => Route::PackedGemv(path.gemv()),
        })
    }

    /// How a matrix in the file layout multiplies `n_tokens` rows. `group_gemm_ok`: every
    /// matrix of the fork/join the prompt GEMM can take ([`WeightRef::unsupported`]); they
    /// take it together or not at all. A row's result on [`Route::Dot`] never depends on how
    /// many rows share the matmul (batch and prefix invariance); the file-layout GEMM rounds
    /// differently, so it runs only where `file_layout_gemm` asks for it.
    pub fn file_route(&self, w: &WeightRef<'_>, n_tokens: usize, group_gemm_ok: bool) -> Route {
        let Some(path) = self.file_gemm(n_tokens, group_gemm_ok) else {
            return Route::Dot;
        };
        match self.int8 {
            Some(p) if p.supports(w.dtype) && int8::unsupported(w).is_none() => Route::FileInt8(p),
            _ => Route::FileBf16(path),
        }
    }

    /// The prompt GEMM file-layout matrices take together ([`Plan::file_route`]), if any.
    pub fn file_gemm(&self, n_tokens: usize, group_gemm_ok: bool) -> Option<GemmPath> {
        self.gemm
            .filter(|_| n_tokens >= GEMM_MIN_TOKENS && self.file_layout_gemm && group_gemm_ok)
    }
}

/// The kernel one matmul runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A repacked matrix on AMX tiles ([`PackedMatrix::gemm_amx`], bf16 activations).
    PackedAmx,
    /// A repacked matrix through its int8 GEMM ([`PackedMatrix::gemm`]).
    PackedGemm(Int8Path),
    /// A repacked matrix through its GEMV, rows split by 32-row panels ([`run_panels`]).
    PackedGemv(Int8Path),
    /// The file's blocks through the int8 GEMM ([`int8::gemm_i8`]).
    FileInt8(Int8Path),
    /// The file's blocks through the bf16-panel GEMM ([`gemm::gemm`]).
    FileBf16(GemmPath),
    /// Per-token dot products on the file's blocks (the backend's own loop).
    Dot,
}

impl Route {
    /// The activations the route reads.
    pub fn input(self) -> ActForm {
        match self {
            Route::PackedAmx => ActForm::Bf16(GemmPath::Amx),
            Route::FileBf16(p) => ActForm::Bf16(p),
            Route::PackedGemm(_) | Route::PackedGemv(_) | Route::FileInt8(_) => ActForm::Int8,
            Route::Dot => ActForm::Dot,
        }
    }

    /// A short name for profiles: the kernel's path.
    pub fn name(self) -> String {
        match self {
            Route::PackedAmx => "packed amx".into(),
            Route::PackedGemm(p) => format!("packed {}", p.name()),
            Route::PackedGemv(p) => format!("gemv {}", p.name()),
            Route::FileInt8(p) => p.name().into(),
            Route::FileBf16(p) => format!("{p:?}"),
            Route::Dot => "dot".into(),
        }
    }
}

/// What a route's activations are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActForm {
    /// [`PackedActs`] for the bf16 GEMM `path` ([`PackedActs::for_path`]).
    Bf16(GemmPath),
    /// [`QActs`] (int8 per 32-block).
    Int8,
    /// Quantized per weight type by the backend's dot products.
    Dot,
}

/// A prepared matrix: the repacked copy, or the file's blocks.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// Repacked at load.
    Packed(&'a PackedMatrix),
    /// The file's blocks.
    File(WeightRef<'a>),
}

/// Activations in the form a route reads ([`Route::input`]).
#[derive(Clone, Copy, Debug)]
pub enum Activations<'a> {
    /// bf16 panels.
    Bf16(&'a PackedActs),
    /// int8 per 32-block.
    Int8(&'a QActs),
}

/// `out = x · Wᵀ` (`out`: `[n_tokens, rows]` f32) on a GEMM `route`, split over `pool`.
/// Errors where the route, the weights and the activations do not fit together (a GEMV or
/// dot-product route, a file route on a repacked matrix, activations of another form).
pub fn run(
    route: Route,
    w: Weights<'_>,
    x: Activations<'_>,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    match (route, w, x) {
        (Route::PackedAmx, Weights::Packed(m), Activations::Bf16(x)) => m.gemm_amx(x, out, pool),
        (Route::PackedGemm(p), Weights::Packed(m), Activations::Int8(x)) => m.gemm(p, x, out, pool),
        (Route::FileInt8(p), Weights::File(w), Activations::Int8(x)) => {
            int8::gemm_i8(p, w, x, out, pool)
        }
        (Route::FileBf16(p), Weights::File(w), Activations::Bf16(x)) => {
            gemm::gemm(p, w, x, out, pool)
        }
        (r, _, _) => Err(mismatch(r)),
    }
}

/// `out += x · Wᵀ` on a GEMM `route`, bit for bit `out` plus the result of [`run`] (the
/// second level of two-level activations).
pub fn run_add(
    route: Route,
    w: Weights<'_>,
    x: Activations<'_>,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    let mut lo = vec![0f32; out.len()]; // [n_tokens, rows] f32
    run(route, w, x, &mut lo, pool)?;
    out.iter_mut().zip(&lo).for_each(|(y, l)| *y += l);
    Ok(())
}

/// The rows of 32-row `panels` of a repacked matrix on [`Route::PackedGemv`], on the calling
/// thread: `out[t * stride + r]` for row `r` of the panels (the backend splits panels over
/// its pool, fused with its other matrices).
pub fn run_panels(
    route: Route,
    m: &PackedMatrix,
    x: &QActs,
    panels: Range<usize>,
    out: &mut [f32],
    stride: usize,
) -> Result<(), KernelError> {
    match route {
        Route::PackedGemv(p) => m.gemv_panels(p, x, panels, out, stride),
        r => Err(mismatch(r)),
    }
}

fn mismatch(r: Route) -> KernelError {
    KernelError::BadShape(format!(
        "matmul: route {r:?} does not fit these weights and activations"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use damascus_quant::GgmlType;

    /// Deterministic values in [-1, 1).
    fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u64 * 2_654_435_761 + seed * 97) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// `rows` rows of `k` quantized to `dtype`.
    fn quantized(dtype: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
        let src = rand_vec(rows * k, seed);
        let rb = k / dtype.block_size() * dtype.type_size();
        let mut out = vec![0u8; rows * rb];
        for (s, o) in src.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
            damascus_quant::quantize_row(dtype, s, o).unwrap();
        }
        out
    }

    fn plan(gemm: Option<GemmPath>, int8: Option<Int8Path>, packed: Option<Int8Path>) -> Plan {
        Plan {
            gemm,
            int8,
            packed,
            repack: packed.is_some(),
            file_layout_gemm: false,
        }
    }

    #[test]
    fn plans_follow_the_settings() {
        let isa = crate::quantdot::kernels().isa();
        let on = KernelSettings::default();
        let p = Plan::new(&on, isa);
        assert_eq!(p.repack, p.packed.is_some());
        assert!(!p.file_layout_gemm);
        assert!(p.gemm.is_none_or(|g| g.is_available()));
        assert!(p.int8.is_none_or(|g| g.is_available()));
        // Without the prompt GEMM nothing is repacked and no int8 GEMM runs.
        let off = Plan::new(
            &KernelSettings {
                gemm: false,
                ..on.clone()
            },
            isa,
        );
        assert_eq!(
            (off.gemm, off.int8, off.packed, off.repack),
            (None, None, None, false)
        );
        let no_repack = Plan::new(
            &KernelSettings {
                repack: false,
                ..on.clone()
            },
            isa,
        );
        assert_eq!(no_repack.packed, p.packed);
        assert!(!no_repack.repack);
        let file = Plan::new(
            &KernelSettings {
                file_layout_gemm: true,
                int8: false,
                ..on
            },
            isa,
        );
        assert!(file.file_layout_gemm && file.int8.is_none());
        assert_eq!(file.gemm, p.gemm);
    }

    #[test]
    fn routes_follow_layout_and_token_count() {
        let vnni = plan(
            Some(GemmPath::Avx512),
            Some(Int8Path::Vnni),
            Some(Int8Path::Vnni),
        );
        assert_eq!(
            vnni.packed_route(1),
            Some(Route::PackedGemv(Int8Path::Vnni))
        );
        assert_eq!(
            vnni.packed_route(15),
            Some(Route::PackedGemv(Int8Path::Vnni))
        );
        assert_eq!(
            vnni.packed_route(63),
            Some(Route::PackedGemv(Int8Path::Vnni))
        );
        assert_eq!(
            vnni.packed_route(PACKED_GEMM_MIN_TOKENS),
            Some(Route::PackedGemm(Int8Path::Vnni))
        );
        let amx = plan(Some(GemmPath::Amx), None, Some(Int8Path::Vnni));
        assert_eq!(amx.packed_route(16), Some(Route::PackedAmx));
        assert_eq!(amx.packed_route(3), Some(Route::PackedGemv(Int8Path::Vnni)));
        // AMX-INT8 prompts: the int8 GEMM on tiles, decode on VNNI's GEMV.
        let amx8 = plan(
            Some(GemmPath::Amx),
            Some(Int8Path::Amx),
            Some(Int8Path::Amx),
        );
        assert_eq!(
            amx8.packed_route(16),
            Some(Route::PackedGemm(Int8Path::Amx))
        );
        assert_eq!(
            amx8.packed_route(15),
            Some(Route::PackedGemv(Int8Path::Vnni))
        );
        let no_gemm = plan(None, None, Some(Int8Path::Avx2));
        assert_eq!(
            no_gemm.packed_route(512),
            Some(Route::PackedGemv(Int8Path::Avx2))
        );
        assert_eq!(plan(None, None, None).packed_route(1), None);
        // File layout: dot products unless asked for, and only for whole groups.
        let bytes = quantized(GgmlType::Q4_0, 32, 64, 1);
        let w = WeightRef {
            dtype: GgmlType::Q4_0,
            bytes: &bytes,
            rows: 32,
            cols: 64,
        };
        assert_eq!(vnni.file_route(&w, 512, true), Route::Dot);
        let file = Plan {
            file_layout_gemm: true,
            ..vnni
        };
        assert_eq!(
            file.file_route(&w, 512, true),
            Route::FileInt8(Int8Path::Vnni)
        );
        assert_eq!(file.file_route(&w, 512, false), Route::Dot);
        assert_eq!(file.file_route(&w, 8, true), Route::Dot);
        let bf16 = Plan { int8: None, ..file };
        assert_eq!(
            bf16.file_route(&w, 512, true),
            Route::FileBf16(GemmPath::Avx512)
        );
    }

    #[test]
    fn run_takes_only_matching_forms_and_equals_the_kernels() {
        for dtype in [GgmlType::Q4_0, GgmlType::Q8_0] {
            let bytes = quantized(dtype, 64, 64, 2);
            let w = WeightRef {
                dtype,
                bytes: &bytes,
                rows: 64,
                cols: 64,
            };
            let xs = rand_vec(3 * 64, 5);
            let xq = QActs::new(&xs, 3, 64, None).unwrap();
            let mut out = vec![0f32; 3 * 64]; // [3 tokens, 64 rows]
            let file = Weights::File(w);
            let wrong = [
                Route::Dot,
                Route::PackedGemm(Int8Path::Avx2),
                Route::PackedAmx,
            ];
            for r in wrong {
                assert!(
                    run(r, file, Activations::Int8(&xq), &mut out, None).is_err(),
                    "{r:?}"
                );
            }
            let mut want = vec![0f32; 3 * 64];
            int8::gemm_i8_ref(w, &xq, &mut want).unwrap();
            let m = PackedMatrix::pack(w, None).unwrap();
            let pool = ThreadPool::new(2);
            for p in [Int8Path::Vnni, Int8Path::Avx2, Int8Path::Amx] {
                if !p.is_available() || !p.supports(dtype) {
                    continue;
                }
                out.fill(f32::NAN);
                run(
                    Route::FileInt8(p),
                    file,
                    Activations::Int8(&xq),
                    &mut out,
                    Some(&pool),
                )
                .unwrap();
                assert_eq!(out, want, "{p:?} {dtype:?} file");
                out.fill(f32::NAN);
                let packed = Weights::Packed(&m);
                run(
                    Route::PackedGemm(p),
                    packed,
                    Activations::Int8(&xq),
                    &mut out,
                    Some(&pool),
                )
                .unwrap();
                assert_eq!(out, want, "{p:?} {dtype:?} packed");
                let base: Vec<f32> = (0..out.len()).map(|i| i as f32 * 0.25 - 3.0).collect();
                let mut sum = base.clone();
                run_add(
                    Route::PackedGemm(p),
                    packed,
                    Activations::Int8(&xq),
                    &mut sum,
                    None,
                )
                .unwrap();
                let want_sum: Vec<f32> = base.iter().zip(&want).map(|(b, w)| b + w).collect();
                assert_eq!(sum, want_sum, "{p:?} {dtype:?} packed add");
                // Panel 1 alone (rows 32..64) at a stride of 32.
                let mut got = vec![f32::NAN; 3 * 32];
                run_panels(Route::PackedGemv(p), &m, &xq, 1..2, &mut got, 32).unwrap();
                for t in 0..3 {
                    assert_eq!(got[t * 32..][..32], want[t * 64 + 32..][..32]);
                }
                assert!(run_panels(Route::PackedGemm(p), &m, &xq, 0..1, &mut got, 32).is_err());
            }
        }
    }
}
