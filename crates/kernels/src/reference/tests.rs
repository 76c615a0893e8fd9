//! Unit tests of the reference kernels against hand-written expectations and identities.

use super::*;
use damascus_quant::{GgmlType, quantize_row};

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn matmul_f32_matches_naive() {
    let (rows, cols, n_tokens) = (7, 64, 3);
    let w = values(rows * cols, 1);
    let x = values(n_tokens * cols, 2);
    let bytes = f32_bytes(&w);
    let view = WeightView::new(GgmlType::F32, rows, cols, &bytes).unwrap();
    let mut y = vec![0f32; n_tokens * rows];
    matmul(&view, &x, &mut y).unwrap();
    for t in 0..n_tokens {
        for r in 0..rows {
            let want: f32 = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c]).sum();
            assert!((y[t * rows + r] - want).abs() < 1e-5);
        }
    }
}

#[test]
fn matmul_quantized_dequantizes_per_row() {
    let (rows, cols) = (5, 64);
    let w = values(rows * cols, 3);
    let rb = GgmlType::Q8_0.row_bytes(cols as u64).unwrap() as usize;
    let mut bytes = vec![0u8; rows * rb];
    for r in 0..rows {
        quantize_row(
            GgmlType::Q8_0,
            &w[r * cols..][..cols],
            &mut bytes[r * rb..][..rb],
        )
        .unwrap();
    }
    let view = WeightView::new(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
    let x = values(cols, 4);
    let mut y = vec![0f32; rows];
    matmul(&view, &x, &mut y).unwrap();
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        view.dequantize_row(r, &mut row).unwrap();
        let want: f32 = row.iter().zip(&x).map(|(a, b)| a * b).sum();
        assert!((y[r] - want).abs() < 1e-5);
        // And the quantized product stays close to the f32 one.
        let exact: f32 = w[r * cols..][..cols]
            .iter()
            .zip(&x)
            .map(|(a, b)| a * b)
            .sum();
        assert!((y[r] - exact).abs() < 0.05, "row {r}: {} vs {exact}", y[r]);
    }
}

#[test]
fn weight_view_rejects_wrong_length() {
    let bytes = vec![0u8; 33];
    assert!(matches!(
        WeightView::new(GgmlType::Q8_0, 1, 32, &bytes),
        Err(KernelError::WeightBytes {
            expected: 34,
            found: 33,
            ..
        })
    ));
}

#[test]
fn embed_rows_looks_up_and_checks_range() {
    let table = values(4 * 8, 5);
    let bytes = f32_bytes(&table);
    let view = WeightView::new(GgmlType::F32, 4, 8, &bytes).unwrap();
    let mut out = vec![0f32; 2 * 8];
    embed_rows(&view, &[3, 1], &mut out).unwrap();
    assert_eq!(&out[..8], &table[24..32]);
    assert_eq!(&out[8..], &table[8..16]);
    assert!(matches!(
        embed_rows(&view, &[4, 0], &mut out),
        Err(KernelError::TokenOutOfRange { id: 4, n_vocab: 4 })
    ));
}

#[test]
fn rms_norm_unit_rms() {
    let x = [3.0f32, -4.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]; // [2, 4]
    let w = [1.0f32, 2.0, 1.0, 1.0];
    let mut y = [0f32; 8];
    rms_norm(&x, &w, 0.0, &mut y);
    // rms of row 0 = sqrt(25 / 4) = 2.5
    assert!((y[0] - 1.2).abs() < 1e-6 && (y[1] + 3.2).abs() < 1e-6);
    assert!((y[4] - 1.0).abs() < 1e-6 && (y[5] - 2.0).abs() < 1e-6);
}

#[test]
fn softmax_sums_to_one_and_is_shift_invariant() {
    let mut a = [1.0f32, 2.0, 3.0, -1.0];
    let mut b = a.map(|v| v + 100.0);
    softmax(&mut a);
    softmax(&mut b);
    assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-6);
    }
    assert!(a[2] > a[1] && a[1] > a[0] && a[0] > a[3]);
}

#[test]
fn swiglu_and_add() {
    let mut g = [0.0f32, 1.0, -2.0];
    swiglu(&mut g, &[5.0, 2.0, 1.0]);
    assert_eq!(g[0], 0.0);
    assert!((g[1] - 2.0 * silu(1.0)).abs() < 1e-7);
    assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
    let mut x = [1.0f32, 2.0];
    add(&mut x, &[0.5, -2.0]);
    assert_eq!(x, [1.5, 0.0]);
}

