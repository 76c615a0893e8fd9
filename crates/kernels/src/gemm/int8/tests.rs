//! Tests of [`super`]: the ISA kernels against the scalar reference on awkward sizes.

use super::*;
use crate::gemm::tests::{quantized as matrix, rand_vec as randn, weight_ref};

/// Every type the int8 path multiplies (also the packed layout's).
pub(in crate::gemm) const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

/// Column counts to test `dtype` on: one block row and three.
pub(in crate::gemm) fn cols_for(dtype: GgmlType) -> [usize; 2] {
    if dtype.block_size() == 256 {
        [256, 768]
    } else {
        [32, 96]
    }
}

#[test]
fn unpacked_rows_equal_the_dequantizer() {
    for dtype in TYPES {
        for cols in cols_for(dtype) {
            let m = matrix(dtype, 3, cols, cols as u64);
            let rb = m.len() / 3;
            for r in 0..3 {
                let src = &m[r * rb..(r + 1) * rb];
                let got = unpacked_row(dtype, src, cols).unwrap();
                let mut want = vec![0f32; cols];
                damascus_quant::dequantize_row(dtype, src, &mut want).unwrap();
                for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{dtype:?} cols {cols} row {r} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_paths_match_scalar_twin_and_f32_math_on_awkward_shapes() {
    let pool = ThreadPool::new(2);
    for dtype in TYPES {
        for cols in cols_for(dtype) {
            for rows in [32usize, 96] {
                let m = matrix(dtype, rows, cols, (rows * 7 + cols) as u64);
                let w = weight_ref(dtype, &m, rows, cols);
                assert_eq!(unsupported(&w), None);
                for n in [1usize, 3, 7, 33] {
                    let xf = randn(n * cols, n as u64 + 5);
                    let x = QActs::new(&xf, n, cols, Some(&pool)).unwrap();
                    let mut want = vec![0f32; n * rows];
                    gemm_i8_ref(w, &x, &mut want).unwrap();
                    for path in Int8Path::available() {
                        if !path.supports(dtype) {
                            continue;
                        }
                        let mut got = vec![0f32; n * rows];
                        gemm_i8(path, w, &x, &mut got, Some(&pool)).unwrap();
                        for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                                "{} {dtype:?} [{rows},{cols}] n={n} [{i}]: {a} vs twin {b}",
                                path.name()
                            );
                        }
                    }
                    // The twin against f32 math on the dequantized weights: within the
                    // activations' q8 rounding.
                    let rb = m.len() / rows;
                    for r in 0..rows {
                        let mut wr = vec![0f32; cols];
                        damascus_quant::dequantize_row(dtype, &m[r * rb..(r + 1) * rb], &mut wr)
                            .unwrap();
                        for t in 0..n {
                            let xt = &xf[t * cols..(t + 1) * cols];
                            let exact: f64 =
                                wr.iter().zip(xt).map(|(&a, &b)| f64::from(a * b)).sum();
                            let mag: f64 = wr
                                .iter()
                                .zip(xt)
                                .map(|(&a, &b)| f64::from((a * b).abs()))
                                .sum();
                            let got = f64::from(want[t * rows + r]);
                            assert!(
                                (got - exact).abs() <= 0.01 * mag + 1e-4,
                                "{dtype:?} [{rows},{cols}] n={n} ({t},{r}): {got} vs {exact}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rejects_what_it_cannot_run() {
    let m = matrix(GgmlType::Q4_K, 16, 256, 1);
    let w = WeightRef {
        dtype: GgmlType::Q4_K,
        bytes: &m,
        rows: 16,
        cols: 256,
    };
    assert!(unsupported(&w).unwrap().contains("multiple of 32"));
    let x = QActs::new(&[0.0; 256], 1, 256, None).unwrap();
    assert!(gemm_i8(Int8Path::Scalar, w, &x, &mut [0.0; 16], None).is_err());
    let m = matrix(GgmlType::Q8_0, 32, 32, 2);
    let w = WeightRef {
        dtype: GgmlType::Q8_0,
        bytes: &m,
        rows: 32,
        cols: 32,
    };
    let x = QActs::new(&[0.5; 32], 1, 32, None).unwrap();
    let r = gemm_i8(Int8Path::Avx2, w, &x, &mut [0.0; 32], None);
    assert!(r.is_err(), "AVX2 must refuse Q8_0 (i16 saturation)");
    let w = WeightRef {
        dtype: GgmlType::Q2_K,
        bytes: &[],
        rows: 32,
        cols: 256,
    };
    assert!(unsupported(&w).is_some());
    assert!(QActs::new(&[0.0; 30], 1, 30, None).is_err());
}

/// [`gemm_panels`] on `w`'s file blocks, as the bits of `out`.
fn panel_bits(
    path: Int8Path,
    step: TileStep,
    w: &WeightRef<'_>,
    x: &QActs,
    pool: Option<&ThreadPool>,
    pair: bool,
) -> Vec<u32> {
    let sz = sub_block(w.dtype).unwrap_or(32);
    let mut out = vec![f32::NAN; x.n_tokens * w.rows];
    let fill = |pn: &mut Panel, r0: usize| pn.fill(w, r0);
    gemm_panels(
        path, step, w.rows, w.cols, sz, x, &mut out, pool, &fill, pair,
    );
    out.iter().map(|v| v.to_bits()).collect()
}

/// The VNNI path's 64-row units ([`super::vnni::micro`] over two panels, 3 tokens per call) give bit for bit
/// what its 32-row units give (4 tokens per call), on every format, awkward token counts and
/// with and without threads: a token's output does not depend on how rows or tokens are tiled.
#[test]
fn vnni_row_pairs_equal_single_panels_bitwise() {
    if !Int8Path::Vnni.is_available() {
        return;
    }
    let pool = ThreadPool::new(2);
    for dtype in TYPES {
        if !Int8Path::Vnni.supports(dtype) {
            continue;
        }
        for cols in cols_for(dtype) {
            let rows = 128;
            let m = matrix(dtype, rows, cols, (rows * 3 + cols) as u64);
            let w = weight_ref(dtype, &m, rows, cols);
            for n in [1usize, 2, 3, 4, 7, 33] {
                let xf = randn(n * cols, n as u64 + 17);
                let x = QActs::new(&xf, n, cols, Some(&pool)).unwrap();
                for p in [None, Some(&pool)] {
                    let run = |pair| panel_bits(Int8Path::Vnni, TileStep::Tiles, &w, &x, p, pair);
                    assert_eq!(run(true), run(false), "{dtype:?} [{rows},{cols}] n={n}");
                }
            }
        }
    }
}

/// The AMX path ([`super::amx::tokens`]: 16-token tiles, VNNI tails) gives bit for bit what
/// the VNNI path and the scalar twin give, on every format, awkward token counts (tails of 1,
/// 3, 7 and 15 tokens, several tiles), 32- and 64-row units, with and without threads: its tile
/// steps emulated on any VNNI CPU, and on the tiles where AMX-INT8 is available.
#[test]
fn amx_tiles_equal_vnni_and_the_twin_bitwise() {
    if !Int8Path::Vnni.is_available() {
        return;
    }
    let mut steps = vec![TileStep::Emulated];
    if Int8Path::Amx.is_available() {
        steps.push(TileStep::Tiles);
    }
    let pool = ThreadPool::new(3);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for dtype in TYPES {
        for cols in cols_for(dtype) {
            for rows in [32usize, 96, 128] {
                let m = matrix(dtype, rows, cols, (rows * 5 + cols) as u64);
                let w = weight_ref(dtype, &m, rows, cols);
                let counts: &[usize] = if dtype == GgmlType::Q4_K && cols == 256 && rows == 96 {
                    &[1, 16, 17, 1023]
                } else {
                    &[3, 7, 16, 33, 47]
                };
                for &n in counts {
                    let xf = randn(n * cols, n as u64 + 29);
                    let x = QActs::new(&xf, n, cols, Some(&pool)).unwrap();
                    let mut twin = vec![0f32; n * rows];
                    gemm_i8_ref(w, &x, &mut twin).unwrap();
                    let mut vnni = vec![0f32; n * rows];
                    gemm_i8(Int8Path::Vnni, w, &x, &mut vnni, Some(&pool)).unwrap();
                    assert_eq!(
                        bits(&vnni),
                        bits(&twin),
                        "vnni {dtype:?} [{rows},{cols}] n={n}"
                    );
                    for &step in &steps {
                        for p in [None, Some(&pool)] {
                            for pair in [false, true] {
                                assert_eq!(
                                    panel_bits(Int8Path::Amx, step, &w, &x, p, pair),
                                    bits(&twin),
                                    "amx {step:?} {dtype:?} [{rows},{cols}] n={n} pair={pair} \
                                     threads={}",
                                    p.is_some()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
