//! Sampler configuration: llama.cpp's defaults and the `--samplers` order string.

use crate::RuntimeError;

/// A configurable stage of the chain (the subset of llama.cpp's `common_sampler_type` we
/// implement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// Repetition / frequency / presence penalties (`penalties`).
    Penalties,
    /// Top-k (`top_k`).
    TopK,
    /// Locally typical sampling (`typ_p`).
    TypicalP,
    /// Nucleus sampling (`top_p`).
    TopP,
    /// Min-p (`min_p`).
    MinP,
    /// Temperature (`temperature`).
    Temperature,
}

/// llama.cpp's default order `penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature`
/// minus the stages we do not implement (dry, top_n_sigma and xtc are all disabled at
/// llama.cpp's default parameters, so the default chains behave the same).
pub const DEFAULT_ORDER: [SamplerKind; 6] = [
    SamplerKind::Penalties,
    SamplerKind::TopK,
    SamplerKind::TypicalP,
    SamplerKind::TopP,
    SamplerKind::MinP,
    SamplerKind::Temperature,
];

/// Every accepted spelling (canonical llama.cpp names, their kebab-case and no-underscore
/// forms, and llama.cpp's extra aliases), lower case.
const ALIASES: &[(&str, SamplerKind)] = &[
    ("penalties", SamplerKind::Penalties),
    ("top_k", SamplerKind::TopK),
    ("top-k", SamplerKind::TopK),
    ("topk", SamplerKind::TopK),
    ("typ_p", SamplerKind::TypicalP),
    ("typ-p", SamplerKind::TypicalP),
    ("typp", SamplerKind::TypicalP),
    ("typ", SamplerKind::TypicalP),
    ("typical_p", SamplerKind::TypicalP),
    ("typical", SamplerKind::TypicalP),
    ("top_p", SamplerKind::TopP),
    ("top-p", SamplerKind::TopP),
    ("topp", SamplerKind::TopP),
    ("nucleus", SamplerKind::TopP),
    ("min_p", SamplerKind::MinP),
    ("min-p", SamplerKind::MinP),
    ("minp", SamplerKind::MinP),
    ("temperature", SamplerKind::Temperature),
    ("temp", SamplerKind::Temperature),
];

/// llama.cpp sampler names we recognise but do not implement.
const UNSUPPORTED: &[&str] = &[
    "dry",
    "top_n_sigma",
    "top-n-sigma",
    "topnsigma",
    "xtc",
    "infill",
    "adaptive_p",
    "adaptive-p",
    "adaptivep",
    "mirostat",
    "mirostat_v2",
];

impl SamplerKind {
    /// Canonical llama.cpp name (`top_k`, `typ_p`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Penalties => "penalties",
            Self::TopK => "top_k",
            Self::TypicalP => "typ_p",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::Temperature => "temperature",
        }
    }

    /// llama.cpp's one-letter code (`--sampling-seq`): e k y p m t.
    pub fn code(self) -> char {
        match self {
            Self::Penalties => 'e',
            Self::TopK => 'k',
            Self::TypicalP => 'y',
            Self::TopP => 'p',
            Self::MinP => 'm',
            Self::Temperature => 't',
        }
    }

    /// Parses one name (case-insensitive, aliases accepted).
    pub fn parse(name: &str) -> Result<Self, RuntimeError> {
        let lower = name.trim().to_ascii_lowercase();
        if let Some(&(_, k)) = ALIASES.iter().find(|(n, _)| *n == lower) {
            return Ok(k);
        }
        let supported = || {
            DEFAULT_ORDER
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if UNSUPPORTED.contains(&lower.as_str()) {
            return Err(RuntimeError::UnsupportedSampler {
                name: name.trim().to_string(),
                supported: supported(),
            });
        }
        Err(RuntimeError::UnknownSampler {
            name: name.trim().to_string(),
            known: supported(),
        })
    }

    /// Parses an order string like llama.cpp's `--samplers`: names separated by `;` (`,` is
    /// accepted too), e.g. `penalties;top_k;top_p;min_p;temperature`. Empty segments are
    /// skipped; an empty string gives an empty order (only the final pick).
    pub fn parse_order(s: &str) -> Result<Vec<Self>, RuntimeError> {
        s.split([';', ','])
            .filter(|n| !n.trim().is_empty())
            .map(Self::parse)
            .collect()
    }

    /// Parses llama.cpp's `--sampling-seq` letter form, e.g. `ekypmt`.
    pub fn parse_codes(s: &str) -> Result<Vec<Self>, RuntimeError> {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| {
                DEFAULT_ORDER
                    .iter()
                    .copied()
                    .find(|k| k.code() == c)
                    .ok_or_else(|| {
                        let known = DEFAULT_ORDER
                            .iter()
                            .map(|k| format!("{} ({})", k.code(), k.name()))
                            .collect::<Vec<_>>()
                            .join(", ");
                        if "dsxia".contains(c) {
                            RuntimeError::UnsupportedSampler {
                                name: c.to_string(),
                                supported: known,
                            }
                        } else {
                            RuntimeError::UnknownSampler {
                                name: c.to_string(),
                                known,
                            }
                        }
                    })
            })
            .collect()
    }

    /// Formats an order back to the `;`-separated string.
    pub fn order_to_string(order: &[Self]) -> String {
        order.iter().map(|k| k.name()).collect::<Vec<_>>().join(";")
    }
}

