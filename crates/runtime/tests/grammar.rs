//! The grammar constraint in the sampler chain, on the default model's vocabulary: the top-k
//! shortcut equals the full mask followed by top-k, and constrained generation (greedy and
//! sampled) gives output that the grammar accepts.

use std::sync::Arc;

use damascus_grammar::{Grammar, Matcher, schema_to_gbnf};
use damascus_model::{LoadOptions, Model};
use damascus_runtime::generate::{GenerateConfig, Generator};
use damascus_runtime::sampler::{
    Candidates, GrammarConstraint, SamplerChain, SamplerConfig, grammar_vocab,
};
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::Tokenizer;
use serde_json::json;

fn schema() -> String {
    schema_to_gbnf(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "n": {"type": "integer", "minimum": 1, "maximum": 9},
            "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "minItems": 1, "maxItems": 2},
        },
        "required": ["name", "n", "tags"],
    }))
    .unwrap()
}

#[test]
fn top_k_shortcut_equals_full_mask() {
    let path = damascus_hub::default_model_path().expect("default model");
    let file = damascus_gguf::GgufFile::open(&path).expect("gguf");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let vocab = Arc::new(grammar_vocab(&tok));
    let g = Arc::new(Grammar::parse(&schema()).unwrap());
    let text = r#"{"name": "ab", "n": 3, "tags": ["x"]}"#;
    let mut state = 12345u64;
    let mut gc = GrammarConstraint::new(Arc::clone(&g), Arc::clone(&vocab));
    let mut m = Matcher::new(g);
    for (step, &id) in tok.encode(text, false, false).iter().enumerate() {
        let logits: Vec<f32> = (0..tok.n_vocab())
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0
            })
            .collect();
        for k in [1, 5, 40] {
            let mut a = Candidates::from_logits(&logits);
            gc.apply_top_k(&mut a, k);
            let mut b = Candidates::from_logits(&logits);
            gc.apply(&mut b);
            b.sort();
            b.data.truncate(k);
            let ids = |c: &Candidates| c.data.iter().map(|d| d.id).collect::<Vec<_>>();
            assert_eq!(ids(&a), ids(&b), "step {step} k {k}");
        }
        gc.accept(id).unwrap();
        m.advance_token(&vocab, id).unwrap();
    }
    assert!(m.can_end());
}

#[test]
fn constrained_generation_is_valid() {
    let path = damascus_hub::default_model_path().expect("default model");
    let opts = LoadOptions {
        n_ctx: Some(256),
        ..Default::default()
    };
    let model = Model::load(&path, &opts).expect("load");
    let tok = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    let vocab = Arc::new(grammar_vocab(&tok));
    let g = Arc::new(Grammar::parse(&schema()).unwrap());
    let prompt = tok.encode("A JSON record:", true, false);
    for (temp, seed) in [(0.0, 0), (0.8, 1), (0.8, 2)] {
        let cfg = SamplerConfig {
            temp,
            seed: Some(seed),
            ..Default::default()
        };
        let mut sampler = SamplerChain::from_config(&cfg).unwrap();
        sampler.set_grammar(GrammarConstraint::new(Arc::clone(&g), Arc::clone(&vocab)));
        assert!(!sampler.is_plain_greedy());
        let mut seq = Sequence::new(model.session().unwrap());
        let gcfg = GenerateConfig {
            max_tokens: Some(120),
            ..Default::default()
        };
        let c = Generator::new(&mut seq, &tok, gcfg, sampler, &prompt)
            .run(|_| {})
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&c.text).unwrap_or_else(|e| panic!("{e}: {}", c.text));
        let n = v["n"].as_i64().unwrap();
        assert!((1..=9).contains(&n), "{}", c.text);
        assert!(v["name"].as_str().unwrap().chars().count() <= 12);
        let mut m = Matcher::new(Arc::clone(&g));
        m.advance_bytes(c.text.as_bytes()).unwrap();
        assert!(m.can_end(), "{}", c.text);
    }
}
