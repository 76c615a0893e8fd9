//! The CPU backend's matmuls. Which kernel multiplies a prepared matrix (repacked panels,
//! the int8 or bf16-panel prompt GEMM, or per-token dot products) is the kernels crate's
//! [`matmul::Plan`] (a [`Route`] per layout and token count, run by [`matmul::run`]); what
//! stays here is model-specific: matrices fused into one fork/join (Q/K/V, gate/up with their
//! SwiGLU), two-level activations for Q/K/V, the activation buffers kept between matmuls,
//! profile labels, the per-token dot products, and how the work is cut into chunks handed out
//! over the pool ([`ThreadPool::for_each_task`]: a late thread costs one chunk, and a chunk's
//! result never depends on the thread that ran it).

use std::ops::Range;

use damascus_kernels::gemm::packed::PackedMatrix;
use damascus_kernels::gemm::{self, GemmPath, PackedActs, WeightRef};
use damascus_kernels::matmul::{self, ActForm, Activations, Route, Weights};
use damascus_kernels::pool::chunk_len;
use damascus_kernels::quantdot::{self, ActType, Acts, BlockQ8_0, BlockQ8_1, BlockQ8K, QK, QK_K};
use damascus_quant::dequantize_row;

use super::{
    CpuBackend, CpuMatrix, FirstError, MatKind, ROW_ALIGN, TOKEN_TILE, dot_f32, kernel_err,
};
use crate::backend::profile::weight_class;
use crate::backend::reference::HostAct;
use crate::error::ModelError;

/// `f(i, rows, out)` of [`CpuBackend::row_split`]: matrix `i`'s rows `rows` for every token
/// into `out` (`[n_tokens, rows.len()]`).
type RowFn<'a> = dyn Fn(usize, Range<usize>, &mut [f32]) -> Result<(), ModelError> + Sync + 'a;

/// One task of a row split: rows `rows` of matrix `i` (and, fused, of matrix `i + 1`) and
/// where they go: straight into the outputs for one token, a `[n_tokens, rows.len()]` buffer
/// for several.
struct RowTask<'a> {
    i: usize,
    rows: Range<usize>,
    out: &'a mut [f32],
    /// The up projection's chunk when gate/up are fused with their SwiGLU (one token).
    up: Option<&'a mut [f32]>,
}

