//! Decode GEMV cost per step as the number of token rows grows (issue 26): a repacked matrix
//! times `n` rows on one thread, in cache. A developer tool.
//!
//! `cargo run --release -p damascus-kernels --example gemv_rows -- [ROWS] [COLS] [TYPE] [COPIES] [avx2]`
//! (`avx2`: the AVX2 int8 path even where VNNI is present)

use std::time::Instant;

use damascus_kernels::gemm::WeightRef;
use damascus_kernels::gemm::int8::{Int8Path, QActs};
use damascus_kernels::gemm::packed::PackedMatrix;
use damascus_quant::GgmlType;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rows: usize = args.first().map_or(Ok(576), |s| s.parse())?;
    let cols: usize = args.get(1).map_or(Ok(576), |s| s.parse())?;
    let dtype = match args.get(2).map_or("q4_1", |s| s.as_str()) {
        "q4_k" => GgmlType::Q4_K,
        "q8_0" => GgmlType::Q8_0,
        _ => GgmlType::Q4_1,
    };
    let rb = cols / dtype.block_size() * dtype.type_size();
    let mut bytes = vec![0u8; rows * rb];
    let mut seed = 1u32;
    let mut rnd = || {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
    };
    let row: Vec<f32> = (0..cols).map(|_| rnd()).collect();
    for r in 0..rows {
        damascus_quant::quantize_row(dtype, &row, &mut bytes[r * rb..(r + 1) * rb])?;
    }
    let w = WeightRef {
        dtype,
        bytes: &bytes,
        rows,
        cols,
    };
    // `COPIES` > 1: that many packed copies cycled through, so the weights stream from
    // memory as in a model whose weights exceed the last-level cache.
    let copies: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let ms: Vec<PackedMatrix> = (0..copies.max(1))
        .map(|_| PackedMatrix::pack(w, None))
        .collect::<Result<_, _>>()?;
    let path = if Int8Path::Vnni.is_available() && args.get(4).is_none_or(|a| a != "avx2") {
        Int8Path::Vnni
    } else {
        Int8Path::Avx2
    };
    // Activation quantization of a 512-token prompt (`DAMASCUS_ISA=avx2`: the scalar loop).
    let xs: Vec<f32> = (0..512 * cols).map(|_| rnd()).collect();
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t0 = Instant::now();
        let xq = QActs::new(&xs, 512, cols, None)?;
        best = best.min(t0.elapsed().as_secs_f64());
        std::hint::black_box(&xq);
    }
    println!("quantize [512, {cols}]: {:.1} us", best * 1e6);
    for n in [1usize, 2, 4, 8, 16, 32, 48, 64, 128] {
        let x: Vec<f32> = (0..n * cols).map(|_| rnd()).collect();
        let mut out = vec![0f32; n * rows];
        let reps = 2000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            for i in 0..reps {
                let xq = QActs::new(&x, n, cols, None)?;
                ms[i % ms.len()].gemv_panels(path, &xq, 0..rows / 32, &mut out, rows)?;
            }
            best = best.min(t0.elapsed().as_secs_f64() / reps as f64);
        }
        // The prompt GEMM on the same rows (panels expanded per unit).
        let xq = QActs::new(&x, n, cols, None)?;
        let mut best_gemm = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            for i in 0..reps {
                ms[i % ms.len()].gemm(path, &xq, &mut out, None)?;
            }
            best_gemm = best_gemm.min(t0.elapsed().as_secs_f64() / reps as f64);
        }
        println!(
            "{rows}x{cols} {dtype:?} n={n:2}: gemv {:7.2} us/call ({:6.2} us/row), gemm {:7.2} us",
            best * 1e6,
            best * 1e6 / n as f64,
            best_gemm * 1e6
        );
    }
    Ok(())
}
