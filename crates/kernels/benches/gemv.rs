//! GEMV throughput micro-benchmark (no criterion): GB/s of weight bytes
//! streamed per ISA and thread count, on matrices shaped like Llama-3.2-3B's
//! `ffn_down` (n = 3072 rows, k = 8192), cycling over enough copies to defeat
//! the last-level cache (decode streams weights from DRAM).
//!
//! `cargo bench -p damascus-kernels --bench gemv -- [-t 1,2] [--types q4_k,q6_k]
//!  [--reps 20] [--mb 640 | --mats 8] [--n 3072] [--k 8192] [--attn N_KV]
//!  [--isa scalar,avx2,avx512,vnni]`
//!
//! `DAMASCUS_PREFETCH=<bytes>` sets the kernels' software-prefetch distance.
//!
//! `--mb` sets the total size of the distinct matrices cycled through (make it
//! well above the last-level cache to measure DRAM streaming); `--mats 1` with
//! a small `--n` measures in-cache compute throughput instead.

use std::time::Instant;

use damascus_kernels::attn_decode::{
    DecodeShape, KvLayout, attn_decode_f16, attn_decode_f16_scalar,
};
use damascus_kernels::pool::ThreadPool;
use damascus_kernels::quantdot::{ActBuf, Isa, WeightType, gemv_with, kernels_for};

mod common;

