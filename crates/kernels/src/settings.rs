//! Every tuning setting of the CPU kernels and backend in one struct, [`KernelSettings`],
//! carried in the model's load options. Libraries never read the environment for these: the
//! binary maps the `DAMASCUS_*` variables onto the struct once ([`KernelSettings::from_vars`],
//! the table in [`KernelSettings::VARS`]) and hands it down. The few settings the kernels need
//! process-wide (deep in a micro-kernel, where no struct reaches) are installed once with
//! [`KernelSettings::install`]; the ISA choice alone still falls back to `DAMASCUS_ISA` when
//! nothing was installed, so `DAMASCUS_ISA=scalar cargo test` tests each level.

use std::sync::OnceLock;

use crate::cpu::{Isa, IsaError};

/// Tuning settings of the CPU kernels and backend (defaults: everything on, automatic).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSettings {
    /// Kernel ISA level (`None`: the best this CPU has). `DAMASCUS_ISA`.
    pub isa: Option<Isa>,
    /// Prompts through the prefill GEMM (else per-token dot products). `DAMASCUS_GEMM`.
    pub gemm: bool,
    /// Weights left in the file layout take the prefill GEMM for prompts too (off by default:
    /// its rounding differs from the per-row dot products, so a row's result would depend on
    /// how many rows share the matmul). `DAMASCUS_FILE_GEMM=1`.
    pub file_layout_gemm: bool,
    /// Prompts multiply in int8 where the weight type allows (else bf16 panels).
    /// `DAMASCUS_GEMM_INT8`.
    pub int8: bool,
    /// Weights repacked into interleaved panels at load. `DAMASCUS_REPACK`.
    pub repack: bool,
    /// Prompt attention on AMX tiles (with the AMX GEMM). `DAMASCUS_ATTN_AMX`.
    pub attn_amx: bool,
    /// On AMX CPUs, prompts multiply in int8 on AMX-INT8 tiles — the VNNI path's bits, so a
    /// row's result does not depend on its pass — instead of on AMX-BF16 tiles (off by
    /// default: on the 16-core AMX host the bf16 tiles run pp512 2.3× faster, BENCHMARKS.md
    /// 2026-12-07 afternoon). `DAMASCUS_AMX_INT8=1`.
    pub amx_int8: bool,
    /// Weight-panel bytes per AMX GEMM unit, in KiB (`None`: 640). `DAMASCUS_AMX_PANEL_KIB`.
    pub amx_panel_kib: Option<usize>,
    /// Pool threads taking AMX GEMM units (`None`: all). `DAMASCUS_AMX_THREADS`.
    pub amx_threads: Option<usize>,
    /// Software-prefetch distance in bytes while streaming weights (`Some(0)`: off, `None`:
    /// 2048). `DAMASCUS_PREFETCH`.
    pub prefetch: Option<usize>,
    /// Per-op wall-time profile, printed when the backend is dropped. `DAMASCUS_PROFILE`.
    pub profile: bool,
    /// On the repacked int8 path, the Q/K/V projections multiply two-level int8 activations
    /// (the input's int8 rows plus its quantized residual: close to f32 activations, at twice
    /// their int8 work).
    /// `DAMASCUS_TWO_LEVEL`.
    pub two_level_qkv: bool,
    /// CUDA: every quantized decode GEMV (not only Q/K/V) on two-level q8 activations.
    /// `DAMASCUS_TWO_LEVEL=all`.
    pub two_level_all: bool,
    /// CUDA: a one-token pass replays a captured graph. `DAMASCUS_CUDA_GRAPHS` (0: off).
    pub cuda_graphs: bool,
    /// CUDA: prompt matmuls on the int8 MMQ kernels instead of cuBLAS bf16.
    /// `DAMASCUS_CUDA_MMQ` (1: on).
    pub cuda_mmq: bool,
    /// CUDA: prompt attention on tensor cores. `DAMASCUS_CUDA_FLASH` (0: off).
    pub cuda_flash: bool,
    /// CUDA: decode attention on the streamed kernel (`cp.async` K/V tiles for a whole GQA
    /// group, online softmax per split) for head sizes 64/128/256 instead of the split
    /// kernel. `DAMASCUS_CUDA_ATTN_V2` (0: off).
    pub cuda_attn_v2: bool,
    /// CUDA: decode batches of 2..16 tokens on the batched GEMV (one weight load per 8
    /// tokens). `DAMASCUS_CUDA_GEMV_BATCH` (0: off).
    pub cuda_gemv_batch: bool,
    /// CUDA: per-op GPU times (eager launches, no graphs), printed when the device is
    /// dropped. `DAMASCUS_CUDA_PROFILE` (1: on).
    pub cuda_profile: bool,
    /// CUDA: passes of up to this many rows (decode batches) multiply on the dp4a GEMVs —
    /// every row then gets the bits of its own one-row pass —, longer ones on the prompt GEMM
    /// (`None`: 15; clamped to 15..=64). `DAMASCUS_CUDA_GEMV_ROWS`.
    pub cuda_gemv_rows: Option<usize>,
    /// CUDA: passes of up to this many rows that reach the prompt GEMM take the int8 MMQ
    /// kernels on the quantized weights instead of cuBLAS bf16 (`None`: none).
    /// `DAMASCUS_CUDA_MMQ_ROWS`.
    pub cuda_mmq_rows: Option<usize>,
    /// CUDA: a decode batch that multiplies on cuBLAS replays a captured graph too (cuBLAS
    /// then works in a workspace of its own). `DAMASCUS_CUDA_GRAPH_GEMM` (0: off).
    pub cuda_graph_gemm: bool,
    /// CUDA (sm_90+): programmatic dependent launch, each kernel of a pass starting while the
    /// one before it drains. `DAMASCUS_CUDA_PDL` (0: off; `noprefetch`: on without
    /// `cuda_pdl_prefetch`).
    pub cuda_pdl: bool,
    /// CUDA, with `cuda_pdl`: each decode GEMV block prefetches its weight rows into L2 before
    /// it waits on the kernel before it (off with `DAMASCUS_CUDA_PDL=noprefetch`).
    pub cuda_pdl_prefetch: bool,
    /// CUDA: decode fusions (an RMSNorm feeding the two-level Q/K/V GEMV writes the second q8
    /// level itself; a one-token gate/up GEMV applies the activation). `DAMASCUS_CUDA_FUSE`
    /// (1: on).
    pub cuda_fuse: bool,
}

