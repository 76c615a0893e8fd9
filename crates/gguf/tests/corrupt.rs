//! Untrusted input: a corpus of corrupted and hostile files, generated in-test. Every one must
//! end in an `Err` with a one-line message (naming an offset where one applies), quickly, with no
//! panic and no huge allocation.

mod common;

use std::time::{Duration, Instant};

use common::{Raw, synthetic_bytes};
use damascus_gguf::{GgufError, GgufFile};

/// Upper bound for any single parse in this file ("well under a second").
const LIMIT: Duration = Duration::from_millis(250);

fn parse_timed(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    let t = Instant::now();
    let r = GgufFile::from_bytes(bytes);
    let dt = t.elapsed();
    assert!(dt < LIMIT, "parse took {dt:?}");
    r
}

/// Parses `bytes`, expects an error, checks it is one line and returns it.
fn expect_err(bytes: Vec<u8>) -> GgufError {
    let err = match parse_timed(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "multi-line error: {msg}");
    assert!(!msg.is_empty());
    err
}

/// A minimal xorshift RNG (deterministic, no dependency).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn every_truncation_fails_cleanly() {
    let bytes = synthetic_bytes();
    let full = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_end = full
        .tensors()
        .iter()
        .map(|t| full.data_offset() + t.offset + t.n_bytes())
        .max()
        .unwrap();
    for n in 0..bytes.len() {
        let r = parse_timed(bytes[..n].to_vec());
        if (n as u64) < data_end {
            let e = r
                .err()
                .unwrap_or_else(|| panic!("truncation at {n} parsed"));
            let msg = e.to_string();
            assert!(!msg.contains('\n'));
            assert!(
                msg.contains("offset") || msg.contains("outside the file"),
                "{n}: {msg}"
            );
        }
    }
}

#[test]
fn random_byte_flips_never_panic() {
    let bytes = synthetic_bytes();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut n_err = 0;
    for _ in 0..20_000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(b.len());
            b[i] = match rng.below(4) {
                0 => rng.next() as u8,
                1 => b[i] ^ (1 << rng.below(8)),
                2 => 0xFF,
                _ => 0,
            };
        }
        if parse_timed(b).is_err() {
            n_err += 1;
        }
    }
    assert!(n_err > 1000, "only {n_err} mutations were rejected");
}

#[test]
fn random_garbage_fails() {
    let mut rng = Rng(12345);
    for len in [0usize, 1, 3, 4, 7, 8, 23, 24, 100, 4096] {
        let b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        expect_err(b.clone());
        // Same garbage behind a valid magic and version.
        let mut v = Raw::header(3, 0, 0).build();
        v.truncate(8);
        v.extend(b);
        let _ = parse_timed(v);
    }
}

