//! Unit tests of the type-selection recipe against llama.cpp's rules.

use super::*;
use GgmlType as G;

fn llama(n_layer: u32, n_head: u32, n_head_kv: u32) -> ModelInfo {
    ModelInfo {
        arch: "llama".into(),
        n_layer,
        n_head,
        n_head_kv,
        n_expert: 0,
    }
}

/// Names and dims of a Llama decoder (tied embeddings unless `untied`).
fn llama_tensors(
    n_layer: u32,
    n_embd: u64,
    n_ff: u64,
    n_kv: u64,
    untied: bool,
) -> Vec<(String, Vec<u64>)> {
    let mut v = vec![
        ("token_embd.weight".to_string(), vec![n_embd, 1000]),
        ("output_norm.weight".to_string(), vec![n_embd]),
        ("rope_freqs.weight".to_string(), vec![64]),
    ];
    if untied {
        v.push(("output.weight".to_string(), vec![n_embd, 1000]));
    }
    for l in 0..n_layer {
        let p = format!("blk.{l}.");
        v.push((p.clone() + "attn_norm.weight", vec![n_embd]));
        v.push((p.clone() + "attn_q.weight", vec![n_embd, n_embd]));
        v.push((p.clone() + "attn_k.weight", vec![n_embd, n_kv]));
        v.push((p.clone() + "attn_v.weight", vec![n_embd, n_kv]));
        v.push((p.clone() + "attn_output.weight", vec![n_embd, n_embd]));
        v.push((p.clone() + "ffn_norm.weight", vec![n_embd]));
        v.push((p.clone() + "ffn_gate.weight", vec![n_embd, n_ff]));
        v.push((p.clone() + "ffn_up.weight", vec![n_embd, n_ff]));
        v.push((p + "ffn_down.weight", vec![n_ff, n_embd]));
    }
    v
}

fn run(
    model: &ModelInfo,
    mix: Mix,
    tensors: &[(String, Vec<u64>)],
    src: GgmlType,
) -> Vec<(String, GgmlType)> {
    let descs: Vec<TensorDesc<'_>> = tensors
        .iter()
        .map(|(n, d)| TensorDesc {
            name: n,
            dims: d,
            dtype: if d.len() == 1 { G::F32 } else { src },
        })
        .collect();
    let choices = plan(model, mix, &descs, &RecipeOptions::default()).unwrap();
    tensors
        .iter()
        .zip(choices)
        .map(|((n, _), c)| (n.clone(), c.dtype))
        .collect()
}

fn type_of(r: &[(String, GgmlType)], name: &str) -> GgmlType {
    r.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn use_more_bits_pattern_28_layers() {
    // n/8 = 3, 7n/8 = 24: layers 0..3, 24..28 and (i-3)%3 == 2 -> 5, 8, ..., 23.
    let more: Vec<i64> = (0..28).filter(|&i| use_more_bits(i, 28)).collect();
    assert_eq!(
        more,
        vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    );
}

#[test]
fn q4_k_m_llama_3b_shape() {
    let m = llama(28, 24, 8);
    let t = llama_tensors(28, 3072, 8192, 1024, false);
    let r = run(&m, Mix::Q4_K_M, &t, G::F16);
    // Tied embeddings: token_embd is treated as the output tensor.
    assert_eq!(type_of(&r, "token_embd.weight"), G::Q6_K);
    assert_eq!(type_of(&r, "output_norm.weight"), G::F32);
    assert_eq!(type_of(&r, "rope_freqs.weight"), G::F32);
    for l in 0..28i64 {
        let want = if use_more_bits(l, 28) {
            G::Q6_K
        } else {
            G::Q4_K
        };
        assert_eq!(
            type_of(&r, &format!("blk.{l}.attn_v.weight")),
            want,
            "layer {l}"
        );
        assert_eq!(
            type_of(&r, &format!("blk.{l}.ffn_down.weight")),
            want,
            "layer {l}"
        );
        for other in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(type_of(&r, &format!("blk.{l}.{other}.weight")), G::Q4_K);
        }
        assert_eq!(type_of(&r, &format!("blk.{l}.attn_norm.weight")), G::F32);
    }
}

