//! GBNF parser and automaton: good and bad grammars (clear errors, never a panic), random
//! inputs, accept/reject of strings.

use std::sync::Arc;

use damascus_grammar::{Grammar, GrammarError, Matcher};

fn matcher(src: &str) -> Matcher {
    Matcher::new(Arc::new(
        Grammar::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}")),
    ))
}

/// Whether the whole of `s` is a sentence of the grammar.
fn full(m: &Matcher, s: &str) -> bool {
    let mut m = m.clone();
    m.advance_bytes(s.as_bytes()).is_ok() && m.can_end()
}

/// Whether `s` is a prefix of some sentence.
fn prefix(m: &Matcher, s: &str) -> bool {
    m.accepts_bytes(s.as_bytes())
}

#[test]
fn literals_alternation_groups() {
    let m = matcher(r#"root ::= "yes" | "no" | ("may" "be")"#);
    for s in ["yes", "no", "maybe"] {
        assert!(full(&m, s), "{s}");
    }
    for s in ["ye", "", "m"] {
        assert!(prefix(&m, s) && !full(&m, s), "{s}");
    }
    for s in ["yess", "x", "nope", "maybe!"] {
        assert!(!prefix(&m, s), "{s}");
    }
}

#[test]
fn repetitions() {
    let m = matcher(r#"root ::= "a"* "b"+ "c"? "d"{2} "e"{1,3} "f"{2,}"#);
    assert!(full(&m, "bddeff"));
    assert!(full(&m, "aaabbbcddeeefffff"));
    assert!(!prefix(&m, "bdde eff"));
    assert!(!full(&m, "bddef"));
    assert!(!prefix(&m, "bddeeeee"));
    assert!(!prefix(&m, "ddeff"));
    // A repeated group and a repeated multi-character literal.
    let m = matcher(r#"root ::= ("ab" | "c"){2,3} "xy"*"#);
    assert!(full(&m, "abc") && full(&m, "cabab") && full(&m, "ccxyxy"));
    assert!(!full(&m, "ab") && !prefix(&m, "abababa") && !prefix(&m, "ccx y"));
}

#[test]
fn classes_escapes_unicode() {
    let m = matcher(
        r#"
        # a comment
        root ::= [a-zA-Z_] [a-z0-9\-]* tail   # trailing comment
        tail ::= [^"\\\n]? "\x41\u00e9\n" [\u4e00-\u9fff]
        "#,
    );
    assert!(full(&m, "x-9!Aé\n中"));
    assert!(full(&m, "_Aé\n中"));
    assert!(!prefix(&m, "9"));
    assert!(!prefix(&m, "a\"A"));
    assert!(!full(&m, "aAé\nx"));
    // UTF-8 split across calls: the lead byte alone is a valid prefix only if some class can
    // take a character starting with it.
    let mut m2 = m.clone();
    m2.advance_bytes("aAé\n".as_bytes()).unwrap();
    let zhong = "中".as_bytes();
    assert!(m2.accepts_bytes(&zhong[..1]));
    assert!(!m2.accepts_bytes("é".as_bytes()));
    m2.advance_bytes(&zhong[..2]).unwrap();
    assert!(!m2.can_end());
    m2.advance_bytes(&zhong[2..]).unwrap();
    assert!(m2.can_end() && m2.is_finished());
    // Invalid UTF-8 is refused.
    assert!(!matcher("root ::= .*").accepts_bytes(&[0xC0, 0x80]));
    assert!(!matcher("root ::= .*").accepts_bytes(&[0xED, 0xA0, 0x80]));
    assert!(matcher("root ::= .*").accepts_bytes("héllo 中 🎉".as_bytes()));
}

#[test]
fn recursion_and_rules_across_lines() {
    let m =
        matcher("root ::= expr\nexpr ::= term (\"+\" term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n");
    assert!(full(&m, "1+(2+(3+4))+5"));
    assert!(!full(&m, "1+(2+3"));
    assert!(prefix(&m, "1+(2+3"));
    assert!(!prefix(&m, "1+)"));
    // Alternatives continued on the next line.
    let m = matcher("root ::= \"a\"\n  | \"b\"\nother ::= \"c\"");
    assert!(full(&m, "a") && full(&m, "b") && !prefix(&m, "c"));
}

#[test]
fn deep_right_recursion_stays_flat() {
    let m = matcher("root ::= [a-z]*");
    let mut m = m.clone();
    for _ in 0..10_000 {
        m.advance_bytes(b"x").unwrap();
    }
    assert!(m.n_stacks() <= 2, "{}", m.n_stacks());
    // Ambiguity does not multiply the stacks.
    let mut m = matcher(r#"root ::= ("a" | "a" | [a-c])*"#);
    m.advance_bytes(&[b'a'; 64]).unwrap();
    assert!(m.n_stacks() <= 4, "{}", m.n_stacks());
}

fn parse_err(src: &str) -> GrammarError {
    match Grammar::parse(src) {
        Ok(_) => panic!("expected an error for {src:?}"),
        Err(e) => e,
    }
}

#[test]
fn bad_grammars_get_clear_errors() {
    assert_eq!(parse_err(r#"start ::= "a""#), GrammarError::NoRoot);
    assert_eq!(
        parse_err(r#"root ::= foo"#),
        GrammarError::UndefinedRule("foo".into())
    );
    assert!(matches!(
        parse_err(r#"root ::= root "a" | "b""#),
        GrammarError::LeftRecursion(r) if r == "root"
    ));
    assert!(matches!(
        parse_err(r#"root ::= ("a"?)*"#),
        GrammarError::LeftRecursion(_)
    ));
    for (src, needle) in [
        (r#"root ::= "abc"#, "unterminated string"),
        ("root ::= [a-z", "unterminated character class"),
        ("root ::= [z-a]", "reversed"),
        ("root ::= []", "empty character class"),
        ("root ::= (\"a\"", "expected ')'"),
        ("root ::= \"a\"{3,1}", "max < min"),
        ("root ::= \"a\"{x}", "expected a number"),
        ("root ::= \"\\q\"", "unknown escape"),
        ("root ::= \"\\xZZ\"", "hex digits"),
        ("root ::= \"\\uD800\"", "not a Unicode scalar"),
        ("root = \"a\"", "expected '::='"),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        ("root ::= \"a\" @", "unexpected character '@'"),
        (":: = \"a\"", "expected a rule name"),
    ] {
        let e = parse_err(src).to_string();
        assert!(e.contains(needle), "{src:?}: {e}");
    }
    let e = parse_err("root ::= \"a\"\n  x ::= [b-a]").to_string();
    assert!(e.contains("line 2"), "{e}");
    assert!(matches!(
        parse_err("root ::= \"a\"{99999}"),
        GrammarError::TooLarge(_)
    ));
    let huge = format!("root ::= {}", "\"a\"{9999} ".repeat(120));
    assert!(matches!(parse_err(&huge), GrammarError::TooLarge(_)));
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(500), ")".repeat(500));
    assert!(parse_err(&deep).to_string().contains("nested deeper"));
}

/// A tiny deterministic generator (no rand dependency).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn random_inputs_never_panic() {
    let pieces = [
        "root", " ::= ", "::=", "\"a\"", "\"", "[", "]", "^", "-", "(", ")", "|", "*", "+", "?",
        "{", "}", ",", "2", "x", " ", "\n", "\\", "\\x4", "\\u00e9", ".", "#c\n", "é", "a-z",
        "rule", "\t", "{1,", "0",
    ];
    let mut rng = Lcg(7);
    let mut parsed = 0;
    for _ in 0..20_000 {
        let n = 1 + rng.next() as usize % 12;
        let mut s = String::from(if rng.next().is_multiple_of(2) {
            "root ::= "
        } else {
            ""
        });
        for _ in 0..n {
            s.push_str(pieces[rng.next() as usize % pieces.len()]);
        }
        if let Ok(g) = Grammar::parse(&s) {
            parsed += 1;
            let mut m = Matcher::new(Arc::new(g));
            for _ in 0..8 {
                let b = [b"a", b"x", b"2", b"\n", "é".as_bytes()][rng.next() as usize % 5];
                let _ = m.accepts_bytes(b);
                let _ = m.advance_bytes(b);
            }
        }
    }
    assert!(parsed > 100, "only {parsed} random grammars parsed");
    // Random bytes as a grammar.
    for _ in 0..5_000 {
        let bytes: Vec<u8> = (0..rng.next() % 40).map(|_| rng.next() as u8).collect();
        let _ = Grammar::parse(&String::from_utf8_lossy(&bytes));
    }
}
