//! `damascus serve`: not implemented yet.

/// Flags of `damascus serve`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus serve`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus serve` is not implemented yet")
}
