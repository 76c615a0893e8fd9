//! The portable parts of the GEMM: bf16 conversion, panel scatter and the f32 FMA
//! micro-kernel, one generic body instantiated for baseline x86-64, AVX2 + FMA and AVX-512F.

use super::{KSTEP, MicroArgs, TILE, bf16_to_f32, f32_to_bf16};

/// Tokens per register block of the f32 micro-kernel.
const TB: usize = 4;

/// `out[i] = bf16(x[i])`.
pub(super) fn to_bf16(x: &[f32], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
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

/// Packs 16 dequantized rows `rows` (`[16][kc]` f32) into panel tiles `tiles`
/// (`[kc / 32][16 pairs][16 rows]` u32): `tiles[s][p][n] = bf16(rows[n][32s + 2p]) |
/// bf16(rows[n][32s + 2p + 1]) << 16`.
pub(crate) fn pack_group(rows: &[f32], kc: usize, tiles: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F is present.
        return unsafe { pack_group_avx512(rows, kc, tiles) };
    }
    pack_group_scalar(rows, kc, tiles);
}

/// Scalar twin of [`pack_group`].
pub(super) fn pack_group_scalar(rows: &[f32], kc: usize, tiles: &mut [u32]) {
    for n in 0..TILE {
        let row = &rows[n * kc..(n + 1) * kc];
        for (s, seg) in row.chunks_exact(KSTEP).enumerate() {
            let tile = &mut tiles[s * TILE * TILE..(s + 1) * TILE * TILE];
            for (p, pair) in seg.chunks_exact(2).enumerate() {
                tile[p * TILE + n] =
                    u32::from(f32_to_bf16(pair[0])) | (u32::from(f32_to_bf16(pair[1])) << 16);
            }
        }
    }
}

/// [`pack_group`] with AVX-512: per k-step, 16 rows rounded to bf16 pairs, then a 16 × 16
/// transpose of u32 in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_group_avx512(rows: &[f32], kc: usize, tiles: &mut [u32]) {
    use std::arch::x86_64::*;
    assert!(rows.len() >= TILE * kc && tiles.len() >= kc / KSTEP * TILE * TILE);
    /// 16 f32 → 16 bf16 bits (round to nearest even; NaN quieted) in u16 lanes.
    #[inline(always)]
    unsafe fn bf16x16(p: *const f32) -> __m256i {
        // SAFETY: 16 readable floats at p (caller); register ops otherwise.
        unsafe {
            let b = _mm512_castps_si512(_mm512_loadu_ps(p));
            let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
            let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(
                b,
                _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb),
            ));
            let abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fff_ffff));
            let nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
            let q = _mm512_or_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(0x40));
            _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q))
        }
    }
    // SAFETY: loads stay within rows[n * kc + 32 s .. + 32] and stores within tile s
    // (asserted lengths above).
    unsafe {
        for s in 0..kc / KSTEP {
            let mut r = [_mm512_setzero_si512(); TILE];
            for (n, rn) in r.iter_mut().enumerate() {
                let p = rows.as_ptr().add(n * kc + s * KSTEP);
                *rn =
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bf16x16(p)), bf16x16(p.add(16)));
            }
            let out = transpose16(&r);
            let dst = tiles.as_mut_ptr().add(s * TILE * TILE);
            for (p, v) in out.into_iter().enumerate() {
                _mm512_storeu_si512(dst.add(p * TILE).cast(), v);
            }
        }
    }
}

