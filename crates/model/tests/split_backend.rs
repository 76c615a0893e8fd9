//! The layer split (`--ngl`, [`damascus_model::backend::split::Split`]) against the scalar
//! reference: every split point of the 2-layer `tiny-llama3` (all on one side, one layer each,
//! all on the other), both ways round, as one prompt and as prefill + decode steps (the KV
//! cache is split too). Two CPU backends stand in for CPU + GPU, so this runs everywhere; the
//! CPU + CUDA pairing runs in `cuda_backend.rs` on the GPU machine.

mod common;

use damascus_model::backend::Backend;
use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::reference::ReferenceBackend;
use damascus_model::backend::split::Split;
use damascus_model::verify::{compare, compare_models};
use damascus_model::{LoadOptions, Model};
use damascus_quant::recipe::Mix;

const IDS: [u32; 8] = [791, 4062, 14198, 39935, 35308, 927, 279, 16053];

fn opts() -> LoadOptions {
    LoadOptions {
        n_ctx: Some(64),
        ..Default::default()
    }
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap()
}

fn check<A: Backend, B: Backend>(make: impl Fn(usize, usize) -> Split<A, B>, what: &str) {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    let reference = Model::with_backend(f.clone(), &opts(), ReferenceBackend).unwrap();
    let n_layer = reference.params().n_layer;
    let ids: Vec<u32> = IDS.iter().cycle().take(18).copied().collect();
    let want = reference.session().unwrap().eval(&ids).unwrap();
    for n_b in 0..=n_layer + 1 {
        let m = Model::with_backend(f.clone(), &opts(), make(n_layer, n_b)).unwrap();
        assert!(m.backend_name().contains('+'), "{}", m.backend_name());
        // One prompt: every hidden state and the logits.
        let d = compare_models(&reference, &m, &IDS).unwrap();
        for s in &d.slots {
            assert!(
                s.cosine >= 0.995,
                "{what} n_b={n_b}: {} cosine {}",
                s.label,
                s.cosine
            );
        }
        assert!(
            d.logits_cosine >= 0.999,
            "{what} n_b={n_b}: logits cosine {}",
            d.logits_cosine
        );
        assert!(d.same_top1, "{what} n_b={n_b}: top-1 differs");
        // Prefill 10 + 8 decode steps.
        let mut s = m.session().unwrap();
        s.eval(&ids[..10]).unwrap();
        let mut got = Vec::new();
        for &id in &ids[10..] {
            got = s.eval(&[id]).unwrap();
        }
        let c = compare(&got, &want).0;
        assert!(c >= 0.999, "{what} n_b={n_b}: decode logits cosine {c}");
        assert_eq!(
            argmax(&got),
            argmax(&want),
            "{what} n_b={n_b}: decode top-1"
        );
    }
}

#[test]
fn split_reference_then_cpu_matches_reference() {
    check(
        |l, n| Split::new(ReferenceBackend, CpuBackend::new(Some(2)), l, n),
        "reference+cpu",
    );
}

#[test]
fn split_cpu_then_reference_matches_reference() {
    check(
        |l, n| Split::new(CpuBackend::new(Some(2)), ReferenceBackend, l, n),
        "cpu+reference",
    );
}
