//! `damascus serve` with several models, through the real binary: the flags refused before
//! anything loads (`--max-loaded 0`, a missing or empty `--models-dir`, `-m ID=` with no path,
//! two models of one name, a file over `--max-memory-mb`), and a server of `-m A -m ID=PATH`
//! plus `--models-dir` listing every model in `/v1/models`.
//!
//! The model is `$DAMASCUS_TEST_MODEL`, else the binary's default model (pulled on first use).

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn model() -> PathBuf {
    std::env::var_os("DAMASCUS_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| damascus_hub::default_model_path().expect("default model"))
}

/// Runs `damascus serve ARGS` expecting it to fail; its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_damascus"))
        .arg("serve")
        .args(["--port", "0", "--quiet"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run damascus");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "accepted: {args:?}\n{err}");
    assert_ne!(out.status.code(), Some(101), "panicked: {err}");
    err
}

#[test]
fn bad_model_flags_are_refused_clearly() {
    let m = model();
    let m = m.to_str().unwrap();
    let e = refused(&["-m", m, "-m", m, "--max-loaded", "0"]);
    assert!(e.contains("--max-loaded must be at least 1"), "{e}");
    let e = refused(&["--prefill-chunk", "0"]);
    assert!(e.contains("prefill_chunk: must be at least 1"), "{e}");
    let e = refused(&["--max-memory-mb", "0"]);
    assert!(e.contains("--max-memory-mb must be at least 1"), "{e}");
    let e = refused(&["--models-dir", "/nonexistent/damascus-models"]);
    assert!(
        e.contains("--models-dir /nonexistent/damascus-models: no such directory"),
        "{e}"
    );
    let empty = tempfile::tempdir().unwrap();
    let e = refused(&["--models-dir", empty.path().to_str().unwrap()]);
    assert!(e.contains("no .gguf files"), "{e}");
    let e = refused(&["-m", "chat="]);
    assert!(e.contains("nothing after '='"), "{e}");
    let e = refused(&["-m", m, "-m", m]);
    assert!(e.contains("two models are named"), "{e}");
    let e = refused(&["-m", m, "--max-memory-mb", "1"]);
    assert!(e.contains("larger than the memory budget"), "{e}");
}

#[test]
fn serves_every_model_given() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(model(), dir.path().join("extra.gguf")).unwrap();
    let m = model();
    let stem = m.file_stem().unwrap().to_string_lossy().into_owned();
    let mut child = Command::new(env!("CARGO_BIN_EXE_damascus"))
        .arg("serve")
        .args([
            "--port",
            "0",
            "--quiet",
            "--max-loaded",
            "1",
            "-c",
            "256",
            "-m",
        ])
        .arg(&m)
        .arg("-m")
        .arg(format!("chat={}", m.display()))
        .arg("--models-dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn damascus serve");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut seen = String::new();
    for _ in 0..50 {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        seen.push_str(&line);
        if let Some(a) = line.trim().split("listening on http://").nth(1) {
            addr = Some(a.to_string());
            break;
        }
    }
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("no address in: {seen}");
    };
    assert!(seen.contains("3 models (default '"), "{seen}");
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET /v1/models HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let _ = child.kill();
    let _ = child.wait();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw}"));
    let listed: Vec<(&str, &str)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            (stem.as_str(), "loaded"),
            ("chat", "unloaded"),
            ("extra", "unloaded")
        ]
    );
}
