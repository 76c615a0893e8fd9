//! Token-for-token comparison with Hugging Face (fixtures from `tools/tokenizer_fixtures.py`),
//! round trips, and chat-template renders.
//!
//! The vocabularies come from the real files: SmolLM2's GGUF and Llama 3.2's `tokenizer.json`
//! (found via damascus-hub, env vars, or /tmp/dev). A test whose file cannot be found prints why
//! and passes without checking.

use std::path::PathBuf;

use damascus_gguf::GgufFile;
use damascus_tokenizer::{ChatTemplate, Tokenizer, TokenizerSpec};
use serde_json::Value as Json;

mod common;

use common::{corpus, fixture, ids};

/// First existing path among an env var, a hub lookup and a dev fallback.
fn find(env: &str, hub: impl FnOnce() -> Option<PathBuf>, dev: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Some(PathBuf::from(p));
    }
    let dev = PathBuf::from(dev);
    if dev.exists() {
        return Some(dev);
    }
    hub()
}

fn smollm2() -> Option<Tokenizer> {
    let path = find(
        "DAMASCUS_SMOLLM2",
        || damascus_hub::default_model_path().ok(),
        "/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf",
    );
    let Some(path) = path else {
        eprintln!("SKIP: SmolLM2 GGUF not found (set DAMASCUS_SMOLLM2)");
        return None;
    };
    let f = GgufFile::open(&path).unwrap();
    Some(Tokenizer::from_gguf(&f).unwrap())
}

fn llama3() -> Option<Tokenizer> {
    let path = find(
        "DAMASCUS_LLAMA3_TOKENIZER",
        || damascus_hub::llama3_tokenizer_json().ok(),
        "/tmp/dev/tokenizer.json",
    );
    let Some(path) = path else {
        eprintln!("SKIP: Llama 3.2 tokenizer.json not found (set DAMASCUS_LLAMA3_TOKENIZER)");
        return None;
    };
    let json = std::fs::read_to_string(path).unwrap();
    Some(Tokenizer::from_spec(TokenizerSpec::from_hf_json(&json, None).unwrap()).unwrap())
}

fn check_against(tok: &Tokenizer, expected: &Json, name: &str) {
    let strings = corpus();
    let mut failures = Vec::new();
    for (i, s) in strings.iter().enumerate() {
        let got_special = tok.encode(s, false, true);
        let got_plain = tok.encode(s, false, false);
        let want_special = ids(&expected["special"][i]);
        let want_plain = ids(&expected["plain"][i]);
        if got_special != want_special {
            failures.push(format!(
                "[{i}] special {s:?}\n  got  {got_special:?}\n  want {want_special:?}"
            ));
        }
        if got_plain != want_plain {
            failures.push(format!(
                "[{i}] plain {s:?}\n  got  {got_plain:?}\n  want {want_plain:?}"
            ));
        }
        let back = tok.decode_bytes(&got_plain, true).unwrap();
        if back != s.as_bytes() {
            failures.push(format!(
                "[{i}] round trip {s:?} -> {:?}",
                String::from_utf8_lossy(&back)
            ));
        }
    }
    assert_eq!(
        tok.encode(&strings[0], true, false),
        ids(&expected["bos"]),
        "{name}: BOS handling"
    );
    assert!(
        failures.is_empty(),
        "{name}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_transformers() {
    if let Some(tok) = smollm2() {
        check_against(&tok, &fixture("smollm2_ids.json"), "smollm2");
    }
}

#[test]
fn llama3_matches_tokenizers() {
    if let Some(tok) = llama3() {
        check_against(&tok, &fixture("llama3_ids.json"), "llama3");
    }
}

#[test]
fn chat_templates_match_transformers() {
    let fx = fixture("templates.json");
    let llama_src = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/llama3.2_chat_template.jinja"),
    )
    .unwrap();
    let smol_src = smollm2().and_then(|t| t.chat_template().map(String::from));
    let mut n = 0;
    for case in fx["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let src = match name {
            "llama3.2" => llama_src.clone(),
            _ => match &smol_src {
                Some(s) => s.clone(),
                None => continue,
            },
        };
        let toks = &fx[name];
        let t = ChatTemplate::new(
            src,
            toks["bos_token"].as_str().unwrap(),
            toks["eos_token"].as_str().unwrap(),
        );
        let extra = case["extra"].as_object();
        let got = t
            .render(
                &case["messages"],
                case["add_generation_prompt"].as_bool().unwrap(),
                extra,
            )
            .unwrap();
        assert_eq!(
            got,
            case["expected"].as_str().unwrap(),
            "{name}: {}",
            case["messages"]
        );
        n += 1;
    }
    assert!(n >= 12, "only {n} template cases ran");
}