/// Sampling parameters. [`Default`] gives llama.cpp's `common_params_sampling` defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Temperature; `<= 0` samples greedily (argmax). Default 0.8.
    pub temp: f32,
    /// Top-k; 0 disables. Default 40.
    pub top_k: usize,
    /// Top-p in (0, 1]; 1 disables. Default 0.95.
    pub top_p: f32,
    /// Min-p in [0, 1]; 0 disables. Default 0.05.
    pub min_p: f32,
    /// Typical-p in (0, 1]; 1 disables. Default 1.0.
    pub typical_p: f32,
    /// Repetition penalty (> 0); 1 disables. Default 1.0.
    pub repeat_penalty: f32,
    /// Size of the penalty window in tokens; 0 disables penalties. Default 64.
    pub repeat_last_n: usize,
    /// Presence penalty, subtracted once per seen token; 0 disables. Default 0.
    pub presence_penalty: f32,
    /// Frequency penalty, subtracted per occurrence; 0 disables. Default 0.
    pub frequency_penalty: f32,
    /// RNG seed; `None` (or [`super::DEFAULT_SEED`]) picks a random seed from the clock, like
    /// llama.cpp's `LLAMA_DEFAULT_SEED`.
    pub seed: Option<u64>,
    /// Stage order; default [`DEFAULT_ORDER`].
    pub order: Vec<SamplerKind>,
    /// Minimum number of candidates top-p / min-p / typical-p keep. Default 0 (= 1).
    pub min_keep: usize,
    /// `(token, bias)` pairs added to the logits before every other stage.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            order: DEFAULT_ORDER.to_vec(),
            min_keep: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding (temperature 0, no penalties).
    pub fn greedy() -> Self {
        Self {
            temp: 0.0,
            ..Self::default()
        }
    }

    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        fn bad(param: &'static str, value: f32, reason: &'static str) -> RuntimeError {
            RuntimeError::InvalidSamplerParam {
                param,
                value: value.to_string(),
                reason,
            }
        }
        let finite = [
            ("temp", self.temp),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        for (name, v) in finite {
            if !v.is_finite() {
                return Err(bad(name, v, "must be a finite number"));
            }
        }
        let unit = [
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("typical_p", self.typical_p),
        ];
        for (name, v) in unit {
            if !(0.0..=1.0).contains(&v) {
                return Err(bad(name, v, "must be in [0, 1]"));
            }
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(bad(
                "repeat_penalty",
                self.repeat_penalty,
                "must be > 0 (1 disables)",
            ));
        }
        for &(tok, b) in &self.logit_bias {
            if b.is_nan() {
                return Err(RuntimeError::InvalidSamplerParam {
                    param: "logit_bias",
                    value: format!("{tok}:{b}"),
                    reason: "bias must not be NaN",
                });
            }
        }
        Ok(())
    }
}
