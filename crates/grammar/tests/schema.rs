//! JSON schema → grammar: valid documents are sentences, invalid ones are refused, unsupported
//! keywords are named in the error.

use std::sync::Arc;

use damascus_grammar::{Grammar, GrammarError, Matcher, json_object_grammar, schema_to_gbnf};
use serde_json::{Value, json};

fn matcher(schema: &Value) -> Matcher {
    let g = schema_to_gbnf(schema).unwrap_or_else(|e| panic!("{e}"));
    Matcher::new(Arc::new(
        Grammar::parse(&g).unwrap_or_else(|e| panic!("{e}\n{g}")),
    ))
}

fn full(m: &Matcher, s: &str) -> bool {
    let mut m = m.clone();
    m.advance_bytes(s.as_bytes()).is_ok() && m.can_end()
}

#[test]
fn nested_objects_in_order() {
    let m = matcher(&json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"],
            },
            "nick": {"type": "string"},
        },
        "required": ["name", "address"],
    }));
    assert!(full(&m, r#"{"name": "a", "address": {"city": "b"}}"#));
    assert!(full(
        &m,
        r#"{"name":"a","address":{"city":"b","zip":"1"},"nick":"n"}"#
    ));
    assert!(full(
        &m,
        "{\n  \"name\": \"a\",\n  \"address\": {\"city\": \"b\"}\n}"
    ));
    assert!(!full(&m, r#"{"name": "a"}"#));
    assert!(!full(&m, r#"{"address": {"city": "b"}, "name": "a"}"#));
    assert!(!full(&m, r#"{"name": "a", "address": {"zip": "1"}}"#));
    assert!(!full(
        &m,
        r#"{"name": "a", "address": {"city": "b"}, "other": 1}"#
    ));
}

#[test]
fn enums_consts_arrays_min_items() {
    let m = matcher(&json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", 3, null]},
            "kind": {"const": "fixed"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
            "any": {"type": "array"},
        },
        "required": ["color", "kind", "tags", "any"],
    }));
    assert!(full(
        &m,
        r#"{"color": "red", "kind": "fixed", "tags": ["a", "b"], "any": []}"#
    ));
    assert!(full(
        &m,
        r#"{"color": 3, "kind": "fixed", "tags": ["a", "b", "c"], "any": [1, {"x": null}]}"#
    ));
    assert!(full(
        &m,
        r#"{"color": null, "kind": "fixed", "tags": ["a","b"], "any": [[]]}"#
    ));
    assert!(!full(
        &m,
        r#"{"color": "blue", "kind": "fixed", "tags": ["a", "b"], "any": []}"#
    ));
    assert!(!full(
        &m,
        r#"{"color": "red", "kind": "other", "tags": ["a", "b"], "any": []}"#
    ));
    assert!(!full(
        &m,
        r#"{"color": "red", "kind": "fixed", "tags": ["a"], "any": []}"#
    ));
    assert!(!full(
        &m,
        r#"{"color": "red", "kind": "fixed", "tags": ["a","b","c","d"], "any": []}"#
    ));
}

#[test]
fn numbers_integers_ranges() {
    let m = matcher(&json!({"type": "number"}));
    for s in ["0", "-1", "3.25", "1e5", "-0.5E-3", "12345"] {
        assert!(full(&m, s), "{s}");
    }
    for s in ["01", "1.", ".5", "+1", "1e", "--1", "NaN"] {
        assert!(!full(&m, s), "{s}");
    }
    let m = matcher(&json!({"type": "integer", "minimum": -12, "maximum": 137}));
    for v in -30..200 {
        assert_eq!(full(&m, &v.to_string()), (-12..=137).contains(&v), "{v}");
    }
    assert!(!full(&m, "1.5") && !full(&m, "007"));
    let m = matcher(&json!({"type": "integer", "exclusiveMinimum": 18}));
    for v in [0, 17, 18] {
        assert!(!full(&m, &v.to_string()), "{v}");
    }
    for v in [19, 20, 99, 100, 12345] {
        assert!(full(&m, &v.to_string()), "{v}");
    }
    let m = matcher(&json!({"type": "number", "minimum": 0}));
    assert!(full(&m, "0.5") && !full(&m, "-1"));
}

#[test]
fn strings_with_escapes_and_formats() {
    let m = matcher(&json!({"type": "string"}));
    for s in [
        r#""""#,
        r#""a\"b""#,
        r#""\\ \/ \b\f\n\r\t""#,
        r#""\u00e9\uABCD""#,
        "\"é中🎉\"",
    ] {
        assert!(full(&m, s), "{s}");
    }
    for s in ["\"a", "\"\\x\"", "\"\\u12\"", "\"a\nb\"", "\"a\"b\""] {
        assert!(!full(&m, s), "{s:?}");
    }
    let m = matcher(&json!({"type": "string", "minLength": 2, "maxLength": 3}));
    assert!(full(&m, r#""ab""#) && full(&m, r#""a\nc""#));
    assert!(!full(&m, r#""a""#) && !full(&m, r#""abcd""#));
    let m = matcher(&json!({"type": "string", "format": "date-time"}));
    assert!(full(&m, r#""2024-02-29T12:30:00Z""#));
    assert!(!full(&m, r#""2024-13-01T00:00:00Z""#));
    let m = matcher(&json!({"type": "string", "format": "uuid"}));
    assert!(full(&m, r#""123e4567-e89b-12d3-a456-426614174000""#));
}

#[test]
fn any_of_refs_and_nullable() {
    let m = matcher(&json!({
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
                "required": ["v", "next"],
            }
        },
        "type": "object",
        "properties": {
            "head": {"$ref": "#/$defs/node"},
            "label": {"type": ["string", "null"]},
            "flag": {"oneOf": [{"type": "boolean"}, {"const": "maybe"}]},
        },
        "required": ["head", "label", "flag"],
    }));
    assert!(full(
        &m,
        r#"{"head": {"v": 1, "next": {"v": 2, "next": null}}, "label": null, "flag": true}"#
    ));
    assert!(full(
        &m,
        r#"{"head": {"v": 1, "next": null}, "label": "x", "flag": "maybe"}"#
    ));
    assert!(!full(
        &m,
        r#"{"head": {"v": 1}, "label": "x", "flag": true}"#
    ));
    assert!(!full(
        &m,
        r#"{"head": {"v": 1, "next": null}, "label": 3, "flag": true}"#
    ));
}

#[test]
fn json_object_and_empty_schema() {
    let g = Arc::new(Grammar::parse(&json_object_grammar()).unwrap());
    let m = Matcher::new(g);
    assert!(full(&m, r#"{"a": [1, 2.5, "x", true, null, {}]}"#));
    assert!(full(&m, "{}"));
    assert!(!full(&m, "[]") && !full(&m, "\"x\""));
    let m = matcher(&json!({}));
    assert!(full(&m, "[]") && full(&m, "1") && full(&m, r#"{"k": "v"}"#));
}

#[test]
fn unsupported_keywords_are_named() {
    for (schema, kw) in [
        (json!({"type": "string", "pattern": "^a$"}), "pattern"),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
        (json!({"not": {"type": "string"}}), "not"),
        (json!({"type": "number", "maximum": 3.5}), "minimum/maximum"),
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "format": "email"}}}),
            "format",
        ),
    ] {
        match schema_to_gbnf(&schema) {
            Err(GrammarError::UnsupportedKeyword { keyword, .. }) => {
                assert!(keyword.contains(kw), "{keyword} vs {kw}")
            }
            other => panic!("{schema}: {other:?}"),
        }
    }
    for schema in [
        json!({"$ref": "#/$defs/missing"}),
        json!({"type": "object", "properties": {}, "required": ["x"]}),
        json!({"type": "wat"}),
        json!({"enum": []}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!(3),
    ] {
        assert!(
            matches!(schema_to_gbnf(&schema), Err(GrammarError::Schema(_))),
            "{schema}"
        );
    }
}