#[test]
fn untied_token_embd_keeps_base_type() {
    let m = llama(2, 8, 2);
    let t = llama_tensors(2, 512, 1536, 128, true);
    let r = run(&m, Mix::Q4_K_M, &t, G::F16);
    assert_eq!(type_of(&r, "token_embd.weight"), G::Q4_K);
    assert_eq!(type_of(&r, "output.weight"), G::Q6_K);
}

#[test]
fn q8_0_output_stays_q8_0_and_legacy_mixes_are_uniform() {
    let m = llama(2, 8, 2);
    let t = llama_tensors(2, 512, 1536, 128, false);
    let r = run(&m, Mix::Q8_0, &t, G::F16);
    assert_eq!(type_of(&r, "token_embd.weight"), G::Q8_0);
    let r = run(&m, Mix::Q4_0, &t, G::F16);
    // Output rule: Q6_K even for legacy mixes.
    assert_eq!(type_of(&r, "token_embd.weight"), G::Q6_K);
    assert_eq!(type_of(&r, "blk.0.attn_v.weight"), G::Q4_0);
    assert_eq!(type_of(&r, "blk.1.ffn_down.weight"), G::Q4_0);
}

#[test]
fn counters_follow_numeric_layer_order() {
    // 12 layers stored in lexicographic order (blk.10 before blk.2) must still be visited
    // numerically: use_more_bits(i, 12) -> 0, 4, 7, 10, 11 (n/8 = 1, 7n/8 = 10).
    let m = llama(12, 8, 2);
    let mut t = llama_tensors(12, 512, 1536, 128, false);
    t.sort_by(|a, b| a.0.cmp(&b.0));
    let r = run(&m, Mix::Q5_K_M, &t, G::F16);
    for l in 0..12i64 {
        let want = if use_more_bits(l, 12) {
            G::Q6_K
        } else {
            G::Q5_K
        };
        assert_eq!(
            type_of(&r, &format!("blk.{l}.attn_v.weight")),
            want,
            "layer {l}"
        );
    }
}

#[test]
fn q4_k_s_attn_v_and_ffn_down() {
    let m = llama(16, 32, 8);
    let t = llama_tensors(16, 2048, 8192, 512, false);
    let r = run(&m, Mix::Q4_K_S, &t, G::F16);
    for l in 0..16 {
        let v = if l < 4 { G::Q5_K } else { G::Q4_K };
        let d = if l < 2 { G::Q5_K } else { G::Q4_K };
        assert_eq!(type_of(&r, &format!("blk.{l}.attn_v.weight")), v);
        assert_eq!(type_of(&r, &format!("blk.{l}.ffn_down.weight")), d);
    }
}

#[test]
fn row_length_fallbacks() {
    assert_eq!(fallback_type(576, G::Q4_K), (G::Q5_0, true));
    assert_eq!(fallback_type(576, G::Q5_K), (G::Q5_1, true));
    assert_eq!(fallback_type(576, G::Q6_K), (G::Q8_0, true));
    assert_eq!(fallback_type(576, G::Q3_K), (G::Q4_0, true));
    assert_eq!(fallback_type(576, G::Q2_K), (G::Q4_0, true));
    assert_eq!(fallback_type(512, G::Q4_K), (G::Q4_K, false));
    assert_eq!(fallback_type(100, G::Q4_K), (G::F16, true));
    assert_eq!(fallback_type(100, G::Q8_0), (G::F16, true));
    assert_eq!(fallback_type(96, G::Q8_0), (G::Q8_0, false));
}

