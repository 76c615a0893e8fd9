//! Log-probabilities of raw logits, for `--json` output and an OpenAI-style server.

/// A token with its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    /// Token id.
    pub id: u32,
    /// Natural-log probability under the softmax of the raw logits.
    pub logprob: f32,
}

/// NaN -> `-inf`, `+inf` -> `f32::MAX`, as the sampler does.
fn sanitize(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l.min(f32::MAX)
    }
}

/// Log-probability of raw logit `l` given the log-sum-exp of all `n` logits.
fn logprob(l: f32, lse: f32, n: usize) -> f32 {
    if lse == f32::NEG_INFINITY {
        -(n as f32).ln()
    } else {
        sanitize(l) - lse
    }
}

/// `max + ln(sum(exp(l - max)))` over the sanitized logits.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits
        .iter()
        .map(|&l| sanitize(l))
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from((sanitize(l) - max).exp()))
        .sum();
    max + sum.ln() as f32
}

/// Log-softmax of `logits` (`[n_vocab] f32`) -> `[n_vocab] f32`. NaN logits get `-inf`; all `-inf`
/// logits give all `NaN` (no distribution).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let lse = log_sum_exp(logits);
    logits
        .iter()
        .map(|&l| logprob(l, lse, logits.len()))
        .collect()
}

/// Log-probability of `token` under the softmax of `logits`; `None` if out of range.
pub fn token_logprob(logits: &[f32], token: u32) -> Option<f32> {
    let l = *logits.get(token as usize)?;
    Some(logprob(l, log_sum_exp(logits), logits.len()))
}

/// The `n` most likely tokens with their log-probabilities, most likely first (ties: lower id).
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<TokenLogprob> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let lse = log_sum_exp(logits);
    let mut all: Vec<TokenLogprob> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| TokenLogprob {
            id: i as u32,
            logprob: if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l - lse
            },
        })
        .collect();
    let cmp =
        |a: &TokenLogprob, b: &TokenLogprob| b.logprob.total_cmp(&a.logprob).then(a.id.cmp(&b.id));
    if n < all.len() {
        all.select_nth_unstable_by(n - 1, cmp);
        all.truncate(n);
    }
    all.sort_unstable_by(cmp);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalises() {
        let logits = [1.0f32, 2.0, 3.0, -1.0];
        let lp = log_softmax(&logits);
        let s: f32 = lp.iter().map(|x| x.exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!((token_logprob(&logits, 2).unwrap() - lp[2]).abs() < 1e-6);
        assert_eq!(token_logprob(&logits, 9), None);
    }

    #[test]
    fn top_logprobs_sorted() {
        let logits = [0.5f32, 3.0, 3.0, -2.0, 1.0];
        let top = top_logprobs(&logits, 3);
        let ids: Vec<u32> = top.iter().map(|t| t.id).collect();
        assert_eq!(ids, vec![1, 2, 4]);
        assert!(top[0].logprob >= top[2].logprob);
        assert_eq!(top_logprobs(&logits, 10).len(), 5);
        assert!(top_logprobs(&[], 3).is_empty());
    }

    #[test]
    fn handles_inf_and_nan() {
        let logits = [f32::NEG_INFINITY, 0.0, f32::NAN];
        let lp = log_softmax(&logits);
        assert_eq!(lp[0], f32::NEG_INFINITY);
        assert!(lp[1].abs() < 1e-6);
        assert_eq!(lp[2], f32::NEG_INFINITY);
        let lp = log_softmax(&[f32::INFINITY, 1.0]);
        assert_eq!(lp[0], 0.0);
        assert!(lp[1] < -1e30);
        let lp = log_softmax(&[f32::NEG_INFINITY; 4]);
        assert!(lp.iter().all(|&x| (x - 0.25f32.ln()).abs() < 1e-6));
    }
}
