//! Round-trip sanity: quantize -> dequantize error bounds per type, plus API error paths.
//!
//! Bounds are relative RMSE on Gaussian-like rows (std 0.02), loose enough to be stable and
//! tight enough to catch a wrong layout (a misplaced nibble gives errors near 1.0).

use damascus_quant::{
    GgmlType, QuantError, can_dequantize, can_quantize, dequantize_row, quantize_row,
};

/// Deterministic pseudo-Gaussian row (sum of 4 uniforms), `[n]` f32.
fn row(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uni = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (uni() + uni() + uni() + uni() - 2.0) * 0.035)
        .collect()
}

fn rel_rmse(dtype: GgmlType, x: &[f32]) -> f32 {
    let mut q = vec![0u8; dtype.row_bytes(x.len() as u64).unwrap() as usize];
    quantize_row(dtype, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(dtype, &q, &mut y).unwrap();
    let err: f64 = x
        .iter()
        .zip(&y)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let sig: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (err / sig).sqrt() as f32
}

#[test]
fn roundtrip_error_bounds() {
    // (type, max relative RMSE). Typical observed values are roughly half of these.
    let bounds = [
        ("F32", 0.0),
        ("F16", 0.001),
        ("BF16", 0.005),
        ("Q8_0", 0.01),
        ("Q8_1", 0.01),
        ("Q8_K", 0.01),
        ("Q6_K", 0.03),
        ("Q5_0", 0.06),
        ("Q5_1", 0.06),
        ("Q5_K", 0.05),
        ("Q4_0", 0.12),
        ("Q4_1", 0.12),
        ("Q4_K", 0.10),
        ("Q3_K", 0.22),
        ("Q2_K", 0.45),
    ];
    for (name, bound) in bounds {
        let dtype = GgmlType::from_name(name).unwrap();
        for seed in 0..4 {
            let x = row(1024, seed);
            let e = rel_rmse(dtype, &x);
            assert!(
                e <= bound,
                "{name}: relative RMSE {e} > {bound} (seed {seed})"
            );
        }
    }
}

#[test]
fn more_bits_means_less_error() {
    let x = row(4096, 99);
    let e = |n| rel_rmse(GgmlType::from_name(n).unwrap(), &x);
    assert!(e("Q2_K") > e("Q3_K"));
    assert!(e("Q3_K") > e("Q4_K"));
    assert!(e("Q4_K") > e("Q5_K"));
    assert!(e("Q5_K") > e("Q6_K"));
    assert!(e("Q6_K") > e("Q8_0"));
    assert!(e("Q4_0") > e("Q5_0"));
}

#[test]
fn zero_rows_stay_zero() {
    for dtype in damascus_quant::SUPPORTED {
        let n = dtype.block_size() * 2;
        let x = vec![0f32; n];
        let mut q = vec![0u8; dtype.row_bytes(n as u64).unwrap() as usize];
        quantize_row(dtype, &x, &mut q).unwrap();
        let mut y = vec![1f32; n];
        dequantize_row(dtype, &q, &mut y).unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "{dtype}");
    }
}

#[test]
fn bad_lengths_are_errors_not_panics() {
    let q4k = GgmlType::Q4_K;
    let mut dst = vec![0f32; 256];
    assert_eq!(
        dequantize_row(q4k, &[0u8; 143], &mut dst),
        Err(QuantError::SrcLen {
            expected: 144,
            found: 143
        })
    );
    let mut dst = vec![0f32; 100];
    assert!(matches!(
        dequantize_row(q4k, &[0u8; 144], &mut dst),
        Err(QuantError::NotBlockMultiple {
            n_elems: 100,
            block_size: 256,
            ..
        })
    ));
    let mut out = vec![0u8; 10];
    assert_eq!(
        quantize_row(GgmlType::Q8_0, &[0f32; 32], &mut out),
        Err(QuantError::DstLen {
            expected: 34,
            found: 10
        })
    );
    for t in [GgmlType::IQ2_XXS, GgmlType::I32, GgmlType::TQ1_0] {
        assert!(!can_dequantize(t) && !can_quantize(t));
        assert!(matches!(
            dequantize_row(t, &[], &mut []),
            Err(QuantError::Unsupported {
                op: "dequantize",
                ..
            })
        ));
        assert!(matches!(
            quantize_row(t, &[], &mut []),
            Err(QuantError::Unsupported { .. })
        ));
    }
    // Empty rows are fine.
    dequantize_row(q4k, &[], &mut []).unwrap();
    quantize_row(q4k, &[], &mut []).unwrap();
}

#[test]
fn quantize_throughput_smoke() {
    // Not a benchmark: prints rows/s so regressions are visible with --nocapture.
    let x = row(256 * 64, 7);
    for name in [
        "Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "Q5_0", "Q8_0", "Q4_1", "F16",
    ] {
        let dtype = GgmlType::from_name(name).unwrap();
        let mut q = vec![0u8; dtype.row_bytes(x.len() as u64).unwrap() as usize];
        let t = std::time::Instant::now();
        quantize_row(dtype, &x, &mut q).unwrap();
        let secs = t.elapsed().as_secs_f64();
        println!("{name}: {:.1} Melem/s", x.len() as f64 / secs / 1e6);
    }
}

#[test]
fn dequantize_throughput_smoke() {
    // Not a benchmark: prints Melem/s so regressions are visible with --nocapture.
    let x = row(256 * 256, 3);
    for dtype in damascus_quant::SUPPORTED {
        let mut q = vec![0u8; dtype.row_bytes(x.len() as u64).unwrap() as usize];
        quantize_row(dtype, &x, &mut q).unwrap();
        let mut y = vec![0f32; x.len()];
        let t = std::time::Instant::now();
        for _ in 0..10 {
            dequantize_row(dtype, &q, &mut y).unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "dequant {dtype}: {:.0} Melem/s",
            10.0 * x.len() as f64 / secs / 1e6
        );
    }
}
