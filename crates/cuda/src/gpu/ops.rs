//! The ops the backend records (but attention, in `attention`): embedding look-ups,
//! RMSNorm, the matmuls (dp4a GEMVs for decode, cuBLAS or int8 MMQ for prompts), SwiGLU,
//! residual adds and row copies. Each checks shapes, then records a typed launch.

use std::sync::atomic::Ordering;

use super::buffers::{DevAct, DevBuf, DevMatrix, DevVec, i32_dim};
use super::launch::{
    Add, AddBias, Dequant, Geglu, Gemv, GemvBatch, GemvMat, Launch, Mmq, Ptr, QuantizeQ8,
    QuantizeQ8Res, RmsNorm, RmsNormHeads, ScaleAct, Softcap, Swiglu, ToBf16, mmq_variant,
};
use super::recorder::Op;
use super::{GLU_CHUNKS, Gpu, MAX_GEMV_ROWS};
use crate::error::CudaError;
use crate::layout::Format;

/// Warps per GEMV block.
const GEMV_WARPS: usize = 4;
// A 32-row chunk of a gate/up GEMV with its activation fused is whole blocks.
const _: () = assert!(32 % GEMV_WARPS == 0);
/// Matrices one GEMV launch takes.
const GEMV_MATS: usize = 3;
/// Tokens per weight load of the decode-batch GEMV (the kernel's `GB_TOK`).
const GEMV_BATCH_TOK: usize = 8;
/// Weight rows and tokens of one MMQ block's output tile (the kernel's `MMQ_ROWS`, `MMQ_TOK`).
const MMQ_ROWS: usize = 64;
const MMQ_TOK: usize = 64;
/// Threads of an MMQ block (the kernel's `MMQ_THREADS`).
const MMQ_THREADS: u32 = 128;

