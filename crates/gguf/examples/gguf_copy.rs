//! Reads a GGUF file and writes it back through [`GgufWriter`]: `gguf_copy IN OUT`; or writes a
//! small file using writer features gguf-py's writer lacks (alignment 64, empty and nested
//! arrays): `gguf_copy --demo OUT`. Used by `tools/gguf_roundtrip_check.py` to check that other
//! readers (gguf-py, llama.cpp) read our output identically.

use damascus_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value, ValueType, keys};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        eprintln!("usage: gguf_copy IN.gguf OUT.gguf | gguf_copy --demo OUT.gguf");
        std::process::exit(2);
    };
    let result = if input == "--demo" {
        demo(output)
    } else {
        copy(input, output)
    };
    if let Err(e) = result {
        eprintln!("error: {input}: {e}");
        std::process::exit(1);
    }
}

fn copy(input: &str, output: &str) -> Result<(), GgufError> {
    let file = GgufFile::open(input)?;
    let w = GgufWriter::from_gguf(&file)?;
    let n = w.write_to_path(output, |i, buf| {
        if let Some(t) = file.tensors().get(i) {
            buf.extend_from_slice(file.tensor_data(t));
        }
        Ok(())
    })?;
    println!(
        "{input} -> {output}: {} kv, {} tensors, {n} bytes",
        file.metadata().len(),
        file.tensors().len()
    );
    Ok(())
}

/// Values checked by `tools/gguf_roundtrip_check.py` (keep in sync).
fn demo(output: &str) -> Result<(), GgufError> {
    let mut w = GgufWriter::new();
    w.add_metadata(keys::GENERAL_ARCHITECTURE, Value::from("llama"))?;
    w.add_metadata(keys::GENERAL_ALIGNMENT, Value::U32(64))?;
    w.add_metadata("demo.empty", Value::Array(Array::empty(ValueType::F32)))?;
    w.add_metadata(
        "demo.nested",
        Value::Array(Array::Array(vec![
            Array::I16(vec![1, -2]),
            Array::String(vec!["x".into()]),
        ])),
    )?;
    w.add_metadata("demo.i64", Value::I64(-5))?;
    w.add_tensor("x", vec![3], GgmlType::F32)?; // [3] f32 = 1, 2, 3
    w.add_tensor("y", vec![32, 2], GgmlType::Q8_0)?; // [2, 32] q8_0, bytes 0..68
    w.write_to_path(output, |i, buf| {
        if i == 0 {
            for v in [1.0f32, 2.0, 3.0] {
                buf.extend_from_slice(&v.to_le_bytes());
            }
        } else {
            buf.extend(0..68u8);
        }
        Ok(())
    })?;
    Ok(())
}
