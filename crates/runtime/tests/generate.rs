//! Generation loop, KV-cache reuse and context shift on the real default model (SmolLM2-135M
//! Instruct Q4_1): `$DAMASCUS_TEST_MODEL`, else `/tmp/dev/...` when present, else the hub's
//! default model (pulled on first use).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use damascus_model::{BackendKind, LoadOptions, Model};
use damascus_runtime::chat::{Chat, ChatConfig};
use damascus_runtime::generate::{Completion, Event, GenerateConfig, Generator, StopReason};
use damascus_runtime::sampler::{SamplerChain, SamplerConfig};
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("DAMASCUS_TEST_MODEL") {
        return p.into();
    }
    let dev = PathBuf::from("/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf");
    if dev.exists() {
        return dev;
    }
    damascus_hub::default_model_path().expect("default model")
}

fn load(n_ctx: usize) -> (Model, Tokenizer) {
    load_on(n_ctx, BackendKind::Auto)
}

fn load_on(n_ctx: usize, backend: BackendKind) -> (Model, Tokenizer) {
    let opts = LoadOptions {
        n_ctx: Some(n_ctx),
        backend,
        ..Default::default()
    };
    let model = Model::load(model_path(), &opts).expect("load model");
    let tok = Tokenizer::from_gguf(model.gguf()).expect("tokenizer");
    (model, tok)
}

fn greedy() -> SamplerChain {
    SamplerChain::from_config(&SamplerConfig::greedy()).expect("greedy chain")
}

fn run(g: Generator<'_>) -> (Completion, String) {
    let mut streamed = String::new();
    let c = g.run(|t| streamed.push_str(&t.text)).expect("generate");
    streamed.push_str(&c.tail);
    (c, streamed)
}

#[test]
fn generator_events_stops_and_cancel() {
    let (model, tok) = load(256);
    let mut seq = Sequence::new(model.session().unwrap());
    let prompt = tok.encode("The capital of France is", true, false);

    // Budget: exactly n tokens, streamed text equals the completion text.
    let cfg = GenerateConfig {
        max_tokens: Some(6),
        logprobs: true,
        top_logprobs: 3,
        ..Default::default()
    };
    let mut g = Generator::new(&mut seq, &tok, cfg, greedy(), &prompt);
    let mut tokens = Vec::new();
    let done = loop {
        match g.next().expect("event").expect("ok") {
            Event::Token(t) => tokens.push(t),
            Event::Done(c) => break c,
        }
    };
    assert!(g.next().is_none(), "nothing after Done");
    assert_eq!(done.reason, StopReason::MaxTokens);
    assert_eq!(done.ids.len(), 6);
    assert!(done.text.starts_with(" Paris."), "{:?}", done.text);
    for t in &tokens {
        let lp = t.logprob.expect("logprob");
        assert!(lp <= 0.0);
        // Greedy picks the most likely token.
        assert_eq!(t.top_logprobs[0].id, t.id);
    }
    assert_eq!(done.timings.prompt_tokens, prompt.len());
    assert_eq!(done.timings.prompt_evaluated, prompt.len());
    assert_eq!(done.timings.generated_tokens, 6);
    // The last sampled token is not evaluated.
    assert_eq!(seq.n_past(), prompt.len() + 5);

    // Same prompt again: everything but the last prompt token is reused.
    let cfg = GenerateConfig {
        max_tokens: Some(32),
        stop: vec!["\n\n".into()],
        ..Default::default()
    };
    let (c, streamed) = run(Generator::new(&mut seq, &tok, cfg, greedy(), &prompt));
    assert_eq!(c.reason, StopReason::StopString("\n\n".into()));
    assert_eq!(c.text, " Paris.");
    assert_eq!(streamed, c.text);
    assert_eq!(c.timings.prompt_cached, prompt.len() - 1);
    assert_eq!(c.timings.prompt_evaluated, 1);

    // Zero budget and a raised cancel flag both end at once.
    let cfg = GenerateConfig {
        max_tokens: Some(0),
        ..Default::default()
    };
    let (c, _) = run(Generator::new(&mut seq, &tok, cfg, greedy(), &prompt));
    assert_eq!(c.reason, StopReason::MaxTokens);
    assert!(c.ids.is_empty());
    let cfg = GenerateConfig {
        cancel: Some(Arc::new(AtomicBool::new(true))),
        ..Default::default()
    };
    let (c, _) = run(Generator::new(&mut seq, &tok, cfg, greedy(), &prompt));
    assert_eq!(c.reason, StopReason::Cancelled);

    // A prompt longer than the context is an error, not a panic.
    let long = vec![prompt[0]; 300];
    let mut g = Generator::new(&mut seq, &tok, GenerateConfig::default(), greedy(), &long);
    assert!(g.step().is_err());
}

