//! Structured output and tool calling: `response_format`, `grammar`, `json_schema`, `tools` and
//! `tool_choice` turned into a grammar constraint on sampling, prompts that carry the tools, and
//! replies that carry `tool_calls`.
//!
//! Tool calls follow the model's template: a template that knows tools (it mentions
//! `<tool_call>`, as Qwen 2.5 and Hermes do) gets `tools` in its context as Hugging Face passes
//! them and is expected to answer `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
//! any other template (SmolLM2's, Gemma 3's) gets the tool list in the system message and is
//! asked to answer with the bare JSON object `{"name": ..., "arguments": {...}}`. `required`
//! and a named function constrain the output to exactly that shape (arguments validated by the
//! function's parameter schema); `auto` leaves the output free and detects a call in it;
//! `none` does not offer the tools.

use std::sync::Arc;

use damascus_grammar::{Grammar, Vocab, json_object_grammar, schema_to_gbnf};
use damascus_runtime::sampler::{GrammarConstraint, grammar_vocab};
use damascus_tokenizer::{ChatTemplate, Tokenizer};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::routes::ApiError;

/// The structured-output fields of a request body (read in a second pass over the body).
#[derive(Debug, Default, Deserialize)]
pub struct Extras {
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<Value>,
    /// A GBNF grammar (llama-server).
    pub grammar: Option<String>,
    /// A JSON schema (llama-server).
    pub json_schema: Option<Value>,
    /// OpenAI tools: `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
    pub tools: Option<Value>,
    /// `auto`, `none`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// The raw messages (for tool calls and tool results).
    pub messages: Option<Vec<Value>>,
}

/// How the model writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `<tool_call>{json}</tool_call>` (templates with a tool section).
    Hermes,
    /// The bare JSON object (templates without one; tools described in the system message).
    Generic,
}

/// Tools offered to the model for one request.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// Function definitions (`function` objects).
    pub functions: Vec<Value>,
    /// Output convention.
    pub style: Style,
    /// The output is constrained to a call (`required` or a named function).
    pub forced: bool,
}

/// What a request asks beyond plain text.
#[derive(Debug, Default)]
pub struct Plan {
    /// The grammar to constrain sampling with.
    pub grammar: Option<Arc<Grammar>>,
    /// Tools, when offered.
    pub tools: Option<ToolPlan>,
}

fn bad(param: &'static str, msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg.into(), Some(param))
}

fn compile(param: &'static str, gbnf: &str) -> Result<Arc<Grammar>, ApiError> {
    Grammar::parse(gbnf)
        .map(Arc::new)
        .map_err(|e| bad(param, e.to_string()))
}

fn schema_grammar(param: &'static str, schema: &Value) -> Result<Arc<Grammar>, ApiError> {
    let g = schema_to_gbnf(schema).map_err(|e| {
        let mut err = bad(param, e.to_string());
        if matches!(e, damascus_grammar::GrammarError::UnsupportedKeyword { .. }) {
            err = err.with_code("unsupported_parameter");
        }
        err
    })?;
    compile(param, &g)
}

fn template_knows_tools(t: Option<&ChatTemplate>) -> bool {
    t.is_some_and(|t| t.source().contains("<tool_call>") && t.source().contains("tools"))
}

