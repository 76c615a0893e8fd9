//! The fast CPU backend. Where the int8 kernels run (AVX-512 VNNI, or AVX2; on AMX CPUs the
//! VNNI decode kernels) every weight they take is
//! **repacked at load** into [`PackedMatrix`] panels (32 rows interleaved, scales pre-unpacked;
//! read from the file with `pread`, so the mapping's pages are not kept resident as well), and
//! every matmul and embedding lookup reads that copy: prompts through its int8 GEMM (on AMX
//! CPUs its AMX-BF16 GEMM, each unit's panels rounded to bf16 tiles), decode through its GEMV
//! (rows split by 32-row panels). Elsewhere, or with `DAMASCUS_REPACK=0` /
//! [`CpuBackend::with_repack`], weights stay in the memory mapping, activations are quantized
//! once per matmul (Q8_K for K-quants, Q8_0/Q8_1 for the legacy types) and multiplied with the
//! SIMD dot products of [`damascus_kernels::quantdot`] (ISA chosen once at run time). Work is
//! split over the kernels' persistent [`ThreadPool`]. The KV cache is head-major, f16 by default (attention
//! with [`attn_decode_f16`]) or f32 on request (a plain per-head f32 loop, split over heads),
//! or q8_0 (batched path only: `paged.rs`, [`damascus_kernels::attn_paged_q8`]).
//!
//! Work split:
//! * one token (decode): every matrix is split by rows across the threads; Q/K/V and gate/up
//!   are fused into one fork/join each (gate/up with the SwiGLU applied in the same pass);
//! * a prompt (prefill): split by tokens, each thread walking the weight rows once per tile of
//!   [`TOKEN_TILE`] tokens so a row stays in L1 while it meets every token of the tile.
//!
//! Weight types without a dot-product kernel (F32, F16, BF16, Q5_1, Q2_K, Q3_K, ...) are
//! dequantized one row at a time and dotted in f32, with the same work split.
//!
//! The model crate forbids `unsafe`: threads write disjoint `&mut` output chunks handed out
//! by the pool ([`ThreadPool::for_each_chunk_mut`], [`ThreadPool::for_each_task`]).

use std::ops::Range;
use std::sync::Mutex;

use damascus_gguf::GgmlType;
use damascus_kernels::attn_decode::{DecodeShape, KvLayout, attn_decode_f16};
use damascus_kernels::attn_prefill;
use damascus_kernels::gemm::int8::Int8Path;
use damascus_kernels::gemm::packed::PackedMatrix;
use damascus_kernels::gemm::{self, GemmPath, PackedActs, WeightRef};
use damascus_kernels::hugebuf::{Elem, HugeBuf};
use damascus_kernels::matmul::Plan;
use damascus_kernels::pool::{ThreadClamp, ThreadPool, chunk_len, physical_cores};
use damascus_kernels::quantdot::{self, DotKernels, Isa, WeightType};
use damascus_kernels::reference as k;
use damascus_kernels::reference::AttnShape;

use super::profile::OpProfile;
use super::reference::{HostAct, check_len, host_ops};
use super::{AttnSpec, Backend, KvCacheType, KvShape, PagedBatch, RopeParams};

mod paged;
use crate::error::ModelError;
use crate::family::Activation;
use crate::tensor::FileTensor;
use damascus_kernels::settings::KernelSettings;

mod matmul;

/// Tokens per prefill tile: each weight row is read once per tile.
pub const TOKEN_TILE: usize = 8;

/// Fewest tokens a matmul sends through the prefill GEMM ([`damascus_kernels::gemm`]); fewer
/// go through the per-token dot products, which read each weight block once without
/// unpacking it (the plan's, [`damascus_kernels::matmul::GEMM_MIN_TOKENS`]).
pub const GEMM_MIN_TOKENS: usize = damascus_kernels::matmul::GEMM_MIN_TOKENS;

/// Output rows per scheduling unit in row splits (16 f32 = one cache line, so threads never
/// share a line of the output).
const ROW_ALIGN: usize = 16;

/// Fewest values (`n_tokens · width`) an elementwise op (norm, add, SwiGLU) splits over the
/// pool: below it, a batch of decode rows costs less than a fork/join (≈ 5 µs quiet, far more
/// when the threads are descheduled).
const PAR_MIN_ELEMS: usize = 1 << 15;

