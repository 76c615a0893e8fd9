//! End-to-end tests of `damascus generate` / `run` / `chat` on the default model (SmolLM2-135M
//! Instruct Q4_1) against Hugging Face greedy-generation fixtures
//! (`tests/fixtures/generate/`, written by `tools/hf_generate_fixtures.py`).
//!
//! The model is `$DAMASCUS_TEST_MODEL`, else `/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf` when
//! present, else the binary's default model (pulled into the cache on first use).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/generate/smollm2-q4_1-greedy.json");
    let text = std::fs::read_to_string(&path).expect("read generate fixture");
    serde_json::from_str(&text).expect("parse generate fixture")
}

/// `-m PATH` for the test model, or nothing (the binary's default model).
fn model_args() -> Vec<String> {
    let path = std::env::var_os("DAMASCUS_TEST_MODEL")
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from("/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf");
            p.exists().then_some(p)
        });
    match path {
        Some(p) => vec!["-m".into(), p.display().to_string()],
        None => Vec::new(),
    }
}

fn damascus(args: &[&str], stdin: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_damascus"));
    cmd.args(args)
        .args(model_args())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn damascus");
    if let Some(input) = stdin {
        let mut si = child.stdin.take().expect("stdin");
        si.write_all(input.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("wait damascus");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "damascus {args:?} failed: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    (stdout, stderr)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

fn generate_json(prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "generate", "-p", prompt, "--temp", "0", "-n", "32", "--json",
    ];
    args.extend_from_slice(extra);
    let (stdout, _) = damascus(&args, None);
    serde_json::from_str(stdout.trim()).expect("generate --json output")
}

#[test]
fn greedy_reference_matches_hugging_face() {
    let fx = fixture();
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        let out = generate_json(prompt, &["--reference"]);
        assert_eq!(
            ids(&out["prompt_ids"]),
            ids(&case["prompt_ids"]),
            "{prompt:?}"
        );
        assert_eq!(
            ids(&out["ids"]),
            ids(&case["ids"]),
            "{prompt:?}: damascus {:?} vs HF {:?}",
            out["text"],
            case["text"]
        );
        let want = if case["eos_stopped"].as_bool() == Some(true) {
            "eog"
        } else {
            "length"
        };
        assert_eq!(out["stop_reason"], want, "{prompt:?}");
    }
    let first = &fx["cases"][0];
    assert_eq!(first["prompt"], "The capital of France is");
    assert!(
        first["text"]
            .as_str()
            .is_some_and(|t| t.starts_with(" Paris."))
    );
}

#[test]
fn fast_path_first_token_matches() {
    let fx = fixture();
    let mut report = Vec::new();
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        let out = generate_json(prompt, &[]);
        let got = ids(&out["ids"]);
        let want = ids(&case["ids"]);
        assert_eq!(got.first(), want.first(), "{prompt:?}: first token");
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        report.push(format!("{prompt:?}: {same}/{} tokens match HF", want.len()));
    }
    // Visible with `cargo test -- --nocapture`: how far the fast path tracks the oracle.
    eprintln!("fast path vs HF greedy:\n  {}", report.join("\n  "));
}

#[test]
fn stop_string_and_run_alias() {
    let out = generate_json("The capital of France is", &["--stop", "\n\n"]);
    assert_eq!(out["text"], " Paris.");
    assert_eq!(out["stop_reason"], "stop");
    assert_eq!(out["stop_string"], "\n\n");
    let t = &out["timings"];
    assert_eq!(t["prompt_tokens"], 5);
    assert!(t["generated_tokens"].as_u64().is_some_and(|n| n >= 2));

    let (stdout, stderr) = damascus(
        &[
            "run",
            "The capital of France is",
            "--raw",
            "--temp",
            "0",
            "-n",
            "3",
        ],
        None,
    );
    assert!(
        stdout.starts_with("The capital of France is Paris"),
        "{stdout}"
    );
    assert!(stderr.contains("tok/s"), "timings on stderr: {stderr}");
}

