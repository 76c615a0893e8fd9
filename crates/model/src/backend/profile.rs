//! A per-op wall-clock profile for synchronous (host) backends, switched on with
//! [`damascus_kernels::settings::KernelSettings::profile`] (`DAMASCUS_PROFILE=1` in the CLI): each op adds its elapsed time under a key (op, weight class, prompt or
//! decode), and the table is printed to stderr when the backend is dropped. Passes are
//! grouped by kind: `tg` (one row), `b<n>` (a batch of 2..=64 rows: decode steps of several
//! sequences, short prompt chunks), `pp` (longer prompts). A dev tool: the clock reads cost
//! ≈ 50 ns an op, nothing when it is off.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Rows above which a pass counts as a prompt (`pp`) rather than a batch (`b<n>`).
const BATCH_MAX: usize = 64;

/// Accumulated `(calls, seconds)` per (pass kind, key), the number of forward passes of
/// each kind, and the current pass's kind.
#[derive(Debug, Default)]
pub struct OpProfile {
    ops: Mutex<HashMap<(String, String), (u64, f64)>>,
    passes: Mutex<(HashMap<String, u64>, String)>,
}

/// The kind of a pass of `n_tokens` rows.
fn kind(n_tokens: usize) -> String {
    match n_tokens {
        0 | 1 => "tg".into(),
        n if n <= BATCH_MAX => format!("b{n}"),
        _ => "pp".into(),
    }
}

impl OpProfile {
    /// Starts a forward pass of `n_tokens` rows; the ops until the next pass count under its
    /// kind (a prompt's one-row LM head too).
    pub fn pass(&self, n_tokens: usize) {
        let mut p = self.passes.lock().unwrap_or_else(|p| p.into_inner());
        let k = kind(n_tokens);
        *p.0.entry(k.clone()).or_default() += 1;
        p.1 = k;
    }

    /// Runs `f`, adding its time under `key()` in the current pass's table.
    pub fn time<T>(&self, key: impl FnOnce() -> String, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        let dt = t0.elapsed().as_secs_f64();
        let kind = self
            .passes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .clone();
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let e = ops.entry((kind, key())).or_default();
        e.0 += 1;
        e.1 += dt;
        r
    }

    /// The table: per kind of pass, ms per pass and share of each key, largest first.
    pub fn report(&self) -> String {
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let passes = self.passes.lock().unwrap_or_else(|p| p.into_inner());
        let mut kinds: Vec<(&String, &u64)> = passes.0.iter().collect();
        // pp, then the batches by rows, then tg.
        let order = |k: &str| match k {
            "pp" => 0,
            "tg" => usize::MAX,
            b => b[1..].parse::<usize>().map_or(1, |n| BATCH_MAX + 1 - n),
        };
        kinds.sort_by_key(|(k, _)| order(k));
        let mut out = String::new();
        for (kind, &passes) in kinds {
            let mut rows: Vec<_> = ops.iter().filter(|((k, _), _)| k == kind).collect();
            if rows.is_empty() {
                continue;
            }
            rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
            let total: f64 = rows.iter().map(|r| r.1.1).sum();
            let n = passes.max(1) as f64;
            out += &format!(
                "damascus cpu profile ({kind}): {passes} passes, {:.2} ms of ops per pass\n\
                 {:>10} {:>8} {:>6}  op\n",
                1e3 * total / n,
                "ms/pass",
                "calls",
                "%"
            );
            for ((_, k), (calls, s)) in rows {
                out += &format!(
                    "{:>10.3} {:>8} {:>5.1}%  {}\n",
                    1e3 * s / n,
                    calls,
                    100.0 * s / total.max(1e-12),
                    k
                );
            }
        }
        out
    }
}

/// A weight's name without its layer (`blk.3.attn_q.weight` → `attn_q`), so layers sum up.
pub fn weight_class(name: &str) -> &str {
    let n = name.strip_suffix(".weight").unwrap_or(name);
    match n.strip_prefix("blk.") {
        Some(rest) => rest.split_once('.').map_or(rest, |(_, r)| r),
        None => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_accumulate_per_pass_kind() {
        let p = OpProfile::default();
        p.pass(512);
        p.time(|| "gemm attn_q".into(), || ());
        p.time(|| "gemm attn_q".into(), || ());
        p.pass(8);
        p.time(|| "gemv attn_q".into(), || ());
        p.pass(1);
        p.time(|| "dot attn_q".into(), || ());
        let r = p.report();
        assert!(r.contains("(pp): 1 passes"), "{r}");
        assert!(r.contains("gemm attn_q"), "{r}");
        assert!(r.contains("(b8): 1 passes"), "{r}");
        assert!(r.contains("(tg): 1 passes"), "{r}");
        assert_eq!(weight_class("blk.12.ffn_down.weight"), "ffn_down");
        assert_eq!(weight_class("output.weight"), "output");
    }
}