#[test]
fn bad_magic_and_versions() {
    let e = expect_err(b"GGML\x03\0\0\0".to_vec());
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    assert!(e.to_string().starts_with("offset 0"));
    let e = expect_err(Raw::header(1, 0, 0).build());
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 1, .. }),
        "{e}"
    );
    let e = expect_err(Raw::header(4, 0, 0).build());
    assert!(e.to_string().contains("offset 4"), "{e}");
    let e = expect_err(Raw::header(3u32.swap_bytes(), 0, 0).build());
    assert!(e.to_string().contains("big-endian"), "{e}");
    let e = expect_err(b"GG".to_vec());
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    // Empty v2 and v3 files are valid.
    assert!(parse_timed(Raw::header(2, 0, 0).build()).is_ok());
    assert!(parse_timed(Raw::header(3, 0, 0).build()).is_ok());
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let e = expect_err(Raw::header(3, 1 << 60, 0).build());
    assert!(
        matches!(e, GgufError::CountTooLarge { offset: 8, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("tensor count"), "{e}");
    let e = expect_err(Raw::header(3, u64::MAX, u64::MAX).build());
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    let e = expect_err(Raw::header(3, 0, 1 << 60).build());
    assert!(e.to_string().contains("kv count"), "{e}");
    // A key string claiming 2^62 bytes.
    let e = expect_err(Raw::header(3, 0, 1).u64(1 << 62).zeros(16).build());
    assert!(matches!(e, GgufError::CountTooLarge { offset: 24, count, .. } if count == 1 << 62));
    assert!(e.to_string().contains("kv[0] key"), "{e}");
    // A string value claiming 2^62 bytes.
    let e = expect_err(Raw::header(3, 0, 1).str("k").u32(8).u64(1 << 62).build());
    assert!(e.to_string().contains("'k'"), "{e}");
    // An array claiming 2^62 u64 elements, and 2^60 strings.
    let e = expect_err(
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(10)
            .u64(1 << 62)
            .build(),
    );
    assert!(e.to_string().contains("array count"), "{e}");
    let e = expect_err(
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(8)
            .u64(1 << 60)
            .zeros(64)
            .build(),
    );
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    // Nested arrays each claiming huge counts.
    let e = expect_err(
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(9)
            .u64(1)
            .u32(9)
            .u64(u64::MAX)
            .build(),
    );
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    // Tensor name of 2^62 bytes.
    let e = expect_err(Raw::header(3, 1, 0).u64(1 << 62).zeros(32).build());
    assert!(e.to_string().contains("tensor[0] name"), "{e}");
}

#[test]
fn metadata_errors() {
    // Unknown value type.
    let e = expect_err(Raw::header(3, 0, 1).str("k").u32(13).u32(0).build());
    assert!(
        matches!(
            e,
            GgufError::UnknownValueType {
                type_id: 13,
                offset: 33,
                ..
            }
        ),
        "{e}"
    );
    // Unknown array element type.
    let e = expect_err(Raw::header(3, 0, 1).str("k").u32(9).u32(99).u64(0).build());
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        "{e}"
    );
    // Duplicate key.
    let e = expect_err(Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).build());
    assert!(matches!(e, GgufError::DuplicateKey { .. }), "{e}");
    // Invalid UTF-8 in a key and in a string value.
    let e = expect_err(
        Raw::header(3, 0, 1)
            .u64(2)
            .bytes(&[0xC3, 0x28])
            .u32(4)
            .u32(0)
            .build(),
    );
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset: 32, .. }),
        "{e}"
    );
    let e = expect_err(Raw::header(3, 0, 1).str("k").u32(8).u64(1).u8(0xFF).build());
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");
    // Bool that is neither 0 nor 1.
    let e = expect_err(Raw::header(3, 0, 1).str("k").u32(7).u8(2).build());
    assert!(matches!(e, GgufError::InvalidBool { byte: 2, .. }), "{e}");
    // Nesting depth cap: 100 nested array headers.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9);
    for _ in 0..100 {
        r.u32(9).u64(1);
    }
    r.u32(0).u64(0);
    let e = expect_err(r.build());
    assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e}");
    // Bad alignments.
    for (ty, payload) in [(4u32, 0u64), (4, 3), (4, 48), (10, 1 << 33), (11, 32)] {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(ty);
        if ty == 4 {
            r.u32(payload as u32);
        } else {
            r.u64(payload);
        }
        let e = expect_err(r.build());
        assert!(matches!(e, GgufError::InvalidAlignment { .. }), "{e}");
    }
}

/// A header with one F32 tensor `[4]` at `offset` plus optional extra tensors, and `data` bytes
/// of data section.
fn one_tensor(name: &str, dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(name, dims, ty, offset).pad(32).zeros(data);
    r.build()
}

