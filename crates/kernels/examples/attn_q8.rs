//! Paged attention on an f16 pool against a q8_0 pool, one thread, interleaved rounds, medians:
//! decode (the grouped kernel, one token per sequence) and a prompt chunk (the tiled kernel).
//! SmolLM2-135M's heads (9 query, 3 KV, 64 wide) and 30 layers, so the caches stream from
//! memory as in a model. A developer tool.
//!
//! `cargo run --release -p damascus-kernels --example attn_q8 -- [N_KV] [CHUNK] [ROUNDS]`
//! (`CHUNK` 0: decode only)

use std::time::Instant;

use damascus_kernels::attn_group::attn_paged_f16_grouped;
use damascus_kernels::attn_kv::{Q8Rows, quantize_q8_0};
use damascus_kernels::attn_paged::{PagedQuery, PagedShape, attn_paged_f16};
use damascus_kernels::attn_paged_q8::{attn_paged_q8, attn_paged_q8_grouped};
use damascus_kernels::quantdot::f32_to_f16;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_kv: usize = args.first().map_or(Ok(4096), |s| s.parse())?;
    let chunk: usize = args.get(1).map_or(Ok(64), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(7), |s| s.parse())?;
    let (n_head, n_head_kv, hd, bs, layers) = (9, 3, 64, 16, 30);
    let n_blocks = n_kv.div_ceil(bs);
    let sh = PagedShape {
        n_head,
        n_head_kv,
        head_dim: hd,
        n_slots: n_blocks * bs,
        block_size: bs,
    };
    let len = n_head_kv * sh.n_slots * hd;
    let val = |i: usize, l: usize, m: usize| ((i * m + l * 31) % 1997) as f32 / 1000.0 - 1.0;
    let mut f16 = Vec::new();
    let mut q8 = Vec::new();
    for l in 0..layers {
        let kx: Vec<f32> = (0..len).map(|i| val(i, l, 7)).collect();
        let vx: Vec<f32> = (0..len).map(|i| val(i, l, 13)).collect();
        f16.push((
            kx.iter().map(|&x| f32_to_f16(x)).collect::<Vec<u16>>(),
            vx.iter().map(|&x| f32_to_f16(x)).collect::<Vec<u16>>(),
        ));
        let quant = |x: &[f32]| {
            let mut qs = vec![0i8; x.len()];
            let mut d = vec![0u16; x.len() / 32];
            quantize_q8_0(x, &mut qs, &mut d).map(|_| (qs, d))
        };
        q8.push((quant(&kx)?, quant(&vx)?));
    }
    let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
    let decode = [PagedQuery {
        table: &table,
        lo: 0,
        hi: n_kv,
        scale: 0.125,
    }];
    let prompt: Vec<PagedQuery<'_>> = (n_kv - chunk.min(n_kv)..n_kv)
        .map(|p| PagedQuery {
            table: &table,
            lo: 0,
            hi: p + 1,
            scale: 0.125,
        })
        .collect();
    let w = n_head * hd;
    let q: Vec<f32> = (0..chunk.max(1) * w).map(|i| val(i, 0, 3)).collect();
    let mut out = vec![0f32; chunk.max(1) * w];
    let (mut t_dec, mut t_pro) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..rounds {
        for ty in 0..2 {
            let t0 = Instant::now();
            for l in 0..layers {
                let o = &mut out[..w];
                if ty == 0 {
                    attn_paged_f16_grouped(&decode, &q[..w], &f16[l].0, &f16[l].1, sh, o, None)?;
                } else {
                    let (k, v) = (&q8[l].0, &q8[l].1);
                    let (k, v) = (Q8Rows::new(&k.0, &k.1)?, Q8Rows::new(&v.0, &v.1)?);
                    attn_paged_q8_grouped(&decode, &q[..w], k, v, sh, o, None)?;
                }
            }
            t_dec[ty].push(t0.elapsed().as_secs_f64() * 1e3);
            if chunk == 0 {
                t_pro[ty].push(0.0);
                continue;
            }
            let t0 = Instant::now();
            for l in 0..layers {
                if ty == 0 {
                    attn_paged_f16(&prompt, &q, &f16[l].0, &f16[l].1, sh, &mut out, None)?;
                } else {
                    let (k, v) = (&q8[l].0, &q8[l].1);
                    let (k, v) = (Q8Rows::new(&k.0, &k.1)?, Q8Rows::new(&v.0, &v.1)?);
                    attn_paged_q8(&prompt, &q, k, v, sh, &mut out, None)?;
                }
            }
            t_pro[ty].push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    println!("n_kv {n_kv}, {layers} layers, 1 thread, median of {rounds} interleaved rounds");
    for (name, t) in [
        ("decode (grouped)", &t_dec),
        ("prompt chunk (tiled)", &t_pro),
    ] {
        let (a, b) = (median(t[0].clone()), median(t[1].clone()));
        println!(
            "{name}: f16 {a:.2} ms, q8_0 {b:.2} ms, q8_0/f16 {:.2}",
            b / a
        );
    }
    println!("chunk of {chunk} tokens for the prompt test");
    Ok(())
}
