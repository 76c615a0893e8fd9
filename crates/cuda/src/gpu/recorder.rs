//! The op recorder: ops recorded per forward pass, run at a flush either one by one, under
//! the profiler, or (a one-token pass, or a batch of decode rows, flushed whole) as a cached
//! CUDA graph.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{CudaGraph, result, sys};

use super::buffers::{DevAct, DevBuf};
use super::launch::{ArgmaxRows, Args, Gemv, KERNELS, Launch, MAX_ARGS, Ptr, RmsNorm};
use super::profile::Profile;
use super::{GEMM_MIN_TOKENS, Gpu, MAX_GEMV_ROWS, MAX_GRAPHS, call};
use crate::error::CudaError;

// Launches are nearly every op, so their inline arguments are the common size (boxing them
// would allocate per recorded launch).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Op {
    Launch {
        f: usize,
        grid: [u32; 3],
        block: [u32; 3],
        /// Dynamic shared memory bytes.
        smem: u32,
        args: Args,
    },
    /// `C[n, m] = B[n, k] · A[m, k]ᵀ` (row-major), A and B bf16, C f32; `acc` adds into C.
    Gemm {
        acc: bool,
        m: i32,
        n: i32,
        k: i32,
        a: Ptr,
        b: Ptr,
        c: Ptr,
    },
    Copy {
        dst: Ptr,
        src: Ptr,
        bytes: usize,
    },
}

/// An instantiated graph.
struct Graph(CudaGraph);
// SAFETY: a CUgraphExec may be launched from any thread; it is only touched under the
// recorder's mutex.
unsafe impl Send for Graph {}

pub(super) struct Recorder {
    pub(super) ops: Vec<Op>,
    pub(super) n_tokens: usize,
    /// `[pos0, ids...]`, written to `inputs` before the next flush.
    pub(super) inputs_host: Vec<u32>,
    pub(super) inputs_dirty: bool,
    pub(super) inputs: DevBuf,
    /// `[rows]` u32: where `argmax` writes its picks (grown on demand).
    picks: Option<DevBuf>,
    /// The batch table of a batched pass over the paged pool (see `paged`), written to
    /// `batch` before the next flush; empty when the pass has none.
    pub(super) batch_host: Vec<u32>,
    pub(super) batch_dirty: bool,
    /// Device copy of `batch_host` (grown on demand).
    pub(super) batch: Option<DevBuf>,
    /// This pass is a batch of decode rows only: its launches repeat step after step while the
    /// batch keeps its size, so it is graphed like a one-token pass (with its cuBLAS GEMMs
    /// where `gemm_graphs` allows; set by `paged`).
    pub(super) decode_batch: bool,
    /// Part of this forward pass already ran (a host read in the middle): no graph.
    flushed_mid: bool,
    /// The last RMSNorm recorded and its index in `ops` (a following two-level GEMV may
    /// have it write the second q8 level: [`Gpu::set_fuse`]).
    pub(super) last_norm: Option<(usize, RmsNorm)>,
    /// The last one-token GEMV recorded and its index in `ops` (a following activation may
    /// fuse into it: [`Gpu::set_fuse`]).
    pub(super) last_gemv: Option<(usize, Gemv)>,
    graphs: HashMap<u64, Graph>,
}

impl Recorder {
    pub(super) fn new(inputs: DevBuf) -> Self {
        Recorder {
            ops: Vec::new(),
            n_tokens: 0,
            inputs_host: Vec::new(),
            inputs_dirty: false,
            inputs,
            picks: None,
            batch_host: Vec::new(),
            batch_dirty: false,
            batch: None,
            decode_batch: false,
            flushed_mid: false,
            last_norm: None,
            last_gemv: None,
            graphs: HashMap::new(),
        }
    }
}

