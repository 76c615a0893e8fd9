//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): GPT-2's byte↔unicode alphabet and ranked
//! merges applied with a priority queue over a linked list of symbols (O(n log n) per word, no
//! rescans), with a per-word cache.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Mutex;

use crate::error::{Result, TokenizerError};
use crate::fxhash::FxBuild;

/// GPT-2's byte → unicode alphabet: printable Latin-1 bytes map to themselves, the other 68
/// bytes to U+0100.. in byte order, so every byte has a visible, non-space character.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let cp = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(cp).unwrap_or('\0');
    }
    table
}

/// `UNICODE_TO_BYTE[cp]` = the byte mapped to code point `cp` (< 0x144), or -1.
const UNICODE_TO_BYTE: [i16; 0x144] = {
    let mut t = [-1i16; 0x144];
    let mut extra = 0usize;
    let mut b = 0usize;
    while b < 256 {
        let printable =
            (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        if printable {
            t[b] = b as i16;
        } else {
            t[0x100 + extra] = b as i16;
            extra += 1;
        }
        b += 1;
    }
    t
};

/// The inverse of [`byte_to_char`]: `None` for characters outside the alphabet.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match UNICODE_TO_BYTE.get(c as usize) {
        Some(&b) if b >= 0 => Some(b as u8),
        _ => None,
    }
}

/// Longer words are not cached (they are rare and would bloat the cache).
const MAX_CACHED_WORD: usize = 256;

/// Most words seen so far; cleared when full so memory stays bounded.
const CACHE_CAP: usize = 1 << 16;

/// A compiled byte-level BPE model.
pub(crate) struct BytePairModel {
    /// Token id of each single byte (`u32::MAX` if the vocabulary lacks it). `[256]`
    byte_tok: [u32; 256],
    /// `(left id, right id)` packed as `left << 32 | right` → `(rank, merged id)`.
    merges: HashMap<u64, (u32, u32), FxBuild>,
    /// Token string (byte-level alphabet) → id, for `ignore_merges`.
    vocab: HashMap<String, u32, FxBuild>,
    /// A word that is itself a token skips merging.
    ignore_merges: bool,
    /// Byte alphabet. `[256]`
    alphabet: [char; 256],
    /// Word bytes → token ids.
    cache: Mutex<WordCache>,
}

/// Word bytes → token ids.
type WordCache = HashMap<Box<[u8]>, Box<[u32]>, FxBuild>;

/// One symbol of the word being merged: a node of a doubly linked list.
#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NIL: u32 = u32::MAX;

/// Scratch buffers reused across words.
#[derive(Default)]
pub(crate) struct BpeScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

