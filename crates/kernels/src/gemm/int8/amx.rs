//! The AMX-INT8 kernel of [`super`] (one file per ISA, as `vnni.rs` is): `tdpbsud` (i8
//! activations × u8 weights → i32) on tiles, one sub-block per tile product, and the float
//! epilogue of [`super::vnni::micro`] on AVX-512, so every output is the same bits as on VNNI
//! and in the scalar twin [`super::micro_scalar`] (the integer dot is exact either way).
//!
//! Roles: the **activations are the A operand**, read straight from [`QActs`] (`[16 tokens][S]`
//! i8 at stride `k`); the **panel is the B operand**, read straight from its `[k / 4][32 rows][4]`
//! u8 quads (two B tiles of `[S / 4][16 rows][4]` at a stride of 128 bytes: rows 0..16 at
//! offset 0, rows 16..32 at offset 64). C is `[16 tokens][16 rows]` i32, already in `out`'s
//! `[tokens, rows]` order, so nothing is staged or transposed.
//!
//! Per sub-block `b` of `S` columns (32, or 16 for Q6_K): zero two C tiles, load A and the two
//! B tiles, two `tdpbsud`, store C to one of two 2 KiB buffers; then per token and 16-row half
//! `acc = fma(f32(dot), s · dx, acc)`, `acc = fma(−m, xsum, acc)`. The tile step of `b + 1` is
//! issued before the epilogue of `b`, so the tile unit multiplies while the vector units scale.
//! Tokens come in tiles of 16; a tail of fewer goes to the VNNI kernel (the same bits).
//!
//! Tile registers (palette 1, [`config`]): `tmm0`/`tmm1` C (16 × 64 bytes),
//! `tmm4` A (16 rows × `S` bytes), `tmm5`/`tmm6` B (`S / 4` rows × 64 bytes).

use std::arch::asm;
use std::arch::x86_64::*;

use super::{Panel, QActs, ROWS, TileStep, vnni};
use crate::gemm::amx::TileConfig;

/// Tokens per tile step (the A tile's rows).
const TT: usize = 16;

/// The tile configuration for sub-blocks of `S` columns (see the module docs): C in
/// `tmm0`/`tmm1`, A in `tmm4`, B in `tmm5`/`tmm6`.
pub(super) fn config(sz: usize) -> TileConfig {
    assert!(
        sz == 16 || sz == 32,
        "AMX int8: sub-blocks of 16 or 32 columns"
    );
    let (c, a, b) = ((TT as u8, 64), (TT as u8, sz as u8), (sz as u8 / 4, 64));
    TileConfig::new([c, c, (0, 0), (0, 0), a, b, b, (0, 0)])
}

