//! Issue 29 A6: prompt-lookup speculative decoding gives exactly the tokens of plain greedy
//! decoding — same ids, text, stop reason and the same KV cache afterwards — on the real
//! default model (SmolLM2-135M Instruct Q4_1), for several prompts including a code edit,
//! several drafter settings, and every way a generation ends (end of generation, token
//! budget, stop string, full context).

use std::path::PathBuf;

use damascus_model::{LoadOptions, Model};
use damascus_runtime::generate::{Completion, GenerateConfig, Generator, StopReason};
use damascus_runtime::lookup::{DraftConfig, MAX_DRAFT};
use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::{ChatTemplate, Tokenizer};

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DAMASCUS_TEST_MODEL") {
        return p.into();
    }
    damascus_hub::default_model_path().expect("default model")
}

fn load(n_ctx: usize) -> (Model, Tokenizer) {
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        ..Default::default()
    };
    let model = Model::load(model_path(), &opts).expect("load model");
    let tok = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    (model, tok)
}

fn greedy() -> SamplerChain {
    SamplerChain::from_config(&SamplerConfig::greedy()).expect("greedy chain")
}

const CODE_EDIT: &str = "Rewrite this function with the variable `x` renamed to `value`. \
Reply with the full code only.

```python
def normalize(x, lo, hi):
    if hi <= lo:
        raise ValueError(\"empty range\")
    x = max(lo, min(hi, x))
    span = hi - lo
    x = (x - lo) / span
    return round(x, 6)

def normalize_all(items, lo, hi):
    out = []
    for x in items:
        out.append(normalize(x, lo, hi))
    return out
```";

/// `text` as one user message through the model's chat template.
fn chat_prompt(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let t = ChatTemplate::from_tokenizer(tok).expect("the default model has a template");
    let messages = serde_json::json!([{"role": "user", "content": text}]);
    let rendered = t.render(&messages, true, None).expect("render");
    tok.encode(&rendered, false, true)
}

/// Generates on a fresh sequence; returns the completion and the cached ids afterwards.
fn gen_with(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    cfg: GenerateConfig,
    sampler: SamplerChain,
) -> (Completion, Vec<u32>) {
    let mut seq = Sequence::new(model.session().unwrap());
    let g = Generator::new(&mut seq, tok, cfg, sampler, prompt);
    let c = g.run(|_| {}).expect("generate");
    (c, seq.tokens().to_vec())
}

fn generate(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    cfg: &GenerateConfig,
    draft: Option<DraftConfig>,
) -> (Completion, Vec<u32>) {
    let cfg = GenerateConfig {
        draft,
        ..cfg.clone()
    };
    gen_with(model, tok, prompt, cfg, greedy())
}

fn drafts() -> [DraftConfig; 3] {
    [
        DraftConfig::default(),
        DraftConfig {
            ngram_max: 1,
            ngram_min: 1,
            max_draft: MAX_DRAFT,
        },
        DraftConfig {
            ngram_max: 4,
            ngram_min: 2,
            max_draft: 3,
        },
    ]
}

/// Plain and drafted generations agree in everything but the timings.
fn assert_same(plain: &(Completion, Vec<u32>), spec: &(Completion, Vec<u32>), what: &str) {
    assert_eq!(spec.0.ids, plain.0.ids, "{what}: ids");
    assert_eq!(spec.0.text, plain.0.text, "{what}: text");
    assert_eq!(spec.0.reason, plain.0.reason, "{what}: stop reason");
    assert_eq!(spec.1, plain.1, "{what}: the cached ids afterwards");
    assert!(plain.0.timings.draft.is_none());
    assert!(spec.0.timings.draft.is_some(), "{what}: drafting ran");
}

#[test]
fn drafted_greedy_output_is_plain_greedy_output() {
    let (model, tok) = load(1024);
    let prompts = [
        chat_prompt(&tok, CODE_EDIT),
        tok.encode(CODE_EDIT, true, false),
        chat_prompt(
            &tok,
            "List the days of the week, then list them again in reverse.",
        ),
        tok.encode("The capital of France is", true, false),
        tok.encode("a b a b a b a b", true, false),
    ];
    let cfg = GenerateConfig {
        max_tokens: Some(120),
        ..Default::default()
    };
    for (i, prompt) in prompts.iter().enumerate() {
        let plain = generate(&model, &tok, prompt, &cfg, None);
        for d in drafts() {
            let spec = generate(&model, &tok, prompt, &cfg, Some(d));
            assert_same(&plain, &spec, &format!("prompt {i}, {d:?}"));
        }
    }
    // The code edit copies most of its prompt: drafts are accepted, and it generates 64+
    // tokens (it ends in end-of-generation).
    let prompt = &prompts[0];
    let (c, _) = generate(&model, &tok, prompt, &cfg, Some(DraftConfig::default()));
    let st = c.timings.draft.unwrap();
    assert!(
        c.ids.len() >= 64,
        "the code edit generated {} tokens",
        c.ids.len()
    );
    assert_eq!(c.reason, StopReason::Eog);
    assert!(st.accepted > 20, "{st:?}");
    assert!(st.accepted <= st.drafted && st.passes > 0, "{st:?}");
}

