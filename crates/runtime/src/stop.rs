//! User stop strings on streamed text, across token boundaries.
//!
//! Text arrives piece by piece (one detokenized token at a time, already UTF-8 safe). A stop
//! string may span several pieces, so [`StopMatcher`] holds back the longest tail of the text
//! that could still be the start of a stop string and releases everything before it. When a
//! stop string completes, the text before it is released and the rest is dropped.
//!
//! ```
//! use damascus_runtime::stop::StopMatcher;
//! let mut m = StopMatcher::new(["\nUser:"]);
//! let mut out = String::new();
//! for piece in ["Hi there", "\nUs", "er: more"] {
//!     let r = m.push(piece);
//!     out += &r.emit;
//!     if r.stopped() {
//!         break;
//!     }
//! }
//! assert_eq!(out, "Hi there");
//! assert_eq!(m.matched(), Some("\nUser:"));
//! ```

/// What [`StopMatcher::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopOutput {
    /// Text that is safe to show now.
    pub emit: String,
    /// Index (in the list given to [`StopMatcher::new`]) of the stop string that was hit by this
    /// push, if any.
    pub stop: Option<usize>,
}

impl StopOutput {
    /// True when this push completed a stop string.
    pub fn stopped(&self) -> bool {
        self.stop.is_some()
    }
}

/// Incremental matcher for a set of stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,     // as given; empty strings never match
    held: String,           // text not released yet: a possible stop-string prefix
    matched: Option<usize>, // index of the stop string hit, once stopped
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored.
    pub fn new<I, S>(stops: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            stops: stops.into_iter().map(Into::into).collect(),
            held: String::new(),
            matched: None,
        }
    }

    /// The stop strings.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// True once a stop string has been hit; later pushes release nothing.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that was hit, if any.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Text currently held back.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Feeds the next piece of text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.matched.is_some() {
            return StopOutput::default();
        }
        self.held.push_str(piece);

        // Earliest complete match wins; at the same position the longest stop string.
        let mut best: Option<(usize, usize)> = None; // (byte position, stop index)
        for (i, s) in self.stops.iter().enumerate() {
            if s.is_empty() {
                continue;
            }
            if let Some(pos) = self.held.find(s.as_str()) {
                let better = match best {
                    None => true,
                    Some((bp, bi)) => pos < bp || (pos == bp && s.len() > self.stops[bi].len()),
                };
                if better {
                    best = Some((pos, i));
                }
            }
        }
        if let Some((pos, i)) = best {
            let emit = self.held[..pos].to_string();
            self.held.clear();
            self.matched = Some(i);
            return StopOutput {
                emit,
                stop: Some(i),
            };
        }

        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutput { emit, stop: None }
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop string
    /// (always starts on a char boundary).
    fn partial_suffix_len(&self) -> usize {
        let h = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let s = s.as_bytes();
            let max_k = (s.len().saturating_sub(1)).min(h.len());
            for k in (best + 1..=max_k).rev() {
                if h[h.len() - k..] == s[..k] && self.held.is_char_boundary(h.len() - k) {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// End of generation without a stop: releases the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Clears state for a new generation (keeps the stop strings).
    pub fn reset(&mut self) {
        self.held.clear();
        self.matched = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds all pieces, returns (emitted text, stop index, held text after finish).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>, String) {
        let mut m = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        let mut stop = None;
        for p in pieces {
            let r = m.push(p);
            out += &r.emit;
            if r.stopped() {
                stop = r.stop;
                break;
            }
        }
        let rest = m.finish();
        (out, stop, rest)
    }

    #[test]
    fn no_stops_passes_through() {
        let (out, stop, rest) = run(&[], &["a", "bc", "é"]);
        assert_eq!((out.as_str(), stop, rest.as_str()), ("abcé", None, ""));
        let (out, _, _) = run(&[""], &["x", "y"]);
        assert_eq!(out, "xy");
    }

    #[test]
    fn stop_within_one_piece() {
        let (out, stop, rest) = run(&["END"], &["hello END world"]);
        assert_eq!((out.as_str(), stop, rest.as_str()), ("hello ", Some(0), ""));
    }

    #[test]
    fn stop_across_boundaries() {
        let (out, stop, _) = run(&["</s>"], &["abc<", "/", "s", ">tail"]);
        assert_eq!((out.as_str(), stop), ("abc", Some(0)));
        // Character by character.
        let text = "The answer is 42.\n\nQuestion: next";
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (out, stop, _) = run(&["\n\nQuestion:"], &refs);
        assert_eq!((out.as_str(), stop), ("The answer is 42.", Some(0)));
    }

    #[test]
    fn holds_back_only_possible_prefix() {
        let mut m = StopMatcher::new(["STOP"]);
        let r = m.push("abcST");
        assert_eq!(r.emit, "abc");
        assert_eq!(m.held(), "ST");
        let r = m.push("x");
        assert_eq!(r.emit, "STx");
        assert_eq!(m.held(), "");
        // A false start followed by a real one in the same piece.
        let r = m.push("SSTO");
        assert_eq!(r.emit, "S");
        assert_eq!(m.held(), "STO");
        let r = m.push("P!");
        assert!(r.stopped());
        assert_eq!(r.emit, "");
        assert_eq!(m.push("more"), StopOutput::default());
    }

    #[test]
    fn partial_match_flushed_at_end() {
        let (out, stop, rest) = run(&["<|end|>"], &["text <|e", "nd"]);
        assert_eq!(
            (out.as_str(), stop, rest.as_str()),
            ("text ", None, "<|end")
        );
    }

    #[test]
    fn earliest_then_longest_stop_wins() {
        let (out, stop, _) = run(&["world", "o w", "lo"], &["hello world"]);
        assert_eq!((out.as_str(), stop), ("hel", Some(2)));
        let (out, stop, _) = run(&["ab", "abc"], &["xxabcd"]);
        assert_eq!((out.as_str(), stop), ("xx", Some(1)));
    }

    #[test]
    fn multibyte_text() {
        let (out, stop, _) = run(&["à la fin"], &["voilà", " à l", "a fin!"]);
        assert_eq!((out.as_str(), stop), ("voilà ", Some(0)));
        let mut m = StopMatcher::new(["é!"]);
        assert_eq!(m.push("café").emit, "caf");
        assert_eq!(m.held(), "é");
        assert_eq!(m.finish(), "é");
        m.reset();
        assert!(!m.is_stopped());
    }

    #[test]
    fn random_splits_agree_with_whole_text() {
        // Splitting the same text anywhere must give the same released text.
        let text = "one two <stop> three";
        let stops = ["<stop>", "two <x"];
        let (whole, whole_stop, _) = run(&stops, &[text]);
        assert_eq!((whole.as_str(), whole_stop), ("one two ", Some(0)));
        let mut st = 99u64;
        for _ in 0..300 {
            let mut pieces = Vec::new();
            let mut i = 0;
            while i < text.len() {
                let n = 1 + (crate::sampler::splitmix64(&mut st) % 5) as usize;
                let j = (i + n).min(text.len());
                pieces.push(&text[i..j]);
                i = j;
            }
            let (out, stop, rest) = run(&stops, &pieces);
            assert_eq!(
                (out.as_str(), stop, rest.as_str()),
                ("one two ", Some(0), "")
            );
        }
    }
}
