//! The issue-25 family fixtures (tests/fixtures/families, made by tools/hf_family_fixtures.py
//! and tools/hf_gemma_oracle.py) are well formed: every tiny GGUF opens, declares what its
//! Hugging Face model ran with (layers, width, windows, soft-cap, rope bases), and its forward
//! and greedy oracles parse and agree with it. The forward comparisons live elsewhere.

use std::path::{Path, PathBuf};

use damascus_gguf::{GgufFile, Value};
use damascus_model::verify::Fixture;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families")
}

fn json(name: &str) -> serde_json::Value {
    let path = dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().expect("an id"))
        .collect()
}

/// (family, general.architecture, layers, sliding window declared in the GGUF)
const FAMILIES: [(&str, &str, usize, Option<u32>); 5] = [
    ("qwen2", "qwen2", 3, None),
    ("qwen3", "qwen3", 3, None),
    ("phi3", "phi3", 3, Some(16)),
    // The converter writes Mistral as llama with no window key (HF ran with window 4096, which
    // these prompts never reach).
    ("mistral", "llama", 3, None),
    ("gemma3", "gemma3", 8, Some(8)),
];

fn n_vocab(file: &GgufFile) -> usize {
    match file.metadata().get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a.len(),
        other => panic!("tokenizer.ggml.tokens: {other:?}"),
    }
}

#[test]
fn family_ggufs_open_and_declare_their_shape() {
    for (family, arch, n_layer, window) in FAMILIES {
        let path = dir().join(format!("{family}.gguf"));
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let md = file.metadata();
        assert_eq!(file.architecture().unwrap(), Some(arch), "{family}");
        assert_eq!(
            md.get_u32(&format!("{arch}.block_count")).unwrap(),
            Some(n_layer as u32),
            "{family}"
        );
        assert_eq!(
            md.get_u32(&format!("{arch}.embedding_length")).unwrap(),
            Some(64),
            "{family}"
        );
        assert_eq!(
            md.get_u32(&format!("{arch}.attention.sliding_window"))
                .unwrap(),
            window,
            "{family}"
        );
        for t in file.tensors() {
            assert_eq!(
                file.tensor_data(t).len() as u64,
                t.n_bytes(),
                "{family} {}",
                t.name
            );
        }
        assert!(file.tensor("blk.0.attn_norm.weight").is_some(), "{family}");
    }
}

