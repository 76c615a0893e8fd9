//! Dev-only check on real weights: dequantize each tensor of an input GGUF and requantize it
//! to the type `llama-quantize` chose, expecting byte-identical tensor data.
//!
//! Ignored by default (needs llama.cpp and a model). Run with, e.g.:
//! ```text
//! llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf /tmp/out.gguf Q4_K_M
//! DAMASCUS_REQUANT_IN=SmolLM2-135M-Instruct.Q4_1.gguf DAMASCUS_REQUANT_OUT=/tmp/out.gguf \
//!   cargo test -p damascus-quant --test requantize_real -- --ignored --nocapture
//! ```
//! (Same-type tensors are copied by llama-quantize, so they are compared as copies.)

use damascus_gguf::GgufFile;
use damascus_quant::{dequantize_row, quantize_row};

#[test]
#[ignore = "needs DAMASCUS_REQUANT_IN / DAMASCUS_REQUANT_OUT (a llama-quantize run)"]
fn requantize_matches_llama_quantize() {
    let (Ok(inp), Ok(out)) = (
        std::env::var("DAMASCUS_REQUANT_IN"),
        std::env::var("DAMASCUS_REQUANT_OUT"),
    ) else {
        eprintln!("DAMASCUS_REQUANT_IN / DAMASCUS_REQUANT_OUT not set; skipping");
        return;
    };
    let fin = GgufFile::open(&inp).unwrap();
    let fout = GgufFile::open(&out).unwrap();
    let mut bad = Vec::new();
    let mut checked = 0;
    for t_out in fout.tensors() {
        let t_in = fin.tensor(&t_out.name).expect("tensor in input");
        let src = fin.tensor_data(t_in);
        let want = fout.tensor_data(t_out);
        if t_in.dtype == t_out.dtype {
            if src != want {
                bad.push(format!("{} (copied {})", t_out.name, t_out.dtype));
            }
            continue;
        }
        let row_len = t_in.dims[0] as usize;
        let n_rows = (t_in.n_elements() as usize) / row_len;
        let in_row = t_in.dtype.row_bytes(row_len as u64).unwrap() as usize;
        let out_row = t_out.dtype.row_bytes(row_len as u64).unwrap() as usize;
        let mut x = vec![0f32; row_len]; // [row_len] f32
        let mut q = vec![0u8; out_row];
        let mut same = true;
        for r in 0..n_rows {
            dequantize_row(t_in.dtype, &src[r * in_row..(r + 1) * in_row], &mut x).unwrap();
            quantize_row(t_out.dtype, &x, &mut q).unwrap();
            if q[..] != want[r * out_row..(r + 1) * out_row] {
                same = false;
                break;
            }
        }
        println!(
            "{:40} {:5} -> {:5} {}",
            t_out.name,
            t_in.dtype,
            t_out.dtype,
            if same { "ok" } else { "MISMATCH" }
        );
        if !same {
            bad.push(format!(
                "{} ({} -> {})",
                t_out.name, t_in.dtype, t_out.dtype
            ));
        }
        checked += 1;
    }
    println!("{checked} requantized tensors checked");
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
}
