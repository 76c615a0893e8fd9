//! One module per subcommand. Each defines its clap `Args` and a `run` function.
//!
//! Shared flag groups (the model argument) live here so every command spells them the same way.

pub mod bench;
pub mod chat;
pub mod device_info;
pub mod generate;
pub mod load;
pub mod predict;
pub mod pull;
pub mod quantize;
pub mod serve;
pub mod synth;
pub mod template;
pub mod tokenize;
pub mod verify;

use std::path::PathBuf;

/// The `-m/--model` flag shared by every command that needs a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelArg {
    /// Model: a GGUF path or an http(s) URL. Default: the cached default model, pulled on first use.
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
}

impl ModelArg {
    /// Resolve to a local GGUF path, fetching the default model or a URL if needed.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        Ok(damascus_hub::resolve_model(self.model.as_deref())?)
    }
}
