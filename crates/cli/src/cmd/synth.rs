//! `damascus synth`: not implemented yet.

/// Flags of `damascus synth`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus synth`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus synth` is not implemented yet")
}
