//! Property-style tests of the sampler stages and chain: seeded loops over random logits (our
//! own RNG, no proptest dependency).

use super::*;
use crate::RuntimeError;

/// Random logits: [n] f32 in roughly [-scale, scale], with occasional duplicates.
fn random_logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|_| (rng.next_f32() * 2.0 - 1.0) * scale)
        .collect();
    if n > 3 && rng.below(4) == 0 {
        v[1] = v[0]; // exercise ties
    }
    v
}

/// Softmax of raw logits in f64: [n] probabilities.
fn softmax64(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn apply(stage: &mut dyn Stage, logits: &[f32]) -> Candidates {
    let mut c = Candidates::from_logits(logits);
    stage.apply(&mut c);
    c
}

fn ids(c: &Candidates) -> Vec<u32> {
    let mut v: Vec<u32> = c.data.iter().map(|d| d.id).collect();
    v.sort_unstable();
    v
}

#[test]
fn top_k_keeps_the_k_largest() {
    let mut rng = Rng::new(1);
    for _ in 0..300 {
        let n = 1 + rng.below(300) as usize;
        let k = 1 + rng.below(400) as usize;
        let logits = random_logits(&mut rng, n, 10.0);
        let c = apply(&mut TopK::new(k), &logits);
        assert_eq!(c.len(), k.min(n));
        assert!(c.sorted);
        assert!(c.data.windows(2).all(|w| w[0].logit >= w[1].logit));
        let min_kept = c.data.last().unwrap().logit;
        let kept = ids(&c);
        for (i, &l) in logits.iter().enumerate() {
            if kept.binary_search(&(i as u32)).is_err() {
                assert!(l <= min_kept, "dropped {l} > kept {min_kept}");
            }
        }
    }
    // k = 0 disables.
    assert_eq!(apply(&mut TopK::new(0), &[1.0, 2.0, 3.0]).len(), 3);
}

#[test]
fn top_p_keeps_smallest_set_reaching_p() {
    let mut rng = Rng::new(2);
    for iter in 0..300 {
        // Some lists above 1024 to exercise the partial-sort fast path.
        let n = if iter % 5 == 0 {
            1025 + rng.below(2000) as usize
        } else {
            1 + rng.below(200) as usize
        };
        let scale = [0.5f32, 3.0, 15.0][iter % 3];
        let p = 0.05 + 0.9 * rng.next_f32();
        let logits = random_logits(&mut rng, n, scale);
        let probs = softmax64(&logits);
        let c = apply(&mut TopP::new(p, 0), &logits);
        assert!(c.sorted && !c.is_empty());
        let kept: Vec<f64> = c.data.iter().map(|d| probs[d.id as usize]).collect();
        let total: f64 = kept.iter().sum();
        let without_last = total - kept[kept.len() - 1];
        assert!(total >= f64::from(p) - 1e-4, "kept mass {total} < p {p}");
        assert!(
            without_last < f64::from(p) + 1e-4,
            "not minimal: {without_last} already reaches {p}"
        );
        // The kept set is the most probable tokens.
        let min_kept = kept.iter().cloned().fold(f64::INFINITY, f64::min);
        let kept_ids = ids(&c);
        for (i, &q) in probs.iter().enumerate() {
            if kept_ids.binary_search(&(i as u32)).is_err() {
                assert!(q <= min_kept + 1e-12);
            }
        }
    }
    // p = 1 disables; min_keep is honoured.
    assert_eq!(apply(&mut TopP::new(1.0, 0), &[0.0, 1.0]).len(), 2);
    assert_eq!(
        apply(&mut TopP::new(0.1, 3), &[9.0, 1.0, 0.0, -1.0]).len(),
        3
    );
}

#[test]
fn min_p_drops_tokens_below_p_times_max() {
    let mut rng = Rng::new(3);
    for _ in 0..300 {
        let n = 1 + rng.below(300) as usize;
        let p = rng.next_f32() * 0.9 + 0.01;
        let logits = random_logits(&mut rng, n, 5.0);
        let probs = softmax64(&logits);
        let pmax = probs.iter().cloned().fold(0.0, f64::max);
        let c = apply(&mut MinP::new(p, 0), &logits);
        let kept = ids(&c);
        for (i, &q) in probs.iter().enumerate() {
            let ratio = q / (pmax * f64::from(p));
            let is_kept = kept.binary_search(&(i as u32)).is_ok();
            // Skip values within rounding of the threshold.
            if ratio > 1.0 + 1e-4 {
                assert!(is_kept, "token {i} with p={q} dropped (pmax={pmax}, p={p})");
            } else if ratio < 1.0 - 1e-4 {
                assert!(!is_kept, "token {i} with p={q} kept (pmax={pmax}, p={p})");
            }
        }
    }
    // min_keep forces the top tokens in.
    let c = apply(&mut MinP::new(0.9, 2), &[10.0, 0.0, 5.0]);
    assert_eq!(ids(&c), vec![0, 2]);
}

#[test]
fn typical_p_keeps_most_typical_mass() {
    let mut rng = Rng::new(4);
    for _ in 0..200 {
        let n = 2 + rng.below(100) as usize;
        let p = 0.05 + 0.9 * rng.next_f32();
        let logits = random_logits(&mut rng, n, 4.0);
        let probs = softmax64(&logits);
        let entropy: f64 = probs.iter().map(|&q| -q * q.ln()).sum();
        let score = |i: usize| (-probs[i].ln() - entropy).abs();
        let c = apply(&mut TypicalP::new(p, 0), &logits);
        assert!(!c.is_empty());
        // Kept in order of typicality.
        let order: Vec<usize> = c.data.iter().map(|d| d.id as usize).collect();
        assert!(order.windows(2).all(|w| score(w[0]) <= score(w[1]) + 1e-4));
        // Mass just exceeds p.
        let kept: f64 = order.iter().map(|&i| probs[i]).sum();
        let without_last = kept - probs[*order.last().unwrap()];
        assert!(kept > f64::from(p) - 1e-4);
        assert!(without_last <= f64::from(p) + 1e-4);
        // Every dropped token is at least as atypical as the last kept one.
        let worst = score(*order.last().unwrap());
        for i in 0..n {
            if !order.contains(&i) {
                assert!(score(i) >= worst - 1e-4);
            }
        }
    }
    // Uniform distribution: every token equally typical, keep ceil-ish p * n.
    let c = apply(&mut TypicalP::new(0.5, 0), &[1.0; 10]);
    assert_eq!(c.len(), 6); // mass must exceed 0.5 strictly (0.6 > 0.5 ≥ 0.5)
    assert_eq!(apply(&mut TypicalP::new(1.0, 0), &[1.0, 2.0]).len(), 2);
}

#[test]
fn penalties_change_only_seen_tokens() {
    let mut rng = Rng::new(5);
    for _ in 0..200 {
        let n = 10 + rng.below(200) as usize;
        let last_n = 1 + rng.below(20) as usize;
        let repeat = 0.5 + 1.5 * rng.next_f32();
        let freq = rng.next_f32();
        let pres = rng.next_f32();
        let mut pen = Penalties::new(last_n, repeat, freq, pres);
        let history: Vec<u32> = (0..rng.below(40))
            .map(|_| rng.below(n as u64) as u32)
            .collect();
        for &t in &history {
            pen.accept(t);
        }
        let window = &history[history.len().saturating_sub(last_n)..];
        let logits = random_logits(&mut rng, n, 5.0);
        let c = apply(&mut pen, &logits);
        assert_eq!(c.len(), n);
        for d in &c.data {
            let l = logits[d.id as usize];
            let count = window.iter().filter(|&&t| t == d.id).count();
            assert_eq!(pen.count(d.id), count);
            if count == 0 {
                assert_eq!(d.logit, l, "unseen token {} changed", d.id);
            } else {
                let r = if l <= 0.0 { l * repeat } else { l / repeat };
                let want = r - count as f32 * freq - pres;
                assert!((d.logit - want).abs() < 1e-5, "{} vs {want}", d.logit);
            }
        }
    }
    // A repetition penalty > 1 always makes a seen token less likely.
    let mut pen = Penalties::new(64, 1.3, 0.0, 0.0);
    pen.accept(0);
    pen.accept(1);
    let c = apply(&mut pen, &[2.0, -2.0, 0.5]);
    assert!(c.data[0].logit < 2.0 && c.data[1].logit < -2.0 && c.data[2].logit == 0.5);
    pen.reset();
    assert_eq!(pen.count(0), 0);
    assert!(Penalties::new(0, 1.3, 0.0, 0.0).is_disabled());
    assert!(Penalties::new(64, 1.0, 0.0, 0.0).is_disabled());
}

#[test]
fn penalties_work_after_reordering_stages() {
    // Penalties placed after top-k see sorted, truncated candidates.
    let cfg = SamplerConfig {
        temp: 0.0,
        repeat_penalty: 100.0,
        order: SamplerKind::parse_order("top_k;penalties").unwrap(),
        ..SamplerConfig::default()
    };
    let mut chain = SamplerChain::from_config(&cfg).unwrap();
    chain.accept(2);
    assert_eq!(chain.sample(&[1.0, 3.0, 5.0, 4.0]).unwrap(), 3);
}

#[test]
fn temperature_zero_is_argmax() {
    let mut rng = Rng::new(6);
    let mut chain = SamplerChain::from_config(&SamplerConfig::greedy()).unwrap();
    assert_eq!(chain.describe(), "greedy");
    assert_eq!(chain.seed(), None);
    for _ in 0..200 {
        let n = 1 + rng.below(500) as usize;
        let logits = random_logits(&mut rng, n, 8.0);
        let want = Candidates::from_logits(&logits).argmax().unwrap() as u32;
        // First max wins ties, like torch.argmax.
        let first_max = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &l)| if l > b.1 { (i, l) } else { b },
            )
            .0 as u32;
        assert_eq!(want, first_max);
        assert_eq!(chain.sample_and_accept(&logits).unwrap(), want);
        // The Temperature stage itself at 0 leaves only the argmax for a random draw.
        let mut manual = SamplerChain::new();
        manual.push(Temperature::new(0.0));
        manual.push(Dist::new(rng.next_u64()));
        assert_eq!(manual.sample(&logits).unwrap(), want);
    }
}