impl CpuBackend {
    /// `outs[i][t, r] = f(i, rows ∋ r)` for a few tokens, rows cut into `align`-aligned
    /// chunks handed out over the pool. `f(i, rows, out)` writes `[n_tokens, rows.len()]`
    /// into `out`. With `swiglu` (gate/up of one token, equal rows) each chunk's SwiGLU is
    /// applied in the same task; otherwise after.
    fn row_split(
        &self,
        ws: &[&CpuMatrix],
        outs: &mut [&mut HostAct],
        n_tokens: usize,
        align: usize,
        swiglu: bool,
        f: &RowFn<'_>,
    ) -> Result<(), ModelError> {
        let nt = self.pool.n_threads();
        let fuse = swiglu && n_tokens == 1 && ws.len() == 2 && ws[0].rows == ws[1].rows;
        let lens: Vec<usize> = ws.iter().map(|w| chunk_len(w.rows, align, nt)).collect();
        // Several tokens: per task a [n_tokens, rows] buffer, gathered below.
        let mut bufs: Vec<(usize, Range<usize>, Vec<f32>)> = Vec::new();
        let mut tasks: Vec<RowTask<'_>> = Vec::new();
        if n_tokens == 1 {
            let mut it = outs.iter_mut();
            if fuse {
                let (g, u) = (it.next(), it.next());
                if let (Some(g), Some(u)) = (g, u) {
                    let chunks = g.data.chunks_mut(lens[0]).zip(u.data.chunks_mut(lens[0]));
                    for (c, (g, u)) in chunks.enumerate() {
                        let r0 = c * lens[0];
                        let rows = r0..r0 + g.len();
                        tasks.push(RowTask {
                            i: 0,
                            rows,
                            out: g,
                            up: Some(u),
                        });
                    }
                }
            } else {
                for (i, o) in it.enumerate() {
                    for (c, out) in o.data.chunks_mut(lens[i]).enumerate() {
                        let rows = c * lens[i]..c * lens[i] + out.len();
                        tasks.push(RowTask {
                            i,
                            rows,
                            out,
                            up: None,
                        });
                    }
                }
            }
        } else {
            for (i, w) in ws.iter().enumerate() {
                for r0 in (0..w.rows).step_by(lens[i].max(1)) {
                    let rows = r0..(r0 + lens[i]).min(w.rows);
                    bufs.push((i, rows.clone(), vec![0.0; rows.len() * n_tokens]));
                }
            }
            tasks = bufs
                .iter_mut()
                .map(|(i, rows, b)| RowTask {
                    i: *i,
                    rows: rows.clone(),
                    out: b,
                    up: None,
                })
                .collect();
        }
        let err = FirstError::default();
        self.pool.for_each_task(tasks, &|_, t| {
            let res = f(t.i, t.rows.clone(), t.out).and_then(|()| match t.up {
                Some(up) => {
                    f(t.i + 1, t.rows, up)?;
                    damascus_kernels::elementwise::swiglu(t.out, up);
                    Ok(())
                }
                None => Ok(()),
            });
            if let Err(e) = res {
                err.set(e);
            }
        });
        err.into_result()?;
        for (i, rows, b) in bufs {
            let width = ws[i].rows;
            for tok in 0..n_tokens {
                outs[i].data[tok * width + rows.start..tok * width + rows.end]
                    .copy_from_slice(&b[tok * rows.len()..(tok + 1) * rows.len()]);
            }
        }
        if swiglu && !fuse {
            let (g, rest) = outs.split_at_mut(1);
            damascus_kernels::elementwise::swiglu(&mut g[0].data, &rest[0].data);
        }
        Ok(())
    }
}

/// Quantized activations of `n_tokens` rows, one block vector per row laid end to end.
enum QActs {
    K(Vec<BlockQ8K>),
    Q0(Vec<BlockQ8_0>),
    Q1(Vec<BlockQ8_1>),
}

impl QActs {
    /// Row `t` of `nb` blocks.
    fn row(&self, t: usize, nb: usize) -> Acts<'_> {
        match self {
            QActs::K(b) => Acts::Q8K(&b[t * nb..(t + 1) * nb]),
            QActs::Q0(b) => Acts::Q8_0(&b[t * nb..(t + 1) * nb]),
            QActs::Q1(b) => Acts::Q8_1(&b[t * nb..(t + 1) * nb]),
        }
    }
}

/// One matmul input: the f32 rows and, per activation type some weight needs, their
/// quantization.
struct Input<'a> {
    /// `[n_tokens, k]` f32.
    x: &'a [f32],
    k: usize,
    q8k: Option<QActs>,
    q80: Option<QActs>,
    q81: Option<QActs>,
}

impl Input<'_> {
    fn acts(&self, at: ActType, t: usize) -> Option<Acts<'_>> {
        let (q, qk) = match at {
            ActType::Q8_K => (&self.q8k, QK_K),
            ActType::Q8_0 => (&self.q80, QK),
            ActType::Q8_1 => (&self.q81, QK),
        };
        q.as_ref().map(|q| q.row(t, self.k / qk))
    }
}

