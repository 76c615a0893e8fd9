//! Prefill GEMM throughput micro-benchmark (no criterion): GFLOP/s (2 · rows · k · tokens per
//! call; GOP/s for the int8 path) per path, weight type and thread count, on Llama-3.2-3B
//! shapes. The int8 paths (`gemm::int8`) are listed as `vnni-int8` / `avx2-int8`.
//!
//! `cargo bench -p damascus-kernels --bench gemm -- [-t 1,2] [--types q4_k,q6_k]
//!  [--tokens 512] [--reps 5] [--shapes 3072x3072,8192x3072,3072x8192]`

use std::time::Instant;

use damascus_kernels::gemm::packed::PackedMatrix;
use damascus_kernels::gemm::{GemmPath, PackedActs, WeightRef, gemm, int8};
use damascus_kernels::pool::ThreadPool;
use damascus_quant::GgmlType;

mod common;
use common::{acts, quantized_weights};

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn dtype(name: &str) -> GgmlType {
    match name {
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "q5_0" => GgmlType::Q5_0,
        "q8_0" => GgmlType::Q8_0,
        "q5_k" => GgmlType::Q5_K,
        "q6_k" => GgmlType::Q6_K,
        "f16" => GgmlType::F16,
        _ => GgmlType::Q4_K,
    }
}

/// Wall clock, or this process's CPU time.
struct Clock(Instant, f64);

impl Clock {
    fn now(cpu: bool) -> Clock {
        Clock(Instant::now(), if cpu { process_cpu_s() } else { 0.0 })
    }

    fn elapsed(&self, cpu: bool) -> f64 {
        if cpu {
            process_cpu_s() - self.1
        } else {
            self.0.elapsed().as_secs_f64()
        }
    }
}

/// Seconds of CPU time this process has used (all threads); 0 off Linux.
fn process_cpu_s() -> f64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for the call to write.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    #[cfg(not(target_os = "linux"))]
    0.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: Vec<usize> = arg(&args, "-t", "1,2")
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let types: Vec<GgmlType> = arg(&args, "--types", "q4_k,q6_k")
        .split(',')
        .map(dtype)
        .collect();
    let tokens: usize = arg(&args, "--tokens", "512").parse().unwrap_or(512);
    let reps: usize = arg(&args, "--reps", "5").parse().unwrap_or(5);
    // `--cpu`: time the packed GEMM by process CPU time (steadier on a shared machine at one
    // thread; at several threads it counts every thread's time).
    let cpu_time = args.iter().any(|a| a == "--cpu");
    let shapes: Vec<(usize, usize)> = arg(&args, "--shapes", "3072x3072,8192x3072,3072x8192")
        .split(',')
        .filter_map(|s| {
            let (r, k) = s.split_once('x')?;
            Some((r.parse().ok()?, k.parse().ok()?))
        })
        .collect();
    println!("| path | type | rows×k | tokens | threads | ms | GFLOP/s |");
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: |");
    for &(rows, k) in &shapes {
        let x = acts(tokens * k);
        for &dt in &types {
            let bytes = quantized_weights(dt, rows, k);
            let w = WeightRef {
                dtype: dt,
                bytes: &bytes,
                rows,
                cols: k,
            };
            let mut out = vec![0f32; tokens * rows];
            for &nt in &threads {
                let pool = ThreadPool::new(nt);
                for path in GemmPath::available() {
                    if path == GemmPath::Scalar {
                        continue;
                    }
                    let xp = PackedActs::for_path(path, &x, tokens, k, Some(&pool)).expect("pack");
                    gemm(path, w, &xp, &mut out, Some(&pool)).expect("gemm");
                    let mut best = f64::MAX;
                    for _ in 0..reps {
                        let t0 = Instant::now();
                        gemm(path, w, &xp, &mut out, Some(&pool)).expect("gemm");
                        best = best.min(t0.elapsed().as_secs_f64());
                    }
                    let gflops = 2.0 * (rows * k * tokens) as f64 / best / 1e9;
                    println!(
                        "| {} | {dt:?} | {rows}×{k} | {tokens} | {nt} | {:.1} | {gflops:.0} |",
                        path.name(),
                        best * 1e3
                    );
                }
                for ip in int8::Int8Path::available() {
                    if ip == int8::Int8Path::Scalar
                        || !ip.supports(dt)
                        || int8::unsupported(&w).is_some()
                    {
                        continue;
                    }
                    let xq = int8::QActs::new(&x, tokens, k, Some(&pool)).expect("quantize x");
                    int8::gemm_i8(ip, w, &xq, &mut out, Some(&pool)).expect("gemm");
                    let mut best = f64::MAX;
                    for _ in 0..reps {
                        let t0 = Instant::now();
                        int8::gemm_i8(ip, w, &xq, &mut out, Some(&pool)).expect("gemm");
                        best = best.min(t0.elapsed().as_secs_f64());
                    }
                    let gops = 2.0 * (rows * k * tokens) as f64 / best / 1e9;
                    println!(
                        "| {} | {dt:?} | {rows}×{k} | {tokens} | {nt} | {:.1} | {gops:.0} |",
                        ip.name(),
                        best * 1e3
                    );
                    // The repacked layout (what the CPU backend runs on prompts).
                    if !damascus_kernels::gemm::packed::can_pack(dt) {
                        continue;
                    }
                    let pm = PackedMatrix::pack(w, Some(&pool)).expect("pack");
                    pm.gemm(ip, &xq, &mut out, Some(&pool)).expect("gemm");
                    let mut best = f64::MAX;
                    for _ in 0..reps {
                        let t0 = Clock::now(cpu_time);
                        pm.gemm(ip, &xq, &mut out, Some(&pool)).expect("gemm");
                        best = best.min(t0.elapsed(cpu_time));
                    }
                    let gops = 2.0 * (rows * k * tokens) as f64 / best / 1e9;
                    println!(
                        "| {} packed | {dt:?} | {rows}×{k} | {tokens} | {nt} | {:.1} | {gops:.0} |",
                        ip.name(),
                        best * 1e3
                    );
                }
            }
        }
    }
}