impl Gpu {
    pub(super) fn rec(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records launch `k` on `grid` x `block` (no dynamic shared memory).
    pub(super) fn push<K: Launch>(&self, k: K, grid: [u32; 3], block: [u32; 3]) {
        self.push_smem(k, grid, block, 0);
    }

    /// Records launch `k` with `smem` bytes of dynamic shared memory.
    pub(super) fn push_smem<K: Launch>(&self, k: K, grid: [u32; 3], block: [u32; 3], smem: u32) {
        let f = self.index[k.name()];
        let args = k.args();
        self.rec().ops.push(Op::Launch {
            f,
            grid,
            block,
            smem,
            args,
        });
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
        r.last_norm = None;
        r.last_gemv = None;
        r.n_tokens = n_tokens;
        r.flushed_mid = false;
        r.inputs_host.clear();
        r.inputs_host.push(pos);
        r.inputs_dirty = true;
        r.batch_host.clear();
        r.batch_dirty = false;
        r.decode_batch = false;
        Ok(())
    }

    /// Drops every captured graph (a buffer their launches name was replaced).
    pub(super) fn forget_graphs(r: &mut Recorder) {
        r.graphs.clear();
    }

    /// Turns decode graphs on or off (on unless profiling).
    pub fn set_graphs(&self, on: bool) {
        self.graphs_enabled.store(on, Ordering::Relaxed);
    }

    /// Turns graphs of decode batches that multiply on cuBLAS on or off (on at first where
    /// cuBLAS took a workspace of its own when the device opened; a capture that fails turns
    /// them off for good).
    pub fn set_gemm_graphs(&self, on: bool) {
        self.gemm_graphs
            .store(on && self.blas_workspace.is_some(), Ordering::Relaxed);
    }

    /// Whether decode batches on cuBLAS are graphed (see [`Gpu::set_gemm_graphs`]).
    pub fn gemm_graphs(&self) -> bool {
        self.gemm_graphs.load(Ordering::Relaxed)
    }

    /// Turns the int8 MMQ prompt matmuls on or off (off at first).
    pub fn set_mmq(&self, on: bool) {
        self.mmq_enabled.store(on, Ordering::Relaxed);
    }

    /// Passes of up to `rows` rows multiply on the dp4a GEMVs (the batched GEMV from two rows:
    /// every row gets the bits of its own one-row pass), longer ones on the prompt GEMM
    /// (cuBLAS bf16, or MMQ). Clamped to `GEMM_MIN_TOKENS - 1..=MAX_GEMV_ROWS`; the default
    /// is `GEMM_MIN_TOKENS - 1`. Set it before allocating activations for longer passes.
    pub fn set_gemv_rows(&self, rows: usize) {
        let rows = rows.clamp(GEMM_MIN_TOKENS - 1, MAX_GEMV_ROWS);
        self.gemv_rows.store(rows, Ordering::Relaxed);
    }

    /// Passes of `GEMM_MIN_TOKENS..=rows` rows that reach the prompt GEMM take the int8 MMQ
    /// kernels on the quantized weights (where the format has one) even with MMQ off for
    /// prompts: decode batches then read the 4-bit weights instead of their bf16 copy and
    /// stay graphable. 0 (the default): none.
    pub fn set_mmq_rows(&self, rows: usize) {
        self.mmq_rows.store(rows, Ordering::Relaxed);
    }

    /// Whether a pass of `n` rows multiplies on the GEMVs.
    pub(super) fn gemv_takes(&self, n: usize) -> bool {
        n <= self.gemv_rows.load(Ordering::Relaxed)
    }

    /// Whether a pass of `n` rows on the prompt GEMM takes MMQ (where the format has it).
    pub(super) fn mmq_takes(&self, n: usize) -> bool {
        self.mmq_enabled.load(Ordering::Relaxed) || n <= self.mmq_rows.load(Ordering::Relaxed)
    }

    /// Turns the decode-batch GEMV (`gemv_batch`, one weight load per 8 tokens) on or off
    /// (on at first; off: one-token GEMV blocks per token).
    /// Either way a token gets the bits of its own pass.
    pub fn set_gemv_batch(&self, on: bool) {
        self.gemv_batch_enabled.store(on, Ordering::Relaxed);
    }

    /// Turns two-level q8 activations for the GEMVs of [`DevMatrix::two_level`] matrices on or
    /// off (the CPU's `KernelSettings::two_level_qkv`; on by default). The second level
    /// quantizes what the first misses (`x ≈ d₁q₁ + d₂q₂`), at twice the dp4a work of those
    /// GEMVs and no extra weight reads.
    ///
    /// [`DevMatrix::two_level`]: super::DevMatrix::two_level
    pub fn set_two_level_qkv(&self, on: bool) {
        self.two_level_qkv.store(on, Ordering::Relaxed);
    }

    /// Turns the tensor-core prompt attention on or off (on at first where the device
    /// allows; off: the CUDA-core kernel runs instead). Stays off on a device that cannot give the
    /// flash kernels their shared memory.
    pub fn set_flash(&self, on: bool) {
        self.flash_enabled
            .store(on && self.flash_ok, Ordering::Relaxed);
    }

    /// Turns the decode fusions on or off (off at first): an RMSNorm whose output a GEMV on
    /// two-level q8 activations takes next (the Q/K/V projections) writes the second level
    /// itself, and a one-token gate/up GEMV applies SwiGLU/GeGLU (and the q8 shadow) itself,
    /// two launches fewer per layer. Same bits either way.
    pub fn set_fuse(&self, on: bool) {
        self.fuse.store(on, Ordering::Relaxed);
    }

    /// Turns programmatic dependent launch on or off (off at first; stays off below sm_90 and
    /// while profiling). On: a kernel whose code waits on the grid before it (`PDL_WAIT()`)
    /// and that follows another kernel launches with programmatic stream serialization, so
    /// its blocks start while that kernel drains (in graphs too: capture keeps the
    /// programmatic edges). With `prefetch`, every decode GEMV block also asks L2 for its
    /// weight rows before it waits. Results are the same bits either way.
    pub fn set_pdl(&self, on: bool, prefetch: bool) {
        let on = on && self.profile.is_none() && self.pdl_ok.iter().any(|&k| k);
        self.pdl_enabled.store(on, Ordering::Relaxed);
        self.pdl_prefetch.store(on && prefetch, Ordering::Relaxed);
    }

    /// Turns PDL off for good after the driver refused it (`why`), saying so once.
    fn pdl_off(&self, why: &str) {
        if self.pdl_enabled.swap(false, Ordering::Relaxed) {
            eprintln!("damascus: programmatic dependent launch off: {why}");
        }
    }

    /// Whether kernels launch with PDL ([`Gpu::set_pdl`]; false where the device cannot).
    pub fn pdl(&self) -> bool {
        self.pdl_enabled.load(Ordering::Relaxed)
    }

    /// Whether decode GEMVs prefetch their weights before waiting ([`Gpu::set_pdl`]).
    pub(super) fn pdl_prefetch(&self) -> bool {
        self.pdl_prefetch.load(Ordering::Relaxed)
    }

    /// The dependency edges of every cached graph: (all, programmatic). Tests check that
    /// capture kept the programmatic launches as programmatic edges.
    pub fn graph_edges(&self) -> Result<(usize, usize), CudaError> {
        let r = self.rec();
        let (mut all, mut programmatic) = (0, 0);
        for g in r.graphs.values() {
            let h = g.0.cu_graph();
            let mut n = 0usize;
            // SAFETY: `h` is a live graph (owned by `g`, under the recorder's lock); null
            // arrays ask for the edge count only.
            unsafe {
                sys::cuGraphGetEdges_v2(
                    h,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut n,
                )
            }
            .result()
            .map_err(call("counting graph edges"))?;
            let mut from = vec![std::ptr::null_mut(); n];
            let mut to = vec![std::ptr::null_mut(); n];
            let none = sys::CUgraphEdgeData {
                from_port: 0,
                to_port: 0,
                type_: 0,
                reserved: [0; 5],
            };
            let mut data = vec![none; n];
            // SAFETY: the three arrays hold `n` entries each, as `n` tells the driver.
            unsafe {
                sys::cuGraphGetEdges_v2(
                    h,
                    from.as_mut_ptr(),
                    to.as_mut_ptr(),
                    data.as_mut_ptr(),
                    &mut n,
                )
            }
            .result()
            .map_err(call("reading graph edges"))?;
            all += n;
            // A programmatic edge: its type, or a launch port other than the default one.
            let prog = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
            programmatic += data[..n.min(data.len())]
                .iter()
                .filter(|e| e.type_ == prog || e.from_port != 0)
                .count();
        }
        Ok((all, programmatic))
    }

    /// How many ops are recorded and not yet run (tests count what a fusion saves).
    pub fn pending_ops(&self) -> usize {
        self.rec().ops.len()
    }

    /// Ends a forward pass: runs what was recorded (as a graph when it can).
    pub fn end(&self) -> Result<(), CudaError> {
        let mut r = self.rec();
        self.flush(&mut r, true)
    }

    pub(super) fn flush(&self, r: &mut Recorder, last: bool) -> Result<(), CudaError> {
        if r.inputs_dirty {
            // SAFETY: `inputs` holds at least `4 * (n_tokens + 1)` bytes (see `begin`) and
            // `inputs_host` at most `n_tokens + 1` values (`embed` checks).
            unsafe {
                result::memcpy_htod_async(r.inputs.ptr.0, &r.inputs_host, self.stream.cu_stream())
            }
            .map_err(call("uploading positions and token ids"))?;
            r.inputs_dirty = false;
        }
        if r.batch_dirty {
            let dst = r.batch.as_ref().map_or(Ptr::NULL, |b| b.ptr);
            // SAFETY: `batch` was grown to hold `batch_host` when it was written (`paged`).
            unsafe { result::memcpy_htod_async(dst.0, &r.batch_host, self.stream.cu_stream()) }
                .map_err(call("uploading the batch table"))?;
            r.batch_dirty = false;
        }
        if r.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut r.ops);
        r.last_norm = None;
        r.last_gemv = None;
        let has_gemm = ops.iter().any(|o| matches!(o, Op::Gemm { .. }));
        // A decode batch on cuBLAS is graphed too where cuBLAS has its own workspace (it then
        // allocates nothing while captured) and no capture of one has failed.
        let gemm_ok = r.decode_batch && self.gemm_graphs.load(Ordering::Relaxed);
        let graphable = self.graphs_enabled.load(Ordering::Relaxed)
            && last
            && !r.flushed_mid
            && (r.n_tokens == 1 || r.decode_batch)
            && (!has_gemm || gemm_ok);
        if !last {
            r.flushed_mid = true;
        }
        if let Some(p) = &self.profile {
            return self.run_profiled(&ops, p);
        }
        let pdl = self.pdl();
        if !graphable {
            return self.run_ops(&ops, pdl);
        }
        let mut key = graph_key(&ops, pdl);
        if !r.graphs.contains_key(&key) {
            if r.graphs.len() >= MAX_GRAPHS {
                r.graphs.clear();
            }
            let mut captured = self.capture(&ops, pdl);
            if let (Err(e), true) = (&captured, pdl) {
                // A driver that cannot capture programmatic launches: graphs without them.
                self.pdl_off(&format!("capturing a decode graph with it failed ({e})"));
                key = graph_key(&ops, false);
                captured = self.capture(&ops, false);
            }
            let g = match captured {
                Ok(g) => g,
                Err(e) if has_gemm => {
                    // cuBLAS would not be captured: such passes run eager from now on.
                    self.gemm_graphs.store(false, Ordering::Relaxed);
                    eprintln!("damascus: decode batches on cuBLAS run without graphs ({e})");
                    return self.run_ops(&ops, self.pdl());
                }
                Err(e) => return Err(e),
            };
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
            self.run_op(o, false)?;
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

    fn capture(&self, ops: &[Op], pdl: bool) -> Result<CudaGraph, CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(call("starting graph capture"))?;
        let recorded = self.run_ops(ops, pdl);
        let ended = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(call("ending graph capture"));
        recorded?;
        ended?.ok_or_else(|| CudaError::call("graph capture", "captured nothing"))
    }

    /// Runs `ops` in order; with `pdl`, a kernel that may ([`Gpu::set_pdl`]) and follows a
    /// kernel launches with programmatic stream serialization. After a copy or a cuBLAS GEMM
    /// (or first in the list) a launch is plain: it starts after everything before it.
    fn run_ops(&self, ops: &[Op], pdl: bool) -> Result<(), CudaError> {
        let mut after_kernel = false;
        for o in ops {
            // (`pdl()` again: a refused launch turns PDL off midway.)
            let programmatic = pdl
                && after_kernel
                && matches!(o, Op::Launch { f, .. } if self.pdl_ok[*f])
                && self.pdl();
            self.run_op(o, programmatic)?;
            after_kernel = matches!(o, Op::Launch { .. });
        }
        Ok(())
    }

    fn run_op(&self, op: &Op, programmatic: bool) -> Result<(), CudaError> {
        let s = self.stream.cu_stream();
        match op {
            Op::Launch {
                f,
                grid,
                block,
                smem,
                args,
            } => {
                let mut slots = args.v;
                let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
                for (p, a) in params.iter_mut().zip(slots.iter_mut()) {
                    *p = a as *mut u64 as *mut c_void;
                }
                if programmatic {
                    let mut attr = sys::CUlaunchAttribute {
                        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                        pad: [0; 4],
                        value: sys::CUlaunchAttributeValue {
                            programmaticStreamSerializationAllowed: 1,
                        },
                    };
                    let config = sys::CUlaunchConfig {
                        gridDimX: grid[0],
                        gridDimY: grid[1],
                        gridDimZ: grid[2],
                        blockDimX: block[0],
                        blockDimY: block[1],
                        blockDimZ: block[2],
                        sharedMemBytes: *smem,
                        hStream: s,
                        attrs: &mut attr,
                        numAttrs: 1,
                    };
                    // SAFETY: as for the plain launch below (same function, arguments and
                    // shared memory); `config` and `attr` outlive the call. The kernel runs
                    // `PDL_WAIT()` before it touches memory another kernel writes (`pdl_ok`:
                    // its PTX holds the wait), so starting it early is sound.
                    let launched = unsafe {
                        sys::cuLaunchKernelEx(
                            &config,
                            self.funcs[*f].cu_function(),
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    }
                    .result();
                    match launched {
                        Ok(()) => return Ok(()),
                        // Refused (nothing was launched): PDL off, this one launched plain.
                        Err(e) => self.pdl_off(&format!("{} refused it ({e})", KERNELS[*f])),
                    }
                }
                // SAFETY: every kernel in KERNELS takes only pointers, 64-bit offsets, ints
                // and floats, and its typed launch struct (`launch`) lists them in the
                // kernel's order; each argument sits in its own 8-byte slot whose low bytes
                // hold the value (little-endian), so the driver reads the declared size from
                // each. The pointers come from live `DevBuf`s whose sizes the recording method
                // checked against the kernel's indexing; `smem` is within the kernel's
                // allowance (set when the device opened).
                unsafe {
                    result::launch_kernel(
                        self.funcs[*f].cu_function(),
                        (grid[0], grid[1], grid[2]),
                        (block[0], block[1], block[2]),
                        *smem,
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
                        a.0 as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        *k,
                        b.0 as *const c_void,
                        cudaDataType::CUDA_R_16BF,
                        *k,
                        &beta as *const f32 as *const c_void,
                        c.0 as *mut c_void,
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
                unsafe { result::memcpy_dtod_async(dst.0, src.0, *bytes, s) }
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
        unsafe { result::memcpy_dtoh_async(&mut out, x.x.ptr.0, self.stream.cu_stream()) }
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
        let picks = r.picks.as_ref().map_or(Ptr::NULL, |b| b.ptr);
        drop(r);
        self.push(
            ArgmaxRows {
                x: x.x.ptr,
                width: x.width as i32,
                out: picks,
            },
            [x.n as u32, 1, 1],
            [1024, 1, 1],
        );
        let mut r = self.rec();
        self.flush(&mut r, false)?;
        drop(r);
        let mut out = vec![0u32; x.n];
        // SAFETY: `picks` holds at least `n` u32; the stream is synchronized before `out` is
        // read.
        unsafe { result::memcpy_dtoh_async(&mut out, picks.0, self.stream.cu_stream()) }
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
}

/// The key of the graph of `ops` launched with PDL on or off.
fn graph_key(ops: &[Op], pdl: bool) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ops.hash(&mut h);
    pdl.hash(&mut h);
    h.finish()
}