/// The multithreaded SIMD CPU backend.
pub struct CpuBackend {
    pool: ThreadPool,
    /// Set where `-t` asked for more threads than the CPUs (reported in the load note).
    clamp: Option<ThreadClamp>,
    kern: &'static DotKernels,
    /// Which kernels multiply a prepared matrix ([`Plan`]: the prompt GEMM, the int8 GEMM,
    /// the repacked matrices' kernels, repacking on or off, file-layout GEMM on or off).
    plan: Plan,
    /// Prompt attention on AMX tiles (with the AMX GEMM; `DAMASCUS_ATTN_AMX=0` keeps the f32
    /// flash kernel).
    attn_amx: bool,
    /// `DAMASCUS_PROFILE=1`: per-op wall time, printed to stderr on drop.
    prof: Option<OpProfile>,
    /// The prefill GEMM's packed inputs, reused by every prompt matmul.
    gemm_bufs: Mutex<(Option<PackedActs>, Option<gemm::int8::QActs>)>,
    /// RoPE angle tables of the current pass's positions (`paged.rs`), newest last.
    rope_tables: Mutex<Vec<paged::RopeTable>>,
    /// Q/K/V projections on two-level int8 activations (`KernelSettings::two_level_qkv`).
    pub(super) two_level_qkv: bool,
    /// Tensors and bytes repacked, and the seconds it took (for [`Backend::load_note`]).
    repacked: Mutex<(usize, usize, f64)>,
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.prof {
            eprint!("{}", p.report());
        }
    }
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("n_threads", &self.pool.n_threads())
            .field("isa", &self.kern.isa())
            .finish()
    }
}

impl CpuBackend {
    /// A backend running on `n_threads` threads (`None`: one per physical core), with the
    /// default [`KernelSettings`] and the process-wide kernel table ([`quantdot::kernels`]).
    pub fn new(n_threads: Option<usize>) -> CpuBackend {
        CpuBackend::with_settings(n_threads, &KernelSettings::default())
    }

    /// A backend running on `n_threads` threads (`None`: one per physical core; more than
    /// the CPUs this process may use are clamped, see [`CpuBackend::thread_clamp`]) with the
    /// tuning `settings` (the process-wide ones, the ISA level among them, are those
    /// [`KernelSettings::install`]ed, or the defaults).
    pub fn with_settings(n_threads: Option<usize>, settings: &KernelSettings) -> CpuBackend {
        let (pool, clamp) = match n_threads.filter(|&n| n > 0) {
            Some(n) => ThreadPool::clamped(n),
            None => (ThreadPool::new(physical_cores()), None),
        };
        let kern = quantdot::kernels();
        let plan = Plan::new(settings, kern.isa());
        let attn_amx = plan.gemm == Some(GemmPath::Amx) && settings.attn_amx;
        CpuBackend {
            pool,
            clamp,
            kern,
            plan,
            attn_amx,
            prof: settings.profile.then(OpProfile::default),
            gemm_bufs: Mutex::new((None, None)),
            rope_tables: Mutex::new(Vec::new()),
            two_level_qkv: settings.two_level_qkv,
            repacked: Mutex::new((0, 0, 0.0)),
        }
    }

    /// The thread count asked for and the one used, where it was more than the CPUs this
    /// process may use.
    pub fn thread_clamp(&self) -> Option<ThreadClamp> {
        self.clamp
    }

    /// Runs `f`, timed under `key` when profiling.
    fn timed<T>(&self, key: impl FnOnce() -> String, f: impl FnOnce() -> T) -> T {
        match &self.prof {
            Some(p) => p.time(key, f),
            None => f(),
        }
    }

    /// With `on == false`, weights stay in the file's layout (see [`PackedMatrix`]); call before
    /// the model is loaded. Repacking also needs a packed path (an int8 path, or an AMX CPU
    /// with the VNNI kernels) and no `DAMASCUS_REPACK=0`.
    pub fn with_repack(mut self, on: bool) -> CpuBackend {
        self.plan.repack &= on;
        self
    }

    /// The prefill GEMM path in use (`None`: prompts use the per-token dot products).
    pub fn gemm_path(&self) -> Option<GemmPath> {
        self.plan.gemm
    }

    /// Threads taking part in each op (the caller included).
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The kernel ISA level in use.
    pub fn isa(&self) -> Isa {
        self.kern.isa()
    }
}

