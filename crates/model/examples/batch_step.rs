//! Times one decode step of `B` sequences over a shared paged cache (issue 26): the cost per
//! step as the batch grows, to see which part does not amortize. A developer tool, not CI.
//!
//! `cargo run --release -p damascus-model --example batch_step -- MODEL.gguf [CTX] [STEPS] [B...]`
//! (`DAMASCUS_PROFILE=1` adds the per-op profile of the whole run; `DAMASCUS_BACKEND=cuda`
//! runs on CUDA device 0, built with `--features cuda`.)
//!
//! Steps alternate between the two ways the server's engine can take a greedy step: every
//! sequence's logits read back and picked on the host (`logits`), or only the picks
//! (`picks`, [`damascus_model::batch::PagedCache::forward_picks`]: the backend's argmax).

use std::time::Instant;

use damascus_kernels::settings::KernelSettings;
use damascus_model::backend::host_argmax;
use damascus_model::batch::SeqInput;
use damascus_model::kv_pool::BlockPool;
use damascus_model::{BackendKind, LoadOptions, Model};

const BLOCK: usize = 16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: batch_step MODEL.gguf [CTX] [STEPS] [B...]")?;
    let ctx: usize = args.get(1).map_or(Ok(512), |s| s.parse())?;
    let steps: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let bs: Vec<usize> = if args.len() > 3 {
        args[3..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 2, 4, 8]
    };
    let kernel = KernelSettings::from_vars(|k| std::env::var(k).ok())?;
    kernel.install()?;
    let backend = match std::env::var("DAMASCUS_BACKEND").as_deref() {
        Ok("cuda") => BackendKind::Cuda {
            device: 0,
            n_gpu_layers: None,
            n_threads: None,
        },
        _ => BackendKind::Cpu { n_threads: Some(2) },
    };
    let opts = LoadOptions {
        backend,
        kernel,
        ..Default::default()
    };
    let model = Model::load(path, &opts)?;
    let bmax = *bs.iter().max().unwrap_or(&1);
    let n_blocks = bmax * (ctx + steps + BLOCK).div_ceil(BLOCK) + 8;
    for &b in &bs {
        let mut cache = model.paged_cache(n_blocks, BLOCK)?;
        let mut pool = BlockPool::new(n_blocks, BLOCK);
        let mut tables = Vec::new();
        let mut seqs: Vec<Vec<u32>> = Vec::new();
        for s in 0..b {
            let ids: Vec<u32> = (0..ctx as u32)
                .map(|i| 100 + (s as u32 * 7919 + i * 104_729) % 5000)
                .collect();
            let (mut t, _) = pool.start(&ids, false);
            pool.reserve(&mut t, ctx + steps + 1)
                .map_err(|_| "the pool is too small")?;
            // Prefill one sequence at a time.
            cache.forward(&[SeqInput {
                ids: &ids,
                pos0: 0,
                table: &t.blocks,
                logits: false,
            }])?;
            tables.push(t);
            seqs.push(ids);
        }
        let mut times = [Vec::new(), Vec::new()]; // [logits, picks]
        let greedy = vec![true; b];
        for step in 0..steps {
            let ins: Vec<SeqInput<'_>> = (0..b)
                .map(|s| SeqInput {
                    ids: &seqs[s][step % ctx..step % ctx + 1],
                    pos0: ctx + step,
                    table: &tables[s].blocks,
                    logits: true,
                })
                .collect();
            let t0 = Instant::now();
            if step % 2 == 0 {
                let picks: Vec<u32> = cache
                    .forward(&ins)?
                    .iter()
                    .map(|l| host_argmax(l))
                    .collect();
                std::hint::black_box(picks);
            } else {
                std::hint::black_box(cache.forward_picks(&ins, &greedy)?);
            }
            times[step % 2].push(t0.elapsed().as_secs_f64() * 1e3);
        }
        for (name, t) in ["logits", "picks"].iter().zip(&mut times) {
            t.sort_by(f64::total_cmp);
            let med = t.get(t.len() / 2).copied().unwrap_or(f64::NAN);
            println!(
                "B={b:2} {name:6}  step median {med:7.2} ms  per token {:6.2} ms  {:7.1} tok/s",
                med / b as f64,
                b as f64 * 1e3 / med
            );
        }
    }
    Ok(())
}
