//! Prefill GEMM in int8: `out[t, r] = Σ_k W[r, k] x[t, k]` with `vpdpbusd` on AVX-512 VNNI
//! (u8 weights × i8 activations → i32), `tdpbsud` on AMX-INT8 tiles, or AVX2's
//! `vpmaddubsw`, never materializing f32 weights.
//!
//! Every supported weight type is written as `w = s_b · q − m_b` per sub-block `b` of `S`
//! columns (`q` an unsigned byte, `s_b`, `m_b` f32 per row and sub-block):
//!
//! | type | S | q | s | m |
//! | --- | ---: | --- | --- | --- |
//! | Q4_K / Q5_K | 32 | 4 / 5-bit quant | `d · sc` | `dmin · m` |
//! | Q6_K | 16 | 6-bit quant | `d · sc` | `32 · d · sc` |
//! | Q8_0 | 32 | `q + 128` | `d` | `128 · d` |
//! | Q4_0 / Q5_0 | 32 | quant | `d` | `8 d` / `16 d` |
//! | Q4_1 / Q5_1 | 32 | quant | `d` | `−m` |
//!
//! Activations are quantized once per matmul ([`QActs`]: i8 per 32-block with scale `dx`, plus
//! `dx · Σ q` per sub-block), so `Σ_k w x = Σ_b s_b dx_b (Σ_{k∈b} q x_q) − m_b (dx_b Σ_{k∈b} x_q)`:
//! the integer dot of a sub-block is scaled once, and the `m` term uses the precomputed sums.
//!
//! Work unit: 32 weight rows (unpacked once into a `[k / 4][32 rows][4]` u8 panel with their
//! `[k / S][32]` scales, L2-resident) × a range of tokens, 4 tokens per micro-kernel call: per
//! 4 columns two 64-byte panel loads feed 8 `vpdpbusd`. On VNNI, where the rows pair up, a unit
//! is two such panels (64 rows) and a call takes 3 tokens: four panel loads and three
//! broadcasts feed 12 `vpdpbusd` (the broadcasts, not memory, bound the kernel). Every token
//! gets the same operations in the same order either way. On AMX ([`Int8Path::Amx`], `amx.rs`)
//! a unit's panels are the B tiles as they are and 16 tokens' activation rows the A tile, one
//! tile product per sub-block, then the same float epilogue on AVX-512: the same bits again.
//! [`gemm_i8_ref`] is the scalar twin, the same arithmetic in the same order.

use std::sync::atomic::{AtomicUsize, Ordering};

use damascus_quant::GgmlType;
use damascus_quant::fp::fp16_to_f32;

use crate::pool::{ThreadPool, split_range};
use crate::quantdot::KernelError;

use super::{SendPtr, WeightRef};

/// Weight rows per unit (two 16-lane vectors).
pub const ROWS: usize = 32;
/// Tokens per micro-kernel call.
pub(super) const NT: usize = 4;

/// The sub-block size `S` of `dtype` on this path, or `None` when it has none here.
pub fn sub_block(dtype: GgmlType) -> Option<usize> {
    match dtype {
        GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1 => Some(32),
        GgmlType::Q6_K => Some(16),
        _ => None,
    }
}

/// Why `w` cannot go through the int8 GEMM, if it cannot.
pub fn unsupported(w: &WeightRef<'_>) -> Option<String> {
    if sub_block(w.dtype).is_none() {
        return Some(format!("no int8 unpacker for {:?}", w.dtype));
    }
    if w.rows == 0 || !w.rows.is_multiple_of(ROWS) {
        return Some(format!("{} rows is not a multiple of {ROWS}", w.rows));
    }
    let bs = w.dtype.block_size();
    if w.cols == 0 || !w.cols.is_multiple_of(bs) || !w.cols.is_multiple_of(32) {
        return Some(format!("{} columns for {:?}", w.cols, w.dtype));
    }
    if w.rows.checked_mul(w.row_bytes()) != Some(w.bytes.len()) {
        return Some(format!(
            "{} bytes for [{}, {}] {:?}",
            w.bytes.len(),
            w.rows,
            w.cols,
            w.dtype
        ));
    }
    None
}

