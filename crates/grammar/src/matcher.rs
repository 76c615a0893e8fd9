//! The pushdown automaton: a set of stacks of grammar positions, advanced byte by byte.
//!
//! A stack is a linked list of nodes `(pos, parent)` in an arena: `pos` of the top node is the
//! [`Elem::Char`] to match next, every node below holds the position to return to when the rule
//! above it ends. Expanding a position pushes rule references until each branch reaches a
//! character (a reference that ends its alternative pushes no return node: tail calls keep
//! right-recursive repetitions flat). A branch that closes the root rule marks the state as able
//! to end.
//!
//! Bytes are decoded as UTF-8 on the way: the lead byte of a multi-byte character is kept as a
//! pending partial character whose range of possible code points must meet some top class.
//!
//! The live state keeps its nodes hash-consed (equal stacks have equal ids), so a state is
//! identified by its sorted list of top node ids; [`Matcher::mask`] caches token masks by it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::GrammarError;
use crate::gbnf::{Elem, Grammar};
use crate::vocab::{TokenMask, Vocab};

const NONE: u32 = u32::MAX;
/// Deepest chain of rule references expanded without consuming a character; deeper branches
/// are dropped (a grammar would need thousands of nested rules to reach it).
const MAX_EXPAND_DEPTH: usize = 2048;
/// Most masks kept per matcher.
const CACHE_CAP: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Node {
    pos: u32,    // index into the grammar's elements
    parent: u32, // node below, NONE at the bottom
}

/// A UTF-8 character being decoded: its bits so far and the continuation bytes still due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Partial {
    cp: u32,
    need: u8,
    min: u32, // smallest code point a sequence of this length may encode
}

impl Partial {
    fn range(&self) -> (u32, u32) {
        let shift = 6 * u32::from(self.need);
        let lo = self.cp << shift;
        (lo.max(self.min), (lo | ((1 << shift) - 1)).min(0x10FFFF))
    }
}

/// Where nodes are made: the interned arena of the live state, or a scratch area on top of it.
trait Store {
    fn get(&self, id: u32) -> Node;
    fn make(&mut self, n: Node) -> u32;
}

/// FxHash-style hasher for the node index (keys are two small integers).
#[derive(Debug, Default, Clone, Copy)]
struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxBuild = std::hash::BuildHasherDefault<FxHasher>;

#[derive(Debug, Default, Clone)]
struct Arena {
    nodes: Vec<Node>,
    index: HashMap<Node, u32, FxBuild>,
}

impl Store for Arena {
    fn get(&self, id: u32) -> Node {
        self.nodes[id as usize]
    }
    fn make(&mut self, n: Node) -> u32 {
        if let Some(&id) = self.index.get(&n) {
            return id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(n);
        self.index.insert(n, id);
        id
    }
}

const SCRATCH_SLOTS: usize = 4096;

/// Nodes made while trying bytes without committing them: ids from `base.nodes.len()` up live
/// in `extra`; a direct-mapped table merges most equal nodes.
struct Scratch<'a> {
    base: &'a Arena,
    extra: Vec<Node>,
    slots: Vec<u32>, // [SCRATCH_SLOTS] id of a recent node per hash slot
}

impl<'a> Scratch<'a> {
    fn new(base: &'a Arena) -> Self {
        Self {
            base,
            extra: Vec::new(),
            slots: vec![NONE; SCRATCH_SLOTS],
        }
    }
}

impl Store for Scratch<'_> {
    #[inline]
    fn get(&self, id: u32) -> Node {
        let n = self.base.nodes.len();
        if (id as usize) < n {
            self.base.nodes[id as usize]
        } else {
            self.extra[id as usize - n]
        }
    }
    #[inline]
    fn make(&mut self, n: Node) -> u32 {
        let h = (n.pos.wrapping_mul(0x9E37_79B9) ^ n.parent.wrapping_mul(0x85EB_CA6B)) as usize
            % SCRATCH_SLOTS;
        let s = self.slots[h];
        if s != NONE && self.get(s) == n {
            return s;
        }
        let id = (self.base.nodes.len() + self.extra.len()) as u32;
        self.extra.push(n);
        self.slots[h] = id;
        id
    }
}

/// Expands position `pos` over `parent` until every branch reaches a character; pushes the top
/// node ids to `out`. Returns whether some branch closed the root rule.
fn expand<S: Store>(g: &Grammar, st: &mut S, pos: u32, parent: u32, out: &mut Vec<u32>) -> bool {
    expand_at(g, st, pos, parent, out, 0)
}

