//! `damascus tokenize` and `damascus detokenize`: not implemented yet.

/// Flags of `damascus tokenize`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Flags of `damascus detokenize`.
#[derive(clap::Args, Debug, Default)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    model: super::ModelArg,
}

/// Run `damascus tokenize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus tokenize` is not implemented yet")
}

/// Run `damascus detokenize`.
pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`damascus detokenize` is not implemented yet")
}
