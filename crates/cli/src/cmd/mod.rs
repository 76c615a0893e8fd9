//! One module per subcommand. Each defines its clap `Args` and a `run` function.
//!
//! Shared flag groups (the model argument) live here so every command spells them the same way.

pub mod bench;
pub mod chat;
pub mod device_info;
pub mod embed;
pub mod generate;
pub mod list;
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

use damascus_model::BackendKind;

/// The `-m/--model` flag shared by every command that needs a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelArg {
    /// Model: a GGUF path, an http(s) URL or a known model name (`damascus list --known`).
    /// Default: the cached default model, pulled on first use.
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
}

impl ModelArg {
    /// Resolve to a local GGUF path, fetching the default model, a named model or a URL if needed.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        Ok(damascus_hub::resolve_model(self.model.as_deref())?)
    }
}

/// Which engine runs the model.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The SIMD CPU backend (the default).
    #[default]
    Cpu,
    /// The CUDA backend (a build with `--features cuda` and an NVIDIA GPU).
    Cuda,
}

/// The `--backend` / `--device` flags shared by every command that runs a model.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BackendArg {
    /// Backend that runs the model.
    #[arg(long, value_enum, default_value_t)]
    pub backend: BackendChoice,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Decoder layers on the GPU (with --backend cuda; default all): fewer runs the last N
    /// layers on the GPU and the rest on the CPU, for models larger than the GPU's memory.
    #[arg(long = "ngl", alias = "n-gpu-layers", value_name = "N")]
    pub n_gpu_layers: Option<usize>,
    /// Keep the CPU weights in the file's layout instead of repacking them at load for the
    /// int8 kernels (also `DAMASCUS_REPACK=0`).
    #[arg(long)]
    pub no_repack: bool,
}

/// The CPU kernel settings given by the `DAMASCUS_*` variables (table in ARCHITECTURE.md),
/// read once per process and installed process-wide (ISA level, prefetch, AMX knobs).
pub fn kernel_settings() -> anyhow::Result<damascus_kernels::settings::KernelSettings> {
    use damascus_kernels::settings::KernelSettings;
    static SETTINGS: std::sync::OnceLock<Result<KernelSettings, String>> =
        std::sync::OnceLock::new();
    SETTINGS
        .get_or_init(|| {
            let s =
                KernelSettings::from_vars(|k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
            s.install().map_err(|e| e.to_string())?;
            Ok(s)
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

impl BackendArg {
    /// The backend to load: `reference` and `threads` select among the CPU ones.
    pub fn kind(&self, reference: bool, threads: Option<usize>) -> anyhow::Result<BackendKind> {
        Ok(match (self.backend, reference, threads) {
            (BackendChoice::Cuda, true, _) => {
                anyhow::bail!("--reference runs on the CPU; drop it or --backend cuda")
            }
            (BackendChoice::Cuda, false, threads) => BackendKind::Cuda {
                device: self.device,
                n_gpu_layers: self.n_gpu_layers,
                n_threads: threads,
            },
            (BackendChoice::Cpu, _, _) if self.n_gpu_layers.is_some_and(|n| n > 0) => {
                anyhow::bail!("--ngl needs --backend cuda")
            }
            (BackendChoice::Cpu, true, _) => BackendKind::Reference,
            (BackendChoice::Cpu, false, Some(n)) => BackendKind::Cpu { n_threads: Some(n) },
            (BackendChoice::Cpu, false, None) => BackendKind::Auto,
        })
    }
}
