//! `damascus list [--json] [--known] [--no-verify]`: the models in the cache (name, path, size,
//! whether the SHA-256 matches the pinned one), or with `--known` the models that can be pulled
//! by name.

use damascus_hub::{CachedModel, MODELS, cache_dir, cached_models};
use serde_json::json;

/// Flags of `damascus list`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Print JSON (one array) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// List the models known by name (what `pull NAME` and `-m NAME` accept) instead.
    #[arg(long)]
    pub known: bool,
    /// Skip hashing the cached files (sizes are still checked).
    #[arg(long)]
    pub no_verify: bool,
}

/// Run `damascus list`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let cache = cache_dir()?;
    if args.known {
        if args.json {
            let v: Vec<_> = MODELS
                .iter()
                .map(|m| {
                    json!({
                        "name": m.name,
                        "description": m.description,
                        "size": m.size,
                        "sha256": m.sha256,
                        "cached": m.cached_in(&cache).is_some(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for m in MODELS {
                let cached = if m.cached_in(&cache).is_some() {
                    "cached"
                } else {
                    "-"
                };
                println!(
                    "{:<14} {:>9}  {:<6}  {}",
                    m.name,
                    human(m.size),
                    cached,
                    m.description
                );
            }
        }
        return Ok(());
    }
    let models = cached_models(&cache, !args.no_verify)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&models))?);
        return Ok(());
    }
    print!("{}", table(&models));
    if models.is_empty() {
        eprintln!(
            "no models cached in {} (try `damascus pull` or `damascus list --known`)",
            cache.display()
        );
    }
    Ok(())
}

fn sha_text(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "ok",
        Some(false) => "MISMATCH",
        None => "-",
    }
}

/// The JSON form: `[{name, path, size, sha_ok}]` (`sha_ok` null when unknown or unchecked).
pub fn to_json(models: &[CachedModel]) -> serde_json::Value {
    models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "path": m.path.display().to_string(),
                "size": m.size,
                "sha_ok": m.sha_ok,
            })
        })
        .collect()
}

/// The table form: a header line, then one line per model.
pub fn table(models: &[CachedModel]) -> String {
    let w = models
        .iter()
        .map(|m| m.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut s = format!("{:<w$}  {:>9}  {:<8}  PATH\n", "NAME", "SIZE", "SHA256");
    for m in models {
        s += &format!(
            "{:<w$}  {:>9}  {:<8}  {}\n",
            m.name,
            human(m.size),
            sha_text(m.sha_ok),
            m.path.display()
        );
    }
    s
}

/// Bytes as `253.1 MB`.
fn human(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "kB", "MB", "GB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
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
    fn table_and_json_forms() {
        let models = vec![
            CachedModel {
                name: "gemma3-270m".into(),
                path: "/c/models/gemma-3-270m-q4_k_m.gguf".into(),
                size: 253_113_024,
                sha_ok: Some(true),
            },
            CachedModel {
                name: "x.gguf".into(),
                path: "/c/models/url-00/x.gguf".into(),
                size: 12,
                sha_ok: None,
            },
        ];
        let t = table(&models);
        let lines: Vec<_> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("NAME"));
        assert!(
            lines[1].contains("gemma3-270m")
                && lines[1].contains("253.1 MB")
                && lines[1].contains(" ok "),
            "{t}"
        );
        assert!(lines[2].contains("12 B") && lines[2].contains(" - "), "{t}");
        let j = to_json(&models);
        assert_eq!(j[0]["size"], 253_113_024);
        assert_eq!(j[0]["sha_ok"], true);
        assert!(j[1]["sha_ok"].is_null());
        assert_eq!(j[1]["path"], "/c/models/url-00/x.gguf");
    }
}
