//! `damascus load [MODEL.gguf] [--json] [--reference config.json]`: open a GGUF file, read
//! the model config from its metadata, check every tensor's shape against it and print a
//! summary. Every number comes from the file. With `--reference`, the config is compared
//! field by field with a Hugging Face `config.json`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use damascus_gguf::{GgmlType, GgufFile};
use damascus_model::config::{ModelConfig, RopeScalingKind};
use serde_json::{Value as Json, json};

/// Flags of `damascus load`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// GGUF file or http(s) URL (default: the default model, pulled on first use).
    #[arg(value_name = "MODEL")]
    pub path: Option<String>,
    #[command(flatten)]
    model: super::ModelArg,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Compare the config with a Hugging Face config.json; non-zero exit on mismatch.
    #[arg(long, value_name = "CONFIG_JSON")]
    pub reference: Option<PathBuf>,
}

/// What `load` learned, for both output formats.
struct Summary {
    path: PathBuf,
    version: u32,
    file_size: u64,
    file_type: String,
    n_tensors: usize,
    n_params: u64,
    config: ModelConfig,
    seconds: f64,
}

/// Run `damascus load`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = match (&args.path, &args.model.model) {
        (Some(_), Some(_)) => bail!("give the model either as MODEL or with -m, not both"),
        (Some(p), None) => Some(p.clone()),
        (None, m) => m.clone(),
    };
    let path = super::ModelArg { model: spec }.resolve()?;
    let summary = load(&path)?;
    let reference = match &args.reference {
        Some(r) => Some(compare_reference(&summary.config, r)?),
        None => None,
    };
    if args.json {
        let mut j = to_json(&summary);
        if let Some(m) = &reference {
            j["reference"] = json!({ "matches": m.is_empty(), "mismatches": m });
        }
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        print_text(&summary);
        if let Some(m) = &reference {
            if m.is_empty() {
                println!("config ✓ matches reference");
            } else {
                println!(
                    "config ✗ {} mismatch{} with reference:",
                    m.len(),
                    if m.len() == 1 { "" } else { "es" }
                );
                for line in m {
                    println!("  {line}");
                }
            }
        }
    }
    match reference {
        Some(m) if !m.is_empty() => bail!(
            "config does not match the reference ({} mismatches)",
            m.len()
        ),
        _ => Ok(()),
    }
}

/// Open, parse the config and check the tensors, timing all of it.
fn load(path: &Path) -> anyhow::Result<Summary> {
    let t0 = Instant::now();
    let file = GgufFile::open(path).with_context(|| path.display().to_string())?;
    let config = ModelConfig::from_gguf(&file).with_context(|| path.display().to_string())?;
    config
        .check_tensors(&file)
        .with_context(|| format!("{}: config ✗ inconsistent", path.display()))?;
    let seconds = t0.elapsed().as_secs_f64();
    let file_type = match config.file_type {
        Some(ft) => ft.name().to_string(),
        None => guess_file_type(&file),
    };
    Ok(Summary {
        path: path.to_path_buf(),
        version: file.version(),
        file_size: file.file_size(),
        file_type,
        n_tensors: file.tensors().len(),
        n_params: file.tensors().iter().map(|t| t.n_elements()).sum(),
        config,
        seconds,
    })
}

/// Without `general.file_type`: the most common type among 2-D tensors, marked as a guess.
fn guess_file_type(file: &GgufFile) -> String {
    let mut counts: Vec<(GgmlType, usize)> = Vec::new();
    for t in file.tensors().iter().filter(|t| t.dims.len() >= 2) {
        match counts.iter_mut().find(|(d, _)| *d == t.dtype) {
            Some((_, n)) => *n += 1,
            None => counts.push((t.dtype, 1)),
        }
    }
    counts
        .iter()
        .max_by_key(|(_, n)| *n)
        .map(|(d, _)| format!("{} (guessed)", d.name()))
        .unwrap_or_else(|| "unknown type".into())
}