impl BytePairModel {
    /// Compile from the token strings and `"left right"` merges.
    pub(crate) fn new(tokens: &[String], merges: &[String], ignore_merges: bool) -> Result<Self> {
        let mut vocab: HashMap<String, u32, FxBuild> =
            HashMap::with_capacity_and_hasher(tokens.len(), FxBuild::default());
        for (i, t) in tokens.iter().enumerate() {
            // First id wins for duplicate strings (as in HF and llama.cpp).
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        let alphabet = byte_to_char();
        let mut byte_tok = [u32::MAX; 256];
        for (b, c) in alphabet.iter().enumerate() {
            if let Some(&id) = vocab.get(c.to_string().as_str()) {
                byte_tok[b] = id;
            }
        }
        let mut merge_map: HashMap<u64, (u32, u32), FxBuild> = HashMap::default();
        merge_map.reserve(merges.len());
        let mut joined = String::new();
        for (rank, rule) in merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index: rank,
                rule: rule.clone(),
                reason,
            };
            // Split at the first space after the first character (a token may start with ' ').
            let first_len = rule.chars().next().map_or(0, char::len_utf8);
            let sp = rule[first_len..]
                .find(' ')
                .map(|p| p + first_len)
                .ok_or_else(|| bad("no space"))?;
            let (l, r) = (&rule[..sp], &rule[sp + 1..]);
            let lid = *vocab
                .get(l)
                .ok_or_else(|| bad("left side not in vocabulary"))?;
            let rid = *vocab
                .get(r)
                .ok_or_else(|| bad("right side not in vocabulary"))?;
            joined.clear();
            joined.push_str(l);
            joined.push_str(r);
            let Some(&mid) = vocab.get(joined.as_str()) else {
                return Err(bad("merged token not in vocabulary"));
            };
            merge_map
                .entry(u64::from(lid) << 32 | u64::from(rid))
                .or_insert((rank as u32, mid));
        }
        Ok(Self {
            byte_tok,
            merges: merge_map,
            vocab,
            ignore_merges,
            alphabet,
            cache: Mutex::new(HashMap::default()),
        })
    }

    /// The token of a single byte, if the vocabulary has it.
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        Some(self.byte_tok[b as usize]).filter(|&id| id != NIL)
    }

    /// Encode one pre-tokenized word (raw bytes), appending token ids to `out`.
    pub(crate) fn encode_word(&self, word: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        if word.len() == 1 {
            let id = self.byte_tok[word[0] as usize];
            if id != NIL {
                out.push(id);
            }
            return;
        }
        let cacheable = word.len() <= MAX_CACHED_WORD;
        if cacheable
            && let Ok(cache) = self.cache.lock()
            && let Some(ids) = cache.get(word)
        {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.encode_uncached(word, scratch, out);
        if !cacheable {
            return;
        }
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_CAP {
                cache.clear();
            }
            cache.insert(word.into(), out[start..].into());
        }
    }

    fn encode_uncached(&self, word: &[u8], scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        if self.ignore_merges {
            let mapped: String = word.iter().map(|&b| self.alphabet[b as usize]).collect();
            if let Some(&id) = self.vocab.get(&mapped) {
                out.push(id);
                return;
            }
        }
        let syms = &mut scratch.syms;
        syms.clear();
        for &b in word {
            let id = self.byte_tok[b as usize];
            if id == NIL {
                // A byte the vocabulary cannot express is dropped (as HF does without `unk`).
                continue;
            }
            let n = syms.len() as u32;
            syms.push(Sym {
                id,
                prev: if n == 0 { NIL } else { n - 1 },
                next: n + 1,
                alive: true,
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NIL;
        }
        let heap = &mut scratch.heap;
        heap.clear();
        for i in 0..syms.len().saturating_sub(1) {
            if let Some(&(rank, _)) = self.merges.get(&pair(syms[i].id, syms[i + 1].id)) {
                heap.push(Reverse((rank, i as u32)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let left = syms[pos as usize];
            if !left.alive || left.next == NIL {
                continue;
            }
            let right = syms[left.next as usize];
            // Stale entry: the pair at `pos` changed since it was queued.
            let Some(&(r, merged)) = self.merges.get(&pair(left.id, right.id)) else {
                continue;
            };
            if r != rank {
                continue;
            }
            syms[pos as usize].id = merged;
            syms[pos as usize].next = right.next;
            syms[left.next as usize].alive = false;
            if right.next != NIL {
                syms[right.next as usize].prev = pos;
                let nn = syms[right.next as usize].id;
                if let Some(&(r2, _)) = self.merges.get(&pair(merged, nn)) {
                    heap.push(Reverse((r2, pos)));
                }
            }
            if left.prev != NIL {
                let p = syms[left.prev as usize].id;
                if let Some(&(r2, _)) = self.merges.get(&pair(p, merged)) {
                    heap.push(Reverse((r2, left.prev)));
                }
            }
        }
        out.extend(syms.iter().filter(|s| s.alive).map(|s| s.id));
    }
}

#[inline]
fn pair(a: u32, b: u32) -> u64 {
    u64::from(a) << 32 | u64::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_round_trips() {
        let t = byte_to_char();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }
}
