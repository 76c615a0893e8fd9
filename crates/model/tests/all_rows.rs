//! Issue 29 A6: the verify pass of speculative decoding. [`Session::eval_all`] returns the
//! logits after every row of a multi-token pass, and each row must be bit for bit what a
//! one-token pass at that position gives (the same kernel route: below the GEMM threshold
//! every matmul runs the decode GEMV; above it only AMX prompt tiles round differently).
//! Rolling back rejected positions ([`Session::truncate`]) and evaluating other tokens there
//! must give the logits of a sequence that never saw the rejected ones. The default model on
//! the CPU backend; the synthetic `tiny-llama3` on the reference.

mod common;

use std::sync::Arc;

use damascus_gguf::GgufFile;
use damascus_model::backend::cpu::{CpuBackend, GEMM_MIN_TOKENS};
use damascus_model::backend::host_argmax;
use damascus_model::backend::reference::ReferenceBackend;
use damascus_model::{LoadOptions, Model, Session};
use damascus_quant::recipe::Mix;

fn file() -> Arc<GgufFile> {
    common::default_model_file()
}

fn opts() -> LoadOptions {
    LoadOptions {
        n_ctx: Some(128),
        ..Default::default()
    }
}

/// `n` ids of ordinary tokens.
fn ids(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1000 + (seed * 7919 + i * 37) % 500)
        .collect()
}

/// Logits after each of `ids`, fed one token per pass.
fn one_by_one(s: &mut Session, ids: &[u32]) -> Vec<Vec<f32>> {
    ids.iter().map(|&t| s.eval(&[t]).unwrap()).collect()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn check(model: &Model) {
    let name = model.backend_name();
    let prefix = ids(1, 21);
    // Row counts: 1, awkward sizes below the GEMM threshold, the largest verify pass (15),
    // and one above the threshold.
    for n in [1, 3, 7, GEMM_MIN_TOKENS - 1, 33] {
        let rows = ids(n as u32 + 2, n);
        let mut a = model.session().unwrap();
        a.eval(&prefix).unwrap();
        let want = one_by_one(&mut a, &rows);
        let mut b = model.session().unwrap();
        b.eval(&prefix).unwrap();
        let got = b.eval_all(&rows).unwrap();
        assert_eq!(got.len(), n);
        assert_eq!(b.n_past(), prefix.len() + n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if n >= GEMM_MIN_TOKENS && name == "cpu-amx" {
                // AMX-BF16 prompt tiles vs the VNNI GEMV: the greedy pick must still agree.
                assert_eq!(host_argmax(g), host_argmax(w), "{name}: {n} rows, row {i}");
            } else {
                assert!(same_bits(g, w), "{name}: {n} rows, row {i} differs");
            }
        }
        // The argmax variant picks the same tokens.
        let mut c = model.session().unwrap();
        c.eval(&prefix).unwrap();
        let picks = c.eval_all_argmax(&rows).unwrap();
        let want_picks: Vec<u32> = got.iter().map(|l| host_argmax(l)).collect();
        assert_eq!(picks, want_picks, "{name}: {n} rows");
    }
}

/// A rejected draft rolled back and replaced gives the logits of a sequence that never held
/// it, including the positions after it (the stale cache entries are overwritten).
fn check_rollback(model: &Model) {
    let name = model.backend_name();
    let prefix = ids(3, 18);
    let good = ids(4, 9);
    let mut fresh = model.session().unwrap();
    fresh.eval(&prefix).unwrap();
    let want = fresh.eval_all(&good).unwrap();

    let mut s = model.session().unwrap();
    s.eval(&prefix).unwrap();
    // Verify [good[0], wrong drafts...]: keep good[0] and one right draft, drop the rest.
    let mut input = vec![good[0], good[1]];
    input.extend(ids(9, 6));
    s.eval_all(&input).unwrap();
    s.truncate(prefix.len() + 2);
    assert_eq!(s.n_past(), prefix.len() + 2);
    // Continue with the right tokens, one pass of several rows and then one at a time.
    let mut got = s.eval_all(&good[2..6]).unwrap();
    got.extend(one_by_one(&mut s, &good[6..]));
    for (i, (g, w)) in got.iter().zip(&want[2..]).enumerate() {
        assert!(same_bits(g, w), "{name}: row {} after the rollback", i + 2);
    }
    // Rolling back everything and evaluating the whole again also matches.
    s.truncate(prefix.len());
    let again = s.eval_all(&good).unwrap();
    for (i, (g, w)) in again.iter().zip(&want).enumerate() {
        assert!(same_bits(g, w), "{name}: row {i} after a full rollback");
    }
}

#[test]
fn every_row_gets_the_one_token_logits_on_the_cpu_backend() {
    for threads in [1, 2] {
        let model = Model::with_backend(file(), &opts(), CpuBackend::new(Some(threads))).unwrap();
        check(&model);
        check_rollback(&model);
        assert!(model.session().unwrap().row_invariant());
    }
}

#[test]
fn every_row_gets_the_one_token_logits_on_the_reference() {
    let tiny = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    let model = Model::with_backend(tiny, &opts(), ReferenceBackend).unwrap();
    check(&model);
    check_rollback(&model);
}

#[test]
fn bad_input_is_an_error() {
    let model = Model::with_backend(file(), &opts(), CpuBackend::new(Some(1))).unwrap();
    let mut s = model.session().unwrap();
    assert!(s.eval_all(&[]).is_err());
    assert!(s.eval_all_argmax(&[u32::MAX]).is_err());
    assert_eq!(s.n_past(), 0);
    let too_long = ids(5, 129);
    assert!(s.eval_all_argmax(&too_long).is_err());
    assert_eq!(s.n_past(), 0);
}