impl Default for KernelSettings {
    fn default() -> KernelSettings {
        KernelSettings {
            isa: None,
            gemm: true,
            file_layout_gemm: false,
            int8: true,
            repack: true,
            attn_amx: true,
            amx_int8: false,
            amx_panel_kib: None,
            amx_threads: None,
            prefetch: None,
            profile: false,
            two_level_qkv: true,
            two_level_all: false,
            cuda_graphs: true,
            cuda_mmq: false,
            cuda_flash: true,
            cuda_attn_v2: true,
            cuda_gemv_batch: true,
            cuda_profile: false,
            cuda_gemv_rows: None,
            cuda_mmq_rows: None,
            cuda_graph_gemm: true,
            cuda_pdl: true,
            cuda_pdl_prefetch: true,
            cuda_fuse: false,
        }
    }
}

/// A `DAMASCUS_*` value that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("{var}={value:?}: {expected}")]
pub struct SettingsError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What was expected.
    pub expected: String,
}

/// The process-wide part of the settings, once installed.
#[derive(Clone, Copy, Debug)]
struct Installed {
    prefetch: Option<usize>,
    amx_panel_kib: Option<usize>,
    amx_threads: Option<usize>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

impl KernelSettings {
    /// Every variable [`KernelSettings::from_vars`] reads, with what it sets.
    pub const VARS: [(&'static str, &'static str); 23] = [
        (
            "DAMASCUS_ISA",
            "kernel level: scalar, avx2, avx512, vnni, amx",
        ),
        ("DAMASCUS_GEMM", "0: prompts on per-token dot products"),
        ("DAMASCUS_GEMM_INT8", "0: prompts on the bf16-panel GEMM"),
        (
            "DAMASCUS_FILE_GEMM",
            "1: file-layout weights take the prompt GEMM (not batch-invariant)",
        ),
        ("DAMASCUS_REPACK", "0: weights stay in the file layout"),
        ("DAMASCUS_ATTN_AMX", "0: prompt attention on the f32 kernel"),
        (
            "DAMASCUS_AMX_INT8",
            "1: AMX prompts on int8 tiles (the VNNI path's bits; slower than bf16)",
        ),
        (
            "DAMASCUS_AMX_PANEL_KIB",
            "AMX GEMM weight panel per unit, KiB",
        ),
        ("DAMASCUS_AMX_THREADS", "threads taking AMX GEMM units"),
        ("DAMASCUS_PREFETCH", "prefetch distance in bytes (0: off)"),
        ("DAMASCUS_PROFILE", "1: per-op profile on stderr"),
        (
            "DAMASCUS_TWO_LEVEL",
            "0: Q/K/V projections on one-level int8 activations; all: every CUDA GEMV two-level",
        ),
        ("DAMASCUS_CUDA_GRAPHS", "0: CUDA decode without graphs"),
        ("DAMASCUS_CUDA_MMQ", "1: CUDA prompt matmuls on int8 MMQ"),
        (
            "DAMASCUS_CUDA_GEMV_ROWS",
            "CUDA passes of up to N rows on the GEMVs (15..=64, default 15)",
        ),
        (
            "DAMASCUS_CUDA_GRAPH_GEMM",
            "0: CUDA decode batches on cuBLAS without graphs",
        ),
        (
            "DAMASCUS_CUDA_MMQ_ROWS",
            "CUDA passes of 16..=N rows on int8 MMQ (default 0: cuBLAS)",
        ),
        (
            "DAMASCUS_CUDA_FLASH",
            "0: CUDA prompt attention on CUDA cores",
        ),
        (
            "DAMASCUS_CUDA_ATTN_V2",
            "0: CUDA decode attention on the split kernel (not the streamed one)",
        ),
        (
            "DAMASCUS_CUDA_GEMV_BATCH",
            "0: CUDA decode batches on one-token GEMVs",
        ),
        ("DAMASCUS_CUDA_PROFILE", "1: per-op CUDA profile on stderr"),
        (
            "DAMASCUS_CUDA_PDL",
            "0: no CUDA programmatic dependent launch (noprefetch: PDL without the GEMV weight prefetch)",
        ),
        (
            "DAMASCUS_CUDA_FUSE",
            "1: CUDA decode fusions (RMSNorm + second q8 level)",
        ),
    ];

