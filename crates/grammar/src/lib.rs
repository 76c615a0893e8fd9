//! Grammar-constrained decoding: which tokens may come next so that the output stays a valid
//! prefix of a language.
//!
//! - [`gbnf`]: the GBNF grammar format of llama.cpp (`root ::= ...`, alternation, groups,
//!   `*` `+` `?` `{m,n}`, character classes, string literals) parsed into a flat [`Grammar`].
//! - [`matcher`]: a pushdown automaton over Unicode characters fed with bytes: a set of stacks of
//!   grammar positions ([`Matcher`]), advanced byte by byte (UTF-8 decoded on the way).
//! - [`vocab`]: a byte trie of the vocabulary ([`Vocab`]); [`Matcher::mask`] walks it once per
//!   state to find every token that keeps the output valid, with a cache per state.
//! - [`schema`]: JSON schema → GBNF (objects, arrays, enums, strings, numbers, `anyOf`, `$ref`).
//!
//! ```
//! use damascus_grammar::{Grammar, Matcher};
//! use std::sync::Arc;
//! let g = Arc::new(Grammar::parse(r#"root ::= "yes" | "no""#)?);
//! let mut m = Matcher::new(g);
//! assert!(m.accepts_bytes(b"ye"));
//! m.advance_bytes(b"yes")?;
//! assert!(m.can_end() && m.is_finished());
//! # Ok::<(), damascus_grammar::GrammarError>(())
//! ```
#![forbid(unsafe_code)]

pub mod gbnf;
pub mod matcher;
pub mod schema;
pub mod vocab;

pub use gbnf::Grammar;
pub use matcher::Matcher;
pub use schema::{json_object_grammar, schema_to_gbnf};
pub use vocab::{TokenMask, Vocab};

/// Errors of the grammar crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The GBNF text does not parse.
    #[error("grammar parse error at line {line}, column {col}: {msg}")]
    Parse {
        /// 1-based line.
        line: usize,
        /// 1-based column (in characters).
        col: usize,
        /// What was wrong.
        msg: String,
    },
    /// A rule is used but never defined.
    #[error("grammar: rule '{0}' is used but not defined")]
    UndefinedRule(String),
    /// The grammar has no `root` rule.
    #[error("grammar: no 'root' rule (the start rule must be named root)")]
    NoRoot,
    /// A rule can reach itself without consuming a character (left recursion, or a repetition
    /// of something that can be empty); the automaton would loop forever.
    #[error(
        "grammar: rule '{0}' is left-recursive (it can reach itself without consuming a \
         character, e.g. `a ::= a \"x\"` or `(\"x\"?)*`)"
    )]
    LeftRecursion(String),
    /// The grammar is too large (repetition counts, rule count).
    #[error("grammar too large: {0}")]
    TooLarge(String),
    /// Bytes that the grammar does not allow.
    #[error("the text is not allowed by the grammar at byte {offset}")]
    Rejected {
        /// Offset of the first refused byte.
        offset: usize,
    },
    /// A JSON schema that cannot be turned into a grammar.
    #[error("json schema: {0}")]
    Schema(String),
    /// A JSON schema keyword that is not supported.
    #[error("json schema: keyword '{keyword}' at {path} is not supported")]
    UnsupportedKeyword {
        /// The keyword.
        keyword: String,
        /// JSON pointer-ish path of the schema node.
        path: String,
    },
}
