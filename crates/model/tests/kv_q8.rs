//! The q8_0 KV cache (`--cache-type q8_0`, issue 26 item 2) on the CPU backend: paged attention
//! against the reference backend's emulation (quantize then dequantize on write) on awkward
//! shapes and windows; the default model's greedy tokens on a q8_0 cache against an f16 one;
//! clear errors where q8_0 cannot be used; the sizes the pool budget uses.
//! Batch and prefix invariance on q8_0 are in `batch_invariance.rs` / `prefix_invariance.rs`.

mod common;

use common::act;

use damascus_kernels::reference::{AttnShape, RopeLayout};
use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::reference::{HostAct, ReferenceBackend};
use damascus_model::backend::{AttnSpec, Backend, KvShape, PagedBatch, RopeParams, SeqSpan};
use damascus_model::{KvCacheType, LoadOptions, Model};

/// A prompt of `chunks` (token counts) through layer 1's paged attention on `b` (one sequence,
/// blocks of 16 in a scrambled table, RoPE on), every chunk's output concatenated.
fn run_paged<B>(b: &B, spec: AttnSpec, chunks: &[usize], cache: KvCacheType) -> Vec<f32>
where
    B: Backend<Act = HostAct>,
{
    const BS: usize = 16;
    let AttnShape {
        n_head,
        n_head_kv,
        head_dim,
    } = spec.shape;
    let total: usize = chunks.iter().sum();
    let n_blocks = total.div_ceil(BS) + 2;
    let table: Vec<u32> = (0..n_blocks as u32).rev().collect();
    let mut kv = b
        .new_kv_cache(KvShape {
            n_layer: 2,
            n_ctx: n_blocks * BS,
            n_head_kv,
            head_dim,
            cache_type: cache,
        })
        .unwrap();
    let rope = RopeParams {
        layout: RopeLayout::Neox,
        head_dim,
        inv_freq: (0..head_dim / 2)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / head_dim as f32))
            .collect(),
    };
    let mut pos0 = 0;
    let mut all = Vec::new();
    for (i, &n) in chunks.iter().enumerate() {
        let seed = 100 * i as u64;
        let mut q = act(n, n_head * head_dim, seed + 1);
        let mut k = act(n, n_head_kv * head_dim, seed + 2);
        let v = act(n, n_head_kv * head_dim, seed + 3);
        let mut out = act(n, n_head * head_dim, 0);
        let seqs = [SeqSpan {
            rows: 0..n,
            pos0,
            table: &table,
        }];
        let batch = PagedBatch {
            block_size: BS,
            seqs: &seqs,
        };
        b.attention_batch(
            &mut kv, 1, spec, &rope, &batch, &mut q, &mut k, &v, &mut out,
        )
        .unwrap();
        all.extend_from_slice(&out.data);
        pos0 += n;
    }
    all
}

#[test]
fn paged_q8_attention_matches_the_reference_emulation() {
    let shapes = [(4, 2, 64), (8, 1, 128), (2, 2, 32), (4, 1, 256), (9, 3, 64)];
    let chunk_sets: [&[usize]; 4] = [&[1], &[3, 1, 1], &[7], &[33, 1, 2]];
    for (n_head, n_head_kv, head_dim) in shapes {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        for window in [None, Some(5)] {
            let spec = AttnSpec { shape, window };
            for chunks in chunk_sets {
                let want = run_paged(&ReferenceBackend, spec, chunks, KvCacheType::Q8_0);
                let f16 = run_paged(&ReferenceBackend, spec, chunks, KvCacheType::F16);
                assert_ne!(want, f16, "q8_0 emulation changed nothing");
                for threads in [1, 3] {
                    let cpu = CpuBackend::new(Some(threads));
                    let got = run_paged(&cpu, spec, chunks, KvCacheType::Q8_0);
                    let d = got
                        .iter()
                        .zip(&want)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max);
                    assert!(
                        d < 2e-4,
                        "{shape:?} window {window:?} chunks {chunks:?} {threads} threads: max diff {d}"
                    );
                }
            }
        }
    }
}