#[test]
fn same_seed_same_tokens() {
    let cfg = SamplerConfig {
        seed: Some(1234),
        temp: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let run = |cfg: &SamplerConfig| {
        let mut chain = SamplerChain::from_config(cfg).unwrap();
        let mut rng = Rng::new(77); // same logits stream for every run
        (0..300)
            .map(|_| {
                let logits = random_logits(&mut rng, 64, 2.0);
                chain.sample_and_accept(&logits).unwrap()
            })
            .collect::<Vec<u32>>()
    };
    let a = run(&cfg);
    assert_eq!(a, run(&cfg));
    let other = run(&SamplerConfig {
        seed: Some(1235),
        ..cfg.clone()
    });
    assert_ne!(a, other);
    // Reset brings the RNG and penalty window back to the start.
    let mut chain = SamplerChain::from_config(&cfg).unwrap();
    let logits = [0.0f32; 64];
    let first: Vec<u32> = (0..20)
        .map(|_| chain.sample_and_accept(&logits).unwrap())
        .collect();
    chain.reset();
    let again: Vec<u32> = (0..20)
        .map(|_| chain.sample_and_accept(&logits).unwrap())
        .collect();
    assert_eq!(first, again);
    assert_eq!(chain.seed(), Some(1234));
}

#[test]
fn random_seed_is_reported_and_replayable() {
    let mut chain = SamplerChain::from_config(&SamplerConfig::default()).unwrap();
    let seed = chain.seed().unwrap();
    let mut replay = SamplerChain::from_config(&SamplerConfig {
        seed: Some(seed),
        ..SamplerConfig::default()
    })
    .unwrap();
    let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
    for _ in 0..50 {
        assert_eq!(
            chain.sample_and_accept(&logits).unwrap(),
            replay.sample_and_accept(&logits).unwrap()
        );
    }
}

#[test]
fn dist_follows_the_softmax() {
    let logits = [0.0f32, 1.0, 2.0, -1.0];
    let probs = softmax64(&logits);
    let mut d = Dist::new(9);
    let mut counts = [0usize; 4];
    let trials = 40_000;
    for _ in 0..trials {
        let c = apply(&mut d, &logits);
        counts[c.selected_token().unwrap() as usize] += 1;
    }
    for i in 0..4 {
        let f = counts[i] as f64 / trials as f64;
        assert!(
            (f - probs[i]).abs() < 0.01,
            "token {i}: {f} vs {}",
            probs[i]
        );
    }
}

#[test]
fn nan_and_inf_logits_never_panic() {
    let mut chain = SamplerChain::from_config(&SamplerConfig {
        seed: Some(3),
        typical_p: 0.9,
        ..SamplerConfig::default()
    })
    .unwrap();
    let logits = [f32::NAN, 1.0, f32::NEG_INFINITY, 0.5];
    for _ in 0..50 {
        let t = chain.sample(&logits).unwrap();
        assert!(t == 1 || t == 3, "picked {t}");
    }
    assert_eq!(chain.sample(&[0.0, f32::INFINITY, 3.0]).unwrap(), 1);
    let all_inf = [f32::NEG_INFINITY; 5];
    assert!(chain.sample(&all_inf).unwrap() < 5);
    let mut greedy = SamplerChain::from_config(&SamplerConfig::greedy()).unwrap();
    assert_eq!(greedy.sample(&[f32::NAN, 0.0, f32::NAN]).unwrap(), 1);
    assert!(matches!(chain.sample(&[]), Err(RuntimeError::EmptyLogits)));
}

#[test]
fn logit_bias_bans_and_boosts() {
    let cfg = SamplerConfig {
        temp: 0.0,
        logit_bias: vec![(2, f32::NEG_INFINITY), (0, 2.5), (99, 1.0)],
        ..SamplerConfig::default()
    };
    let mut chain = SamplerChain::from_config(&cfg).unwrap();
    assert_eq!(chain.sample(&[1.0, 3.0, 9.0]).unwrap(), 0);
}

#[test]
fn default_chain_matches_llama_cpp_order() {
    let cfg = SamplerConfig {
        seed: Some(0),
        ..SamplerConfig::default()
    };
    let chain = SamplerChain::from_config(&cfg).unwrap();
    // penalties (repeat 1.0) and typical (1.0) are disabled at the defaults.
    assert_eq!(
        chain.describe(),
        "top_k -> top_p -> min_p -> temperature -> dist"
    );
    let chain = SamplerChain::from_config(&SamplerConfig {
        repeat_penalty: 1.1,
        typical_p: 0.9,
        ..cfg
    })
    .unwrap();
    assert_eq!(
        chain.describe(),
        "penalties -> top_k -> typ_p -> top_p -> min_p -> temperature -> dist"
    );
    assert_eq!(
        SamplerKind::order_to_string(&DEFAULT_ORDER),
        "penalties;top_k;typ_p;top_p;min_p;temperature"
    );
}

#[test]
fn order_parsing() {
    use SamplerKind::*;
    assert_eq!(
        SamplerKind::parse_order("penalties;top_k;typ_p;top_p;min_p;temperature").unwrap(),
        DEFAULT_ORDER.to_vec()
    );
    assert_eq!(
        SamplerKind::parse_order(" Top-K ; nucleus;minp,temp ;typical ").unwrap(),
        vec![TopK, TopP, MinP, Temperature, TypicalP]
    );
    assert_eq!(SamplerKind::parse_order("").unwrap(), vec![]);
    assert_eq!(
        SamplerKind::parse_codes("ekypmt").unwrap(),
        DEFAULT_ORDER.to_vec()
    );

    let e = SamplerKind::parse_order("top_k;bogus").unwrap_err();
    assert!(matches!(&e, RuntimeError::UnknownSampler { name, .. } if name == "bogus"));
    assert!(e.to_string().contains("top_k"), "{e}");

    // llama.cpp's full default string names stages we do not implement.
    let e = SamplerKind::parse_order(
        "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
    )
    .unwrap_err();
    assert!(matches!(&e, RuntimeError::UnsupportedSampler { name, .. } if name == "dry"));
    assert!(matches!(
        SamplerKind::parse_codes("kx"),
        Err(RuntimeError::UnsupportedSampler { .. })
    ));
    assert!(matches!(
        SamplerKind::parse_codes("kz"),
        Err(RuntimeError::UnknownSampler { .. })
    ));
}

#[test]
fn config_validation() {
    let bad = [
        SamplerConfig {
            top_p: 1.5,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            min_p: -0.1,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temp: f32::NAN,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            repeat_penalty: 0.0,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            logit_bias: vec![(1, f32::NAN)],
            ..SamplerConfig::default()
        },
    ];
    for cfg in &bad {
        let e = SamplerChain::from_config(cfg).unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidSamplerParam { .. }), "{e}");
    }
    assert!(SamplerConfig::default().validate().is_ok());
    let d = SamplerConfig::default();
    assert_eq!(
        (
            d.temp,
            d.top_k,
            d.top_p,
            d.min_p,
            d.typical_p,
            d.repeat_penalty,
            d.repeat_last_n
        ),
        (0.8, 40, 0.95, 0.05, 1.0, 1.0, 64)
    );
}

#[test]
fn chain_without_final_stage_falls_back_to_greedy() {
    let mut chain = SamplerChain::new();
    chain.push(TopK::new(2));
    assert_eq!(chain.sample(&[0.0, 5.0, 1.0]).unwrap(), 1);
    assert_eq!(chain.candidates().len(), 2);
}