fn print_text(s: &Summary) {
    let c = &s.config;
    println!(
        "gguf v{} · {} · {}",
        s.version,
        s.file_type,
        human_bytes(s.file_size)
    );
    println!(
        "arch {} · {} layers · {} hidden",
        c.arch, c.n_layer, c.n_embd
    );
    println!("ffn {} · {} · RMSNorm", c.ffn_name(), c.n_ff);
    let attn = if c.n_head_kv == c.n_head {
        "MHA"
    } else if c.n_head_kv == 1 {
        "MQA"
    } else {
        "GQA"
    };
    println!(
        "attn {attn} · {} heads / {} kv · head dim {}",
        c.n_head, c.n_head_kv, c.head_dim
    );
    let head = if c.tied_embeddings {
        "tied embeddings"
    } else {
        "separate output"
    };
    println!("vocab {} · {head}", group(c.n_vocab as u64));
    let mut rope = format!(
        "rope theta {} · dim {} · ctx {}",
        number(c.rope_theta),
        c.rope_dim,
        group(c.n_ctx_train as u64)
    );
    if let Some(sc) = &c.rope_scaling {
        rope.push_str(&format!(
            " · {} scaling ×{}",
            sc.kind.name(),
            number(sc.factor)
        ));
    }
    println!("{rope}");
    let features = c.features();
    if !features.is_empty() {
        println!("{} · {}", c.family.arch(), features.join(" · "));
    }
    if c.has_rope_freqs {
        println!(
            "llama3 rope factors (rope_freqs.weight, {} entries)",
            c.rope_dim / 2
        );
    }
    println!("loaded in {:.1}s · config ✓ consistent", s.seconds);
}

fn to_json(s: &Summary) -> Json {
    let c = &s.config;
    let scaling = c.rope_scaling.as_ref().map(|r| {
        json!({
            "type": r.kind.name(), "factor": r.factor, "original_context_length": r.original_ctx,
            "attn_factor": r.attn_factor, "finetuned": r.finetuned,
        })
    });
    json!({
        "path": s.path.display().to_string(),
        "gguf_version": s.version,
        "file_type": s.file_type,
        "file_size": s.file_size,
        "n_tensors": s.n_tensors,
        "n_params": s.n_params,
        "arch": c.arch,
        "n_layer": c.n_layer,
        "n_embd": c.n_embd,
        "n_ff": c.n_ff,
        "n_head": c.n_head,
        "n_head_kv": c.n_head_kv,
        "head_dim": c.head_dim,
        "head_dim_v": c.head_dim_v,
        "n_vocab": c.n_vocab,
        "n_ctx_train": c.n_ctx_train,
        "rope_theta": c.rope_theta,
        "rope_dim": c.rope_dim,
        "rope_scaling": scaling,
        "has_rope_freqs": c.has_rope_freqs,
        "rms_eps": c.rms_eps,
        "tied_embeddings": c.tied_embeddings,
        "ffn": c.ffn_name(),
        "features": c.features(),
        "sliding_window": c.sliding_window,
        "final_logit_softcapping": c.final_logit_softcap,
        "load_seconds": s.seconds,
        "consistent": true,
    })
}

