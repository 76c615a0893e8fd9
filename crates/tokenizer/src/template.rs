//! Chat templates: render `tokenizer.chat_template` (Jinja) with minijinja the way Hugging Face
//! `apply_chat_template` does.
//!
//! Matching HF means: `trim_blocks` and `lstrip_blocks` on, the trailing newline dropped,
//! Python string/dict methods (`.strip()`, `.items()`, via minijinja-contrib's pycompat), and the
//! globals HF installs: `raise_exception(msg)`, `strftime_now(fmt)`, and a `tojson` filter that
//! prints like Python's `json.dumps` (`", "` / `": "` separators, no HTML escaping, `indent=`).
//!
//! A GGUF without `tokenizer.chat_template` (base models such as Gemma 3 270M) still chats, as
//! with llama-server: [`ChatTemplate::for_model`] falls back to a built-in template
//! ([`BUILTIN_TEMPLATES`]: the family's own turn format where we carry one, else ChatML), and
//! says so.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use crate::error::{Result, TokenizerError};

/// A compiled-on-demand chat template plus the special-token strings it may reference.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// A template from Jinja source; `bos_token` / `eos_token` are exposed to it by those names.
    pub fn new(source: impl Into<String>, bos_token: &str, eos_token: &str) -> Self {
        Self {
            source: source.into(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        }
    }

    /// The model's own template, or [`TokenizerError::NoChatTemplate`].
    pub fn from_tokenizer(tok: &crate::Tokenizer) -> Result<Self> {
        let src = tok.chat_template().ok_or(TokenizerError::NoChatTemplate)?;
        Ok(Self::new(src, tok.bos_text(), tok.eos_text()))
    }

    /// A built-in template by name (`chatml`, `gemma`; llama.cpp's `--chat-template NAME`).
    pub fn builtin(name: &str, tok: &crate::Tokenizer) -> Result<Self> {
        let (_, src) = BUILTIN_TEMPLATES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| TokenizerError::UnknownTemplate {
                name: name.to_string(),
                known: BUILTIN_TEMPLATES.map(|(n, _)| n).join(", "),
            })?;
        Ok(Self::new(*src, tok.bos_text(), tok.eos_text()))
    }

    /// The model's own template, else the built-in one for its `general.architecture`
    /// (`gemma*` → `gemma`, anything else → `chatml`). The second value names the built-in
    /// template when it was a fallback, for the caller to tell the user.
    pub fn for_model(tok: &crate::Tokenizer, architecture: &str) -> (Self, Option<&'static str>) {
        if let Ok(own) = Self::from_tokenizer(tok) {
            return (own, None);
        }
        let name = if architecture.starts_with("gemma") {
            "gemma"
        } else {
            "chatml"
        };
        let (_, src) = BUILTIN_TEMPLATES
            .iter()
            .find(|(n, _)| *n == name)
            .expect("the fallback names are built in");
        (Self::new(*src, tok.bos_text(), tok.eos_text()), Some(name))
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages` (a JSON list of `{"role", "content", ...}` objects). `extra` adds or
    /// overrides context variables (`tools`, `date_string`, ...).
    pub fn render(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
        extra: Option<&serde_json::Map<String, Json>>,
    ) -> Result<String> {
        let list = messages
            .as_array()
            .ok_or_else(|| TokenizerError::Messages("expected a JSON list of messages".into()))?;
        if let Some((i, _)) = list.iter().enumerate().find(|(_, m)| !m.is_object()) {
            return Err(TokenizerError::Messages(format!(
                "message #{i} is not an object"
            )));
        }
        let env = environment();
        let tmpl = env.template_from_named_str("chat_template", &self.source)?;
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), messages.clone());
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(add_generation_prompt),
        );
        ctx.insert("bos_token".into(), Json::String(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Json::String(self.eos_token.clone()));
        if let Some(extra) = extra {
            for (k, v) in extra {
                ctx.insert(k.clone(), v.clone());
            }
        }
        Ok(tmpl.render(Value::from_serialize(&ctx))?)
    }
}

/// Templates carried for models whose GGUF has none: `(name, Jinja source)`.
pub const BUILTIN_TEMPLATES: [(&str, &str); 2] = [
    ("chatml", include_str!("templates/chatml.jinja")),
    ("gemma", include_str!("templates/gemma.jinja")),
];

/// The minijinja environment configured like HF's `ImmutableSandboxedEnvironment`.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        strftime(&fmt, secs)
    });
    env.add_filter("tojson", tojson);
    env
}

/// `tojson` as HF defines it: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match usize::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(n)),
            Err(_) => Some(v.as_str().unwrap_or("").to_string()),
        },
    };
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    for k in ["ensure_ascii", "separators"] {
        // Accepted for compatibility; HF templates use the defaults.
        let _: Option<Value> = kwargs.get(k)?;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(
        &value,
        indent.as_deref(),
        sort_keys.unwrap_or(false),
        0,
        &mut out,
    )?;
    Ok(Value::from(out))
}

/// Python `json.dumps` formatting of a minijinja value.
fn write_json(
    v: &Value,
    indent: Option<&str>,
    sort: bool,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, d: usize| {
        if let Some(ind) = indent {
            out.push('\n');
            for _ in 0..d {
                out.push_str(ind);
            }
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => write_json_str(v.as_str().unwrap_or(""), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(it, indent, sort, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => write_json_str(s, out),
                    None => write_json_str(&k.to_string(), out),
                }
                out.push_str(": ");
                write_json(&v.get_item(k)?, indent, sort, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => write_json_str(&v.to_string(), out),
    }
    Ok(())
}

/// Python's `repr(float)` for the common cases (`1.0`, `0.5`, `1e-05`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let a = f.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        // Rust prints `1e-5`; Python prints `1e-05`.
        let s = format!("{f:e}");
        if let Some((m, e)) = s.split_once('e') {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            return format!("{m}e{sign}{digits:0>2}");
        }
        return s;
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// JSON string with `ensure_ascii=False` escaping.
fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Format a UTC time (`secs` since the Unix epoch) like C `strftime` for the common specifiers
/// (`%Y %y %m %d %e %B %b %A %a %H %M %S %j %p %I %%`); others are kept literally.
pub fn strftime(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let wd = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match it.next() {
            Some('Y') => write!(out, "{y}"),
            Some('y') => write!(out, "{:02}", y.rem_euclid(100)),
            Some('m') => write!(out, "{m:02}"),
            Some('d') => write!(out, "{d:02}"),
            Some('e') => write!(out, "{d:2}"),
            Some('B') => write!(out, "{}", MONTHS[m as usize - 1]),
            Some('b') | Some('h') => write!(out, "{}", &MONTHS[m as usize - 1][..3]),
            Some('A') => write!(out, "{}", DAYS[wd]),
            Some('a') => write!(out, "{}", &DAYS[wd][..3]),
            Some('H') => write!(out, "{hh:02}"),
            Some('I') => write!(out, "{:02}", if hh % 12 == 0 { 12 } else { hh % 12 }),
            Some('p') => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{mm:02}"),
            Some('S') => write!(out, "{ss:02}"),
            Some('j') => write!(out, "{yday:03}"),
            Some('%') => write!(out, "%"),
            Some(o) => write!(out, "%{o}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 → (year, month 1-12, day 1-31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 00:00:00 UTC
        assert_eq!(strftime("%d %b %Y", 1_721_952_000), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %j %H:%M:%S", 1_721_952_000 + 3661),
            "Friday July 208 01:01:01"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }

    fn builtin(name: &str) -> ChatTemplate {
        let (_, src) = BUILTIN_TEMPLATES.iter().find(|(n, _)| *n == name).unwrap();
        ChatTemplate::new(*src, "<bos>", "<eos>")
    }

    #[test]
    fn builtin_templates_render_the_family_turn_formats() {
        let msgs: Json = serde_json::from_str(
            r#"[{"role": "system", "content": "You are terse."},
                {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "And?"}]"#,
        )
        .unwrap();
        // Gemma's own format: the system text opens the first user turn.
        assert_eq!(
            builtin("gemma").render(&msgs, true, None).unwrap(),
            "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello<end_of_turn>\n\
             <start_of_turn>user\nAnd?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            builtin("chatml").render(&msgs, false, None).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n\
             <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n"
        );
        // A tool-call turn without content renders as an empty turn, not an error.
        let calls: Json =
            serde_json::from_str(r#"[{"role": "assistant", "content": null, "tool_calls": []}]"#)
                .unwrap();
        for (name, _) in BUILTIN_TEMPLATES {
            builtin(name).render(&calls, true, None).unwrap();
        }
    }

    #[test]
    fn tojson_like_python() {
        let t = ChatTemplate::new("{{ x|tojson }}|{{ x|tojson(indent=2) }}", "", "");
        let extra: serde_json::Map<String, Json> =
            serde_json::from_str(r#"{"x": {"a": {}, "b": [1, 2.5, "<é\n>"], "c": null}}"#).unwrap();
        let s = t.render(&Json::Array(vec![]), false, Some(&extra)).unwrap();
        assert_eq!(
            s,
            "{\"a\": {}, \"b\": [1, 2.5, \"<é\\n>\"], \"c\": null}|{\n  \"a\": {},\n  \"b\": [\n    1,\n    2.5,\n    \"<é\\n>\"\n  ],\n  \"c\": null\n}"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('bad roles') }}", "", "");
        let e = t.render(&Json::Array(vec![]), false, None).unwrap_err();
        assert!(e.to_string().contains("bad roles"), "{e}");
    }

    #[test]
    fn python_methods_and_trim() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.content.strip() }}|{{ m['content']|trim }}|{{ loop.index }}{% endfor %}",
            "",
            "",
        );
        let msgs: Json = serde_json::from_str(r#"[{"role":"user","content":"  hi  "}]"#).unwrap();
        assert_eq!(t.render(&msgs, false, None).unwrap(), "hi|hi|1");
    }
}
