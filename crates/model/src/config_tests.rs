//! Tests of [`ModelConfig`] on in-memory GGUF files built with [`GgufWriter`].

use damascus_gguf::keys::{self, tensors as tn};
use damascus_gguf::{Array, GgmlType, GgufFile, GgufWriter, Metadata, Value};

use super::*;

/// A tiny llama: 2 layers, hidden 8, 2 heads / 1 kv head (head_dim 4), ffn 16, vocab 10.
struct Tiny {
    md: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>)>,
}

fn llama(suffix: &str) -> String {
    keys::llm("llama", suffix)
}

impl Tiny {
    fn new() -> Tiny {
        let md = vec![
            (
                keys::GENERAL_ARCHITECTURE.to_string(),
                Value::String("llama".into()),
            ),
            (keys::GENERAL_FILE_TYPE.to_string(), Value::U32(0)),
            (llama(keys::BLOCK_COUNT), Value::U32(2)),
            (llama(keys::EMBEDDING_LENGTH), Value::U32(8)),
            (llama(keys::FEED_FORWARD_LENGTH), Value::U32(16)),
            (llama(keys::ATTENTION_HEAD_COUNT), Value::U32(2)),
            (llama(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(1)),
            (llama(keys::CONTEXT_LENGTH), Value::U32(64)),
            (llama(keys::ATTENTION_LAYERNORM_RMS_EPS), Value::F32(1e-5)),
            (
                keys::TOKENIZER_TOKENS.to_string(),
                Value::Array(Array::String((0..10).map(|i| format!("t{i}")).collect())),
            ),
        ];
        let mut tensors = vec![
            (tn::TOKEN_EMBD.to_string(), vec![8, 10]),
            (tn::OUTPUT_NORM.to_string(), vec![8]),
        ];
        for l in 0..2 {
            for (s, d) in [
                (tn::ATTN_NORM, vec![8]),
                (tn::ATTN_Q, vec![8, 8]),
                (tn::ATTN_K, vec![8, 4]),
                (tn::ATTN_V, vec![8, 4]),
                (tn::ATTN_OUTPUT, vec![8, 8]),
                (tn::FFN_NORM, vec![8]),
                (tn::FFN_GATE, vec![8, 16]),
                (tn::FFN_UP, vec![8, 16]),
                (tn::FFN_DOWN, vec![16, 8]),
            ] {
                tensors.push((tn::blk(l, s), d));
            }
        }
        Tiny { md, tensors }
    }

    fn set(mut self, key: &str, v: Value) -> Tiny {
        self.md.retain(|(k, _)| k != key);
        self.md.push((key.to_string(), v));
        self
    }

    fn without_key(mut self, key: &str) -> Tiny {
        self.md.retain(|(k, _)| k != key);
        self
    }

    fn tensor(mut self, name: &str, dims: Vec<u64>) -> Tiny {
        self.tensors.retain(|(n, _)| n != name);
        self.tensors.push((name.to_string(), dims));
        self
    }

    fn without_tensor(mut self, name: &str) -> Tiny {
        self.tensors.retain(|(n, _)| n != name);
        self
    }

    fn build(&self) -> GgufFile {
        let mut w = GgufWriter::new();
        for (k, v) in &self.md {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
        for (n, d) in &self.tensors {
            w.add_tensor(n.clone(), d.clone(), GgmlType::F32).unwrap();
        }
        let sizes: Vec<u64> = w.layout().unwrap().iter().map(|t| t.n_bytes()).collect();
        let mut bytes = Vec::new();
        w.write(&mut bytes, |i, buf| {
            buf.resize(sizes[i] as usize, 0);
            Ok(())
        })
        .unwrap();
        GgufFile::from_bytes(bytes).unwrap()
    }

    fn config(&self) -> Result<ModelConfig, ModelError> {
        let f = self.build();
        let c = ModelConfig::from_gguf(&f)?;
        c.check_tensors(&f)?;
        Ok(c)
    }
}

fn err_text(r: Result<ModelConfig, ModelError>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn tiny_llama_reads_and_checks() {
    let c = Tiny::new().config().unwrap();
    assert_eq!(c.arch, "llama");
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv),
        (2, 8, 16, 2, 1)
    );
    assert_eq!((c.head_dim, c.head_dim_v, c.rope_dim), (4, 4, 4));
    assert_eq!(c.n_vocab, 10, "vocab from the token list");
    assert_eq!(c.n_ctx_train, 64);
    assert_eq!(c.rope_theta, DEFAULT_ROPE_THETA);
    assert_eq!(c.rms_eps, 1e-5);
    assert!(c.tied_embeddings && !c.has_rope_freqs && c.rope_scaling.is_none() && c.is_gqa());
    assert_eq!(c.file_type, Some(FileType::ALL_F32));
}

#[test]
fn output_rope_freqs_and_vocab_key_are_detected() {
    let c = Tiny::new()
        .tensor(tn::OUTPUT, vec![8, 12])
        .tensor(tn::TOKEN_EMBD, vec![8, 12])
        .tensor(tn::ROPE_FREQS, vec![2])
        .set(&llama(keys::VOCAB_SIZE), Value::U32(12))
        .set(&llama(keys::ROPE_FREQ_BASE), Value::F32(500_000.0))
        .config()
        .unwrap();
    assert!(!c.tied_embeddings && c.has_rope_freqs);
    assert_eq!(c.n_vocab, 12, "vocab_size wins over the token list");
    assert_eq!(c.rope_theta, 500_000.0);
}

#[test]
fn bad_shapes_name_tensor_expected_and_found() {
    let e = err_text(
        Tiny::new()
            .tensor(&tn::blk(1, tn::ATTN_K), vec![8, 8])
            .config(),
    );
    assert!(
        e.contains("blk.1.attn_k.weight") && e.contains("[8, 4]") && e.contains("[8, 8]"),
        "{e}"
    );
    let e = err_text(Tiny::new().tensor(tn::TOKEN_EMBD, vec![8, 11]).config());
    assert!(
        e.contains("token_embd.weight") && e.contains("[8, 10]"),
        "{e}"
    );
    let e = err_text(
        Tiny::new()
            .tensor(&tn::blk(0, tn::FFN_DOWN), vec![8, 16])
            .config(),
    );
    assert!(
        e.contains("blk.0.ffn_down.weight") && e.contains("[16, 8]"),
        "{e}"
    );
    let e = err_text(Tiny::new().tensor(tn::ROPE_FREQS, vec![4]).config());
    assert!(e.contains("rope_freqs.weight") && e.contains("[2]"), "{e}");
    // A trailing 1 is tolerated on 1-D tensors.
    Tiny::new()
        .tensor(tn::OUTPUT_NORM, vec![8, 1])
        .config()
        .unwrap();
}

#[test]
fn missing_and_extra_tensors() {
    let e = err_text(Tiny::new().without_tensor(&tn::blk(1, tn::FFN_UP)).config());
    assert!(
        e.contains("blk.1.ffn_up.weight") && e.contains("missing"),
        "{e}"
    );
    let e = err_text(Tiny::new().without_tensor(tn::TOKEN_EMBD).config());
    assert!(e.contains("token_embd.weight"), "{e}");
    let e = err_text(
        Tiny::new()
            .tensor(&tn::blk(2, tn::ATTN_NORM), vec![8])
            .config(),
    );
    assert!(
        e.contains("blk.2.attn_norm.weight") && e.contains("2 layers"),
        "{e}"
    );
}

#[test]
fn missing_and_bad_keys() {
    for suffix in [
        keys::BLOCK_COUNT,
        keys::EMBEDDING_LENGTH,
        keys::FEED_FORWARD_LENGTH,
        keys::ATTENTION_HEAD_COUNT,
        keys::CONTEXT_LENGTH,
        keys::ATTENTION_LAYERNORM_RMS_EPS,
    ] {
        let e = err_text(Tiny::new().without_key(&llama(suffix)).config());
        assert!(e.contains(&llama(suffix)) && e.contains("missing"), "{e}");
    }
    let e = err_text(Tiny::new().without_key(keys::GENERAL_ARCHITECTURE).config());
    assert!(e.contains(keys::GENERAL_ARCHITECTURE), "{e}");
    let e = err_text(Tiny::new().without_key(keys::TOKENIZER_TOKENS).config());
    assert!(e.contains(&llama(keys::VOCAB_SIZE)), "{e}");
    let e = err_text(
        Tiny::new()
            .set(&llama(keys::BLOCK_COUNT), Value::String("two".into()))
            .config(),
    );
    assert!(e.contains(&llama(keys::BLOCK_COUNT)), "{e}");
    let e = err_text(
        Tiny::new()
            .set(&llama(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(3))
            .config(),
    );
    assert!(e.contains("not a multiple"), "{e}");
    let e = err_text(
        Tiny::new()
            .set(&llama(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(0))
            .config(),
    );
    assert!(e.contains("must be positive"), "{e}");
    let e = err_text(
        Tiny::new()
            .set(&llama(keys::ROPE_DIMENSION_COUNT), Value::U32(6))
            .config(),
    );
    assert!(e.contains(&llama(keys::ROPE_DIMENSION_COUNT)), "{e}");
    let e = err_text(
        Tiny::new()
            .set(
                &llama(keys::ATTENTION_LAYERNORM_RMS_EPS),
                Value::F32(f32::NAN),
            )
            .config(),
    );
    assert!(e.contains("positive finite"), "{e}");
    let e = err_text(
        Tiny::new()
            .set(keys::GENERAL_ARCHITECTURE, Value::String("gpt2".into()))
            .config(),
    );
    assert!(e.contains("gpt2") && e.contains("unsupported"), "{e}");
}

#[test]
fn key_length_overrides_the_default_head_size() {
    // head_dim 8 with 2 heads over hidden 8: q is [8, 16], k/v [8, 8], o [16, 8].
    let mut t = Tiny::new().set(&llama(keys::ATTENTION_KEY_LENGTH), Value::U32(8));
    for l in 0..2 {
        t = t
            .tensor(&tn::blk(l, tn::ATTN_Q), vec![8, 16])
            .tensor(&tn::blk(l, tn::ATTN_K), vec![8, 8])
            .tensor(&tn::blk(l, tn::ATTN_V), vec![8, 8])
            .tensor(&tn::blk(l, tn::ATTN_OUTPUT), vec![16, 8]);
    }
    let c = t.config().unwrap();
    assert_eq!((c.head_dim, c.head_dim_v, c.rope_dim), (8, 8, 8));
}

#[test]
fn rope_scaling_keys() {
    let c = Tiny::new()
        .set(
            &llama(keys::ROPE_SCALING_TYPE),
            Value::String("yarn".into()),
        )
        .set(&llama(keys::ROPE_SCALING_FACTOR), Value::F32(4.0))
        .set(&llama(keys::ROPE_SCALING_ORIG_CTX_LEN), Value::U32(32))
        .set(&llama(keys::ROPE_SCALING_ATTN_FACTOR), Value::F32(0.5))
        .config()
        .unwrap();
    let s = c.rope_scaling.unwrap();
    assert_eq!(
        (s.kind, s.factor, s.original_ctx, s.attn_factor),
        (RopeScalingKind::Yarn, 4.0, Some(32), Some(0.5))
    );
    let c = Tiny::new()
        .set(
            &llama(keys::ROPE_SCALING_TYPE),
            Value::String("none".into()),
        )
        .config()
        .unwrap();
    assert!(c.rope_scaling.is_none());
    let c = Tiny::new()
        .set(&llama(keys::ROPE_SCALE_LINEAR), Value::F32(2.0))
        .config()
        .unwrap();
    assert_eq!(
        c.rope_scaling.map(|s| (s.kind, s.factor)),
        Some((RopeScalingKind::Linear, 2.0))
    );
    let e = err_text(
        Tiny::new()
            .set(
                &llama(keys::ROPE_SCALING_TYPE),
                Value::String("linear".into()),
            )
            .set(&llama(keys::ROPE_SCALING_FACTOR), Value::F32(-1.0))
            .config(),
    );
    assert!(e.contains(&llama(keys::ROPE_SCALING_FACTOR)), "{e}");
}

/// Llama 3.2 3B metadata as llama.cpp's converter writes it. A full file is ~2 GB even in
/// Q4_K, so this checks the metadata path and the expected shapes only; the end-to-end
/// check on a real-sized file belongs to the model synthesizer's tests.
#[test]
fn llama32_3b_metadata() {
    let mut md = Metadata::new();
    let mut set = |k: String, v: Value| md.set(k, v);
    set(
        keys::GENERAL_ARCHITECTURE.into(),
        Value::String("llama".into()),
    );
    set(keys::GENERAL_FILE_TYPE.into(), Value::U32(15));
    set(llama(keys::BLOCK_COUNT), Value::U32(28));
    set(llama(keys::CONTEXT_LENGTH), Value::U32(131_072));
    set(llama(keys::EMBEDDING_LENGTH), Value::U32(3072));
    set(llama(keys::FEED_FORWARD_LENGTH), Value::U32(8192));
    set(llama(keys::ATTENTION_HEAD_COUNT), Value::U32(24));
    set(llama(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(8));
    set(llama(keys::ROPE_FREQ_BASE), Value::F32(500_000.0));
    set(llama(keys::ATTENTION_LAYERNORM_RMS_EPS), Value::F32(1e-5));
    set(llama(keys::ATTENTION_KEY_LENGTH), Value::U32(128));
    set(llama(keys::ATTENTION_VALUE_LENGTH), Value::U32(128));
    set(llama(keys::VOCAB_SIZE), Value::U32(128_256));
    set(llama(keys::ROPE_DIMENSION_COUNT), Value::U32(128));
    let c =
        ModelConfig::from_metadata(&md, |n| n == tn::ROPE_FREQS || n == tn::TOKEN_EMBD).unwrap();
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_head,
            c.n_head_kv,
            c.n_vocab
        ),
        (28, 3072, 8192, 24, 8, 128_256)
    );
    assert_eq!(
        (c.head_dim, c.rope_dim, c.rope_theta),
        (128, 128, 500_000.0)
    );
    assert!(c.tied_embeddings && c.has_rope_freqs);
    assert_eq!(c.file_type.map(FileType::name), Some("Q4_K_M"));
    assert_eq!(c.expected_shape(tn::ROPE_FREQS).unwrap().0, vec![64]);
    assert_eq!(
        c.expected_shape(&tn::blk(27, tn::ATTN_K)).unwrap().0,
        vec![3072, 1024]
    );
    assert_eq!(
        c.expected_shape(&tn::blk(0, tn::FFN_DOWN)).unwrap().0,
        vec![8192, 3072]
    );
    assert!(c.expected_shape(&tn::blk(28, tn::ATTN_K)).is_none());
    assert_eq!(c.required_tensors().len(), 2 + 28 * 9);
}

impl Tiny {
    /// The same model declared as `arch` (every `llama.*` key renamed).
    fn arch(mut self, arch: &str) -> Tiny {
        for (k, v) in &mut self.md {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("{arch}.{rest}");
            } else if k == keys::GENERAL_ARCHITECTURE {
                *v = Value::String(arch.into());
            }
        }
        self
    }

    fn per_layer(mut self, suffix: &str, dims: Vec<u64>) -> Tiny {
        for l in 0..2 {
            self = self.tensor(&tn::blk(l, suffix), dims.clone());
        }
        self
    }

    fn gemma3(self) -> Tiny {
        self.arch("gemma3")
            .per_layer(tn::ATTN_Q_NORM, vec![4])
            .per_layer(tn::ATTN_K_NORM, vec![4])
            .per_layer(tn::ATTN_POST_NORM, vec![8])
            .per_layer(tn::FFN_POST_NORM, vec![8])
    }
}

#[test]
fn unsupported_architecture_names_every_supported_one() {
    let e = err_text(Tiny::new().arch("mamba").config());
    assert!(e.contains("\"mamba\""), "{e}");
    assert!(e.contains("llama, qwen2, qwen3, phi3, gemma3"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn gemma3_reads_its_spec_windows_and_softcap() {
    let c = Tiny::new().gemma3().config().unwrap();
    assert_eq!(c.family, crate::family::Family::Gemma3);
    assert!(c.spec.qk_norm && c.spec.post_norms && c.spec.embed_scale_sqrt);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.swa_layers, vec![false, false]);
    assert_eq!(c.ffn_name(), "GeGLU (tanh)");
    // A window: the family's 5:1 pattern, the local layers' θ 10k, the soft-cap.
    let c = Tiny::new()
        .gemma3()
        .set("gemma3.attention.sliding_window", Value::U32(4))
        .set("gemma3.final_logit_softcapping", Value::F32(30.0))
        .config()
        .unwrap();
    assert_eq!((c.sliding_window, c.window_of(0)), (Some(4), Some(4)));
    assert_eq!(c.swa_layers, vec![true, true]);
    assert_eq!(c.rope_theta_swa, Some(10_000.0));
    assert_eq!(c.final_logit_softcap, Some(30.0));
    // The pattern from metadata: a period, or one flag per layer.
    let with = |v: Value| {
        Tiny::new()
            .gemma3()
            .set("gemma3.attention.sliding_window", Value::U32(4))
            .set("gemma3.attention.sliding_window_pattern", v)
            .config()
    };
    assert_eq!(with(Value::U32(2)).unwrap().swa_layers, vec![true, false]);
    let flags = Value::Array(Array::Bool(vec![false, true]));
    assert_eq!(with(flags).unwrap().swa_layers, vec![false, true]);
    let short = Value::Array(Array::Bool(vec![true]));
    assert!(err_text(with(short)).contains("sliding_window_pattern"));
    // The family's tensors are required.
    let e = err_text(
        Tiny::new()
            .gemma3()
            .without_tensor(&tn::blk(1, tn::ATTN_K_NORM))
            .config(),
    );
    assert!(e.contains("blk.1.attn_k_norm.weight"), "{e}");
    let e = err_text(
        Tiny::new()
            .gemma3()
            .tensor(&tn::blk(0, tn::ATTN_Q_NORM), vec![8])
            .config(),
    );
    assert!(e.contains("head_dim"), "{e}");
}

#[test]
fn phi3_fused_tensors_and_qwen2_biases_are_checked() {
    let phi3 = Tiny::new()
        .arch("phi3")
        .per_layer(tn::ATTN_QKV, vec![8, 16])
        .per_layer(tn::FFN_UP, vec![8, 32]);
    let mut phi3 = phi3;
    for l in 0..2 {
        for s in [tn::ATTN_Q, tn::ATTN_K, tn::ATTN_V, tn::FFN_GATE] {
            phi3 = phi3.without_tensor(&tn::blk(l, s));
        }
    }
    let c = phi3.config().unwrap();
    assert!(c.fused_qkv && c.spec.fused_gate_up);
    assert!(c.features().contains(&"fused attn_qkv".to_string()));
    let e = err_text(phi3.tensor(&tn::blk(0, tn::FFN_UP), vec![8, 16]).config());
    assert!(e.contains("2 * n_ff"), "{e}");

    let qwen2 = Tiny::new()
        .arch("qwen2")
        .tensor(&tn::blk_bias(0, tn::ATTN_Q), vec![8])
        .tensor(&tn::blk_bias(0, tn::ATTN_K), vec![4])
        .tensor(&tn::blk_bias(0, tn::ATTN_V), vec![4]);
    let c = qwen2.config().unwrap();
    assert!(c.qkv_bias);
    assert_eq!(
        c.spec.rope_layout,
        damascus_kernels::reference::RopeLayout::Neox
    );
    let e = err_text(qwen2.tensor(&tn::blk_bias(0, tn::ATTN_K), vec![8]).config());
    assert!(e.contains("blk.0.attn_k.bias"), "{e}");
}
