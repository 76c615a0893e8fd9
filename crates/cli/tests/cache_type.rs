//! `--cache-type` and llama.cpp's `-ctk`/`-ctv` (`--cache-type-k`/`--cache-type-v`) through
//! the real binary: the spellings agree, disagreeing or unknown types are clear errors, `bench`
//! reports the type, `serve --help` says what `-c` and `--cache-type` mean. Also `bench --npl`
//! (sequences in parallel over the shared paged cache), whose cache is the same kind.
//!
//! The model is `$DAMASCUS_TEST_MODEL`, else the binary's default model (pulled on first use).

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> PathBuf {
    std::env::var_os("DAMASCUS_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| damascus_hub::default_model_path().expect("default model"))
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_damascus"))
        .args(args)
        .arg("-m")
        .arg(model())
        .output()
        .expect("running damascus")
}

/// The document `bench ARGS --json` prints (it must succeed).
fn bench_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = run(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bench --json")
}

/// The greedy text of `generate --json` with `flags`.
fn greedy(flags: &[&str]) -> String {
    let mut args = vec![
        "generate",
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--json",
    ];
    args.extend_from_slice(flags);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("generate --json");
    v["text"].as_str().expect("text").to_string()
}

#[test]
fn every_spelling_of_q8_0_gives_the_same_text() {
    let want = greedy(&["--cache-type", "q8_0"]);
    assert!(!want.is_empty());
    assert_eq!(greedy(&["-ctk", "q8_0", "-ctv", "q8_0"]), want);
    assert_eq!(greedy(&["-ctk=q8_0", "-ctv=q8_0"]), want);
    assert_eq!(
        greedy(&["--cache-type-k", "q8_0", "--cache-type-v", "q8_0"]),
        want
    );
    assert_eq!(greedy(&["--cache-type", "Q8_0", "-ctk", "q8_0"]), want);
    // f16 stays the default.
    assert_eq!(greedy(&[]), greedy(&["-ctk", "f16", "-ctv", "f16"]));
}

#[test]
fn disagreeing_or_unknown_types_are_clear_errors() {
    let out = run(&[
        "generate", "-p", "hi", "-n", "1", "-ctk", "q8_0", "-ctv", "f16",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("differ") && err.contains("-ctk"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = run(&["run", "hi", "--cache-type", "q4_0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("q4_0") && err.contains("q8_0"), "{err}");
}

#[test]
fn bench_reports_the_cache_type() {
    let v = bench_json(&[
        "-p", "0", "-n", "2", "-r", "1", "-ctk", "q8_0", "-ctv", "q8_0",
    ]);
    assert_eq!(v["type_k"], "q8_0", "{v}");
    assert_eq!(v["type_v"], "q8_0", "{v}");
}

#[test]
fn bench_runs_sequences_in_parallel() {
    let v = bench_json(&["-p", "8", "-n", "3", "-d", "5", "--npl", "1,3", "-r", "1"]);
    let tests = v["tests"].as_array().expect("tests");
    let names: Vec<&str> = tests.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["pp8 @ d5", "pp8 x3 @ d5", "tg3 @ d5", "tg3 x3 @ d5"],
        "{v}"
    );
    for t in tests {
        let ts = t["samples_ts"][0].as_f64().expect("a sample");
        assert!(ts.is_finite() && ts > 0.0, "{t}");
    }
    assert_eq!(tests[3]["n_parallel"], 3, "{v}");
    // Zero sequences is a clear error, not a panic.
    let out = run(&["bench", "-p", "8", "-n", "0", "--npl", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--npl") && !err.contains("panicked"), "{err}");
}

#[test]
fn serve_help_says_what_c_and_cache_type_mean() {
    let out = Command::new(env!("CARGO_BIN_EXE_damascus"))
        .args(["serve", "--help"])
        .output()
        .expect("running damascus");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("--cache-type") && help.contains("q8_0"),
        "{help}"
    );
    assert!(help.contains("--ctx-size"), "{help}");
}