/// How a matrix is multiplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MatKind {
    /// Integer dot products against quantized activations.
    Quant(WeightType),
    /// Row-by-row dequantization and f32 dot products (types without a kernel).
    Dequant,
}

/// A prepared weight matrix: a handle into the mapping plus its geometry.
#[derive(Debug)]
pub struct CpuMatrix {
    tensor: FileTensor,
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    kind: MatKind,
    /// Whether the prefill GEMM can take this matrix.
    gemm_ok: bool,
    /// The repacked copy every matmul and lookup reads instead of the mapping, if any.
    packed: Option<PackedMatrix>,
}

/// The KV cache of every layer, head-major so each thread streams whole heads.
#[derive(Debug)]
pub struct CpuKvCache {
    shape: KvShape,
    store: KvStore,
}

/// Keys and values of every layer in one element type.
#[derive(Debug)]
enum KvStore {
    /// Per layer: `[n_head_kv, n_ctx, head_dim]` f16 bits (keys, then values).
    F16 {
        k: Vec<HugeBuf<u16>>,
        v: Vec<HugeBuf<u16>>,
    },
    /// Per layer: `[n_head_kv, n_ctx, head_dim]` f32 (keys, then values).
    F32 {
        k: Vec<HugeBuf<f32>>,
        v: Vec<HugeBuf<f32>>,
    },
    /// Per layer: `[n_head_kv, n_ctx, head_dim]` q8_0 (keys, then values; paged path only).
    Q8 {
        k: Vec<paged::Q8Layer>,
        v: Vec<paged::Q8Layer>,
    },
}

/// A zeroed huge-page KV buffer of `len` elements (a clear error when the memory cannot be
/// mapped).
pub(super) fn kv_buf<T: Elem>(len: usize) -> Result<HugeBuf<T>, ModelError> {
    HugeBuf::zeroed(len).map_err(|e| kernel_err("KV cache", e))
}

/// `n_layer` [`kv_buf`]s of `per_layer` elements.
fn kv_layers<T: Elem>(n_layer: usize, per_layer: usize) -> Result<Vec<HugeBuf<T>>, ModelError> {
    (0..n_layer).map(|_| kv_buf(per_layer)).collect()
}

/// Writes `n_tokens` new positions (`[n_tokens, n_head_kv, hd]` f32 rows of `kk`, `v`) into
/// head-major layer caches at `pos0`: token t, head h → `kc[(h * n_ctx + pos0 + t) * hd ..]`.
#[allow(clippy::too_many_arguments)]
fn append_kv<T>(
    kc: &mut [T],
    vc: &mut [T],
    kk: &[f32],
    v: &[f32],
    n_head_kv: usize,
    hd: usize,
    n_ctx: usize,
    pos0: usize,
    conv: impl Fn(&[f32], &mut [T]),
) {
    let kv_width = n_head_kv * hd;
    for t in 0..kk.len() / kv_width.max(1) {
        for h in 0..n_head_kv {
            let src = t * kv_width + h * hd..t * kv_width + (h + 1) * hd;
            let dst = (h * n_ctx + pos0 + t) * hd;
            conv(&kk[src.clone()], &mut kc[dst..dst + hd]);
            conv(&v[src], &mut vc[dst..dst + hd]);
        }
    }
}

/// f32 attention of one token's query heads `heads` against the first `n_visible` positions
/// of head-major f32 caches `kc`, `vc` (`[n_head_kv, n_ctx, hd]`). `q`: `[n_head, hd]` f32 (the
/// whole token), `out`: `[heads.len(), hd]` f32, `scores`: scratch.
#[allow(clippy::too_many_arguments)]
fn attn_heads_f32(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    heads: Range<usize>,
    group: usize,
    hd: usize,
    n_ctx: usize,
    visible: Range<usize>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let scale = 1.0 / (hd as f32).sqrt();
    for (i, h) in heads.enumerate() {
        let base = (h / group) * n_ctx * hd;
        let qh = &q[h * hd..(h + 1) * hd];
        scores.clear();
        scores.extend(
            visible
                .clone()
                .map(|p| dot_f32(qh, &kc[base + p * hd..base + (p + 1) * hd]) * scale),
        );
        k::softmax(scores);
        let oh = &mut out[i * hd..(i + 1) * hd];
        oh.fill(0.0);
        for (p, &w) in visible.clone().zip(scores.iter()) {
            let vp = &vc[base + p * hd..base + (p + 1) * hd];
            for (o, &x) in oh.iter_mut().zip(vp) {
                *o += w * x;
            }
        }
    }
}