fn expand_at<S: Store>(
    g: &Grammar,
    st: &mut S,
    mut pos: u32,
    mut parent: u32,
    out: &mut Vec<u32>,
    depth: usize,
) -> bool {
    loop {
        match g.elem(pos) {
            Elem::Char(_) => {
                out.push(st.make(Node { pos, parent }));
                return false;
            }
            Elem::End => {
                if parent == NONE {
                    return true;
                }
                let n = st.get(parent);
                pos = n.pos;
                parent = n.parent;
            }
            Elem::Ref(r) => {
                if depth >= MAX_EXPAND_DEPTH {
                    return false;
                }
                let ret = if g.elem(pos + 1) == Elem::End {
                    parent
                } else {
                    st.make(Node {
                        pos: pos + 1,
                        parent,
                    })
                };
                let mut acc = false;
                for &a in g.alternatives(r) {
                    acc |= expand_at(g, st, a, ret, out, depth + 1);
                }
                return acc;
            }
        }
    }
}

/// Sorts and dedups `buf[from..]`.
fn dedup_tail(buf: &mut Vec<u32>, from: usize) {
    let tail = &mut buf[from..];
    if tail.len() > 1 {
        tail.sort_unstable();
        let mut w = 1;
        for r in 1..tail.len() {
            if tail[r] != tail[w - 1] {
                tail[w] = tail[r];
                w += 1;
            }
        }
        buf.truncate(from + w);
    }
}

/// One byte against the stacks `buf[src]`; the new stacks are appended to `buf`. Returns the new
/// partial character and whether the state can end, or `None` when the byte is refused.
fn step_byte<S: Store>(
    g: &Grammar,
    st: &mut S,
    buf: &mut Vec<u32>,
    src: std::ops::Range<usize>,
    partial: Partial,
    b: u8,
) -> Option<(Partial, bool)> {
    let any_meets = |st: &S, buf: &Vec<u32>, p: &Partial| {
        let (lo, hi) = p.range();
        lo <= hi
            && buf[src.clone()]
                .iter()
                .any(|&s| match g.elem(st.get(s).pos) {
                    Elem::Char(c) => g.class(c).intersects(lo, hi),
                    _ => false,
                })
    };
    let cp = if partial.need == 0 {
        if b < 0x80 {
            u32::from(b)
        } else {
            let (need, bits, min) = match b {
                0xC2..=0xDF => (1, b & 0x1F, 0x80),
                0xE0..=0xEF => (2, b & 0x0F, 0x800),
                0xF0..=0xF4 => (3, b & 0x07, 0x10000),
                _ => return None,
            };
            let p = Partial {
                cp: u32::from(bits),
                need,
                min,
            };
            if !any_meets(st, buf, &p) {
                return None;
            }
            buf.extend_from_within(src);
            return Some((p, false));
        }
    } else {
        if b & 0xC0 != 0x80 {
            return None;
        }
        let p = Partial {
            cp: partial.cp << 6 | u32::from(b & 0x3F),
            need: partial.need - 1,
            min: partial.min,
        };
        if p.need > 0 {
            if !any_meets(st, buf, &p) {
                return None;
            }
            buf.extend_from_within(src);
            return Some((p, false));
        }
        if p.cp < p.min || (0xD800..=0xDFFF).contains(&p.cp) || p.cp > 0x10FFFF {
            return None;
        }
        p.cp
    };
    let from = buf.len();
    let mut acc = false;
    for k in src {
        let n = st.get(buf[k]);
        if let Elem::Char(c) = g.elem(n.pos)
            && g.class(c).contains(cp)
        {
            acc |= expand(g, st, n.pos + 1, n.parent, buf);
        }
    }
    dedup_tail(buf, from);
    (buf.len() > from || acc).then_some((Partial::default(), acc))
}

/// The matching state of one output: which continuations the grammar still allows.
#[derive(Debug, Clone)]
pub struct Matcher {
    grammar: Arc<Grammar>,
    arena: Arena,
    stacks: Vec<u32>, // sorted top node ids
    accepting: bool,
    partial: Partial,
    cache: HashMap<(Vec<u32>, Partial, bool, u64), Arc<TokenMask>>,
}

impl Matcher {
    /// The state at the start of the output.
    pub fn new(grammar: Arc<Grammar>) -> Self {
        let mut m = Self {
            grammar,
            arena: Arena::default(),
            stacks: Vec::new(),
            accepting: false,
            partial: Partial::default(),
            cache: HashMap::new(),
        };
        m.reset();
        m
    }

    /// Back to the start of the output (the mask cache is kept).
    pub fn reset(&mut self) {
        let g = Arc::clone(&self.grammar);
        self.arena = Arena::default();
        self.cache.clear();
        self.stacks.clear();
        let mut acc = false;
        for &a in g.alternatives(g.root()) {
            acc |= expand(&g, &mut self.arena, a, NONE, &mut self.stacks);
        }
        dedup_tail(&mut self.stacks, 0);
        self.accepting = acc;
        self.partial = Partial::default();
    }

    /// The grammar.
    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// Whether the output may end here (the root rule is complete, no partial character).
    pub fn can_end(&self) -> bool {
        self.accepting && self.partial.need == 0
    }

