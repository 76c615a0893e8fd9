//! Splitting text around special-token strings (`<|eot_id|>`, `<|im_start|>`), leftmost-longest.

/// One piece of the input: raw text or a special token matched as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    /// Plain text to pre-tokenize and encode.
    Text(&'a str),
    /// A special token id.
    Token(u32),
}

/// The special tokens that may be matched in text, grouped by first byte.
#[derive(Default)]
pub(crate) struct SpecialMatcher {
    /// `first byte → [(text, id)]`, longest first. `[256]`
    by_first: Vec<Vec<(String, u32)>>,
}

impl SpecialMatcher {
    /// Build from `(text, id)` pairs; empty strings are ignored.
    pub(crate) fn new(specials: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut by_first: Vec<Vec<(String, u32)>> = vec![Vec::new(); 256];
        for (t, id) in specials {
            if let Some(&b) = t.as_bytes().first() {
                by_first[b as usize].push((t, id));
            }
        }
        for v in &mut by_first {
            // Longest first; equal strings keep the lowest id.
            v.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }
        Self { by_first }
    }

    /// Whether no special token can ever match.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_first.iter().all(Vec::is_empty)
    }

    /// Split `text` into fragments, pushing them to `out`.
    pub(crate) fn split<'a>(&self, text: &'a str, out: &mut Vec<Fragment<'a>>) {
        let bytes = text.as_bytes();
        let mut last = 0;
        let mut i = 0;
        while i < bytes.len() {
            let cands = &self.by_first[bytes[i] as usize];
            let hit = cands
                .iter()
                .find(|(t, _)| bytes[i..].starts_with(t.as_bytes()));
            match hit {
                // Token strings are valid UTF-8 and start at a char boundary (their first byte
                // matched and text is UTF-8), so slicing at i and i + len is safe.
                Some((t, id)) if text.is_char_boundary(i) => {
                    if last < i {
                        out.push(Fragment::Text(&text[last..i]));
                    }
                    out.push(Fragment::Token(*id));
                    i += t.len();
                    last = i;
                }
                _ => i += 1,
            }
        }
        if last < bytes.len() {
            out.push(Fragment::Text(&text[last..]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_match_wins() {
        let m = SpecialMatcher::new([("<|a|>".to_string(), 1), ("<|a|><|b|>".to_string(), 2)]);
        let mut out = Vec::new();
        m.split("x<|a|><|b|>y<|a|>", &mut out);
        assert_eq!(
            out,
            [
                Fragment::Text("x"),
                Fragment::Token(2),
                Fragment::Text("y"),
                Fragment::Token(1)
            ]
        );
    }
}
