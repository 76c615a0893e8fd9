//! Programmatic dependent launch (`KernelSettings::cuda_pdl`, `DAMASCUS_CUDA_PDL=1`) and the
//! decode fusions (`cuda_fuse`, `DAMASCUS_CUDA_FUSE=1`) on whole models: the same bits as
//! without them. A session (a prompt on the GEMVs, then decode steps replayed from graphs or
//! launched eagerly, and the device argmax) and the server's batched steps (continuous
//! batching over the paged pool, passes under 16 rows: decode batches are graphed) give logits
//! identical to a backend with neither, on the synthetic `tiny-llama3` (Q4_K_M: Q4_K and Q6_K
//! GEMVs; Q8_0) and the tiny Qwen 3 and Gemma 3 fixtures.
//!
//! Runs with `--features cuda`. Without a device every test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_CUDA=1` (set on the GPU machine).
#![cfg(feature = "cuda")]

mod common;

use common::sim::{seq, simulate};

use std::path::Path;
use std::sync::Arc;

use damascus_cuda::Gpu;
use damascus_gguf::GgufFile;
use damascus_kernels::settings::KernelSettings;
use damascus_model::backend::cuda::CudaBackend;
use damascus_model::{LoadOptions, Model};
use damascus_quant::recipe::Mix;

const IDS: [u32; 8] = [791, 4062, 14198, 39935, 35308, 927, 279, 16053];

/// The model on a CUDA backend of its own with PDL (and the GEMV weight prefetch), graphs and
/// the decode fusions as given.
fn cuda_model(
    file: &Arc<GgufFile>,
    pdl: bool,
    prefetch: bool,
    graphs: bool,
    fuse: bool,
) -> (Model, Arc<Gpu>) {
    let settings = KernelSettings {
        cuda_pdl: pdl,
        cuda_pdl_prefetch: prefetch,
        cuda_graphs: graphs,
        cuda_fuse: fuse,
        ..KernelSettings::default()
    };
    let b = CudaBackend::with_settings(0, &settings).expect("opening the CUDA backend");
    let gpu = Arc::clone(b.gpu());
    assert_pdl(&gpu, pdl);
    let opts = LoadOptions {
        n_ctx: Some(256),
        ..Default::default()
    };
    let m = Model::with_backend(file.clone(), &opts, b).expect("loading on CUDA");
    (m, gpu)
}

/// On sm_90+, PDL is on when asked for (and stayed on: the driver refused nothing).
fn assert_pdl(gpu: &Gpu, pdl: bool) {
    if pdl && gpu.compute_capability.0 >= 9 {
        assert!(gpu.pdl(), "PDL asked for on sm_90+ but off (see stderr)");
    }
}

/// Prefill 20 tokens, then 50 decode steps (crossing attention splits): every step's logits,
/// and the device's greedy pick of a second session in lockstep.
fn session_trace(m: &Model) -> (Vec<Vec<f32>>, Vec<u32>) {
    let ids: Vec<u32> = IDS.iter().cycle().take(70).copied().collect();
    let (mut s, mut g) = (m.session().unwrap(), m.session().unwrap());
    let mut logits = vec![s.eval(&ids[..20]).unwrap()];
    let mut picks = vec![g.eval_argmax(&ids[..20]).unwrap()];
    for &id in &ids[20..] {
        logits.push(s.eval(&[id]).unwrap());
        picks.push(g.eval_argmax(&[id]).unwrap());
    }
    (logits, picks)
}

#[test]
fn sessions_give_the_same_bits_with_pdl_and_fusions() {
    if !common::cuda_device() {
        return;
    }
    for (mix, label) in [(Mix::Q4_K_M, "Q4_K_M"), (Mix::Q8_0, "Q8_0")] {
        let f = common::tiny(mix, label);
        let plain = session_trace(&cuda_model(&f, false, false, true, false).0);
        for (pdl, prefetch, graphs, fuse) in [
            (true, true, true, false),
            (true, true, false, false),
            (true, false, true, false),
            (false, false, true, true),
            (true, true, true, true),
        ] {
            let (m, gpu) = cuda_model(&f, pdl, prefetch, graphs, fuse);
            let got = session_trace(&m);
            assert_pdl(&gpu, pdl);
            assert!(
                got == plain,
                "tiny-llama3 {label}: PDL {pdl}, prefetch {prefetch}, graphs {graphs}, fusions \
                 {fuse}: bits differ"
            );
        }
    }
}

/// The server's steps over the paged pool: a target and 10 others arriving and leaving,
/// prompt chunks under 15 tokens per step (every pass on the GEMVs, decode batches graphed).
fn batch_trace(m: &Model) -> Vec<Vec<Vec<f32>>> {
    let n_vocab = m.params().n_vocab;
    let prompt = |seed: u32, n: usize| -> Vec<u32> {
        let span = (n_vocab as u32).saturating_sub(8).clamp(1, 5000);
        (0..n as u32)
            .map(|i| 4 + (seed * 7919 + i * 104_729) % span)
            .collect()
    };
    let seqs = (0..11u32)
        .map(|i| seq(i as usize / 3, prompt(i + 1, 3 + (i as usize * 5) % 17), 6))
        .collect();
    simulate(m, seqs, 15, 128, 16)
}

#[test]
fn batched_steps_give_the_same_bits_with_pdl_and_fusions() {
    if !common::cuda_device() {
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families");
    let mut files = vec![(
        "tiny-llama3 Q4_K_M".to_string(),
        common::tiny(Mix::Q4_K_M, "Q4_K_M"),
    )];
    for family in ["qwen3", "gemma3"] {
        let f = GgufFile::open(dir.join(format!("{family}.gguf")))
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        files.push((family.to_string(), Arc::new(f)));
    }
    for (label, f) in &files {
        let plain = batch_trace(&cuda_model(f, false, false, true, false).0);
        let (m, gpu) = cuda_model(f, true, true, true, true);
        let got = batch_trace(&m);
        assert_pdl(&gpu, true);
        assert!(
            got == plain,
            "{label}: batched steps differ with PDL and fusions"
        );
    }
}
