//! The KV cache as a shared pool of fixed-size blocks (vLLM's block manager, with its automatic
//! prefix caching), as bookkeeping only: which physical block holds which positions of which
//! sequence. The memory itself is one backend KV cache of `n_blocks * block_size` positions
//! (see [`crate::batch`]); block `b` holds the positions `b * block_size ..` of that cache.
//!
//! ```text
//!   sequence A: table [4, 9, 2]   positions 0..40   (block_size 16)
//!   sequence B: table [4, 7]      positions 0..20   (block 4 shared: the same first 16 tokens)
//!   free: [0, 1, 3, ...]          evictable (cached, unused): LRU [5, 8]
//! ```
//!
//! Every block is in exactly one state: **free** (no content), **used** (refcount > 0: in the
//! tables of that many sequences), or **evictable** (refcount 0 but holding a full block of a
//! known prefix, reusable by a later request until it is evicted, least recently used first,
//! when the free list runs dry). A full block is keyed by a chained hash of its tokens and
//! its parent's key, so a key names the whole prefix up to the block's end; the tokens are
//! kept and compared too, so a hash collision can never hand out wrong cache contents.

use std::collections::{BTreeMap, HashMap};

/// Key of a full block: a hash of the whole prefix up to its end.
pub type BlockKey = u64;

/// The key of the empty prefix (the parent of a sequence's first block).
pub const ROOT_KEY: BlockKey = 0xcbf2_9ce4_8422_2325;

/// The key of a full block of `tokens` following the prefix `parent` (FNV-1a over the parent
/// key and the token ids: stable across runs and builds).
pub fn block_key(parent: BlockKey, tokens: &[u32]) -> BlockKey {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = ROOT_KEY;
    for byte in parent
        .to_le_bytes()
        .into_iter()
        .chain(tokens.iter().flat_map(|t| t.to_le_bytes()))
    {
        h ^= u64::from(byte);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// Not enough free or evictable blocks for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolFull {
    /// Blocks asked for.
    pub needed: usize,
    /// Blocks that could be handed out.
    pub available: usize,
}

/// The blocks of one sequence, in position order: position `p` lives in
/// `blocks[p / block_size]`, slot `p % block_size`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Physical block ids.
    pub blocks: Vec<u32>,
    /// Keys of the leading full blocks already registered in the prefix cache (or found
    /// there): `keys[i]` is the key of `blocks[i]`.
    keys: Vec<BlockKey>,
}

impl BlockTable {
    /// Full blocks registered in (or matched from) the prefix cache.
    pub fn n_keyed(&self) -> usize {
        self.keys.len()
    }
}

/// What a cached block is: its key, its parent's key and its tokens (compared on a hit).
#[derive(Clone, Debug)]
struct Cached {
    key: BlockKey,
    parent: BlockKey,
    tokens: Vec<u32>,
}

/// Counters of the prefix cache (for `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up.
    pub lookup_tokens: u64,
    /// Of those, tokens found in the cache (not recomputed).
    pub hit_tokens: u64,
}

impl PrefixStats {
    /// `hit_tokens / lookup_tokens` (0 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        if self.lookup_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.lookup_tokens as f64
        }
    }
}

/// The block allocator with its prefix cache.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    /// Per block: tables holding it.
    refcount: Vec<u32>,
    /// Per block: its prefix-cache entry, if it holds a registered full block.
    cached: Vec<Option<Cached>>,
    /// Key → the block holding it.
    by_key: HashMap<BlockKey, u32>,
    /// Blocks with no content, handed out last-in first-out.
    free: Vec<u32>,
    /// Evictable blocks by last use: tick → block.
    lru: BTreeMap<u64, u32>,
    /// Per block: its tick in `lru` while evictable.
    lru_tick: Vec<u64>,
    tick: u64,
    stats: PrefixStats,
}

