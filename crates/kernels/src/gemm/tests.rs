//! Every available GEMM path against the scalar twin [`gemm_ref`], on awkward shapes: token
//! counts 1, 3, 7, 16, 33, 47 (tile tails), odd row-group counts, `k` with a partial
//! [`KC`] slice, and every weight type with a dequantizer the model may meet.

use damascus_quant::{GgmlType, quantize_row};

use super::*;
use crate::pool::ThreadPool;

/// Deterministic pseudo-random f32 in [-1, 1).
pub(super) fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// `rows` random rows of `k` quantized to `dtype`.
pub(super) fn quantized(dtype: GgmlType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
    let src = rand_vec(rows * k, seed);
    let rb = k / dtype.block_size() * dtype.type_size();
    let mut out = vec![0u8; rows * rb];
    for r in 0..rows {
        quantize_row(
            dtype,
            &src[r * k..(r + 1) * k],
            &mut out[r * rb..(r + 1) * rb],
        )
        .unwrap();
    }
    out
}

/// `bytes` as a `[rows, cols]` matrix of `dtype`.
pub(super) fn weight_ref(dtype: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> WeightRef<'_> {
    WeightRef {
        dtype,
        bytes,
        rows,
        cols,
    }
}

fn check_case(dtype: GgmlType, rows: usize, k: usize, n_tokens: usize, pool: Option<&ThreadPool>) {
    let bytes = quantized(dtype, rows, k, (rows * 31 + k) as u64);
    let w = WeightRef {
        dtype,
        bytes: &bytes,
        rows,
        cols: k,
    };
    let xs = rand_vec(n_tokens * k, 7 + n_tokens as u64);
    let x = PackedActs::new(&xs, n_tokens, k).unwrap();
    let mut want = vec![0f32; n_tokens * rows];
    gemm_ref(w, &x, &mut want).unwrap();
    // Σ|w|·|x| bounds the rounding of any summation order.
    let scale: f32 = (k as f32).sqrt();
    for path in GemmPath::available() {
        let mut got = vec![f32::NAN; n_tokens * rows];
        let xp = PackedActs::for_path(path, &xs, n_tokens, k, pool).unwrap();
        gemm(path, w, &xp, &mut got, pool).unwrap();
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - e).abs() <= 2e-5 * scale * (1.0 + e.abs()),
                "{dtype:?} {} rows={rows} k={k} T={n_tokens} at [{}, {}]: {g} vs {e}",
                path.name(),
                i / rows,
                i % rows
            );
        }
    }
}

#[test]
fn paths_match_reference_on_awkward_shapes() {
    for &t in &[1, 3, 7, 16, 33, 47] {
        check_case(GgmlType::Q4_K, 48, 512, t, None);
    }
    // Odd group count, several row blocks, a KC tail.
    check_case(GgmlType::Q4_K, 16 * 9 + MC, KC + 256, 33, None);
    check_case(GgmlType::Q6_K, 80, KC + 256, 7, None);
}

#[test]
fn every_weight_type() {
    for dtype in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ] {
        check_case(dtype, 32, 256, 19, None);
    }
    // Legacy types with a k that is not a multiple of 256.
    check_case(GgmlType::Q4_1, 16, 32 * 3, 5, None);
}

#[test]
fn threaded_matches_reference() {
    let pool = ThreadPool::new(3);
    check_case(GgmlType::Q4_K, 16 * 11, 768, 65, Some(&pool));
    check_case(GgmlType::Q6_K, 16, 256, 100, Some(&pool)); // one row block, tokens split
}

#[test]
fn bad_shapes_are_errors() {
    let bytes = quantized(GgmlType::Q4_K, 16, 256, 1);
    let w = WeightRef {
        dtype: GgmlType::Q4_K,
        bytes: &bytes,
        rows: 16,
        cols: 256,
    };
    let x = PackedActs::new(&rand_vec(2 * 256, 1), 2, 256).unwrap();
    let mut out = vec![0f32; 31];
    assert!(gemm(GemmPath::Scalar, w, &x, &mut out, None).is_err());
    let short = WeightRef {
        bytes: &bytes[..100],
        ..w
    };
    let mut out = vec![0f32; 32];
    assert!(gemm(GemmPath::Scalar, short, &x, &mut out, None).is_err());
    assert!(WeightRef { rows: 8, ..w }.unsupported().is_some());
    assert!(PackedActs::new(&[0.0; 3], 2, 2).is_err());
    // Activations packed for another path.
    let xp =
        PackedActs::with_layout(ActLayout::Pairs, &rand_vec(2 * 256, 1), 2, 256, None).unwrap();
    let mut out = vec![0f32; 32];
    assert!(gemm(GemmPath::Scalar, w, &xp, &mut out, None).is_err());
}

#[test]
fn bf16_rounding() {
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(bf16_to_f32(0x3f80), 1.0);
    // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
    assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
}

