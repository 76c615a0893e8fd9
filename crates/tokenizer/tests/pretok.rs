//! The hand-written GPT-2 and Qwen2 splitters against `tokenizers`' regex `Split` on the corpus
//! (fixture from tools/tokenizer_fixtures.py). Llama 3 and SmolLM are covered end to end by the
//! id fixtures in oracle.rs.

use std::path::PathBuf;

use damascus_tokenizer::PreTokenizer;
use serde_json::Value as Json;

fn fixture(name: &str) -> Json {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn splits_match_hf_regex() {
    let corpus = fixture("corpus.json");
    let splits = fixture("pretok_splits.json");
    for (name, pre) in [("gpt2", PreTokenizer::Gpt2), ("qwen2", PreTokenizer::Qwen2)] {
        for (i, s) in corpus["strings"].as_array().unwrap().iter().enumerate() {
            let s = s.as_str().unwrap();
            let want: Vec<&str> = splits[name][i]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap())
                .collect();
            assert_eq!(pre.split(s), want, "{name} [{i}] {s:?}");
        }
    }
}