#[test]
fn tensor_errors() {
    // Valid baseline.
    let ok = parse_timed(one_tensor("t", &[4], 0, 0, 16)).unwrap();
    assert_eq!(ok.tensor_data_by_name("t").unwrap().len(), 16);
    // Unknown / removed type ids.
    for id in [4u32, 31, 36, 43, 1 << 31] {
        let e = expect_err(one_tensor("t", &[4], id, 0, 16));
        assert!(matches!(e, GgufError::UnknownGgmlType { .. }), "{e}");
        assert!(e.to_string().contains("'t'"), "{e}");
    }
    // Too many dims.
    let e = expect_err(one_tensor("t", &[1, 1, 1, 1, 1], 0, 0, 16));
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");
    let e = expect_err(
        Raw::header(3, 1, 0)
            .str("t")
            .u32(u32::MAX)
            .zeros(64)
            .build(),
    );
    assert!(matches!(e, GgufError::TooManyDims { .. }), "{e}");
    // Dim products that overflow u64, exceed i64, or whose byte size overflows.
    for dims in [
        vec![1u64 << 32, 1 << 32],
        vec![u64::MAX],
        vec![1 << 62, 2],
        vec![1 << 40, 1 << 20, 1 << 10],
    ] {
        let e = expect_err(one_tensor("t", &dims, 0, 0, 16));
        assert!(matches!(e, GgufError::DimsOverflow { .. }), "{dims:?}: {e}");
    }
    // Row length not a multiple of the block size.
    let e = expect_err(one_tensor("t", &[33], 2, 0, 64));
    assert!(matches!(e, GgufError::BadRowLength { .. }), "{e}");
    // Misaligned offset.
    let e = expect_err(one_tensor("t", &[4], 0, 4, 64));
    assert!(matches!(e, GgufError::MisalignedTensor { .. }), "{e}");
    // Data outside the file: past the end, offset near u64::MAX, huge but valid dims.
    let e = expect_err(one_tensor("t", &[4], 0, 0, 15));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = expect_err(one_tensor("t", &[4], 0, u64::MAX - 31, 16));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = expect_err(one_tensor("t", &[1 << 40, 1 << 20], 0, 0, 16));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    // Duplicate names.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[4], 0, 0)
        .tensor("t", &[4], 0, 32)
        .pad(32)
        .zeros(64);
    let e = expect_err(r.build());
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
    // Overlapping tensors (second starts inside the first).
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(128);
    let e = expect_err(r.build());
    assert!(matches!(e, GgufError::OverlappingTensors { .. }), "{e}");
    assert!(
        e.to_string().contains("'a'") && e.to_string().contains("'b'"),
        "{e}"
    );
    // Adjacent and shared-zero-size tensors are fine.
    let mut r = Raw::header(3, 3, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .tensor("z", &[0, 4], 0, 32);
    r.pad(32).zeros(64);
    let f = parse_timed(r.build()).unwrap();
    assert_eq!(f.tensor_data_by_name("z").unwrap().len(), 0);
    // Tensor count claims more infos than present.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0).u64(5).bytes(b"ab").zeros(5);
    let e = expect_err(r.build());
    assert!(e.to_string().contains("tensor[1]"), "{e}");
}

#[test]
fn valid_but_unsupported_types_list_by_name() {
    for (id, name, elems) in [
        (16u32, "IQ2_XXS", 256u64),
        (39, "MXFP4", 32),
        (35, "TQ2_0", 256),
    ] {
        let f = parse_timed(one_tensor("t", &[elems], id, 0, 128)).unwrap();
        assert_eq!(f.tensors()[0].dtype.name(), name);
    }
}

/// The regression inputs under `tests/fixtures/` (crashes or slow inputs found by fuzzing, if
/// any) must each fail or parse quickly.
#[test]
fn fuzz_regressions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let bytes = std::fs::read(e.path()).unwrap();
        let _ = parse_timed(bytes);
    }
}

#[test]
fn open_errors_name_the_path() {
    let e = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/dir/model.gguf"), "{e}");
    // An empty file on disk is a clean error too (no zero-length mmap).
    let p = std::env::temp_dir().join(format!("damascus-empty-{}.gguf", std::process::id()));
    std::fs::write(&p, b"").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");
    std::fs::remove_file(&p).unwrap();
}
