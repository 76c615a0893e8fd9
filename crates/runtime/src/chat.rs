//! Multi-turn chat through the model's chat template, reusing the KV cache between turns.
//!
//! Each turn renders the whole conversation with the template and tokenizes it; the
//! [`Sequence`] keeps the longest common prefix with what is already cached, so only the new
//! turn (the end-of-turn marker of the previous reply, the new user message and the assistant
//! header) is evaluated — never the whole history.
//!
//! When a turn does not fit, [`Chat::user_turn`] either fails with
//! [`RuntimeError::ContextFull`] or, with [`ChatConfig::context_shift`], drops the oldest
//! user/assistant exchanges (the system prompt stays). The cache is re-positioned by re-evaluating
//! the kept turns after the system prompt (the system prompt's cached prefix is still reused).

use damascus_tokenizer::{ChatTemplate, Tokenizer};

use crate::RuntimeError;
use crate::generate::{GenerateConfig, Generator};
use crate::sampler::SamplerChain;
use crate::sequence::Sequence;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_string(),
            content: content.into(),
        }
    }
}

/// Chat settings.
#[derive(Debug, Clone, Default)]
pub struct ChatConfig {
    /// System prompt, kept through resets and context shifts.
    pub system: Option<String>,
    /// Drop the oldest exchanges when the context fills instead of failing.
    pub context_shift: bool,
}

/// A prepared turn: the full prompt to generate from.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// Token ids of the whole rendered conversation plus the assistant header. `[n_prompt]`
    pub prompt: Vec<u32>,
    /// Messages dropped by a context shift for this turn (0 = none).
    pub dropped_messages: usize,
}

/// A conversation bound to one [`Sequence`].
#[derive(Debug)]
pub struct Chat {
    template: ChatTemplate,
    cfg: ChatConfig,
    messages: Vec<Message>, // system (if any) first, then alternating user / assistant
    seq: Sequence,
}

impl Chat {
    /// A chat over `seq` using the tokenizer's own template.
    pub fn new(seq: Sequence, tok: &Tokenizer, cfg: ChatConfig) -> Result<Self, RuntimeError> {
        let template = ChatTemplate::from_tokenizer(tok)?;
        Ok(Self::with_template(seq, template, cfg))
    }

    /// A chat over `seq` with an explicit template.
    pub fn with_template(seq: Sequence, template: ChatTemplate, cfg: ChatConfig) -> Self {
        let mut chat = Self {
            template,
            cfg,
            messages: Vec::new(),
            seq,
        };
        chat.reset_messages();
        chat
    }

    fn reset_messages(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.cfg.system {
            self.messages.push(Message::new("system", s.clone()));
        }
    }

    /// The conversation so far.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// The sequence (KV cache and its ids).
    pub fn sequence(&self) -> &Sequence {
        &self.seq
    }

    /// Starts a new conversation with the same system prompt. The cached prefix (the system
    /// prompt) stays and is reused by the next turn.
    pub fn reset(&mut self) {
        self.reset_messages();
    }

    /// Tokenizes the conversation as the template renders it; with `add_generation_prompt` the
    /// assistant header is appended. BOS is added when the model asks for it and the template
    /// did not already write it.
    pub fn render_ids(
        &self,
        tok: &Tokenizer,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, RuntimeError> {
        let json = serde_json::to_value(&self.messages)
            .map_err(|e| RuntimeError::Chat(format!("messages to JSON: {e}")))?;
        let text = self.template.render(&json, add_generation_prompt, None)?;
        let mut ids = tok.encode(&text, false, true);
        if tok.add_bos()
            && let Some(bos) = tok.bos()
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Index of the first message a context shift may drop.
    fn first_droppable(&self) -> usize {
        usize::from(self.messages.first().is_some_and(|m| m.role == "system"))
    }

    /// Adds a user message and returns the prompt to generate from, leaving room for at least
    /// `reserve` generated tokens. If it does not fit: with context shift, the oldest exchanges
    /// are dropped until it does; without, the message is withdrawn and
    /// [`RuntimeError::ContextFull`] returned.
    pub fn user_turn(
        &mut self,
        tok: &Tokenizer,
        content: &str,
        reserve: usize,
    ) -> Result<Turn, RuntimeError> {
        self.messages.push(Message::new("user", content));
        let n_ctx = self.seq.n_ctx();
        let reserve = reserve.min(n_ctx / 2);
        let mut dropped = 0;
        loop {
            let prompt = match self.render_ids(tok, true) {
                Ok(p) => p,
                Err(e) => {
                    self.messages.pop();
                    return Err(e);
                }
            };
            if prompt.len() + reserve <= n_ctx {
                return Ok(Turn {
                    prompt,
                    dropped_messages: dropped,
                });
            }
            let first = self.first_droppable();
            // Keep at least the new user message.
            if !self.cfg.context_shift || first + 1 >= self.messages.len() {
                self.messages.pop();
                return Err(if self.cfg.context_shift || prompt.len() > n_ctx {
                    RuntimeError::PromptTooLong {
                        n_prompt: prompt.len() + reserve,
                        n_ctx,
                    }
                } else {
                    RuntimeError::ContextFull {
                        n_ctx,
                        n_past: prompt.len(),
                        n_tokens: reserve,
                    }
                });
            }
            // Drop one exchange: a user message and the assistant reply after it.
            self.messages.remove(first);
            dropped += 1;
            if first + 1 < self.messages.len() && self.messages[first].role == "assistant" {
                self.messages.remove(first);
                dropped += 1;
            }
        }
    }

    /// A generator for `turn` over this chat's sequence.
    pub fn generator<'a>(
        &'a mut self,
        tok: &'a Tokenizer,
        cfg: GenerateConfig,
        sampler: SamplerChain,
        turn: &Turn,
    ) -> Generator<'a> {
        Generator::new(&mut self.seq, tok, cfg, sampler, &turn.prompt)
    }

    /// Records the assistant's reply (call after generation, with the completion text, also a
    /// partial one after cancellation).
    pub fn push_assistant(&mut self, content: impl Into<String>) {
        self.messages.push(Message::new("assistant", content));
    }

    /// Withdraws the last message if it is a user message without a reply (e.g. the generation
    /// failed). Returns it.
    pub fn pop_unanswered(&mut self) -> Option<Message> {
        if self.messages.last().is_some_and(|m| m.role == "user") {
            self.messages.pop()
        } else {
            None
        }
    }
}
