//! The serving step's outputs (issue 26): [`PagedCache::forward_picks`] hands greedy sequences
//! their argmax and the others their logits, the same bits as [`PagedCache::forward`] gives;
//! and a pass's result does not depend on the sizes of the passes before it (the decoder keeps
//! one set of activation buffers, resized in place, across passes of any size).

mod common;

use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::host_argmax;
use damascus_model::backend::reference::ReferenceBackend;
use damascus_model::batch::{PagedCache, SeqInput, StepOut};
use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_quant::recipe::Mix;

const BLOCK: usize = 4;
const N_BLOCKS: usize = 64;

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 100 + (seed * 7919 + i * 104_729) % 5000)
        .collect()
}

/// A table of `n` blocks starting at block `first`.
fn table(first: u32, n: u32) -> Vec<u32> {
    (first..first + n).collect()
}

fn models() -> Vec<Model> {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    let opts = |cache_type| LoadOptions {
        n_ctx: Some(64),
        cache_type: Some(cache_type),
        ..Default::default()
    };
    vec![
        Model::with_backend(f.clone(), &opts(KvCacheType::F32), ReferenceBackend).unwrap(),
        Model::with_backend(f, &opts(KvCacheType::F16), CpuBackend::new(Some(2))).unwrap(),
    ]
}

#[test]
fn picks_are_the_argmax_and_logits_the_same_bits() {
    for m in models() {
        let name = m.backend_name();
        // Four sequences, each in its own 4 blocks: prompts of 5, 1, 9 and 3 tokens; the third
        // asks for nothing (a prompt chunk).
        let prompts: Vec<Vec<u32>> = [5, 1, 9, 3]
            .iter()
            .enumerate()
            .map(|(i, &n)| prompt(i as u32 + 1, n))
            .collect();
        let tables: Vec<Vec<u32>> = (0..4).map(|i| table(4 * i, 4)).collect();
        let inputs: Vec<SeqInput<'_>> = prompts
            .iter()
            .zip(&tables)
            .enumerate()
            .map(|(i, (p, t))| SeqInput {
                ids: p,
                pos0: 0,
                table: t,
                logits: i != 2,
            })
            .collect();
        let mut plain: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        let want = plain.forward(&inputs).unwrap();
        assert_eq!(want.len(), 3);
        for greedy in [
            [false; 4],
            [true; 4],
            [true, false, true, true],
            [false, true, false, true],
        ] {
            let mut c: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
            let got = c.forward_picks(&inputs, &greedy).unwrap();
            let asked: Vec<bool> = (0..4).filter(|&i| i != 2).map(|i| greedy[i]).collect();
            assert_eq!(got.len(), want.len(), "{name} {greedy:?}");
            for ((g, w), pick) in got.iter().zip(&want).zip(asked) {
                match g {
                    StepOut::Token(t) => {
                        assert!(pick, "{name} {greedy:?}: a token for a sampled row");
                        assert_eq!(*t, host_argmax(w), "{name} {greedy:?}");
                    }
                    StepOut::Logits(l) => {
                        assert!(!pick, "{name} {greedy:?}: logits for a greedy row");
                        assert!(
                            l.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{name} {greedy:?}: logits differ"
                        );
                    }
                }
            }
        }
        // One flag per sequence, or a clear error.
        let mut c: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        assert!(c.forward_picks(&inputs, &[true]).is_err());
    }
}

/// Runs a greedy sequence of `target` for `n_gen` tokens in blocks 0..8 of `c`, one token per
/// pass after its prompt; returns the logits of every step.
fn run_target(c: &mut PagedCache, target: &[u32], n_gen: usize) -> Vec<Vec<f32>> {
    let t = table(0, 8);
    let mut all = target.to_vec();
    let mut n_past = 0;
    let mut out = Vec::new();
    while out.len() < n_gen {
        let inp = [SeqInput {
            ids: &all[n_past..],
            pos0: n_past,
            table: &t,
            logits: true,
        }];
        let l = c.forward(&inp).unwrap().pop().unwrap();
        n_past = all.len();
        all.push(host_argmax(&l));
        out.push(l);
    }
    out
}

#[test]
fn a_pass_does_not_depend_on_the_sizes_of_earlier_passes() {
    for m in models() {
        let name = m.backend_name();
        let target = prompt(7, 11);
        let mut fresh: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        let want = run_target(&mut fresh, &target, 4);
        // The same cache first runs a 40-token pass and a 3-sequence pass on other blocks, so
        // its buffers are larger (and hold other contents) when the target's passes come.
        let mut used: PagedCache = m.paged_cache(N_BLOCKS, BLOCK).unwrap();
        let (big, t_big) = (prompt(3, 40), table(16, 10));
        used.forward(&[SeqInput {
            ids: &big,
            pos0: 0,
            table: &t_big,
            logits: true,
        }])
        .unwrap();
        let (a, b, c) = (prompt(4, 2), prompt(5, 6), prompt(6, 1));
        let (ta, tb, tc) = (table(26, 2), table(28, 2), table(30, 1));
        used.forward(&[
            SeqInput {
                ids: &a,
                pos0: 0,
                table: &ta,
                logits: true,
            },
            SeqInput {
                ids: &b,
                pos0: 0,
                table: &tb,
                logits: false,
            },
            SeqInput {
                ids: &c,
                pos0: 0,
                table: &tc,
                logits: true,
            },
        ])
        .unwrap();
        let got = run_target(&mut used, &target, 4);
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.iter().zip(w).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: step {step}: logits depend on the earlier passes"
            );
        }
    }
}