/// Activations `[n_tokens, k]` quantized for the int8 GEMM.
#[derive(Clone, Debug)]
pub struct QActs {
    pub(super) n_tokens: usize,
    pub(super) k: usize,
    /// `[n_tokens, k]` i8.
    pub(super) q: Vec<i8>,
    /// `[n_tokens, k / 32]` block scales.
    pub(super) d: Vec<f32>,
    /// `[n_tokens, k / 16]` `d · Σ q` over each 16 elements.
    s16: Vec<f32>,
    /// `[n_tokens, k / 32]` `d · Σ q` over each 32-block.
    s32: Vec<f32>,
}

impl QActs {
    /// Quantizes `x` (`[n_tokens, k]` f32, `k` a multiple of 32), tokens split over `pool`.
    pub fn new(
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<QActs, KernelError> {
        let mut a = QActs {
            n_tokens: 0,
            k: 0,
            q: Vec::new(),
            d: Vec::new(),
            s16: Vec::new(),
            s32: Vec::new(),
        };
        a.requantize(x, n_tokens, k, pool)?;
        Ok(a)
    }

    /// Quantizes `x` (`[n_tokens, k]`) into this buffer, reusing its allocations (every
    /// element is rewritten).
    pub fn requantize(
        &mut self,
        x: &[f32],
        n_tokens: usize,
        k: usize,
        pool: Option<&ThreadPool>,
    ) -> Result<(), KernelError> {
        if x.len() != n_tokens * k || !k.is_multiple_of(32) {
            return Err(KernelError::BadLength {
                what: "int8 gemm activations (k a multiple of 32)",
                expected: n_tokens * k,
                found: x.len(),
                unit: "elements",
            });
        }
        let nb = k / 32;
        let a = self;
        a.n_tokens = n_tokens;
        a.k = k;
        a.q.resize(n_tokens * k, 0);
        a.d.resize(n_tokens * nb, 0.0);
        a.s16.resize(n_tokens * 2 * nb, 0.0);
        a.s32.resize(n_tokens * nb, 0.0);
        let simd = crate::quantdot::kernels().isa() >= crate::quantdot::Isa::Avx2
            && crate::quantdot::Isa::Avx2.is_available();
        let quant = |t: usize, q: &mut [i8], d: &mut [f32], s16: &mut [f32], s32: &mut [f32]| {
            act::quantize_row(simd, &x[t * k..(t + 1) * k], q, d, s16, s32);
        };
        let nt = pool.map_or(1, ThreadPool::n_threads);
        // A few decode rows: less work than a fork/join.
        if let Some(p) = pool.filter(|_| nt > 1 && n_tokens >= 2 * nt && n_tokens * k >= 1 << 15) {
            // Chunks of whole tokens handed out over the pool, each with its rows of every
            // output array.
            let per = crate::pool::chunk_len(n_tokens, 1, nt);
            let tasks: Vec<_> =
                a.q.chunks_mut(per * k)
                    .zip(a.d.chunks_mut(per * nb))
                    .zip(a.s16.chunks_mut(per * 2 * nb))
                    .zip(a.s32.chunks_mut(per * nb))
                    .collect();
            p.for_each_task(tasks, &|c, (((q, d), s), u)| {
                for i in 0..q.len() / k {
                    quant(
                        c * per + i,
                        &mut q[i * k..(i + 1) * k],
                        &mut d[i * nb..(i + 1) * nb],
                        &mut s[i * 2 * nb..(i + 1) * 2 * nb],
                        &mut u[i * nb..(i + 1) * nb],
                    );
                }
            });
        } else {
            for t in 0..n_tokens {
                quant(
                    t,
                    &mut a.q[t * k..(t + 1) * k],
                    &mut a.d[t * nb..(t + 1) * nb],
                    &mut a.s16[t * 2 * nb..(t + 1) * 2 * nb],
                    &mut a.s32[t * nb..(t + 1) * nb],
                );
            }
        }
        Ok(())
    }

    /// Tokens.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// The per-sub-block sums for sub-block size `s` (16 or 32).
    pub(super) fn sums(&self, s: usize) -> &[f32] {
        if s == 16 { &self.s16 } else { &self.s32 }
    }

    /// The rows of tokens `t0..t0 + N` — quants (`[k]` i8), block scales (`[k / 32]`) and the
    /// sums of sub-blocks of `sz` (`[k / sz]`) — checked once here (it panics where a token
    /// lies outside the activations), so a micro-kernel reads them without per-sub-block
    /// bounds checks.
    pub(super) fn token_rows<const N: usize>(
        &self,
        t0: usize,
        sz: usize,
    ) -> ([*const i8; N], [*const f32; N], [*const f32; N]) {
        let (k, nsub, sums) = (self.k, self.k / sz, self.sums(sz));
        assert!(
            (t0 + N) * k <= self.q.len()
                && (t0 + N) * (k / 32) <= self.d.len()
                && (t0 + N) * nsub <= sums.len(),
            "int8 micro-kernel: tokens {t0}..{} outside the activations",
            t0 + N
        );
        (
            std::array::from_fn(|j| self.q[(t0 + j) * k..].as_ptr()),
            std::array::from_fn(|j| self.d[(t0 + j) * (k / 32)..].as_ptr()),
            std::array::from_fn(|j| sums[(t0 + j) * nsub..].as_ptr()),
        )
    }
}

/// One row unpacked: `q` `[k]` u8, `s` and `m` `[k / S]`.
pub(super) fn unpack_row(dtype: GgmlType, src: &[u8], q: &mut [u8], s: &mut [f32], m: &mut [f32]) {
    let h = |b: &[u8], i: usize| fp16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]));
    match dtype {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let ts = if dtype == GgmlType::Q4_0 { 18 } else { 20 };
            for (b, blk) in src.chunks_exact(ts).enumerate() {
                let d = h(blk, 0);
                let qs = &blk[ts - 16..];
                for j in 0..16 {
                    q[32 * b + j] = qs[j] & 0xF;
                    q[32 * b + j + 16] = qs[j] >> 4;
                }
                s[b] = d;
                m[b] = if dtype == GgmlType::Q4_0 {
                    8.0 * d
                } else {
                    -h(blk, 2)
                };
            }
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (ts, qh_at) = if dtype == GgmlType::Q5_0 {
                (22, 2)
            } else {
                (24, 4)
            };
            for (b, blk) in src.chunks_exact(ts).enumerate() {
                let d = h(blk, 0);
                let qh = u32::from_le_bytes([
                    blk[qh_at],
                    blk[qh_at + 1],
                    blk[qh_at + 2],
                    blk[qh_at + 3],
                ]);
                let qs = &blk[qh_at + 4..];
                for j in 0..16 {
                    q[32 * b + j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
                    q[32 * b + j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
                }
                s[b] = d;
                m[b] = if dtype == GgmlType::Q5_0 {
                    16.0 * d
                } else {
                    -h(blk, 2)
                };
            }
        }
        GgmlType::Q8_0 => {
            for (b, blk) in src.chunks_exact(34).enumerate() {
                let d = h(blk, 0);
                for j in 0..32 {
                    q[32 * b + j] = (blk[2 + j] as i8 as i16 + 128) as u8;
                }
                s[b] = d;
                m[b] = 128.0 * d;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let ts = if dtype == GgmlType::Q4_K { 144 } else { 176 };
            for (sb, blk) in src.chunks_exact(ts).enumerate() {
                let (d, dmin) = (h(blk, 0), h(blk, 2));
                let sc = &blk[4..16];
                let (qh, qs) = if dtype == GgmlType::Q4_K {
                    (None, &blk[16..144])
                } else {
                    (Some(&blk[16..48]), &blk[48..176])
                };
                for j in 0..8 {
                    let (scv, mv) = if j < 4 {
                        (sc[j] & 63, sc[j + 4] & 63)
                    } else {
                        (
                            (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4),
                            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
                        )
                    };
                    s[8 * sb + j] = d * f32::from(scv);
                    m[8 * sb + j] = dmin * f32::from(mv);
                    let qsj: &[u8; 32] = qs[32 * (j / 2)..][..32].try_into().expect("32 bytes");
                    let dst: &mut [u8; 32] = (&mut q[256 * sb + 32 * j..][..32])
                        .try_into()
                        .expect("32 bytes");
                    let shift = 4 * (j % 2);
                    for (o, &b) in dst.iter_mut().zip(qsj) {
                        *o = (b >> shift) & 0xF;
                    }
                    if let Some(qh) = qh {
                        for (o, &hb) in dst.iter_mut().zip(qh) {
                            *o |= ((hb >> j) & 1) << 4;
                        }
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (sb, blk) in src.chunks_exact(210).enumerate() {
                let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
                let d = h(blk, 208);
                for n in 0..2 {
                    for l in 0..32 {
                        let (a, b, hh) = (ql[64 * n + l], ql[64 * n + l + 32], qh[32 * n + l]);
                        let o = 256 * sb + 128 * n + l;
                        q[o] = (a & 0xF) | ((hh & 3) << 4);
                        q[o + 32] = (b & 0xF) | (((hh >> 2) & 3) << 4);
                        q[o + 64] = (a >> 4) | (((hh >> 4) & 3) << 4);
                        q[o + 96] = (b >> 4) | (((hh >> 6) & 3) << 4);
                    }
                }
                for (i, &c) in sc.iter().enumerate() {
                    let v = d * f32::from(c as i8);
                    s[16 * sb + i] = v;
                    m[16 * sb + i] = 32.0 * v;
                }
            }
        }
        _ => unreachable!("checked by `unsupported`"),
    }
}

/// `w[r, k]` as this path sees it (`s · q − m`), for tests against the dequantizer.
pub fn unpacked_row(dtype: GgmlType, src: &[u8], k: usize) -> Option<Vec<f32>> {
    let sz = sub_block(dtype)?;
    let (mut q, mut s, mut m) = (vec![0u8; k], vec![0f32; k / sz], vec![0f32; k / sz]);
    unpack_row(dtype, src, &mut q, &mut s, &mut m);
    Some(
        (0..k)
            .map(|i| s[i / sz] * f32::from(q[i]) - m[i / sz])
            .collect(),
    )
}

/// The 32 rows `r0..r0 + 32` of `w` as the micro-kernel reads them.
pub(super) struct Panel {
    /// `[k / 4][32]` quads of 4 u8 (little-endian u32), i.e. `[k / 4][32][4]` bytes.
    pub(super) q: Vec<u32>,
    /// `[k / S][32]` scales.
    pub(super) s: Vec<f32>,
    /// `[k / S][32]` offsets.
    pub(super) m: Vec<f32>,
    /// Scratch `[k]` u8, `[k / S]` f32 ×2: one row.
    row_q: Vec<u8>,
    row_s: Vec<f32>,
    row_m: Vec<f32>,
}

impl Panel {
    pub(super) fn new(k: usize, sz: usize) -> Panel {
        Panel {
            q: vec![0; k / 4 * ROWS],
            s: vec![0.0; k / sz * ROWS],
            m: vec![0.0; k / sz * ROWS],
            row_q: vec![0; k],
            row_s: vec![0.0; k / sz],
            row_m: vec![0.0; k / sz],
        }
    }

    /// Whether this panel has the sizes of [`Panel::new`]`(k, sz)`.
    pub(super) fn fits(&self, k: usize, sz: usize) -> bool {
        self.q.len() == k / 4 * ROWS && self.s.len() == k / sz * ROWS && self.row_q.len() == k
    }

    pub(super) fn fill(&mut self, w: &WeightRef<'_>, r0: usize) {
        let rb = w.row_bytes();
        for r in 0..ROWS {
            let src = &w.bytes[(r0 + r) * rb..(r0 + r + 1) * rb];
            unpack_row(
                w.dtype,
                src,
                &mut self.row_q,
                &mut self.row_s,
                &mut self.row_m,
            );
            let col = self.q.iter_mut().skip(r).step_by(ROWS);
            for (dst, quad) in col.zip(self.row_q.chunks_exact(4)) {
                *dst = u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]);
            }
            for (b, (&s, &m)) in self.row_s.iter().zip(&self.row_m).enumerate() {
                self.s[b * ROWS + r] = s;
                self.m[b * ROWS + r] = m;
            }
        }
    }
}

/// Scalar twin of the micro-kernel: tokens `t0..t0 + nt`, the panel's 32 rows, into
/// `out[t * rows + r0 ..][..32]`. Same order of operations as the SIMD one: per sub-block an
/// exact integer dot, then `acc = fma(idot, s · dx, acc)` and `acc = fma(−m, xsum, acc)`.
///
/// # Safety
/// Tokens `t0..t0 + nt` and rows `r0..r0 + 32` must lie inside `out` (`[n_tokens, rows]`),
/// and no other thread may write that rectangle meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn micro_scalar(
    p: &Panel,
    x: &QActs,
    sz: usize,
    t0: usize,
    nt: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let k = x.k;
    let sums = x.sums(sz);
    for t in t0..t0 + nt {
        let xq = &x.q[t * k..(t + 1) * k];
        for r in 0..ROWS {
            let mut acc = 0f32;
            for b in 0..k / sz {
                let mut dot = 0i32;
                for (i, &xv) in xq.iter().enumerate().skip(b * sz).take(sz) {
                    let quad = p.q[i / 4 * ROWS + r].to_le_bytes();
                    dot += i32::from(quad[i % 4]) * i32::from(xv);
                }
                let dx = x.d[t * (k / 32) + b * sz / 32];
                acc = (dot as f32).mul_add(p.s[b * ROWS + r] * dx, acc);
                acc = (-p.m[b * ROWS + r]).mul_add(sums[t * (k / sz) + b], acc);
            }
            // SAFETY: inside the caller's rectangle.
            unsafe { *out.add(t * rows + r0 + r) = acc };
        }
    }
}

mod act;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod vnni;

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2;

/// Which int8 micro-kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Path {
    /// The scalar twin's loop (any CPU; for tests).
    Scalar,
    /// `vpmaddubsw` + `vpmaddwd` on AVX2 (not for Q8_0).
    Avx2,
    /// `vpdpbusd` on AVX-512 VNNI.
    Vnni,
    /// `tdpbsud` on AMX-INT8 tiles for prompts (16-token tiles; token tails, and the decode
    /// GEMV of repacked matrices, on VNNI): the same bits as [`Int8Path::Vnni`].
    Amx,
}