impl CpuBackend {
    /// Quantizes `x` (`[n_tokens, k]` f32) to `at`, split by tokens when there are several.
    fn quantize(&self, x: &[f32], k: usize, at: ActType) -> Result<QActs, ModelError> {
        fn run<B: Copy + Send>(
            be: &CpuBackend,
            x: &[f32],
            k: usize,
            qk: usize,
            zero: B,
            f: fn(&[f32], &mut [B]) -> Result<(), quantdot::KernelError>,
        ) -> Result<Vec<B>, ModelError> {
            let nb = k / qk;
            let n_tokens = x.len() / k;
            let mut out = vec![zero; n_tokens * nb]; // [n_tokens, k / qk] blocks
            if n_tokens < 2 * be.pool.n_threads() {
                f(x, &mut out).map_err(|e| kernel_err("activation quantization", e))?;
                return Ok(out);
            }
            let per = chunk_len(n_tokens, 1, be.pool.n_threads());
            let err = FirstError::default();
            be.pool.for_each_chunk_mut(&mut out, per * nb, &|c, chunk| {
                let t0 = c * per;
                let xs = &x[t0 * k..(t0 + chunk.len() / nb) * k];
                if let Err(e) = f(xs, chunk) {
                    err.set(kernel_err("activation quantization", e));
                }
            });
            err.into_result()?;
            Ok(out)
        }
        if !k.is_multiple_of(QK) || (at == ActType::Q8_K && !k.is_multiple_of(QK_K)) {
            return Err(ModelError::Tensor {
                what: format!("matmul: row length {k} is not a whole number of {at:?} blocks"),
            });
        }
        Ok(match at {
            ActType::Q8_K => QActs::K(run(
                self,
                x,
                k,
                QK_K,
                BlockQ8K::ZERO,
                quantdot::quantize_q8_k,
            )?),
            ActType::Q8_0 => QActs::Q0(run(
                self,
                x,
                k,
                QK,
                BlockQ8_0::ZERO,
                quantdot::quantize_q8_0,
            )?),
            ActType::Q8_1 => QActs::Q1(run(
                self,
                x,
                k,
                QK,
                BlockQ8_1::ZERO,
                quantdot::quantize_q8_1,
            )?),
        })
    }

