//! Row-parallel conversion of one tensor: every row is produced as f32 (by dequantizing a
//! source row, or by a generator), then encoded to the target type.
//!
//! Rows are split into one contiguous range per thread with `std::thread::scope`; each thread
//! owns a disjoint slice of the output buffer, so the result does not depend on the thread
//! count.

use damascus_gguf::GgmlType;

use crate::{ConvertError, Progress};

/// The message of the row error that a cancellation produces.
pub(crate) const CANCELLED: &str = "cancelled";

/// Encode one f32 row as `dtype` into `dst` (exactly `row_bytes` long).
pub fn encode_row(dtype: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), String> {
    if dtype == GgmlType::F32 {
        for (d, &x) in dst.chunks_exact_mut(4).zip(src) {
            d.copy_from_slice(&x.to_le_bytes());
        }
        return Ok(());
    }
    damascus_quant::quantize_row(dtype, src, dst).map_err(|e| e.to_string())
}

/// Decode one row stored as `dtype` from `src` into `dst` f32 values.
pub fn decode_row(dtype: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    if dtype == GgmlType::F32 {
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
        return Ok(());
    }
    damascus_quant::dequantize_row(dtype, src, dst).map_err(|e| e.to_string())
}

/// One tensor conversion job.
pub struct RowJob<'a> {
    /// Tensor name (for errors).
    pub name: &'a str,
    /// Elements per row (`dims[0]`).
    pub n_per_row: usize,
    /// Number of rows (product of the other dims).
    pub n_rows: usize,
    /// Target type.
    pub dst_type: GgmlType,
    /// Worker threads (≥ 1).
    pub threads: usize,
}

/// Fill `dst` (`n_rows * row_bytes(dst_type)` bytes) row by row. `fill(row, buf)` writes the
/// f32 values of row `row` into `buf` (`[n_per_row] f32`). Workers report finished elements
/// to `progress` and stop early when it is cancelled.
pub fn convert_rows<F>(
    job: &RowJob<'_>,
    dst: &mut [u8],
    fill: F,
    progress: &dyn Progress,
) -> Result<(), ConvertError>
where
    F: Fn(usize, &mut [f32]) -> Result<(), String> + Sync,
{
    let row_bytes = job
        .dst_type
        .row_bytes(job.n_per_row as u64)
        .ok_or_else(|| ConvertError::Shape {
            tensor: job.name.to_string(),
            reason: format!(
                "row length {} is not a multiple of the {} block size {}",
                job.n_per_row,
                job.dst_type,
                job.dst_type.block_size()
            ),
        })? as usize;
    if dst.len() != row_bytes * job.n_rows {
        return Err(ConvertError::Shape {
            tensor: job.name.to_string(),
            reason: format!(
                "output buffer is {} bytes, expected {} rows x {} bytes",
                dst.len(),
                job.n_rows,
                row_bytes
            ),
        });
    }
    if job.n_rows == 0 || row_bytes == 0 {
        return Ok(());
    }
    let threads = job.threads.clamp(1, job.n_rows);
    let rows_per_thread = job.n_rows.div_ceil(threads);
    // Report progress every this many rows, so big tensors move the bar smoothly.
    let report_every = (1 << 20) / job.n_per_row.max(1) + 1;

    let work = |first_row: usize, out: &mut [u8]| -> Result<(), String> {
        let mut buf = vec![0f32; job.n_per_row]; // [n_per_row] f32
        let mut pending = 0usize;
        for (i, dst_row) in out.chunks_exact_mut(row_bytes).enumerate() {
            let row = first_row + i;
            fill(row, &mut buf).map_err(|e| format!("row {row}: {e}"))?;
            encode_row(job.dst_type, &buf, dst_row).map_err(|e| format!("row {row}: {e}"))?;
            pending += 1;
            if pending == report_every {
                progress.advance((pending * job.n_per_row) as u64);
                pending = 0;
                if progress.is_cancelled() {
                    return Err(CANCELLED.to_string());
                }
            }
        }
        progress.advance((pending * job.n_per_row) as u64);
        Ok(())
    };

    let result: Result<(), String> = if threads == 1 {
        work(0, dst)
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = dst
                .chunks_mut(rows_per_thread * row_bytes)
                .enumerate()
                .map(|(t, chunk)| {
                    let work = &work;
                    s.spawn(move || work(t * rows_per_thread, chunk))
                })
                .collect();
            let mut first_err = Ok(());
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err("worker thread panicked".to_string()));
                if first_err.is_ok() {
                    first_err = r;
                }
            }
            first_err
        })
    };
    result.map_err(|reason| ConvertError::Convert {
        tensor: job.name.to_string(),
        to: job.dst_type,
        reason,
    })
}