/// How the AMX path's tile steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TileStep {
    /// AMX-INT8 tiles.
    Tiles,
    /// Scalar emulation on the same memory (tests).
    #[cfg(test)]
    Emulated,
}

impl Int8Path {
    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        let f = crate::cpu::CpuFeatures::get();
        let x86 = cfg!(target_arch = "x86_64");
        match self {
            Int8Path::Scalar => true,
            Int8Path::Avx2 => x86 && f.avx2 && f.fma && f.f16c,
            Int8Path::Vnni => x86 && f.avx512f && f.avx512bw && f.avx512vnni,
            Int8Path::Amx => {
                Int8Path::Vnni.is_available() && f.amx_int8 && crate::cpu::Isa::Amx.is_available()
            }
        }
    }

    /// Every path this CPU can run.
    pub fn available() -> Vec<Int8Path> {
        [
            Int8Path::Scalar,
            Int8Path::Avx2,
            Int8Path::Vnni,
            Int8Path::Amx,
        ]
        .into_iter()
        .filter(|p| p.is_available())
        .collect()
    }

    /// Whether the path multiplies `dtype` (AVX2's i16 pair sums would saturate on Q8_0).
    pub fn supports(self, dtype: GgmlType) -> bool {
        sub_block(dtype).is_some() && !(self == Int8Path::Avx2 && dtype == GgmlType::Q8_0)
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Int8Path::Scalar => "int8-scalar",
            Int8Path::Avx2 => "avx2-int8",
            Int8Path::Vnni => "vnni-int8",
            Int8Path::Amx => "amx-int8",
        }
    }

    /// The path the decode GEMV of repacked matrices runs for this one (AMX: VNNI).
    pub fn gemv(self) -> Int8Path {
        if self == Int8Path::Amx {
            Int8Path::Vnni
        } else {
            self
        }
    }
}