/// Compare with a Hugging Face `config.json`; returns one line per mismatch.
fn compare_reference(c: &ModelConfig, path: &Path) -> anyhow::Result<Vec<String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let hf: Json = serde_json::from_str(&text)
        .with_context(|| format!("parsing {} as JSON", path.display()))?;
    let mut out = Vec::new();
    let int = |k: &str| hf.get(k).and_then(Json::as_u64);
    let mut cmp_int = |k: &str, want: Option<u64>, have: u32| {
        if let Some(w) = want
            && w != have as u64
        {
            out.push(format!("{k}: reference {w}, file {have}"));
        }
    };
    cmp_int("hidden_size", int("hidden_size"), c.n_embd);
    cmp_int("num_hidden_layers", int("num_hidden_layers"), c.n_layer);
    cmp_int("intermediate_size", int("intermediate_size"), c.n_ff);
    cmp_int("num_attention_heads", int("num_attention_heads"), c.n_head);
    cmp_int(
        "num_key_value_heads",
        int("num_key_value_heads").or(int("num_attention_heads")),
        c.n_head_kv,
    );
    cmp_int("vocab_size", int("vocab_size"), c.n_vocab);
    cmp_int(
        "max_position_embeddings",
        int("max_position_embeddings"),
        c.n_ctx_train,
    );
    // Only an explicit head_dim: the derived one would just echo a hidden_size mismatch.
    cmp_int("head_dim", int("head_dim"), c.head_dim);

    let close = |a: f64, b: f64, rel: f64| (a - b).abs() <= rel * a.abs().max(b.abs());
    let theta = hf
        .get("rope_theta")
        .and_then(Json::as_f64)
        .unwrap_or(10_000.0);
    if !close(theta, c.rope_theta as f64, 1e-6) {
        out.push(format!(
            "rope_theta: reference {theta}, file {}",
            c.rope_theta
        ));
    }
    if let Some(eps) = hf.get("rms_norm_eps").and_then(Json::as_f64)
        && !close(eps, c.rms_eps as f64, 1e-4)
    {
        out.push(format!(
            "rms_norm_eps: reference {eps:e}, file {:e}",
            c.rms_eps
        ));
    }
    if let Some(tied) = hf.get("tie_word_embeddings").and_then(Json::as_bool)
        && tied != c.tied_embeddings
    {
        out.push(format!(
            "tie_word_embeddings: reference {tied}, file {}",
            c.tied_embeddings
        ));
    }
    out.extend(compare_rope_scaling(
        c,
        hf.get("rope_scaling").filter(|v| !v.is_null()),
    ));
    Ok(out)
}

fn compare_rope_scaling(c: &ModelConfig, hf: Option<&Json>) -> Option<String> {
    let file_desc = match (&c.rope_scaling, c.has_rope_freqs) {
        (_, true) => "llama3 (rope_freqs.weight)".to_string(),
        (Some(s), false) => format!("{} ×{}", s.kind.name(), s.factor),
        (None, false) => "none".to_string(),
    };
    let Some(hf) = hf else {
        return (c.rope_scaling.is_some() || c.has_rope_freqs)
            .then(|| format!("rope_scaling: reference none, file {file_desc}"));
    };
    let kind = hf
        .get("rope_type")
        .or_else(|| hf.get("type"))
        .and_then(Json::as_str)
        .unwrap_or("?")
        .to_ascii_lowercase();
    let factor = hf.get("factor").and_then(Json::as_f64);
    let ok = match kind.as_str() {
        "llama3" => {
            c.has_rope_freqs
                || c.rope_scaling
                    .as_ref()
                    .is_some_and(|s| s.kind == RopeScalingKind::Llama3)
        }
        "default" => c.rope_scaling.is_none() && !c.has_rope_freqs,
        _ => c.rope_scaling.as_ref().is_some_and(|s| {
            s.kind.name() == kind
                && factor.is_none_or(|f| (f - s.factor as f64).abs() <= 1e-6 * f.abs().max(1.0))
        }),
    };
    (!ok).then(|| {
        format!(
            "rope_scaling: reference {kind}{}, file {file_desc}",
            factor.map(|f| format!(" ×{f}")).unwrap_or_default()
        )
    })
}

/// `49152` -> `49,152`.
fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// A float without a useless fraction: `100000`, `1.5`.
fn number(x: f32) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

/// `98362432` -> `93.8 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_helpers() {
        assert_eq!(group(49_152), "49,152");
        assert_eq!(group(128_256), "128,256");
        assert_eq!(group(999), "999");
        assert_eq!(group(1_000_000), "1,000,000");
        assert_eq!(number(100_000.0), "100000");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(human_bytes(98_362_432), "93.8 MiB");
        assert_eq!(human_bytes(2_019_377_440), "1.9 GiB");
        assert_eq!(human_bytes(12), "12 B");
    }
}
