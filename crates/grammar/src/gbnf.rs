//! GBNF, the grammar format of llama.cpp's `--grammar` and llama-server's `grammar` field, parsed
//! into a flat [`Grammar`].
//!
//! Syntax: `name ::= body` rules (a rule ends where the next `name ::=` starts), `|`
//! alternation, sequences, `( ... )` groups, `*` `+` `?` `{m}` `{m,}` `{m,n}` repetition,
//! `"literal"` strings, `[a-z0-9_]` / `[^"\\]` character classes, `.` (any character), escapes
//! `\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`, `#` comments. Start rule: `root`.
//!
//! Groups and repetitions become generated rules, so every alternative is a plain sequence of
//! [`Elem`]s: a character class, a rule reference, and an [`Elem::End`] closing it. Repetition
//! is right-recursive (`x*` ⇒ `r ::= x r | ε`) so matching never needs left recursion, which
//! [`Grammar::parse`] refuses with a clear error.

use std::collections::HashMap;

use crate::GrammarError;

/// Most repetitions one `{m,n}` may ask for.
pub const MAX_REPEAT: u32 = 10_000;
/// Most elements a grammar may expand to.
pub const MAX_ELEMS: usize = 1 << 20;
/// Deepest nesting of groups.
pub const MAX_DEPTH: usize = 128;

/// A set of Unicode code points: sorted, merged inclusive ranges, possibly negated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    ranges: Vec<(u32, u32)>, // sorted, non-overlapping, non-adjacent
    negated: bool,
    ascii: [u64; 2], // membership of 0..128 (after negation)
}