/// One sub-block on the tiles: `c[h][t][r] = Σ_{i < S} a[t · lda + i] · w_h[i][r]` for the
/// two 16-row halves `h`, with `w_h[i][r]` the byte at `b + (i / 4) · 128 + 64 h + 4 r + i % 4`.
///
/// # Safety
/// The tiles are configured for `S` ([`config`]) on this thread; `a` is
/// readable for 16 rows of `S` bytes at stride `lda`, `b` for `S / 4` rows of 128 bytes and
/// `c` writable for `[2][16][16]` i32.
#[inline(always)]
unsafe fn tile_step(a: *const i8, lda: usize, b: *const u8, c: *mut i32) {
    // SAFETY: pointers and tile shapes as documented.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tileloadd tmm4, [{a} + {lda}]",
            "tileloadd tmm5, [{b0} + {s128}]",
            "tileloadd tmm6, [{b1} + {s128}]",
            "tdpbsud tmm0, tmm4, tmm5",
            "tdpbsud tmm1, tmm4, tmm6",
            "tilestored [{c0} + {s64}], tmm0",
            "tilestored [{c1} + {s64}], tmm1",
            a = in(reg) a,
            lda = in(reg) lda,
            b0 = in(reg) b,
            b1 = in(reg) b.add(64),
            s128 = in(reg) 128usize,
            c0 = in(reg) c,
            c1 = in(reg) c.add(TT * 16),
            s64 = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// Scalar emulation of [`tile_step`] on the same memory (tests: the driver's layouts and
/// pointers on any CPU).
///
/// # Safety
/// As [`tile_step`], without the tile configuration.
#[cfg(test)]
unsafe fn emulate_step(sz: usize, a: *const i8, lda: usize, b: *const u8, c: *mut i32) {
    for h in 0..2 {
        for t in 0..TT {
            for r in 0..16 {
                let mut dot = 0i32;
                for i in 0..sz {
                    // SAFETY: inside the operands (caller).
                    let (x, w) = unsafe {
                        (
                            *a.add(t * lda + i),
                            *b.add(i / 4 * 128 + 64 * h + 4 * r + i % 4),
                        )
                    };
                    dot += i32::from(x) * i32::from(w);
                }
                // SAFETY: `c` holds [2][16][16] i32.
                unsafe { *c.add((h * TT + t) * 16 + r) = dot };
            }
        }
    }
}

/// `acc[t][r] = fma(−m_r, xsum_t, fma(f32(c[r / 16][t][r % 16]), s_r · dx_t, acc[t][r]))` for
/// 16 tokens × 32 rows: [`super::vnni::micro`]'s epilogue, operation for operation.
///
/// # Safety
/// AVX-512F must be available; `s` and `m` hold 32 floats.
#[target_feature(enable = "avx512f")]
unsafe fn epilogue(
    c: &[i32; 2 * TT * 16],
    acc: &mut [f32; TT * ROWS],
    s: &[f32],
    m: &[f32],
    dx: &[f32; TT],
    xsum: &[f32; TT],
) {
    let (s, m) = (&s[..ROWS], &m[..ROWS]);
    // SAFETY (block): 32 floats each in `s`, `m`; 16 per (half, token) in `c` and `acc`.
    unsafe {
        let sv = [
            _mm512_loadu_ps(s.as_ptr()),
            _mm512_loadu_ps(s.as_ptr().add(16)),
        ];
        let mv = [
            _mm512_loadu_ps(m.as_ptr()),
            _mm512_loadu_ps(m.as_ptr().add(16)),
        ];
        for t in 0..TT {
            let (d, xs) = (_mm512_set1_ps(dx[t]), _mm512_set1_ps(xsum[t]));
            for h in 0..2 {
                let dot = _mm512_loadu_si512(c.as_ptr().add((h * TT + t) * 16).cast());
                let at = acc.as_mut_ptr().add(t * ROWS + 16 * h);
                let a = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(dot),
                    _mm512_mul_ps(sv[h], d),
                    _mm512_loadu_ps(at),
                );
                _mm512_storeu_ps(at, _mm512_fnmadd_ps(mv[h], xs, a));
            }
        }
    }
}

/// The two C buffers of the pipelined steps, `[2][2 halves][16 tokens][16 rows]` i32.
#[repr(C, align(64))]
struct CBufs([[i32; 2 * TT * 16]; 2]);