#[test]
fn context_full_stops_generation() {
    let (model, tok) = load(12);
    let mut seq = Sequence::new(model.session().unwrap());
    let prompt = tok.encode("The capital of France is", true, false);
    let cfg = GenerateConfig {
        ignore_eos: true,
        ..Default::default()
    };
    let (c, _) = run(Generator::new(&mut seq, &tok, cfg, greedy(), &prompt));
    assert_eq!(c.reason, StopReason::ContextFull);
    assert_eq!(seq.n_past(), 12);
    assert_eq!(c.ids.len(), 12 - prompt.len() + 1);
}

#[test]
fn chat_turn_two_prefills_only_its_tokens_and_context_shift() {
    // The reference path pins the replies' content (the fast path may drift).
    let (model, tok) = load_on(2048, BackendKind::Reference);
    let seq = Sequence::new(model.session().unwrap());
    let cfg = ChatConfig {
        system: Some("You are a terse assistant.".into()),
        context_shift: false,
    };
    let mut chat = Chat::new(seq, &tok, cfg).expect("chat template");
    let gen_cfg = || GenerateConfig {
        max_tokens: Some(16),
        ..Default::default()
    };

    let turn1 = chat
        .user_turn(&tok, "What is the capital of France?", 16)
        .unwrap();
    let (c1, _) = run(chat.generator(&tok, gen_cfg(), greedy(), &turn1));
    assert!(c1.text.contains("Paris"), "{:?}", c1.text);
    assert_eq!(c1.timings.prompt_evaluated, turn1.prompt.len());
    chat.push_assistant(c1.text.clone());
    let cached = chat.sequence().n_past();
    assert_eq!(cached, turn1.prompt.len() + c1.ids.len() - 1);

    let turn2 = chat.user_turn(&tok, "And of Germany?", 16).unwrap();
    // The new prompt extends what is cached: history, then only the new turn.
    assert_eq!(&turn2.prompt[..cached], chat.sequence().tokens());
    let (c2, _) = run(chat.generator(&tok, gen_cfg(), greedy(), &turn2));
    assert_eq!(c2.timings.prompt_cached, cached);
    assert_eq!(c2.timings.prompt_evaluated, turn2.prompt.len() - cached);
    assert!(c2.timings.prompt_evaluated < 20, "{:?}", c2.timings);
    assert!(c2.text.contains("Berlin"), "{:?}", c2.text);
    chat.push_assistant(c2.text.clone());

    // Without context shift, a turn that does not fit is refused and withdrawn.
    let n_msgs = chat.messages().len();
    let huge = "word ".repeat(3000);
    assert!(chat.user_turn(&tok, &huge, 16).is_err());
    assert_eq!(chat.messages().len(), n_msgs);
}

#[test]
fn chat_context_shift_drops_oldest_turns_keeping_system() {
    let (model, tok) = load(80);
    let seq = Sequence::new(model.session().unwrap());
    let cfg = ChatConfig {
        system: Some("You are terse.".into()),
        context_shift: true,
    };
    let mut chat = Chat::new(seq, &tok, cfg).expect("chat template");
    let mut dropped = 0;
    for q in [
        "Name a fruit.",
        "Name a color.",
        "Name an animal.",
        "Name a country.",
        "Name a planet.",
        "Name a river.",
        "Name a tree.",
        "Name a metal.",
    ] {
        let turn = chat.user_turn(&tok, q, 24).unwrap();
        dropped += turn.dropped_messages;
        let cfg = GenerateConfig {
            max_tokens: Some(24),
            ..Default::default()
        };
        let (c, _) = run(chat.generator(&tok, cfg, greedy(), &turn));
        assert!(turn.prompt.len() + 24 <= 80);
        if turn.dropped_messages > 0 {
            // Re-positioned by re-evaluating the kept turns; the system prompt stays cached.
            assert!(c.timings.prompt_cached >= 5, "{:?}", c.timings);
        }
        chat.push_assistant(c.text);
    }
    assert!(dropped > 0, "the conversation outgrew 80 tokens");
    assert_eq!(chat.messages()[0].role, "system");
    assert_eq!(chat.messages()[1].role, "user");
    assert_eq!(chat.messages().last().unwrap().role, "assistant");
}