impl Plan {
    /// Validates the fields and compiles the grammar.
    pub fn new(x: &Extras, template: Option<&ChatTemplate>) -> Result<Self, ApiError> {
        let mut plan = Plan::default();
        let mut grammar_from: Option<&'static str> = None;
        let mut set = |plan: &mut Plan, param: &'static str, g: Arc<Grammar>| {
            if let Some(prev) = grammar_from {
                return Err(bad(
                    param,
                    format!("'{param}' and '{prev}' both constrain the output; send one"),
                ));
            }
            grammar_from = Some(param);
            plan.grammar = Some(g);
            Ok(())
        };
        if let Some(g) = &x.grammar {
            set(&mut plan, "grammar", compile("grammar", g)?)?;
        }
        if let Some(s) = &x.json_schema {
            set(&mut plan, "json_schema", schema_grammar("json_schema", s)?)?;
        }
        if let Some(rf) = &x.response_format {
            match rf.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => {
                    let g = match rf.get("schema") {
                        Some(s) => schema_grammar("response_format", s)?,
                        None => compile("response_format", &json_object_grammar())?,
                    };
                    set(&mut plan, "response_format", g)?;
                }
                Some("json_schema") => {
                    let s = rf
                        .get("json_schema")
                        .and_then(|j| j.get("schema"))
                        .or_else(|| rf.get("schema"))
                        .ok_or_else(|| {
                            bad("response_format", "json_schema needs json_schema.schema")
                        })?;
                    set(
                        &mut plan,
                        "response_format",
                        schema_grammar("response_format", s)?,
                    )?;
                }
                other => {
                    return Err(bad(
                        "response_format",
                        format!(
                            "response_format.type must be text, json_object or json_schema, got {}",
                            other.map_or("nothing".to_string(), |o| format!("'{o}'"))
                        ),
                    ));
                }
            }
        }
        let Some(tools) = &x.tools else {
            if x.tool_choice
                .as_ref()
                .is_some_and(|c| c != "none" && c != "auto")
            {
                return Err(bad("tool_choice", "tool_choice needs tools"));
            }
            return Ok(plan);
        };
        let list = tools
            .as_array()
            .ok_or_else(|| bad("tools", "tools must be a list"))?;
        let mut functions = Vec::new();
        for (i, t) in list.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad("tools", format!("tools[{i}].type must be 'function'")));
            }
            let f = t
                .get("function")
                .filter(|f| f.get("name").and_then(Value::as_str).is_some())
                .ok_or_else(|| bad("tools", format!("tools[{i}].function.name is missing")))?;
            functions.push(f.clone());
        }
        if functions.is_empty() {
            return Ok(plan);
        }
        let choice = x.tool_choice.clone().unwrap_or(json!("auto"));
        let forced: Option<Vec<Value>> = match &choice {
            Value::String(s) if s == "none" => return Ok(plan),
            Value::String(s) if s == "auto" => None,
            Value::String(s) if s == "required" => Some(functions.clone()),
            Value::Object(o) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tool_choice", "tool_choice.function.name is missing"))?;
                let f = functions
                    .iter()
                    .find(|f| f["name"] == name)
                    .ok_or_else(|| {
                        bad(
                            "tool_choice",
                            format!("tool_choice names '{name}', not in tools"),
                        )
                    })?;
                Some(vec![f.clone()])
            }
            _ => {
                return Err(bad(
                    "tool_choice",
                    "tool_choice must be auto, none, required or a named function",
                ));
            }
        };
        let style = if template_knows_tools(template) {
            Style::Hermes
        } else {
            Style::Generic
        };
        if let Some(fs) = &forced {
            if grammar_from.is_some() {
                return Err(bad(
                    "tool_choice",
                    "a forced tool call and a response_format/grammar cannot be combined",
                ));
            }
            plan.grammar = Some(call_grammar(fs, style)?);
        }
        plan.tools = Some(ToolPlan {
            functions,
            style,
            forced: forced.is_some(),
        });
        Ok(plan)
    }

    /// The sampler constraint for this plan (the vocabulary built once per server).
    pub fn constraint(
        &self,
        vocab: &std::sync::OnceLock<Arc<Vocab>>,
        tok: &Tokenizer,
    ) -> Option<GrammarConstraint> {
        let g = self.grammar.as_ref()?;
        let v = vocab.get_or_init(|| Arc::new(grammar_vocab(tok)));
        Some(GrammarConstraint::new(Arc::clone(g), Arc::clone(v)))
    }
}

/// The grammar of one call to one of `fs`.
fn call_grammar(fs: &[Value], style: Style) -> Result<Arc<Grammar>, ApiError> {
    let alts: Vec<Value> = fs
        .iter()
        .map(|f| {
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": params},
                "required": ["name", "arguments"],
            })
        })
        .collect();
    let schema = if alts.len() == 1 {
        alts[0].clone()
    } else {
        json!({"anyOf": alts})
    };
    let gbnf = schema_to_gbnf(&schema).map_err(|e| bad("tools", e.to_string()))?;
    let gbnf = match style {
        Style::Generic => gbnf,
        Style::Hermes => gbnf.replacen(
            "root ::= ",
            "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall ::= ",
            1,
        ),
    };
    compile("tools", &gbnf)
}

/// Whether the request needs our own prompt rendering (tools offered or tool messages present).
pub fn needs_prompt(x: &Extras, plan: &Plan) -> bool {
    plan.tools.is_some()
        || x.messages.as_ref().is_some_and(|ms| {
            ms.iter()
                .any(|m| m.get("role") == Some(&json!("tool")) || m.get("tool_calls").is_some())
        })
}

fn text_of(content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => s.push_str(t),
                    _ => return Err(bad("messages", "only text content parts are supported")),
                }
            }
            Ok(s)
        }
        Some(_) => Err(bad(
            "messages",
            "content must be a string or a list of parts",
        )),
    }
}

/// Arguments as an object (they arrive as a JSON string).
fn arguments_value(a: Option<&Value>) -> Value {
    match a {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => json!({}),
    }
}