#[test]
fn fast_unpack_is_bit_exact() {
    for dtype in [GgmlType::Q4_K, GgmlType::Q6_K] {
        let k = 256 * 3;
        let mut bytes = quantized(dtype, 1, k, 99);
        // Also arbitrary bytes (odd scales, high bits), with finite f16 scales.
        let mut s = 12345u32;
        let mut junk: Vec<u8> = (0..bytes.len())
            .map(|_| {
                s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (s >> 16) as u8
            })
            .collect();
        let ts = dtype.type_size();
        for b in junk.chunks_exact_mut(ts) {
            let at = if dtype == GgmlType::Q4_K {
                [0, 2]
            } else {
                [ts - 2, ts - 2]
            };
            for o in at {
                b[o + 1] &= 0x3b; // exponent < 0x1f: finite
            }
        }
        bytes.extend_from_slice(&junk);
        let n = bytes.len() / ts * 256;
        let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
        damascus_quant::dequantize_row(dtype, &bytes, &mut want).unwrap();
        assert!(super::unpack::dequant_fast(dtype, &bytes, &mut got));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{dtype:?} element {i}");
        }
    }
}

#[test]
fn transposed_store_matches_scalar_twin() {
    let tile = rand_vec(TILE * TILE, 9);
    for valid in [0, 1, 7, 16] {
        let stride = 37;
        let (mut a, mut b) = (vec![-1f32; 16 * stride], vec![-1f32; 16 * stride]);
        // SAFETY: 16 runs of `stride` >= 16 floats.
        unsafe {
            super::micro::store_transposed(&tile, a.as_mut_ptr(), stride, valid);
            super::micro::store_transposed_scalar(&tile, b.as_mut_ptr(), stride, valid);
        }
        assert_eq!(a, b, "valid {valid}");
        if valid > 3 {
            assert_eq!(a[3 * stride + 5], tile[5 * TILE + 3]);
        }
    }
}

#[test]
fn strided_bf16_rows() {
    let row = rand_vec(96, 4);
    let mut dst = vec![7u16; 2 * 512 + 32];
    super::micro::to_bf16_strided(&row, &mut dst, 512);
    for s in 0..3 {
        for i in 0..32 {
            assert_eq!(dst[s * 512 + i], f32_to_bf16(row[32 * s + i]));
        }
    }
    assert_eq!(dst[32], 7);
}

#[test]
fn pack_group_matches_scalar_twin() {
    let kc = 96;
    let mut rows = rand_vec(TILE * kc, 5);
    rows[3] = f32::NAN;
    rows[40] = 1.0 + 1.0 / 256.0; // a tie
    rows[41] = -0.0;
    let (mut a, mut b) = (
        vec![0u32; kc / KSTEP * TILE * TILE],
        vec![1u32; kc / KSTEP * TILE * TILE],
    );
    super::micro::pack_group(&rows, kc, &mut a);
    super::micro::pack_group_scalar(&rows, kc, &mut b);
    assert_eq!(a, b);
}

#[test]
fn packing_over_threads_matches_serial() {
    let pool = ThreadPool::new(3);
    for layout in [ActLayout::Rows, ActLayout::Pairs] {
        for &t in &[1, 15, 16, 17, 50, 97] {
            let x = rand_vec(t * 96, t as u64);
            let a = PackedActs::with_layout(layout, &x, t, 96, None).unwrap();
            let b = PackedActs::with_layout(layout, &x, t, 96, Some(&pool)).unwrap();
            assert_eq!(a.data, b.data, "{layout:?} {t} tokens");
            for (tok, i) in [(t - 1, 95), (0, 0), (t / 2, 33), (t - 1, 64)] {
                assert_eq!(
                    a.get(tok, i),
                    f32_to_bf16(x[tok * 96 + i]),
                    "{layout:?} {tok} {i}"
                );
            }
        }
    }
}

#[test]
fn reused_buffers_equal_fresh_ones() {
    // Large first, then smaller (stale tail and padding must not leak), then larger again.
    let pool = ThreadPool::new(2);
    let k = 96;
    let (mut p, mut q) = (None::<PackedActs>, None::<super::int8::QActs>);
    let mut pp = None::<PackedActs>;
    for (i, n) in [40usize, 3, 33, 1, 70].into_iter().enumerate() {
        let x = rand_vec(n * k, 100 + i as u64);
        let fresh = PackedActs::new(&x, n, k).unwrap();
        let fresh_pairs = PackedActs::with_layout(ActLayout::Pairs, &x, n, k, None).unwrap();
        match &mut pp {
            Some(pp) => pp.repack(&x, n, k, Some(&pool)).unwrap(),
            None => {
                pp = Some(PackedActs::with_layout(ActLayout::Pairs, &x, n, k, Some(&pool)).unwrap())
            }
        }
        assert_eq!(
            pp.as_ref().unwrap().data,
            fresh_pairs.data,
            "pairs pack, n {n}"
        );
        let fq = super::int8::QActs::new(&x, n, k, None).unwrap();
        match (&mut p, &mut q) {
            (Some(p), Some(q)) => {
                p.repack(&x, n, k, Some(&pool)).unwrap();
                q.requantize(&x, n, k, Some(&pool)).unwrap();
            }
            _ => {
                p = Some(PackedActs::new_with(&x, n, k, Some(&pool)).unwrap());
                q = Some(super::int8::QActs::new(&x, n, k, Some(&pool)).unwrap());
            }
        }
        let (pr, qr) = (p.as_ref().unwrap(), q.as_ref().unwrap());
        assert_eq!(pr.data, fresh.data, "bf16 pack, n {n}");
        assert_eq!(format!("{qr:?}"), format!("{fq:?}"), "int8 acts, n {n}");
    }
}
