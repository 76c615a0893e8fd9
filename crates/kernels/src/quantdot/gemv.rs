//! Quantized GEMV: `out[r] = W[r, :] · x` for a row-major matrix of ggml
//! blocks, split over a [`ThreadPool`] in row chunks.

use std::ops::Range;

use super::dispatch::check_pair;
use super::{Acts, DotKernels, KernelError, WeightType, kernels};
use crate::pool::{ThreadPool, chunk_len};

/// Rows per scheduling unit (keeps chunks cache-line friendly in `out` and
/// leaves room for interleaved-row layouts later).
pub const ROW_ALIGN: usize = 4;

/// Single-threaded GEMV over `rows`: `out[i] = W[rows.start + i] · a`.
///
/// `w`: `[n, row_bytes]` u8 (ggml blocks, `row_bytes` = `wtype.row_bytes(k)`),
/// `a`: quantized activations of length `k`, `out`: `[rows.len()]` f32.
pub fn gemv_rows(
    kern: &DotKernels,
    wtype: WeightType,
    w: &[u8],
    a: Acts<'_>,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let rb = check(wtype, w, a, out.len().max(rows.end))?;
    if out.len() != rows.len() {
        return Err(KernelError::BadLength {
            what: "gemv output",
            expected: rows.len(),
            found: out.len(),
            unit: "elements",
        });
    }
    for (o, r) in out.iter_mut().zip(rows) {
        *o = kern.dot_unchecked_len(wtype, &w[r * rb..(r + 1) * rb], a);
    }
    Ok(())
}

/// Validates shapes; returns the row stride in bytes.
fn check(wtype: WeightType, w: &[u8], a: Acts<'_>, n_rows: usize) -> Result<usize, KernelError> {
    check_pair(wtype, a)?;
    let k = a.n_elems();
    let rb = wtype.row_bytes(k).ok_or(KernelError::BadRowLength {
        wtype,
        k,
        block: wtype.block_elems(),
    })?;
    let need = rb.saturating_mul(n_rows);
    if w.len() < need {
        return Err(KernelError::BadLength {
            what: "weight matrix",
            expected: need,
            found: w.len(),
            unit: "bytes",
        });
    }
    Ok(rb)
}

/// GEMV `out = W · a` with `W`: `[out.len(), row_bytes]` u8, using the
/// process-wide kernels and the pool's threads (or the caller only).
pub fn gemv(
    wtype: WeightType,
    w: &[u8],
    a: Acts<'_>,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    gemv_with(kernels(), wtype, w, a, out, pool)
}

/// [`gemv`] with an explicit kernel table (benchmarks, per-ISA tests).
pub fn gemv_with(
    kern: &DotKernels,
    wtype: WeightType,
    w: &[u8],
    a: Acts<'_>,
    out: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    let n = out.len();
    let rb = check(wtype, w, a, n)?;
    if w.len() != rb * n {
        return Err(KernelError::BadLength {
            what: "weight matrix",
            expected: rb * n,
            found: w.len(),
            unit: "bytes",
        });
    }
    let Some(pool) = pool.filter(|p| p.n_threads() > 1) else {
        return gemv_rows(kern, wtype, w, a, 0..n, out);
    };
    // Chunks of rows handed out over the pool (a late thread costs one chunk).
    let per = chunk_len(n, ROW_ALIGN, pool.n_threads());
    pool.for_each_chunk_mut(out, per, &|c, o| {
        for (i, v) in o.iter_mut().enumerate() {
            let r = c * per + i;
            *v = kern.dot_unchecked_len(wtype, &w[r * rb..(r + 1) * rb], a);
        }
    });
    Ok(())
}
