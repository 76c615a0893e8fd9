//! Tests of [`super`]: the ISA kernels against the scalar reference on awkward sizes.

use super::*;
use crate::gemm::int8::gemm_i8_ref;
use crate::gemm::int8::tests::{TYPES, cols_for};
use crate::gemm::tests::{quantized as matrix, rand_vec as randn, weight_ref};

#[test]
fn packed_rows_equal_the_int8_unpacker() {
    let pool = ThreadPool::new(2);
    for dtype in TYPES {
        for cols in cols_for(dtype) {
            let rows = 64;
            let m = matrix(dtype, rows, cols, cols as u64 + 11);
            let w = weight_ref(dtype, &m, rows, cols);
            let p = PackedMatrix::pack(w, Some(&pool)).unwrap();
            let rb = m.len() / rows;
            let mut got = vec![0f32; cols];
            for r in [0, 1, 17, 31, 32, 63] {
                p.dequant_row(r, &mut got).unwrap();
                let want = super::super::int8::unpacked_row(dtype, &m[r * rb..(r + 1) * rb], cols)
                    .unwrap();
                assert_eq!(got, want, "{dtype:?} cols {cols} row {r}");
            }
            let mut panel = Panel::new(cols, sub_cols(p.scales.id()));
            let mut want = Panel::new(cols, sub_cols(p.scales.id()));
            let mut twin = Panel::new(cols, sub_cols(p.scales.id()));
            p.expand(1, &mut panel);
            p.expand_scalar(1, &mut twin);
            want.fill(&w, 32);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                panel.q == twin.q
                    && bits(&panel.s) == bits(&twin.s)
                    && bits(&panel.m) == bits(&twin.m),
                "{dtype:?}: expand differs from its scalar twin"
            );
            assert!(
                panel.q == want.q && panel.s == want.s && panel.m == want.m,
                "{dtype:?}: expanded panel differs from the file's unpack"
            );
            // The packed matrix is exactly as large as the file's blocks: decode reads
            // no more bytes than llama.cpp does.
            let file = cols / dtype.block_size() * dtype.type_size() * rows;
            assert_eq!(p.n_bytes(), file, "{dtype:?} size");
        }
    }
}