/// Renders the conversation with the tools and tool turns, and tokenizes it.
pub fn chat_prompt(
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
    x: &Extras,
    plan: &Plan,
) -> Result<Vec<u32>, ApiError> {
    let template = template.ok_or_else(|| bad("messages", "this model has no chat template"))?;
    let msgs = x
        .messages
        .as_ref()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("messages", "messages must not be empty"))?;
    let style = plan.tools.as_ref().map_or(
        if template_knows_tools(Some(template)) {
            Style::Hermes
        } else {
            Style::Generic
        },
        |t| t.style,
    );
    let mut out: Vec<Value> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("messages", format!("message #{i} has no role")))?;
        let content = text_of(m.get("content"))?;
        match (role, style) {
            ("assistant", _) if m.get("tool_calls").is_some() => {
                let calls: Vec<Value> = m["tool_calls"]
                    .as_array()
                    .ok_or_else(|| {
                        bad(
                            "messages",
                            format!("message #{i}: tool_calls must be a list"),
                        )
                    })?
                    .iter()
                    .map(|c| {
                        let f = c.get("function").cloned().unwrap_or(json!({}));
                        json!({"name": f.get("name").cloned().unwrap_or(Value::Null),
                               "arguments": arguments_value(f.get("arguments"))})
                    })
                    .collect();
                if style == Style::Hermes {
                    let tc: Vec<Value> = calls
                        .iter()
                        .map(|c| json!({"type": "function", "function": c}))
                        .collect();
                    out.push(json!({"role": "assistant", "content": content, "tool_calls": tc}));
                } else {
                    let text: Vec<String> = calls.iter().map(Value::to_string).collect();
                    out.push(json!({"role": "assistant", "content": text.join("\n")}));
                }
            }
            ("tool", Style::Hermes) => out.push(json!({"role": "tool", "content": content})),
            ("tool", Style::Generic) => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                out.push(json!({"role": "user",
                    "content": format!("Result of tool call {id}:\n{content}")}));
            }
            _ => out.push(json!({"role": role, "content": content})),
        }
    }
    let mut extra = Map::new();
    if let Some(tp) = &plan.tools {
        let tools: Vec<Value> = tp
            .functions
            .iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect();
        match tp.style {
            Style::Hermes => {
                extra.insert("tools".into(), Value::Array(tools));
            }
            Style::Generic => {
                let list: Vec<String> = tp.functions.iter().map(Value::to_string).collect();
                let instr = format!(
                    "You can call these functions:\n{}\nTo call a function, reply with only a \
                     JSON object {{\"name\": <function name>, \"arguments\": <arguments \
                     object>}}{}",
                    list.join("\n"),
                    if tp.forced {
                        "."
                    } else {
                        "; otherwise answer normally."
                    }
                );
                match out.first_mut() {
                    Some(first) if first["role"] == "system" => {
                        let c = first["content"].as_str().unwrap_or("").to_string();
                        first["content"] = json!(format!("{c}\n\n{instr}"));
                    }
                    _ => out.insert(0, json!({"role": "system", "content": instr})),
                }
            }
        }
    }
    let text = template
        .render(&Value::Array(out), true, Some(&extra))
        .map_err(|e| bad("messages", format!("chat template: {e}")))?;
    let mut ids = tok.encode(&text, false, true);
    if let Some(bos) = tok.bos().filter(|_| tok.add_bos())
        && ids.first() != Some(&bos)
    {
        ids.insert(0, bos);
    }
    Ok(ids)
}

/// The tool calls in a reply's text, each `{"id", "type", "function": {"name", "arguments"}}`
/// with `arguments` a JSON string; `None` when the text is not a call.
pub fn tool_calls(text: &str, tp: &ToolPlan, id: &str) -> Option<Vec<Value>> {
    let mut found = Vec::new();
    let bodies: Vec<&str> = match tp.style {
        Style::Hermes => text
            .split("<tool_call>")
            .skip(1)
            .map(|s| s.split("</tool_call>").next().unwrap_or(s))
            .collect(),
        Style::Generic => {
            let t = text.trim();
            let t = t
                .strip_prefix("```json")
                .or_else(|| t.strip_prefix("```"))
                .map_or(t, |s| s.trim_end_matches("```"));
            vec![t]
        }
    };
    for b in bodies {
        let v: Value = serde_json::from_str(b.trim()).ok()?;
        let name = v.get("name")?.as_str()?;
        if !tp.functions.iter().any(|f| f["name"] == name) {
            return None;
        }
        let args = v.get("arguments").cloned().unwrap_or(json!({}));
        if !args.is_object() {
            return None;
        }
        found.push(json!({
            "id": format!("call_{id}_{}", found.len()),
            "type": "function",
            "function": {"name": name, "arguments": args.to_string()},
        }));
    }
    (!found.is_empty()).then_some(found)
}

/// Rewrites a whole chat reply whose text is a tool call: `message.tool_calls`, no content,
/// `finish_reason: "tool_calls"`.
pub fn tool_reply(body: &mut Value, tp: &ToolPlan, id: &str) {
    let text = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if let Some(calls) = tool_calls(&text, tp, id) {
        body["choices"][0]["message"] =
            json!({"role": "assistant", "content": Value::Null, "tool_calls": calls});
        body["choices"][0]["finish_reason"] = json!("tool_calls");
    }
}

/// The streamed deltas of a finished tool-call reply, as OpenAI streams them: per call one
/// delta with the id, type and name (empty arguments), then one with the arguments.
pub fn tool_deltas(calls: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        out.push(json!({"tool_calls": [{
            "index": i, "id": c["id"], "type": "function",
            "function": {"name": c["function"]["name"], "arguments": ""},
        }]}));
        out.push(json!({"tool_calls": [{
            "index": i, "function": {"arguments": c["function"]["arguments"]},
        }]}));
    }
    out
}