impl Class {
    /// A class from inclusive ranges (any order, may overlap).
    pub fn new(mut ranges: Vec<(u32, u32)>, negated: bool) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut c = Self {
            ranges: merged,
            negated,
            ascii: [0; 2],
        };
        for b in 0..128u32 {
            if c.slow_contains(b) {
                c.ascii[(b / 64) as usize] |= 1 << (b % 64);
            }
        }
        c
    }

    fn slow_contains(&self, cp: u32) -> bool {
        let inside = self
            .ranges
            .binary_search_by(|&(lo, hi)| {
                if hi < cp {
                    std::cmp::Ordering::Less
                } else if lo > cp {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok();
        inside != self.negated
    }

    /// Whether the class holds code point `cp`.
    #[inline]
    pub fn contains(&self, cp: u32) -> bool {
        if cp < 128 {
            self.ascii[(cp / 64) as usize] >> (cp % 64) & 1 == 1
        } else {
            self.slow_contains(cp)
        }
    }

    /// Whether the class holds any code point of `lo..=hi`.
    pub fn intersects(&self, lo: u32, hi: u32) -> bool {
        if !self.negated {
            return self.ranges.iter().any(|&(a, b)| a <= hi && b >= lo);
        }
        // Negated: some point of lo..=hi lies outside every range.
        let mut next = lo; // first point not yet known to be covered
        for &(a, b) in &self.ranges {
            if b < next {
                continue;
            }
            if a > next {
                return true;
            }
            if b >= hi {
                return false;
            }
            next = b + 1;
        }
        next <= hi
    }
}

/// One element of an alternative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// One character from the class with this index ([`Grammar::class`]).
    Char(u32),
    /// The rule with this index.
    Ref(u32),
    /// End of the alternative.
    End,
}

/// A parsed grammar: every rule's alternatives as runs of [`Elem`]s in one flat array.
#[derive(Debug, Clone)]
pub struct Grammar {
    names: Vec<String>,  // [n_rules] rule names (generated ones: `name#N`)
    alts: Vec<Vec<u32>>, // [n_rules][n_alts] index in `elems` of each alternative's start
    elems: Vec<Elem>,    // [n_elems] all alternatives, each closed by End
    classes: Vec<Class>, // [n_classes]
    root: u32,
}

impl Grammar {
    /// Parses GBNF text. Errors name the line and column, the undefined rule or the
    /// left-recursive rule; never panics.
    pub fn parse(src: &str) -> Result<Self, GrammarError> {
        let mut p = Parser {
            src: src.chars().collect(),
            i: 0,
            ids: HashMap::new(),
            names: Vec::new(),
            bodies: Vec::new(),
            classes: Vec::new(),
            n_elems: 0,
        };
        p.parse_rules()?;
        p.finish()
    }

    /// Index of the start rule.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// Element at index `i`.
    #[inline]
    pub fn elem(&self, i: u32) -> Elem {
        self.elems[i as usize]
    }

    /// Start indices of rule `r`'s alternatives.
    #[inline]
    pub fn alternatives(&self, r: u32) -> &[u32] {
        &self.alts[r as usize]
    }

    /// Character class `c`.
    #[inline]
    pub fn class(&self, c: u32) -> &Class {
        &self.classes[c as usize]
    }

    /// Rule names (generated rules included).
    pub fn rule_names(&self) -> &[String] {
        &self.names
    }

    /// Number of elements.
    pub fn n_elems(&self) -> usize {
        self.elems.len()
    }
}

type Seq = Vec<Elem>;

struct Parser {
    src: Vec<char>,
    i: usize,
    ids: HashMap<String, u32>,
    names: Vec<String>,
    bodies: Vec<Option<Vec<Seq>>>, // [n_rules] alternatives; None until defined
    classes: Vec<Class>,
    n_elems: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

impl Parser {
    fn err(&self, msg: impl Into<String>) -> GrammarError {
        let upto = &self.src[..self.i.min(self.src.len())];
        let line = upto.iter().filter(|&&c| c == '\n').count() + 1;
        let col = upto.iter().rev().take_while(|&&c| c != '\n').count() + 1;
        GrammarError::Parse {
            line,
            col,
            msg: msg.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.src.get(self.i).copied()
    }

    fn skip_ws(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.i += 1;
                }
            } else if c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn rule_id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.ids.insert(name.to_string(), id);
        self.names.push(name.to_string());
        self.bodies.push(None);
        id
    }

    /// A fresh generated rule `base_N` with the given body.
    fn new_rule(&mut self, base: &str, body: Vec<Seq>) -> Result<u32, GrammarError> {
        self.count(body.iter().map(|s| s.len() + 1).sum())?;
        let id = self.names.len() as u32;
        self.names.push(format!("{base}#{id}"));
        self.bodies.push(Some(body));
        Ok(id)
    }

    fn count(&mut self, n: usize) -> Result<(), GrammarError> {
        self.n_elems += n;
        if self.n_elems > MAX_ELEMS {
            return Err(GrammarError::TooLarge(format!(
                "more than {MAX_ELEMS} elements after expanding repetitions"
            )));
        }
        Ok(())
    }

    fn parse_name(&mut self) -> Option<String> {
        let start = self.i;
        while self.peek().is_some_and(is_name_char) {
            self.i += 1;
        }
        (self.i > start).then(|| self.src[start..self.i].iter().collect())
    }

    fn at_rule_start(&mut self) -> bool {
        let save = self.i;
        let ok = self.parse_name().is_some() && {
            self.skip_ws(false);
            self.src[self.i.min(self.src.len())..].starts_with(&[':', ':', '='])
        };
        self.i = save;
        ok
    }

    fn parse_rules(&mut self) -> Result<(), GrammarError> {
        loop {
            self.skip_ws(true);
            if self.peek().is_none() {
                return Ok(());
            }
            let Some(name) = self.parse_name() else {
                return Err(self.err(format!(
                    "expected a rule name, found '{}'",
                    self.peek().unwrap_or(' ')
                )));
            };
            self.skip_ws(false);
            if !self.src[self.i..].starts_with(&[':', ':', '=']) {
                return Err(self.err(format!("expected '::=' after rule name '{name}'")));
            }
            self.i += 3;
            let id = self.rule_id(&name);
            if self.bodies[id as usize].is_some() {
                return Err(self.err(format!("rule '{name}' is defined twice")));
            }
            let body = self.parse_alts(&name, 0)?;
            self.count(body.iter().map(|s| s.len() + 1).sum())?;
            self.bodies[id as usize] = Some(body);
        }
    }

    fn parse_alts(&mut self, rule: &str, depth: usize) -> Result<Vec<Seq>, GrammarError> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("groups nested deeper than {MAX_DEPTH}")));
        }
        let mut alts = vec![self.parse_seq(rule, depth)?];
        loop {
            self.skip_ws(true);
            if self.peek() == Some('|') {
                self.i += 1;
                alts.push(self.parse_seq(rule, depth)?);
            } else {
                return Ok(alts);
            }
        }
    }

    fn parse_seq(&mut self, rule: &str, depth: usize) -> Result<Seq, GrammarError> {
        let mut seq = Seq::new();
        loop {
            self.skip_ws(true);
            match self.peek() {
                None | Some('|') | Some(')') => return Ok(seq),
                Some(c) if is_name_char(c) && depth == 0 && self.at_rule_start() => {
                    return Ok(seq);
                }
                _ => {}
            }
            let atom = self.parse_atom(rule, depth)?;
            self.skip_ws(false);
            let rep = match self.peek() {
                Some('*') => Some((0, None)),
                Some('+') => Some((1, None)),
                Some('?') => Some((0, Some(1))),
                Some('{') => None,
                _ => {
                    seq.extend(atom);
                    continue;
                }
            };
            let (min, max) = match rep {
                Some(r) => {
                    self.i += 1;
                    r
                }
                None => self.parse_braces()?,
            };
            let item = if atom.len() == 1 {
                atom[0]
            } else {
                Elem::Ref(self.new_rule(rule, vec![atom])?)
            };
            self.repeat(rule, item, min, max, &mut seq)?;
        }
    }

    fn parse_number(&mut self) -> Result<u32, GrammarError> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let s: String = self.src[start..self.i].iter().collect();
        let n: u64 = s
            .parse()
            .map_err(|_| self.err("expected a number in '{m,n}'"))?;
        if n > u64::from(MAX_REPEAT) {
            return Err(GrammarError::TooLarge(format!(
                "repetition count {n} exceeds {MAX_REPEAT}"
            )));
        }
        Ok(n as u32)
    }

    /// `{m}`, `{m,}`, `{m,n}` (the `{` is at `self.i`).
    fn parse_braces(&mut self) -> Result<(u32, Option<u32>), GrammarError> {
        self.i += 1;
        self.skip_ws(false);
        let min = self.parse_number()?;
        self.skip_ws(false);
        let max = match self.peek() {
            Some('}') => Some(min),
            Some(',') => {
                self.i += 1;
                self.skip_ws(false);
                if self.peek() == Some('}') {
                    None
                } else {
                    let max = self.parse_number()?;
                    if max < min {
                        return Err(self.err(format!("repetition {{{min},{max}}}: max < min")));
                    }
                    self.skip_ws(false);
                    Some(max)
                }
            }
            _ => return Err(self.err("expected ',' or '}' in repetition")),
        };
        if self.peek() != Some('}') {
            return Err(self.err("expected '}' to close the repetition"));
        }
        self.i += 1;
        Ok((min, max))
    }

    fn repeat(
        &mut self,
        rule: &str,
        item: Elem,
        min: u32,
        max: Option<u32>,
        seq: &mut Seq,
    ) -> Result<(), GrammarError> {
        self.count(min as usize)?;
        seq.extend(std::iter::repeat_n(item, min as usize));
        match max {
            None => {
                // r ::= item r | ε
                let id = self.names.len() as u32;
                self.new_rule(rule, vec![vec![item, Elem::Ref(id)], vec![]])?;
                seq.push(Elem::Ref(id));
            }
            Some(max) if max > min => {
                // r_1 ::= item r_2 | ε ; ... ; r_k ::= item | ε   (built from the innermost)
                let mut next: Option<u32> = None;
                for _ in 0..(max - min) {
                    let mut alt = vec![item];
                    if let Some(n) = next {
                        alt.push(Elem::Ref(n));
                    }
                    next = Some(self.new_rule(rule, vec![alt, vec![]])?);
                }
                if let Some(n) = next {
                    seq.push(Elem::Ref(n));
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    fn class_of(&mut self, ranges: Vec<(u32, u32)>, negated: bool) -> Elem {
        let c = Class::new(ranges, negated);
        let id = match self.classes.iter().position(|k| *k == c) {
            Some(i) => i,
            None => {
                self.classes.push(c);
                self.classes.len() - 1
            }
        };
        Elem::Char(id as u32)
    }

    fn parse_atom(&mut self, rule: &str, depth: usize) -> Result<Seq, GrammarError> {
        match self.peek() {
            Some('"') => {
                self.i += 1;
                let mut seq = Seq::new();
                loop {
                    match self.peek() {
                        None | Some('\n') => return Err(self.err("unterminated string literal")),
                        Some('"') => {
                            self.i += 1;
                            return Ok(seq);
                        }
                        Some(_) => {
                            let c = self.parse_char()?;
                            let e = self.class_of(vec![(c, c)], false);
                            seq.push(e);
                        }
                    }
                }
            }
            Some('[') => {
                self.i += 1;
                let negated = self.peek() == Some('^');
                if negated {
                    self.i += 1;
                }
                let mut ranges = Vec::new();
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated character class")),
                        Some(']') => {
                            self.i += 1;
                            break;
                        }
                        Some(_) => {
                            let lo = self.parse_char()?;
                            let hi = if self.peek() == Some('-')
                                && self.src.get(self.i + 1).is_some_and(|&c| c != ']')
                            {
                                self.i += 1;
                                let hi = self.parse_char()?;
                                if hi < lo {
                                    return Err(self.err(format!(
                                        "character range {lo:#x}-{hi:#x} is reversed"
                                    )));
                                }
                                hi
                            } else {
                                lo
                            };
                            ranges.push((lo, hi));
                        }
                    }
                }
                if ranges.is_empty() && !negated {
                    return Err(self.err("empty character class '[]' matches nothing"));
                }
                Ok(vec![self.class_of(ranges, negated)])
            }
            Some('.') => {
                self.i += 1;
                Ok(vec![self.class_of(Vec::new(), true)])
            }
            Some('(') => {
                self.i += 1;
                let body = self.parse_alts(rule, depth + 1)?;
                self.skip_ws(true);
                if self.peek() != Some(')') {
                    return Err(self.err("expected ')' to close the group"));
                }
                self.i += 1;
                Ok(vec![Elem::Ref(self.new_rule(rule, body)?)])
            }
            Some(c) if is_name_char(c) => {
                let name = self.parse_name().unwrap_or_default();
                Ok(vec![Elem::Ref(self.rule_id(&name))])
            }
            Some(c) => Err(self.err(format!("unexpected character '{c}'"))),
            None => Err(self.err("unexpected end of grammar")),
        }
    }

    /// One literal character or escape (inside a string or class).
    fn parse_char(&mut self) -> Result<u32, GrammarError> {
        let Some(c) = self.peek() else {
            return Err(self.err("unexpected end of grammar"));
        };
        self.i += 1;
        if c != '\\' {
            return Ok(c as u32);
        }
        let Some(e) = self.peek() else {
            return Err(self.err("unterminated escape"));
        };
        self.i += 1;
        let hex = |p: &mut Self, n: usize| -> Result<u32, GrammarError> {
            let digits: String = p.src.get(p.i..p.i + n).unwrap_or(&[]).iter().collect();
            if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(p.err(format!("expected {n} hex digits after '\\{e}'")));
            }
            p.i += n;
            let v = u32::from_str_radix(&digits, 16).unwrap_or(u32::MAX);
            if char::from_u32(v).is_none() {
                return Err(p.err(format!("\\{e}{digits} is not a Unicode scalar value")));
            }
            Ok(v)
        };
        match e {
            'n' => Ok(10),
            'r' => Ok(13),
            't' => Ok(9),
            '0' => Ok(0),
            '\\' | '"' | '\'' | '[' | ']' | '-' | '^' | '/' | '.' | '(' | ')' => Ok(e as u32),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            _ => Err(self.err(format!("unknown escape '\\{e}'"))),
        }
    }

    fn finish(self) -> Result<Grammar, GrammarError> {
        let root = *self.ids.get("root").ok_or(GrammarError::NoRoot)?;
        let mut bodies = Vec::with_capacity(self.bodies.len());
        for (i, b) in self.bodies.into_iter().enumerate() {
            match b {
                Some(b) => bodies.push(b),
                None => return Err(GrammarError::UndefinedRule(self.names[i].clone())),
            }
        }
        check_left_recursion(&self.names, &bodies)?;
        let mut elems = Vec::with_capacity(self.n_elems);
        let mut alts = Vec::with_capacity(bodies.len());
        for body in bodies {
            let mut starts = Vec::with_capacity(body.len());
            for seq in body {
                starts.push(elems.len() as u32);
                elems.extend(seq);
                elems.push(Elem::End);
            }
            alts.push(starts);
        }
        Ok(Grammar {
            names: self.names,
            alts,
            elems,
            classes: self.classes,
            root,
        })
    }
}

