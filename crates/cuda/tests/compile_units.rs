//! The kernels compiled as one NVRTC program per definition (`gpu::compile`) are the kernels of
//! the single program the source used to be compiled as: the same entries, each in exactly one
//! program, each with the same PTX body up to the numbering of its labels, local depots and
//! call sequences (which count from the start of the module).
//!
//! Needs NVRTC only, not a GPU: CI installs it from PyPI (`nvidia-cuda-nvrtc`, see
//! `.ci/run`). Where it cannot be loaded the test says SKIPPED and passes, unless
//! `DAMASCUS_REQUIRE_NVRTC=1` (set in CI) or `DAMASCUS_REQUIRE_CUDA=1` (the GPU machine).
#![cfg(feature = "cuda")]

use std::collections::HashMap;

use damascus_cuda::gpu::SOURCE;
use damascus_cuda::gpu::compile::{
    UNIT_SEP, compile_unit, compile_units, entry_bodies, nvrtc_present, unit_sources,
};

/// `text` with the digits after each of `prefixes` dropped.
fn renumbered(text: &str, prefixes: &[&str]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    'scan: while !rest.is_empty() {
        for p in prefixes {
            if let Some(tail) = rest.strip_prefix(p) {
                out.push_str(p);
                rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
                continue 'scan;
            }
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn required() -> bool {
    ["DAMASCUS_REQUIRE_NVRTC", "DAMASCUS_REQUIRE_CUDA"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| v == "1"))
}

#[test]
fn renumbering_drops_only_the_counters() {
    let t = "@%p1 bra $L__BB12_3; { // callseq 7, 0\n__local_depot3 x1";
    assert_eq!(
        renumbered(t, &["$L__BB", "callseq ", "__local_depot"]),
        "@%p1 bra $L__BB_3; { // callseq , 0\n__local_depot x1"
    );
}

#[test]
fn every_kernel_is_compiled_once_as_in_one_program() {
    if !nvrtc_present() {
        assert!(!required(), "NVRTC (libnvrtc.so.13) could not be loaded");
        eprintln!("SKIPPED: NVRTC not found (add its lib directory to LD_LIBRARY_PATH)");
        return;
    }
    let arch = "compute_90";
    let whole = compile_unit(SOURCE, arch).expect("the whole source compiles");
    let units = compile_units(arch).expect("every program compiles");
    assert_eq!(units.len(), unit_sources(SOURCE).len());
    let counters = ["$L__BB", "callseq ", "__local_depot"];
    let mut split: HashMap<&str, (usize, &str)> = HashMap::new();
    for (u, ptx) in units.iter().enumerate() {
        assert!(
            !ptx.contains(UNIT_SEP),
            "program {u}'s PTX holds the cache separator"
        );
        let bodies = entry_bodies(ptx);
        assert!(!bodies.is_empty(), "program {u} defines no kernel");
        for (name, body) in bodies {
            if let Some((v, _)) = split.insert(name, (u, body)) {
                panic!("kernel {name} is in programs {v} and {u}");
            }
        }
    }
    let want = entry_bodies(&whole);
    assert_eq!(split.len(), want.len(), "kernels: split vs whole");
    for (name, body) in want {
        let Some((u, got)) = split.get(name) else {
            panic!("kernel {name} is in no program");
        };
        assert_eq!(
            renumbered(got, &counters),
            renumbered(body, &counters),
            "kernel {name} (program {u}) differs from the whole source's"
        );
    }
}