    /// Prepares `x` for every matrix in `ws` (quantizing once per activation type).
    fn input<'a>(&self, x: &'a HostAct, ws: &[&CpuMatrix]) -> Result<Input<'a>, ModelError> {
        let mut inp = Input {
            x: &x.data,
            k: x.width,
            q8k: None,
            q80: None,
            q81: None,
        };
        for w in ws {
            if x.width != w.cols {
                return Err(ModelError::Tensor {
                    what: format!(
                        "matmul: x row has {} elements, {} has {} columns",
                        x.width,
                        w.tensor.name(),
                        w.cols
                    ),
                });
            }
            if let MatKind::Quant(wt) = w.kind {
                let at = wt.act_type();
                let slot = match at {
                    ActType::Q8_K => &mut inp.q8k,
                    ActType::Q8_0 => &mut inp.q80,
                    ActType::Q8_1 => &mut inp.q81,
                };
                if slot.is_none() {
                    *slot = Some(self.quantize(&x.data, x.width, at)?);
                }
            }
        }
        Ok(inp)
    }

    /// `out[(t - tokens.start) * stride + (r - rows.start)] = W[r] · x[t]` for `r` in `rows`,
    /// `t` in `tokens`, on the calling thread. `w`: the matrix bytes, `scratch`: f32 row
    /// buffer for dequantized types.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        m: &CpuMatrix,
        w: &[u8],
        inp: &Input<'_>,
        rows: Range<usize>,
        tokens: Range<usize>,
        out: &mut [f32],
        stride: usize,
        scratch: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let rb = m.row_bytes;
        match m.kind {
            MatKind::Quant(wt) => {
                let at = wt.act_type();
                let mut t0 = tokens.start;
                while t0 < tokens.end {
                    let t1 = (t0 + TOKEN_TILE).min(tokens.end);
                    for r in rows.clone() {
                        let wr = &w[r * rb..(r + 1) * rb];
                        for t in t0..t1 {
                            let a = inp.acts(at, t).ok_or_else(|| ModelError::Tensor {
                                what: format!("matmul: {at:?} activations missing"),
                            })?;
                            out[(t - tokens.start) * stride + (r - rows.start)] =
                                self.kern.dot_unchecked_len(wt, wr, a);
                        }
                    }
                    t0 = t1;
                }
            }
            MatKind::Dequant => {
                let kk = inp.k;
                scratch.resize(kk, 0.0); // [k] f32 one dequantized weight row
                for r in rows.clone() {
                    dequantize_row(m.dtype, &w[r * rb..(r + 1) * rb], scratch).map_err(|e| {
                        ModelError::Tensor {
                            what: format!("matmul: {} row {r}: {e}", m.tensor.name()),
                        }
                    })?;
                    for t in tokens.clone() {
                        out[(t - tokens.start) * stride + (r - rows.start)] =
                            dot_f32(scratch, &inp.x[t * kk..(t + 1) * kk]);
                    }
                }
            }
        }
        Ok(())
    }

    /// `outs[i] = x · ws[i]ᵀ` for every `i`, in one fork/join; `swiglu` applies
    /// `outs[0] = silu(outs[0]) * outs[1]` in the same pass.
    pub(super) fn matmuls(
        &self,
        ws: &[&CpuMatrix],
        x: &HostAct,
        outs: &mut [&mut HostAct],
        swiglu: bool,
    ) -> Result<(), ModelError> {
        let n_tokens = x.n_tokens;
        for (w, o) in ws.iter().zip(outs.iter()) {
            if o.width != w.rows || o.n_tokens != n_tokens || o.data.len() != n_tokens * w.rows {
                return Err(ModelError::Tensor {
                    what: format!(
                        "matmul: out is [{}, {}], expected [{n_tokens}, {}] ({})",
                        o.n_tokens,
                        o.width,
                        w.rows,
                        w.tensor.name()
                    ),
                });
            }
        }
        if ws.iter().any(|w| w.packed.is_some()) {
            if ws.iter().all(|w| w.packed.is_some() && w.cols == x.width) {
                return self.packed_matmuls(ws, x, outs, swiglu);
            }
            // A mix: each matrix on its own path, the SwiGLU after.
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                self.matmuls(&[*w], x, &mut [&mut **o], false)?;
            }
            if swiglu {
                let (g, rest) = outs.split_at_mut(1);
                damascus_kernels::elementwise::swiglu(&mut g[0].data, &rest[0].data);
            }
            return Ok(());
        }
        // Matrices left in the file layout take the per-row dot products at every row count
        // unless the plan says otherwise (`Plan::file_route`: batch and prefix invariance).
        let group_ok = ws.iter().all(|w| w.gemm_ok && w.cols == x.width);
        if self.plan.file_gemm(n_tokens, group_ok).is_some() {
            return self.gemm_matmuls(ws, x, outs, swiglu);
        }
        let key = || {
            let names: Vec<&str> = ws.iter().map(|w| weight_class(w.tensor.name())).collect();
            format!("dot {}", names.join("+"))
        };
        self.timed(key, || self.dot_matmuls(ws, x, outs, swiglu))
    }

    /// [`CpuBackend::matmuls`] through the per-token dot products.
    fn dot_matmuls(
        &self,
        ws: &[&CpuMatrix],
        x: &HostAct,
        outs: &mut [&mut HostAct],
        swiglu: bool,
    ) -> Result<(), ModelError> {
        let n_tokens = x.n_tokens;
        let inp = self.input(x, ws)?;
        let views = ws
            .iter()
            .map(|w| w.tensor.view())
            .collect::<Result<Vec<_>, _>>()?;
        let bytes = views
            .iter()
            .map(|v| v.bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let nt = self.pool.n_threads();
        if n_tokens < 2 * nt {
            // Decode-sized inputs split rows.
            return self.row_split(ws, outs, n_tokens, ROW_ALIGN, swiglu, &|i, rows, out| {
                let mut scratch = Vec::new();
                let stride = rows.len();
                self.block(
                    ws[i],
                    bytes[i],
                    &inp,
                    rows,
                    0..n_tokens,
                    out,
                    stride,
                    &mut scratch,
                )
            });
        }
        // Prompts split tokens, in chunks of whole tiles.
        let per = chunk_len(n_tokens, TOKEN_TILE, nt);
        let mut tasks: Vec<(usize, Range<usize>, &mut [f32])> = Vec::new();
        for (i, (w, o)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            for (c, out) in o.data.chunks_mut(per * w.rows).enumerate() {
                let t0 = c * per;
                tasks.push((i, t0..t0 + out.len() / w.rows, out));
            }
        }
        let err = FirstError::default();
        self.pool.for_each_task(tasks, &|_, (i, tokens, out)| {
            let (w, mut scratch) = (ws[i], Vec::new());
            if let Err(e) = self.block(
                w,
                bytes[i],
                &inp,
                0..w.rows,
                tokens,
                out,
                w.rows,
                &mut scratch,
            ) {
                err.set(e);
            }
        });
        err.into_result()?;
        if swiglu {
            self.swiglu_rows(outs);
        }
        Ok(())
    }
}

