//! JSON schema → GBNF.
//!
//! Supported: `type` (one or a list), `properties` + `required` (required properties first, in
//! schema order, then the optional ones, each optional), nested objects, `items`, `minItems`,
//! `maxItems`, `enum`, `const`, strings (every JSON escape; `minLength`/`maxLength`; `format`
//! `date`, `time`, `date-time`, `uuid`), integers with `minimum`/`maximum`/exclusive bounds,
//! numbers (with `minimum: 0`), `boolean`, `null`, `anyOf`/`oneOf` (as alternatives), `allOf`
//! of one schema, `$ref` to `#/$defs/...` or `#/definitions/...` (recursion allowed). Keywords
//! that only annotate (`title`, `description`, `default`, `examples`, ...) are ignored, and so
//! are `additionalProperties` / `patternProperties` (the grammar emits only the listed
//! properties, which is always valid). Anything else — `pattern`, `uniqueItems`,
//! `prefixItems`, `not`, bounds on non-integer numbers — is refused with
//! [`GrammarError::UnsupportedKeyword`] rather than silently not enforced.
//!
//! Output is bounded where models tend to loop: at most 20 whitespace characters between
//! tokens, 16 integer digits, 16 fraction digits.

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;

use crate::GrammarError;

/// Shared rules: whitespace, strings, numbers, any JSON value.
const PRIMITIVES: &str = r#"ws ::= | " " | "\n" [ \t]{0,20}
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
int ::= "0" | [1-9] [0-9]{0,15}
frac ::= "." [0-9]{1,16}
exp ::= [eE] [-+]? [0-9]{1,3}
number ::= "-"? int frac? exp?
integer ::= "-"? int
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
"#;

const FORMATS: &str = r#"date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )
time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
uuid ::= [0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12}
"#;

/// Keywords that do not constrain the output (or whose omission keeps the output valid).
const IGNORED: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "additionalProperties",
    "patternProperties",
    "unevaluatedProperties",
    "discriminator",
    "strict",
    "nullable",
];

/// A grammar for any JSON object (`response_format: {"type": "json_object"}`).
pub fn json_object_grammar() -> String {
    format!("root ::= object\n{PRIMITIVES}")
}

/// A GBNF grammar whose language is (a subset of) the JSON documents valid under `schema`.
pub fn schema_to_gbnf(schema: &Value) -> Result<String, GrammarError> {
    let mut b = Builder {
        root: schema,
        rules: BTreeMap::new(),
        defs_done: HashSet::new(),
        n: 0,
    };
    let e = b.visit(schema, "#")?;
    let mut out = format!("root ::= {e}\n{PRIMITIVES}{FORMATS}");
    for (name, body) in &b.rules {
        out.push_str(&format!("{name} ::= {body}\n"));
    }
    Ok(out)
}

/// `s` as a GBNF string literal.
pub fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                out.push_str(&format!("\\x{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_literal(v: &Value) -> String {
    literal(&v.to_string())
}

struct Builder<'a> {
    root: &'a Value,
    rules: BTreeMap<String, String>,
    defs_done: HashSet<String>,
    n: usize,
}

fn bad(path: &str, msg: impl Into<String>) -> GrammarError {
    GrammarError::Schema(format!("{path}: {}", msg.into()))
}

fn unsupported(keyword: &str, path: &str) -> GrammarError {
    GrammarError::UnsupportedKeyword {
        keyword: keyword.to_string(),
        path: path.to_string(),
    }
}

fn count(v: &Value, key: &str, path: &str) -> Result<Option<u64>, GrammarError> {
    match v.get(key) {
        None => Ok(None),
        Some(x) => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| bad(path, format!("'{key}' must be a non-negative integer"))),
    }
}

