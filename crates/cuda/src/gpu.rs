//! The device: context, stream, the NVRTC-compiled kernels, cuBLAS, and the op recorder.
//!
//! Ops are not launched when called: they are *recorded* (kernel, grid, arguments) and run at
//! the next flush: [`Gpu::read`] (a host read needs the results) or [`Gpu::end`] (the end of a
//! forward pass). A one-token forward pass whose ops are flushed all at once becomes a CUDA
//! graph: the recorded list is hashed, and a list seen before replays its instantiated graph
//! instead of launching ~300 kernels one by one. Positions and token ids reach the kernels
//! through a small device `inputs` buffer written before the flush, so the same graph serves
//! every decode step of a sequence.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr};
use cudarc::driver::{result, sys};

use crate::error::CudaError;
use crate::layout::{self, Format, Packed};

/// The kernel source, compiled at run time for the device's architecture: `damascus.cu`, then
/// `mmq.cu` (the int8 tensor-core prompt matmuls, which use the first file's helpers).
pub const SOURCE: &str = concat!(
    include_str!("../kernels/damascus.cu"),
    include_str!("../kernels/mmq.cu")
);

/// Prompts of at least this many tokens multiply through cuBLAS (bf16 tensor cores, weights
/// dequantized to bf16 once, on first use), or with `DAMASCUS_CUDA_MMQ=1` through the int8
/// MMQ kernels on the quantized weights; shorter ones use the dp4a GEMVs.
pub const GEMM_MIN_TOKENS: usize = 16;

/// Positions per attention split (the kernel's `ATT_CHUNK`).
const ATT_CHUNK: usize = 32;
/// Threads of an attention split block (the kernel's `ATT_THREADS`).
const ATT_THREADS: u32 = 256;
/// Warps per GEMV block.
const GEMV_WARPS: usize = 4;
/// Matrices one GEMV launch takes.
const GEMV_MATS: usize = 3;
/// Largest GQA group the attention kernels handle (the kernel's `MAX_GROUP`).
const MAX_GROUP: usize = 8;
/// Decode graphs kept per device (one per live sequence, in practice).
const MAX_GRAPHS: usize = 16;

const KERNELS: &[&str] = &[
    "quantize_q8",
    "rms_norm",
    "swiglu",
    "add",
    "to_bf16",
    "rope",
    "rope_kv",
    "gemv_q4k",
    "gemv_q41",
    "gemv_q80",
    "gemv_q50",
    "gemv_q6k",
    "gemv_f16",
    "dequant_q4k",
    "dequant_q41",
    "dequant_q80",
    "dequant_q50",
    "dequant_q6k",
    "dequant_f16",
    "attn_split_64",
    "attn_combine_64",
    "attn_prefill_64",
    "attn_split_128",
    "attn_combine_128",
    "attn_prefill_128",
    "mmq_q4k",
    "mmq_q41",
    "mmq_q80",
    "mmq_q50",
    "mmq_q6k",
    "argmax_rows",
];

/// `gemv_<format>` and `dequant_<format>`, indexed by `Format as usize` (the kernel's `FMT_*`).
const GEMV: [&str; 6] = [
    "gemv_q4k", "gemv_q41", "gemv_q80", "gemv_q50", "gemv_q6k", "gemv_f16",
];
const DEQUANT: [&str; 6] = [
    "dequant_q4k",
    "dequant_q41",
    "dequant_q80",
    "dequant_q50",
    "dequant_q6k",
    "dequant_f16",
];

/// `mmq_<format>` (int8 tensor-core prompt matmul on the quantized weights), indexed like
/// `GEMV`; f16 has none.
const MMQ: [Option<&str>; 6] = [
    Some("mmq_q4k"),
    Some("mmq_q41"),
    Some("mmq_q80"),
    Some("mmq_q50"),
    Some("mmq_q6k"),
    None,
];
/// Weight rows and tokens of one MMQ block's output tile (the kernel's `MMQ_ROWS`, `MMQ_TOK`).
const MMQ_ROWS: usize = 64;
const MMQ_TOK: usize = 64;
/// Threads of an MMQ block (the kernel's `MMQ_THREADS`).
const MMQ_THREADS: u32 = 128;

fn call<E: std::fmt::Display>(op: &str) -> impl FnOnce(E) -> CudaError + '_ {
    move |e| CudaError::call(op, e)
}

/// A device allocation (bytes), freed on drop.
pub struct DevBuf {
    _slice: Option<CudaSlice<u8>>,
    ptr: u64,
    len: usize,
}

impl DevBuf {
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A weight matrix `[rows, cols]` resident on the device in its [`Format`].
pub struct DevMatrix {
    /// Layout.
    pub format: Format,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    buf: DevBuf,
    off1: u64,
    off2: u64,
    /// `[rows, cols]` bf16 copy for the prompt GEMM, made on first use.
    bf16: Mutex<Option<DevBuf>>,
}

impl DevMatrix {
    /// Device bytes held (the quantized copy, plus the bf16 one once made).
    pub fn device_bytes(&self) -> usize {
        let bf = self
            .bf16
            .lock()
            .map(|b| b.as_ref().map_or(0, DevBuf::len))
            .unwrap_or(0);
        self.buf.len + bf
    }
}

/// A `[n]` f32 vector on the device.
pub struct DevVec {
    /// Elements.
    pub n: usize,
    buf: DevBuf,
}

/// An activation `[n_tokens, width]` f32 on the device, with its q8 shadow (`q` int8
/// `[n_tokens, width]`, `ds` float2 `[n_tokens, width / 32]`) and, for prompts, a bf16 copy
/// for the GEMM.
pub struct DevAct {
    /// Tokens (rows).
    pub n: usize,
    /// Width (columns).
    pub width: usize,
    x: DevBuf,
    q: Option<(DevBuf, DevBuf)>,
    bf: Option<DevBuf>,
    /// The q8 shadow holds the current contents (its producer wrote both).
    q_fresh: AtomicBool,
}

/// The KV cache of every layer (f16, head-major `[layer][n_kv][n_ctx][head_dim]`) and the
/// decode attention's split partials.
pub struct DevKv {
    /// Layers.
    pub n_layer: usize,
    /// Positions.
    pub n_ctx: usize,
    /// KV heads.
    pub n_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Query heads (sizes the partials).
    pub n_head: usize,
    k: DevBuf,
    v: DevBuf,
    n_split: usize,
    part_o: DevBuf,  // [n_head][n_split][head_dim] f32
    part_ml: DevBuf, // [n_head][n_split] float2
}

/// Most arguments any kernel in `KERNELS` takes.
const MAX_ARGS: usize = 20;

/// A kernel's arguments, one 8-byte slot each (no allocation per recorded launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Args {
    n: usize,
    v: [u64; MAX_ARGS],
}

