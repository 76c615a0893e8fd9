//! Single-threaded encode throughput: `cargo run --release -p damascus-tokenizer --example
//! encode_bench -- VOCAB CORPUS [REPEATS]`, where VOCAB is a GGUF or a `tokenizer.json`.
//!
//! Prints load time, ids count and MB/s (best of REPEATS runs, cold cache each run: a fresh
//! tokenizer per run so the per-word cache does not carry over).

use std::time::Instant;

use damascus_gguf::GgufFile;
use damascus_tokenizer::{Tokenizer, TokenizerSpec};

fn load(path: &str) -> Tokenizer {
    if path.ends_with(".json") {
        let json = std::fs::read_to_string(path).expect("read tokenizer.json");
        let t = Instant::now();
        let spec = TokenizerSpec::from_hf_json(&json, None).expect("parse");
        let parse_s = t.elapsed().as_secs_f64();
        let tok = Tokenizer::from_spec(spec).expect("build");
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprintln!(
                "tokenizer.json: parse {parse_s:.3} s, build {:.3} s",
                t.elapsed().as_secs_f64() - parse_s
            );
        }
        tok
    } else {
        let t = Instant::now();
        let f = GgufFile::open(path).expect("open gguf");
        let open_s = t.elapsed().as_secs_f64();
        let spec = TokenizerSpec::from_metadata(f.metadata()).expect("read metadata");
        let spec_s = t.elapsed().as_secs_f64() - open_s;
        let tok = Tokenizer::from_spec(spec).expect("build");
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            eprintln!(
                "gguf: open (metadata parse) {open_s:.3} s, spec {spec_s:.3} s, build {:.3} s",
                t.elapsed().as_secs_f64() - open_s - spec_s
            );
        }
        tok
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: encode_bench VOCAB CORPUS [REPEATS]");
        std::process::exit(2);
    }
    let repeats: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let text = std::fs::read_to_string(&args[2]).expect("read corpus");
    let t0 = Instant::now();
    drop(load(&args[1]));
    let load_s = t0.elapsed().as_secs_f64();
    println!("load {load_s:.3} s, {} bytes", text.len());
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mb = text.len() as f64 / 1e6;
    for mode in ["whole", "lines"] {
        let mut best = f64::INFINITY;
        let mut ids = Vec::new();
        for _ in 0..repeats {
            let tok = load(&args[1]);
            let t = Instant::now();
            ids = if mode == "whole" {
                tok.encode(&text, false, false)
            } else {
                lines
                    .iter()
                    .flat_map(|l| tok.encode(l, false, false))
                    .collect()
            };
            best = best.min(t.elapsed().as_secs_f64());
        }
        // Same checksum as tools/tokenizer_bench.py, to prove identical ids.
        let sum = ids.iter().enumerate().fold(0u128, |acc, (i, &x)| {
            (acc + (i as u128 + 1) * u128::from(x)) % (1u128 << 61)
        });
        println!(
            "[{mode}]: {} ids, checksum {sum}, best {best:.4} s = {:.2} MB/s",
            ids.len(),
            mb / best
        );
    }
}