impl Builder<'_> {
    fn rule(&mut self, hint: &str, body: String) -> String {
        self.n += 1;
        let clean: String = hint
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let name = format!("r{}-{}", self.n, clean.trim_matches('-'));
        let name = name.trim_end_matches('-').to_string();
        self.rules.insert(name.clone(), body);
        name
    }

    fn visit(&mut self, s: &Value, path: &str) -> Result<String, GrammarError> {
        let obj = match s {
            Value::Bool(true) => return Ok("value".into()),
            Value::Bool(false) => return Err(bad(path, "schema 'false' allows nothing")),
            Value::Object(o) => o,
            _ => return Err(bad(path, "a schema must be an object or a boolean")),
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, path);
        }
        if let Some(v) = obj.get("const") {
            return Ok(json_literal(v));
        }
        if let Some(v) = obj.get("enum") {
            let list = v
                .as_array()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| bad(path, "'enum' must be a non-empty array"))?;
            let alts: Vec<String> = list.iter().map(json_literal).collect();
            return Ok(format!("( {} )", alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(v) = obj.get(key) {
                let list = v
                    .as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| bad(path, format!("'{key}' must be a non-empty array")))?;
                let mut alts = Vec::new();
                for (i, sub) in list.iter().enumerate() {
                    alts.push(self.visit(sub, &format!("{path}/{key}/{i}"))?);
                }
                return Ok(format!("( {} )", alts.join(" | ")));
            }
        }
        if let Some(v) = obj.get("allOf") {
            return match v.as_array().map(Vec::as_slice) {
                Some([one]) => self.visit(one, &format!("{path}/allOf/0")),
                _ => Err(unsupported("allOf (with more than one schema)", path)),
            };
        }
        let types: Vec<&str> = match obj.get("type") {
            None if obj.contains_key("properties") => vec!["object"],
            None if obj.contains_key("items") => vec!["array"],
            None => vec![],
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| bad(path, "'type' entries must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(path, "'type' must be a string or a list")),
        };
        self.check_keywords(obj, &types, path)?;
        if types.is_empty() {
            return Ok("value".into());
        }
        let mut alts = Vec::new();
        for t in types {
            alts.push(match t {
                "string" => self.string(obj, path)?,
                "integer" => self.integer(obj, path)?,
                "number" => self.number(obj, path)?,
                "boolean" => "boolean".into(),
                "null" => "null".into(),
                "object" => self.object(obj, path)?,
                "array" => self.array(obj, path)?,
                other => return Err(bad(path, format!("unknown type '{other}'"))),
            });
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or_default()
        } else {
            format!("( {} )", alts.join(" | "))
        })
    }

    fn check_keywords(
        &self,
        obj: &serde_json::Map<String, Value>,
        types: &[&str],
        path: &str,
    ) -> Result<(), GrammarError> {
        for k in obj.keys() {
            let k = k.as_str();
            let ok = IGNORED.contains(&k)
                || k == "type"
                || match k {
                    "properties" | "required" => types.contains(&"object"),
                    "items" | "minItems" | "maxItems" => types.contains(&"array"),
                    "minLength" | "maxLength" | "format" => types.contains(&"string"),
                    "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => {
                        types.contains(&"integer") || types.contains(&"number")
                    }
                    _ => false,
                };
            if !ok {
                return Err(unsupported(k, path));
            }
        }
        Ok(())
    }

    fn reference(&mut self, r: &Value, path: &str) -> Result<String, GrammarError> {
        let r = r
            .as_str()
            .ok_or_else(|| bad(path, "'$ref' must be a string"))?;
        let name = r
            .strip_prefix("#/$defs/")
            .or_else(|| r.strip_prefix("#/definitions/"));
        let (target, rule) = match (r, name) {
            ("#", _) => (self.root, "ref-root".to_string()),
            (_, Some(n)) if !n.contains('/') => {
                let key = if r.starts_with("#/$defs/") {
                    "$defs"
                } else {
                    "definitions"
                };
                let t = self
                    .root
                    .get(key)
                    .and_then(|d| d.get(n))
                    .ok_or_else(|| bad(path, format!("'$ref' {r} points nowhere")))?;
                let clean: String = n
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                    .collect();
                (t, format!("ref-{clean}-{}", n.len()))
            }
            _ => {
                return Err(bad(
                    path,
                    format!("'$ref' {r}: only #/$defs/NAME and #/definitions/NAME are supported"),
                ));
            }
        };
        if self.defs_done.insert(rule.clone()) {
            let body = self.visit(target, r)?;
            self.rules.insert(rule.clone(), body);
        }
        Ok(rule)
    }

    fn string(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<String, GrammarError> {
        if let Some(f) = obj.get("format") {
            return match f.as_str() {
                Some("date") => Ok(r#""\"" date "\"""#.into()),
                Some("time") => Ok(r#""\"" time "\"""#.into()),
                Some("date-time") => Ok(r#""\"" date "T" time "\"""#.into()),
                Some("uuid") => Ok(r#""\"" uuid "\"""#.into()),
                _ => Err(unsupported(&format!("format: {f}"), path)),
            };
        }
        let min = count(&Value::Object(obj.clone()), "minLength", path)?;
        let max = count(&Value::Object(obj.clone()), "maxLength", path)?;
        if min.is_none() && max.is_none() {
            return Ok("string".into());
        }
        let lo = min.unwrap_or(0);
        if lo > 1000 || max.is_some_and(|m| m > 1000) {
            return Err(bad(
                path,
                "minLength/maxLength above 1000 are not supported",
            ));
        }
        if max.is_some_and(|m| m < lo) {
            return Err(bad(path, "maxLength < minLength"));
        }
        let rep = match max {
            Some(m) => format!("{{{lo},{m}}}"),
            None => format!("{{{lo},}}"),
        };
        Ok(format!("\"\\\"\" char{rep} \"\\\"\""))
    }

    fn bounds(
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<(Option<f64>, Option<f64>, bool, bool), GrammarError> {
        let num = |k: &str| -> Result<Option<f64>, GrammarError> {
            match obj.get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| bad(path, format!("'{k}' must be a number"))),
            }
        };
        let (min, xmin) = match (num("minimum")?, num("exclusiveMinimum")?) {
            (Some(a), Some(b)) if b >= a => (Some(b), true),
            (a @ Some(_), _) => (a, false),
            (None, b) => (b, b.is_some()),
        };
        let (max, xmax) = match (num("maximum")?, num("exclusiveMaximum")?) {
            (Some(a), Some(b)) if b <= a => (Some(b), true),
            (a @ Some(_), _) => (a, false),
            (None, b) => (b, b.is_some()),
        };
        Ok((min, max, xmin, xmax))
    }

    fn integer(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<String, GrammarError> {
        let (min, max, xmin, xmax) = Self::bounds(obj, path)?;
        if min.is_none() && max.is_none() {
            return Ok("integer".into());
        }
        let limit = 1e15;
        let lo = match min {
            Some(m) if m.abs() > limit => return Err(bad(path, "integer bound too large")),
            Some(m) => Some(if xmin {
                m.floor() as i64 + 1
            } else {
                m.ceil() as i64
            }),
            None => None,
        };
        let hi = match max {
            Some(m) if m.abs() > limit => return Err(bad(path, "integer bound too large")),
            Some(m) => Some(if xmax {
                m.ceil() as i64 - 1
            } else {
                m.floor() as i64
            }),
            None => None,
        };
        if let (Some(a), Some(b)) = (lo, hi)
            && a > b
        {
            return Err(bad(path, "the integer range is empty"));
        }
        let body = int_range(lo, hi);
        Ok(self.rule(&format!("{path}-int"), body))
    }

    fn number(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<String, GrammarError> {
        let (min, max, xmin, _) = Self::bounds(obj, path)?;
        match (min, max, xmin) {
            (None, None, _) => Ok("number".into()),
            (Some(0.0), None, false) => {
                Ok(self.rule(&format!("{path}-nonneg"), "int frac? exp?".into()))
            }
            _ => Err(unsupported(
                "minimum/maximum on a non-integer number (only minimum: 0 is supported)",
                path,
            )),
        }
    }

    fn object(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<String, GrammarError> {
        let Some(props) = obj.get("properties") else {
            return Ok("object".into());
        };
        let props = props
            .as_object()
            .ok_or_else(|| bad(path, "'properties' must be an object"))?;
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|x| {
                    x.as_str()
                        .ok_or_else(|| bad(path, "'required' entries must be strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(path, "'required' must be a list")),
        };
        for r in &required {
            if !props.contains_key(*r) {
                return Err(bad(
                    path,
                    format!("required property '{r}' is not in 'properties'"),
                ));
            }
        }
        let mut req = Vec::new();
        let mut opt = Vec::new();
        for (name, sub) in props {
            let v = self.visit(sub, &format!("{path}/properties/{name}"))?;
            let kv = format!(
                "{} ws \":\" ws {v} ws",
                literal(&Value::String(name.clone()).to_string())
            );
            if required.contains(&name.as_str()) {
                req.push(kv);
            } else {
                opt.push(kv);
            }
        }
        let mut body = String::from("\"{\" ws ");
        if !req.is_empty() {
            body.push_str(&req.join(" \",\" ws "));
            for kv in &opt {
                body.push_str(&format!(" ( \",\" ws {kv} )?"));
            }
        } else if !opt.is_empty() {
            // Any non-empty ordered subset of the optional properties, or none.
            let mut alts = Vec::new();
            for (i, kv) in opt.iter().enumerate() {
                let mut a = kv.clone();
                for later in &opt[i + 1..] {
                    a.push_str(&format!(" ( \",\" ws {later} )?"));
                }
                alts.push(a);
            }
            body.push_str(&format!("( {} )?", alts.join(" | ")));
        }
        body.push_str(" \"}\"");
        Ok(self.rule(path, body))
    }

    fn array(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        path: &str,
    ) -> Result<String, GrammarError> {
        let item = match obj.get("items") {
            None => "value".to_string(),
            Some(s) => self.visit(s, &format!("{path}/items"))?,
        };
        let o = Value::Object(obj.clone());
        let min = count(&o, "minItems", path)?.unwrap_or(0);
        let max = count(&o, "maxItems", path)?;
        if min > 1000 || max.is_some_and(|m| m > 1000) {
            return Err(bad(path, "minItems/maxItems above 1000 are not supported"));
        }
        if max.is_some_and(|m| m < min) {
            return Err(bad(path, "maxItems < minItems"));
        }
        let item = self.rule(&format!("{path}-item"), item);
        let more = format!("\",\" ws {item} ws");
        let body = match (min, max) {
            (_, Some(0)) => "\"[\" ws \"]\"".to_string(),
            (0, None) => format!("\"[\" ws ( {item} ws ( {more} )* )? \"]\""),
            (0, Some(m)) => format!("\"[\" ws ( {item} ws ( {more} ){{0,{}}} )? \"]\"", m - 1),
            (n, None) => format!("\"[\" ws {item} ws ( {more} ){{{},}} \"]\"", n - 1),
            (n, Some(m)) => format!("\"[\" ws {item} ws ( {more} ){{{},{}}} \"]\"", n - 1, m - 1),
        };
        Ok(self.rule(path, body))
    }
}

/// GBNF for the decimal integers in `lo..=hi` (`None`: unbounded on that side; at most 16
/// digits either way).
pub fn int_range(lo: Option<i64>, hi: Option<i64>) -> String {
    const BIG: i64 = 9_999_999_999_999_999; // 16 digits
    let lo = lo.unwrap_or(-BIG).max(-BIG);
    let hi = hi.unwrap_or(BIG).min(BIG);
    let mut alts = Vec::new();
    if lo < 0 {
        // Negative part: "-" then |x| in max(1, -hi)..=-lo.
        let a = (-hi).max(1);
        let b = -lo;
        if a <= b {
            alts.push(format!("\"-\" ( {} )", nonneg_range(a as u64, b as u64)));
        }
    }
    if hi >= 0 {
        alts.push(format!("( {} )", nonneg_range(lo.max(0) as u64, hi as u64)));
    }
    alts.join(" | ")
}

/// GBNF for `lo..=hi`, both non-negative, without leading zeros.
fn nonneg_range(lo: u64, hi: u64) -> String {
    let mut alts = Vec::new();
    let digits = |x: u64| x.to_string().len();
    for len in digits(lo)..=digits(hi) {
        let first = if len == 1 {
            0
        } else {
            10u64.pow(len as u32 - 1)
        };
        let last = 10u64.pow(len as u32) - 1;
        let a = lo.max(first);
        let b = hi.min(last);
        if a <= b {
            alts.push(same_len(&a.to_string(), &b.to_string()));
        }
    }
    alts.join(" | ")
}

/// Digit strings of one length between `a` and `b` inclusive.
fn same_len(a: &str, b: &str) -> String {
    if a == b {
        return literal(a);
    }
    let (x, y) = (a.as_bytes()[0], b.as_bytes()[0]);
    let n = a.len() - 1;
    if n == 0 {
        return format!("[{}-{}]", x as char, y as char);
    }
    let tail_a = &a[1..];
    let tail_b = &b[1..];
    if x == y {
        return format!("\"{}\" ( {} )", x as char, same_len(tail_a, tail_b));
    }
    let nines = "9".repeat(n);
    let zeros = "0".repeat(n);
    let mut alts = vec![format!(
        "\"{}\" ( {} )",
        x as char,
        same_len(tail_a, &nines)
    )];
    if x + 1 < y {
        alts.push(format!(
            "[{}-{}] [0-9]{{{n}}}",
            (x + 1) as char,
            (y - 1) as char
        ));
    }
    alts.push(format!(
        "\"{}\" ( {} )",
        y as char,
        same_len(&zeros, tail_b)
    ));
    alts.join(" | ")
}