#[test]
fn rope_position_zero_is_identity_and_rotation_keeps_norm() {
    let (n_head, head_dim) = (2, 8);
    let inv = rope_inv_freq(head_dim, 10000.0, None);
    assert_eq!(inv.len(), 4);
    assert_eq!(inv[0], 1.0);
    let x0 = values(2 * n_head * head_dim, 6); // [2 tokens, 2 heads, 8]
    for layout in [RopeLayout::Normal, RopeLayout::Neox] {
        let mut x = x0.clone();
        rope(&mut x, n_head, head_dim, 0, &inv, layout);
        assert_eq!(&x[..n_head * head_dim], &x0[..n_head * head_dim]); // position 0
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((norm(&x[16..]) - norm(&x0[16..])).abs() < 1e-5);
        assert_ne!(&x[16..], &x0[16..]);
    }
}

#[test]
fn rope_normal_equals_neox_on_permuted_heads() {
    // Neox on halves == Normal on adjacent pairs after interleaving the halves: this is the
    // permutation llama.cpp's converter applies to the Q/K weights.
    let (n_head, head_dim, n_rot) = (3, 8, 8);
    let inv = rope_inv_freq(n_rot, 500.0, None);
    let x = values(n_head * head_dim, 7);
    let interleave = |v: &[f32]| -> Vec<f32> {
        v.chunks(head_dim)
            .flat_map(|h| (0..head_dim / 2).flat_map(move |i| [h[i], h[i + head_dim / 2]]))
            .collect()
    };
    let mut neox = x.clone();
    rope(&mut neox, n_head, head_dim, 5, &inv, RopeLayout::Neox);
    let mut normal = interleave(&x);
    rope(&mut normal, n_head, head_dim, 5, &inv, RopeLayout::Normal);
    for (a, b) in interleave(&neox).iter().zip(&normal) {
        assert!((a - b).abs() < 1e-6);
    }
}

#[test]
fn rope_partial_rotation_leaves_tail() {
    let inv = rope_inv_freq(4, 10000.0, None); // rotate 4 of 8 dims
    let x0 = values(8, 8);
    let mut x = x0.clone();
    rope(&mut x, 1, 8, 3, &inv, RopeLayout::Normal);
    assert_eq!(&x[4..], &x0[4..]);
}

#[test]
fn llama3_factors_match_llama_3_2() {
    // Llama 3.2: base 500000, head_dim 64... use 128 like the real model.
    let s = RopeScalingLlama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_ctx: 8192.0,
    };
    let ff = llama3_freq_factors(128, 500000.0, &s);
    assert_eq!(ff.len(), 64);
    assert_eq!(ff[0], 1.0); // highest frequency kept
    assert_eq!(ff[63], 32.0); // lowest frequency divided by the factor
    assert!(ff.windows(2).all(|w| w[0] <= w[1]));
    let inv = rope_inv_freq(128, 500000.0, Some(&ff));
    let plain = rope_inv_freq(128, 500000.0, None);
    assert!((inv[63] * 32.0 - plain[63]).abs() < 1e-12);
}

#[test]
fn attention_single_position_returns_v_and_groups_heads() {
    let shape = AttnShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 2,
    };
    let q = values(4 * 2, 9);
    let k = values(2 * 2, 10);
    let v = [1.0f32, 2.0, 3.0, 4.0]; // [1, 2 kv heads, 2]
    let mut out = vec![0f32; 8];
    attention(&q, &k, &v, shape, 0, &mut out);
    assert_eq!(out, [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]);
}

#[test]
fn attention_is_causal_and_prefill_equals_decode() {
    let shape = AttnShape {
        n_head: 2,
        n_head_kv: 1,
        head_dim: 4,
    };
    let n = 5;
    let q = values(n * 8, 11);
    let k = values(n * 4, 12);
    let v = values(n * 4, 13);
    let mut prefill = vec![0f32; n * 8];
    attention(&q, &k, &v, shape, 0, &mut prefill);
    // Token by token against a growing cache gives the same rows.
    for t in 0..n {
        let mut one = vec![0f32; 8];
        attention(
            &q[t * 8..][..8],
            &k[..(t + 1) * 4],
            &v[..(t + 1) * 4],
            shape,
            t,
            &mut one,
        );
        for (a, b) in one.iter().zip(&prefill[t * 8..][..8]) {
            assert!((a - b).abs() < 1e-6);
        }
    }
    // Two equal keys split the weight evenly.
    let q1 = [1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
    let k1 = [1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
    let v1 = [2.0f32, 0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0];
    let mut out = vec![0f32; 8];
    attention(&q1, &k1, &v1, shape, 1, &mut out);
    assert!((out[0] - 3.0).abs() < 1e-6);
}