/// Refuses rules that can reach themselves without consuming a character.
fn check_left_recursion(names: &[String], bodies: &[Vec<Seq>]) -> Result<(), GrammarError> {
    let n = bodies.len();
    let mut nullable = vec![false; n];
    loop {
        let mut changed = false;
        for r in 0..n {
            if nullable[r] {
                continue;
            }
            let null = bodies[r].iter().any(|seq| {
                seq.iter().all(|e| match e {
                    Elem::Ref(s) => nullable[*s as usize],
                    _ => false,
                })
            });
            if null {
                nullable[r] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Edges r -> s where s can start r without a character consumed before it.
    let mut edges: Vec<Vec<u32>> = vec![Vec::new(); n];
    for r in 0..n {
        for seq in &bodies[r] {
            for e in seq {
                match e {
                    Elem::Ref(s) => {
                        edges[r].push(*s);
                        if !nullable[*s as usize] {
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
    }
    // Iterative DFS with colours: 0 new, 1 on the path, 2 done.
    let mut colour = vec![0u8; n];
    for start in 0..n {
        if colour[start] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
        colour[start] = 1;
        while let Some(&mut (r, ref mut k)) = stack.last_mut() {
            if let Some(&s) = edges[r].get(*k) {
                *k += 1;
                let s = s as usize;
                match colour[s] {
                    0 => {
                        colour[s] = 1;
                        stack.push((s, 0));
                    }
                    1 => {
                        // Report the user-written rule the cycle passes through, if any.
                        let on_path = stack.iter().map(|&(x, _)| x).skip_while(|&x| x != s);
                        let name = on_path
                            .map(|x| &names[x])
                            .find(|nm| !nm.contains('#'))
                            .unwrap_or(&names[s]);
                        let name = name.split('#').next().unwrap_or(name);
                        return Err(GrammarError::LeftRecursion(name.to_string()));
                    }
                    _ => {}
                }
            } else {
                colour[r] = 2;
                stack.pop();
            }
        }
    }
    Ok(())
}
