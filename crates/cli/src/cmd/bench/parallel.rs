//! `damascus bench --npl N`: N sequences at once over one shared paged KV cache, every step
//! one batched forward pass, as `damascus serve` runs concurrent requests (in the spirit of
//! llama.cpp's `llama-batched-bench -npl`).
//!
//! * `ppP xN`: N prompts of P random tokens each, prefilled together (passes of at most
//!   [`FILL_CHUNK`] tokens), the greedy pick of each prompt's last token on the backend.
//! * `tgT xN`: T decode steps of all N sequences, one token each per step, greedy picks.
//!
//! Throughput counts every sequence's tokens: N · P (or N · T) over the run's time. With `-d D`
//! each sequence first holds D random tokens (untimed, once per test); every run then writes
//! its tokens at positions D.. again, so runs see the same depth.

use anyhow::{Context, bail};
use damascus_model::Model;
use damascus_model::batch::{PagedCache, SeqInput};

use std::time::Instant;

use super::{FILL_CHUNK, Kind, Rng, Test, timed_runs};

/// Positions per cache block: the server's.
const BLOCK: usize = damascus_server::engine::BLOCK_SIZE;

/// N sequences over one paged cache, each with its own run of blocks.
struct Batch {
    cache: PagedCache,
    /// Per sequence: its block table (blocks `s·per..(s + 1)·per`).
    tables: Vec<Vec<u32>>,
}

impl Batch {
    /// `n_seq` sequences of up to `n_pos` positions each.
    fn new(model: &Model, n_seq: usize, n_pos: usize) -> anyhow::Result<Batch> {
        let per = n_pos.max(1).div_ceil(BLOCK);
        let n_blocks = n_seq
            .checked_mul(per)
            .filter(|&b| u32::try_from(b).is_ok())
            .with_context(|| {
                format!(
                    "--npl {n_seq} sequences of {n_pos} positions: more than 2^32 cache blocks \
                     of {BLOCK}"
                )
            })?;
        let cache = model.paged_cache(n_blocks, BLOCK)?;
        let tables = (0..n_seq)
            .map(|s| (s * per..(s + 1) * per).map(|b| b as u32).collect())
            .collect();
        Ok(Batch { cache, tables })
    }

    /// Writes `ids[s]` at positions `pos0..` of every sequence `s`, in passes of at most
    /// [`FILL_CHUNK`] tokens (chunks of several sequences side by side); with `pick`, each
    /// sequence's last chunk asks for its greedy pick.
    fn prefill(&mut self, ids: &[Vec<u32>], pos0: usize, pick: bool) -> anyhow::Result<()> {
        let mut done = vec![0usize; ids.len()];
        loop {
            let mut budget = FILL_CHUNK;
            let mut seqs = Vec::new();
            let mut took = Vec::new();
            for (s, ids) in ids.iter().enumerate() {
                let take = (ids.len() - done[s]).min(budget);
                if take == 0 {
                    continue;
                }
                let end = done[s] + take;
                seqs.push(SeqInput {
                    ids: &ids[done[s]..end],
                    pos0: pos0 + done[s],
                    table: &self.tables[s],
                    logits: pick && end == ids.len(),
                });
                took.push((s, end));
                budget -= take;
                if budget == 0 {
                    break;
                }
            }
            if seqs.is_empty() {
                return Ok(());
            }
            let greedy = vec![true; seqs.len()];
            self.cache.forward_picks(&seqs, &greedy)?;
            for (s, end) in took {
                done[s] = end;
            }
        }
    }

    /// One decode step: `ids[s]` at position `pos` of every sequence, greedy picks.
    fn step(&mut self, ids: &[u32], pos: usize) -> anyhow::Result<()> {
        let seqs: Vec<SeqInput<'_>> = ids
            .iter()
            .zip(&self.tables)
            .map(|(id, table)| SeqInput {
                ids: std::slice::from_ref(id),
                pos0: pos,
                table,
                logits: true,
            })
            .collect();
        let greedy = vec![true; seqs.len()];
        self.cache.forward_picks(&seqs, &greedy)?;
        Ok(())
    }
}

/// Runs `test` (its `parallel` > 1) once as a warm-up and `reps` times; returns each run's
/// elapsed nanoseconds.
pub(super) fn samples(
    model: &Model,
    test: Test,
    reps: usize,
    rng: &mut Rng,
    n_vocab: usize,
) -> anyhow::Result<Vec<u64>> {
    if !model.supports_batches() {
        bail!(
            "--npl {}: the {} backend does not run batched passes (use the cpu or cuda backend)",
            test.parallel,
            model.backend_name()
        );
    }
    let n_seq = test.parallel;
    let mut batch = Batch::new(model, n_seq, test.depth + test.n_tokens())?;
    if test.depth > 0 {
        eprint!("{}: filling {n_seq} × {} tokens,", test.name(), test.depth);
        let fill: Vec<Vec<u32>> = (0..n_seq).map(|_| rng.ids(test.depth, n_vocab)).collect();
        batch.prefill(&fill, 0, false)?;
    }
    timed_runs(test, reps, || {
        let t0 = match test.kind {
            Kind::Prompt(n) => {
                let ids: Vec<Vec<u32>> = (0..n_seq).map(|_| rng.ids(n, n_vocab)).collect();
                let t0 = Instant::now();
                batch.prefill(&ids, test.depth, true)?;
                t0
            }
            Kind::Gen(n) => {
                let ids: Vec<Vec<u32>> = (0..n).map(|_| rng.ids(n_seq, n_vocab)).collect();
                let t0 = Instant::now();
                for (i, step) in ids.iter().enumerate() {
                    batch.step(step, test.depth + i)?;
                }
                t0
            }
        };
        Ok(t0.elapsed().as_nanos() as u64)
    })
}