/// Llama 3.2's vocabulary embedded in a GGUF by our own writer (llama.cpp's key layout), read back
/// through `Tokenizer::from_gguf`: the GGUF path must give the same ids as `tokenizers`.
#[test]
fn llama3_gguf_roundtrip_matches_tokenizers() {
    use damascus_gguf::{Array, GgufWriter, Value, keys};
    let Some(path) = find(
        "DAMASCUS_LLAMA3_TOKENIZER",
        || damascus_hub::llama3_tokenizer_json().ok(),
        "/tmp/dev/tokenizer.json",
    ) else {
        eprintln!("SKIP: Llama 3.2 tokenizer.json not found");
        return;
    };
    let spec = TokenizerSpec::from_hf_json(&std::fs::read_to_string(path).unwrap(), None).unwrap();
    let mut w = GgufWriter::new();
    let mut add = |k: &str, v: Value| w.add_metadata(k, v).unwrap();
    add(keys::GENERAL_ARCHITECTURE, Value::String("llama".into()));
    add(keys::TOKENIZER_MODEL, Value::String("gpt2".into()));
    add(keys::TOKENIZER_PRE, Value::String("llama-bpe".into()));
    add(
        keys::TOKENIZER_TOKENS,
        Value::Array(Array::String(spec.tokens.clone())),
    );
    let types = spec.token_types.iter().map(|t| t.id()).collect();
    add(keys::TOKENIZER_TOKEN_TYPE, Value::Array(Array::I32(types)));
    add(
        keys::TOKENIZER_MERGES,
        Value::Array(Array::String(spec.merges.clone())),
    );
    add(keys::TOKENIZER_BOS_ID, Value::U32(spec.bos.unwrap()));
    add(keys::TOKENIZER_ADD_BOS, Value::Bool(true));
    let mut bytes = Vec::new();
    w.write(&mut bytes, |_, _| Ok(())).unwrap();
    let tok = Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
    check_against(&tok, &fixture("llama3_ids.json"), "llama3 via GgufWriter");
}

/// The same vocabulary through the GGUF path (`tools/tokenizer_llama3_gguf.py`; not committed,
/// several MB): `from_gguf` must agree with `tokenizers` too.
#[test]
fn llama3_gguf_matches_tokenizers() {
    let path = std::env::var("DAMASCUS_LLAMA3_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/tmp/llama3_tokenizer.gguf"));
    if !path.exists() {
        eprintln!(
            "SKIP: {} not found (run tools/tokenizer_llama3_gguf.py)",
            path.display()
        );
        return;
    }
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    check_against(&tok, &fixture("llama3_ids.json"), "llama3 gguf");
    assert_eq!(tok.token_text(tok.eos().unwrap()), Some("<|end_of_text|>"));
    // No eot key in the file: found by its text.
    assert_eq!(tok.token_text(tok.eot().unwrap()), Some("<|eot_id|>"));
    assert!(tok.is_eog(tok.eos().unwrap()) && tok.is_eog(tok.eot().unwrap()));
    assert!(ChatTemplate::from_tokenizer(&tok).is_ok());
}
