//! `damascus serve`: an OpenAI-compatible HTTP server (see the `damascus-server` crate).
//!
//! ```text
//! $ damascus serve                              # default model on 127.0.0.1:8080
//! $ damascus serve -m model.gguf --port 9000 --parallel 4 --ctx-size 2048 --api-key secret
//! $ damascus serve -m a.gguf -m chat=b.gguf --max-loaded 1   # routed by the request's model
//! $ damascus serve --models-dir ~/models --max-memory-mb 8000
//! ```
//!
//! With several models the first is the default (requests without `model`) and is loaded at
//! startup; the others are loaded on first use and unloaded least recently used
//! (`damascus_server::models`). Stops gracefully on Ctrl-C / SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use damascus_server::ServerConfig;
use damascus_server::models::{ModelSource, ModelSpec, ModelsConfig};

/// Models loaded at once when there are several and `--max-loaded` is not given.
const DEFAULT_MAX_LOADED: usize = 3;

/// Flags of `damascus serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Model to serve (repeatable): a GGUF path, an http(s) URL or a known model name;
    /// `ID=PATH` names it. Its id is the file name without extension (a known name is also
    /// accepted). The first is the default model. Default: the cached default model.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    models: Vec<String>,
    /// Serve every *.gguf file in DIR too (ids: file names without extension), loaded on
    /// first use.
    #[arg(long, value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// Most models loaded at once; the least recently used is unloaded to make room (a
    /// request still running on it finishes first). Default: 3 (with one model: 1).
    #[arg(long, value_name = "N")]
    max_loaded: Option<usize>,
    /// Most megabytes of model files loaded at once (file sizes count; KV caches do not);
    /// least recently used models are unloaded to stay within it. Default: no limit.
    #[arg(long, value_name = "MB")]
    max_memory_mb: Option<u64>,
    #[command(flatten)]
    engine: super::generate::LoadArgs,
    /// Address to listen on (loopback by default; use 0.0.0.0 to expose it).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once, batched into one forward pass per step (continuous
    /// batching). They share one KV cache of -c positions: -c is the total, as llama-server's
    /// unified cache (one sequence may use up to the model's context); full prompt blocks are
    /// reused across requests (prefix cache). CPU and CUDA alike.
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// Most tokens per forward pass: the decoding sequences' tokens, then prompt chunks (long
    /// prompts are prefilled in pieces between decode steps).
    #[arg(short = 'b', long, default_value_t = 512)]
    batch_size: usize,
    /// Most prompt tokens per forward pass while other requests are decoding (default: sized
    /// from the measured step times so such a pass costs about two decode steps, 16 to -b
    /// tokens). Smaller values keep the running streams' inter-token latency low while a long
    /// prompt arrives, and delay that prompt's first token; -b turns the limit off.
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Require `Authorization: Bearer KEY` (also read from DAMASCUS_API_KEY).
    #[arg(long)]
    api_key: Option<String>,
    /// Most requests waiting for a slot; more are answered 503.
    #[arg(long, default_value_t = 64)]
    queue_size: usize,
    /// Largest request body in bytes; larger is answered 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// Upper bound of max_tokens (also the default when a request gives none).
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Id of the default model (default: the GGUF file name without extension).
    #[arg(long)]
    model_id: Option<String>,
    /// Other accepted names of the default model (repeatable).
    #[arg(long = "alias")]
    aliases: Vec<String>,
    /// Do not log one line per request to stderr.
    #[arg(long)]
    quiet: bool,
    /// Allow browser requests from this origin (CORS; `*` for any). Off by default.
    #[arg(long, value_name = "ORIGIN")]
    cors_origin: Option<String>,
    /// Seconds to wait for a request's headers (an idle connection is closed after this) and,
    /// again, for its body.
    #[arg(
        long = "timeout",
        alias = "to",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    timeout: u64,
}