    /// The settings given by variables `get(name)` returns (the binary passes the process
    /// environment); unset or empty variables keep the defaults.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, SettingsError> {
        let val = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let off = |k: &str| val(k).is_some_and(|v| v == "0");
        let num = |k: &'static str| -> Result<Option<usize>, SettingsError> {
            val(k)
                .map(|v| {
                    v.parse::<usize>().map_err(|_| SettingsError {
                        var: k,
                        value: v,
                        expected: "expected a whole number".into(),
                    })
                })
                .transpose()
        };
        let isa = val("DAMASCUS_ISA")
            .map(|v| {
                v.parse::<Isa>().map_err(|e| SettingsError {
                    var: "DAMASCUS_ISA",
                    value: v,
                    expected: e.to_string(),
                })
            })
            .transpose()?;
        Ok(KernelSettings {
            isa,
            gemm: !off("DAMASCUS_GEMM"),
            file_layout_gemm: val("DAMASCUS_FILE_GEMM").is_some_and(|v| v == "1"),
            int8: !off("DAMASCUS_GEMM_INT8"),
            repack: !off("DAMASCUS_REPACK"),
            attn_amx: !off("DAMASCUS_ATTN_AMX"),
            amx_int8: val("DAMASCUS_AMX_INT8").is_some_and(|v| v == "1"),
            amx_panel_kib: num("DAMASCUS_AMX_PANEL_KIB")?.filter(|&v| v > 0),
            amx_threads: num("DAMASCUS_AMX_THREADS")?.filter(|&v| v > 0),
            prefetch: num("DAMASCUS_PREFETCH")?,
            profile: val("DAMASCUS_PROFILE").is_some_and(|v| v == "1"),
            two_level_qkv: !off("DAMASCUS_TWO_LEVEL"),
            two_level_all: val("DAMASCUS_TWO_LEVEL").is_some_and(|v| v == "all"),
            cuda_graphs: !off("DAMASCUS_CUDA_GRAPHS"),
            cuda_mmq: val("DAMASCUS_CUDA_MMQ").is_some_and(|v| v == "1"),
            cuda_flash: !off("DAMASCUS_CUDA_FLASH"),
            cuda_attn_v2: !off("DAMASCUS_CUDA_ATTN_V2"),
            cuda_gemv_batch: !off("DAMASCUS_CUDA_GEMV_BATCH"),
            cuda_profile: val("DAMASCUS_CUDA_PROFILE").is_some_and(|v| v != "0"),
            cuda_gemv_rows: num("DAMASCUS_CUDA_GEMV_ROWS")?,
            cuda_mmq_rows: num("DAMASCUS_CUDA_MMQ_ROWS")?,
            cuda_graph_gemm: !off("DAMASCUS_CUDA_GRAPH_GEMM"),
            cuda_pdl: !off("DAMASCUS_CUDA_PDL"),
            cuda_pdl_prefetch: val("DAMASCUS_CUDA_PDL").is_none_or(|v| v != "noprefetch"),
            cuda_fuse: val("DAMASCUS_CUDA_FUSE").is_some_and(|v| v == "1"),
        })
    }

    /// Installs the process-wide settings (ISA level, prefetch distance, AMX knobs) before
    /// the first kernel runs. The first install wins; a later one with different values, or
    /// an ISA level this CPU lacks, is an error.
    pub fn install(&self) -> Result<(), IsaError> {
        Isa::set_override(self.isa)?;
        let want = Installed {
            prefetch: self.prefetch,
            amx_panel_kib: self.amx_panel_kib,
            amx_threads: self.amx_threads,
        };
        let got = *INSTALLED.get_or_init(|| want);
        if (got.prefetch, got.amx_panel_kib, got.amx_threads)
            != (want.prefetch, want.amx_panel_kib, want.amx_threads)
        {
            return Err(IsaError::Unavailable {
                isa: self.isa.unwrap_or(Isa::Scalar),
                missing: "a second, different set of process-wide kernel settings".into(),
            });
        }
        Ok(())
    }
}

