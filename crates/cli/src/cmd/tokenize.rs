//! `damascus tokenize` and `damascus detokenize`: text ↔ token ids with a model's tokenizer.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use damascus_gguf::GgufFile;
use damascus_tokenizer::{Tokenizer, TokenizerSpec};

/// Flags of `damascus tokenize`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    /// Print `{"ids": [...], "pieces": [...]}` instead of one `id -> piece` line per token.
    #[arg(long)]
    json: bool,
    /// Do not add BOS (or EOS) even if the model's metadata asks for it.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token strings such as `<|im_start|>` as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Read the text from a file instead of the command line.
    #[arg(long, value_name = "PATH", conflicts_with = "text")]
    file: Option<PathBuf>,
    /// The text to tokenize (standard input if neither TEXT nor --file is given).
    text: Option<String>,
}

/// Flags of `damascus detokenize`.
#[derive(clap::Args, Debug, Default)]
pub struct DetokenizeArgs {
    #[command(flatten)]
    model: super::ModelArg,
    /// Also print control tokens (`<|eot_id|>`, `<s>`), which are hidden by default.
    #[arg(long)]
    show_special: bool,
    /// Token ids (separated by spaces or commas).
    #[arg(required = true, value_name = "IDS")]
    ids: Vec<String>,
}

/// Load the tokenizer of a model argument: a GGUF (default) or a Hugging Face `tokenizer.json`.
pub fn load_tokenizer(model: &super::ModelArg) -> anyhow::Result<Tokenizer> {
    let is_json = model.model.as_deref().is_some_and(|m| m.ends_with(".json"));
    if is_json {
        let path = Path::new(model.model.as_deref().unwrap_or_default());
        let json =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let spec =
            TokenizerSpec::from_hf_json(&json, None).with_context(|| path.display().to_string())?;
        return Ok(Tokenizer::from_spec(spec)?);
    }
    let path = model.resolve()?;
    let file = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    Tokenizer::from_gguf(&file).with_context(|| format!("tokenizer of {}", path.display()))
}

/// Run `damascus tokenize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.file, &args.text) {
        (Some(p), _) => {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?
        }
        (None, Some(t)) => t.clone(),
        (None, None) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading standard input")?;
            s
        }
    };
    let tok = load_tokenizer(&args.model)?;
    let ids = tok.encode(&text, !args.no_bos, !args.no_parse_special);
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| tok.token_piece(i).unwrap_or_default())
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let v = serde_json::json!({ "ids": ids, "pieces": pieces });
        writeln!(out, "{v}")?;
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            writeln!(out, "{id:>7} -> {piece:?}")?;
        }
    }
    Ok(())
}

/// Run `damascus detokenize`.
pub fn run_detokenize(args: DetokenizeArgs) -> anyhow::Result<()> {
    let mut ids = Vec::new();
    for arg in &args.ids {
        for part in arg.split([',', ' ', '[', ']']).filter(|p| !p.is_empty()) {
            ids.push(
                part.parse::<u32>()
                    .with_context(|| format!("`{part}` is not a token id"))?,
            );
        }
    }
    let tok = load_tokenizer(&args.model)?;
    let bytes = tok.decode_bytes(&ids, args.show_special)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&bytes)?;
    if std::io::stdout().is_terminal() && !bytes.ends_with(b"\n") {
        writeln!(out)?;
    }
    Ok(())
}
