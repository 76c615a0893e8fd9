//! `damascus serve`: an OpenAI-compatible HTTP server (see the `damascus-server` crate).
//!
//! ```text
//! $ damascus serve                              # default model on 127.0.0.1:8080
//! $ damascus serve -m model.gguf --port 9000 --parallel 4 --ctx-size 2048 --api-key secret
//! ```
//!
//! Stops gracefully on Ctrl-C / SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use damascus_server::ServerConfig;

/// Flags of `damascus serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    engine: super::generate::EngineArgs,
    /// Address to listen on (loopback by default; use 0.0.0.0 to expose it).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at once, batched into one forward pass per step (continuous
    /// batching). They share one KV cache of -c positions: -c is the total, as llama-server's
    /// unified cache (one sequence may use up to the model's context); full prompt blocks are
    /// reused across requests (prefix cache). CUDA: one KV cache of -c per slot.
    #[arg(long, default_value_t = 2)]
    parallel: usize,
    /// Most tokens per forward pass: the decoding sequences' tokens, then prompt chunks (long
    /// prompts are prefilled in pieces between decode steps).
    #[arg(short = 'b', long, default_value_t = 512)]
    batch_size: usize,
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
    /// Model id served (default: the GGUF file name without extension).
    #[arg(long)]
    model_id: Option<String>,
    /// Other accepted model names (repeatable).
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
    let path = args.engine.model.resolve()?;
    let (model, tok) = args.engine.load()?;
    let model_id = args.model_id.clone().unwrap_or_else(|| {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "damascus".into())
    });
    let cfg = ServerConfig {
        parallel: args.parallel,
        n_ctx: args.engine.ctx_size,
        batch_size: args.batch_size,
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
    let n_ctx = args.engine.ctx_size.unwrap_or(model.n_ctx());
    damascus_server::run(
        cfg,
        Arc::new(model),
        Arc::new(tok),
        &args.host,
        args.port,
        |addr| {
            errln!(
                "damascus serve: model '{model_id}' ({} sequences, {n_ctx} ctx) listening on http://{addr}",
                parallel
            );
        },
    )
    .context("damascus serve")?;
    Ok(())
}
