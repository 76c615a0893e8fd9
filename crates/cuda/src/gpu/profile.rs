//! Per-op GPU times (`DAMASCUS_CUDA_PROFILE=1`, a dev tool): each op of an eager flush is
//! bracketed by events, and the totals are printed when the device is dropped.

use std::collections::HashMap;

/// Per-op GPU time (dev tool): each op of an eager flush is bracketed by events; totals are
/// keyed by kernel name and grid, so the GEMVs of different matrices show apart.
#[derive(Default)]
pub(super) struct Profile {
    /// key -> (calls, milliseconds)
    pub(super) ops: HashMap<String, (u64, f64)>,
    pub(super) passes: u64,
}

impl Profile {
    pub(super) fn report(&self) -> String {
        let total: f64 = self.ops.values().map(|v| v.1).sum();
        let mut rows: Vec<_> = self.ops.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        let passes = self.passes.max(1) as f64;
        let mut out = format!(
            "damascus cuda profile: {} flushes, {:.3} ms GPU per flush\n{:>9} {:>8} {:>9} {:>6}  op\n",
            self.passes,
            total / passes,
            "us/flush",
            "calls",
            "us/call",
            "%"
        );
        for (k, (n, ms)) in rows {
            out += &format!(
                "{:>9.1} {:>8} {:>9.2} {:>5.1}%  {k}\n",
                ms * 1e3 / passes,
                n,
                ms * 1e3 / *n as f64,
                100.0 * ms / total.max(1e-9)
            );
        }
        out
    }
}
