//! `damascus template`: render a chat template for a list of messages.

use std::path::PathBuf;

use anyhow::Context;
use damascus_tokenizer::ChatTemplate;
use serde_json::Value as Json;

/// Flags of `damascus template`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    #[command(flatten)]
    model: super::ModelArg,
    /// JSON file: a list of `{"role", "content"}` messages, or an object with a `messages` list
    /// and extra template variables (`tools`, `date_string`, ...).
    #[arg(long, value_name = "FILE.json")]
    messages: PathBuf,
    /// End with the header that opens the assistant's turn.
    #[arg(long)]
    add_generation_prompt: bool,
    /// Use this Jinja template instead of the model's `tokenizer.chat_template`.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
}

/// Run `damascus template`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let raw = std::fs::read_to_string(&args.messages)
        .with_context(|| format!("reading {}", args.messages.display()))?;
    let json: Json = serde_json::from_str(&raw)
        .with_context(|| format!("parsing {}", args.messages.display()))?;
    let (messages, extra) = match json {
        Json::Object(mut o) => {
            let m = o
                .remove("messages")
                .context("the messages object has no `messages` list")?;
            (m, Some(o))
        }
        m => (m, None),
    };
    let template = match &args.chat_template {
        Some(path) => {
            let src = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            // BOS/EOS strings come from the model when one is available.
            match super::tokenize::load_tokenizer(&args.model) {
                Ok(tok) => ChatTemplate::new(src, tok.bos_text(), tok.eos_text()),
                Err(e) if args.model.model.is_none() => {
                    errln!("warning: no model for bos/eos tokens ({e:#}); using empty strings");
                    ChatTemplate::new(src, "", "")
                }
                Err(e) => return Err(e),
            }
        }
        None => ChatTemplate::from_tokenizer(&super::tokenize::load_tokenizer(&args.model)?)?,
    };
    let text = template.render(&messages, args.add_generation_prompt, extra.as_ref())?;
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(())
}