pub(super) fn div_ceil_u32(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

impl DevAct {
    /// The q8 shadow's `(q, ds)` addresses, null when it has none.
    pub(super) fn q8_ptrs(&self) -> (Ptr, Ptr) {
        self.q
            .as_ref()
            .map_or((Ptr::NULL, Ptr::NULL), |(q, d)| (q.ptr, d.ptr))
    }
}

impl Gpu {
    /// Records the `dequant_<format>` kernel: `n_out` rows of `w` (rows `ids[r]` when `ids` is
    /// non-zero, else `0..n_out`) into `out_f32` and/or `out_bf16` (0 = not written).
    fn push_dequant(&self, w: &DevMatrix, n_out: usize, ids: Ptr, out_f32: Ptr, out_bf16: Ptr) {
        self.push(
            Dequant {
                variant: w.format as usize,
                w: w.buf.ptr,
                off1: w.off1,
                off2: w.off2,
                rows: w.rows as i32,
                cols: w.cols as i32,
                ids,
                out_f32,
                out_bf16,
            },
            [n_out as u32, 1, 1],
            [128, 1, 1],
        );
    }

    pub(super) fn same_shape(a: &DevAct, b: &DevAct, op: &str) -> Result<(), CudaError> {
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
            r.inputs.ptr.at(4)
        };
        self.push_dequant(table, ids.len(), ids_ptr, out.x.ptr, Ptr::NULL);
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
        let (q, ds) = out.q8_ptrs();
        let k = RmsNorm {
            x: x.x.ptr,
            w: w.buf.ptr,
            eps,
            out: out.x.ptr,
            q,
            ds,
            q2: Ptr::NULL,
            ds2: Ptr::NULL,
            width: x.width as i32,
            do_q: out.q.is_some(),
        };
        self.push(
            k,
            // Decode: the row over several blocks; prompts: one block per token.
            [
                if x.n == 1 {
                    div_ceil_u32(x.width, 256)
                } else {
                    1
                },
                x.n as u32,
                1,
            ],
            [256, 1, 1],
        );
        let mut r = self.rec();
        let at = r.ops.len() - 1;
        r.last_norm = Some((at, k));
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
            QuantizeQ8 {
                x: x.x.ptr,
                q: q.ptr,
                ds: ds.ptr,
                n_blocks: n_blocks as i32,
            },
            [div_ceil_u32(n_blocks, 8), 1, 1],
            [256, 1, 1],
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
        if !self.gemv_takes(x.n) {
            let xbf = x.bf.as_ref().ok_or_else(|| {
                CudaError::Shape(format!(
                    "matmul: [{}, {}] without a bf16 copy",
                    x.n, x.width
                ))
            })?;
            let on = self.mmq_takes(x.n);
            let mmq = |w: &DevMatrix| Self::mmq_kernel(w, x).filter(|_| on);
            if pairs.iter().any(|(w, _)| mmq(w).is_some()) {
                self.ensure_q8(x)?;
            }
            if pairs.iter().any(|(w, _)| mmq(w).is_none()) {
                let n = x.n * x.width;
                self.push(
                    ToBf16 {
                        x: x.x.ptr,
                        y: xbf.ptr,
                        n: n as i32,
                    },
                    [div_ceil_u32(n, 256), 1, 1],
                    [256, 1, 1],
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
        let (q, ds) = x.q8_ptrs();
        let (q2, ds2) = self.second_level(x, pairs);
        let mut rest = pairs;
        while let Some(((w0, _), _)) = rest.split_first() {
            let same = rest
                .iter()
                .take(GEMV_MATS)
                .take_while(|(w, _)| w.format == w0.format)
                .count();
            let (group, tail) = rest.split_at(same);
            rest = tail;
            // One slot per matrix, unused slots zero.
            let mut mats = [GemvMat::default(); GEMV_MATS];
            let mut blocks = 0;
            for (slot, (w, out)) in mats.iter_mut().zip(group) {
                *slot = GemvMat {
                    w: w.buf.ptr,
                    off1: w.off1,
                    off2: w.off2,
                    rows: w.rows as i32,
                    out: out.x.ptr,
                };
                blocks += w.rows.div_ceil(GEMV_WARPS);
            }
            let xq2 = if group.iter().any(|(w, _)| w.two_level) {
                q2
            } else {
                Ptr::NULL
            };
            let block = [32 * GEMV_WARPS as u32, 1, 1];
            if x.n > 1 && self.gemv_batch_enabled.load(Ordering::Relaxed) {
                // (row block, token group of GEMV_BATCH_TOK), group fastest.
                let grid = [(blocks * x.n.div_ceil(GEMV_BATCH_TOK)) as u32, 1, 1];
                self.push(
                    GemvBatch {
                        variant: w0.format as usize,
                        mats,
                        cols: w0.cols as i32,
                        xq: q,
                        xds: ds,
                        xf: x.x.ptr,
                        xq2,
                        xds2: ds2,
                        acc,
                        prefetch: self.pdl_prefetch(),
                        n_tok: x.n as i32,
                    },
                    grid,
                    block,
                );
                continue;
            }
            let k = Gemv {
                variant: w0.format as usize,
                mats,
                cols: w0.cols as i32,
                xq: q,
                xds: ds,
                xf: x.x.ptr,
                xq2,
                xds2: ds2,
                acc,
                prefetch: self.pdl_prefetch(),
                glu: 0,
                gq: Ptr::NULL,
                gds: Ptr::NULL,
                cnt: Ptr::NULL,
            };
            // (row block, token), token fastest (the kernel's order).
            self.push(k, [(blocks * x.n) as u32, 1, 1], block);
            if x.n == 1 {
                let mut r = self.rec();
                let at = r.ops.len() - 1;
                r.last_gemv = Some((at, k));
            }
        }
        Ok(())
    }

    /// x's second q8 level (written now), when one of `pairs` takes two-level activations and
    /// they are on; else null pointers. The caller made the first level current.
    fn second_level(&self, x: &DevAct, pairs: &[(&DevMatrix, &DevAct)]) -> (Ptr, Ptr) {
        let want = self.two_level_qkv.load(Ordering::Relaxed)
            && pairs
                .iter()
                .any(|(w, _)| w.two_level && w.format != Format::F16);
        match (&x.q, &x.q2) {
            (Some((q, ds)), Some((q2, ds2))) if want && x.n <= MAX_GEMV_ROWS => {
                if self.fuse_second_level(x, q2.ptr, ds2.ptr) {
                    return (q2.ptr, ds2.ptr);
                }
                let n_blocks = x.n * x.width / 32;
                self.push(
                    QuantizeQ8Res {
                        x: x.x.ptr,
                        q: q.ptr,
                        ds: ds.ptr,
                        q2: q2.ptr,
                        ds2: ds2.ptr,
                        n_blocks: n_blocks as i32,
                    },
                    [div_ceil_u32(n_blocks, 8), 1, 1],
                    [256, 1, 1],
                );
                (q2.ptr, ds2.ptr)
            }
            _ => (Ptr::NULL, Ptr::NULL),
        }
    }

    /// With the fusions on ([`Gpu::set_fuse`]), when the last op recorded is the one-token GEMV
    /// that wrote `gate` (slot 0) and `up` (slot 1) alone, of rows a multiple of 32 (and
    /// of at most `GLU_CHUNKS` chunks), has it apply the activation `glu` (1 SwiGLU, 2 GeGLU)
    /// and write gate's q8 shadow; false (nothing changed) otherwise. The caller checked the
    /// shapes.
    fn fuse_glu(&self, gate: &DevAct, up: &DevAct, glu: i32) -> bool {
        if !self.fuse.load(Ordering::Relaxed) || gate.n != 1 {
            return false;
        }
        let mut r = self.rec();
        let Some((at, mut k)) = r.last_gemv else {
            return false;
        };
        let [m0, m1, m2] = k.mats;
        let rows = gate.width;
        let fits = at + 1 == r.ops.len()
            && !k.acc
            && m0.out == gate.x.ptr
            && m1.out == up.x.ptr
            && m2.rows == 0
            && m0.rows as usize == rows
            && m1.rows as usize == rows
            && rows.is_multiple_of(32)
            && rows / 32 <= GLU_CHUNKS;
        if !fits {
            return false;
        }
        let (q, ds) = gate.q8_ptrs();
        k.glu = glu;
        k.gq = q;
        k.gds = ds;
        k.cnt = self.glu_counts.ptr;
        match &mut r.ops[at] {
            Op::Launch { args, .. } => *args = k.args(),
            _ => return false,
        }
        r.last_gemv = None;
        gate.q_fresh.store(gate.q.is_some(), Ordering::Relaxed);
        true
    }

    /// With the fusions on ([`Gpu::set_fuse`]), when the last op recorded is the RMSNorm that
    /// wrote x and its q8 shadow, has that launch write x's second level (`q2`, `ds2`) too;
    /// false (nothing changed) otherwise.
    fn fuse_second_level(&self, x: &DevAct, q2: Ptr, ds2: Ptr) -> bool {
        if !self.fuse.load(Ordering::Relaxed) {
            return false;
        }
        let mut r = self.rec();
        let Some((at, mut k)) = r.last_norm else {
            return false;
        };
        if at + 1 != r.ops.len() || k.out != x.x.ptr || !k.do_q || k.q != x.q8_ptrs().0 {
            return false;
        }
        k.q2 = q2;
        k.ds2 = ds2;
        match &mut r.ops[at] {
            Op::Launch { args, .. } => *args = k.args(),
            _ => return false,
        }
        r.last_norm = Some((at, k));
        true
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
    fn mmq_kernel(w: &DevMatrix, x: &DevAct) -> Option<usize> {
        let kernel = mmq_variant(w.format)?;
        (w.rows.is_multiple_of(32) && x.q.is_some() && x.n.div_ceil(MMQ_TOK) <= 65535)
            .then_some(kernel)
    }

    /// Records `kernel` (from [`Gpu::mmq_kernel`]): out `[n, rows]` f32 (+)= x's q8 shadow
    /// (`[n, cols]` int8, `[n, cols / 32]` float2) · Wᵀ. The caller checked the shapes and made
    /// the shadow current.
    fn push_mmq(&self, kernel: usize, w: &DevMatrix, x: &DevAct, out: &DevAct, acc: bool) {
        let (xq, xds) = x.q8_ptrs();
        self.push(
            Mmq {
                variant: kernel,
                w: w.buf.ptr,
                off1: w.off1,
                off2: w.off2,
                rows: w.rows as i32,
                cols: w.cols as i32,
                xq,
                xds,
                out: out.x.ptr,
                n_tok: x.n as i32,
                acc,
            },
            [
                div_ceil_u32(w.rows, MMQ_ROWS),
                div_ceil_u32(x.n, MMQ_TOK),
                1,
            ],
            [MMQ_THREADS, 1, 1],
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
                self.push_dequant(w, w.rows, Ptr::NULL, Ptr::NULL, buf.ptr);
                *slot = Some(buf);
            }
            slot.as_ref().map_or(Ptr::NULL, |b| b.ptr)
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

    /// `gate = silu(gate) * up` (and gate's q8 shadow).
    pub fn swiglu(&self, gate: &DevAct, up: &DevAct) -> Result<(), CudaError> {
        Self::same_shape(gate, up, "swiglu")?;
        let n = gate.n * gate.width;
        if !n.is_multiple_of(32) {
            return Err(CudaError::Shape(format!(
                "swiglu: {n} elements, not a multiple of 32"
            )));
        }
        if self.fuse_glu(gate, up, 1) {
            return Ok(());
        }
        let (q, ds) = gate.q8_ptrs();
        self.push(
            Swiglu {
                gate: gate.x.ptr,
                up: up.x.ptr,
                q,
                ds,
                n_blocks: (n / 32) as i32,
                do_q: gate.q.is_some(),
            },
            [div_ceil_u32(n / 32, 8), 1, 1],
            [256, 1, 1],
        );
        gate.q_fresh.store(gate.q.is_some(), Ordering::Relaxed);
        Ok(())
    }

    /// `gate = gelu_tanh(gate) * up` (GeGLU; and gate's q8 shadow).
    pub fn geglu(&self, gate: &DevAct, up: &DevAct) -> Result<(), CudaError> {
        Self::same_shape(gate, up, "geglu")?;
        let n = gate.n * gate.width;
        if !n.is_multiple_of(32) {
            return Err(CudaError::Shape(format!(
                "geglu: {n} elements, not a multiple of 32"
            )));
        }
        if self.fuse_glu(gate, up, 2) {
            return Ok(());
        }
        let (q, ds) = gate.q8_ptrs();
        self.push(
            Geglu {
                gate: gate.x.ptr,
                up: up.x.ptr,
                q,
                ds,
                n_blocks: (n / 32) as i32,
                do_q: gate.q.is_some(),
            },
            [div_ceil_u32(n / 32, 8), 1, 1],
            [256, 1, 1],
        );
        gate.q_fresh.store(gate.q.is_some(), Ordering::Relaxed);
        Ok(())
    }

    /// `x[t] += b` for every row (a projection's bias).
    pub fn add_bias(&self, x: &DevAct, b: &DevVec) -> Result<(), CudaError> {
        if b.n != x.width {
            return Err(CudaError::Shape(format!(
                "add_bias: bias of {} for width {}",
                b.n, x.width
            )));
        }
        let n = x.n * x.width;
        self.push(
            AddBias {
                x: x.x.ptr,
                b: b.buf.ptr,
                width: x.width as i32,
                n: n as i32,
            },
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// RMSNorm of every head in place: `x` `[n, n_heads, head_dim]`, `w` `[head_dim]`.
    pub fn rms_norm_heads(
        &self,
        x: &DevAct,
        w: &DevVec,
        eps: f32,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        if head_dim == 0 || w.n != head_dim || !x.width.is_multiple_of(head_dim) {
            return Err(CudaError::Shape(format!(
                "rms_norm_heads: width {} in heads of {head_dim} with a weight of {}",
                x.width, w.n
            )));
        }
        let rows = x.n * x.width / head_dim;
        self.push(
            RmsNormHeads {
                x: x.x.ptr,
                w: w.buf.ptr,
                eps,
                n_rows: rows as i32,
                head_dim: head_dim as i32,
            },
            [div_ceil_u32(rows, 8), 1, 1],
            [256, 1, 1],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// `x *= s`.
    pub fn scale(&self, x: &DevAct, s: f32) -> Result<(), CudaError> {
        let n = x.n * x.width;
        self.push(
            ScaleAct {
                x: x.x.ptr,
                s,
                n: n as i32,
            },
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// `x = cap * tanh(x / cap)` (logit soft-capping); `cap` must be positive.
    pub fn softcap(&self, x: &DevAct, cap: f32) -> Result<(), CudaError> {
        if cap.is_nan() || cap <= 0.0 {
            return Err(CudaError::Shape(format!("softcap: cap {cap}")));
        }
        let n = x.n * x.width;
        self.push(
            Softcap {
                x: x.x.ptr,
                cap,
                n: n as i32,
            },
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
        );
        x.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// `x += y`.
    pub fn add(&self, x: &DevAct, y: &DevAct) -> Result<(), CudaError> {
        Self::same_shape(x, y, "add")?;
        let n = x.n * x.width;
        self.push(
            Add {
                x: x.x.ptr,
                y: y.x.ptr,
                n: n as i32,
            },
            [div_ceil_u32(n, 256), 1, 1],
            [256, 1, 1],
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
            src: src.x.ptr.at(row * bytes),
            bytes,
        });
        dst.q_fresh.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Runs the dequantization kernel on rows `0..rows` of `w` (tests compare it with
    /// [`crate::layout::dequant_row`]).
    pub fn dequantize(&self, w: &DevMatrix) -> Result<Vec<f32>, CudaError> {
        let out = self.act(w.rows, w.cols)?;
        self.push_dequant(w, w.rows, Ptr::NULL, out.x.ptr, Ptr::NULL);
        self.read(&out)
    }
}
