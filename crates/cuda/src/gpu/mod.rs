//! The device: context, stream, the NVRTC-compiled kernels and cuBLAS ([`Gpu`]), split into
//!
//! * `launch`: a typed launch struct per kernel (a wrong argument fails to compile);
//! * [`compile`]: the kernels compiled by NVRTC as one program per definition, in parallel,
//!   and cached on disk (one module per program);
//! * `buffers`: device buffers, weights, activations and the KV cache;
//! * `recorder`: the op recorder, flushes and decode graphs;
//! * `profile`: per-op GPU times (`DAMASCUS_CUDA_PROFILE=1`);
//! * `ops` and `attention`: the ops the model's backend records;
//! * `paged`: attention of a batched pass over a shared paged KV pool, and row gathers.
//!
//! Ops are not launched when called: they are *recorded* (kernel, grid, arguments) and run at
//! the next flush: [`Gpu::read`] (a host read needs the results) or [`Gpu::end`] (the end of a
//! forward pass). A one-token forward pass whose ops are flushed all at once becomes a CUDA
//! graph: the recorded list is hashed, and a list seen before replays its instantiated graph
//! instead of launching ~300 kernels one by one. Positions and token ids reach the kernels
//! through a small device `inputs` buffer written before the flush, so the same graph serves
//! every decode step of a sequence. A batched pass over the shared paged pool (`paged`) adds
//! a batch table (per-row positions and slots, block tables) to those inputs; one of decode
//! rows only is graphed the same way, one graph per batch size (its cuBLAS GEMMs included:
//! cuBLAS works in a workspace of its own, so a captured GEMM allocates nothing).
//!
//! With programmatic dependent launch on ([`Gpu::set_pdl`], sm_90+), a kernel that follows
//! another kernel and whose PTX waits on the grid before it (`PDL_WAIT()` in the kernels,
//! found by `launch::waits_on_grid` when the modules load) launches with programmatic
//! stream serialization: its blocks start while that kernel drains (decode GEMV blocks
//! prefetch their weight rows into L2 meanwhile) and wait in-kernel for its results. Stream
//! capture keeps those edges in the graphs; the graph key includes the switch.

mod attention;
mod buffers;
pub mod compile;
pub(crate) mod launch;
mod ops;
mod paged;
mod profile;
mod recorder;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};

pub use attention::{AttnParams, decode_chunk};
pub use buffers::{DevAct, DevBuf, DevKv, DevMatrix, DevVec};
pub use paged::{PagedSeq, decode_splits_bound};

use crate::error::CudaError;
use launch::KERNELS;
use profile::Profile;
use recorder::Recorder;

/// The kernel source, compiled at run time for the device's architecture ([`compile`]):
/// `damascus.cu`, then
/// `gemv.cu` (dequantization and the one-token GEMVs), `kv_quant.cu` (the cache write into a
/// q8_0 KV cache), `mmq.cu` (the int8 tensor-core prompt matmuls, which use the first file's
/// helpers),
/// `flash.cu` (the tensor-core prompt attention), `paged.cu` (the attention kernels of a
/// batched pass over the shared paged KV pool, built from the other files' device functions),
/// `gemv_batch.cu` (the GEMV of a decode batch) and `attn_decode.cu` (the streamed split-K
/// decode attention, `cp.async` tiles of K and V for a whole GQA group).
pub const SOURCE: &str = concat!(
    include_str!("../../kernels/damascus.cu"),
    include_str!("../../kernels/gemv.cu"),
    include_str!("../../kernels/kv_quant.cu"),
    include_str!("../../kernels/mmq.cu"),
    include_str!("../../kernels/flash.cu"),
    include_str!("../../kernels/paged.cu"),
    include_str!("../../kernels/gemv_batch.cu"),
    include_str!("../../kernels/attn_decode.cu")
);

/// Prompts of at least this many tokens multiply through cuBLAS (bf16 tensor cores, weights
/// dequantized to bf16 once, on first use), or with `DAMASCUS_CUDA_MMQ=1` through the int8
/// MMQ kernels on the quantized weights; shorter ones use the dp4a GEMVs.
pub const GEMM_MIN_TOKENS: usize = 16;

/// Most rows a pass may multiply on the dp4a GEMVs ([`Gpu::set_gemv_rows`]); activations keep
/// their second q8 level for this many rows.
pub const MAX_GEMV_ROWS: usize = 64;

/// Bytes of cuBLAS's workspace (NVIDIA's recommendation for Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

/// Most 32-row chunks a gate/up GEMV with the activation fused may have (rows up to 32 times
/// this; wider FFNs take the separate activation kernel).
const GLU_CHUNKS: usize = 4096;

/// Decode graphs kept per device (one per live sequence or decode batch size, in practice).
const MAX_GRAPHS: usize = 16;

fn call<E: std::fmt::Display>(op: &str) -> impl FnOnce(E) -> CudaError + '_ {
    move |e| CudaError::call(op, e)
}