/// The installed prefetch distance (`None`: the default).
pub(crate) fn installed_prefetch() -> Option<usize> {
    INSTALLED.get().and_then(|i| i.prefetch)
}

/// The installed AMX knobs (panel KiB, threads).
pub(crate) fn installed_amx() -> (Option<usize>, Option<usize>) {
    INSTALLED
        .get()
        .map_or((None, None), |i| (i.amx_panel_kib, i.amx_threads))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_map_onto_the_struct() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            KernelSettings::from_vars(env(&[])).unwrap(),
            KernelSettings::default()
        );
        let s = KernelSettings::from_vars(env(&[
            ("DAMASCUS_ISA", "avx2"),
            ("DAMASCUS_GEMM", "0"),
            ("DAMASCUS_REPACK", " 0 "),
            ("DAMASCUS_PREFETCH", "0"),
            ("DAMASCUS_AMX_THREADS", "8"),
            ("DAMASCUS_PROFILE", "1"),
            ("DAMASCUS_CUDA_ATTN_V2", "0"),
            ("DAMASCUS_AMX_INT8", "1"),
        ]))
        .unwrap();
        assert!(s.amx_int8);
        assert_eq!(s.isa, Some(Isa::Avx2));
        assert!(!s.gemm && s.int8 && !s.repack && s.profile && !s.cuda_attn_v2);
        assert_eq!((s.prefetch, s.amx_threads), (Some(0), Some(8)));
        assert!(s.cuda_pdl && s.cuda_pdl_prefetch);
        let s = KernelSettings::from_vars(env(&[("DAMASCUS_CUDA_PDL", "1")])).unwrap();
        assert!(s.cuda_pdl && s.cuda_pdl_prefetch);
        let s = KernelSettings::from_vars(env(&[("DAMASCUS_CUDA_PDL", "noprefetch")])).unwrap();
        assert!(s.cuda_pdl && !s.cuda_pdl_prefetch);
        let s = KernelSettings::from_vars(env(&[("DAMASCUS_CUDA_PDL", "0")])).unwrap();
        assert!(!s.cuda_pdl && !s.cuda_fuse);
        let s = KernelSettings::from_vars(env(&[("DAMASCUS_CUDA_FUSE", "1")])).unwrap();
        assert!(s.cuda_fuse);
        let e = KernelSettings::from_vars(env(&[("DAMASCUS_PREFETCH", "lots")])).unwrap_err();
        assert!(e.to_string().contains("DAMASCUS_PREFETCH"));
        assert!(KernelSettings::from_vars(env(&[("DAMASCUS_ISA", "sse9")])).is_err());
    }
}