impl Args {
    fn new(args: &[u64]) -> Self {
        let mut v = [0; MAX_ARGS];
        v[..args.len()].copy_from_slice(args);
        Args { n: args.len(), v }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Op {
    Launch {
        f: usize,
        grid: [u32; 3],
        block: [u32; 3],
        args: Args,
    },
    /// `C[n, m] = B[n, k] · A[m, k]ᵀ` (row-major), A and B bf16, C f32; `acc` adds into C.
    Gemm {
        acc: bool,
        m: i32,
        n: i32,
        k: i32,
        a: u64,
        b: u64,
        c: u64,
    },
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
}

/// An instantiated graph.
struct Graph(CudaGraph);
// SAFETY: a CUgraphExec may be launched from any thread; it is only touched under the
// recorder's mutex.
unsafe impl Send for Graph {}

struct Recorder {
    ops: Vec<Op>,
    n_tokens: usize,
    /// `[pos0, ids...]`, written to `inputs` before the next flush.
    inputs_host: Vec<u32>,
    inputs_dirty: bool,
    inputs: DevBuf,
    /// `[rows]` u32: where `argmax` writes its picks (grown on demand).
    picks: Option<DevBuf>,
    /// Part of this forward pass already ran (a host read in the middle): no graph.
    flushed_mid: bool,
    graphs: HashMap<u64, Graph>,
}

/// One CUDA device with the kernels loaded. Ops are recorded under a mutex; concurrent
/// forward passes on one `Gpu` must be serialized by the caller (the backend does).
pub struct Gpu {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    funcs: Vec<CudaFunction>,
    index: HashMap<&'static str, usize>,
    blas: CudaBlas,
    rec: Mutex<Recorder>,
    graphs_enabled: AtomicBool,
    /// `DAMASCUS_CUDA_MMQ=1`: prompt matmuls run the int8 MMQ kernels on the quantized weights
    /// instead of cuBLAS on a bf16 copy (where the format has one and the shape fits).
    mmq_enabled: AtomicBool,
    /// `DAMASCUS_CUDA_PROFILE=1`: per-op GPU times, printed when the device is dropped.
    profile: Option<Mutex<Profile>>,
    /// Device name.
    pub name: String,
    /// Compute capability.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_mem: usize,
}

/// Per-op GPU time (dev tool): each op of an eager flush is bracketed by events; totals are
/// keyed by kernel name and grid, so the GEMVs of different matrices show apart.
#[derive(Default)]
struct Profile {
    /// key -> (calls, milliseconds)
    ops: HashMap<String, (u64, f64)>,
    passes: u64,
}

impl Profile {
    fn report(&self) -> String {
        let total: f64 = self.ops.values().map(|v| v.1).sum();
        let mut rows: Vec<_> = self.ops.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        let passes = self.passes.max(1) as f64;
        let mut out = format!(
            "damascus cuda profile: {} flushes, {:.3} ms GPU per flush\n{:>9} {:>8} {:>9} {:>6}  op\n",
            self.passes,
            total / passes,
            "us/flush",
            "calls",
            "us/call",
            "%"
        );
        for (k, (n, ms)) in rows {
            out += &format!(
                "{:>9.1} {:>8} {:>9.2} {:>5.1}%  {k}\n",
                ms * 1e3 / passes,
                n,
                ms * 1e3 / *n as f64,
                100.0 * ms / total.max(1e-9)
            );
        }
        out
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let p = p.lock().unwrap_or_else(|p| p.into_inner());
            eprint!("{}", p.report());
        }
    }
}

fn cache_path(arch: &str) -> Option<PathBuf> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(SOURCE.as_bytes());
    h.update(arch.as_bytes());
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints; NVRTC was found loadable before this runs.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    h.update(format!("nvrtc {major}.{minor}").as_bytes());
    let hex: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = damascus_hub::cache_dir().ok()?.join("cuda");
    Some(dir.join(format!("damascus-{arch}-{hex}.ptx")))
}

/// PTX for `arch`, from the disk cache or NVRTC.
fn ptx_for(arch: &'static str) -> Result<String, CudaError> {
    let path = cache_path(arch);
    if let Some(p) = &path
        && let Ok(s) = std::fs::read_to_string(p)
    {
        return Ok(s);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            CudaError::Compile(log.to_string_lossy().into_owned())
        }
        other => CudaError::Compile(format!("{other:?}")),
    })?;
    let src = ptx.to_src();
    if let Some(p) = &path
        && let Some(dir) = p.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        // Write then rename: a concurrent reader never sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &src).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(src)
}

fn i32_dim(what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v)
        .map_err(|_| CudaError::Shape(format!("{what} = {v} does not fit a kernel int")))
}

