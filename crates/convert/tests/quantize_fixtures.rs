//! `damascus quantize` versus llama.cpp's `llama-quantize`: the per-tensor types and sha256
//! hashes in `tests/fixtures/quantize/*.json` were produced by `tools/quant_compare.py` from
//! llama-quantize's output; our quantizer must reproduce them byte for byte.
//!
//! Inputs: the default SmolLM2-135M Q4_1 model (fetched and cached by damascus-hub) requantized
//! to Q4_K_M, and a synthetic F16 tiny-llama3 (seed 42, regenerated here) to several types.

use std::path::{Path, PathBuf};

use damascus_convert::{
    NoProgress, QuantizeOptions, Shape, SynthOptions, quantize_file, synth_model,
};
use damascus_gguf::GgufFile;
use damascus_quant::recipe::{Mix, RecipeOptions};
use sha2::{Digest, Sha256};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quantize")
}

/// `(name, type, sha256)` per tensor, in file order.
type Table = Vec<(String, String, String)>;

fn load_fixture(name: &str) -> (serde_json::Value, Table) {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let table = json["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["type"].as_str().unwrap().to_string(),
                t["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (json, table)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn table_of(path: &Path) -> Table {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .iter()
        .map(|t| {
            let h = Sha256::digest(f.tensor_data(t));
            (t.name.clone(), t.dtype.name().to_string(), hex(&h))
        })
        .collect()
}

fn assert_tables_equal(ours: &Table, theirs: &Table, what: &str) {
    let mut bad = Vec::new();
    for (a, b) in ours.iter().zip(theirs) {
        if a != b {
            bad.push(format!("  ours {a:?}\n  llama.cpp {b:?}"));
        }
    }
    assert_eq!(ours.len(), theirs.len(), "{what}: tensor count");
    assert!(
        bad.is_empty(),
        "{what}: {} tensors differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

fn threads() -> usize {
    damascus_convert::default_threads()
}

fn quantize(input: &Path, out: &Path, mix: Mix, allow_requantize: bool) {
    let opts = QuantizeOptions {
        mix,
        allow_requantize,
        threads: threads(),
        recipe: RecipeOptions::default(),
    };
    quantize_file(input, out, &opts, &NoProgress).unwrap();
}

#[test]
fn smollm2_q4_1_to_q4_k_m_matches_llama_quantize() {
    let (json, theirs) = load_fixture("smollm2-q4_1-to-Q4_K_M.json");
    let input = damascus_hub::default_model_path().expect("fetch the default model");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");

    // Without --allow-requantize this must be refused, and no output may appear.
    let opts = QuantizeOptions {
        mix: Mix::Q4_K_M,
        allow_requantize: false,
        threads: threads(),
        recipe: RecipeOptions::default(),
    };
    let err = quantize_file(&input, &out, &opts, &NoProgress).unwrap_err();
    assert!(err.to_string().contains("--allow-requantize"), "{err}");
    assert!(!out.exists());

    quantize(&input, &out, Mix::Q4_K_M, true);
    assert_tables_equal(&table_of(&out), &theirs, "SmolLM2 Q4_1 -> Q4_K_M");
    // The whole file (metadata, order, padding) is identical too.
    let file_hash = hex(&Sha256::digest(std::fs::read(&out).unwrap()));
    assert_eq!(file_hash, json["file_sha256"].as_str().unwrap());
    // Never overwrite the input.
    assert!(quantize_file(&input, &input, &opts, &NoProgress).is_err());
}

fn synth_tiny(dir: &Path, mix: Mix) -> PathBuf {
    let tokenizer = damascus_hub::llama3_tokenizer_json().expect("fetch the Llama 3.2 tokenizer");
    let out = dir.join(format!("tiny-{}.gguf", mix.name()));
    let opts = SynthOptions {
        shape: Shape::by_name("tiny-llama3").unwrap(),
        mix,
        seed: 42,
        tokenizer: &tokenizer,
        threads: threads(),
    };
    synth_model(&opts, &out, &NoProgress).unwrap();
    out
}

fn check_tiny(mixes: &[Mix]) {
    let dir = tempfile::tempdir().unwrap();
    let f16 = synth_tiny(dir.path(), Mix::F16);
    for &mix in mixes {
        let (_, theirs) = load_fixture(&format!("tiny-llama3-seed42-F16-to-{}.json", mix.name()));
        let out = dir.path().join(format!("q-{}.gguf", mix.name()));
        quantize(&f16, &out, mix, false);
        assert_tables_equal(&table_of(&out), &theirs, mix.name());
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn tiny_llama3_f16_matches_llama_quantize() {
    // Q4_K_M covers Q4_K and Q6_K (the tied embeddings), Q8_0 the legacy path.
    check_tiny(&[Mix::Q4_K_M, Mix::Q8_0]);
}

#[test]
#[ignore = "slow (~1 min): run with --ignored"]
fn tiny_llama3_f16_matches_llama_quantize_more_types() {
    check_tiny(&[Mix::Q5_K_M, Mix::Q4_0, Mix::Q6_K]);
}

#[test]
fn synth_quantizes_on_the_fly_like_f16_then_quantize() {
    // Weights are f16-exact, so synthesizing Q4_K_M directly equals F16 -> llama-quantize.
    let dir = tempfile::tempdir().unwrap();
    let direct = synth_tiny(dir.path(), Mix::Q4_K_M);
    let (_, theirs) = load_fixture("tiny-llama3-seed42-F16-to-Q4_K_M.json");
    let mut ours = table_of(&direct);
    // Synth writes tensors in converter order, llama-quantize in by-layer order.
    let order: Vec<&str> = theirs.iter().map(|t| t.0.as_str()).collect();
    ours.sort_by_key(|t| order.iter().position(|n| *n == t.0));
    assert_tables_equal(&ours, &theirs, "synth Q4_K_M");
}
