//! `damascus chat`: an interactive conversation through the model's chat template.
//!
//! ```text
//! $ damascus chat --system "You are terse."
//! > What is the capital of France?
//! Paris.
//! > /reset
//! ```
//!
//! Input: one line per message; a line ending in `\` continues on the next line, and a `"""`
//! line opens a block closed by another `"""` line. Commands: `/reset` (new conversation, same
//! system prompt), `/exit` (or `/quit`, `/bye`, end of input), `/help`. On a terminal, lines are
//! edited with rustyline (history, cursor keys); with piped stdin, lines are read plainly and no
//! prompt is printed, so the REPL can be scripted. Ctrl-C during a reply stops that reply only.
//!
//! Each turn prefills only its new tokens: the KV cache keeps the conversation so far.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::Ordering;

use anyhow::bail;
use damascus_runtime::RuntimeError;
use damascus_runtime::chat::{Chat, ChatConfig};
use damascus_runtime::generate::{Event, StopReason};
use damascus_runtime::sampler::SamplerChain;
use damascus_runtime::sequence::Sequence;
use damascus_tokenizer::ChatTemplate;

use super::generate::{EngineArgs, SamplingArgs, ctrl_c_flag, print_perf};

/// Flags of `damascus chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// System prompt (kept through /reset and context shifts).
    #[arg(long)]
    pub system: Option<String>,
    /// When the context is full, drop the oldest exchanges (keeping the system prompt) instead
    /// of refusing the turn.
    #[arg(long)]
    pub context_shift: bool,
    /// Print timings to stderr after every reply.
    #[arg(long)]
    pub perf: bool,
    /// Print one JSON line of per-turn counters to stderr after every reply (prompt tokens,
    /// reused, evaluated, generated, stop reason).
    #[arg(long)]
    pub stats_json: bool,
}

/// Where input lines come from.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Piped(std::io::StdinLock<'static>),
}

impl Input {
    fn new() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        if stdin.is_terminal() && std::io::stdout().is_terminal() {
            Ok(Input::Editor(Box::new(rustyline::DefaultEditor::new()?)))
        } else {
            Ok(Input::Piped(stdin.lock()))
        }
    }

    fn is_tty(&self) -> bool {
        matches!(self, Input::Editor(_))
    }

    /// One raw line; `None` at end of input. Ctrl-C at the prompt gives an empty line.
    fn line(&mut self, prompt: &str) -> anyhow::Result<Option<String>> {
        match self {
            Input::Editor(ed) => match ed.readline(prompt) {
                Ok(l) => Ok(Some(l)),
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Some(String::new())),
                Err(rustyline::error::ReadlineError::Eof) => Ok(None),
                Err(e) => Err(e.into()),
            },
            Input::Piped(stdin) => {
                let mut s = String::new();
                if stdin.read_line(&mut s)? == 0 {
                    return Ok(None);
                }
                while s.ends_with(['\n', '\r']) {
                    s.pop();
                }
                Ok(Some(s))
            }
        }
    }

    /// One message, joining `\`-continued lines and `"""` blocks; `None` at end of input.
    fn message(&mut self) -> anyhow::Result<Option<String>> {
        let Some(first) = self.line("> ")? else {
            return Ok(None);
        };
        let msg = if first.trim() == "\"\"\"" {
            let mut lines = Vec::new();
            loop {
                match self.line("... ")? {
                    Some(l) if l.trim() == "\"\"\"" => break,
                    Some(l) => lines.push(l),
                    None => break,
                }
            }
            lines.join("\n")
        } else {
            let mut msg = first;
            while msg.ends_with('\\') {
                msg.pop();
                msg.push('\n');
                match self.line("... ")? {
                    Some(l) => msg.push_str(&l),
                    None => break,
                }
            }
            msg
        };
        if let Input::Editor(ed) = self
            && !msg.trim().is_empty()
        {
            let _ = ed.add_history_entry(msg.as_str());
        }
        Ok(Some(msg))
    }
}

const HELP: &str = "commands: /reset (new conversation), /exit (quit), /help; \
end a line with \\ to continue it, or wrap a block in \"\"\" lines";