impl BlockPool {
    /// A pool of `n_blocks` blocks of `block_size` positions, all free.
    pub fn new(n_blocks: usize, block_size: usize) -> BlockPool {
        assert!(block_size > 0, "block_size must be positive");
        let n = u32::try_from(n_blocks).expect("block count fits u32");
        BlockPool {
            block_size,
            refcount: vec![0; n_blocks],
            cached: vec![None; n_blocks],
            by_key: HashMap::new(),
            free: (0..n).rev().collect(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; n_blocks],
            tick: 0,
            stats: PrefixStats::default(),
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.refcount.len()
    }

    /// Blocks in some sequence's table.
    pub fn n_used(&self) -> usize {
        self.n_blocks() - self.n_available()
    }

    /// Blocks that can be handed out (free plus evictable).
    pub fn n_available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks holding a registered prefix (used or evictable).
    pub fn n_cached(&self) -> usize {
        self.by_key.len()
    }

    /// Prefix-cache counters.
    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Blocks needed to hold `n_positions`.
    pub fn blocks_for(&self, n_positions: usize) -> usize {
        n_positions.div_ceil(self.block_size)
    }

    /// Starts a table for a sequence whose first tokens are `tokens`: the longest run of its
    /// leading full blocks found in the prefix cache is shared (refcounts taken), leaving at
    /// least one token to compute (the last prompt token's logits are needed). Returns the
    /// table and the number of positions it already holds (a multiple of the block size).
    /// `lookup: false` (a request with `cache_prompt: false`) shares nothing.
    pub fn start(&mut self, tokens: &[u32], lookup: bool) -> (BlockTable, usize) {
        let mut table = BlockTable::default();
        if !lookup || tokens.is_empty() {
            return (table, 0);
        }
        let bs = self.block_size;
        let max_blocks = (tokens.len() - 1) / bs;
        let mut parent = ROOT_KEY;
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            let key = block_key(parent, chunk);
            let Some(&b) = self.by_key.get(&key) else {
                break;
            };
            let entry = self.cached[b as usize].as_ref();
            if !entry.is_some_and(|c| c.parent == parent && c.tokens == chunk) {
                break; // a hash collision: never share what is not the same prefix
            }
            self.take_ref(b);
            table.blocks.push(b);
            table.keys.push(key);
            parent = key;
        }
        let hit = table.blocks.len() * bs;
        self.stats.lookup_tokens += tokens.len() as u64;
        self.stats.hit_tokens += hit as u64;
        (table, hit)
    }