fn kernel_err(what: &str, e: quantdot::KernelError) -> ModelError {
    ModelError::Tensor {
        what: format!("{what}: {e}"),
    }
}

/// Records the first error of a parallel region.
#[derive(Default)]
struct FirstError(Mutex<Option<ModelError>>);

impl FirstError {
    fn set(&self, e: ModelError) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(e);
    }

    fn into_result(self) -> Result<(), ModelError> {
        match self.0.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl CpuBackend {
    /// Runs `f(tokens, rows)` over `data` (`[n_tokens, width]` f32) cut into chunks of whole
    /// tokens handed out over the pool, in parallel when there are at least two tokens per
    /// thread and [`PAR_MIN_ELEMS`] values.
    fn par_rows(
        &self,
        data: &mut [f32],
        width: usize,
        f: &(dyn Fn(Range<usize>, &mut [f32]) + Sync),
    ) {
        let nt = self.pool.n_threads();
        let n_tokens = data.len() / width.max(1);
        // A few decode rows (a batch of sequences) are less work than handing them out.
        if n_tokens < 2 * nt || data.len() < PAR_MIN_ELEMS {
            return f(0..n_tokens, data);
        }
        let per = chunk_len(n_tokens, 1, nt);
        self.pool
            .for_each_chunk_mut(data, per * width, &|c, chunk| {
                let t0 = c * per;
                f(t0..t0 + chunk.len() / width, chunk)
            });
    }

    /// Attention of every token of `q` (`[n_tokens, n_head * hd]` f32, token t at `pos0 + t`)
    /// against head-major f32 layer caches already holding the new positions. One token:
    /// split over heads; a prompt: tokens dealt round-robin.
    #[allow(clippy::too_many_arguments)]
    fn attention_f32(
        &self,
        kc: &[f32],
        vc: &[f32],
        attn: AttnSpec,
        n_ctx: usize,
        pos0: usize,
        q: &HostAct,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        let AttnShape {
            n_head,
            n_head_kv,
            head_dim: hd,
        } = attn.shape;
        if n_head_kv == 0 || !n_head.is_multiple_of(n_head_kv) {
            return Err(ModelError::Tensor {
                what: format!("attention: {n_head} heads are not a multiple of {n_head_kv}"),
            });
        }
        let group = n_head / n_head_kv;
        let (n_tokens, q_width) = (q.n_tokens, q.width);
        if n_tokens == 1 {
            let per = chunk_len(n_head, 1, self.pool.n_threads());
            self.pool
                .for_each_chunk_mut(&mut out.data, per * hd, &|c, o| {
                    let heads = c * per..c * per + o.len() / hd;
                    let mut scores = Vec::with_capacity(pos0 + 1); // [n_visible] f32
                    attn_heads_f32(
                        &q.data,
                        kc,
                        vc,
                        heads,
                        group,
                        hd,
                        n_ctx,
                        attn.first_visible(pos0)..pos0 + 1,
                        o,
                        &mut scores,
                    );
                });
            return Ok(());
        }
        // One task per token, the latest (most positions) first.
        let rows: Vec<(usize, &mut [f32])> =
            out.data.chunks_mut(q_width).enumerate().rev().collect();
        let scores = || Vec::with_capacity(pos0 + n_tokens); // [n_visible] f32
        self.pool
            .for_each_task_with(rows, &scores, &|_, (tok, o), scores| {
                attn_heads_f32(
                    &q.data[tok * q_width..(tok + 1) * q_width],
                    kc,
                    vc,
                    0..n_head,
                    group,
                    hd,
                    n_ctx,
                    attn.first_visible(pos0 + tok)..pos0 + tok + 1,
                    o,
                    scores,
                );
            });
        Ok(())
    }
}

/// `Σ a·b` with eight independent accumulators (vectorizes without `unsafe`).
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &xi), &yi) in acc.iter_mut().zip(x).zip(y) {
            *s += xi * yi;
        }
    }
    acc.iter().sum::<f32>() + tail
}

impl Backend for CpuBackend {
    type Act = HostAct;
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type KvCache = CpuKvCache;