/// Scalar twin of [`gemm_i8`]: `out` `[n_tokens, rows]`.
pub fn gemm_i8_ref(w: WeightRef<'_>, x: &QActs, out: &mut [f32]) -> Result<(), KernelError> {
    check(&w, x, out)?;
    let sz = sub_block(w.dtype).unwrap_or(32);
    let mut p = Panel::new(w.cols, sz);
    for r0 in (0..w.rows).step_by(ROWS) {
        p.fill(&w, r0);
        // SAFETY: `check` sized `out` as [n_tokens, rows]; r0 + 32 <= rows.
        unsafe { micro_scalar(&p, x, sz, 0, x.n_tokens, out.as_mut_ptr(), r0, w.rows) };
    }
    Ok(())
}

fn check(w: &WeightRef<'_>, x: &QActs, out: &[f32]) -> Result<(), KernelError> {
    if let Some(why) = unsupported(w) {
        return Err(KernelError::BadShape(format!("int8 gemm: {why}")));
    }
    if x.k != w.cols || out.len() != x.n_tokens * w.rows {
        return Err(KernelError::BadShape(format!(
            "int8 gemm: [{}, {}] activations, [{}, {}] weights, {} outputs",
            x.n_tokens,
            x.k,
            w.rows,
            w.cols,
            out.len()
        )));
    }
    Ok(())
}

