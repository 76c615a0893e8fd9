//! `damascus generate` and its alias `damascus run`: not implemented yet.

/// Flags of `damascus generate`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Flags of `damascus run`.
#[derive(clap::Args, Debug, Default)]
pub struct RunArgs {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus generate`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus generate` is not implemented yet")
}

/// Run `damascus run`.
pub fn run_alias(args: RunArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus run` is not implemented yet")
}
