//! The ops the model families added to the backend seam (sliding-window attention, GeGLU,
//! bias add, per-head RMSNorm, scale, soft-cap), CPU backend against the scalar reference on
//! awkward sizes, on 1 and 3 threads and both cache types.

mod common;

use common::{act, vals};
use damascus_kernels::reference::AttnShape;
use damascus_model::KvCacheType;
use damascus_model::backend::cpu::CpuBackend;
use damascus_model::backend::reference::{HostAct, ReferenceBackend};
use damascus_model::backend::{AttnSpec, Backend, KvShape};

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs a prompt of `chunks` (token counts) through `layer`'s attention on `b`, returning
/// every chunk's output concatenated.
fn run_attention<B>(b: &B, spec: AttnSpec, chunks: &[usize], cache: KvCacheType) -> Vec<f32>
where
    B: Backend<Act = HostAct>,
{
    let AttnShape {
        n_head,
        n_head_kv,
        head_dim,
    } = spec.shape;
    let n_ctx: usize = chunks.iter().sum::<usize>() + 3;
    let mut kv = b
        .new_kv_cache(KvShape {
            n_layer: 2,
            n_ctx,
            n_head_kv,
            head_dim,
            cache_type: cache,
        })
        .unwrap();
    let mut pos0 = 0;
    let mut all = Vec::new();
    for (i, &n) in chunks.iter().enumerate() {
        let seed = 100 * i as u64;
        let q = act(n, n_head * head_dim, seed + 1);
        let k = act(n, n_head_kv * head_dim, seed + 2);
        let v = act(n, n_head_kv * head_dim, seed + 3);
        let mut out = act(n, n_head * head_dim, 0);
        b.attention(&mut kv, 1, spec, pos0, &q, &k, &v, &mut out)
            .unwrap();
        all.extend_from_slice(&out.data);
        pos0 += n;
    }
    all
}

#[test]
fn windowed_attention_matches_reference() {
    let shapes = [
        (4, 2, 64),  // the flash prompt kernel's head size
        (3, 1, 16),  // the generic per-token path
        (8, 8, 128), // MHA
    ];
    let chunk_sets: [&[usize]; 5] = [&[1], &[3, 1, 1], &[7], &[33, 1, 2], &[40, 1]];
    for (n_head, n_head_kv, head_dim) in shapes {
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim,
        };
        for window in [None, Some(1), Some(5), Some(16), Some(1023)] {
            let spec = AttnSpec { shape, window };
            for chunks in chunk_sets {
                for cache in [KvCacheType::F32, KvCacheType::F16] {
                    let want = run_attention(&ReferenceBackend, spec, chunks, cache);
                    for threads in [1, 3] {
                        let cpu = CpuBackend::new(Some(threads));
                        let got = run_attention(&cpu, spec, chunks, cache);
                        let d = max_diff(&got, &want);
                        assert!(
                            d < 2e-4,
                            "{shape:?} window {window:?} chunks {chunks:?} {cache:?} {threads} \
                             threads: max diff {d}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn window_of_one_returns_each_tokens_own_value() {
    // With a window of 1 every query sees only itself: the output is its own V row.
    let shape = AttnShape {
        n_head: 2,
        n_head_kv: 1,
        head_dim: 16,
    };
    let spec = AttnSpec {
        shape,
        window: Some(1),
    };
    let got = run_attention(&CpuBackend::new(Some(2)), spec, &[7], KvCacheType::F32);
    let v = act(7, 16, 3);
    for t in 0..7 {
        for h in 0..2 {
            let o = &got[(t * 2 + h) * 16..][..16];
            assert!(
                max_diff(o, &v.data[t * 16..][..16]) < 1e-6,
                "token {t} head {h}"
            );
        }
    }
}

#[test]
fn elementwise_family_ops_match_reference() {
    let r = ReferenceBackend;
    for threads in [1, 3] {
        let c = CpuBackend::new(Some(threads));
        for (n, width) in [(1, 3), (3, 7), (7, 33), (2, 1023), (33, 64)] {
            // GeGLU.
            let up = act(n, width, 7);
            let (mut g1, mut g2) = (act(n, width, 8), act(n, width, 8));
            for g in [&mut g1, &mut g2] {
                g.data.iter_mut().for_each(|x| *x *= 6.0);
            }
            r.geglu(&mut g1, &up).unwrap();
            c.geglu(&mut g2, &up).unwrap();
            assert!(max_diff(&g1.data, &g2.data) < 1e-5, "geglu {n}x{width}");
            // Bias add.
            let bias = vals(width, 9);
            let (mut x1, mut x2) = (act(n, width, 10), act(n, width, 10));
            r.add_bias(&mut x1, &bias).unwrap();
            c.add_bias(&mut x2, &bias).unwrap();
            assert_eq!(x1.data, x2.data, "bias {n}x{width}");
            assert_eq!(
                x1.data[width - 1],
                act(n, width, 10).data[width - 1] + bias[width - 1]
            );
            // Scale and soft-cap.
            r.scale(&mut x1, 3.5).unwrap();
            c.scale(&mut x2, 3.5).unwrap();
            r.softcap(&mut x1, 2.0).unwrap();
            c.softcap(&mut x2, 2.0).unwrap();
            assert_eq!(x1.data, x2.data, "scale+softcap {n}x{width}");
            assert!(x1.data.iter().all(|v| v.abs() <= 2.0));
        }
        // Per-head RMSNorm: every head normalised on its own.
        for (n, heads, hd) in [(1, 1, 16), (3, 4, 64), (7, 3, 256)] {
            let w = vals(hd, 11);
            let (mut x1, mut x2) = (act(n, heads * hd, 12), act(n, heads * hd, 12));
            r.rms_norm_heads(&mut x1, &w, 1e-6, hd).unwrap();
            c.rms_norm_heads(&mut x2, &w, 1e-6, hd).unwrap();
            assert_eq!(x1.data, x2.data);
            // The last head of the last token, normalised on its own.
            let x0 = act(n, heads * hd, 12);
            let at = x0.data.len() - hd;
            let head = &x0.data[at..];
            let rms = (head.iter().map(|v| v * v).sum::<f32>() / hd as f32 + 1e-6).sqrt();
            assert!((x1.data[at] - head[0] / rms * w[0]).abs() < 1e-5);
        }
        let mut bad = act(2, 30, 1);
        assert!(c.rms_norm_heads(&mut bad, &vals(16, 1), 1e-6, 16).is_err());
        assert!(c.add_bias(&mut bad, &vals(29, 1)).is_err());
    }
}
