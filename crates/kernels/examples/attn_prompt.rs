//! Prompt attention on the paged cache (issue 28): a prompt of `N` tokens from position 0 at
//! Llama 3.2 3B's shape (32 query heads, 8 KV heads, head size 128, blocks of 16), through
//! `attn_paged_f16` (the tiled kernel at the chosen ISA), several rounds, medians. A developer
//! tool.
//!
//! `cargo run --release -p damascus-kernels --example attn_prompt -- [N] [THREADS] [ROUNDS]`

use std::time::Instant;

use damascus_kernels::attn_paged::{PagedQuery, PagedShape, attn_paged_f16};
use damascus_kernels::pool::ThreadPool;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map_or(Ok(512), |s| s.parse())?;
    let threads: usize = args.get(1).map_or(Ok(1), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(7), |s| s.parse())?;
    let (n_head, n_head_kv, hd, bs) = (32, 8, 128, 16);
    let n_blocks = n.div_ceil(bs);
    let sh = PagedShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        n_slots: n_blocks * bs,
        block_size: bs,
    };
    let len = n_head_kv * sh.n_slots * hd;
    let k: Vec<u16> = (0..len).map(|i| 0x3000 + (i * 7 % 1024) as u16).collect();
    let v: Vec<u16> = (0..len).map(|i| 0x3000 + (i * 13 % 1024) as u16).collect();
    let table: Vec<u32> = (0..n_blocks as u32).collect();
    let queries: Vec<PagedQuery<'_>> = (0..n)
        .map(|p| PagedQuery {
            table: &table,
            lo: 0,
            hi: p + 1,
            scale: 1.0 / (hd as f32).sqrt(),
        })
        .collect();
    let q: Vec<f32> = (0..n * n_head * hd)
        .map(|i| (i % 17) as f32 * 0.01 - 0.08)
        .collect();
    let mut out = vec![0f32; q.len()];
    let pool = ThreadPool::new(threads);
    let pool = (threads > 1).then_some(&pool);
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let t0 = Instant::now();
        attn_paged_f16(&queries, &q, &k, &v, sh, &mut out, pool)?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let med = ms[ms.len() / 2];
    // Q·Kᵀ and P·V over the causal triangle: 2 · 2 · head_dim flops per (head, visible pair).
    let flops = 4.0 * (hd * n_head) as f64 * (n * (n + 1) / 2) as f64;
    let check: f64 = out.iter().map(|&x| x as f64).sum();
    println!(
        "prompt {n}, {threads} thread(s): {med:.2} ms median of {rounds} ({:.1} GFLOP/s), checksum {check:.6}",
        flops / med / 1e6
    );
    Ok(())
}
