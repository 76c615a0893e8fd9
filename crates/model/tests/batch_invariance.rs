//! Batch invariance (issue 26): a greedy sequence gives bit-identical logits alone and inside
//! a batch of 16 with other sequences arriving and leaving, prompts chunked by a token
//! budget, over a shared paged KV cache with prefix reuse — on the reference backend with the
//! f32 cache and on the fast CPU path (f16 and q8_0 caches), on the synthetic `tiny-llama3`.

mod common;

use common::sim::{seq, simulate};

use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::host_argmax;
use damascus_model::backend::reference::ReferenceBackend;
use damascus_model::{KvCacheType, LoadOptions, Model};
use damascus_quant::recipe::Mix;

const BLOCK: usize = 4;
const N_BLOCKS: usize = 256;

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 100 + (seed * 7919 + i * 104_729) % 5000)
        .collect()
}

fn check(model: &Model) {
    let target = prompt(1, 21);
    let alone = simulate(model, vec![seq(0, target.clone(), 6)], 64, N_BLOCKS, BLOCK);
    // 15 others arriving and leaving around it; two share its first 8 tokens (prefix reuse),
    // one arrives after it has finished its prompt with its whole prompt as a prefix.
    let mut seqs = vec![seq(2, target.clone(), 6)];
    for i in 0..15u32 {
        let mut p = prompt(10 + i, 3 + (i as usize * 5) % 29);
        if i < 2 {
            p.splice(0..0, target[..8].iter().copied());
        }
        seqs.push(seq(i as usize / 2, p, 2 + (i as usize % 5)));
    }
    let mut extended = target.clone();
    extended.extend(prompt(99, 5));
    seqs.push(seq(9, extended, 3));
    let batched = simulate(model, seqs, 24, N_BLOCKS, BLOCK);
    assert_eq!(batched[0].len(), alone[0].len());
    // Bit-identical where every row takes the same kernel route whatever the batch: the
    // reference; CPU weights repacked for the int8 kernels (the int8 GEMM and the packed GEMV
    // give the same bits per row, AMX-INT8 tiles with `DAMASCUS_AMX_INT8=1` included) and
    // file-layout weights (every row on the dot products). With AMX-BF16 prompts (the default
    // on AMX hosts) prompts multiply on bf16 tiles and decode on the VNNI GEMV, which round
    // differently: there the greedy tokens must still agree.
    if model.backend_name() == "cpu-amx" {
        for (step, (a, b)) in alone[0].iter().zip(&batched[0]).enumerate() {
            assert_eq!(
                host_argmax(a),
                host_argmax(b),
                "{}: step {step}: greedy token differs between alone and batched",
                model.backend_name()
            );
        }
        return;
    }
    for (step, (a, b)) in alone[0].iter().zip(&batched[0]).enumerate() {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differ,
            0,
            "{}: step {step}: {differ} logits differ between alone and batched",
            model.backend_name()
        );
    }
}

fn opts(cache_type: KvCacheType) -> LoadOptions {
    LoadOptions {
        n_ctx: Some(64),
        cache_type: Some(cache_type),
        ..Default::default()
    }
}

#[test]
fn batched_logits_are_bit_identical_on_the_reference_f32_cache() {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    check(&Model::with_backend(f, &opts(KvCacheType::F32), ReferenceBackend).unwrap());
}

#[test]
fn batched_logits_are_bit_identical_on_the_cpu_fast_path() {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    for threads in [1, 2] {
        let m = Model::with_backend(
            f.clone(),
            &opts(KvCacheType::F16),
            CpuBackend::new(Some(threads)),
        );
        check(&m.unwrap());
    }
}

#[test]
fn batched_logits_are_bit_identical_on_the_cpu_q8_0_cache() {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    for threads in [1, 2] {
        let m = Model::with_backend(
            f.clone(),
            &opts(KvCacheType::Q8_0),
            CpuBackend::new(Some(threads)),
        );
        check(&m.unwrap());
    }
}

#[test]
fn batched_logits_are_bit_identical_on_the_reference_q8_0_cache() {
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    check(&Model::with_backend(f, &opts(KvCacheType::Q8_0), ReferenceBackend).unwrap());
}

/// On AMX hosts with `KernelSettings::amx_int8` (prompts on AMX-INT8 tiles, the VNNI path's
/// bits): bit-identical too, like every other repacked int8 path.
#[test]
fn batched_logits_are_bit_identical_on_amx_int8_tiles() {
    use damascus_kernels::gemm::int8::Int8Path;
    use damascus_kernels::settings::KernelSettings;
    if !Int8Path::Amx.is_available() {
        return;
    }
    let settings = KernelSettings {
        amx_int8: true,
        ..KernelSettings::default()
    };
    let f = common::tiny(Mix::Q4_K_M, "Q4_K_M");
    for threads in [1, 2] {
        let backend = CpuBackend::with_settings(Some(threads), &settings);
        let m = Model::with_backend(f.clone(), &opts(KvCacheType::F16), backend).unwrap();
        if m.backend_name() != "cpu-amx-int8" {
            return; // a forced ISA below AMX (DAMASCUS_ISA)
        }
        check(&m);
    }
}