/// Test prompts of the default model (SmolLM2 ids of "The capital of France is",
/// "def fibonacci(n):", "Once upon a time, in a small village,", "The three primary colors
/// are").
const PROMPTS: [&[u32]; 4] = [
    &[504, 3575, 282, 4649, 314],
    &[1604, 3987, 46477, 24, 94, 727],
    &[6403, 1980, 253, 655, 28, 281, 253, 1165, 6560, 28],
    &[504, 1296, 3003, 4683, 359],
];

fn model(cache_type: KvCacheType) -> Model {
    let opts = LoadOptions {
        n_ctx: Some(128),
        cache_type: Some(cache_type),
        ..Default::default()
    };
    Model::with_backend(
        common::default_model_file(),
        &opts,
        CpuBackend::new(Some(2)),
    )
    .expect("loading on cpu")
}

/// Greedy tokens after `prompt`, and the logits of every step.
fn greedy(m: &Model, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = m.session().unwrap();
    let mut logits = vec![s.eval(prompt).unwrap()];
    let mut toks = Vec::new();
    for _ in 0..n {
        let tok = damascus_model::backend::host_argmax(&logits[logits.len() - 1]);
        toks.push(tok);
        if toks.len() < n {
            logits.push(s.eval(&[tok]).unwrap());
        }
    }
    (toks, logits)
}

/// Most logit gap between the f16 run's pick and the q8_0 run's at the first step where they
/// differ, for that to count as a near-tie (the two caches round K and V differently; on this
/// 135M model q8_0 moves a logit by up to about 0.5 against f16). The named near-ties of
/// [`PROMPTS`], 32 greedy tokens each (AVX-512 VNNI host): "The capital of France is" at step
/// 26 (ids 33 vs 37, gap 0.010, inside a run of digits), "def fibonacci(n):" at step 13 (304
/// vs 2822, gap 0.43), "Once upon a time, …" at step 16 (1343 vs 253, gap 0.019), "The three
/// primary colors are" at step 3 (42 ":" vs 282 "of", gap 0.021).
const NEAR_TIE: f32 = 0.5;

#[test]
fn q8_0_cache_gives_the_f16_greedy_tokens_on_the_default_model() {
    let (f16, q8) = (model(KvCacheType::F16), model(KvCacheType::Q8_0));
    for p in PROMPTS {
        let (a, la) = greedy(&f16, p, 32);
        let (b, lb) = greedy(&q8, p, 32);
        assert_ne!(la[0], lb[0], "the q8_0 cache changed nothing");
        // Same tokens, or the first difference is a near-tie in the f16 run's own logits
        // (the same prefix up to there); then the continuations are different texts.
        let same = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        for (step, (x, y)) in la.iter().zip(&lb).enumerate().take(same + 1) {
            let c = damascus_model::verify::compare(x, y).0;
            // q8_0 against f16 moves logits more than f16 against f32 does (the reference's
            // own q8_0 emulation reaches a cosine of 0.995 against f16 on the first prompt; the
            // fast path 0.990 on the third): a sanity bound, a broken cache is far below.
            assert!(c >= 0.98, "prompt {p:?}: step {step}: logits cosine {c}");
        }
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            let l = &la[i];
            let gap = l[a[i] as usize] - l[b[i] as usize];
            eprintln!(
                "prompt {p:?}: step {i}: f16 picks {} and q8_0 {} (f16 logit gap {gap})",
                a[i], b[i]
            );
            assert!(
                gap <= NEAR_TIE,
                "prompt {p:?}: greedy tokens differ at step {i} by a logit gap of {gap}:\n{a:?}\n{b:?}"
            );
        }
    }
}