/// Run `damascus serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Settings that need no model are checked before loading one.
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty; leave it out to serve without a key");
    }
    for (flag, v) in [
        ("--max-tokens", args.max_tokens),
        ("--max-body", args.max_body),
        ("--queue-size", args.queue_size),
        ("--parallel", args.parallel),
    ] {
        if v == 0 {
            anyhow::bail!("{flag} must be at least 1");
        }
    }
    if args.timeout == 0 {
        anyhow::bail!("--timeout must be at least 1 second");
    }
    if args.max_loaded == Some(0) {
        bail!("--max-loaded must be at least 1");
    }
    if args.max_memory_mb == Some(0) {
        bail!("--max-memory-mb must be at least 1");
    }
    let mut specs = model_specs(&args)?;
    if let Some(id) = &args.model_id {
        specs[0].id = id.clone();
    }
    specs[0].aliases.extend(args.aliases.iter().cloned());
    let model_id = specs[0].id.clone();
    let n_models = specs.len();
    let max_loaded = args
        .max_loaded
        .unwrap_or(if n_models == 1 { 1 } else { DEFAULT_MAX_LOADED });
    let engine = args.engine.clone();
    let models = ModelsConfig {
        models: specs,
        loader: Some(Arc::new(move |path: &Path| {
            engine.load(path).map_err(|e| format!("{e:#}"))
        })),
        max_loaded: Some(max_loaded),
        max_memory_bytes: args.max_memory_mb.map(|mb| mb.saturating_mul(1 << 20)),
        preload_default: true,
    };
    let cfg = ServerConfig {
        parallel: args.parallel,
        n_ctx: args.engine.ctx_size,
        batch_size: args.batch_size,
        prefill_chunk: args.prefill_chunk,
        queue_size: args.queue_size,
        max_body_bytes: args.max_body,
        max_tokens_cap: args.max_tokens,
        // An explicit empty --api-key is refused (ServerConfig checks it); an empty
        // DAMASCUS_API_KEY counts as unset.
        api_key: args.api_key.clone().or_else(|| {
            std::env::var("DAMASCUS_API_KEY")
                .ok()
                .filter(|k| !k.is_empty())
        }),
        model_id: model_id.clone(),
        aliases: args.aliases.clone(),
        log_requests: !args.quiet,
        cors_origin: args.cors_origin.clone(),
        header_timeout: std::time::Duration::from_secs(args.timeout),
        body_timeout: std::time::Duration::from_secs(args.timeout),
    };
    let parallel = cfg.parallel;
    damascus_server::run_models(cfg, models, &args.host, args.port, |addr| {
        if n_models == 1 {
            errln!(
                "damascus serve: model '{model_id}' ({parallel} sequences) listening on http://{addr}"
            );
        } else {
            errln!(
                "damascus serve: {n_models} models (default '{model_id}', at most {max_loaded} loaded at once; {parallel} sequences each) listening on http://{addr}"
            );
        }
    })
    .context("damascus serve")?;
    Ok(())
}

/// The models of `-m` (in order) and then of `--models-dir` (by file name), checked: every
/// file exists, ids are unique. None given: the default model.
fn model_specs(args: &Args) -> anyhow::Result<Vec<ModelSpec>> {
    let mut specs = Vec::new();
    for m in &args.models {
        specs.push(model_spec(m)?);
    }
    if let Some(dir) = &args.models_dir {
        specs.extend(dir_specs(dir)?);
    }
    if specs.is_empty() {
        specs.push(spec_for(None, None)?);
    }
    for (i, s) in specs.iter().enumerate() {
        let names = || std::iter::once(&s.id).chain(&s.aliases);
        if let Some(other) = specs[..i]
            .iter()
            .find(|o| names().any(|n| *n == o.id || o.aliases.contains(n)))
        {
            bail!(
                "two models are named '{}' ({} and {}); name one with -m ID=PATH",
                s.id,
                source_name(&other.source),
                source_name(&s.source)
            );
        }
    }
    Ok(specs)
}

fn source_name(s: &ModelSource) -> String {
    match s {
        ModelSource::File(p) => p.display().to_string(),
        ModelSource::Loaded(..) => "a model in memory".into(),
    }
}

/// One `-m` value: `ID=PATH` or a path, URL or known name.
fn model_spec(m: &str) -> anyhow::Result<ModelSpec> {
    // `ID=...` names a model, unless the whole value is an existing file or the part before
    // `=` looks like a path or URL.
    if !Path::new(m).exists()
        && let Some((id, rest)) = m.split_once('=')
        && !id.is_empty()
        && !id.contains(['/', '\\', ':'])
    {
        if rest.is_empty() {
            bail!("-m {m}: nothing after '='; give -m ID=PATH");
        }
        return spec_for(Some(id), Some(rest));
    }
    spec_for(None, Some(m))
}

/// Resolves a model (fetching a known name or URL) into a spec; the id is `id`, else the file
/// name without extension (a known name becomes an alias).
fn spec_for(id: Option<&str>, model: Option<&str>) -> anyhow::Result<ModelSpec> {
    let arg = super::ModelArg {
        model: model.map(str::to_string),
    };
    let path = arg.resolve()?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "damascus".into());
    let mut aliases = Vec::new();
    let named = model.filter(|m| !Path::new(m).exists() && !m.contains("://"));
    if let Some(name) = named
        && id.is_none()
        && name != stem
    {
        aliases.push(name.to_string());
    }
    Ok(ModelSpec {
        id: id.map_or(stem, str::to_string),
        aliases,
        source: ModelSource::File(path),
    })
}

/// Every `*.gguf` file of `dir`, by file name.
fn dir_specs(dir: &Path) -> anyhow::Result<Vec<ModelSpec>> {
    if !dir.is_dir() {
        bail!("--models-dir {}: no such directory", dir.display());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("--models-dir {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("--models-dir {}: no .gguf files in it", dir.display());
    }
    Ok(files
        .into_iter()
        .map(|p| ModelSpec {
            id: p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
            aliases: Vec::new(),
            source: ModelSource::File(p),
        })
        .collect())
}