/// `out = x · Wᵀ` (`out` `[n_tokens, rows]` f32) on `path`, units of 32 rows × a token range
/// split over `pool`.
pub fn gemm_i8(
    path: Int8Path,
    w: WeightRef<'_>,
    x: &QActs,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    check(&w, x, out)?;
    if !path.is_available() || !path.supports(w.dtype) {
        return Err(KernelError::BadShape(format!(
            "int8 gemm: {} cannot run {:?} on this CPU",
            path.name(),
            w.dtype
        )));
    }
    if x.n_tokens == 0 {
        return Ok(());
    }
    let sz = sub_block(w.dtype).unwrap_or(32);
    gemm_panels(
        path,
        TileStep::Tiles,
        w.rows,
        w.cols,
        sz,
        x,
        out,
        pool,
        &|p, r0| p.fill(&w, r0),
        true,
    );
    Ok(())
}

/// The unit loop of [`gemm_i8`] with the panel of rows `r0..r0 + 32` made by `fill` (from the
/// file's blocks, or from a repacked matrix). `out` is `[x.n_tokens, rows]`, already checked.
/// With `pair`, the VNNI path multiplies two panels (64 rows) per unit where the rows allow
/// ([`vnni::micro`] over two panels: the same bits as two 32-row units; `false` is its twin
/// in the tests).
/// The AMX path's tile steps run on `step` ([`TileStep::Tiles`]; the tests emulate them).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_panels(
    path: Int8Path,
    step: TileStep,
    rows: usize,
    cols: usize,
    sz: usize,
    x: &QActs,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
    fill: &(dyn Fn(&mut Panel, usize) + Sync),
    pair: bool,
) {
    debug_assert!(rows.is_multiple_of(ROWS) && out.len() == x.n_tokens * rows);
    let nt = pool.map_or(1, ThreadPool::n_threads);
    // VNNI multiplies two panels (64 rows) per unit where the rows pair up; AMX takes both
    // panels per 16-token activation tile (its tile is read from L1 for the second).
    let pair =
        pair && cfg!(target_arch = "x86_64") && matches!(path, Int8Path::Vnni | Int8Path::Amx);
    let pair = pair && rows.is_multiple_of(2 * ROWS);
    let span = if pair { 2 } else { 1 };
    let n_rb = rows / ROWS / span;
    // Token chunks only when row blocks are scarce (each chunk re-unpacks its panel).
    let tc = (2 * nt).div_ceil(n_rb).clamp(1, x.n_tokens.div_ceil(NT));
    let n_units = n_rb * tc;
    let next = AtomicUsize::new(0);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let work = |_t: usize, _nt: usize| {
        let out_ptr = &out_ptr;
        #[cfg(target_arch = "x86_64")]
        let _tiles = (path == Int8Path::Amx && step == TileStep::Tiles).then(|| {
            // SAFETY: the callers run `Int8Path::Amx` only where it is available (AMX-INT8,
            // permitted); `config` is a valid palette-1 layout.
            unsafe { crate::gemm::amx::TileGuard::with(&amx::config(sz)) }
        });
        #[cfg(not(target_arch = "x86_64"))]
        let _ = step; // tiles exist on x86-64 only
        let mut p = Panel::new(cols, sz);
        let mut p2 = if pair {
            Some(Panel::new(cols, sz))
        } else {
            None
        };
        let mut last_rb = usize::MAX;
        loop {
            let u = next.fetch_add(1, Ordering::Relaxed);
            if u >= n_units {
                break;
            }
            let (rb, tcx) = (u / tc, u % tc);
            if rb != last_rb {
                fill(&mut p, rb * span * ROWS);
                if let Some(p2) = p2.as_mut() {
                    fill(p2, (rb * span + 1) * ROWS);
                }
                last_rb = rb;
            }
            // AMX token chunks are whole 16-token tiles (only the last has a VNNI tail).
            let tr = split_range(
                x.n_tokens,
                if path == Int8Path::Amx { 16 } else { 1 },
                tcx,
                tc,
            );
            #[cfg(target_arch = "x86_64")]
            if path == Int8Path::Amx {
                let r0 = rb * span * ROWS;
                // SAFETY: AMX-INT8 and VNNI checked by the caller (tiles configured above for
                // `TileStep::Tiles`); tokens tr ⊂ 0..n_tokens and rows r0..r0 + 32·span ⊂
                // 0..rows lie inside `out`; units own disjoint rectangles.
                unsafe {
                    match p2.as_ref() {
                        Some(p2) => amx::tokens(
                            step,
                            [&p, p2],
                            x,
                            sz,
                            tr.start,
                            tr.end,
                            out_ptr.0,
                            r0,
                            rows,
                        ),
                        None => {
                            amx::tokens(step, [&p], x, sz, tr.start, tr.end, out_ptr.0, r0, rows)
                        }
                    }
                };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if let Some(p2) = p2.as_ref() {
                // SAFETY: VNNI checked by the caller; tokens tr ⊂ 0..n_tokens and rows
                // rb*64..+64 ⊂ 0..rows lie inside `out`; units own disjoint rectangles.
                unsafe {
                    vnni::tokens(
                        [&p, p2],
                        x,
                        sz,
                        tr.start,
                        tr.end,
                        out_ptr.0,
                        rb * 2 * ROWS,
                        rows,
                    )
                };
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            match path {
                Int8Path::Vnni => {
                    // SAFETY: VNNI checked by the caller; tokens tr ⊂ 0..n_tokens and rows
                    // rb*32..+32 ⊂ 0..rows lie inside `out` (checked sizes); units own disjoint
                    // rectangles.
                    unsafe {
                        vnni::tokens([&p], x, sz, tr.start, tr.end, out_ptr.0, rb * ROWS, rows)
                    };
                    continue;
                }
                Int8Path::Avx2 => {
                    // SAFETY: AVX2 checked by the caller; as above.
                    unsafe {
                        avx2::tokens(&p, x, sz, tr.start, tr.end, out_ptr.0, rb * ROWS, rows)
                    };
                    continue;
                }
                Int8Path::Scalar | Int8Path::Amx => {}
            }
            // SAFETY: as above; this unit's rectangle is written by this thread only.
            unsafe { micro_scalar(&p, x, sz, tr.start, tr.len(), out_ptr.0, rb * ROWS, rows) };
        }
    };
    match pool {
        Some(p) if nt > 1 => p.run(&work),
        _ => work(0, 1),
    }
}

#[cfg(test)]
pub(super) mod tests;