impl CpuBackend {
    /// [`CpuBackend::matmuls`] on repacked matrices: `x` quantized (or, for AMX, packed as
    /// bf16) once; prompts through [`PackedMatrix::gemm`] ([`PackedMatrix::gemm_amx`] on AMX
    /// CPUs), decode (and short inputs) split by 32-row panels
    /// over the threads in one fork/join for every matrix, gate/up with the SwiGLU in the same
    /// pass.
    fn packed_matmuls(
        &self,
        ws: &[&CpuMatrix],
        x: &HostAct,
        outs: &mut [&mut HostAct],
        swiglu: bool,
    ) -> Result<(), ModelError> {
        let n = x.n_tokens;
        let Some(route) = self.plan.packed_route(n) else {
            unreachable!("matrices are repacked only with a packed path")
        };
        fn packed(w: &CpuMatrix) -> &PackedMatrix {
            w.packed
                .as_ref()
                .unwrap_or_else(|| unreachable!("checked by the caller"))
        }
        let pool = Some(&self.pool);
        if route == Route::PackedAmx {
            let mut bufs = self.gemm_bufs.lock().unwrap_or_else(|p| p.into_inner());
            let xp = Activations::Bf16(self.bf16_acts(&mut bufs.0, GemmPath::Amx, x)?);
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                let wp = Weights::Packed(packed(w));
                self.timed(gemm_key(w, route), || {
                    matmul::run(route, wp, xp, &mut o.data, pool)
                })
                .map_err(|e| kernel_err(w.tensor.name(), e))?;
            }
            drop(bufs);
            if swiglu {
                self.swiglu_rows(outs);
            }
            return Ok(());
        }
        if let Route::PackedGemm(_) = route {
            let mut bufs = self.gemm_bufs.lock().unwrap_or_else(|p| p.into_inner());
            let xq = self.int8_acts(&mut bufs.1, x)?;
            let rq = self.residual_acts(ws, xq, x)?;
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                let wp = Weights::Packed(packed(w));
                let out = &mut o.data;
                self.timed(gemm_key(w, route), || {
                    matmul::run(route, wp, Activations::Int8(xq), out, pool)
                })
                .map_err(|e| kernel_err(w.tensor.name(), e))?;
                if let Some(rq) = rq.as_ref().filter(|_| two_level(w)) {
                    self.timed(gemm_key(w, route), || {
                        matmul::run_add(route, wp, Activations::Int8(rq), out, pool)
                    })
                    .map_err(|e| kernel_err(w.tensor.name(), e))?;
                }
            }
            drop(bufs);
            if swiglu {
                self.swiglu_rows(outs);
            }
            return Ok(());
        }
        let key = || {
            let names: Vec<&str> = ws.iter().map(|w| weight_class(w.tensor.name())).collect();
            format!("gemv {} packed", names.join("+"))
        };
        self.timed(key, || {
            // Small: a fresh buffer, so concurrent sequences never wait on a shared one.
            let xq = gemm::int8::QActs::new(&x.data, n, x.width, pool)
                .map_err(|e| kernel_err("int8 activations", e))?;
            let rq = self.residual_acts(ws, &xq, x)?;
            let rows = gemm::int8::ROWS;
            self.row_split(ws, outs, n, rows, swiglu, &|i, r, out| {
                let panels = r.start / rows..r.end.div_ceil(rows);
                let err = |e| kernel_err(ws[i].tensor.name(), e);
                let w = packed(ws[i]);
                matmul::run_panels(route, w, &xq, panels.clone(), out, r.len()).map_err(err)?;
                if let Some(rq) = rq.as_ref().filter(|_| two_level(ws[i])) {
                    let mut lo = vec![0f32; out.len()]; // [n_tokens, rows] f32
                    matmul::run_panels(route, w, rq, panels, &mut lo, r.len()).map_err(err)?;
                    out.iter_mut().zip(&lo).for_each(|(y, l)| *y += l);
                }
                Ok(())
            })
        })
    }

    /// The residual of `xq` (what its int8 rows miss of `x`) quantized again, when one of
    /// `ws` takes two-level activations ([`two_level`]).
    fn residual_acts(
        &self,
        ws: &[&CpuMatrix],
        xq: &gemm::int8::QActs,
        x: &HostAct,
    ) -> Result<Option<gemm::int8::QActs>, ModelError> {
        if !self.two_level_qkv || !ws.iter().any(|w| two_level(w)) {
            return Ok(None);
        }
        self.timed(
            || "int8 acts (residual)".into(),
            || {
                let r = xq.residual(&x.data); // [n_tokens, k] f32
                gemm::int8::QActs::new(&r, x.n_tokens, x.width, Some(&self.pool))
            },
        )
        .map(Some)
        .map_err(|e| kernel_err("int8 residual activations", e))
    }

    /// `x` quantized for the int8 kernels into `slot`, kept between matmuls (fresh pages for
    /// every input cost more than quantizing it).
    fn int8_acts<'s>(
        &self,
        slot: &'s mut Option<gemm::int8::QActs>,
        x: &HostAct,
    ) -> Result<&'s gemm::int8::QActs, ModelError> {
        let (pool, n, k) = (Some(&self.pool), x.n_tokens, x.width);
        let r = self.timed(
            || "int8 acts (quantize)".into(),
            || match &mut *slot {
                Some(q) => q.requantize(&x.data, n, k, pool),
                s @ None => gemm::int8::QActs::new(&x.data, n, k, pool).map(|q| *s = Some(q)),
            },
        );
        r.map_err(|e| kernel_err("int8 gemm input", e))?;
        Ok(slot
            .as_ref()
            .unwrap_or_else(|| unreachable!("quantized above")))
    }

    /// `x` packed as bf16 for the GEMM `path` into `slot`, kept between matmuls.
    fn bf16_acts<'s>(
        &self,
        slot: &'s mut Option<PackedActs>,
        path: GemmPath,
        x: &HostAct,
    ) -> Result<&'s PackedActs, ModelError> {
        let (pool, n, k) = (Some(&self.pool), x.n_tokens, x.width);
        let r = self.timed(
            || "bf16 acts (pack)".into(),
            || match &mut *slot {
                Some(p) => p.repack(&x.data, n, k, pool),
                s @ None => PackedActs::for_path(path, &x.data, n, k, pool).map(|p| *s = Some(p)),
            },
        );
        r.map_err(|e| kernel_err("gemm input", e))?;
        Ok(slot
            .as_ref()
            .unwrap_or_else(|| unreachable!("packed above")))
    }

    /// `outs[0] = silu(outs[0]) · outs[1]`, split by tokens.
    fn swiglu_rows(&self, outs: &mut [&mut HostAct]) {
        let (g, rest) = outs.split_at_mut(1);
        let (gate, up) = (&mut *g[0], &*rest[0]);
        self.timed(
            || "swiglu".into(),
            || {
                self.par_rows(&mut gate.data, gate.width, &|r, chunk| {
                    damascus_kernels::elementwise::swiglu(
                        chunk,
                        &up.data[r.start * up.width..r.end * up.width],
                    );
                })
            },
        );
    }
}

