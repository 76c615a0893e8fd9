//! SentencePiece BPE against `sentencepiece` itself (fixture from tools/tokenizer_spm_fixture.py):
//! a small real model trained on a mixed-language corpus, stored as a llama-style GGUF.

use std::path::PathBuf;

use damascus_gguf::GgufFile;
use damascus_tokenizer::{ModelKind, Tokenizer};
use serde_json::Value as Json;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load() -> Tokenizer {
    let f = GgufFile::open(fixtures().join("spm_bpe.gguf")).unwrap();
    Tokenizer::from_gguf(&f).unwrap()
}

fn read_json(name: &str) -> Json {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn spm_matches_sentencepiece() {
    let tok = load();
    assert_eq!(tok.model_kind(), ModelKind::SentencePiece);
    let strings = read_json("corpus.json")["strings"]
        .as_array()
        .unwrap()
        .clone();
    let want = read_json("spm_ids.json");
    let mut failures = Vec::new();
    for (i, s) in strings.iter().enumerate() {
        let s = s.as_str().unwrap();
        let got = tok.encode(s, false, false);
        let exp = ids(&want["plain"][i]);
        if got != exp {
            failures.push(format!("[{i}] {s:?}\n  got  {got:?}\n  want {exp:?}"));
        }
        let back = tok.decode(&got, false).unwrap();
        if back != s {
            failures.push(format!("[{i}] round trip {s:?} -> {back:?}"));
        }
    }
    let first = strings[0].as_str().unwrap();
    assert_eq!(tok.encode(first, true, false), ids(&want["bos"]), "BOS");
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn spm_byte_fallback_and_specials() {
    let tok = load();
    // A character surely absent from the vocabulary falls back to <0xNN> bytes.
    let ids = tok.encode("\u{1F9EC}", false, false);
    assert_eq!(tok.token_text(ids[0]), Some("\u{2581}"), "dummy prefix");
    assert!(
        ids[1..]
            .iter()
            .all(|&i| tok.token_text(i).unwrap().starts_with("<0x")),
        "{ids:?}"
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), "\u{1F9EC}");
    // Control tokens are text unless special parsing is on; hidden when decoding by default.
    let bos = tok.bos().unwrap();
    assert!(!tok.encode("<s>hi", false, false).contains(&bos));
    let with = tok.encode("<s>hi", false, true);
    assert_eq!(with[0], bos);
    assert_eq!(tok.decode(&with, false).unwrap(), "hi");
    assert_eq!(tok.decode(&with, true).unwrap(), "<s>hi");
}

#[test]
fn spm_stream_continuation_keeps_leading_space() {
    let tok = load();
    // A generated "▁word" after a prompt is " word"; only a sequence start drops the prefix.
    let ids = tok.encode("hello", false, false);
    let mut cont = tok.stream_decoder(false);
    let text: String = ids.iter().map(|&i| cont.push(i).unwrap()).collect();
    assert_eq!(text, " hello");
    let mut start = damascus_tokenizer::StreamDecoder::from_start(&tok, false);
    let text: String = ids.iter().map(|&i| start.push(i).unwrap()).collect();
    assert_eq!(text, "hello");
}
