//! `damascus pull`: not implemented yet.

/// Flags of `damascus pull`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus pull`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus pull` is not implemented yet")
}