struct Opts {
    threads: Vec<usize>,
    types: Vec<WeightType>,
    reps: usize,
    mats: usize,
    mb: usize,
    attn: usize,
    isas: Vec<Isa>,
    n: usize,
    k: usize,
    /// Also time the repacked layout (`gemm::packed`) on every int8 path.
    packed: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        threads: vec![1, 2],
        types: vec![
            WeightType::Q4_K,
            WeightType::Q6_K,
            WeightType::Q8_0,
            WeightType::Q4_0,
        ],
        reps: 20,
        mats: 0,
        mb: 640,
        attn: 0,
        isas: vec![Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni],
        n: 3072,
        k: 8192,
        packed: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "-t" => o.threads = v.split(',').filter_map(|s| s.parse().ok()).collect(),
            "--types" => {
                o.types = v
                    .split(',')
                    .filter_map(|s| {
                        WeightType::ALL
                            .into_iter()
                            .find(|t| t.name().eq_ignore_ascii_case(s))
                    })
                    .collect()
            }
            "--reps" => o.reps = v.parse().unwrap_or(o.reps),
            "--mats" => o.mats = v.parse().unwrap_or(o.mats),
            "--mb" => o.mb = v.parse().unwrap_or(o.mb),
            "--attn" => o.attn = v.parse().unwrap_or(o.attn),
            "--isa" => o.isas = v.split(',').filter_map(|s| s.parse().ok()).collect(),
            "--n" => o.n = v.parse().unwrap_or(o.n),
            "--k" => o.k = v.parse().unwrap_or(o.k),
            "--packed" => {
                o.packed = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    o
}

fn main() {
    let o = parse();
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    println!(
        "| type | isa | threads | n x k | MB/matrix | matrices | median us | GB/s | best GB/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &t in &o.types {
        let rb = t
            .row_bytes(o.k)
            .expect("k must be a multiple of the block size");
        let mat = o.n * rb;
        let mats = if o.mats > 0 {
            o.mats
        } else {
            (o.mb << 20).div_ceil(mat).max(1)
        };
        // Random blocks with small finite f16 scales (0x2000 ≈ 0.0078).
        let mut w: Vec<u8> = (0..mat * mats).map(|_| rnd() as u8).collect();
        common::tame_scales(t, &mut w);
        let x: Vec<f32> = (0..o.k)
            .map(|_| (rnd() % 2000) as f32 / 1000.0 - 1.0)
            .collect();
        let mut acts = ActBuf::new(t.act_type());
        let q0 = Instant::now();
        acts.quantize(&x).expect("quantize");
        let q_us = q0.elapsed().as_secs_f64() * 1e6;
        let mut out = vec![0f32; o.n];
        for &isa in &o.isas {
            let Some(kern) = kernels_for(isa) else {
                eprintln!("skip {}: not available on this CPU", isa.name());
                continue;
            };
            for &nt in &o.threads {
                let pool = ThreadPool::new(nt);
                let reps = if isa == Isa::Scalar {
                    2.max(o.reps / 10)
                } else {
                    o.reps
                };
                // Warm-up: one pass over all matrices.
                for m in 0..mats {
                    gemv_with(
                        kern,
                        t,
                        &w[m * mat..(m + 1) * mat],
                        acts.as_acts(),
                        &mut out,
                        Some(&pool),
                    )
                    .expect("gemv");
                }
                let mut times = Vec::with_capacity(reps);
                for r in 0..reps {
                    let m = r % mats;
                    let s = Instant::now();
                    gemv_with(
                        kern,
                        t,
                        &w[m * mat..(m + 1) * mat],
                        acts.as_acts(),
                        &mut out,
                        Some(&pool),
                    )
                    .expect("gemv");
                    times.push(s.elapsed().as_secs_f64());
                }
                times.sort_by(|a, b| a.total_cmp(b));
                let med = times[times.len() / 2];
                println!(
                    "| {} | {} | {} | {}x{} | {:.1} | {} | {:.0} | {:.1} | {:.1} |",
                    t.name(),
                    isa.name(),
                    nt,
                    o.n,
                    o.k,
                    mat as f64 / 1e6,
                    mats,
                    med * 1e6,
                    mat as f64 / med / 1e9,
                    mat as f64 / times[0] / 1e9
                );
            }
        }
        if o.packed {
            packed_bench(&o, t, &w, mats, &x);
        }
        println!(
            "<!-- {}: quantizing the {}-element activation took {:.1} us -->",
            t.name(),
            o.k,
            q_us
        );
    }
    if o.attn > 0 {
        attn_bench(&o);
    }
}

/// The same matrices repacked (`gemm::packed`), one token, panels split over the threads.
fn packed_bench(o: &Opts, t: WeightType, w: &[u8], mats: usize, x: &[f32]) {
    use damascus_kernels::gemm::WeightRef;
    use damascus_kernels::gemm::int8::{Int8Path, QActs, ROWS};
    use damascus_kernels::gemm::packed::PackedMatrix;
    use damascus_kernels::pool::split_range;
    let Some(dt) = damascus_quant::GgmlType::from_id(t.ggml_id()) else {
        return;
    };
    let mat = w.len() / mats;
    let pk: Vec<PackedMatrix> = (0..mats)
        .map(|m| {
            let wr = WeightRef {
                dtype: dt,
                bytes: &w[m * mat..(m + 1) * mat],
                rows: o.n,
                cols: o.k,
            };
            PackedMatrix::pack(wr, None).expect("pack")
        })
        .collect();
    let xq = QActs::new(x, 1, o.k, None).expect("acts");
    let n_panels = o.n / ROWS;
    for path in Int8Path::available() {
        if path == Int8Path::Scalar || !path.supports(dt) {
            continue;
        }
        for &nt in &o.threads {
            let pool = ThreadPool::new(nt);
            let outs: Vec<std::sync::Mutex<Vec<f32>>> = (0..nt)
                .map(|_| std::sync::Mutex::new(vec![0f32; o.n]))
                .collect();
            let run = |m: usize| {
                pool.run(&|ti, _| {
                    let r = split_range(n_panels, 1, ti, nt);
                    let mut g = outs[ti].lock().expect("lock");
                    let len = r.len() * ROWS;
                    pk[m]
                        .gemv_panels(path, &xq, r, &mut g[..len], len)
                        .expect("gemv");
                });
            };
            for m in 0..mats {
                run(m);
            }
            let mut times: Vec<f64> = (0..o.reps)
                .map(|r| {
                    let s = Instant::now();
                    run(r % mats);
                    s.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(|a, b| a.total_cmp(b));
            let med = times[times.len() / 2];
            let bytes = pk[0].n_bytes() as f64;
            println!(
                "| {} packed | {} | {} | {}x{} | {:.1} | {} | {:.0} | {:.1} | {:.1} |",
                t.name(),
                path.name(),
                nt,
                o.n,
                o.k,
                bytes / 1e6,
                mats,
                med * 1e6,
                bytes / med / 1e9,
                bytes / times[0] / 1e9
            );
        }
    }
}

/// Decode attention over an f16 KV cache shaped like Llama-3.2-3B (24 query
/// heads, 8 KV heads, head_dim 128) with `--attn N` cached positions.
fn attn_bench(o: &Opts) {
    let sh = DecodeShape {
        n_head: 24,
        n_head_kv: 8,
        head_dim: 128,
        layout: KvLayout::PosMajor,
    };
    let n_kv = o.attn;
    let kv = n_kv * sh.n_head_kv * sh.head_dim;
    let k: Vec<u16> = (0..kv).map(|i| 0x3000 + (i % 977) as u16).collect();
    let v: Vec<u16> = (0..kv).map(|i| 0x2c00 + (i % 613) as u16).collect();
    let q: Vec<f32> = (0..sh.n_head * sh.head_dim)
        .map(|i| ((i % 17) as f32 - 8.0) * 0.05)
        .collect();
    let mut out = vec![0f32; q.len()];
    let bytes = 2.0 * kv as f64 * 2.0;
    println!();
    println!("| attention (24/8 heads, hd 128) | n_kv | threads | median us | KV GB/s |");
    println!("|---|---|---|---|---|");
    let mut time = |name: &str, nt: usize, f: &mut dyn FnMut(&mut [f32])| {
        f(&mut out);
        let mut ts: Vec<f64> = (0..o.reps)
            .map(|_| {
                let s = Instant::now();
                f(&mut out);
                s.elapsed().as_secs_f64()
            })
            .collect();
        ts.sort_by(|a, b| a.total_cmp(b));
        let med = ts[ts.len() / 2];
        println!(
            "| {name} | {n_kv} | {nt} | {:.0} | {:.1} |",
            med * 1e6,
            bytes / med / 1e9
        );
    };
    time("scalar", 1, &mut |out| {
        attn_decode_f16_scalar(&q, &k, &v, sh, n_kv, out).expect("attn")
    });
    let hm = DecodeShape {
        layout: KvLayout::HeadMajor { n_ctx: n_kv },
        ..sh
    };
    for &nt in &o.threads {
        let pool = ThreadPool::new(nt);
        time("simd pos-major", nt, &mut |out| {
            attn_decode_f16(&q, &k, &v, sh, n_kv, out, Some(&pool)).expect("attn")
        });
        time("simd head-major", nt, &mut |out| {
            attn_decode_f16(&q, &k, &v, hm, n_kv, out, Some(&pool)).expect("attn")
        });
    }
}
