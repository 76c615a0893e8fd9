//! `damascus chat`: not implemented yet.

/// Flags of `damascus chat`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus chat`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus chat` is not implemented yet")
}