    /// Whether nothing more may follow (only the end is allowed).
    pub fn is_finished(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Number of live stacks (for diagnostics).
    pub fn n_stacks(&self) -> usize {
        self.stacks.len()
    }

    /// Whether `bytes` may follow the output so far (the empty string always may).
    pub fn accepts_bytes(&self, bytes: &[u8]) -> bool {
        let g = &*self.grammar;
        let mut st = Scratch::new(&self.arena);
        let mut buf = self.stacks.clone();
        let mut src = 0..buf.len();
        let mut partial = self.partial;
        for &b in bytes {
            if src.is_empty() {
                return false;
            }
            match step_byte(g, &mut st, &mut buf, src.clone(), partial, b) {
                Some((p, _)) => {
                    partial = p;
                    // Drop the old stacks so the buffer does not grow with the token.
                    buf.drain(..src.end);
                    src = 0..buf.len();
                }
                None => return false,
            }
        }
        true
    }

    /// Commits `bytes` to the output. On error the state is unchanged.
    pub fn advance_bytes(&mut self, bytes: &[u8]) -> Result<(), GrammarError> {
        let g = Arc::clone(&self.grammar);
        let mut buf = self.stacks.clone();
        let mut partial = self.partial;
        let mut acc = self.accepting;
        for (off, &b) in bytes.iter().enumerate() {
            let n = buf.len();
            match step_byte(&g, &mut self.arena, &mut buf, 0..n, partial, b) {
                Some((p, a)) if n > 0 => {
                    partial = p;
                    acc = a;
                    buf.drain(..n);
                }
                _ => return Err(GrammarError::Rejected { offset: off }),
            }
        }
        self.stacks = buf;
        self.partial = partial;
        self.accepting = acc;
        Ok(())
    }

    /// Whether token `id` of `vocab` may come next (end-of-generation tokens: where the output
    /// may end; control tokens: never).
    pub fn allows_token(&self, vocab: &Vocab, id: u32) -> bool {
        if vocab.is_eog(id) {
            return self.can_end();
        }
        match vocab.bytes(id) {
            Some(b) if !b.is_empty() => self.accepts_bytes(b),
            _ => false,
        }
    }

    /// Commits token `id` of `vocab` (an end-of-generation token commits nothing).
    pub fn advance_token(&mut self, vocab: &Vocab, id: u32) -> Result<(), GrammarError> {
        if vocab.is_eog(id) {
            return if self.can_end() {
                Ok(())
            } else {
                Err(GrammarError::Rejected { offset: 0 })
            };
        }
        match vocab.bytes(id) {
            Some(b) if !b.is_empty() => self.advance_bytes(b),
            _ => Err(GrammarError::Rejected { offset: 0 }),
        }
    }

    /// Every token of `vocab` that may come next, by one walk of the vocabulary trie against
    /// the stacks (subtrees whose prefix is refused are skipped). Cached per state.
    pub fn mask(&mut self, vocab: &Vocab) -> Arc<TokenMask> {
        let key = (
            self.stacks.clone(),
            self.partial,
            self.accepting,
            vocab.id(),
        );
        if let Some(m) = self.cache.get(&key) {
            return Arc::clone(m);
        }
        let m = Arc::new(self.compute_mask(vocab));
        if self.cache.len() >= CACHE_CAP {
            self.cache.clear();
        }
        self.cache.insert(key, Arc::clone(&m));
        m
    }

    /// [`Matcher::mask`] without the cache.
    pub fn compute_mask(&self, vocab: &Vocab) -> TokenMask {
        let g = &*self.grammar;
        let mut mask = TokenMask::new(vocab.n_tokens());
        if self.can_end() {
            for &e in vocab.eog() {
                mask.set(e);
            }
        }
        let trie = vocab.trie();
        let mut st = Scratch::new(&self.arena);
        // Per depth d (d = 0: the current state): stacks in buf[frame[d]..frame[d + 1]].
        let mut buf: Vec<u32> = self.stacks.clone();
        let mut frame: Vec<usize> = vec![0, buf.len()];
        let mut partial: Vec<Partial> = vec![self.partial];
        let mut i = 1; // node 0 is the root (empty prefix)
        while i < trie.len() {
            let node = trie.node(i);
            let d = node.depth as usize;
            buf.truncate(frame[d]);
            frame.truncate(d + 1);
            partial.truncate(d);
            let src = frame[d - 1]..frame[d];
            if src.is_empty() {
                i = node.end as usize;
                continue;
            }
            match step_byte(g, &mut st, &mut buf, src, partial[d - 1], node.byte) {
                None => i = node.end as usize,
                Some((p, _)) => {
                    for &t in trie.tokens(i) {
                        mask.set(t);
                    }
                    frame.push(buf.len());
                    partial.push(p);
                    i += 1;
                }
            }
        }
        mask
    }
}
