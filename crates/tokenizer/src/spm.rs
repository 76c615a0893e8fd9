//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`): spaces become `▁`, adjacent pieces
//! merge highest score first while the merged piece is in the vocabulary, and pieces left outside
//! the vocabulary fall back to `<0xNN>` byte tokens (or `<unk>`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasher, Hasher};

use crate::fxhash::FxBuild;
use crate::spec::TokenType;

/// SentencePiece's word-boundary marker, U+2581.
pub(crate) const SPACE_MARK: char = '\u{2581}';

/// A compiled SentencePiece BPE model.
///
/// The piece index borrows nothing and copies no strings (a 262k vocabulary builds in a few
/// milliseconds): it maps the 64-bit hash of a piece to its id, and a lookup confirms the text
/// against the tokenizer's token strings. A piece whose hash equals another piece's goes to the
/// (practically always empty) `collide` map.
pub(crate) struct SentencePieceModel {
    /// Hash of a mergeable piece → (id, score). Unused/control/byte tokens are excluded.
    index: HashMap<u64, (u32, f32), FxBuild>,
    /// Mergeable pieces whose hash collides with an earlier, different piece.
    collide: HashMap<String, (u32, f32), FxBuild>,
    /// Id of each `<0xNN>` byte token (`u32::MAX` if absent). `[256]`
    byte_tok: [u32; 256],
    /// Fallback for bytes without a byte token.
    unk: Option<u32>,
}

/// A symbol: byte range `[start, end)` of the normalized text, in a linked list.
#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
}

const NIL: u32 = u32::MAX;

/// A queued merge candidate: higher score first, then leftmost.
struct Cand {
    score: f32,
    left: u32,
    /// Byte length of the merged piece when queued (detects stale entries).
    len: u32,
}

impl PartialEq for Cand {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Cand {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

impl SentencePieceModel {
    /// Compile from token strings, scores and types.
    pub(crate) fn new(
        tokens: &[String],
        scores: &[f32],
        types: &[TokenType],
        unk: Option<u32>,
    ) -> Self {
        let mut index: HashMap<u64, (u32, f32), FxBuild> =
            HashMap::with_capacity_and_hasher(tokens.len(), FxBuild::default());
        let mut collide: HashMap<String, (u32, f32), FxBuild> = HashMap::default();
        let mut byte_tok = [u32::MAX; 256];
        for (i, t) in tokens.iter().enumerate() {
            let ty = types.get(i).copied().unwrap_or_default();
            let score = scores.get(i).copied().unwrap_or(0.0);
            match ty {
                TokenType::Byte => {
                    if let Some(b) = parse_byte_token(t) {
                        byte_tok[b as usize] = i as u32;
                    }
                }
                TokenType::Normal | TokenType::UserDefined | TokenType::Undefined => {
                    match index.entry(hash_piece(t)) {
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert((i as u32, score));
                        }
                        // The same text again: the first id wins.
                        std::collections::hash_map::Entry::Occupied(o)
                            if tokens[o.get().0 as usize] == *t => {}
                        std::collections::hash_map::Entry::Occupied(_) => {
                            collide.entry(t.clone()).or_insert((i as u32, score));
                        }
                    }
                }
                TokenType::Control | TokenType::Unknown | TokenType::Unused => {}
            }
        }
        Self {
            index,
            collide,
            byte_tok,
            unk,
        }
    }

    /// The id and score of a mergeable piece. `tokens`: the vocabulary this model was built from.
    #[inline]
    fn lookup(&self, tokens: &[String], piece: &str) -> Option<(u32, f32)> {
        match self.index.get(&hash_piece(piece)) {
            Some(&(id, score)) if tokens[id as usize] == piece => Some((id, score)),
            _ if self.collide.is_empty() => None,
            _ => self.collide.get(piece).copied(),
        }
    }

    /// The `<0xNN>` token of a byte, if present.
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        Some(self.byte_tok[b as usize]).filter(|&id| id != NIL)
    }

    /// Encode one text fragment. `text` is raw; spaces are mapped to `▁` here and `prefix` adds
    /// the dummy `▁` in front. `tokens`: the vocabulary this model was built from.
    pub(crate) fn encode(&self, tokens: &[String], text: &str, prefix: bool, out: &mut Vec<u32>) {
        let mut norm = String::with_capacity(text.len() + 3);
        if prefix {
            norm.push(SPACE_MARK);
        }
        for ch in text.chars() {
            norm.push(if ch == ' ' { SPACE_MARK } else { ch });
        }
        if norm.is_empty() {
            return;
        }
        // [n_chars] symbols, one per character to start with.
        let mut syms: Vec<Sym> = Vec::with_capacity(norm.len());
        for (o, ch) in norm.char_indices() {
            let n = syms.len() as u32;
            syms.push(Sym {
                start: o as u32,
                end: (o + ch.len_utf8()) as u32,
                prev: if n == 0 { NIL } else { n - 1 },
                next: n + 1,
            });
        }
        if let Some(l) = syms.last_mut() {
            l.next = NIL;
        }
        let mut heap = BinaryHeap::new();
        for i in 0..syms.len().saturating_sub(1) {
            self.push_cand(tokens, &norm, &syms, i as u32, &mut heap);
        }
        while let Some(c) = heap.pop() {
            let l = syms[c.left as usize];
            if l.end == l.start || l.next == NIL {
                continue;
            }
            let r = syms[l.next as usize];
            if r.end - l.start != c.len {
                continue;
            }
            syms[c.left as usize].end = r.end;
            syms[c.left as usize].next = r.next;
            syms[l.next as usize].end = r.start; // now empty: dead
            if r.next != NIL {
                syms[r.next as usize].prev = c.left;
                self.push_cand(tokens, &norm, &syms, c.left, &mut heap);
            }
            if l.prev != NIL {
                self.push_cand(tokens, &norm, &syms, l.prev, &mut heap);
            }
        }
        let mut i = 0u32;
        while i != NIL && (i as usize) < syms.len() {
            let s = syms[i as usize];
            let piece = &norm[s.start as usize..s.end as usize];
            match self.lookup(tokens, piece) {
                Some((id, _)) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        let id = self.byte_tok[b as usize];
                        if id != NIL {
                            out.push(id);
                        } else if let Some(u) = self.unk {
                            out.push(u);
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    fn push_cand(
        &self,
        tokens: &[String],
        norm: &str,
        syms: &[Sym],
        left: u32,
        heap: &mut BinaryHeap<Cand>,
    ) {
        let l = syms[left as usize];
        let r = syms[l.next as usize];
        if let Some((_, score)) = self.lookup(tokens, &norm[l.start as usize..r.end as usize]) {
            heap.push(Cand {
                score,
                left,
                len: r.end - l.start,
            });
        }
    }
}

/// The index key of a piece: FxHash of the bytes, then a full-avalanche finalizer
/// (splitmix64's). Fx alone leaves the low bits depending only on the first bytes of short
/// pieces, which the table uses for bucket choice: pieces with a common prefix then pile up in
/// one probe chain (a 262k vocabulary took ~170 ms to index instead of ~10 ms).
#[inline]
fn hash_piece(piece: &str) -> u64 {
    let mut h = FxBuild::default().build_hasher();
    h.write(piece.as_bytes());
    let mut z = h.finish() ^ piece.len() as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Parse `<0xNN>` into its byte.
pub(crate) fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
