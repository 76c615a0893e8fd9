//! Paged decode attention: `attn_paged_f16` against `attn_group::attn_paged_f16_grouped`, one
//! thread, interleaved rounds (issue 26). A developer tool.
//!
//! `cargo run --release -p damascus-kernels --example attn_rows -- [N_KV] [B] [LAYERS]`

use std::time::Instant;

use damascus_kernels::attn_group::attn_paged_f16_grouped;
use damascus_kernels::attn_paged::{PagedQuery, PagedShape, attn_paged_f16};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_kv: usize = args.first().map_or(Ok(576), |s| s.parse())?;
    let b: usize = args.get(1).map_or(Ok(8), |s| s.parse())?;
    let (n_head, n_head_kv, hd, bs) = (9, 3, 64, 16);
    let per = n_kv.div_ceil(bs);
    let n_blocks = b * per;
    let sh = PagedShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        n_slots: n_blocks * bs,
        block_size: bs,
    };
    let len = n_head_kv * sh.n_slots * hd;
    // One pool per layer, cycled, so the caches stream from memory as in a model.
    let layers: usize = args.get(2).map_or(Ok(30), |s| s.parse())?;
    let ks: Vec<Vec<u16>> = (0..layers)
        .map(|l| {
            (0..len)
                .map(|i| 0x3000 + ((i + l) * 7 % 1024) as u16)
                .collect()
        })
        .collect();
    let vs: Vec<Vec<u16>> = (0..layers)
        .map(|l| {
            (0..len)
                .map(|i| 0x3000 + ((i + l) * 13 % 1024) as u16)
                .collect()
        })
        .collect();
    let tables: Vec<Vec<u32>> = (0..b)
        .map(|s| (0..per).map(|j| (j * b + s) as u32).collect())
        .collect();
    let queries: Vec<PagedQuery<'_>> = tables
        .iter()
        .map(|t| PagedQuery {
            table: t,
            lo: 0,
            hi: n_kv,
            scale: 0.125,
        })
        .collect();
    let q: Vec<f32> = (0..b * n_head * hd)
        .map(|i| (i % 17) as f32 * 0.01)
        .collect();
    let mut out = vec![0f32; q.len()];
    let (mut t_old, mut t_new) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        let t0 = Instant::now();
        for (k, v) in ks.iter().zip(&vs) {
            attn_paged_f16(&queries, &q, k, v, sh, &mut out, None)?;
        }
        t_old.push(t0.elapsed().as_secs_f64() * 1e3);
        let t0 = Instant::now();
        for (k, v) in ks.iter().zip(&vs) {
            attn_paged_f16_grouped(&queries, &q, k, v, sh, &mut out, None)?;
        }
        t_new.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    t_old.sort_by(f64::total_cmp);
    t_new.sort_by(f64::total_cmp);
    println!(
        "n_kv {n_kv} B {b}: paged {:.2} ms, grouped {:.2} ms (medians, {layers} layers, 1 thread)",
        t_old[7], t_new[7]
    );
    Ok(())
}
