//! Matrix products against (possibly quantized) weights, and embedding-row lookup.

use damascus_quant::{GgmlType, dequantize_row};

use super::KernelError;

/// A borrowed weight matrix `[rows, cols]` of any dequantizable type: `rows` rows, each holding
/// `cols` elements packed as whole ggml blocks, rows contiguous one after the other.
///
/// In GGUF terms `cols = dims[0]` (the contiguous dimension) and `rows = dims[1]`.
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    /// Element type of the packed data.
    pub dtype: GgmlType,
    /// Number of rows (output features for a projection).
    pub rows: usize,
    /// Elements per row (input features for a projection).
    pub cols: usize,
    /// Packed bytes: `rows * row_bytes(cols)`.
    pub data: &'a [u8],
}

impl<'a> WeightView<'a> {
    /// Builds a view, checking that `data` holds exactly `rows` rows of `cols` elements.
    pub fn new(
        dtype: GgmlType,
        rows: usize,
        cols: usize,
        data: &'a [u8],
    ) -> Result<Self, KernelError> {
        let expected = dtype
            .row_bytes(cols as u64)
            .and_then(|rb| rb.checked_mul(rows as u64))
            .and_then(|n| usize::try_from(n).ok());
        match expected {
            Some(expected) if expected == data.len() => Ok(Self {
                dtype,
                rows,
                cols,
                data,
            }),
            _ => Err(KernelError::WeightBytes {
                dtype,
                rows,
                cols,
                expected: expected.unwrap_or(usize::MAX),
                found: data.len(),
            }),
        }
    }

    /// Bytes per packed row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The packed bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// Dequantizes row `r` into `out` (`[cols]` f32).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KernelError> {
        dequantize_row(self.dtype, self.row(r), out).map_err(|source| KernelError::Dequant {
            row: r,
            dtype: self.dtype,
            source,
        })
    }
}

/// `y = x · Wᵀ`: every token's activation row times every weight row.
///
/// * `w`: `[rows, cols]` any dequantizable type
/// * `x`: `[n_tokens, cols]` f32
/// * `y`: `[n_tokens, rows]` f32 (overwritten)
///
/// Each weight row is dequantized once into a `[cols]` scratch row and dotted with all tokens,
/// so the whole matrix is never materialized in f32. A single token is a matrix-vector product.
pub fn matmul(w: &WeightView<'_>, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
    let n_tokens = x.len() / w.cols.max(1);
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x is not [n_tokens, {}]",
        w.cols
    );
    assert_eq!(
        y.len(),
        n_tokens * w.rows,
        "matmul: y is not [{n_tokens}, {}]",
        w.rows
    );
    let mut row = vec![0f32; w.cols]; // [cols] f32, one dequantized weight row
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row)?;
        for t in 0..n_tokens {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            y[t * w.rows + r] = dot(&row, xt);
        }
    }
    Ok(())
}

/// Dot product of two equally long f32 slices, accumulated left to right in f32.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Embedding lookup: `out[t] = table[ids[t]]`, dequantizing only the rows needed.
///
/// * `table`: `[n_vocab, n_embd]` any dequantizable type
/// * `ids`: `[n_tokens]`
/// * `out`: `[n_tokens, n_embd]` f32 (overwritten)
pub fn embed_rows(table: &WeightView<'_>, ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
    assert_eq!(
        out.len(),
        ids.len() * table.cols,
        "embed_rows: out is not [n_tokens, n_embd]"
    );
    for (t, &id) in ids.iter().enumerate() {
        let r = id as usize;
        if r >= table.rows {
            return Err(KernelError::TokenOutOfRange {
                id,
                n_vocab: table.rows,
            });
        }
        table.dequantize_row(r, &mut out[t * table.cols..(t + 1) * table.cols])?;
    }
    Ok(())
}
