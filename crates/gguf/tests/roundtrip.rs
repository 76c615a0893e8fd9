//! Read -> write -> read round trips: metadata and tensor bytes must come back identical.

mod common;

use std::path::Path;

use common::{fill, synthetic_bytes};
use damascus_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value, keys};

/// Copies `file` through the writer and returns the new file's bytes.
fn rewrite(file: &GgufFile) -> Vec<u8> {
    let w = GgufWriter::from_gguf(file).unwrap();
    let mut out = Vec::new();
    let n = w
        .write(&mut out, |i, buf| {
            buf.extend_from_slice(file.tensor_data(&file.tensors()[i]));
            Ok(())
        })
        .unwrap();
    assert_eq!(n, out.len() as u64);
    out
}

fn assert_same(a: &GgufFile, b: &GgufFile) {
    assert_eq!(a.metadata(), b.metadata());
    assert_eq!(
        a.metadata().keys().collect::<Vec<_>>(),
        b.metadata().keys().collect::<Vec<_>>()
    );
    assert_eq!(a.tensors().len(), b.tensors().len());
    assert_eq!(a.alignment(), b.alignment());
    for (ta, tb) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!(ta.name, tb.name);
        assert_eq!(ta.dims, tb.dims);
        assert_eq!(ta.dtype, tb.dtype);
        assert_eq!(a.tensor_data(ta), b.tensor_data(tb), "tensor {}", ta.name);
    }
}

#[test]
fn synthetic_values_read_back() {
    let f = GgufFile::from_bytes(synthetic_bytes()).unwrap();
    let m = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.architecture().unwrap(), Some("llama"));
    assert_eq!(m.get("test.u8"), Some(&Value::U8(200)));
    assert_eq!(m.get("test.i8"), Some(&Value::I8(-100)));
    assert_eq!(m.get_u32("test.u16").unwrap(), Some(60000));
    assert_eq!(m.get("test.i16"), Some(&Value::I16(-30000)));
    assert_eq!(m.get_u32("test.u32").unwrap(), Some(4_000_000_000));
    assert_eq!(m.get_i64("test.i32").unwrap(), Some(-2_000_000_000));
    assert_eq!(m.get_f32("test.f32").unwrap(), Some(1.5e-5));
    assert_eq!(m.get_bool("test.bool").unwrap(), Some(true));
    assert_eq!(m.get_str("test.string").unwrap(), Some("héllo wörld ✓"));
    assert_eq!(m.get_u64("test.u64").unwrap(), Some(u64::MAX - 1));
    assert_eq!(m.get_i64("test.i64").unwrap(), Some(i64::MIN + 1));
    assert_eq!(
        m.get_f32("test.f64").unwrap(),
        Some(std::f64::consts::PI as f32)
    );
    let strs = m.get_array("test.arr.str").unwrap().unwrap();
    assert_eq!(strs.as_strs().unwrap(), ["a", "", "Ġthe"]);
    let ints = m.get_array("test.arr.i32").unwrap().unwrap();
    assert_eq!(ints.as_i32_vec().unwrap(), [-1, 0, 7]);
    assert_eq!(ints.as_u32_vec(), None);
    let u8s = m.get_array("test.arr.u8").unwrap().unwrap();
    assert_eq!(u8s.as_u32_vec().unwrap(), [1, 2, 3, 255]);
    let empty = m.get_array("test.arr.empty").unwrap().unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.elem_type(), damascus_gguf::ValueType::F64);
    let nested = m.get_array("test.arr.nested").unwrap().unwrap();
    assert_eq!(nested.len(), 3);
    assert_eq!(
        nested.as_arrays().unwrap()[2],
        Array::Array(vec![Array::U32(vec![9])])
    );
    assert!(m.get_u32("test.string").is_err());

    let t = f.tensor("b.q4_1").unwrap();
    assert_eq!(t.dtype, GgmlType::Q4_1);
    assert_eq!(t.dims, [64, 2]);
    assert_eq!(t.n_elements(), 128);
    assert_eq!(t.n_bytes(), 4 * 20);
    assert_eq!(f.tensor_data(t), fill(1, 80).as_slice());
    assert_eq!(
        f.tensor_data_by_name("c.f16").unwrap(),
        fill(2, 10).as_slice()
    );
    for t in f.tensors() {
        assert_eq!(t.offset % 64, 0);
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes());
    }
}

#[test]
fn synthetic_roundtrip_is_byte_identical() {
    let bytes = synthetic_bytes();
    let a = GgufFile::from_bytes(bytes.clone()).unwrap();
    let out = rewrite(&a);
    assert_eq!(out, bytes, "rewrite of our own file must be byte-identical");
    let b = GgufFile::from_bytes(out).unwrap();
    assert_same(&a, &b);
}