/// One CUDA device with the kernels loaded. Ops are recorded under a mutex; concurrent
/// forward passes on one `Gpu` must be serialized by the caller (the backend does).
pub struct Gpu {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: Vec<CudaFunction>,
    index: HashMap<&'static str, usize>,
    blas: CudaBlas,
    /// cuBLAS's workspace (`BLAS_WORKSPACE` bytes), set on the handle so that a captured GEMM
    /// allocates nothing; `None` when cuBLAS refused it.
    blas_workspace: Option<DevBuf>,
    /// Decode batches holding cuBLAS GEMMs are graphed ([`Gpu::set_gemm_graphs`]).
    gemm_graphs: AtomicBool,
    rec: Mutex<Recorder>,
    graphs_enabled: AtomicBool,
    /// Prompt matmuls run the int8 MMQ kernels on the quantized weights
    /// instead of cuBLAS on a bf16 copy (where the format has one and the shape fits).
    mmq_enabled: AtomicBool,
    /// Decode batches of 2..GEMM_MIN_TOKENS tokens on `gemv_batch` (one weight load per 8
    /// tokens) instead of the one-token GEMV per token (on at first; [`Gpu::set_gemv_batch`]).
    gemv_batch_enabled: AtomicBool,
    /// Passes of up to this many rows multiply on the GEMVs, longer ones on the prompt GEMM
    /// (`GEMM_MIN_TOKENS - 1..=MAX_GEMV_ROWS`; [`Gpu::set_gemv_rows`]).
    gemv_rows: AtomicUsize,
    /// Passes of up to this many rows on the prompt GEMM take the int8 MMQ kernels even when
    /// `mmq_enabled` is off (0: none; [`Gpu::set_mmq_rows`]).
    mmq_rows: AtomicUsize,
    /// Prompt attention on tensor cores (`DAMASCUS_CUDA_FLASH=0` turns it off).
    flash_enabled: AtomicBool,
    /// GEMVs of matrices marked [`DevMatrix::two_level`] multiply two-level q8 activations
    /// (on unless [`Gpu::set_two_level_qkv`] turns it off).
    two_level_qkv: AtomicBool,
    /// Decode fusions ([`Gpu::set_fuse`]; off at first): an RMSNorm whose output a two-level
    /// GEMV takes next writes the second q8 level itself; a gate/up GEMV applies the
    /// activation.
    fuse: AtomicBool,
    /// `[GLU_CHUNKS]` u32, zero between passes: the per-32-row chunk counters of a gate/up
    /// GEMV with its activation fused (each chunk's last block resets its counter).
    glu_counts: DevBuf,
    /// The device gave every flash kernel its shared memory.
    flash_ok: bool,
    /// Decode attention on the streamed kernel (`attn_decode_*`; off at first,
    /// [`Gpu::set_attn_v2`]).
    attn_v2_enabled: AtomicBool,
    /// The device gave every streamed decode kernel its shared memory.
    attn_v2_ok: bool,
    /// Kernels launch with programmatic stream serialization (PDL) where they may
    /// ([`Gpu::set_pdl`]; off at first).
    pdl_enabled: AtomicBool,
    /// GEMV blocks prefetch their weight rows into L2 before they wait on the kernel before
    /// (only while PDL is on; [`Gpu::set_pdl`]).
    pdl_prefetch: AtomicBool,
    /// Per kernel of [`KERNELS`]: its PTX waits on the grid before it (`PDL_WAIT()`), so it
    /// may be launched with PDL. All false below sm_90.
    pdl_ok: Vec<bool>,
    /// Per-op GPU times ([`Gpu::open_with`]), printed when the device is dropped.
    profile: Option<Mutex<Profile>>,
    /// Device name.
    pub name: String,
    /// Compute capability.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_mem: usize,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let p = p.lock().unwrap_or_else(|p| p.into_inner());
            eprint!("{}", p.report());
        }
    }
}

