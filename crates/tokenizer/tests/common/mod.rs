//! Fixture helpers shared by the tokenizer's integration tests.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value as Json;

/// `tests/fixtures/<name>` parsed as JSON.
pub fn fixture(name: &str) -> Json {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap()
}

/// The strings of `corpus.json`.
pub fn corpus() -> Vec<String> {
    fixture("corpus.json")["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