fn div_ceil_u32(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

impl Gpu {
    /// Opens device `ordinal`: checks that the driver, NVRTC and cuBLAS libraries load,
    /// creates a context and stream, and compiles (or loads from the disk cache) the kernels.
    /// Any missing piece is [`CudaError::NoDevice`]; this never panics.
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        match std::panic::catch_unwind(|| Self::open_inner(ordinal)) {
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

    fn open_inner(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
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
        let cc = ctx
            .compute_capability()
            .map_err(call("reading the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let total_mem = ctx.total_mem().unwrap_or(0);
        let arch: &'static str = Box::leak(format!("compute_{}{}", cc.0, cc.1).into_boxed_str());
        let ptx = ptx_for(arch)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(call("loading the kernels"))?;
        let mut funcs = Vec::with_capacity(KERNELS.len());
        let mut index = HashMap::new();
        for (i, &k) in KERNELS.iter().enumerate() {
            funcs.push(module.load_function(k).map_err(call(k))?);
            index.insert(k, i);
        }
        let inputs = Self::alloc_on(&stream, 4 * 4096)?;
        let profile = std::env::var("DAMASCUS_CUDA_PROFILE").is_ok_and(|v| v != "0");
        let graphs_enabled =
            !profile && std::env::var("DAMASCUS_CUDA_GRAPHS").map_or(true, |v| v != "0");
        let mmq_enabled = std::env::var("DAMASCUS_CUDA_MMQ").is_ok_and(|v| v == "1");
        Ok(Arc::new(Gpu {
            _ctx: ctx,
            stream,
            funcs,
            index,
            blas,
            rec: Mutex::new(Recorder {
                ops: Vec::new(),
                n_tokens: 0,
                inputs_host: Vec::new(),
                inputs_dirty: false,
                inputs,
                picks: None,
                flushed_mid: false,
                graphs: HashMap::new(),
            }),
            graphs_enabled: AtomicBool::new(graphs_enabled),
            mmq_enabled: AtomicBool::new(mmq_enabled),
            profile: profile.then(|| Mutex::new(Profile::default())),
            name,
            compute_capability: cc,
            total_mem,
        }))
    }

    fn alloc_on(stream: &Arc<CudaStream>, bytes: usize) -> Result<DevBuf, CudaError> {
        if bytes == 0 {
            return Ok(DevBuf {
                _slice: None,
                ptr: 0,
                len: 0,
            });
        }
        let slice = stream
            .alloc_zeros::<u8>(bytes)
            .map_err(call(format!("allocating {bytes} bytes").as_str()))?;
        let ptr = {
            let (p, _sync) = slice.device_ptr(stream);
            p
        };
        Ok(DevBuf {
            _slice: Some(slice),
            ptr,
            len: bytes,
        })
    }

    /// A zeroed device buffer of `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        Self::alloc_on(&self.stream, bytes)
    }

    /// Copies host bytes into a new device buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<DevBuf, CudaError> {
        let buf = self.alloc(bytes.len())?;
        if !bytes.is_empty() {
            // SAFETY: `buf` holds `bytes.len()` bytes; the copy is synchronous with respect to
            // the host buffer (pageable memory is staged before the call returns).
            unsafe { result::memcpy_htod_async(buf.ptr, bytes, self.stream.cu_stream()) }
                .map_err(call("uploading"))?;
        }
        Ok(buf)
    }

    /// Uploads a matrix (`dtype` rows of `cols`, GGUF bytes) in its device layout.
    pub fn upload_matrix(
        &self,
        dtype: damascus_gguf::GgmlType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<DevMatrix, CudaError> {
        let p = layout::pack(dtype, bytes, rows, cols)?;
        self.upload_packed(&p)
    }

    /// Uploads an already packed matrix.
    pub fn upload_packed(&self, p: &Packed) -> Result<DevMatrix, CudaError> {
        i32_dim("rows", p.rows)?;
        i32_dim("cols", p.cols)?;
        Ok(DevMatrix {
            format: p.format,
            rows: p.rows,
            cols: p.cols,
            buf: self.upload(&p.bytes)?,
            off1: p.off1 as u64,
            off2: p.off2 as u64,
            bf16: Mutex::new(None),
        })
    }

    /// Uploads an f32 vector.
    pub fn upload_f32(&self, v: &[f32]) -> Result<DevVec, CudaError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(DevVec {
            n: v.len(),
            buf: self.upload(&bytes)?,
        })
    }

    /// A new activation `[n, width]`.
    pub fn act(&self, n: usize, width: usize) -> Result<DevAct, CudaError> {
        i32_dim("activation elements", n * width)?;
        let q = if width.is_multiple_of(32) {
            Some((self.alloc(n * width)?, self.alloc(n * width / 32 * 8)?))
        } else {
            None
        };
        let bf = if n >= GEMM_MIN_TOKENS {
            Some(self.alloc(n * width * 2)?)
        } else {
            None
        };
        Ok(DevAct {
            n,
            width,
            x: self.alloc(n * width * 4)?,
            q,
            bf,
            q_fresh: AtomicBool::new(false),
        })
    }

    /// A new KV cache.
    pub fn kv(
        &self,
        n_layer: usize,
        n_ctx: usize,
        n_kv: usize,
        head_dim: usize,
        n_head: usize,
    ) -> Result<DevKv, CudaError> {
        if head_dim != 64 && head_dim != 128 {
            return Err(CudaError::Shape(format!(
                "CUDA attention supports head_dim 64 and 128, not {head_dim}"
            )));
        }
        if n_kv == 0 || !n_head.is_multiple_of(n_kv) || n_head / n_kv > MAX_GROUP {
            return Err(CudaError::Shape(format!(
                "CUDA attention needs n_head ({n_head}) to be 1..={MAX_GROUP} times n_head_kv ({n_kv})"
            )));
        }
        let per = n_layer * n_kv * n_ctx * head_dim * 2;
        i32_dim("cache positions", n_ctx)?;
        let n_split = n_ctx.div_ceil(ATT_CHUNK);
        Ok(DevKv {
            n_layer,
            n_ctx,
            n_kv,
            head_dim,
            n_head,
            k: self.alloc(per)?,
            v: self.alloc(per)?,
            n_split,
            part_o: self.alloc(n_head * n_split * head_dim * 4)?,
            part_ml: self.alloc(n_head * n_split * 8)?,
        })
    }

    fn rec(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, name: &str, grid: [u32; 3], block: [u32; 3], args: &[u64]) {
        let f = self.index[name];
        let args = Args::new(args);
        self.rec().ops.push(Op::Launch {
            f,
            grid,
            block,
            args,
        });
    }

    /// Records the `dequant_<format>` kernel: `n_out` rows of `w` (rows `ids[r]` when `ids` is
    /// non-zero, else `0..n_out`) into `out_f32` and/or `out_bf16` (0 = not written).
    fn push_dequant(&self, w: &DevMatrix, n_out: usize, ids: u64, out_f32: u64, out_bf16: u64) {
        self.push(
            DEQUANT[w.format as usize],
            [n_out as u32, 1, 1],
            [128, 1, 1],
            &[
                w.buf.ptr,
                w.off1,
                w.off2,
                w.rows as u64,
                w.cols as u64,
                ids,
                out_f32,
                out_bf16,
            ],
        );
    }

    /// Starts a forward pass of `n_tokens` tokens at position `pos0`.
    pub fn begin(&self, n_tokens: usize, pos0: usize) -> Result<(), CudaError> {
        let mut r = self.rec();
        let pos = u32::try_from(pos0).map_err(|_| CudaError::Shape(format!("position {pos0}")))?;
        if r.inputs.len < 4 * (n_tokens + 1) {
            let bytes = 4 * (n_tokens + 1).next_power_of_two();
            r.inputs = self.alloc(bytes)?;
            // Graphs captured the old buffer's address.
            r.graphs.clear();
        }
        r.ops.clear();
        r.n_tokens = n_tokens;
        r.flushed_mid = false;
        r.inputs_host.clear();
        r.inputs_host.push(pos);
        r.inputs_dirty = true;
        Ok(())
    }

    /// Turns decode graphs on or off (`DAMASCUS_CUDA_GRAPHS=0` starts with them off).
    pub fn set_graphs(&self, on: bool) {
        self.graphs_enabled.store(on, Ordering::Relaxed);
    }

    /// Turns the int8 MMQ prompt matmuls on or off (`DAMASCUS_CUDA_MMQ=1` starts with them on).
    pub fn set_mmq(&self, on: bool) {
        self.mmq_enabled.store(on, Ordering::Relaxed);
    }

    /// Ends a forward pass: runs what was recorded (as a graph when it can).
    pub fn end(&self) -> Result<(), CudaError> {
        let mut r = self.rec();
        self.flush(&mut r, true)
    }

    fn flush(&self, r: &mut Recorder, last: bool) -> Result<(), CudaError> {
        if r.inputs_dirty {
            // SAFETY: `inputs` holds at least `4 * (n_tokens + 1)` bytes (see `begin`) and
            // `inputs_host` at most `n_tokens + 1` values (`embed` checks).
            unsafe {
                result::memcpy_htod_async(r.inputs.ptr, &r.inputs_host, self.stream.cu_stream())
            }
            .map_err(call("uploading positions and token ids"))?;
            r.inputs_dirty = false;
        }
        if r.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut r.ops);
        let graphable = self.graphs_enabled.load(Ordering::Relaxed)
            && last
            && !r.flushed_mid
            && r.n_tokens == 1
            && !ops.iter().any(|o| matches!(o, Op::Gemm { .. }));
        if !last {
            r.flushed_mid = true;
        }
        if let Some(p) = &self.profile {
            return self.run_profiled(&ops, p);
        }
        if !graphable {
            return ops.iter().try_for_each(|o| self.run_op(o));
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        ops.hash(&mut h);
        let key = h.finish();
        if !r.graphs.contains_key(&key) {
            if r.graphs.len() >= MAX_GRAPHS {
                r.graphs.clear();
            }
            let g = self.capture(&ops)?;
            r.graphs.insert(key, Graph(g));
        }
        r.graphs[&key]
            .0
            .launch()
            .map_err(call("launching the decode graph"))
    }

    fn run_profiled(&self, ops: &[Op], p: &Mutex<Profile>) -> Result<(), CudaError> {
        let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = |what| self.stream.record_event(timed).map_err(call(what));
        let mut marks = vec![ev("recording a profile event")?];
        for o in ops {
            self.run_op(o)?;
            marks.push(ev("recording a profile event")?);
        }
        let mut p = p.lock().unwrap_or_else(|p| p.into_inner());
        p.passes += 1;
        for (o, w) in ops.iter().zip(marks.windows(2)) {
            let ms = w[0]
                .elapsed_ms(&w[1])
                .map_err(call("reading a profile event"))?;
            let key = match o {
                Op::Launch { f, grid, .. } => {
                    format!("{} [{}x{}]", KERNELS[*f], grid[0], grid[1])
                }
                Op::Gemm { m, n, k, .. } => format!("gemm m{m} n{n} k{k}"),
                Op::Copy { bytes, .. } => format!("copy {bytes} B"),
            };
            let e = p.ops.entry(key).or_default();
            e.0 += 1;
            e.1 += f64::from(ms);
        }
        Ok(())
    }

    fn capture(&self, ops: &[Op]) -> Result<CudaGraph, CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(call("starting graph capture"))?;
        let recorded = ops.iter().try_for_each(|o| self.run_op(o));
        let ended = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(call("ending graph capture"));
        recorded?;
        ended?.ok_or_else(|| CudaError::call("graph capture", "captured nothing"))
    }

    fn run_op(&self, op: &Op) -> Result<(), CudaError> {
        let s = self.stream.cu_stream();
        match op {
            Op::Launch {
                f,
                grid,
                block,
                args,
            } => {
                let mut slots = args.v;
                let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
                for (p, a) in params.iter_mut().zip(slots.iter_mut()) {
                    *p = a as *mut u64 as *mut c_void;
                }
                // SAFETY: every kernel in KERNELS takes only pointers, 64-bit offsets, ints
                // and floats; each argument sits in its own 8-byte slot whose low bytes hold
                // the value (little-endian), so the driver reads the declared size from each.
                // The pointers come from live `DevBuf`s whose sizes the recording method
                // checked against the kernel's indexing.
                unsafe {
                    result::launch_kernel(
                        self.funcs[*f].cu_function(),
                        (grid[0], grid[1], grid[2]),
                        (block[0], block[1], block[2]),
                        0,
                        s,
                        &mut params[..args.n],
                    )
                }
                .map_err(call(KERNELS[*f]))
            }
            Op::Gemm {
                acc,
                m,
                n,
                k,
                a,
                b,
                c,
            } => {
                use cudarc::cublas::sys::{
                    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
                };
                let (alpha, beta) = (1.0f32, if *acc { 1.0f32 } else { 0.0 });
                // SAFETY: A is [m, k] bf16, B [n, k] bf16 and C [n, m] f32 device buffers
                // (checked by `matmul`); column-major, C = Aᵀ·B with lda = ldb = k, ldc = m.
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        *self.blas.handle(),
                        cublasOperation_t::CUBLAS_OP_T,
                        cublasOperation_t::CUBLAS_OP_N,
                        *m,
                        *n,
                        *k,
                        &alpha as *const f32 as *const c_void,
                        *a as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        *k,
                        *b as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        *k,
                        &beta as *const f32 as *const c_void,
                        *c as *mut c_void,
                        cudaDataType::CUDA_R_32F,
                        *m,
                        cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(call("cublasGemmEx"))
            }
            Op::Copy { dst, src, bytes } => {
                // SAFETY: both ranges lie inside live buffers (checked by `copy_row`).
                unsafe { result::memcpy_dtod_async(*dst, *src, *bytes, s) }
                    .map_err(call("copying a row"))
            }
        }
    }

    /// Waits for the device and copies `x` back as f32 `[n, width]`.
    pub fn read(&self, x: &DevAct) -> Result<Vec<f32>, CudaError> {
        let mut r = self.rec();
        self.flush(&mut r, false)?;
        drop(r);
        let mut out = vec![0f32; x.n * x.width];
        // SAFETY: `x.x` holds `n * width` f32; the stream is synchronized before `out` is read.
        unsafe { result::memcpy_dtoh_async(&mut out, x.x.ptr, self.stream.cu_stream()) }
            .map_err(call("reading back"))?;
        self.stream.synchronize().map_err(call("synchronizing"))?;
        Ok(out)
    }

    /// The index of the largest value of every row of `x` `[n, width]` (NaN never wins, ties
    /// go to the lowest index), computed on the device: only `n` ids come back.
    pub fn argmax(&self, x: &DevAct) -> Result<Vec<u32>, CudaError> {
        if x.n == 0 || x.width == 0 || i32::try_from(x.width).is_err() {
            return Err(CudaError::Shape(format!(
                "argmax of [{}, {}]",
                x.n, x.width
            )));
        }
        let mut r = self.rec();
        if r.picks.as_ref().is_none_or(|b| b.len < 4 * x.n) {
            r.picks = Some(self.alloc(4 * x.n.next_power_of_two())?);
        }
        let picks = r.picks.as_ref().map_or(0, |b| b.ptr);
        drop(r);
        self.push(
            "argmax_rows",
            [x.n as u32, 1, 1],
            [1024, 1, 1],
            &[x.x.ptr, x.width as u64, picks],
        );
        let mut r = self.rec();
        self.flush(&mut r, false)?;
        drop(r);
        let mut out = vec![0u32; x.n];
        // SAFETY: `picks` holds at least `n` u32; the stream is synchronized before `out` is
        // read.
        unsafe { result::memcpy_dtoh_async(&mut out, picks, self.stream.cu_stream()) }
            .map_err(call("reading the picks back"))?;
        self.stream.synchronize().map_err(call("synchronizing"))?;
        Ok(out)
    }

    /// Waits for everything recorded so far.
    pub fn sync(&self) -> Result<(), CudaError> {
        let mut r = self.rec();
        self.flush(&mut r, false)?;
        drop(r);
        self.stream.synchronize().map_err(call("synchronizing"))
    }

    // -----------------------------------------------------------------------------------
    // Ops. Each checks shapes, then records.

    fn same_shape(a: &DevAct, b: &DevAct, op: &str) -> Result<(), CudaError> {
        if a.n != b.n || a.width != b.width {
            return Err(CudaError::Shape(format!(
                "{op}: [{}, {}] vs [{}, {}]",
                a.n, a.width, b.n, b.width
            )));
        }
        Ok(())
    }

    /// `out[t] = table[ids[t]]` (dequantized); `out` `[ids.len(), table.cols]`.
    pub fn embed(&self, table: &DevMatrix, ids: &[u32], out: &DevAct) -> Result<(), CudaError> {
        if out.n != ids.len() || out.width != table.cols {
            return Err(CudaError::Shape(format!(
                "embed: {} ids of width {} into [{}, {}]",
                ids.len(),
                table.cols,
                out.n,
                out.width
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(CudaError::Shape(format!(
                "embed: token id {id} out of range for {} rows",
                table.rows
            )));
        }
        let ids_ptr = {
            let mut r = self.rec();
            if r.n_tokens != ids.len() || r.inputs_host.len() != 1 {
                return Err(CudaError::Shape(
                    "embed: call begin(n_tokens, pos0) first, once per forward pass".into(),
                ));
            }
            r.inputs_host.extend_from_slice(ids);
            r.inputs_dirty = true;
            r.inputs.ptr + 4
        };
        self.push_dequant(table, ids.len(), ids_ptr, out.x.ptr, 0);
        out.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// `out = rms_norm(x) * w` (and out's q8 shadow).
    pub fn rms_norm(
        &self,
        x: &DevAct,
        w: &DevVec,
        eps: f32,
        out: &DevAct,
    ) -> Result<(), CudaError> {
        Self::same_shape(x, out, "rms_norm")?;
        if w.n != x.width {
            return Err(CudaError::Shape(format!(
                "rms_norm: weight of {} for width {}",
                w.n, x.width
            )));
        }
        if x.n > 65535 {
            return Err(CudaError::Shape(format!(
                "rms_norm: {} tokens in one pass (at most 65535)",
                x.n
            )));
        }
        let (q, ds) = out.q.as_ref().map_or((0, 0), |(q, d)| (q.ptr, d.ptr));
        self.push(
            "rms_norm",
            [div_ceil_u32(x.width, 256), x.n as u32, 1],
            [256, 1, 1],
            &[
                x.x.ptr,
                w.buf.ptr,
                u64::from(eps.to_bits()),
                out.x.ptr,
                q,
                ds,
                x.width as u64,
                u64::from(out.q.is_some()),
            ],
        );
        out.q_fresh.store(out.q.is_some(), Ordering::Relaxed);
        Ok(())
    }

    fn ensure_q8(&self, x: &DevAct) -> Result<(), CudaError> {
        if x.q_fresh.load(Ordering::Relaxed) {
            return Ok(());
        }
        let (q, ds) = x.q.as_ref().ok_or_else(|| {
            CudaError::Shape(format!("width {} is not a multiple of 32", x.width))
        })?;
        let n_blocks = x.n * x.width / 32;
        self.push(
            "quantize_q8",
            [div_ceil_u32(n_blocks, 8), 1, 1],
            [256, 1, 1],
            &[x.x.ptr, q.ptr, ds.ptr, n_blocks as u64],
        );
        x.q_fresh.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// `out = x · Wᵀ`.
    pub fn matmul(&self, w: &DevMatrix, x: &DevAct, out: &DevAct) -> Result<(), CudaError> {
        self.matmuls(x, &[(w, out)], false)
    }

    /// `out += x · Wᵀ` (an output projection with its residual add).
    pub fn matmul_add(&self, w: &DevMatrix, x: &DevAct, out: &DevAct) -> Result<(), CudaError> {
        self.matmuls(x, &[(w, out)], true)
    }

    /// `out_i = x · W_iᵀ` for every pair (`+=` when `acc`). Decode GEMVs of consecutive
    /// matrices of one format share a launch (up to three: Q/K/V, gate/up).
    pub fn matmuls(
        &self,
        x: &DevAct,
        pairs: &[(&DevMatrix, &DevAct)],
        acc: bool,
    ) -> Result<(), CudaError> {
        for (w, out) in pairs {
            if x.width != w.cols || out.width != w.rows || x.n != out.n {
                return Err(CudaError::Shape(format!(
                    "matmul: [{}, {}] · [{}, {}]ᵀ into [{}, {}]",
                    x.n, x.width, w.rows, w.cols, out.n, out.width
                )));
            }
            out.q_fresh.store(false, Ordering::Relaxed);
        }
        if let Some(xbf) = &x.bf {
            let on = self.mmq_enabled.load(Ordering::Relaxed);
            let mmq = |w: &DevMatrix| Self::mmq_kernel(w, x).filter(|_| on);
            if pairs.iter().any(|(w, _)| mmq(w).is_some()) {
                self.ensure_q8(x)?;
            }
            if pairs.iter().any(|(w, _)| mmq(w).is_none()) {
                let n = x.n * x.width;
                self.push(
                    "to_bf16",
                    [div_ceil_u32(n, 256), 1, 1],
                    [256, 1, 1],
                    &[x.x.ptr, xbf.ptr, n as u64],
                );
            }
            return pairs.iter().try_for_each(|(w, out)| match mmq(w) {
                Some(kernel) => {
                    self.push_mmq(kernel, w, x, out, acc);
                    Ok(())
                }
                None => self.gemm(w, x, xbf, out, acc),
            });
        }
        if pairs.iter().any(|(w, _)| w.format != Format::F16) {
            self.ensure_q8(x)?;
        }
        let (q, ds) = x.q.as_ref().map_or((0, 0), |(q, d)| (q.ptr, d.ptr));
        let mut rest = pairs;
        while let Some(((w0, _), _)) = rest.split_first() {
            let same = rest
                .iter()
                .take(GEMV_MATS)
                .take_while(|(w, _)| w.format == w0.format)
                .count();
            let (group, tail) = rest.split_at(same);
            rest = tail;
            // (w, off1, off2, rows, out) per matrix, unused slots zero, then the shared ones.
            let mut args = [0u64; 5 * GEMV_MATS + 5];
            let mut blocks = 0;
            for (slot, (w, out)) in args.chunks_exact_mut(5).zip(group) {
                slot.copy_from_slice(&[w.buf.ptr, w.off1, w.off2, w.rows as u64, out.x.ptr]);
                blocks += w.rows.div_ceil(GEMV_WARPS);
            }
            args[5 * GEMV_MATS..].copy_from_slice(&[
                w0.cols as u64,
                q,
                ds,
                x.x.ptr,
                u64::from(acc),
            ]);
            self.push(
                GEMV[w0.format as usize],
                [blocks as u32, x.n as u32, 1],
                [32 * GEMV_WARPS as u32, 1, 1],
                &args,
            );
        }
        Ok(())
    }

    /// `out (+)= x · Wᵀ` through the int8 MMQ kernel, for any token count (tests and
    /// benchmarks; prompt matmuls take it under `DAMASCUS_CUDA_MMQ=1`). A [`CudaError::Shape`]
    /// when `w`'s format has no MMQ kernel (f16) or its rows are not a multiple of 32.
    pub fn matmul_mmq(
        &self,
        w: &DevMatrix,
        x: &DevAct,
        out: &DevAct,
        acc: bool,
    ) -> Result<(), CudaError> {
        if x.width != w.cols || out.width != w.rows || x.n != out.n {
            return Err(CudaError::Shape(format!(
                "matmul_mmq: [{}, {}] · [{}, {}]ᵀ into [{}, {}]",
                x.n, x.width, w.rows, w.cols, out.n, out.width
            )));
        }
        let kernel = Self::mmq_kernel(w, x).ok_or_else(|| {
            CudaError::Shape(format!(
                "matmul_mmq: no MMQ kernel for {:?} [{}, {}] (needs a quantized format and \
                 rows a multiple of 32)",
                w.format, w.rows, w.cols
            ))
        })?;
        self.ensure_q8(x)?;
        out.q_fresh.store(false, Ordering::Relaxed);
        self.push_mmq(kernel, w, x, out, acc);
        Ok(())
    }

    /// The MMQ kernel that takes `x · Wᵀ`, if one does: a format with one, rows a multiple of
    /// 32, x with a q8 shadow, and at most 65535 token tiles (the grid's y).
    fn mmq_kernel(w: &DevMatrix, x: &DevAct) -> Option<&'static str> {
        let kernel = MMQ[w.format as usize]?;
        (w.rows.is_multiple_of(32) && x.q.is_some() && x.n.div_ceil(MMQ_TOK) <= 65535)
            .then_some(kernel)
    }

    /// Records `kernel` (from [`Gpu::mmq_kernel`]): out `[n, rows]` f32 (+)= x's q8 shadow
    /// (`[n, cols]` int8, `[n, cols / 32]` float2) · Wᵀ. The caller checked the shapes and made
    /// the shadow current.
    fn push_mmq(&self, kernel: &str, w: &DevMatrix, x: &DevAct, out: &DevAct, acc: bool) {
        let (q, ds) = x.q.as_ref().map_or((0, 0), |(q, d)| (q.ptr, d.ptr));
        self.push(
            kernel,
            [
                div_ceil_u32(w.rows, MMQ_ROWS),
                div_ceil_u32(x.n, MMQ_TOK),
                1,
            ],
            [MMQ_THREADS, 1, 1],
            &[
                w.buf.ptr,
                w.off1,
                w.off2,
                w.rows as u64,
                w.cols as u64,
                q,
                ds,
                out.x.ptr,
                x.n as u64,
                u64::from(acc),
            ],
        );
    }

    /// `out (+)= x · Wᵀ` through cuBLAS; `xbf` already holds x in bf16.
    fn gemm(
        &self,
        w: &DevMatrix,
        x: &DevAct,
        xbf: &DevBuf,
        out: &DevAct,
        acc: bool,
    ) -> Result<(), CudaError> {
        let wbf = {
            let mut slot = w.bf16.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                let buf = self.alloc(w.rows * w.cols * 2)?;
                self.push_dequant(w, w.rows, 0, 0, buf.ptr);
                *slot = Some(buf);
            }
            slot.as_ref().map_or(0, |b| b.ptr)
        };
        self.rec().ops.push(Op::Gemm {
            acc,
            m: i32_dim("rows", w.rows)?,
            n: i32_dim("tokens", x.n)?,
            k: i32_dim("cols", w.cols)?,
            a: wbf,
            b: xbf.ptr,
            c: out.x.ptr,
        });
        Ok(())
    }

    /// Rotates `x` `[n, n_head, head_dim]` in place at positions `pos0 + t` (from `begin`).
    pub fn rope(
        &self,
        x: &DevAct,
        n_head: usize,
        head_dim: usize,
        inv_freq: &DevVec,
        neox: bool,
    ) -> Result<(), CudaError> {
        let half = inv_freq.n;
        if x.width != n_head * head_dim || 2 * half > head_dim {
            return Err(CudaError::Shape(format!(
                "rope: width {} for {n_head} heads of {head_dim} with {half} frequencies",
                x.width
            )));
        }
        let inputs = self.rec().inputs.ptr;
        let n = x.n * n_head * half;
        self.push(
            "rope",
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
            &[
                x.x.ptr,
                inputs,
                inv_freq.buf.ptr,
                x.n as u64,
                n_head as u64,
                head_dim as u64,
                half as u64,
                u64::from(neox),
            ],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `k`, `v` into `layer` of the cache at `pos0 + t`, then causal GQA attention of
    /// `q` over positions `0..=pos0 + t` into `out`. The caller checked `pos0 + n <= n_ctx`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        kv: &DevKv,
        layer: usize,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
    ) -> Result<(), CudaError> {
        self.rope_attention(kv, layer, pos0, q, k, v, out, None)
    }

    /// [`Gpu::attention`] with RoPE fused into the cache write: with `rope = Some((inv_freq,
    /// neox))`, `q` is rotated in place and `k` rotated on its way into the cache (`k` itself
    /// is left as it was), as [`Gpu::rope`] on both would.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention(
        &self,
        kv: &DevKv,
        layer: usize,
        pos0: usize,
        q: &DevAct,
        k: &DevAct,
        v: &DevAct,
        out: &DevAct,
        rope: Option<(&DevVec, bool)>,
    ) -> Result<(), CudaError> {
        let (hd, n_kv, n_head) = (kv.head_dim, kv.n_kv, kv.n_head);
        let n = q.n;
        if layer >= kv.n_layer
            || q.width != n_head * hd
            || k.width != n_kv * hd
            || v.width != n_kv * hd
            || k.n != n
            || v.n != n
            || out.n != n
            || out.width != q.width
            || pos0 + n > kv.n_ctx
        {
            return Err(CudaError::Shape(format!(
                "attention: layer {layer}, q [{n}, {}], k [{}, {}], v [{}, {}], out [{}, {}], \
                 positions {pos0}..{} of {}",
                q.width,
                k.n,
                k.width,
                v.n,
                v.width,
                out.n,
                out.width,
                pos0 + n,
                kv.n_ctx
            )));
        }
        let (half, inv, neox) = match rope {
            Some((inv, neox)) => (inv.n, inv.buf.ptr, neox),
            None => (0, 0, false),
        };
        if 2 * half > hd {
            return Err(CudaError::Shape(format!(
                "attention: {half} rope frequencies for head_dim {hd}"
            )));
        }
        let inputs = self.rec().inputs.ptr;
        let layer_off = (layer * n_kv * kv.n_ctx * hd * 2) as u64;
        let (kc, vc) = (kv.k.ptr + layer_off, kv.v.ptr + layer_off);
        let total = n * (n_head + n_kv) * hd / 2;
        self.push(
            "rope_kv",
            [div_ceil_u32(total, 256), 1, 1],
            [256, 1, 1],
            &[
                q.x.ptr,
                k.x.ptr,
                v.x.ptr,
                kc,
                vc,
                inputs,
                inv,
                n as u64,
                n_head as u64,
                n_kv as u64,
                hd as u64,
                half as u64,
                u64::from(neox),
                kv.n_ctx as u64,
            ],
        );
        if half > 0 {
            q.q_fresh.store(false, Ordering::Relaxed);
        }
        let group = (n_head / n_kv) as u64;
        let scale = u64::from((1.0 / (hd as f32).sqrt()).to_bits());
        if n == 1 {
            self.push(
                if hd == 64 {
                    "attn_split_64"
                } else {
                    "attn_split_128"
                },
                [n_kv as u32, kv.n_split as u32, 1],
                [ATT_THREADS, 1, 1],
                &[
                    q.x.ptr,
                    kc,
                    vc,
                    inputs,
                    kv.part_o.ptr,
                    kv.part_ml.ptr,
                    n_head as u64,
                    group,
                    kv.n_ctx as u64,
                    kv.n_split as u64,
                    scale,
                ],
            );
            let (oq, ods) = out.q.as_ref().map_or((0, 0), |(q, d)| (q.ptr, d.ptr));
            self.push(
                if hd == 64 {
                    "attn_combine_64"
                } else {
                    "attn_combine_128"
                },
                [n_head as u32, 1, 1],
                [hd as u32, 1, 1],
                &[
                    kv.part_o.ptr,
                    kv.part_ml.ptr,
                    inputs,
                    out.x.ptr,
                    oq,
                    ods,
                    kv.n_split as u64,
                    u64::from(out.q.is_some()),
                ],
            );
            out.q_fresh.store(out.q.is_some(), Ordering::Relaxed);
        } else {
            self.push(
                if hd == 64 {
                    "attn_prefill_64"
                } else {
                    "attn_prefill_128"
                },
                [n_kv as u32, div_ceil_u32(n, 4), 1],
                [128, 1, 1],
                &[
                    q.x.ptr,
                    kc,
                    vc,
                    inputs,
                    out.x.ptr,
                    n as u64,
                    n_head as u64,
                    group,
                    kv.n_ctx as u64,
                    scale,
                ],
            );
            out.q_fresh.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `gate = silu(gate) * up` (and gate's q8 shadow).
    pub fn swiglu(&self, gate: &DevAct, up: &DevAct) -> Result<(), CudaError> {
        Self::same_shape(gate, up, "swiglu")?;
        let n = gate.n * gate.width;
        if !n.is_multiple_of(32) {
            return Err(CudaError::Shape(format!(
                "swiglu: {n} elements, not a multiple of 32"
            )));
        }
        let (q, ds) = gate.q.as_ref().map_or((0, 0), |(q, d)| (q.ptr, d.ptr));
        self.push(
            "swiglu",
            [div_ceil_u32(n / 32, 8), 1, 1],
            [256, 1, 1],
            &[
                gate.x.ptr,
                up.x.ptr,
                q,
                ds,
                (n / 32) as u64,
                u64::from(gate.q.is_some()),
            ],
        );
        gate.q_fresh.store(gate.q.is_some(), Ordering::Relaxed);
        Ok(())
    }

    /// `x += y`.
    pub fn add(&self, x: &DevAct, y: &DevAct) -> Result<(), CudaError> {
        Self::same_shape(x, y, "add")?;
        let n = x.n * x.width;
        self.push(
            "add",
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
            &[x.x.ptr, y.x.ptr, n as u64],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Copies row `row` of `src` into `dst` `[1, width]`.
    pub fn copy_row(&self, src: &DevAct, row: usize, dst: &DevAct) -> Result<(), CudaError> {
        if row >= src.n || dst.n != 1 || dst.width != src.width {
            return Err(CudaError::Shape(format!(
                "copy_row: row {row} of [{}, {}] into [{}, {}]",
                src.n, src.width, dst.n, dst.width
            )));
        }
        let bytes = src.width * 4;
        self.rec().ops.push(Op::Copy {
            dst: dst.x.ptr,
            src: src.x.ptr + (row * bytes) as u64,
            bytes,
        });
        dst.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Runs the dequantization kernel on rows `0..rows` of `w` (tests compare it with
    /// [`layout::dequant_row`]).
    pub fn dequantize(&self, w: &DevMatrix) -> Result<Vec<f32>, CudaError> {
        let out = self.act(w.rows, w.cols)?;
        self.push_dequant(w, w.rows, 0, out.x.ptr, 0);
        self.read(&out)
    }

    /// Uploads host f32 `[n, width]` into `x` (tests and the hybrid path).
    pub fn write(&self, x: &DevAct, data: &[f32]) -> Result<(), CudaError> {
        if data.len() != x.n * x.width {
            return Err(CudaError::Shape(format!(
                "write: {} values into [{}, {}]",
                data.len(),
                x.n,
                x.width
            )));
        }
        // Everything recorded before must run first: it may read the old contents.
        self.sync()?;
        // SAFETY: `x.x` holds `n * width` f32.
        unsafe { result::memcpy_htod_async(x.x.ptr, data, self.stream.cu_stream()) }
            .map_err(call("writing an activation"))?;
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }
}
