//! Tests of the block pool: hand-made cases and seeded random joins, cancellations and
//! finishes with every invariant checked after each step.

use super::*;

/// xorshift64*: a small seeded generator for the random schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn shares_full_blocks_of_a_common_prefix() {
    let mut pool = BlockPool::new(8, 4);
    let a_tokens: Vec<u32> = (0..10).collect();
    let (mut a, hit) = pool.start(&a_tokens, true);
    assert_eq!(hit, 0);
    pool.reserve(&mut a, 10).unwrap();
    assert_eq!(a.blocks.len(), 3);
    pool.commit(&mut a, &a_tokens);
    assert_eq!(a.n_keyed(), 2);
    // Same first 8 tokens, then different ones: two blocks shared.
    let b_tokens: Vec<u32> = (0..8).chain([99, 98, 97]).collect();
    let (mut b, hit) = pool.start(&b_tokens, true);
    assert_eq!(hit, 8);
    assert_eq!(b.blocks[..], a.blocks[..2]);
    pool.reserve(&mut b, 11).unwrap();
    assert_eq!(pool.n_used(), 4);
    pool.check(&[&a, &b]).unwrap();
    // A prompt that is exactly the cached prefix keeps its last token to compute.
    let (c, hit) = pool.start(&a_tokens[..8], true);
    assert_eq!(hit, 4);
    // cache_prompt: false shares nothing.
    let (d, hit) = pool.start(&a_tokens, false);
    assert_eq!((hit, d.blocks.len()), (0, 0));
    pool.release(a);
    pool.release(b);
    pool.release(c);
    pool.check(&[]).unwrap();
    assert_eq!(pool.n_available(), 8);
    assert_eq!(pool.n_cached(), 2);
    let s = pool.stats();
    assert_eq!((s.lookup_tokens, s.hit_tokens), (29, 12));
}

#[test]
fn evicts_least_recently_used_and_reports_full() {
    let mut pool = BlockPool::new(4, 2);
    let t1 = [1, 2, 3, 4, 5];
    let (mut a, _) = pool.start(&t1, true);
    pool.reserve(&mut a, 5).unwrap();
    pool.commit(&mut a, &t1);
    pool.release(a);
    assert_eq!((pool.n_cached(), pool.n_available()), (2, 4));
    // Needs all four blocks: the free ones first, then both cached ones evicted.
    let t2 = [9; 8];
    let (mut b, hit) = pool.start(&t2, true);
    assert_eq!(hit, 0);
    pool.reserve(&mut b, 8).unwrap();
    assert_eq!(pool.n_cached(), 0);
    let (mut c, _) = pool.start(&t2, true);
    assert_eq!(
        pool.reserve(&mut c, 1),
        Err(PoolFull {
            needed: 1,
            available: 0
        })
    );
    assert!(c.blocks.is_empty());
    pool.check(&[&b, &c]).unwrap();
}

#[test]
fn truncate_never_rewrites_a_cached_block() {
    let mut pool = BlockPool::new(6, 4);
    let t: Vec<u32> = (0..10).collect();
    let (mut a, _) = pool.start(&t, true);
    pool.reserve(&mut a, 10).unwrap();
    pool.commit(&mut a, &t);
    // Inside the second (cached) block: dropped to the block boundary.
    assert_eq!(pool.truncate(&mut a, 6), 4);
    assert_eq!(a.blocks.len(), 1);
    pool.check(&[&a]).unwrap();
    pool.reserve(&mut a, 7).unwrap();
    // Inside a private block: kept as asked.
    assert_eq!(pool.truncate(&mut a, 6), 6);
    pool.check(&[&a]).unwrap();
}

#[test]
fn random_joins_cancels_and_finishes_keep_every_invariant() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let bs = 1 + rng.below(8);
        let n_blocks = 4 + rng.below(40);
        let mut pool = BlockPool::new(n_blocks, bs);
        // A few shared system prompts so prefixes really are shared.
        let prefixes: Vec<Vec<u32>> = (0..3)
            .map(|p| {
                (0..rng.below(3 * bs + 1))
                    .map(|i| (p * 1000 + i) as u32)
                    .collect()
            })
            .collect();
        // Live sequences: (tokens in the cache, table).
        let mut live: Vec<(Vec<u32>, BlockTable)> = Vec::new();
        for _ in 0..400 {
            match rng.below(4) {
                0 => {
                    // Join: a shared prefix plus a random tail.
                    let mut toks = prefixes[rng.below(3)].clone();
                    toks.extend((0..1 + rng.below(2 * bs)).map(|_| rng.below(5) as u32));
                    let (mut t, hit) = pool.start(&toks, rng.below(4) != 0);
                    assert!(hit < toks.len() && hit % bs == 0);
                    match pool.reserve(&mut t, toks.len()) {
                        Ok(()) => {
                            pool.commit(&mut t, &toks);
                            live.push((toks, t));
                        }
                        Err(_) => pool.release(t), // pool full: the request waits
                    }
                }
                1 if !live.is_empty() => {
                    // Decode: one more token.
                    let i = rng.below(live.len());
                    let (toks, t) = &mut live[i];
                    if pool.reserve(t, toks.len() + 1).is_ok() {
                        toks.push(rng.below(5) as u32);
                        pool.commit(t, toks);
                    }
                }
                2 if !live.is_empty() => {
                    // Finish or cancel: blocks go back at once.
                    let (_, t) = live.swap_remove(rng.below(live.len()));
                    pool.release(t);
                }
                3 if !live.is_empty() => {
                    let i = rng.below(live.len());
                    let (toks, t) = &mut live[i];
                    let kept = pool.truncate(t, rng.below(toks.len() + 1));
                    toks.truncate(kept);
                }
                _ => {}
            }
            let tables: Vec<&BlockTable> = live.iter().map(|(_, t)| t).collect();
            pool.check(&tables)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            // Shared blocks hold the same tokens in every table that holds them.
            let mut owner: HashMap<u32, &[u32]> = HashMap::new();
            for (toks, t) in &live {
                for (i, &b) in t.blocks.iter().enumerate().take(t.n_keyed()) {
                    let chunk = &toks[i * bs..(i + 1) * bs];
                    if let Some(prev) = owner.insert(b, chunk) {
                        assert_eq!(
                            prev, chunk,
                            "seed {seed}: block {b} shared by different prefixes"
                        );
                    }
                }
            }
            // A block written by a sequence (past its keyed blocks) belongs to it alone.
            for (_, t) in &live {
                for &b in t.blocks.iter().skip(t.n_keyed()) {
                    assert_eq!(
                        pool.refcount[b as usize], 1,
                        "seed {seed}: private block shared"
                    );
                }
            }
        }
        for (_, t) in live.drain(..) {
            pool.release(t);
        }
        pool.check(&[]).unwrap();
        assert_eq!(
            pool.n_available(),
            n_blocks,
            "seed {seed}: every block comes back"
        );
    }
}
