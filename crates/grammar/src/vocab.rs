//! The vocabulary as a byte trie, for walking every token against a grammar state at once, and
//! the token mask the walk produces.

use std::sync::atomic::{AtomicU64, Ordering};

/// One trie node, stored in depth-first preorder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrieNode {
    pub(crate) byte: u8,   // the edge into this node
    pub(crate) depth: u32, // prefix length
    pub(crate) end: u32,   // index one past this node's subtree
    tok_start: u32,        // tokens ending here: tokens[tok_start..tok_end]
    tok_end: u32,
}

/// A byte trie of the token strings, nodes in preorder so a refused prefix skips its subtree.
#[derive(Debug, Clone)]
pub(crate) struct Trie {
    nodes: Vec<TrieNode>, // [n_nodes], nodes[0] = root (empty prefix)
    tokens: Vec<u32>,     // [n_tokens in trie] ids grouped by node
}

impl Trie {
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }
    pub(crate) fn node(&self, i: usize) -> TrieNode {
        self.nodes[i]
    }
    pub(crate) fn tokens(&self, i: usize) -> &[u32] {
        let n = &self.nodes[i];
        &self.tokens[n.tok_start as usize..n.tok_end as usize]
    }
}

/// The tokens a grammar may emit: their bytes, the end-of-generation ids, and the trie.
#[derive(Debug, Clone)]
pub struct Vocab {
    id: u64,
    bytes: Vec<Option<Box<[u8]>>>, // [n_vocab] None = never emitted under a grammar (control)
    eog: Vec<u32>,                 // sorted
    trie: Trie,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Vocab {
    /// Builds the trie. `bytes[id]` is what token `id` prints, or `None` for tokens a grammar
    /// never allows (control tokens); `eog` are the end-of-generation ids (allowed exactly
    /// where the grammar can end).
    pub fn new(bytes: Vec<Option<Vec<u8>>>, eog: &[u32]) -> Self {
        let bytes: Vec<Option<Box<[u8]>>> = bytes
            .into_iter()
            .map(|b| b.filter(|b| !b.is_empty()).map(Vec::into_boxed_slice))
            .collect();
        let mut eog: Vec<u32> = eog.to_vec();
        eog.sort_unstable();
        eog.dedup();
        let mut order: Vec<u32> = (0..bytes.len() as u32)
            .filter(|&i| bytes[i as usize].is_some() && eog.binary_search(&i).is_err())
            .collect();
        order.sort_by(|&a, &b| bytes[a as usize].cmp(&bytes[b as usize]));
        let mut nodes = vec![TrieNode {
            byte: 0,
            depth: 0,
            end: 0,
            tok_start: 0,
            tok_end: 0,
        }];
        let mut tokens = Vec::with_capacity(order.len());
        // path[d] = index of the node for the first d bytes of the current token.
        let mut path: Vec<usize> = vec![0];
        let mut prev: &[u8] = &[];
        for &id in &order {
            let b = bytes[id as usize].as_deref().unwrap_or(&[]);
            let common = prev.iter().zip(b).take_while(|(x, y)| x == y).count();
            // Close nodes deeper than the common prefix.
            for &n in &path[common + 1..] {
                nodes[n].end = nodes.len() as u32;
            }
            path.truncate(common + 1);
            for (d, &byte) in b.iter().enumerate().skip(common) {
                let t = tokens.len() as u32;
                nodes.push(TrieNode {
                    byte,
                    depth: d as u32 + 1,
                    end: 0,
                    tok_start: t,
                    tok_end: t,
                });
                path.push(nodes.len() - 1);
            }
            let last = *path.last().unwrap_or(&0);
            // Equal strings (duplicate tokens) share a node; ids of one node are contiguous
            // because the order is sorted by bytes.
            if nodes[last].tok_end as usize != tokens.len() {
                nodes[last].tok_start = tokens.len() as u32;
            }
            tokens.push(id);
            nodes[last].tok_end = tokens.len() as u32;
            prev = b;
        }
        let n = nodes.len() as u32;
        for &p in &path {
            nodes[p].end = n;
        }
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            bytes,
            eog,
            trie: Trie { nodes, tokens },
        }
    }

    /// A process-unique id (masks are cached per vocabulary).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Vocabulary size.
    pub fn n_tokens(&self) -> usize {
        self.bytes.len()
    }

    /// The bytes of token `id` (`None` for control tokens and out-of-range ids).
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).and_then(|b| b.as_deref())
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// End-of-generation ids, sorted.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Number of trie nodes (for diagnostics).
    pub fn n_trie_nodes(&self) -> usize {
        self.trie.len()
    }

    pub(crate) fn trie(&self) -> &Trie {
        &self.trie
    }
}

/// A bit per vocabulary token: may it come next?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    bits: Vec<u64>, // [ceil(n_vocab / 64)]
    n: usize,
}

impl TokenMask {
    /// All tokens refused.
    pub fn new(n: usize) -> Self {
        Self {
            bits: vec![0; n.div_ceil(64)],
            n,
        }
    }

    /// Allows token `id`.
    #[inline]
    pub fn set(&mut self, id: u32) {
        if (id as usize) < self.n {
            self.bits[id as usize / 64] |= 1 << (id % 64);
        }
    }

    /// Whether token `id` is allowed.
    #[inline]
    pub fn allows(&self, id: u32) -> bool {
        (id as usize) < self.n && self.bits[id as usize / 64] >> (id % 64) & 1 == 1
    }

    /// Number of allowed tokens.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Vocabulary size.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}