impl CpuBackend {
    /// [`CpuBackend::matmuls`] through the prefill GEMM on the file's blocks: each matrix on
    /// its [`matmul::Plan::file_route`] (int8 where the weight type allows, else bf16 panels), `x`
    /// quantized or packed at most once per form.
    fn gemm_matmuls(
        &self,
        ws: &[&CpuMatrix],
        x: &HostAct,
        outs: &mut [&mut HostAct],
        swiglu: bool,
    ) -> Result<(), ModelError> {
        // Both operand forms made at most once per call, on first need, in buffers kept
        // between calls (fresh pages for every input cost more than packing it).
        let mut bufs = self.gemm_bufs.lock().unwrap_or_else(|p| p.into_inner());
        let (mut p_fresh, mut q_fresh) = (false, false);
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            let view = w.tensor.view()?;
            let wr = WeightRef {
                dtype: w.dtype,
                bytes: view.bytes()?,
                rows: w.rows,
                cols: w.cols,
            };
            let route = self.plan.file_route(&wr, x.n_tokens, true);
            let acts = match route.input() {
                ActForm::Int8 => {
                    if !q_fresh {
                        self.int8_acts(&mut bufs.1, x)?;
                        q_fresh = true;
                    }
                    let Some(xq) = &bufs.1 else {
                        unreachable!("quantized above")
                    };
                    Activations::Int8(xq)
                }
                ActForm::Bf16(path) => {
                    if !p_fresh {
                        self.bf16_acts(&mut bufs.0, path, x)?;
                        p_fresh = true;
                    }
                    let Some(xp) = &bufs.0 else {
                        unreachable!("packed above")
                    };
                    Activations::Bf16(xp)
                }
                ActForm::Dot => unreachable!("file_gemm checked by the caller"),
            };
            let out = &mut o.data;
            self.timed(gemm_key(w, route), || {
                matmul::run(route, Weights::File(wr), acts, out, Some(&self.pool))
            })
            .map_err(|e| kernel_err(w.tensor.name(), e))?;
        }
        if swiglu {
            self.swiglu_rows(outs);
        }
        Ok(())
    }
}

/// The profile label of a GEMM of `w` on `route` (`gemm attn_q Q4_K packed vnni`).
fn gemm_key(w: &CpuMatrix, route: Route) -> impl FnOnce() -> String + '_ {
    move || {
        let class = weight_class(w.tensor.name());
        format!("gemm {class} {:?} {}", w.dtype, route.name())
    }
}

/// Whether `w` multiplies two-level int8 activations (`x ≈ d₁q₁ + d₂q₂`, the second term
/// quantizing what the first misses): the Q/K/V projections, whose rounding the softmax
/// exponentiates. On Gemma 3 270M one-level int8 put the fast path up to 0.039 from HF's
/// next-token probabilities (mean 0.017 over eight prompts); two-level Q/K/V, at most 0.024
/// (mean 0.012), for about 6% more prompt time.
fn two_level(w: &CpuMatrix) -> bool {
    matches!(
        weight_class(w.tensor.name()),
        "attn_q" | "attn_k" | "attn_v" | "attn_qkv"
    )
}
