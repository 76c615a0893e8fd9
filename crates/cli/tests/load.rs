//! End-to-end tests of `damascus load` and `damascus pull` through the built binary: the
//! default model's summary, `--json`, `--reference`, a Llama-3.2-3B-shaped file (sparse on
//! disk), and corrupted files that must fail fast with one line on stderr.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use damascus_gguf::keys::{self, tensors as tn};
use damascus_gguf::{GgmlType, GgufWriter, Value};

fn damascus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_damascus"))
        .args(args)
        .output()
        .expect("run damascus")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn default_model() -> PathBuf {
    damascus_hub::default_model_path().expect("default model (pulled via pip on first use)")
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/load")
        .join(name)
}

#[test]
fn default_model_summary() {
    let model = default_model();
    let out = damascus(&["load", model.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    for want in [
        "gguf v3 · Q4_1 · 93.8 MiB",
        "arch llama · 30 layers · 576 hidden",
        "ffn SwiGLU · 1536 · RMSNorm",
        "attn GQA · 9 heads / 3 kv",
        "vocab 49,152 · tied embeddings",
        "rope theta 100000",
        "config ✓ consistent",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("llama3 rope factors"));

    // No path: the default model, from the same cache.
    let out = damascus(&["load"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("30 layers"));
}

#[test]
fn default_model_json_and_reference() {
    let model = default_model();
    let m = model.to_str().unwrap();
    let out = damascus(&["load", m, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(j["n_layer"], 30);
    assert_eq!(j["n_embd"], 576);
    assert_eq!(j["n_ff"], 1536);
    assert_eq!(
        (j["n_head"].as_u64(), j["n_head_kv"].as_u64()),
        (Some(9), Some(3))
    );
    assert_eq!(j["n_vocab"], 49_152);
    assert_eq!(j["rope_theta"], 100_000.0);
    assert_eq!(j["tied_embeddings"], true);
    assert_eq!(j["file_type"], "Q4_1");
    assert_eq!(j["n_tensors"], 272);

    let good = fixture("smollm2-135m-instruct.config.json");
    let out = damascus(&["load", m, "--reference", good.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("config ✓ matches reference"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    cfg["hidden_size"] = 512.into();
    cfg["rope_theta"] = 10_000.0.into();
    cfg["tie_word_embeddings"] = false.into();
    std::fs::write(&bad, cfg.to_string()).unwrap();
    let out = damascus(&["load", m, "--reference", bad.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(!out.status.success());
    assert!(stdout.contains("config ✗ 3 mismatches"), "{stdout}");
    assert!(
        stdout.contains("hidden_size: reference 512, file 576"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rope_theta") && stdout.contains("tie_word_embeddings"),
        "{stdout}"
    );
}

/// Writes zero runs as holes, so a 2 GB model file costs almost no disk.
struct SparseFile {
    file: std::fs::File,
    pos: u64,
}

impl Write for SparseFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.iter().all(|&b| b == 0) {
            self.file.seek(SeekFrom::Current(buf.len() as i64))?;
        } else {
            self.file.write_all(buf)?;
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// A file with Llama 3.2 3B's metadata and every tensor at full size (Q4_K weights, zero
/// data), plus `rope_freqs.weight`, written sparsely.
fn write_llama32_shaped(path: &Path) {
    let llama = |s: &str| keys::llm("llama", s);
    let mut w = GgufWriter::new();
    let md: Vec<(String, Value)> = vec![
        (
            keys::GENERAL_ARCHITECTURE.into(),
            Value::String("llama".into()),
        ),
        (keys::GENERAL_FILE_TYPE.into(), Value::U32(15)),
        (llama(keys::BLOCK_COUNT), Value::U32(28)),
        (llama(keys::CONTEXT_LENGTH), Value::U32(131_072)),
        (llama(keys::EMBEDDING_LENGTH), Value::U32(3072)),
        (llama(keys::FEED_FORWARD_LENGTH), Value::U32(8192)),
        (llama(keys::ATTENTION_HEAD_COUNT), Value::U32(24)),
        (llama(keys::ATTENTION_HEAD_COUNT_KV), Value::U32(8)),
        (llama(keys::ROPE_FREQ_BASE), Value::F32(500_000.0)),
        (llama(keys::ATTENTION_LAYERNORM_RMS_EPS), Value::F32(1e-5)),
        (llama(keys::ATTENTION_KEY_LENGTH), Value::U32(128)),
        (llama(keys::ATTENTION_VALUE_LENGTH), Value::U32(128)),
        (llama(keys::VOCAB_SIZE), Value::U32(128_256)),
        (llama(keys::ROPE_DIMENSION_COUNT), Value::U32(128)),
    ];
    for (k, v) in md {
        w.add_metadata(k, v).unwrap();
    }
    let (e, v, ff, kv) = (3072u64, 128_256u64, 8192u64, 1024u64);
    w.add_tensor(tn::ROPE_FREQS, vec![64], GgmlType::F32)
        .unwrap();
    w.add_tensor(tn::TOKEN_EMBD, vec![e, v], GgmlType::Q4_K)
        .unwrap();
    for l in 0..28 {
        w.add_tensor(tn::blk(l, tn::ATTN_NORM), vec![e], GgmlType::F32)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::ATTN_Q), vec![e, e], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::ATTN_K), vec![e, kv], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::ATTN_V), vec![e, kv], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::ATTN_OUTPUT), vec![e, e], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::FFN_NORM), vec![e], GgmlType::F32)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::FFN_GATE), vec![e, ff], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::FFN_UP), vec![e, ff], GgmlType::Q4_K)
            .unwrap();
        w.add_tensor(tn::blk(l, tn::FFN_DOWN), vec![ff, e], GgmlType::Q4_K)
            .unwrap();
    }
    w.add_tensor(tn::OUTPUT_NORM, vec![e], GgmlType::F32)
        .unwrap();
    let sizes: Vec<u64> = w.layout().unwrap().iter().map(|t| t.n_bytes()).collect();
    let mut out = SparseFile {
        file: std::fs::File::create(path).unwrap(),
        pos: 0,
    };
    w.write(&mut out, |i, buf| {
        if i == 0 {
            // rope_freqs: llama3-like factors, 1 for high frequencies up to 32 for low ones.
            for k in 0..64 {
                buf.extend_from_slice(&(1.0f32 + 31.0 * (k as f32 / 63.0)).to_le_bytes());
            }
        } else {
            buf.resize(sizes[i] as usize, 0);
        }
        Ok(())
    })
    .unwrap();
    let len = out.pos;
    out.file.set_len(len).unwrap();
}

#[test]
fn llama32_shaped_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-3.2-3b-shaped.gguf");
    write_llama32_shaped(&path);
    let out = damascus(&["load", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    for want in [
        "· Q4_K_M ·",
        "28 layers · 3072 hidden",
        "ffn SwiGLU · 8192",
        "attn GQA · 24 heads / 8 kv",
        "vocab 128,256 · tied embeddings",
        "rope theta 500000",
        "llama3 rope factors",
        "config ✓ consistent",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
}

/// Runs `damascus load` on `bytes` and checks: failure, one `error:` line, no panic, fast.
fn assert_rejected(name: &str, bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let t = Instant::now();
    let out = damascus(&["load", path.to_str().unwrap()]);
    let took = t.elapsed();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{name}: should fail");
    assert!(took < Duration::from_secs(1), "{name}: took {took:?}");
    assert!(!stderr.contains("panicked"), "{name}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
    assert!(stderr.starts_with("error: "), "{name}: {stderr}");
    assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
    stderr
}

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut h = b"GGUF".to_vec();
    h.extend_from_slice(&3u32.to_le_bytes());
    h.extend_from_slice(&n_tensors.to_le_bytes());
    h.extend_from_slice(&n_kv.to_le_bytes());
    h
}

#[test]
fn corrupted_files_fail_fast_with_one_line() {
    assert_rejected("empty.gguf", b"");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..65_536)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert_rejected("random.gguf", &random);
    let e = assert_rejected("bad-magic.gguf", b"GGUX\x03\0\0\0");
    assert!(e.contains("magic"), "{e}");
    assert_rejected("huge-tensor-count.gguf", &header(1 << 60, 0));
    let mut s = header(0, 1);
    s.extend_from_slice(&(1u64 << 62).to_le_bytes());
    s.extend_from_slice(b"general.architecture");
    assert_rejected("huge-string.gguf", &s);
    let mut a = header(0, 1);
    a.extend_from_slice(&4u64.to_le_bytes());
    a.extend_from_slice(b"keys");
    a.extend_from_slice(&9u32.to_le_bytes()); // array
    a.extend_from_slice(&4u32.to_le_bytes()); // of u32
    a.extend_from_slice(&(1u64 << 61).to_le_bytes());
    assert_rejected("huge-array.gguf", &a);
}

#[test]
fn truncated_and_inconsistent_models_fail_with_context() {
    let model = std::fs::read(default_model()).unwrap();
    let e = assert_rejected("truncated.gguf", &model[..1_000_000]);
    assert!(e.contains("truncated.gguf"), "{e}");
    assert_rejected("truncated-data.gguf", &model[..model.len() - 4096]);

    // A valid GGUF whose tensor shapes disagree with its metadata.
    let f = damascus_gguf::GgufFile::open(default_model()).unwrap();
    let mut w = GgufWriter::from_gguf(&f).unwrap();
    w.set_metadata(
        keys::llm("llama", keys::FEED_FORWARD_LENGTH),
        Value::U32(1024),
    )
    .unwrap();
    let mut bytes = Vec::new();
    let infos = f.tensors().to_vec();
    w.write(&mut bytes, |i, buf| {
        buf.extend_from_slice(f.tensor_data(&infos[i]));
        Ok(())
    })
    .unwrap();
    let e = assert_rejected("inconsistent.gguf", &bytes);
    assert!(
        e.contains("inconsistent.gguf") && e.contains("blk.0.ffn_") && e.contains("1024"),
        "{e}"
    );
}

#[test]
fn pull_url_into_damascus_home() {
    use std::io::{BufRead, BufReader};
    let body: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/files/tiny.gguf", listener.local_addr().unwrap());
    let served = body.clone();
    std::thread::spawn(move || {
        // One request, then the thread ends.
        if let Ok((stream, _)) = listener.accept() {
            let mut r = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).map(|n| n > 0).unwrap_or(false) && line != "\r\n" {
                line.clear();
            }
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                served.len()
            );
            let _ = s.write_all(&served);
        }
    });
    let home = tempfile::tempdir().unwrap();
    let sha = damascus_hub::Sha256Digest::of_bytes(&body).to_hex();
    let out = Command::new(env!("CARGO_BIN_EXE_damascus"))
        .args(["pull", &url, "--sha256", &sha])
        .env("DAMASCUS_HOME", home.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = PathBuf::from(text(&out.stdout).trim());
    assert!(
        path.starts_with(home.path()) && path.ends_with("tiny.gguf"),
        "{path:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), body);

    let out = damascus(&["pull", "not-a-url.gguf"]);
    assert!(!out.status.success() && text(&out.stderr).contains("not an http(s) URL"));
    let out = damascus(&["pull", "http://127.0.0.1:9/x.gguf", "--sha256", "zz"]);
    assert!(!out.status.success() && text(&out.stderr).contains("invalid sha256"));
}