impl Gpu {
    /// Opens device `ordinal`: checks that the driver, NVRTC and cuBLAS libraries load,
    /// creates a context and stream, and compiles (or loads from the disk cache) the kernels.
    /// Any missing piece is [`CudaError::NoDevice`]; this never panics.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        Self::open_with(ordinal, false)
    }

    /// [`Gpu::open`], with per-op GPU times when `profile` (eager launches, no graphs; the
    /// table is printed when the device is dropped).
    pub fn open_with(ordinal: usize, profile: bool) -> Result<Arc<Gpu>, CudaError> {
        match std::panic::catch_unwind(|| Self::open_inner(ordinal, profile)) {
            Ok(r) => r,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a CUDA library call panicked".into());
                Err(CudaError::NoDevice(msg))
            }
        }
    }

    fn open_inner(ordinal: usize, profile: bool) -> Result<Arc<Gpu>, CudaError> {
        // SAFETY: these only try to dlopen the libraries; no CUDA state is touched.
        let (drv, rtc, blas) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nvrtc::sys::is_culib_present(),
                cudarc::cublas::sys::is_culib_present(),
            )
        };
        if !drv {
            return Err(CudaError::NoDevice(
                "the NVIDIA driver library (libcuda.so.1) is not installed".into(),
            ));
        }
        if !rtc {
            return Err(CudaError::NoDevice(
                "NVRTC (libnvrtc.so.13) was not found: install the CUDA 13 toolkit or add its \
                 lib directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        if !blas {
            return Err(CudaError::NoDevice(
                "cuBLAS (libcublas.so.13) was not found: install the CUDA 13 toolkit or add \
                 its lib directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| CudaError::NoDevice(format!("cuInit/cuDeviceGetCount failed: {e}")))?;
        if count <= 0 || ordinal >= count as usize {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} requested, the driver reports {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(call("creating a context"))?;
        // SAFETY: one stream does all the work, so cudarc's cross-stream event tracking is
        // not needed; it is turned off before any allocation is made.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(call("creating a stream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(call("creating a cuBLAS handle"))?;
        let blas_workspace = {
            let ws = Self::alloc_on(&stream, BLAS_WORKSPACE)?;
            // SAFETY: the handle is live, and `ws` (BLAS_WORKSPACE bytes on this device) lives
            // as long as the `Gpu` that owns both; the handle's stream is never reset (that
            // would drop the workspace setting).
            let status = unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ws.ptr.0 as *mut std::ffi::c_void,
                    BLAS_WORKSPACE,
                )
            };
            (status == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(ws)
        };
        let cc = ctx
            .compute_capability()
            .map_err(call("reading the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let total_mem = ctx.total_mem().unwrap_or(0);
        let arch: &'static str = Box::leak(format!("compute_{}{}", cc.0, cc.1).into_boxed_str());
        let units = compile::ptx_units(arch)?;
        // PDL needs sm_90 (the kernels compile `PDL_WAIT()` to nothing below it).
        let mut waiting = std::collections::HashSet::new();
        let mut home = HashMap::new(); // kernel name -> its program's module
        let mut modules = Vec::with_capacity(units.len());
        for ptx in &units {
            for (name, body) in compile::entry_bodies(ptx) {
                home.insert(name, modules.len());
                if launch::waits_on_grid(body) {
                    waiting.insert(name);
                }
            }
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx.as_str()))
                .map_err(call("loading the kernels"))?;
            modules.push(module);
        }
        let pdl_ok: Vec<bool> = KERNELS
            .iter()
            .map(|k| cc.0 >= 9 && waiting.contains(k))
            .collect();
        drop(waiting);
        let mut funcs = Vec::with_capacity(KERNELS.len());
        let mut index = HashMap::new();
        let mut flash_ok = true;
        let mut attn_v2_ok = true;
        for (i, &k) in KERNELS.iter().enumerate() {
            let module = home.get(k).and_then(|&m| modules.get(m)).ok_or_else(|| {
                CudaError::Compile(format!("kernel {k} is in none of the compiled programs"))
            })?;
            let f = module.load_function(k).map_err(call(k))?;
            if let Some(d) = k.strip_prefix("attn_flash_") {
                // A device that cannot give the tiles their shared memory runs the CUDA-core
                // prompt attention instead.
                let smem = attention::flash_kernel_head_size(d).map_or(0, attention::flash_smem);
                flash_ok &= f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .is_ok();
            }
            if let Some(d) = k.strip_prefix("attn_decode_") {
                // Past 48 KiB of dynamic shared memory only when the kernel asks for it; a
                // device that refuses keeps the split kernel for decode.
                let d = d.trim_start_matches("paged_");
                let smem = d.parse().map_or(0, attention::attn_decode_smem);
                attn_v2_ok &= f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .is_ok();
            }
            funcs.push(f);
            index.insert(k, i);
        }
        let inputs = Self::alloc_on(&stream, 4 * 4096)?;
        let glu_counts = Self::alloc_on(&stream, 4 * GLU_CHUNKS)?;
        // Defaults; the backend applies its settings through the setters.
        let graphs_enabled = !profile;
        let mmq_enabled = false;
        let gemv_batch_enabled = true;
        let flash_enabled = flash_ok;
        Ok(Arc::new(Gpu {
            _ctx: ctx,
            stream,
            funcs,
            index,
            gemm_graphs: AtomicBool::new(graphs_enabled && blas_workspace.is_some()),
            blas,
            blas_workspace,
            rec: Mutex::new(Recorder::new(inputs)),
            graphs_enabled: AtomicBool::new(graphs_enabled),
            mmq_enabled: AtomicBool::new(mmq_enabled),
            gemv_batch_enabled: AtomicBool::new(gemv_batch_enabled),
            gemv_rows: AtomicUsize::new(GEMM_MIN_TOKENS - 1),
            mmq_rows: AtomicUsize::new(0),
            flash_enabled: AtomicBool::new(flash_enabled),
            two_level_qkv: AtomicBool::new(true),
            fuse: AtomicBool::new(false),
            glu_counts,
            flash_ok,
            attn_v2_enabled: AtomicBool::new(false),
            attn_v2_ok,
            pdl_enabled: AtomicBool::new(false),
            pdl_prefetch: AtomicBool::new(false),
            pdl_ok,
            profile: profile.then(|| Mutex::new(Profile::default())),
            name,
            compute_capability: cc,
            total_mem,
        }))
    }
}
