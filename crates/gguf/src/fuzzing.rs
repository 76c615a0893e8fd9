//! The parser's fuzz harness, shared by the `cargo fuzz` target (`fuzz/fuzz_targets/parse.rs`)
//! and the bounded mutation loop in `tests/fuzz_loop.rs`.

use crate::{GgufFile, GgufWriter};

/// Parses `data`; if it parses, touches every accessor and checks that write -> read -> write
/// reproduces the same bytes. Panics only if the reader and writer disagree (a bug), never on
/// bad input.
pub fn fuzz_harness(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in file.metadata().iter() {
        let _ = (
            key.len(),
            value.as_u64(),
            value.as_str(),
            value.type_description(),
        );
        if let Some(a) = value.as_array() {
            let _ = (a.as_strs(), a.as_f32_vec(), a.as_i32_vec(), a.as_u32_vec());
        }
    }
    let mut total = 0usize;
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes(), "tensor {}", t.name);
        total = total.wrapping_add(bytes.len());
    }
    let Some(first) = rewrite(&file) else {
        return;
    };
    let again = GgufFile::from_bytes(first.clone()).expect("writer output must parse");
    assert_eq!(again.tensors().len(), file.tensors().len());
    for (a, b) in file.tensors().iter().zip(again.tensors()) {
        assert_eq!((&a.name, &a.dims, a.dtype), (&b.name, &b.dims, b.dtype));
        assert_eq!(file.tensor_data(a), again.tensor_data(b));
    }
    let second = rewrite(&again).expect("rewrite of writer output");
    assert!(first == second, "write -> read -> write is not stable");
    let _ = total;
}

/// Writes `file` back through [`GgufWriter`]; `None` if the writer refuses it (it must not
/// refuse anything the reader accepted, except for size limits of memory).
fn rewrite(file: &GgufFile) -> Option<Vec<u8>> {
    let w = GgufWriter::from_gguf(file).expect("writer must accept what the reader accepted");
    // Skip files whose rewrite would be large: the writer packs tensors, but pads the header and
    // every tensor to the alignment, which a file may set as high as 2^31 (found by cargo fuzz:
    // tests/fixtures/fuzz/oom-alignment-1gib-writer-padding.gguf).
    let n_pads = file.tensors().len() as u64 + 1;
    let out_size = file
        .tensors()
        .iter()
        .map(|t| t.n_bytes())
        .fold(file.data_offset(), u64::saturating_add)
        .saturating_add(n_pads.saturating_mul(file.alignment()));
    if out_size > 64 << 20 {
        return None;
    }
    let mut out = Vec::new();
    w.write(&mut out, |i, buf| {
        if let Some(t) = file.tensors().get(i) {
            buf.extend_from_slice(file.tensor_data(t));
        }
        Ok(())
    })
    .expect("write to a Vec");
    Some(out)
}
