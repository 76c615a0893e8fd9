//! Hand-written pre-tokenizer splitters, exactly equivalent to the regexes they replace.
//!
//! Each regex is a leftmost-first alternation scanned left to right (as Oniguruma and Rust's
//! `regex` do for `Split(..., Isolated)`); every character is covered by some branch, so the
//! matches tile the text. The branches are tried in regex order at each position; the backtracking
//! behaviour of `\s*[\r\n]+` and `\s+(?!\S)` is reproduced by looking at the whole run of white
//! space starting at the position.

use crate::spec::PreTokenizer;
use crate::unicode::{Class, class};

impl PreTokenizer {
    /// Split text into pre-tokenizer words (for inspection and tests; encoding reuses buffers).
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        Splitter::default().split(self, text, &mut ranges);
        ranges.iter().map(|&(a, b)| &text[a..b]).collect()
    }
}

/// Reusable buffers for splitting (one per encode call).
#[derive(Default)]
pub(crate) struct Splitter {
    /// Characters of the current chunk with their classes. `[n_chars]`
    chars: Vec<(char, Class)>,
    /// Byte offset of each character in the chunk, plus the chunk length. `[n_chars + 1]`
    offs: Vec<usize>,
}

impl Splitter {
    /// Split `text` into words, pushing byte ranges `(start, end)` (relative to `text`) to `out`.
    pub(crate) fn split(&mut self, pre: PreTokenizer, text: &str, out: &mut Vec<(usize, usize)>) {
        match pre {
            PreTokenizer::None => {
                if !text.is_empty() {
                    out.push((0, text.len()));
                }
            }
            PreTokenizer::Gpt2 => {
                self.load(text);
                let (c, o) = (&self.chars, &self.offs);
                push_ranges(c, o, 0, c.len(), gpt2_next, out);
            }
            PreTokenizer::Llama3 => {
                self.load(text);
                let (c, o) = (&self.chars, &self.offs);
                push_ranges(c, o, 0, c.len(), |c, i| llama3_next(c, i, 3), out);
            }
            PreTokenizer::Qwen2 => {
                self.load(text);
                let (c, o) = (&self.chars, &self.offs);
                push_ranges(c, o, 0, c.len(), |c, i| llama3_next(c, i, 1), out);
            }
            PreTokenizer::Smollm => {
                // `Digits(individual_digits)` first: each \p{N} is its own word; the GPT-2
                // regex then runs on each stretch between digits independently.
                self.load(text);
                let (c, o) = (&self.chars, &self.offs);
                let mut seg = 0;
                for i in 0..c.len() {
                    if c[i].1 == Class::Number {
                        push_ranges(c, o, seg, i, gpt2_next, out);
                        out.push((o[i], o[i + 1]));
                        seg = i + 1;
                    }
                }
                push_ranges(c, o, seg, c.len(), gpt2_next, out);
            }
        }
    }

    fn load(&mut self, text: &str) {
        self.chars.clear();
        self.offs.clear();
        for (o, ch) in text.char_indices() {
            self.chars.push((ch, class(ch)));
            self.offs.push(o);
        }
        self.offs.push(text.len());
    }
}

/// Tile `chars[start..end]` with matches of `next` (which sees only that sub-slice, so a
/// lookahead at `end` behaves as end of text) and push their byte ranges.
fn push_ranges(
    chars: &[(char, Class)],
    offs: &[usize],
    start: usize,
    end: usize,
    next: impl Fn(&[(char, Class)], usize) -> usize,
    out: &mut Vec<(usize, usize)>,
) {
    let seg = &chars[start..end];
    let mut i = 0;
    while i < seg.len() {
        let j = next(seg, i).max(i + 1);
        out.push((offs[start + i], offs[start + j]));
        i = j;
    }
}

/// End of the run of characters of class `k` starting at `i`.
#[inline]
fn run(c: &[(char, Class)], mut i: usize, k: Class) -> usize {
    while i < c.len() && c[i].1 == k {
        i += 1;
    }
    i
}

#[inline]
fn class_at(c: &[(char, Class)], i: usize) -> Option<Class> {
    c.get(i).map(|x| x.1)
}

