//! Character classes used by the pre-tokenizer regexes: `\p{L}`, `\p{N}`, `\s`, and the rest.
//!
//! `\s` is the Unicode `White_Space` property (what Oniguruma and Rust's `regex` use);
//! `\p{L}` / `\p{N}` are the general categories L* / N*. The four classes are disjoint.

use unicode_general_category::{GeneralCategory as Gc, get_general_category};

/// The class of one character, as the pre-tokenizer regexes see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `\p{L}`: a letter.
    Letter,
    /// `\p{N}`: a number (decimal, letter-like or other).
    Number,
    /// `\s`: white space.
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`): punctuation, symbols, marks, controls, emoji.
    Other,
}

/// ASCII classes, precomputed.
const ASCII: [Class; 128] = {
    let mut t = [Class::Other; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        t[i] = if b.is_ascii_alphabetic() {
            Class::Letter
        } else if b.is_ascii_digit() {
            Class::Number
        } else if matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ') {
            Class::Space
        } else {
            Class::Other
        };
        i += 1;
    }
    t
};

/// Unicode `White_Space` outside ASCII.
fn is_unicode_space(c: char) -> bool {
    matches!(
        c,
        '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// Classify one character.
#[inline]
pub fn class(c: char) -> Class {
    if c.is_ascii() {
        return ASCII[c as usize];
    }
    if is_unicode_space(c) {
        return Class::Space;
    }
    match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => Class::Letter,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => Class::Number,
        _ => Class::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class('a'), Class::Letter);
        assert_eq!(class('é'), Class::Letter);
        assert_eq!(class('中'), Class::Letter);
        assert_eq!(class('٣'), Class::Number);
        assert_eq!(class('½'), Class::Number);
        assert_eq!(class('\u{a0}'), Class::Space);
        assert_eq!(class('\u{3000}'), Class::Space);
        assert_eq!(class('\u{200b}'), Class::Other);
        assert_eq!(class('\u{301}'), Class::Other);
        assert_eq!(class('😀'), Class::Other);
        assert_eq!(class('\u{b}'), Class::Space);
    }
}