#[test]
fn write_to_path_is_atomic_and_mmap_reads_back() {
    let dir = std::env::temp_dir().join(format!("damascus-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.gguf");
    let w = common::synthetic_writer();
    let layout = w.layout().unwrap();
    // A failing producer leaves nothing behind.
    let err = w
        .write_to_path(&path, |i, buf| {
            if i == 2 {
                return Err(GgufError::custom("boom"));
            }
            buf.extend(fill(i, layout[i].n_bytes()));
            Ok(())
        })
        .unwrap_err();
    assert!(err.to_string().contains("c.f16") && err.to_string().contains("boom"));
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    // A short producer is rejected.
    let err = w.write(Vec::new(), |_, _| Ok(())).unwrap_err();
    assert!(matches!(err, GgufError::DataSizeMismatch { .. }), "{err}");
    // A good one.
    w.write_to_path(&path, |i, buf| {
        buf.extend(fill(i, layout[i].n_bytes()));
        Ok(())
    })
    .unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.path(), Some(path.as_path()));
    assert_eq!(f.file_size(), std::fs::metadata(&path).unwrap().len());
    assert_same(&f, &GgufFile::from_bytes(synthetic_bytes()).unwrap());
    // Ranges of a tensor read through the file (pread) equal the mapped bytes, on a mapped
    // and an in-memory file; a range past the tensor is an error, not a short read.
    let mem = GgufFile::from_bytes(synthetic_bytes()).unwrap();
    for file in [&f, &mem] {
        for info in file.tensors() {
            let data = file.tensor_data(info);
            let n = data.len();
            let mut buf = vec![0u8; n / 2];
            file.read_tensor_range(info, (n - n / 2) as u64, &mut buf)
                .unwrap();
            assert_eq!(buf, data[n - n / 2..n - n / 2 + n / 2], "{}", info.name);
            let mut one = [0u8; 1];
            let e = file
                .read_tensor_range(info, n as u64, &mut one)
                .unwrap_err();
            assert!(e.to_string().contains(&info.name), "{e}");
            assert!(file.read_tensor_range(info, u64::MAX, &mut one).is_err());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writer_rejects_bad_declarations() {
    let mut w = GgufWriter::new();
    w.add_tensor("x", vec![32], GgmlType::Q4_0).unwrap();
    assert!(w.add_tensor("x", vec![32], GgmlType::Q4_0).is_err());
    assert!(w.add_tensor("y", vec![33], GgmlType::Q4_0).is_err());
    assert!(
        w.add_tensor("z", vec![1, 1, 1, 1, 1], GgmlType::F32)
            .is_err()
    );
    assert!(w.add_tensor("o", vec![u64::MAX, 2], GgmlType::F32).is_err());
    w.add_metadata("k", Value::U32(1)).unwrap();
    assert!(w.add_metadata("k", Value::U32(2)).is_err());
    assert!(
        w.add_metadata(keys::GENERAL_ALIGNMENT, Value::U32(3))
            .is_err()
    );
    w.set_metadata("k", Value::U32(2)).unwrap();
    assert_eq!(w.metadata().get_u32("k").unwrap(), Some(2));
}

#[test]
fn real_model_roundtrip() {
    let path = Path::new("/tmp/dev/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!("skipping: {} not present", path.display());
        return;
    }
    let a = GgufFile::open(path).unwrap();
    assert_eq!(a.architecture().unwrap(), Some("llama"));
    let arch = "llama";
    let m = a.metadata();
    assert_eq!(
        m.get_u32(&keys::llm(arch, keys::BLOCK_COUNT)).unwrap(),
        Some(30)
    );
    assert_eq!(
        m.get_u32(&keys::llm(arch, keys::EMBEDDING_LENGTH)).unwrap(),
        Some(576)
    );
    let ft = m.get_u32(keys::GENERAL_FILE_TYPE).unwrap().unwrap();
    assert_eq!(
        damascus_gguf::FileType::from_id(ft).map(|f| f.name()),
        Some("Q4_1")
    );
    let tokens = m.get_array(keys::TOKENIZER_TOKENS).unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    let emb = a.tensor(keys::tensors::TOKEN_EMBD).unwrap();
    assert_eq!(emb.dims, [576, 49152]);
    let out = rewrite(&a);
    let b = GgufFile::from_bytes(out).unwrap();
    assert_same(&a, &b);
}

#[test]
fn version_2_files_parse() {
    let mut r = common::Raw::header(2, 1, 1);
    r.kv_u32("k", 5).tensor("t", &[2, 2], 0, 0).pad(32);
    r.bytes(&[1u8; 16]);
    let f = GgufFile::from_bytes(r.build()).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.metadata().get_u32("k").unwrap(), Some(5));
    assert_eq!(f.tensor_data_by_name("t").unwrap(), [1u8; 16]);
    // Rewriting upgrades to v3 with identical content.
    let b = GgufFile::from_bytes(rewrite(&f)).unwrap();
    assert_eq!(b.version(), 3);
    assert_same(&f, &b);
}

#[test]
fn gguf_file_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<GgufFile>();
    check::<GgufError>();
}
