//! Token masks on the real vocabulary of the default model (SmolLM2-135M, 49k tokens): the trie
//! walk against a brute-force reference that checks every token's bytes on its own, for states
//! along JSON outputs; plus how long a mask takes.

use std::sync::Arc;
use std::time::Instant;

use damascus_grammar::{Grammar, Matcher, Vocab, json_object_grammar, schema_to_gbnf};
use damascus_tokenizer::{TokenType, Tokenizer};
use serde_json::json;

fn vocab() -> (Tokenizer, Vocab) {
    let path = damascus_hub::default_model_path().expect("default model");
    let file = damascus_gguf::GgufFile::open(&path).expect("gguf");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let bytes = (0..tok.n_vocab() as u32)
        .map(|id| match tok.token_type(id) {
            Some(TokenType::Control | TokenType::Unknown | TokenType::Unused) => None,
            _ => tok.token_bytes(id).map(<[u8]>::to_vec),
        })
        .collect();
    let v = Vocab::new(bytes, tok.eog_ids());
    (tok, v)
}

fn check_along(g: &str, text: &str, vocab: &Vocab, tok: &Tokenizer) -> Vec<f64> {
    let grammar = Arc::new(Grammar::parse(g).unwrap_or_else(|e| panic!("{e}\n{g}")));
    let mut m = Matcher::new(grammar);
    let ids = tok.encode(text, false, false);
    let mut times = Vec::new();
    for (step, &id) in ids.iter().enumerate() {
        let t0 = Instant::now();
        let mask = m.compute_mask(vocab);
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        if std::env::var("MASK_DEBUG").is_ok() {
            eprintln!(
                "{step} {:.3} ms stacks {} allowed {} after {:?}",
                times[times.len() - 1],
                m.n_stacks(),
                mask.count(),
                tok.decode(&ids[..step], false)
            );
        }
        for t in 0..vocab.n_tokens() as u32 {
            assert_eq!(
                mask.allows(t),
                m.allows_token(vocab, t),
                "step {step} token {t} {:?} after {:?}",
                tok.token_piece(t),
                tok.decode(&ids[..step], false)
            );
        }
        assert!(
            mask.allows(id),
            "step {step}: the text's own token {id} is refused"
        );
        m.advance_token(vocab, id).unwrap();
    }
    assert!(m.can_end());
    let eos = vocab.eog()[0];
    assert!(m.compute_mask(vocab).allows(eos));
    times
}

#[test]
fn mask_matches_brute_force_on_real_vocab() {
    let (tok, vocab) = vocab();
    assert_eq!(vocab.n_tokens(), tok.n_vocab());
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b c", "é"]}, "minItems": 1},
        },
        "required": ["name", "age", "tags"],
    });
    let g = schema_to_gbnf(&schema).unwrap();
    let text = r#"{"name": "Zoë \"Z\" \\ \u00e9 中文", "age": 42, "tags": ["b c", "é"]}"#;
    let mut times = check_along(&g, text, &vocab, &tok);
    times.extend(check_along(
        &json_object_grammar(),
        "{ \"x\": [1, -2.5e3, true, null, {\"y\": \"\"}] }",
        &vocab,
        &tok,
    ));
    times.sort_by(f64::total_cmp);
    eprintln!(
        "mask over {} tokens ({} trie nodes): median {:.3} ms, max {:.3} ms",
        vocab.n_tokens(),
        vocab.n_trie_nodes(),
        times[times.len() / 2],
        times[times.len() - 1]
    );
}

#[test]
fn eos_only_where_the_grammar_ends() {
    let (tok, vocab) = vocab();
    let g = Arc::new(Grammar::parse(r#"root ::= "ab" "c"?"#).unwrap());
    let mut m = Matcher::new(g);
    let eos = vocab.eog()[0];
    assert!(!m.compute_mask(&vocab).allows(eos));
    m.advance_bytes(b"ab").unwrap();
    let mask = m.compute_mask(&vocab);
    assert!(mask.allows(eos));
    let c = tok.encode("c", false, false);
    assert!(mask.allows(c[0]));
    m.advance_bytes(b"c").unwrap();
    let mask = m.compute_mask(&vocab);
    assert_eq!(mask.count(), vocab.eog().len(), "only the end may follow");
}
