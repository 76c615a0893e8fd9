//! `damascus device-info`: not implemented yet.

/// Flags of `damascus device-info`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus device-info`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus device-info` is not implemented yet")
}