#[test]
fn smollm2_shape_falls_back() {
    // SmolLM2-135M: 30 layers, n_embd 576 (not a multiple of 256), 9/3 heads, tied.
    let m = llama(30, 9, 3);
    let t = llama_tensors(30, 576, 1536, 192, false);
    let r = run(&m, Mix::Q4_K_M, &t, G::Q4_1);
    // Output rule sees 576 % 256 != 0 -> Q8_0.
    assert_eq!(type_of(&r, "token_embd.weight"), G::Q8_0);
    // attn_v on a more-bits layer: Q6_K -> Q8_0; otherwise Q4_K -> Q5_0.
    assert_eq!(type_of(&r, "blk.0.attn_v.weight"), G::Q8_0);
    assert_eq!(type_of(&r, "blk.4.attn_v.weight"), G::Q5_0);
    assert_eq!(type_of(&r, "blk.4.attn_q.weight"), G::Q5_0);
    // ffn_down rows are 1536 long: K-quants fit.
    assert_eq!(type_of(&r, "blk.0.ffn_down.weight"), G::Q6_K);
    assert_eq!(type_of(&r, "blk.4.ffn_down.weight"), G::Q4_K);
}

#[test]
fn f16_mix_converts_matrices_only() {
    let m = llama(2, 8, 2);
    let t = llama_tensors(2, 512, 1536, 128, false);
    let r = run(&m, Mix::F16, &t, G::F32);
    assert_eq!(type_of(&r, "token_embd.weight"), G::F16);
    assert_eq!(type_of(&r, "blk.0.ffn_down.weight"), G::F16);
    assert_eq!(type_of(&r, "blk.0.ffn_norm.weight"), G::F32);
}

#[test]
fn allows_quantization_rules() {
    let o = RecipeOptions::default();
    assert!(allows_quantization("blk.0.attn_q.weight", &[64, 64], &o));
    assert!(!allows_quantization("blk.0.attn_norm.weight", &[64], &o));
    assert!(!allows_quantization("blk.0.attn_q.bias", &[64, 64], &o));
    // A 2-D shape with a trailing 1 counts as 1-D.
    assert!(!allows_quantization("blk.0.attn_q.weight", &[64, 1], &o));
    assert!(!allows_quantization(
        "blk.0.ffn_gate_inp.weight",
        &[64, 8],
        &o
    ));
    let leave = RecipeOptions {
        leave_output_tensor: true,
        pure: false,
    };
    assert!(!allows_quantization("output.weight", &[64, 64], &leave));
}

#[test]
fn mix_names_and_ids() {
    assert_eq!(Mix::from_name("q4_k_m"), Some(Mix::Q4_K_M));
    assert_eq!(Mix::from_name("MOSTLY_Q6_K"), Some(Mix::Q6_K));
    assert_eq!(Mix::Q4_K_M.ftype_id(), 15);
    assert_eq!(Mix::from_ftype_id(17), Ok(Mix::Q5_K_M));
    assert!(matches!(
        Mix::from_ftype_id(19),
        Err(RecipeError::UnsupportedFileType {
            name: "IQ2_XXS",
            ..
        })
    ));
    for m in Mix::all() {
        assert_eq!(Mix::from_ftype_id(m.ftype_id()), Ok(m));
        assert_eq!(Mix::from_name(m.name()), Some(m));
    }
}

#[test]
fn tensor_order_matches_llama_cpp() {
    let names = [
        "blk.10.attn_q.weight",
        "token_embd.weight",
        "blk.2.ffn_up.weight",
        "blk.2.attn_k.weight",
        "output_norm.weight",
    ];
    let order: Vec<&str> = llama_tensor_order(&names)
        .iter()
        .map(|&i| names[i])
        .collect();
    assert_eq!(
        order,
        vec![
            "output_norm.weight",
            "token_embd.weight",
            "blk.2.attn_k.weight",
            "blk.2.ffn_up.weight",
            "blk.10.attn_q.weight"
        ]
    );
}