/// 16 × 16 transpose of u32 lanes: `out[p]` lane `n` = `r[n]` lane `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: &[std::arch::x86_64::__m512i; TILE]) -> [std::arch::x86_64::__m512i; TILE] {
    use std::arch::x86_64::*;
    {
        let mut t = [_mm512_setzero_si512(); TILE];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        let mut u = [_mm512_setzero_si512(); TILE];
        for i in 0..4 {
            u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        let mut out = [_mm512_setzero_si512(); TILE];
        for c in 0..4 {
            let lo01 = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
            let hi01 = _mm512_shuffle_i32x4::<0xEE>(u[c], u[4 + c]);
            let lo23 = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
            let hi23 = _mm512_shuffle_i32x4::<0xEE>(u[8 + c], u[12 + c]);
            out[c] = _mm512_shuffle_i32x4::<0x88>(lo01, lo23);
            out[4 + c] = _mm512_shuffle_i32x4::<0xDD>(lo01, lo23);
            out[8 + c] = _mm512_shuffle_i32x4::<0x88>(hi01, hi23);
            out[12 + c] = _mm512_shuffle_i32x4::<0xDD>(hi01, hi23);
        }
        out
    }
}

/// `dst[s * stride..][..32] = bf16(row[32 s..][..32])` for every 32-element step `s` of `row`
/// (one weight row into its AMX A tiles, `stride` = one tile).
pub(crate) fn to_bf16_strided(row: &[f32], dst: &mut [u16], stride: usize) {
    let steps = row.len() / KSTEP;
    assert!(steps == 0 || dst.len() >= (steps - 1) * stride + KSTEP);
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F is present.
        return unsafe { to_bf16_strided_avx512(row, dst, stride) };
    }
    to_bf16_strided_body(row, dst, stride);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn to_bf16_strided_avx512(row: &[f32], dst: &mut [u16], stride: usize) {
    to_bf16_strided_body(row, dst, stride);
}

#[inline(always)]
fn to_bf16_strided_body(row: &[f32], dst: &mut [u16], stride: usize) {
    for (s, seg) in row.chunks_exact(KSTEP).enumerate() {
        let d: &mut [u16; KSTEP] = (&mut dst[s * stride..s * stride + KSTEP])
            .try_into()
            .expect("32 elements");
        let seg: &[f32; KSTEP] = seg.try_into().expect("32 elements");
        for (o, &v) in d.iter_mut().zip(seg) {
            *o = f32_to_bf16(v);
        }
    }
}

/// Writes the transpose of a C tile: `dst[n * stride + m] = tile[m * 16 + n]` for tokens
/// `n < valid` and rows `m < 16`.
///
/// # Safety
/// `dst` is valid for writes of `valid` runs of 16 floats, `stride` floats apart.
pub(super) unsafe fn store_transposed(tile: &[f32], dst: *mut f32, stride: usize, valid: usize) {
    assert!(tile.len() >= TILE * TILE && valid <= TILE);
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::CpuFeatures::allowed().avx512f {
        // SAFETY: AVX-512F is present; the rest is forwarded.
        return unsafe { store_transposed_avx512(tile, dst, stride, valid) };
    }
    // SAFETY: forwarded.
    unsafe { store_transposed_scalar(tile, dst, stride, valid) }
}

/// Scalar twin of [`store_transposed`].
///
/// # Safety
/// As for [`store_transposed`].
pub(super) unsafe fn store_transposed_scalar(
    tile: &[f32],
    dst: *mut f32,
    stride: usize,
    valid: usize,
) {
    for n in 0..valid {
        for m in 0..TILE {
            // SAFETY: run `n` of 16 floats is writable (caller).
            unsafe { *dst.add(n * stride + m) = tile[m * TILE + n] };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_transposed_avx512(tile: &[f32], dst: *mut f32, stride: usize, valid: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the tile holds 256 floats (asserted by the caller); stores as documented.
    unsafe {
        let mut r = [_mm512_setzero_si512(); TILE];
        for (m, v) in r.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(tile.as_ptr().add(m * TILE).cast());
        }
        let out = transpose16(&r);
        for (n, v) in out.into_iter().take(valid).enumerate() {
            _mm512_storeu_si512(dst.add(n * stride).cast(), v);
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
                            // SAFETY: `a[i]` holds nks tiles of [16][32] bf16.
                            let xp = unsafe { args.a[i].add((s * TILE + t0 + tt) * KSTEP + 2 * p) };
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
