//! `damascus`: the command-line interface.
//!
//! Thin by design: each subcommand lives in `cmd/<name>.rs`, parses its flags, validates them and
//! calls the library crates. Errors surface as one line on stderr and a non-zero exit code.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Damascus: a from-scratch LLM inference engine for GGUF models.
#[derive(Parser, Debug)]
#[command(name = "damascus", version, about, long_about = None)]
struct Cli {
    /// Print the CPU and GPU features and the kernel path Damascus would pick, then exit.
    #[arg(long)]
    device_info: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Read a GGUF model, check its config and print a summary.
    Load(cmd::load::Args),
    /// Print CPU/GPU features and the kernel path Damascus would pick.
    DeviceInfo(cmd::device_info::Args),
    /// Fetch the default model (or a known model by name, or a URL) into the cache.
    Pull(cmd::pull::Args),
    /// List the cached models (or with --known, the models known by name).
    List(cmd::list::Args),
    /// Tokenize text and print ids and pieces.
    Tokenize(cmd::tokenize::Args),
    /// Sentence embeddings of texts (pooled final hidden states, L2-normalised).
    Embed(cmd::embed::Args),
    /// Turn token ids back into text.
    Detokenize(cmd::tokenize::DetokenizeArgs),
    /// Render the model's chat template for a list of messages.
    Template(cmd::template::Args),
    /// Quantize a GGUF model to another file type (llama.cpp-compatible).
    Quantize(cmd::quantize::Args),
    /// Write a seeded synthetic Llama model with real shapes.
    Synth(cmd::synth::Args),
    /// Print the next-token distribution for a prompt.
    Predict(cmd::predict::Args),
    /// Compare per-layer hidden states and logits against a Hugging Face fixture.
    Verify(cmd::verify::Args),
    /// Generate text from a prompt.
    Generate(cmd::generate::Args),
    /// Generate text from a prompt given as the first argument (like `ollama run`).
    Run(cmd::generate::RunArgs),
    /// Interactive chat through the model's chat template.
    Chat(cmd::chat::Args),
    /// Measure prompt processing and generation throughput (like llama-bench).
    Bench(cmd::bench::Args),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(cmd::serve::Args),
}

/// llama.cpp's multi-letter short flags, which clap would read as clusters (`-ngl 99` as
/// `-n gl`), rewritten to their long spelling.
fn llama_cpp_spellings(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-ngl") => "--ngl".into(),
        Some(s) if s.starts_with("-ngl=") => format!("--ngl={}", &s[5..]).into(),
        Some("-ctk") => "--cache-type-k".into(),
        Some(s) if s.starts_with("-ctk=") => format!("--cache-type-k={}", &s[5..]).into(),
        Some("-ctv") => "--cache-type-v".into(),
        Some(s) if s.starts_with("-ctv=") => format!("--cache-type-v={}", &s[5..]).into(),
        _ => a,
    })
    .collect()
}

/// The error and its causes joined by ": ", skipping a cause whose text the line already holds
/// (an OS error wrapped by several layers is printed once).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if line.contains(&msg) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&msg);
    }
    line
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(llama_cpp_spellings(std::env::args_os()));
    let result = match cli.command {
        None if cli.device_info => cmd::device_info::run(cmd::device_info::Args::default()),
        None => {
            use clap::CommandFactory;
            let _ = Cli::command().write_help(&mut std::io::stdout());
            return ExitCode::from(2);
        }
        Some(command) => match command {
            Command::Load(a) => cmd::load::run(a),
            Command::DeviceInfo(a) => cmd::device_info::run(a),
            Command::Pull(a) => cmd::pull::run(a),
            Command::List(a) => cmd::list::run(a),
            Command::Tokenize(a) => cmd::tokenize::run(a),
            Command::Embed(a) => cmd::embed::run(a),
            Command::Detokenize(a) => cmd::tokenize::run_detokenize(a),
            Command::Template(a) => cmd::template::run(a),
            Command::Quantize(a) => cmd::quantize::run(a),
            Command::Synth(a) => cmd::synth::run(a),
            Command::Predict(a) => cmd::predict::run(a),
            Command::Verify(a) => cmd::verify::run(a),
            Command::Generate(a) => cmd::generate::run(a),
            Command::Run(a) => cmd::generate::run_alias(a),
            Command::Chat(a) => cmd::chat::run(a),
            Command::Bench(a) => cmd::bench::run(a),
            Command::Serve(a) => cmd::serve::run(a),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`damascus ... | head`): stop quietly, like `tokenize`.
        Err(e) if cmd::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of contexts joined by ": ".
            cmd::err_line(format_args!("error: {}", error_line(&e)));
            ExitCode::FAILURE
        }
    }
}