/// Run `damascus chat`.
pub fn run(args: Args) -> anyhow::Result<()> {
    args.sampling.check()?;
    let (model, tok) = args.engine.load()?;
    let scfg = args.sampling.sampler_config(model.n_ctx())?;
    let seq = Sequence::new(model.session()?);
    let (template, fallback) = ChatTemplate::for_model(&tok, &model.config().arch);
    if let Some(name) = fallback {
        errln!("damascus chat: the model has no chat template; using the built-in {name:?} one");
    }
    let mut chat = Chat::with_template(
        seq,
        template,
        ChatConfig {
            system: args.system.clone(),
            context_shift: args.context_shift,
        },
    );
    // The line editor first: creating it installs rustyline's own SIGINT handler (for the
    // lifetime of the editor), which would swallow Ctrl-C during a reply on a terminal. Our
    // handler, installed after it, replaces it (at the prompt Ctrl-C arrives as a key anyway).
    let mut input = Input::new()?;
    let cancel = ctrl_c_flag();
    let tty = input.is_tty();
    if tty {
        errln!(
            "damascus chat: {} ({} backend, context {}). {HELP}",
            model.config().arch,
            model.backend_name(),
            model.n_ctx()
        );
    }
    let n_ctx = chat.sequence().n_ctx();
    let reserve = usize::try_from(args.sampling.n_predict)
        .unwrap_or(n_ctx / 4)
        .max(1);
    let mut n_turn = 0usize;
    let mut stdout = std::io::stdout();
    while let Some(msg) = input.message()? {
        let cmd = msg.trim();
        match cmd {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/reset" | "/clear" => {
                chat.reset();
                if tty {
                    errln!("[conversation reset]");
                }
                continue;
            }
            "/help" | "/?" => {
                errln!("{HELP}");
                continue;
            }
            _ if cmd.starts_with('/') && !cmd.contains(char::is_whitespace) => {
                errln!("unknown command {cmd}; {HELP}");
                continue;
            }
            _ => {}
        }
        let turn = match chat.user_turn(&tok, &msg, reserve) {
            Ok(t) => t,
            Err(e @ (RuntimeError::ContextFull { .. } | RuntimeError::PromptTooLong { .. })) => {
                errln!("error: {e}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if turn.dropped_messages > 0 && (tty || args.perf) {
            errln!(
                "[context shift: dropped the {} oldest messages]",
                turn.dropped_messages
            );
        }
        n_turn += 1;
        let mut gcfg = args.sampling.generate_config();
        cancel.store(false, Ordering::SeqCst);
        gcfg.cancel = Some(cancel.clone());
        let sampler = SamplerChain::from_config(&scfg)?;
        let mut generator = chat.generator(&tok, gcfg, sampler, &turn);
        if n_turn == 1
            && let Some(why) = generator.draft_off_reason()
        {
            super::warn(format_args!("--draft-ngram ignored: {why}"));
        }
        let done = loop {
            match generator.step() {
                Ok(Some(Event::Token(t))) => {
                    if !t.text.is_empty() {
                        write!(stdout, "{}", t.text)?;
                        stdout.flush()?;
                    }
                }
                Ok(Some(Event::Done(c))) => break c,
                Ok(None) => bail!("generation ended without a result"),
                Err(e) => {
                    drop(generator);
                    chat.pop_unanswered();
                    return Err(e.into());
                }
            }
        };
        writeln!(stdout, "{}", done.tail)?;
        stdout.flush()?;
        match &done.reason {
            StopReason::Cancelled => errln!("[interrupted]"),
            StopReason::ContextFull => {
                errln!("[context full ({n_ctx} tokens): /reset, a larger -c, or --context-shift]")
            }
            _ => {}
        }
        chat.push_assistant(done.text.clone());
        if args.perf {
            print_perf(&done);
        }
        if args.stats_json {
            let stats = serde_json::json!({
                "turn": n_turn,
                "prompt_tokens": done.timings.prompt_tokens,
                "prompt_cached": done.timings.prompt_cached,
                "prompt_evaluated": done.timings.prompt_evaluated,
                "generated_tokens": done.timings.generated_tokens,
                "stop_reason": done.reason.as_str(),
                "dropped_messages": turn.dropped_messages,
                "n_past": chat.sequence().n_past(),
                "draft": done.timings.draft,
            });
            errln!("{stats}");
        }
    }
    Ok(())
}
