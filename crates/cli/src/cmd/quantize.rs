//! `damascus quantize`: not implemented yet.

/// Flags of `damascus quantize`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus quantize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus quantize` is not implemented yet")
}
