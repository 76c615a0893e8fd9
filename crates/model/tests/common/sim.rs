//! The server's continuous batching simulated over a [`PagedCache`]: sequences arrive, their
//! prompts are chunked under a token budget next to the decoding ones, blocks come from a
//! shared [`BlockPool`] with prefix reuse and return when a sequence ends (the batch
//! invariance tests of every backend).

use damascus_model::Model;
use damascus_model::backend::host_argmax;
use damascus_model::batch::{PagedCache, SeqInput};
use damascus_model::kv_pool::{BlockPool, BlockTable};

/// A sequence of the simulated server.
pub struct Seq {
    pub arrive: usize,
    pub all: Vec<u32>,
    pub n_past: usize,
    pub n_gen: usize,
    pub table: Option<BlockTable>,
    pub logits: Vec<Vec<f32>>,
}

/// A sequence arriving at step `arrive` with prompt `all`, sampling `n_gen` tokens.
pub fn seq(arrive: usize, all: Vec<u32>, n_gen: usize) -> Seq {
    Seq {
        arrive,
        all,
        n_past: 0,
        n_gen,
        table: None,
        logits: Vec::new(),
    }
}

/// Runs `seqs` to completion: each step takes every decoding sequence's token, then prompt
/// chunks by arrival up to `budget` tokens, over a pool of `n_blocks` blocks of `block` slots. Returns every sequence's logits per sampled token.
pub fn simulate(
    model: &Model,
    mut seqs: Vec<Seq>,
    budget: usize,
    n_blocks: usize,
    block: usize,
) -> Vec<Vec<Vec<f32>>> {
    let mut cache: PagedCache = model.paged_cache(n_blocks, block).unwrap();
    let mut pool = BlockPool::new(n_blocks, block);
    let mut step = 0;
    while seqs.iter().any(|s| s.logits.len() < s.n_gen) {
        for s in seqs.iter_mut() {
            if s.arrive == step {
                let (mut t, hit) = pool.start(&s.all, true);
                pool.reserve(&mut t, s.all.len() + s.n_gen).unwrap();
                s.n_past = hit;
                s.table = Some(t);
            }
        }
        let mut left = budget;
        let mut chunks = vec![0usize; seqs.len()];
        for (c, s) in chunks.iter_mut().zip(&seqs) {
            if s.table.is_some() && s.all.len() - s.n_past == 1 {
                *c = 1;
                left = left.saturating_sub(1);
            }
        }
        for (c, s) in chunks.iter_mut().zip(&seqs) {
            let rest = s.all.len() - s.n_past;
            if s.table.is_some() && rest > 1 && left > 0 {
                *c = rest.min(left);
                left -= *c;
            }
        }
        let inputs: Vec<SeqInput<'_>> = seqs
            .iter()
            .zip(&chunks)
            .filter(|(_, c)| **c > 0)
            .map(|(s, &c)| SeqInput {
                ids: &s.all[s.n_past..s.n_past + c],
                pos0: s.n_past,
                table: &s.table.as_ref().unwrap().blocks,
                logits: s.n_past + c == s.all.len(),
            })
            .collect();
        let out = if inputs.is_empty() {
            Vec::new()
        } else {
            cache.forward(&inputs).unwrap()
        };
        drop(inputs);
        let mut out = out.into_iter();
        for (s, &c) in seqs.iter_mut().zip(&chunks) {
            if c == 0 {
                continue;
            }
            s.n_past += c;
            pool.commit(s.table.as_mut().unwrap(), &s.all[..s.n_past]);
            if s.n_past == s.all.len() {
                let l = out.next().unwrap();
                s.all.push(host_argmax(&l));
                s.logits.push(l);
                if s.logits.len() == s.n_gen {
                    pool.release(s.table.take().unwrap());
                }
            }
        }
        step += 1;
        assert!(step < 1000, "the simulation does not finish");
    }
    let tables: Vec<&BlockTable> = seqs.iter().filter_map(|s| s.table.as_ref()).collect();
    pool.check(&tables).unwrap();
    seqs.into_iter().map(|s| s.logits).collect()
}