#[test]
fn chat_piped_stdin_reuses_the_cache() {
    let input = "What is the capital of France?\n\
                 /help\n\
                 Say that \\\nagain.\n\
                 /reset\n\
                 \"\"\"\nHello\nthere\n\"\"\"\n\
                 /exit\n\
                 ignored after exit\n";
    let (stdout, stderr) = damascus(
        // The reference path: the reply's content is pinned (the fast path may drift).
        &[
            "chat",
            "--reference",
            "--temp",
            "0",
            "-n",
            "24",
            "--stats-json",
        ],
        Some(input),
    );
    assert!(stdout.contains("Paris"), "stdout: {stdout}");
    let stats: Vec<Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("stats line"))
        .collect();
    assert_eq!(
        stats.len(),
        3,
        "three turns (the rest are commands): {stderr}"
    );
    let n = |v: &Value, k: &str| v[k].as_u64().expect(k);
    let (t1, t2, t3) = (&stats[0], &stats[1], &stats[2]);
    assert_eq!(n(t1, "prompt_cached"), 0);
    assert_eq!(n(t1, "prompt_evaluated"), n(t1, "prompt_tokens"));
    // Turn 2 reuses turn 1's prompt and reply (all but the last sampled token, which was never
    // evaluated) and evaluates only the rest.
    let cached_after_t1 = n(t1, "prompt_tokens") + n(t1, "generated_tokens") - 1;
    assert_eq!(n(t2, "prompt_cached"), cached_after_t1, "{stderr}");
    assert_eq!(
        n(t2, "prompt_evaluated"),
        n(t2, "prompt_tokens") - cached_after_t1
    );
    assert!(n(t2, "prompt_evaluated") < n(t1, "prompt_tokens"));
    // After /reset the system-prompt prefix is still reused.
    assert!(n(t3, "prompt_cached") > 0);
    assert!(n(t3, "prompt_cached") < n(t3, "prompt_tokens"));
}

#[test]
fn draft_ngram_gives_the_plain_greedy_output_and_reports_acceptance() {
    let prompt = "Copy this list: apples, pears, plums, cherries, apples, pears, plums, cherries, \
                  apples, pears, plums, cherries.\nCopy: apples, pears,";
    let plain = generate_json(prompt, &[]);
    let spec = generate_json(prompt, &["--draft-ngram", "3", "--draft-max", "8"]);
    assert_eq!(ids(&spec["ids"]), ids(&plain["ids"]));
    assert_eq!(spec["text"], plain["text"]);
    assert!(plain["timings"]["draft"].is_null());
    let d = &spec["timings"]["draft"];
    let (drafted, accepted) = (
        d["drafted"].as_u64().unwrap(),
        d["accepted"].as_u64().unwrap(),
    );
    assert!(drafted > 0 && accepted > 0 && accepted <= drafted, "{d}");
    // The summary line on stderr.
    let (_, stderr) = damascus(
        &[
            "generate",
            "-p",
            prompt,
            "--temp",
            "0",
            "-n",
            "16",
            "--draft-ngram",
            "3",
        ],
        None,
    );
    assert!(
        stderr.contains("draft:") && stderr.contains("accepted of"),
        "{stderr}"
    );
    // Sampling at a temperature: a warning, and plain decoding.
    let (_, stderr) = damascus(
        &[
            "generate",
            "-p",
            prompt,
            "--temp",
            "0.8",
            "-n",
            "4",
            "--draft-ngram",
            "3",
        ],
        None,
    );
    assert!(stderr.contains("--draft-ngram ignored"), "{stderr}");
    // Bad settings are refused before loading.
    for bad in [
        &["--draft-ngram", "3", "--draft-max", "15"][..],
        &["--draft-ngram", "3", "--draft-max", "0"],
        &["--draft-ngram", "2", "--draft-ngram-min", "3"],
        &["--draft-ngram", "65"],
        &["--draft-ngram", "-1"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_damascus"))
            .args(["generate", "-p", "hi", "--temp", "0"])
            .args(bad)
            .output()
            .expect("spawn damascus");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(err.contains("draft"), "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{bad:?}: {err}");
    }
}