#[test]
fn q8_0_is_refused_where_it_cannot_be_held() {
    let odd = KvShape {
        n_layer: 1,
        n_ctx: 16,
        n_head_kv: 1,
        head_dim: 48,
        cache_type: KvCacheType::Q8_0,
    };
    let cpu = CpuBackend::new(Some(1)).new_kv_cache(odd).unwrap_err();
    assert!(cpu.to_string().contains("multiple of 32"), "{cpu}");
    let refr = ReferenceBackend.new_kv_cache(odd).unwrap_err();
    assert!(refr.to_string().contains("q8_0"), "{refr}");
    // The non-paged attention op has no q8_0 path on the CPU: a clear error, not a panic.
    let shape = KvShape {
        head_dim: 64,
        ..odd
    };
    let b = CpuBackend::new(Some(1));
    let mut kv = b.new_kv_cache(shape).unwrap();
    let spec = AttnSpec {
        shape: AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 64,
        },
        window: None,
    };
    let (q, k, v) = (act(1, 64, 1), act(1, 64, 2), act(1, 64, 3));
    let mut out = act(1, 64, 4);
    let e = b
        .attention(&mut kv, 0, spec, 0, &q, &k, &v, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("q8_0"), "{e}");
}

#[test]
fn cache_type_names_and_sizes() {
    for t in [KvCacheType::F16, KvCacheType::F32, KvCacheType::Q8_0] {
        assert_eq!(t.name().parse::<KvCacheType>().unwrap(), t);
    }
    assert_eq!("Q8_0".parse::<KvCacheType>().unwrap(), KvCacheType::Q8_0);
    let e = "q4_0".parse::<KvCacheType>().unwrap_err();
    assert!(e.contains("q4_0") && e.contains("q8_0"), "{e}");
    // SmolLM2-135M: 30 layers, 3 KV heads of 64.
    let shape = |cache_type| KvShape {
        n_layer: 30,
        n_ctx: 4096,
        n_head_kv: 3,
        head_dim: 64,
        cache_type,
    };
    let f16 = shape(KvCacheType::F16).bytes_per_slot();
    let q8 = shape(KvCacheType::Q8_0).bytes_per_slot();
    assert_eq!(f16, 2 * 30 * 3 * 128);
    assert_eq!(q8, 2 * 30 * 3 * (64 + 4));
    let ratio = f16 as f64 / q8 as f64;
    assert!((1.85..1.9).contains(&ratio), "{ratio}");
    assert_eq!(shape(KvCacheType::Q8_0).bytes(), 4096 * q8);
}

/// The fast path on a q8_0 cache against the reference backend's q8_0 emulation (the oracle:
/// scalar f32 everywhere, K/V quantized and dequantized on write), teacher-forced on the f16
/// run's greedy tokens: every step's logits within the fast path's usual distance.
#[test]
fn cpu_q8_0_matches_the_reference_emulation_on_the_default_model() {
    let p = PROMPTS[0];
    let (toks, _) = greedy(&model(KvCacheType::F16), p, 12);
    let run = |m: &Model| {
        let mut s = m.session().unwrap();
        let mut l = vec![s.eval(p).unwrap()];
        for &t in &toks[..toks.len() - 1] {
            l.push(s.eval(&[t]).unwrap());
        }
        l
    };
    let opts = LoadOptions {
        n_ctx: Some(128),
        cache_type: Some(KvCacheType::Q8_0),
        ..Default::default()
    };
    let oracle = Model::with_backend(common::default_model_file(), &opts, ReferenceBackend);
    let want = run(&oracle.unwrap());
    let got = run(&model(KvCacheType::Q8_0));
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let c = damascus_model::verify::compare(g, w).0;
        // 0.998 over a prompt and two steps (as `cpu_backend.rs`); 12 teacher-forced steps
        // drift a little further (0.9976 at step 11 with DAMASCUS_ISA=scalar).
        let min = if step < 3 { 0.998 } else { 0.995 };
        assert!(
            c >= min,
            "step {step}: logits cosine {c} against the q8_0 oracle"
        );
    }
}