    fn name(&self) -> &'static str {
        match self.kern.isa() {
            Isa::Scalar => "cpu-scalar",
            Isa::Avx2 => "cpu-avx2",
            Isa::Avx512 => "cpu-avx512",
            // AMX-BF16 prompts round differently from the VNNI decode GEMV (a row's result
            // depends on its pass); AMX-INT8 prompts give the VNNI path's bits.
            Isa::Vnni | Isa::Amx if self.plan.gemm == Some(GemmPath::Amx) => {
                if self.plan.int8 == Some(Int8Path::Amx) {
                    "cpu-amx-int8"
                } else {
                    "cpu-amx"
                }
            }
            Isa::Vnni | Isa::Amx => "cpu-vnni",
        }
    }

    fn load_note(&self) -> Option<String> {
        let g = self.repacked.lock().unwrap_or_else(|p| p.into_inner());
        let path = match (self.plan.gemm, self.plan.packed) {
            (Some(GemmPath::Amx), Some(Int8Path::Amx)) => {
                format!("amx-int8 prompts + {} decode", Int8Path::Amx.gemv().name())
            }
            (Some(GemmPath::Amx), Some(p)) => format!("amx prompts + {} decode", p.name()),
            (_, p) => p.map_or("", |p| p.name()).to_string(),
        };
        let note = match *g {
            (0, _, _) if self.plan.packed.is_some() && !self.plan.repack => {
                Some("weights kept in the file layout (repacking off)".into())
            }
            (0, _, _) => None,
            (n, bytes, secs) => Some(format!(
                "repacked {n} tensors ({:.2} GiB) for {path} in {secs:.2} s",
                bytes as f64 / f64::from(1u32 << 30)
            )),
        };
        match (self.clamp, note) {
            (Some(c), Some(n)) => Some(format!("{c} · {n}")),
            (Some(c), None) => Some(c.to_string()),
            (None, n) => n,
        }
    }

    fn prepare_matrix(&self, w: &FileTensor) -> Result<CpuMatrix, ModelError> {
        let view = w.view()?;
        let wv = view.as_weight()?;
        let kind = match WeightType::from_ggml_id(wv.dtype.id()) {
            Some(wt) if wt.row_bytes(wv.cols) == Some(wv.row_bytes()) => MatKind::Quant(wt),
            _ => MatKind::Dequant,
        };
        let gemm_ok = WeightRef {
            dtype: wv.dtype,
            bytes: view.bytes()?,
            rows: wv.rows,
            cols: wv.cols,
        }
        .unsupported()
        .is_none();
        let wr = WeightRef {
            dtype: wv.dtype,
            bytes: view.bytes()?,
            rows: wv.rows,
            cols: wv.cols,
        };
        let packed = match self.plan.repack_path(&wr) {
            Some(_) => {
                let t0 = std::time::Instant::now();
                let rb = wv.row_bytes();
                let read = |r0: usize, buf: &mut [u8]| w.read_bytes(r0 * rb, buf);
                let m =
                    PackedMatrix::pack_from(wv.dtype, wv.rows, wv.cols, Some(&self.pool), &read)
                        .map_err(|e| kernel_err(w.name(), e))??;
                let mut g = self.repacked.lock().unwrap_or_else(|p| p.into_inner());
                g.0 += 1;
                g.1 += m.n_bytes();
                g.2 += t0.elapsed().as_secs_f64();
                Some(m)
            }
            _ => None,
        };
        Ok(CpuMatrix {
            tensor: w.clone(),
            dtype: wv.dtype,
            rows: wv.rows,
            cols: wv.cols,
            row_bytes: wv.row_bytes(),
            kind,
            gemm_ok,
            packed,
        })
    }

    fn prepare_vector(&self, w: &FileTensor) -> Result<Vec<f32>, ModelError> {
        w.view()?.to_f32_vec()
    }

    fn alloc(&self, n_tokens: usize, width: usize) -> Result<HostAct, ModelError> {
        Ok(HostAct {
            n_tokens,
            width,
            data: vec![0.0; n_tokens * width],
        })
    }

    fn set_rows(&self, x: &mut HostAct, n_tokens: usize) -> Result<bool, ModelError> {
        host_ops::set_rows(x, n_tokens)
    }

    fn new_kv_cache(&self, shape: KvShape) -> Result<CpuKvCache, ModelError> {
        shape.check_host_memory()?;
        let per_layer = shape.n_ctx * shape.n_head_kv * shape.head_dim;
        // Zeroed mappings are lazily backed by the OS: only touched pages cost memory. They
        // are advised for huge pages: a sequence's blocks are scattered over the pool, and
        // with 4 KiB pages nearly every block a decode step reads costs a TLB miss.
        let n = shape.n_layer;
        let store = match shape.cache_type {
            KvCacheType::F16 => KvStore::F16 {
                k: kv_layers(n, per_layer)?,
                v: kv_layers(n, per_layer)?,
            },
            KvCacheType::F32 => KvStore::F32 {
                k: kv_layers(n, per_layer)?,
                v: kv_layers(n, per_layer)?,
            },
            KvCacheType::Q8_0 => paged::q8_store(shape)?,
        };
        Ok(CpuKvCache { shape, store })
    }

    fn embed(&self, table: &CpuMatrix, ids: &[u32], out: &mut HostAct) -> Result<(), ModelError> {
        self.timed(
            || "embed".into(),
            || {
                check_len("embed", "out", out.data.len(), ids.len() * table.cols)?;
                if let Some(p) = &table.packed {
                    for (&id, row) in ids.iter().zip(out.data.chunks_exact_mut(table.cols)) {
                        if id as usize >= table.rows {
                            return Err(ModelError::TokenOutOfRange {
                                id,
                                n_vocab: table.rows,
                            });
                        }
                        p.dequant_row(id as usize, row)
                            .map_err(|e| kernel_err("embed", e))?;
                    }
                    return Ok(());
                }
                let view = table.tensor.view()?;
                let w = view.as_weight()?;
                k::embed_rows(&w, ids, &mut out.data)?;
                Ok(())
            },
        )
    }

    fn rms_norm(
        &self,
        x: &HostAct,
        w: &Vec<f32>,
        eps: f32,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        self.timed(
            || "rms_norm".into(),
            || {
                check_len("rms_norm", "x row", x.width, w.len())?;
                check_len("rms_norm", "out", out.data.len(), x.data.len())?;
                let width = x.width;
                self.par_rows(&mut out.data, width, &|r, chunk| {
                    k::rms_norm(&x.data[r.start * width..r.end * width], w, eps, chunk);
                });
                Ok(())
            },
        )
    }

    fn matmul(&self, w: &CpuMatrix, x: &HostAct, out: &mut HostAct) -> Result<(), ModelError> {
        self.matmuls(&[w], x, &mut [out], false)
    }

    fn qkv(
        &self,
        x: &HostAct,
        wq: &CpuMatrix,
        wk: &CpuMatrix,
        wv: &CpuMatrix,
        q: &mut HostAct,
        kk: &mut HostAct,
        v: &mut HostAct,
    ) -> Result<(), ModelError> {
        self.matmuls(&[wq, wk, wv], x, &mut [q, kk, v], false)
    }

    fn ffn_gate_up(
        &self,
        x: &HostAct,
        w_gate: &CpuMatrix,
        w_up: &CpuMatrix,
        act: Activation,
        gate: &mut HostAct,
        up: &mut HostAct,
    ) -> Result<(), ModelError> {
        match act {
            Activation::Silu => self.matmuls(&[w_gate, w_up], x, &mut [gate, up], true),
            Activation::GeluTanh => {
                self.matmuls(&[w_gate, w_up], x, &mut [gate, up], false)?;
                self.geglu(gate, up)
            }
        }
    }

    fn geglu(&self, gate: &mut HostAct, up: &HostAct) -> Result<(), ModelError> {
        self.timed(
            || "geglu".into(),
            || {
                check_len("geglu", "up", up.data.len(), gate.data.len())?;
                let width = gate.width;
                self.par_rows(&mut gate.data, width, &|r, chunk| {
                    damascus_kernels::elementwise::geglu(
                        chunk,
                        &up.data[r.start * width..r.end * width],
                    );
                });
                Ok(())
            },
        )
    }

    fn add_bias(&self, x: &mut HostAct, b: &Vec<f32>) -> Result<(), ModelError> {
        self.timed(|| "bias".into(), || host_ops::add_bias(x, b))
    }

    fn rms_norm_heads(
        &self,
        x: &mut HostAct,
        w: &Vec<f32>,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), ModelError> {
        self.timed(
            || "qk_norm".into(),
            || {
                check_len("rms_norm_heads", "weight", w.len(), head_dim)?;
                if head_dim == 0 || !x.width.is_multiple_of(head_dim) {
                    // The reference reports the shape error.
                    return host_ops::rms_norm_heads(x, w, eps, head_dim);
                }
                // Every head of every row on its own: rows in chunks over the pool, each
                // through the reference kernel (the same bits as one serial call).
                self.par_rows(&mut x.data, x.width, &|_, chunk| {
                    let input = chunk.to_vec(); // [rows, width] f32
                    k::rms_norm(&input, w, eps, chunk);
                });
                Ok(())
            },
        )
    }

    fn scale(&self, x: &mut HostAct, s: f32) -> Result<(), ModelError> {
        host_ops::scale(x, s);
        Ok(())
    }

    fn softcap(&self, x: &mut HostAct, cap: f32) -> Result<(), ModelError> {
        host_ops::softcap(x, cap);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut HostAct,
        n_head: usize,
        pos0: usize,
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.timed(
            || "rope".into(),
            || {
                check_len("rope", "x row", x.width, n_head * rope.head_dim)?;
                let width = x.width;
                self.par_rows(&mut x.data, width, &|r, chunk| {
                    k::rope(
                        chunk,
                        n_head,
                        rope.head_dim,
                        pos0 + r.start,
                        &rope.inv_freq,
                        rope.layout,
                    );
                });
                Ok(())
            },
        )
    }

    fn attention(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        attn: AttnSpec,
        pos0: usize,
        q: &HostAct,
        kk: &HostAct,
        v: &HostAct,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        self.timed(|| "attention".into(), || {
            let shape = attn.shape;
            let n_tokens = q.n_tokens;
            let KvShape {
                n_ctx,
                n_head_kv,
                head_dim: hd,
                ..
            } = cache.shape;
            let kv_width = n_head_kv * hd;
            if pos0 + n_tokens > n_ctx {
                return Err(ModelError::ContextFull {
                    n_ctx,
                    n_past: pos0,
                    n_tokens,
                });
            }
            check_len("attention", "k", kk.data.len(), n_tokens * kv_width)?;
            check_len("attention", "v", v.data.len(), n_tokens * kv_width)?;
            check_len("attention", "q row", q.width, shape.n_head * shape.head_dim)?;
            check_len("attention", "out", out.data.len(), q.data.len())?;
            if shape.n_head_kv != n_head_kv || shape.head_dim != hd {
                return Err(ModelError::Tensor {
                    what: format!(
                        "attention: shape {shape:?} does not match the cache ({n_head_kv} KV heads of {hd})"
                    ),
                });
            }
            let no_layer = || ModelError::Tensor {
                what: format!("attention: no cache for layer {layer}"),
            };
            let (kc, vc) = match &mut cache.store {
                KvStore::Q8 { .. } => {
                    return Err(ModelError::CacheType {
                        cache_type: "q8_0".into(),
                        why: "the CPU backend reads a q8_0 cache only through batched (paged) attention".into(),
                    });
                }
                KvStore::F16 { k: ks, v: vs } => (ks.get_mut(layer), vs.get_mut(layer)),
                KvStore::F32 { k: ks, v: vs } => {
                    let (kc, vc) = match (ks.get_mut(layer), vs.get_mut(layer)) {
                        (Some(kc), Some(vc)) => (kc, vc),
                        _ => return Err(no_layer()),
                    };
                    append_kv(kc, vc, &kk.data, &v.data, n_head_kv, hd, n_ctx, pos0, |s, d| {
                        d.copy_from_slice(s)
                    });
                    return self.attention_f32(kc, vc, attn, n_ctx, pos0, q, out);
                }
            };
            let (kc, vc) = match (kc, vc) {
                (Some(kc), Some(vc)) => (kc, vc),
                _ => return Err(no_layer()),
            };
            append_kv(
                kc,
                vc,
                &kk.data,
                &v.data,
                n_head_kv,
                hd,
                n_ctx,
                pos0,
                damascus_kernels::elementwise::f32_to_f16_slice,
            );
            let dshape = DecodeShape {
                n_head: shape.n_head,
                n_head_kv,
                head_dim: hd,
                layout: KvLayout::HeadMajor { n_ctx },
            };
            let (kc, vc) = (&kc[..], &vc[..]);
            let q_width = q.width;
            // A sliding window hides positions before `first`: in the head-major cache, the
            // slices from row `first` on are a cache of `n_kv - first` positions with the same
            // stride, so the kernels read only the window.
            let windowed = |pos: usize| {
                let first = attn.first_visible(pos);
                (&kc[first * hd..], &vc[first * hd..], pos + 1 - first)
            };
            if n_tokens == 1 {
                let (kw, vw, n_kv) = windowed(pos0);
                return attn_decode_f16(&q.data, kw, vw, dshape, n_kv, &mut out.data, Some(&self.pool))
                    .map_err(|e| kernel_err("attention", e));
            }
            let clipped = attn.clips(pos0 + n_tokens - 1);
            #[cfg(target_arch = "x86_64")]
            if !clipped
                && self.attn_amx
                && n_tokens >= damascus_kernels::attn_amx::MIN_TOKENS
                && damascus_kernels::attn_amx::is_available(hd)
            {
                // A prompt of a query block or more on AMX: Q·Kᵀ and P·V as bf16 tile GEMMs
                // per 32 queries.
                return damascus_kernels::attn_amx::attn_prefill_amx(
                    &q.data,
                    kc,
                    vc,
                    dshape,
                    pos0,
                    &mut out.data,
                    Some(&self.pool),
                )
                .map_err(|e| kernel_err("attention", e));
            }
            if !clipped && attn_prefill::supports_head_dim(hd) {
                // A prompt: flash-style tiles (one KV head × a block of query tokens per unit).
                return attn_prefill::attn_prefill_f16(
                    &q.data,
                    kc,
                    vc,
                    dshape,
                    pos0,
                    &mut out.data,
                    Some(&self.pool),
                )
                .map_err(|e| kernel_err("attention", e));
            }
            // Other head sizes, and prompts a sliding window clips: one task per token, the
            // latest (most positions) first.
            let rows: Vec<(usize, &mut [f32])> =
                out.data.chunks_mut(q_width).enumerate().rev().collect();
            let err = FirstError::default();
            self.pool.for_each_task(rows, &|_, (tok, o)| {
                let qr = &q.data[tok * q_width..(tok + 1) * q_width];
                let (kw, vw, n_kv) = windowed(pos0 + tok);
                if let Err(e) = attn_decode_f16(qr, kw, vw, dshape, n_kv, o, None) {
                    err.set(kernel_err("attention", e));
                }
            });
            err.into_result()
        })
    }

    fn swiglu(&self, gate: &mut HostAct, up: &HostAct) -> Result<(), ModelError> {
        self.timed(
            || "swiglu".into(),
            || {
                check_len("swiglu", "up", up.data.len(), gate.data.len())?;
                let width = gate.width;
                self.par_rows(&mut gate.data, width, &|r, chunk| {
                    damascus_kernels::elementwise::swiglu(
                        chunk,
                        &up.data[r.start * width..r.end * width],
                    );
                });
                Ok(())
            },
        )
    }

    fn add(&self, x: &mut HostAct, y: &HostAct) -> Result<(), ModelError> {
        self.timed(
            || "add".into(),
            || {
                check_len("add", "y", y.data.len(), x.data.len())?;
                let width = x.width;
                self.par_rows(&mut x.data, width, &|r, chunk| {
                    k::add(chunk, &y.data[r.start * width..r.end * width]);
                });
                Ok(())
            },
        )
    }

    fn begin_forward(&self, n_tokens: usize, _pos0: usize) -> Result<(), ModelError> {
        if let Some(p) = &self.prof {
            p.pass(n_tokens);
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &HostAct,
        rows: &[usize],
        dst: &mut HostAct,
    ) -> Result<(), ModelError> {
        host_ops::copy_rows(src, rows, dst)
    }

    fn supports_batches(&self) -> bool {
        true
    }

    fn attention_batch(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        attn: AttnSpec,
        rope: &RopeParams,
        batch: &PagedBatch<'_>,
        q: &mut HostAct,
        k: &mut HostAct,
        v: &HostAct,
        out: &mut HostAct,
    ) -> Result<(), ModelError> {
        self.timed(
            || "attention".into(),
            || self.paged_attention(cache, layer, attn, rope, batch, q, k, v, out),
        )
    }

    fn copy_row(&self, src: &HostAct, row: usize, dst: &mut HostAct) -> Result<(), ModelError> {
        host_ops::copy_row(src, row, dst)
    }

    fn read(&self, x: &HostAct) -> Result<Vec<f32>, ModelError> {
        Ok(x.data.clone())
    }

    fn write(&self, x: &mut HostAct, data: &[f32]) -> Result<(), ModelError> {
        host_ops::write(x, data)
    }
}
