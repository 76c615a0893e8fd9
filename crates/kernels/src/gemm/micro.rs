//! The portable parts of the GEMM: bf16 conversion, panel scatter and the f32 FMA
//! micro-kernel, one generic body instantiated for baseline x86-64, AVX2 + FMA and AVX-512F.

use super::{KSTEP, MicroArgs, TILE, bf16_to_f32, f32_to_bf16};

/// Tokens per register block of the f32 micro-kernel.
const TB: usize = 4;

/// `out[i] = bf16(x[i])`.
pub(super) fn to_bf16(x: &[f32], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::get().avx512f {
        // SAFETY: AVX-512F is present.
        return unsafe { to_bf16_avx512(x, out) };
    }
    to_bf16_body(x, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn to_bf16_avx512(x: &[f32], out: &mut [u16]) {
    to_bf16_body(x, out);
}

#[inline(always)]
fn to_bf16_body(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f32_to_bf16(v);
    }
}

/// Writes one dequantized row `row` (`[kc]` f32) as column `n` of panel tiles
/// `tiles` (`[kc / 32][16 pairs][16 rows]` u32).
#[inline]
pub(super) fn scatter_pairs(row: &[f32], tiles: &mut [u32], n: usize) {
    for (s, seg) in row.chunks_exact(KSTEP).enumerate() {
        let tile = &mut tiles[s * TILE * TILE..(s + 1) * TILE * TILE];
        for (p, pair) in seg.chunks_exact(2).enumerate() {
            tile[p * TILE + n] =
                u32::from(f32_to_bf16(pair[0])) | (u32::from(f32_to_bf16(pair[1])) << 16);
        }
    }
}

/// The f32 micro-kernel: for each of the four C tiles, tokens in blocks of [`TB`],
/// `acc[t][n] += lo(w[p][n]) · x[t][2p] + hi(w[p][n]) · x[t][2p + 1]`.
///
/// # Safety
/// `args` describes valid memory (see [`MicroArgs`]).
#[inline(always)]
unsafe fn micro_body<const FMA: bool>(args: &MicroArgs) {
    let fma = |a: f32, b: f32, c: f32| if FMA { a.mul_add(b, c) } else { a * b + c };
    for i in 0..2 {
        for j in 0..2 {
            let idx = 2 * i + j;
            if j == 1 && args.b[0] == args.b[1] {
                continue; // duplicated group of an odd count: its C tile is discarded
            }
            let (c, cs) = (args.c.c[idx], args.c.stride[idx]);
            for t0 in (0..TILE).step_by(TB) {
                let mut acc = [[0f32; TILE]; TB];
                if args.load_c {
                    for (tt, row) in acc.iter_mut().enumerate() {
                        // SAFETY: C covers 16 rows of `cs` floats.
                        let src =
                            unsafe { std::slice::from_raw_parts(c.add((t0 + tt) * cs), TILE) };
                        row.copy_from_slice(src);
                    }
                }
                for s in 0..args.nks {
                    for p in 0..TILE {
                        // SAFETY: the group holds `nks` tiles of 16 × 16 u32.
                        let wrow = unsafe {
                            &*(args.b[j].add((s * TILE + p) * TILE) as *const [u32; TILE])
                        };
                        let lo = wrow.map(|u| f32::from_bits(u << 16));
                        let hi = wrow.map(|u| f32::from_bits(u & 0xffff_0000));
                        for (tt, a) in acc.iter_mut().enumerate() {
                            // SAFETY: A rows hold 32 * nks bf16 from `a[i]` at stride a_stride.
                            let xp = unsafe {
                                args.a[i].add((t0 + tt) * args.a_stride + s * KSTEP + 2 * p)
                            };
                            // SAFETY: as above.
                            let (x0, x1) = unsafe { (bf16_to_f32(*xp), bf16_to_f32(*xp.add(1))) };
                            for n in 0..TILE {
                                a[n] = fma(hi[n], x1, fma(lo[n], x0, a[n]));
                            }
                        }
                    }
                }
                for (tt, row) in acc.iter().enumerate() {
                    // SAFETY: C covers 16 rows of `cs` floats.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(c.add((t0 + tt) * cs), TILE) };
                    dst.copy_from_slice(row);
                }
            }
        }
    }
}

/// Baseline build of the f32 micro-kernel.
///
/// # Safety
/// `args` describes valid memory.
pub(super) unsafe fn micro_scalar(args: &MicroArgs) {
    // SAFETY: forwarded.
    unsafe { micro_body::<false>(args) }
}

/// AVX2 + FMA build of the f32 micro-kernel.
///
/// # Safety
/// The CPU has AVX2 and FMA; `args` describes valid memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn micro_avx2(args: &MicroArgs) {
    // SAFETY: forwarded.
    unsafe { micro_body::<true>(args) }
}

/// AVX-512F build of the f32 micro-kernel.
///
/// # Safety
/// The CPU has AVX-512F; `args` describes valid memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn micro_avx512(args: &MicroArgs) {
    // SAFETY: forwarded.
    unsafe { micro_body::<true>(args) }
}