#[test]
fn gemma3_declares_its_gemma_settings() {
    let file = GgufFile::open(dir().join("gemma3.gguf")).unwrap();
    let md = file.metadata();
    assert_eq!(
        md.get_f32("gemma3.final_logit_softcapping").unwrap(),
        Some(10.0)
    );
    assert_eq!(
        md.get_f32("gemma3.rope.freq_base").unwrap(),
        Some(1_000_000.0)
    );
    assert_eq!(
        md.get_f32("gemma3.rope.freq_base_swa").unwrap(),
        Some(10_000.0)
    );
    assert_eq!(md.get_u32("gemma3.attention.key_length").unwrap(), Some(32));
    // No pattern key: llama.cpp's default (every 6th layer global) is what HF ran.
    assert!(!md.contains_key("gemma3.attention.sliding_window_pattern"));
    assert!(file.tensor("blk.0.post_attention_norm.weight").is_some());
    assert!(file.tensor("blk.0.attn_q_norm.weight").is_some());
    let greedy = json("gemma3-greedy.json");
    let layer_types = greedy["hf_config"]["layer_types"].as_array().unwrap();
    let global: Vec<usize> = layer_types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.as_str() == Some("full_attention"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(global, vec![5]);
}

#[test]
fn fused_and_biased_tensors_are_where_the_families_put_them() {
    let phi3 = GgufFile::open(dir().join("phi3.gguf")).unwrap();
    let qkv = phi3
        .tensor("blk.0.attn_qkv.weight")
        .expect("phi3 fused qkv");
    assert_eq!(qkv.n_elements(), 64 * (64 + 2 * 2 * 16));
    let up = phi3
        .tensor("blk.0.ffn_up.weight")
        .expect("phi3 fused gate+up");
    assert_eq!(up.n_elements(), 64 * 2 * 128);
    let qwen2 = GgufFile::open(dir().join("qwen2.gguf")).unwrap();
    for b in ["attn_q.bias", "attn_k.bias", "attn_v.bias"] {
        assert!(qwen2.tensor(&format!("blk.0.{b}")).is_some(), "qwen2 {b}");
    }
    let qwen3 = GgufFile::open(dir().join("qwen3.gguf")).unwrap();
    assert!(qwen3.tensor("blk.0.attn_q_norm.weight").is_some());
    assert_eq!(
        qwen3
            .metadata()
            .get_u32("qwen3.attention.key_length")
            .unwrap(),
        Some(64)
    );
    assert_eq!(
        qwen3.metadata().get_str("tokenizer.ggml.pre").unwrap(),
        Some("smollm")
    );
}

#[test]
fn family_oracles_parse_and_match_their_ggufs() {
    for (family, _, n_layer, _) in FAMILIES {
        let file = GgufFile::open(dir().join(format!("{family}.gguf"))).unwrap();
        let vocab = n_vocab(&file);
        for i in 0..2 {
            let fx = Fixture::load(dir().join(format!("{family}-{i}.json")))
                .unwrap_or_else(|e| panic!("{family}-{i}: {e}"));
            let m = &fx.meta;
            assert_eq!(m.model_file, format!("{family}.gguf"));
            assert_eq!(
                (m.n_layer, m.n_embd, m.n_vocab),
                (n_layer, 64, vocab),
                "{family}"
            );
            assert_eq!(
                m.positions.len(),
                m.ids.len(),
                "{family}: every position stored"
            );
            assert!(fx.hidden.iter().all(|x| x.is_finite()), "{family}");
            assert!(m.top_logits.windows(2).all(|w| w[0] >= w[1]), "{family}");
            assert!(m.top_logits[0] <= m.logits_lse, "{family}");
        }
        let long = Fixture::load(dir().join(format!("{family}-1.json"))).unwrap();
        assert_eq!(long.meta.ids.len(), 40, "{family}");

        let greedy = json(&format!("{family}-greedy.json"));
        assert_eq!(greedy["model_file"], format!("{family}.gguf"));
        let cases = greedy["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 2);
        for case in cases {
            let new = ids(&case["ids"]);
            assert_eq!(new.len(), 32, "{family}");
            assert!(new.iter().all(|&t| (t as usize) < vocab), "{family}");
            assert!(case["min_top2_margin"].as_f64().unwrap() > 0.01, "{family}");
        }
    }
}

#[test]
fn gemma3_270m_oracle_parses() {
    let doc = json("gemma3-270m-oracle.json");
    let cases = doc["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        let prompt_ids = ids(&case["ids"]);
        assert_eq!(prompt_ids[0], 2, "BOS first");
        let top = case["top"].as_array().unwrap();
        assert_eq!(top.len(), 10);
        let probs: Vec<f64> = top.iter().map(|p| p[1].as_f64().unwrap()).collect();
        assert!(probs.windows(2).all(|w| w[0] >= w[1]));
        assert!(probs.iter().sum::<f64>() <= 1.0 + 1e-9);
        let greedy = ids(&case["greedy_ids"]);
        assert!(!greedy.is_empty() && greedy.len() <= 16);
        assert!(greedy.iter().chain(&prompt_ids).all(|&t| t < 262_144));
    }
    let first = &cases[0];
    assert_eq!(first["prompt"], "The capital of France is");
    let fx = Fixture::load(dir().join("gemma3-270m-0.json")).unwrap();
    assert_eq!((fx.meta.n_layer, fx.meta.n_embd), (18, 640));
    assert_eq!(
        fx.meta.ids,
        ids(&first["ids"])
            .iter()
            .map(|&t| t as u32)
            .collect::<Vec<_>>()
    );
    assert!(fx.hidden.iter().all(|x| x.is_finite()));
}