    /// Grows `table` to hold `n_positions`, taking free blocks first and then evicting the
    /// least recently used cached ones. On failure nothing changes.
    pub fn reserve(&mut self, table: &mut BlockTable, n_positions: usize) -> Result<(), PoolFull> {
        let needed = self
            .blocks_for(n_positions)
            .saturating_sub(table.blocks.len());
        if needed > self.n_available() {
            return Err(PoolFull {
                needed,
                available: self.n_available(),
            });
        }
        for _ in 0..needed {
            let b = match self.free.pop() {
                Some(b) => b,
                None => self.evict_lru(),
            };
            self.refcount[b as usize] = 1;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// Registers the full blocks of `table` that now hold `tokens` (the sequence's tokens
    /// whose keys and values are in the cache, from position 0) in the prefix cache, so later
    /// requests can share them. A block whose prefix is already cached elsewhere stays
    /// private.
    pub fn commit(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let bs = self.block_size;
        let n_full = (tokens.len() / bs).min(table.blocks.len());
        while table.keys.len() < n_full {
            let i = table.keys.len();
            let parent = table.keys.last().copied().unwrap_or(ROOT_KEY);
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent, chunk);
            let b = table.blocks[i];
            if !self.by_key.contains_key(&key) && self.cached[b as usize].is_none() {
                self.by_key.insert(key, b);
                self.cached[b as usize] = Some(Cached {
                    key,
                    parent,
                    tokens: chunk.to_vec(),
                });
            }
            table.keys.push(key);
        }
    }

    /// Gives every block of `table` back: a block nobody else holds becomes evictable if it
    /// is a cached prefix, free otherwise. Later blocks are released first, so eviction takes
    /// the tails of prefixes before their heads.
    pub fn release(&mut self, table: BlockTable) {
        for &b in table.blocks.iter().rev() {
            self.drop_ref(b);
        }
    }

    /// Keeps at most the first `n_positions` positions of `table` (blocks past them go back)
    /// and returns how many it kept: a block registered in the prefix cache is never written
    /// again, so a cut inside one drops the whole block (the result is then rounded down to
    /// the block size).
    pub fn truncate(&mut self, table: &mut BlockTable, n_positions: usize) -> usize {
        let bs = self.block_size;
        let kept = if !n_positions.is_multiple_of(bs) && n_positions / bs < table.keys.len() {
            n_positions / bs * bs
        } else {
            n_positions.min(table.blocks.len() * bs)
        };
        let keep = self.blocks_for(kept);
        while table.blocks.len() > keep {
            let b = table.blocks.pop().expect("len > keep");
            self.drop_ref(b);
        }
        table.keys.truncate(kept / bs);
        kept
    }

    fn take_ref(&mut self, b: u32) {
        let i = b as usize;
        if self.refcount[i] == 0 {
            self.lru.remove(&self.lru_tick[i]);
        }
        self.refcount[i] += 1;
    }

    fn drop_ref(&mut self, b: u32) {
        let i = b as usize;
        debug_assert!(self.refcount[i] > 0, "block {b} released twice");
        self.refcount[i] = self.refcount[i].saturating_sub(1);
        if self.refcount[i] > 0 {
            return;
        }
        if self.cached[i].is_some() {
            self.tick += 1;
            self.lru_tick[i] = self.tick;
            self.lru.insert(self.tick, b);
        } else {
            self.free.push(b);
        }
    }

    /// Takes the least recently used evictable block out of the prefix cache.
    fn evict_lru(&mut self) -> u32 {
        let (_, b) = self.lru.pop_first().expect("caller checked n_available");
        if let Some(c) = self.cached[b as usize].take() {
            self.by_key.remove(&c.key);
        }
        b
    }

    /// Checks every invariant against the tables that hold blocks (for tests): each block is
    /// in exactly one state, refcounts equal the number of table entries, the key map and
    /// the per-block entries agree.
    pub fn check(&self, tables: &[&BlockTable]) -> Result<(), String> {
        let n = self.n_blocks();
        let mut held = vec![0u32; n];
        for t in tables {
            for &b in &t.blocks {
                *held
                    .get_mut(b as usize)
                    .ok_or(format!("block {b} out of range"))? += 1;
            }
            if t.keys.len() > t.blocks.len() {
                return Err("more keys than blocks".into());
            }
        }
        let mut state = vec![0u8; n];
        for &b in &self.free {
            state[b as usize] += 1;
            if self.cached[b as usize].is_some() {
                return Err(format!("free block {b} still cached"));
            }
        }
        for (&tick, &b) in &self.lru {
            state[b as usize] += 1;
            if self.lru_tick[b as usize] != tick || self.cached[b as usize].is_none() {
                return Err(format!("evictable block {b} inconsistent"));
            }
        }
        for b in 0..n {
            if held[b] != self.refcount[b] {
                return Err(format!(
                    "block {b}: refcount {} but held by {} tables",
                    self.refcount[b], held[b]
                ));
            }
            let want = u8::from(self.refcount[b] == 0);
            if state[b] != want {
                return Err(format!(
                    "block {b}: refcount {} but in {} free/evictable lists",
                    self.refcount[b], state[b]
                ));
            }
            if let Some(c) = &self.cached[b]
                && self.by_key.get(&c.key) != Some(&(b as u32))
            {
                return Err(format!("block {b}: key not mapped back"));
            }
        }
        if self.by_key.len() != self.cached.iter().filter(|c| c.is_some()).count() {
            return Err("key map and cached blocks disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "kv_pool_tests.rs"]
mod tests;