#[test]
fn packed_gemv_and_gemm_match_the_int8_twin_on_awkward_shapes() {
    let pool = ThreadPool::new(2);
    for dtype in TYPES {
        for cols in cols_for(dtype) {
            for rows in [32usize, 96] {
                let m = matrix(dtype, rows, cols, (rows * 5 + cols) as u64);
                let w = weight_ref(dtype, &m, rows, cols);
                let p = PackedMatrix::pack(w, None).unwrap();
                for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 13, 33] {
                    let xf = randn(n * cols, n as u64 + 9);
                    let x = QActs::new(&xf, n, cols, Some(&pool)).unwrap();
                    let mut want = vec![0f32; n * rows];
                    gemm_i8_ref(w, &x, &mut want).unwrap();
                    for path in Int8Path::available() {
                        if !path.supports(dtype) {
                            continue;
                        }
                        let name = path.name();
                        let close = |got: &[f32], what: &str| {
                            for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                                assert!(
                                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                                    "{what} {name} {dtype:?} [{rows},{cols}] n={n} [{i}]: \
                                     {a} vs twin {b}"
                                );
                            }
                        };
                        let mut got = vec![0f32; n * rows];
                        p.gemv_panels(path, &x, 0..rows / ROWS, &mut got, rows)
                            .unwrap();
                        close(&got, "gemv");
                        // A sub-range of panels into a narrower buffer.
                        if rows > ROWS {
                            let mut part = vec![0f32; (n - 1) * ROWS * 2 + ROWS * 2];
                            p.gemv_panels(path, &x, 1..3, &mut part, 2 * ROWS).unwrap();
                            for t in 0..n {
                                for r in 0..2 * ROWS {
                                    let (a, b) =
                                        (part[t * 2 * ROWS + r], want[t * rows + ROWS + r]);
                                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()));
                                }
                            }
                        }
                        let mut gemv = vec![0f32; n * rows];
                        p.gemv_panels(path, &x, 0..rows / ROWS, &mut gemv, rows)
                            .unwrap();
                        let mut got = vec![0f32; n * rows];
                        p.gemm(path, &x, &mut got, Some(&pool)).unwrap();
                        close(&got, "gemm");
                        // Off AMX tiles the GEMM is the GEMV's arithmetic, bit for bit: which
                        // of them a batch takes never changes a row (batch invariance).
                        if path != Int8Path::Amx {
                            let same = got
                                .iter()
                                .zip(&gemv)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "gemm vs gemv {name} {dtype:?} [{rows},{cols}] n={n}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn pack_from_reports_read_errors_and_rejects_bad_shapes() {
    let m = matrix(GgmlType::Q4_K, 32, 256, 3);
    let r: Result<Result<PackedMatrix, String>, _> =
        PackedMatrix::pack_from(GgmlType::Q4_K, 32, 256, None, &|_, _| Err("boom".into()));
    assert_eq!(r.unwrap().unwrap_err(), "boom");
    let ok = PackedMatrix::pack_from::<String>(GgmlType::Q4_K, 32, 256, None, &|r0, buf| {
        buf.copy_from_slice(&m[r0 * 144..r0 * 144 + buf.len()]);
        Ok(())
    });
    assert!(ok.unwrap().is_ok());
    assert!(PackedMatrix::pack_from::<()>(GgmlType::Q4_K, 16, 256, None, &|_, _| Ok(())).is_err());
    assert!(PackedMatrix::pack_from::<()>(GgmlType::F16, 32, 256, None, &|_, _| Ok(())).is_err());
    let w = WeightRef {
        dtype: GgmlType::Q4_K,
        bytes: &m[..100],
        rows: 32,
        cols: 256,
    };
    assert!(PackedMatrix::pack(w, None).is_err());
    let p = PackedMatrix::pack_from::<()>(GgmlType::Q4_K, 32, 256, None, &|_, _| Ok(()))
        .unwrap()
        .unwrap();
    let x = QActs::new(&[0.5; 512], 2, 256, None).unwrap();
    assert!(
        p.gemv_panels(Int8Path::Scalar, &x, 0..2, &mut [0.0; 64], 32)
            .is_err()
    );
    assert!(
        p.gemv_panels(Int8Path::Scalar, &x, 0..1, &mut [0.0; 63], 32)
            .is_err()
    );
    assert!(p.dequant_row(32, &mut [0.0; 256]).is_err());
}

/// Issue 26: a decode step multiplies B rows through each panel once, and each row's result
/// is bit for bit the one it gets alone (the same integer dots and float steps in the same
/// order whatever the batch), on every path, for batch sizes around the micro-kernel's width.
#[test]
fn gemv_rows_equal_each_row_alone_bit_for_bit() {
    let pool = ThreadPool::new(2);
    for dtype in TYPES {
        let cols = cols_for(dtype)[0];
        for rows in [32usize, 96, 1024] {
            let m = matrix(dtype, rows, cols, (rows + 3 * cols) as u64);
            let w = weight_ref(dtype, &m, rows, cols);
            let p = PackedMatrix::pack(w, None).unwrap();
            for n in [1usize, 2, 3, 5, 7, 8, 9, 12, 16, 17] {
                let xf = randn(n * cols, (n * 31 + rows) as u64);
                let x = QActs::new(&xf, n, cols, Some(&pool)).unwrap();
                for path in Int8Path::available() {
                    if !path.supports(dtype) {
                        continue;
                    }
                    let mut all = vec![0f32; n * rows];
                    p.gemv_panels(path, &x, 0..rows / ROWS, &mut all, rows)
                        .unwrap();
                    for t in 0..n {
                        let x1 = QActs::new(&xf[t * cols..(t + 1) * cols], 1, cols, None).unwrap();
                        let mut one = vec![0f32; rows];
                        p.gemv_panels(path, &x1, 0..rows / ROWS, &mut one, rows)
                            .unwrap();
                        let same = one
                            .iter()
                            .zip(&all[t * rows..(t + 1) * rows])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{} {dtype:?} [{rows},{cols}] n={n} row {t}",
                            path.name()
                        );
                    }
                }
            }
        }
    }
}