#[test]
fn every_way_to_stop_matches_plain_decoding() {
    let (model, tok) = load(1024);
    let prompt = chat_prompt(&tok, CODE_EDIT);
    // Token budgets that end inside a verify pass.
    for n in [0, 1, 2, 5, 7, 23] {
        let cfg = GenerateConfig {
            max_tokens: Some(n),
            ..Default::default()
        };
        let plain = generate(&model, &tok, &prompt, &cfg, None);
        assert_eq!(plain.0.ids.len(), n);
        for d in drafts() {
            let spec = generate(&model, &tok, &prompt, &cfg, Some(d));
            assert_same(&plain, &spec, &format!("-n {n}, {d:?}"));
        }
    }
    // Stop strings that appear in the middle of accepted drafts.
    let full = generate(
        &model,
        &tok,
        &prompt,
        &GenerateConfig {
            max_tokens: Some(120),
            ..Default::default()
        },
        None,
    );
    for stop in ["span", "min(hi", "round"] {
        assert!(full.0.text.contains(stop), "{stop:?} in {:?}", full.0.text);
        let cfg = GenerateConfig {
            max_tokens: Some(120),
            stop: vec![stop.to_string()],
            ..Default::default()
        };
        let plain = generate(&model, &tok, &prompt, &cfg, None);
        assert_eq!(plain.0.reason, StopReason::StopString(stop.to_string()));
        for d in drafts() {
            let spec = generate(&model, &tok, &prompt, &cfg, Some(d));
            assert_same(&plain, &spec, &format!("stop {stop:?}, {d:?}"));
        }
    }
    // A context that fills up while drafts are pending (the drafts are cut to the room left).
    for extra in [1, 2, 9, 30] {
        let (small, tok) = load(prompt.len() + extra);
        let cfg = GenerateConfig {
            max_tokens: None,
            ignore_eos: true,
            ..Default::default()
        };
        let plain = generate(&small, &tok, &prompt, &cfg, None);
        assert_eq!(plain.0.reason, StopReason::ContextFull);
        for d in drafts() {
            let spec = generate(&small, &tok, &prompt, &cfg, Some(d));
            assert_same(&plain, &spec, &format!("context +{extra}, {d:?}"));
        }
    }
}

#[test]
fn a_sequence_reused_after_drafting_continues_like_plain_decoding() {
    let (model, tok) = load(1024);
    let prompt = chat_prompt(&tok, CODE_EDIT);
    let cfg = GenerateConfig {
        max_tokens: Some(40),
        ..Default::default()
    };
    // Two generations on one sequence (the second over the first's cache, as a chat turn).
    let run_twice = |draft: Option<DraftConfig>| {
        let mut seq = Sequence::new(model.session().unwrap());
        let cfg = GenerateConfig {
            draft,
            ..cfg.clone()
        };
        let first = Generator::new(&mut seq, &tok, cfg.clone(), greedy(), &prompt)
            .run(|_| {})
            .unwrap();
        let mut next = prompt.clone();
        next.extend(&first.ids);
        next.extend(tok.encode("\nAgain:", false, false));
        let second = Generator::new(&mut seq, &tok, cfg, greedy(), &next)
            .run(|_| {})
            .unwrap();
        (first.ids, second.ids, second.timings.prompt_cached)
    };
    let plain = run_twice(None);
    let spec = run_twice(Some(DraftConfig::default()));
    assert_eq!(spec, plain);
}

#[test]
fn drafting_stays_off_where_it_cannot_match_plain_decoding() {
    let (model, tok) = load(512);
    let prompt = chat_prompt(&tok, CODE_EDIT);
    let sampled = || {
        SamplerChain::from_config(&SamplerConfig {
            temp: 0.8,
            seed: Some(7),
            ..SamplerConfig::default()
        })
        .unwrap()
    };
    let cfg = GenerateConfig {
        max_tokens: Some(24),
        ..Default::default()
    };
    let with = GenerateConfig {
        draft: Some(DraftConfig::default()),
        ..cfg.clone()
    };
    let mut seq = Sequence::new(model.session().unwrap());
    let g = Generator::new(&mut seq, &tok, with.clone(), sampled(), &prompt);
    assert!(g.draft_off_reason().is_some());
    let spec = g.run(|_| {}).unwrap();
    assert!(spec.timings.draft.is_none());
    let plain = gen_with(&model, &tok, &prompt, cfg, sampled());
    assert_eq!(spec.ids, plain.0.ids);
    // Logprobs need every row's logits: off too.
    let lp = GenerateConfig {
        logprobs: true,
        ..with
    };
    let mut seq = Sequence::new(model.session().unwrap());
    let g = Generator::new(&mut seq, &tok, lp, greedy(), &prompt);
    assert!(g.draft_off_reason().is_some());
}