/// `'s|'t|'re|'ve|'m|'ll|'d`, optionally case-insensitive: the match end, if any.
#[inline]
fn contraction(c: &[(char, Class)], i: usize, ignore_case: bool) -> Option<usize> {
    if c[i].0 != '\'' {
        return None;
    }
    let fold = |k: usize| -> Option<char> {
        let ch = c.get(k)?.0;
        Some(if !ignore_case {
            ch
        } else if ch == '\u{17f}' {
            // LATIN SMALL LETTER LONG S case-folds to `s`.
            's'
        } else {
            ch.to_ascii_lowercase()
        })
    };
    let a = fold(i + 1)?;
    if matches!(a, 's' | 't' | 'm' | 'd') {
        return Some(i + 2);
    }
    let b = fold(i + 2)?;
    matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l')).then_some(i + 3)
}

/// The tail of both regexes for a white-space run at `i`: `\s+(?!\S)|\s+`.
#[inline]
fn space_tail(c: &[(char, Class)], i: usize) -> usize {
    let j = run(c, i, Class::Space);
    if j == c.len() || j - i < 2 { j } else { j - 1 }
}

/// One match of GPT-2's regex at `i`:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_next(c: &[(char, Class)], i: usize) -> usize {
    if let Some(e) = contraction(c, i, false) {
        return e;
    }
    let (ch, k) = c[i];
    // ` ?X+` for X in L, N, other: the optional space only counts before a run of X.
    let start = if ch == ' ' {
        match class_at(c, i + 1) {
            Some(n @ (Class::Letter | Class::Number | Class::Other)) => return run(c, i + 1, n),
            _ => i,
        }
    } else {
        i
    };
    match k {
        Class::Space => space_tail(c, start),
        _ => run(c, start, k),
    }
}

/// One match of Llama 3's regex at `i` (Qwen2's with `max_digits = 1`):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+`.
fn llama3_next(c: &[(char, Class)], i: usize, max_digits: usize) -> usize {
    if let Some(e) = contraction(c, i, true) {
        return e;
    }
    let (ch, k) = c[i];
    let next = class_at(c, i + 1);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if k == Class::Letter {
        return run(c, i, Class::Letter);
    }
    if ch != '\r' && ch != '\n' && k != Class::Number && next == Some(Class::Letter) {
        return run(c, i + 1, Class::Letter);
    }
    // \p{N}{1,3}
    if k == Class::Number {
        // Bounded scan: scanning the whole run each time would be quadratic in long digit runs.
        let end = c.len().min(i + max_digits);
        return (i..end).find(|&j| c[j].1 != Class::Number).unwrap_or(end);
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    let other_start = if k == Class::Other {
        Some(i)
    } else if ch == ' ' && next == Some(Class::Other) {
        Some(i + 1)
    } else {
        None
    };
    if let Some(s) = other_start {
        let mut j = run(c, s, Class::Other);
        while j < c.len() && matches!(c[j].0, '\r' | '\n') {
            j += 1;
        }
        return j;
    }
    // k is Space here. \s*[\r\n]+ : greedy, so it ends after the last CR/LF of the run.
    let j = run(c, i, Class::Space);
    if let Some(p) = (i..j).rev().find(|&p| matches!(c[p].0, '\r' | '\n')) {
        return p + 1;
    }
    space_tail(c, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        Splitter::default().split(pre, text, &mut out);
        out.iter().map(|&(a, b)| &text[a..b]).collect()
    }

    #[test]
    fn llama3_basic() {
        assert_eq!(
            words(PreTokenizer::Llama3, "Hello world's  12345 (x)\n\n  end  "),
            [
                "Hello", " world", "'s", " ", " ", "123", "45", " (", "x", ")\n\n", " ", " end",
                "  "
            ]
        );
        assert_eq!(words(PreTokenizer::Llama3, "a \n b"), ["a", " \n", " b"]);
        assert_eq!(words(PreTokenizer::Llama3, "I'M"), ["I", "'M"]);
        // U+017F case-folds to `s`, as in Oniguruma.
        assert_eq!(
            words(PreTokenizer::Llama3, "a'\u{17f}x 'S"),
            ["a", "'\u{17f}", "x", " '", "S"]
        );
    }

    #[test]
    fn gpt2_and_smollm() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "I'M x  12 ab"),
            ["I", "'", "M", " x", " ", " 12", " ab"]
        );
        assert_eq!(
            words(PreTokenizer::Smollm, "x 12a"),
            ["x", " ", "1", "2", "a"]
        );
    }
}