/// Tokens `t0..t1` against `P` panels (rows `r0 + 32 h ..`): whole 16-token tiles on the
/// tiles (or their emulation), the rest on [`vnni::tokens`].
///
/// # Safety
/// AVX-512F/BW/VNNI must be available; for [`TileStep::Tiles`], AMX-INT8 too and this thread
/// holds a `TileGuard` of [`config`]`(sz)`; tokens `t0..t1` and rows `r0..r0 + 32·P` must lie inside
/// `x` and `out` (`[n_tokens, rows]`), and no other thread may write that rectangle meanwhile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tokens<const P: usize>(
    step: TileStep,
    p: [&Panel; P],
    x: &QActs,
    sz: usize,
    t0: usize,
    t1: usize,
    out: *mut f32,
    r0: usize,
    rows: usize,
) {
    let k = x.k;
    let nsub = k / sz;
    let sums = x.sums(sz);
    // Checked once so the tile loads below stay inside the activations and the panels.
    assert!(
        t1 * k <= x.q.len()
            && t1 * (k / 32) <= x.d.len()
            && t1 * nsub <= sums.len()
            && p.iter().all(|pn| pn.q.len() * 4 >= k * ROWS
                && pn.s.len() >= nsub * ROWS
                && pn.m.len() >= nsub * ROWS),
        "AMX int8: tokens {t0}..{t1} or panels outside their buffers"
    );
    let mut cbuf = CBufs([[0; 2 * TT * 16]; 2]);
    let mut acc = [0f32; TT * ROWS]; // [16 tokens][32 rows]
    let mut t = t0;
    while t + TT <= t1 {
        let a0 = x.q[t * k..].as_ptr();
        for (h, pn) in p.iter().enumerate() {
            acc.fill(0.0);
            let pq = pn.q.as_ptr().cast::<u8>();
            let c = [cbuf.0[0].as_mut_ptr(), cbuf.0[1].as_mut_ptr()];
            let run = |b: usize, c: *mut i32| {
                // SAFETY: sub-block b < nsub: 16 token rows of `sz` bytes from column b·sz
                // (asserted), `sz / 4` quad rows of the panel from quad b·sz/4, a C buffer.
                unsafe {
                    let (a, w) = (a0.add(b * sz), pq.add(b * sz / 4 * ROWS * 4));
                    match step {
                        TileStep::Tiles => tile_step(a, k, w, c),
                        #[cfg(test)]
                        TileStep::Emulated => emulate_step(sz, a, k, w, c),
                    }
                }
            };
            run(0, c[0]);
            for b in 0..nsub {
                if b + 1 < nsub {
                    run(b + 1, c[(b + 1) % 2]);
                }
                let dx: [f32; TT] = std::array::from_fn(|j| x.d[(t + j) * (k / 32) + b * sz / 32]);
                let xs: [f32; TT] = std::array::from_fn(|j| sums[(t + j) * nsub + b]);
                // SAFETY: AVX-512F (target feature); the step of b wrote buffer b % 2, which
                // no step writes until this epilogue is done.
                unsafe {
                    epilogue(
                        &*c[b % 2].cast::<[i32; 2 * TT * 16]>(),
                        &mut acc,
                        &pn.s[b * ROWS..],
                        &pn.m[b * ROWS..],
                        &dx,
                        &xs,
                    )
                };
            }
            for (j, a) in acc.chunks_exact(ROWS).enumerate() {
                // SAFETY: token t + j < t1 and rows r0 + 32h .. + 32 lie in the caller's
                // rectangle of `out`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        a.as_ptr(),
                        out.add((t + j) * rows + r0 + ROWS * h),
                        ROWS,
                    )
                };
            }
        }
        t += TT;
    }
    if t < t1 {
        // SAFETY: forwarded from the caller (VNNI available, the rectangle inside `out`).
        unsafe { vnni::tokens(p, x, sz, t, t1, out, r0, rows) };
    }
}

#[cfg(test)]
mod tests {
    /// C in tmm0/tmm1 (16 × 64 bytes), A in tmm4 (16 × S), B in tmm5/tmm6 (S / 4 × 64), the
    /// rest unused: the shapes `tile_step` and the module docs assume.
    #[test]
    fn int8_tile_configuration_matches_the_step() {
        for sz in [16usize, 32] {
            let b = *super::config(sz).bytes();
            assert_eq!(b[0], 1, "palette 1");
            let shape = |t: usize| {
                (
                    b[48 + t],
                    u16::from_le_bytes([b[16 + 2 * t], b[17 + 2 * t]]),
                )
            };
            let want = [
                (16, 64),
                (16, 64),
                (0, 0),
                (0, 0),
                (16, sz as u16),
                (sz as u8 / 4, 64),
                (sz as u8 / 4, 64),
                (0, 0),
            ];
            for (t, &w) in want.iter().enumerate() {
                assert_eq!(shape(t), w, "S = {sz}, tile {t}");
            }
        }
    }
}
