//! Turning a model's reply into function calls, as BFCL's decoders do.
//!
//! Prompt mode (BFCL's `default_decode_ast_prompting`): strip any run of
//! backticks, newlines and spaces from both ends; add `[` in front and `]`
//! at the end where missing; then
//! * Python: strip whitespace and `'` from both ends and parse as a Python
//!   expression; a single call, or a list/tuple/set whose elements are all
//!   calls.  Each call: dotted name, **keyword arguments only** (positional
//!   ones are dropped), values resolved by BFCL's rules: constants as they
//!   are (`...` → `"..."`); any unary operator negates its constant operand
//!   (`+3` → -3, `not True` → -1); lists, tuples, dicts recursively; a binary
//!   operation is evaluated (`2**3` → 8, `"a"+"b"` → "ab"); a bare name is
//!   its identifier as a string (`true` → "true"); a call without keywords
//!   is its `ast.unparse` text, a call with keywords a nested
//!   `{name: {args}}`; a subscript is `unparse(value)[unparse(slice)]`;
//!   anything else (attributes, sets, f-strings, comparisons, lambdas…)
//!   fails.  See `pyexpr.rs` for the parser.
//! * Java / JavaScript: the text between the added brackets is parsed as
//!   source code and the **first** call found is kept, every argument value
//!   being a string of source text (see [`decode_java`], [`decode_js`]).
//!   BFCL uses tree-sitter for these; ours are hand-written parsers that
//!   agree on the shapes models write, not on every error-recovery corner.
//!
//! FC mode (BFCL's OpenAI handler): each tool call's `arguments` JSON is
//! parsed (`json.loads`), so JSON's int/float distinction carries through.
//!
//! Either way a reply can fail in two ways, which BFCL's runner reports
//! differently: the decoder raised (`ast_decoder:decoder_failed`) or it
//! returned something that is not a list of `{name: {args}}`
//! (`ast_decoder:decoder_wrong_output_format`).  [`DecodeError`] keeps the
//! two apart; for irrelevance both count as "no call".

use serde_json::{Map, Value};

use super::data::Language;
use super::pyexpr::{self, Expr};
use super::value::{py_strip, PyValue};

/// One decoded function call.  `None` as an argument name stands for an
/// argument without one (Python `**kwargs`, a positional Java/JavaScript
/// argument): BFCL keeps those under a `None` key, which the checker always
/// rejects as an unexpected parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub args: Vec<(Option<String>, PyValue)>,
}

impl Call {
    pub fn arg(&self, name: &str) -> Option<&PyValue> {
        self.args
            .iter()
            .find(|(k, _)| k.as_deref() == Some(name))
            .map(|(_, v)| v)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum DecodeError {
    /// The decoder raised: `ast_decoder:decoder_failed`.
    Failed(String),
    /// The decoder returned something other than `[{name: {args}}, ...]`:
    /// `ast_decoder:decoder_wrong_output_format`.
    WrongFormat(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Failed(m) => write!(f, "decode failed: {}", m),
            DecodeError::WrongFormat(m) => write!(f, "not in function-call format: {}", m),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Decodes a prompt-mode reply.  Irrelevance entries are decoded as
/// Python whatever the language, as BFCL's runner does.
pub fn decode_prompt(text: &str, language: Language) -> Result<Vec<Call>, DecodeError> {
    let mut s = text
        .trim_matches(|c| c == '`' || c == '\n' || c == ' ')
        .to_string();
    if !s.starts_with('[') {
        s.insert(0, '[');
    }
    if !s.ends_with(']') {
        s.push(']');
    }
    match language {
        Language::Python => decode_python(&s).map_err(DecodeError::Failed),
        // Both drop the first and last character, bracket or not.
        Language::Java => decode_java(inner(&s)),
        Language::JavaScript => decode_js(inner(&s)),
    }
}

fn inner(s: &str) -> &str {
    let mut chars = s.chars();
    chars.next();
    chars.next_back();
    chars.as_str()
}

fn decode_python(s: &str) -> Result<Vec<Call>, String> {
    let cleaned = py_strip(s).trim_matches('\'');
    let body = pyexpr::parse_eval(cleaned)?;
    let to_call = |e: &Expr| match e {
        Expr::Call { func, keywords, .. } => {
            pyexpr::resolve_call(func, keywords).map(|(name, args)| Call { name, args })
        }
        _ => Err("element is not a function call".to_string()),
    };
    match &body {
        Expr::Call { .. } => Ok(vec![to_call(&body)?]),
        Expr::List(elts) | Expr::Tuple(elts) | Expr::Set(elts) => {
            elts.iter().map(to_call).collect()
        }
        _ => Err("expression has no elements".into()),
    }
}

/// Decodes FC-mode tool calls `(name, arguments JSON)`.  Invalid JSON fails;
/// arguments that are valid JSON but not an object are "wrong format".
/// (Floats are read exactly like Python's `json.loads` only with
/// serde_json's `float_roundtrip` feature.)
pub fn decode_fc(tool_calls: &[(String, String)]) -> Result<Vec<Call>, DecodeError> {
    tool_calls
        .iter()
        .map(|(name, arguments)| {
            let parsed: Value = serde_json::from_str(arguments)
                .map_err(|e| DecodeError::Failed(format!("{}: {}", name, e)))?;
            match PyValue::from_json(&parsed) {
                PyValue::Dict(pairs) => Ok(Call {
                    name: name.clone(),
                    args: pairs
                        .into_iter()
                        .map(|(k, v)| (k.as_str().map(str::to_string), v))
                        .collect(),
                }),
                other => Err(DecodeError::WrongFormat(format!(
                    "arguments of {} are {}",
                    name,
                    other.repr()
                ))),
            }
        })
        .collect()
}

/// An FC-mode reply without tool calls: BFCL's handler keeps the text and
/// its decoder iterates it, so an empty text is `[]` and any other text a
/// decode failure.
pub fn decode_fc_text(content: &str) -> Result<Vec<Call>, DecodeError> {
    if content.is_empty() {
        Ok(Vec::new())
    } else {
        Err(DecodeError::Failed(
            "reply has text but no tool calls".into(),
        ))
    }
}

/// Reads decoded calls in BFCL's JSON shape `[{name: {arg: value}}, ...]`,
/// applying BFCL's function-call-format check; `null` is a decode failure.
pub fn calls_from_json(decoded: &Value) -> Result<Vec<Call>, DecodeError> {
    let wrong = |what: &str| Err(DecodeError::WrongFormat(what.to_string()));
    let items = match decoded {
        Value::Null => return Err(DecodeError::Failed("no decoded output".into())),
        Value::Array(items) => items,
        _ => return wrong("not a list"),
    };
    let mut calls = Vec::new();
    for item in items {
        let Value::Object(map) = item else {
            return wrong("an item is not a dict");
        };
        if map.len() != 1 {
            return wrong("an item does not have exactly one key");
        }
        let (name, args) = map.iter().next().expect("one entry");
        let Value::Object(args) = args else {
            return wrong("arguments are not a dict");
        };
        calls.push(Call {
            name: name.clone(),
            args: args
                .iter()
                .map(|(k, v)| (Some(k.clone()), PyValue::from_json(v)))
                .collect(),
        });
    }
    Ok(calls)
}

/// The calls in BFCL's JSON shape (a `None` argument name is written
/// `"null"`, as `json.dumps` does).
pub fn calls_to_json(calls: &[Call]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                let mut args = Map::new();
                for (k, v) in &c.args {
                    args.insert(k.clone().unwrap_or_else(|| "null".into()), v.to_json());
                }
                let mut call = Map::new();
                call.insert(c.name.clone(), Value::Object(args));
                Value::Object(call)
            })
            .collect(),
    )
}

// ---------------------------------------------------------------- shared lexer

#[derive(Clone, Debug, PartialEq)]
enum TokKind {
    Ident,
    Number,
    /// `"..."` (and Java text blocks), with quotes.
    Str,
    /// Java `'c'`; JavaScript `'...'` strings are [`TokKind::Str`].
    Char,
    /// JavaScript template literal.
    Template,
    Op,
}

#[derive(Clone, Debug)]
struct Token {
    kind: TokKind,
    text: String,
    /// Char offsets into the source.
    start: usize,
    end: usize,
    /// A line break precedes this token (JavaScript statement ends).
    newline_before: bool,
}

const C_LIKE_OPS: [&str; 52] = [
    ">>>=", "...", "===", "!==", "<<=", ">>=", ">>>", "**=", "&&=", "||=", "??=", "->", "::", "++",
    "--", "&&", "||", "??", "?.", "==", "!=", "<=", ">=", "+=", "-=", "*=", "/=", "%=", "&=", "|=",
    "^=", "<<", ">>", "**", "=>", "+", "-", "*", "/", "%", "=", "<", ">", "!", "~", "?", ":", ";",
    ",", ".", "&", "|",
];
const SINGLE_OPS: &str = "^()[]{}@";

/// Tokenizes Java or JavaScript source (comments skipped).
fn lex_c_like(src: &[char], javascript: bool) -> Result<Vec<Token>, String> {
    let mut toks = Vec::new();
    let mut i = 0;
    let mut newline = false;
    while i < src.len() {
        let c = src[i];
        let start = i;
        if c == '\n' || c == '\r' {
            newline = true;
            i += 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if c == '/' && src.get(i + 1) == Some(&'/') {
            while i < src.len() && src[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && src.get(i + 1) == Some(&'*') {
            i += 2;
            while i + 1 < src.len() && !(src[i] == '*' && src[i + 1] == '/') {
                i += 1;
            }
            if i + 1 >= src.len() {
                return Err("unterminated comment".into());
            }
            i += 2;
            continue;
        }
        let kind = if c.is_alphabetic() || c == '_' || c == '$' {
            while i < src.len() && (src[i].is_alphanumeric() || src[i] == '_' || src[i] == '$') {
                i += 1;
            }
            TokKind::Ident
        } else if c.is_ascii_digit()
            || (c == '.' && src.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            while i < src.len() {
                let d = src[i];
                let exp_sign = (d == '+' || d == '-')
                    && matches!(src[i - 1], 'e' | 'E')
                    && !src[start..i].iter().any(|x| matches!(x, 'x' | 'X'));
                if d.is_ascii_alphanumeric() || d == '_' || d == '.' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            let text: String = src[start..i].iter().collect();
            // A leading 0 makes a Java integer octal: 8 and 9 are errors.
            if !javascript
                && text.len() > 1
                && text.starts_with('0')
                && text
                    .chars()
                    .all(|d| d.is_ascii_digit() || d == '_' || d == 'l' || d == 'L')
                && text.contains(['8', '9'])
            {
                return Err(format!("invalid octal literal {}", text));
            }
            TokKind::Number
        } else if c == '"'
            && !javascript
            && src.get(i + 1) == Some(&'"')
            && src.get(i + 2) == Some(&'"')
        {
            i += 3;
            while i + 2 < src.len() && !(src[i] == '"' && src[i + 1] == '"' && src[i + 2] == '"') {
                i += if src[i] == '\\' { 2 } else { 1 };
            }
            if i + 2 >= src.len() {
                return Err("unterminated text block".into());
            }
            i += 3;
            TokKind::Str
        } else if c == '"' || c == '\'' || (c == '`' && javascript) {
            i += 1;
            let mut depth = 0usize;
            loop {
                let d = *src.get(i).ok_or("unterminated string literal")?;
                if d == '\\' {
                    i += 2;
                    continue;
                }
                if c == '`' {
                    // Template substitutions may nest braces and strings;
                    // only brace depth is tracked.
                    if d == '$' && src.get(i + 1) == Some(&'{') {
                        depth += 1;
                        i += 2;
                        continue;
                    }
                    if d == '}' && depth > 0 {
                        depth -= 1;
                    }
                } else if d == '\n' {
                    return Err("unterminated string literal".into());
                }
                i += 1;
                if d == c && depth == 0 {
                    break;
                }
            }
            match (c, javascript) {
                ('`', _) => TokKind::Template,
                ('\'', false) => TokKind::Char,
                _ => TokKind::Str,
            }
        } else {
            let rest: String = src[i..src.len().min(i + 4)].iter().collect();
            let op = C_LIKE_OPS
                .iter()
                .find(|op| rest.starts_with(**op))
                .map(|op| op.len());
            match op {
                Some(n) => i += n,
                None if SINGLE_OPS.contains(c) => i += 1,
                None => return Err(format!("unexpected character {:?}", c)),
            }
            TokKind::Op
        };
        toks.push(Token {
            kind,
            text: src[start..i].iter().collect(),
            start,
            end: i,
            newline_before: newline,
        });
        newline = false;
    }
    // Brackets must balance, as any parse does.
    let mut stack = Vec::new();
    for t in &toks {
        if t.kind != TokKind::Op {
            continue;
        }
        match t.text.as_str() {
            "(" | "[" | "{" => stack.push(t.text.clone()),
            ")" | "]" | "}" => {
                let open = stack.pop().ok_or("unbalanced brackets")?;
                let ok = matches!(
                    (open.as_str(), t.text.as_str()),
                    ("(", ")") | ("[", "]") | ("{", "}")
                );
                if !ok {
                    return Err("mismatched brackets".into());
                }
            }
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err("unbalanced brackets".into());
    }
    Ok(toks)
}

/// Index of the bracket closing the one at `open`.
fn matching_close(toks: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate().skip(open) {
        if t.kind == TokKind::Op {
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
        }
    }
    unreachable!("brackets were checked to balance")
}

fn text_of(src: &[char], start: usize, end: usize) -> String {
    src[start..end].iter().collect()
}

/// Strips the first and last char (Python `s[1:-1]`).
fn strip_ends(s: &str) -> String {
    let n = s.chars().count();
    s.chars().skip(1).take(n.saturating_sub(2)).collect()
}

fn insert_unique(
    args: &mut Vec<(Option<String>, PyValue)>,
    key: Option<String>,
    value: String,
) -> Result<(), DecodeError> {
    if args.iter().any(|(k, _)| *k == key) {
        return Err(DecodeError::Failed(
            "Multiple arguments with the same name are not supported.".into(),
        ));
    }
    args.push((key, PyValue::Str(value)));
    Ok(())
}

// ---------------------------------------------------------------- Java

/// A node of the Java syntax tree, with just the distinctions BFCL's
/// rendering of argument values makes.
#[derive(Debug)]
struct JNode {
    start: usize,
    end: usize,
    kind: JKind,
}

#[derive(Debug)]
enum JKind {
    /// Rendered as its source text (identifiers, literals, operators…).
    Leaf,
    Ident,
    ClassLiteral,
    StringLiteral,
    CharLiteral,
    /// Any other construct: its parts' renderings concatenated.
    Seq(Vec<JNode>),
    MethodCall {
        object: Option<(usize, usize)>,
        name: String,
        args: Vec<JNode>,
    },
    NewObject {
        type_: Box<JNode>,
        args: Vec<JNode>,
    },
    NewArray {
        type_: Box<JNode>,
        init: Option<Box<JNode>>,
    },
    Assign {
        left: Box<JNode>,
        op: Box<JNode>,
        right: Box<JNode>,
    },
}

const JAVA_PRIMITIVES: [&str; 9] = [
    "int", "long", "short", "byte", "char", "float", "double", "boolean", "void",
];

struct JavaParser<'a> {
    src: &'a [char],
    toks: Vec<Token>,
    pos: usize,
}

type JResult = Result<JNode, String>;

impl<'a> JavaParser<'a> {
    fn peek(&self) -> Option<&Token> {
        self.toks.get(self.pos)
    }

    fn peek_text(&self, n: usize) -> &str {
        self.toks.get(self.pos + n).map_or("", |t| t.text.as_str())
    }

    fn is(&self, text: &str) -> bool {
        self.peek()
            .is_some_and(|t| t.text == text && matches!(t.kind, TokKind::Op | TokKind::Ident))
    }

    fn leaf(&mut self) -> JNode {
        let t = &self.toks[self.pos];
        self.pos += 1;
        JNode {
            start: t.start,
            end: t.end,
            kind: JKind::Leaf,
        }
    }

    fn expect(&mut self, text: &str) -> JResult {
        if self.is(text) {
            Ok(self.leaf())
        } else {
            Err(format!("expected '{}'", text))
        }
    }

    fn seq(parts: Vec<JNode>) -> JNode {
        let start = parts.first().map_or(0, |p| p.start);
        let end = parts.last().map_or(0, |p| p.end);
        JNode {
            start,
            end,
            kind: JKind::Seq(parts),
        }
    }

    fn expression(&mut self) -> JResult {
        if self.at_lambda() {
            return self.lambda();
        }
        let left = self.ternary()?;
        const ASSIGN: [&str; 12] = [
            "=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=", ">>>=",
        ];
        if self
            .peek()
            .is_some_and(|t| t.kind == TokKind::Op && ASSIGN.contains(&t.text.as_str()))
        {
            let op = self.leaf();
            let right = self.expression()?;
            let (start, end) = (left.start, right.end);
            return Ok(JNode {
                start,
                end,
                kind: JKind::Assign {
                    left: Box::new(left),
                    op: Box::new(op),
                    right: Box::new(right),
                },
            });
        }
        Ok(left)
    }

    fn at_lambda(&self) -> bool {
        let Some(t) = self.peek() else { return false };
        if t.kind == TokKind::Ident && self.peek_text(1) == "->" {
            return true;
        }
        if t.text == "(" && t.kind == TokKind::Op {
            let close = matching_close(&self.toks, self.pos);
            return self.toks.get(close + 1).is_some_and(|n| n.text == "->");
        }
        false
    }

    fn lambda(&mut self) -> JResult {
        let mut parts = Vec::new();
        if self.is("(") {
            let close = matching_close(&self.toks, self.pos);
            while self.pos <= close {
                parts.push(self.leaf());
            }
        } else {
            parts.push(self.leaf());
        }
        parts.push(self.expect("->")?);
        if self.is("{") {
            parts.push(self.balanced_block());
        } else {
            parts.push(self.expression()?);
        }
        Ok(Self::seq(parts))
    }

    /// A `{...}` block kept as its tokens (lambda bodies).
    fn balanced_block(&mut self) -> JNode {
        let close = matching_close(&self.toks, self.pos);
        let mut parts = Vec::new();
        while self.pos <= close {
            parts.push(self.leaf());
        }
        Self::seq(parts)
    }

    fn ternary(&mut self) -> JResult {
        let cond = self.binary()?;
        if !self.is("?") {
            return Ok(cond);
        }
        let q = self.leaf();
        let a = self.expression()?;
        let colon = self.expect(":")?;
        let b = if self.at_lambda() {
            self.lambda()?
        } else {
            self.ternary()?
        };
        Ok(Self::seq(vec![cond, q, a, colon, b]))
    }

    fn binary(&mut self) -> JResult {
        const OPS: [&str; 19] = [
            "||", "&&", "|", "^", "&", "==", "!=", "<", ">", "<=", ">=", "<<", ">>", ">>>", "+",
            "-", "*", "/", "%",
        ];
        let mut parts = vec![self.unary()?];
        while let Some(t) = self.peek() {
            if t.kind == TokKind::Op && OPS.contains(&t.text.as_str()) {
                parts.push(self.leaf());
                parts.push(self.unary()?);
            } else if t.kind == TokKind::Ident && t.text == "instanceof" {
                parts.push(self.leaf());
                parts.push(self.type_()?);
            } else {
                break;
            }
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Self::seq(parts)
        })
    }

    fn unary(&mut self) -> JResult {
        if let Some(t) = self.peek() {
            if t.kind == TokKind::Op
                && matches!(t.text.as_str(), "+" | "-" | "!" | "~" | "++" | "--")
            {
                let op = self.leaf();
                let operand = self.unary()?;
                return Ok(Self::seq(vec![op, operand]));
            }
            if t.kind == TokKind::Op && t.text == "(" && self.at_cast() {
                let close = matching_close(&self.toks, self.pos);
                let mut parts = Vec::new();
                while self.pos <= close {
                    parts.push(self.leaf());
                }
                parts.push(self.unary()?);
                return Ok(Self::seq(parts));
            }
        }
        self.postfix()
    }

    /// `(Type) operand`: a parenthesised type name followed by something
    /// that can only start an operand.
    fn at_cast(&self) -> bool {
        let close = matching_close(&self.toks, self.pos);
        let inside = &self.toks[self.pos + 1..close];
        let Some(first) = inside.first() else {
            return false;
        };
        let type_like = first.kind == TokKind::Ident
            && inside.iter().all(|t| {
                t.kind == TokKind::Ident
                    || matches!(
                        t.text.as_str(),
                        "." | "<" | ">" | "," | "[" | "]" | "?" | "&"
                    )
            });
        if !type_like {
            return false;
        }
        if inside.len() == 1 && JAVA_PRIMITIVES.contains(&first.text.as_str()) {
            return true;
        }
        self.toks.get(close + 1).is_some_and(|n| {
            matches!(
                n.kind,
                TokKind::Ident | TokKind::Number | TokKind::Str | TokKind::Char
            ) || matches!(n.text.as_str(), "(" | "!" | "~")
        })
    }

    fn postfix(&mut self) -> JResult {
        let start_tok = self.pos;
        let mut node = self.primary()?;
        loop {
            if self.is(".") {
                let dot = self.leaf();
                let Some(t) = self.peek() else {
                    return Err("expected a member name".into());
                };
                if t.kind != TokKind::Ident {
                    return Err("expected a member name".into());
                }
                if t.text == "class" {
                    let class_kw = self.leaf();
                    node = JNode {
                        start: node.start,
                        end: class_kw.end,
                        kind: JKind::ClassLiteral,
                    };
                    continue;
                }
                let name = t.text.clone();
                let member = self.leaf();
                if self.is("(") {
                    let args = self.arguments()?;
                    let object = Some((node.start, node.end));
                    let end = self.toks[self.pos - 1].end;
                    node = JNode {
                        start: self.toks[start_tok].start,
                        end,
                        kind: JKind::MethodCall { object, name, args },
                    };
                } else {
                    node = Self::seq(vec![node, dot, member]);
                }
            } else if self.is("[") {
                let open = self.leaf();
                let index = self.expression()?;
                let close = self.expect("]")?;
                node = Self::seq(vec![node, open, index, close]);
            } else if self.is("++") || self.is("--") {
                let op = self.leaf();
                node = Self::seq(vec![node, op]);
            } else if self.is("::") {
                let op = self.leaf();
                let Some(t) = self.peek() else {
                    return Err("expected a method reference".into());
                };
                if t.kind != TokKind::Ident {
                    return Err("expected a method reference".into());
                }
                let name = self.leaf();
                node = Self::seq(vec![node, op, name]);
            } else {
                return Ok(node);
            }
        }
    }

    fn arguments(&mut self) -> Result<Vec<JNode>, String> {
        self.expect("(")?;
        let mut args = Vec::new();
        if self.is(")") {
            self.pos += 1;
            return Ok(args);
        }
        loop {
            args.push(self.expression()?);
            if self.is(",") {
                self.pos += 1;
                continue;
            }
            self.expect(")")?;
            return Ok(args);
        }
    }

    fn primary(&mut self) -> JResult {
        let t = self.peek().ok_or("unexpected end of input")?.clone();
        match t.kind {
            TokKind::Number => Ok(self.leaf()),
            TokKind::Str => {
                self.pos += 1;
                Ok(JNode {
                    start: t.start,
                    end: t.end,
                    kind: JKind::StringLiteral,
                })
            }
            TokKind::Char => {
                self.pos += 1;
                Ok(JNode {
                    start: t.start,
                    end: t.end,
                    kind: JKind::CharLiteral,
                })
            }
            TokKind::Template => Err("template literals are not Java".into()),
            TokKind::Op if t.text == "(" => {
                let open = self.leaf();
                let inner = self.expression()?;
                let close = self.expect(")")?;
                Ok(Self::seq(vec![open, inner, close]))
            }
            TokKind::Op => Err(format!("unexpected '{}'", t.text)),
            TokKind::Ident => match t.text.as_str() {
                "new" => self.creation(),
                "true" | "false" | "null" | "this" | "super" => Ok(self.leaf()),
                p if JAVA_PRIMITIVES.contains(&p) => {
                    // `int.class`, `int[].class`
                    let ty = self.type_()?;
                    self.expect(".")?;
                    let class_kw = self.expect("class")?;
                    Ok(JNode {
                        start: ty.start,
                        end: class_kw.end,
                        kind: JKind::ClassLiteral,
                    })
                }
                _ => {
                    if self.peek_text(1) == "(" {
                        let name = t.text.clone();
                        self.pos += 1;
                        let args = self.arguments()?;
                        let end = self.toks[self.pos - 1].end;
                        return Ok(JNode {
                            start: t.start,
                            end,
                            kind: JKind::MethodCall {
                                object: None,
                                name,
                                args,
                            },
                        });
                    }
                    self.pos += 1;
                    Ok(JNode {
                        start: t.start,
                        end: t.end,
                        kind: JKind::Ident,
                    })
                }
            },
        }
    }

    /// A type: `a.b.C<T, ? extends U>[]` (kept as its tokens).
    fn type_(&mut self) -> JResult {
        let mut parts = Vec::new();
        let first = self.peek().ok_or("expected a type")?;
        if first.kind != TokKind::Ident {
            return Err("expected a type".into());
        }
        parts.push(self.leaf());
        loop {
            if self.is(".")
                && self
                    .toks
                    .get(self.pos + 1)
                    .is_some_and(|t| t.kind == TokKind::Ident && t.text != "class")
            {
                parts.push(self.leaf());
                parts.push(self.leaf());
            } else if self.is("<") {
                // Generic arguments, with `>>` closing two levels.
                let mut depth = 0i32;
                loop {
                    let t = self.peek().ok_or("unclosed type arguments")?;
                    match t.text.as_str() {
                        "<" => depth += 1,
                        ">" => depth -= 1,
                        ">>" => depth -= 2,
                        ">>>" => depth -= 3,
                        "?" | "," | "." | "&" | "[" | "]" | "extends" | "super" => {}
                        _ if t.kind == TokKind::Ident => {}
                        other => return Err(format!("unexpected '{}' in type arguments", other)),
                    }
                    parts.push(self.leaf());
                    if depth <= 0 {
                        break;
                    }
                }
            } else if self.is("[") && self.peek_text(1) == "]" && self.peek_text(2) != "{" {
                parts.push(self.leaf());
                parts.push(self.leaf());
            } else {
                return Ok(Self::seq(parts));
            }
        }
    }

    /// `new T(args) [class body]` or `new T[]{...}` / `new T[n]`.
    fn creation(&mut self) -> JResult {
        let new_kw = self.leaf();
        let type_ = Box::new(self.type_()?);
        if self.is("[") {
            let mut sized = false;
            while self.is("[") {
                self.pos += 1;
                if !self.is("]") {
                    sized = true;
                    self.expression()?;
                }
                self.expect("]")?;
            }
            let init = if !sized && self.is("{") {
                Some(Box::new(self.array_initializer()?))
            } else {
                None
            };
            let end = self.toks[self.pos - 1].end;
            return Ok(JNode {
                start: new_kw.start,
                end,
                kind: JKind::NewArray { type_, init },
            });
        }
        let args = self.arguments()?;
        if self.is("{") {
            // An anonymous class body: BFCL's rendering drops it.
            let close = matching_close(&self.toks, self.pos);
            self.pos = close + 1;
        }
        let end = self.toks[self.pos - 1].end;
        Ok(JNode {
            start: new_kw.start,
            end,
            kind: JKind::NewObject { type_, args },
        })
    }

    fn array_initializer(&mut self) -> JResult {
        let mut parts = vec![self.expect("{")?];
        while !self.is("}") {
            parts.push(if self.is("{") {
                self.array_initializer()?
            } else {
                self.expression()?
            });
            if self.is(",") {
                parts.push(self.leaf());
            } else {
                break;
            }
        }
        parts.push(self.expect("}")?);
        Ok(Self::seq(parts))
    }

    fn text(&self, node: &JNode) -> String {
        text_of(self.src, node.start, node.end)
    }

    /// BFCL's rendering of an argument value (`nested` = inside another node).
    fn render(&self, node: &JNode, nested: bool) -> Result<String, String> {
        Ok(match &node.kind {
            JKind::StringLiteral | JKind::CharLiteral if !nested => strip_ends(&self.text(node)),
            JKind::Leaf
            | JKind::Ident
            | JKind::ClassLiteral
            | JKind::StringLiteral
            | JKind::CharLiteral
            | JKind::MethodCall { .. } => self.text(node),
            JKind::Seq(parts) => parts
                .iter()
                .map(|p| self.render(p, true))
                .collect::<Result<String, _>>()?,
            JKind::Assign { left, op, right } => {
                format!(
                    "{}{}{}",
                    self.render(left, true)?,
                    self.render(op, true)?,
                    self.render(right, true)?
                )
            }
            JKind::NewObject { type_, args } => format!(
                "new {}({})",
                self.render(type_, true)?,
                args.iter()
                    .map(|a| self.render(a, true))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(", ")
            ),
            JKind::NewArray { type_, init } => {
                let init = init.as_ref().ok_or("array creation without initializer")?;
                format!(
                    "new {}[]{}",
                    self.render(type_, true)?,
                    self.render(init, true)?
                )
            }
        })
    }
}

/// The first method call in document order, outermost first.
fn first_java_call(node: &JNode) -> Option<&JNode> {
    match &node.kind {
        JKind::MethodCall { .. } => Some(node),
        JKind::Seq(parts) => parts.iter().find_map(first_java_call),
        JKind::NewObject { type_, args } => {
            first_java_call(type_).or_else(|| args.iter().find_map(first_java_call))
        }
        JKind::NewArray { type_, init } => {
            first_java_call(type_).or_else(|| init.as_deref().and_then(first_java_call))
        }
        JKind::Assign { left, right, .. } => {
            first_java_call(left).or_else(|| first_java_call(right))
        }
        _ => None,
    }
}

/// BFCL's Java decoder: a sequence of expression statements; the first
/// method call found is returned as `Class.method` (the receiver's source
/// text + name) with `name=value` arguments (value = source text, string
/// and char literals unquoted; `new` expressions rendered as
/// `new T(args)` without any anonymous class body, `new T[]{...}`; other
/// composite values with whitespace between tokens removed; nested method
/// calls verbatim).  A bare identifier argument goes under a `None` name;
/// other positional arguments are dropped; a repeated name fails.  No call
/// at all is "wrong format".
///
/// Differences from tree-sitter-java 0.21: its error recovery accepts or
/// rejects some inputs by cost — very short single-argument calls without
/// a trailing `;` (`f(x=1)`, `A.b(x=1)`) are rejected there and accepted
/// here, and statements without a `;` between them are accepted here but
/// rejected there in some short layouts; statements other than expressions
/// (declarations) are not
/// parsed here, and calls inside anonymous class bodies are not searched.
pub fn decode_java(source: &str) -> Result<Vec<Call>, DecodeError> {
    let src: Vec<char> = source.chars().collect();
    let toks = lex_c_like(&src, false).map_err(DecodeError::Failed)?;
    let mut parser = JavaParser {
        src: &src,
        toks,
        pos: 0,
    };
    let mut statements = Vec::new();
    while parser.pos < parser.toks.len() {
        if parser.is(";") {
            parser.pos += 1;
            continue;
        }
        // tree-sitter recovers a missing `;` between statements.
        statements.push(parser.expression().map_err(DecodeError::Failed)?);
    }
    let Some(call) = statements.iter().find_map(first_java_call) else {
        return Err(DecodeError::WrongFormat(
            "no method invocation found".into(),
        ));
    };
    let JKind::MethodCall { object, name, args } = &call.kind else {
        unreachable!("first_java_call finds calls")
    };
    let function_name = match object {
        Some((s, e)) => format!("{}.{}", text_of(&src, *s, *e), name),
        None => name.clone(),
    };
    let mut decoded = Vec::new();
    for arg in args {
        match &arg.kind {
            JKind::Assign { left, right, .. } => {
                let value = parser.render(right, false).map_err(DecodeError::Failed)?;
                insert_unique(&mut decoded, Some(parser.text(left)), value)?;
            }
            JKind::Ident | JKind::ClassLiteral => {
                insert_unique(&mut decoded, None, parser.text(arg))?
            }
            _ => {}
        }
    }
    Ok(vec![Call {
        name: function_name,
        args: decoded,
    }])
}

// ---------------------------------------------------------------- JavaScript

const JS_STATEMENT_KEYWORDS: [&str; 22] = [
    "await", "typeof", "void", "delete", "new", "function", "class", "let", "const", "var",
    "return", "if", "for", "while", "do", "switch", "throw", "try", "yield", "import", "export",
    "async",
];

/// Keywords that may sit between two operands (`a instanceof B`, `new X`…).
const JS_OPERATOR_WORDS: [&str; 12] = [
    "in",
    "of",
    "instanceof",
    "new",
    "typeof",
    "void",
    "delete",
    "await",
    "yield",
    "async",
    "return",
    "function",
];

/// BFCL's JavaScript decoder: among the top-level statements (separated by
/// `;` or a line break), the first that is a call expression gives the
/// result: name = the callee's source text, `name=value` arguments with the
/// value's source text (one pair of matching outer quotes stripped); a bare
/// identifier or `true` argument goes under a `None` name; other positional
/// arguments are dropped; a repeated name fails.  No call statement (also
/// `f(a=1), g(b=2)`, which is one sequence expression) is "wrong format".
///
/// Differences from tree-sitter-javascript 0.21: syntax is checked only
/// loosely here (balanced brackets, no two operands in a row), so some
/// malformed values that tree-sitter rejects are accepted; regex literals
/// are not recognised.
pub fn decode_js(source: &str) -> Result<Vec<Call>, DecodeError> {
    let src: Vec<char> = source.chars().collect();
    let toks = lex_c_like(&src, true).map_err(DecodeError::Failed)?;
    check_js_operands(&toks).map_err(DecodeError::Failed)?;
    let mut start = 0;
    while start < toks.len() {
        let end = js_statement_end(&toks, start);
        if let Some(call) = js_call_statement(&src, &toks[start..end])? {
            return Ok(vec![call]);
        }
        start = if end < toks.len() && toks[end].text == ";" {
            end + 1
        } else {
            end.max(start + 1)
        };
    }
    Err(DecodeError::WrongFormat(
        "no call expression statement".into(),
    ))
}

fn is_operand_token(t: &Token) -> bool {
    match t.kind {
        TokKind::Ident => !JS_OPERATOR_WORDS.contains(&t.text.as_str()),
        TokKind::Number | TokKind::Str | TokKind::Template | TokKind::Char => true,
        TokKind::Op => false,
    }
}

/// Two operands in a row on one line (`hello world`) is a syntax error.
fn check_js_operands(toks: &[Token]) -> Result<(), String> {
    for pair in toks.windows(2) {
        let ends_operand = is_operand_token(&pair[0]) || matches!(pair[0].text.as_str(), ")" | "]");
        if ends_operand
            && is_operand_token(&pair[1])
            && !pair[1].newline_before
            && pair[1].kind != TokKind::Template
        {
            return Err(format!(
                "unexpected '{}' after '{}'",
                pair[1].text, pair[0].text
            ));
        }
    }
    Ok(())
}

/// End (exclusive) of the statement starting at `start`: a top-level `;`,
/// or a line break before a token that starts a new statement.
fn js_statement_end(toks: &[Token], start: usize) -> usize {
    let mut depth = 0i32;
    for i in start..toks.len() {
        let t = &toks[i];
        if i > start && depth == 0 && t.newline_before {
            let prev = &toks[i - 1];
            let prev_ends = is_operand_token(prev) || matches!(prev.text.as_str(), ")" | "]" | "}");
            if prev_ends && (is_operand_token(t) || t.kind == TokKind::Ident) {
                return i;
            }
        }
        if t.kind == TokKind::Op {
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth -= 1,
                ";" if depth == 0 => return i,
                _ => {}
            }
        }
    }
    toks.len()
}

/// The call of a statement that is a call expression, if it is one.
fn js_call_statement(src: &[char], stmt: &[Token]) -> Result<Option<Call>, DecodeError> {
    let Some(last) = stmt.last() else {
        return Ok(None);
    };
    if last.text != ")" || last.kind != TokKind::Op {
        return Ok(None);
    }
    // The `(` opening the final argument list.
    let mut depth = 0;
    let mut open = None;
    for i in (0..stmt.len()).rev() {
        match stmt[i].text.as_str() {
            ")" | "]" | "}" if stmt[i].kind == TokKind::Op => depth += 1,
            "(" | "[" | "{" if stmt[i].kind == TokKind::Op => {
                depth -= 1;
                if depth == 0 {
                    open = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let Some(open) = open.filter(|o| *o > 0) else {
        return Ok(None);
    };
    let callee = &stmt[..open];
    if JS_STATEMENT_KEYWORDS.contains(&callee[0].text.as_str()) && callee[0].kind == TokKind::Ident
    {
        // `new F(...)` is a new_expression; `new F().g(...)` is a call.
        let chained = callee[0].text == "new"
            && callee
                .iter()
                .any(|t| t.text == ")" && t.kind == TokKind::Op);
        if !chained {
            return Ok(None);
        }
    }
    // The callee must be a member/call chain, not an operator expression.
    let mut depth = 0;
    for t in callee {
        if t.kind == TokKind::Op {
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth -= 1,
                "." | "?." if depth == 0 => {}
                _ if depth == 0 => return Ok(None),
                _ => {}
            }
        }
    }
    let name = text_of(src, callee[0].start, callee[callee.len() - 1].end);
    let mut args = Vec::new();
    for arg in split_top_level(&stmt[open + 1..stmt.len() - 1]) {
        if arg.is_empty() {
            continue;
        }
        let eq = arg
            .iter()
            .position(|t| t.kind == TokKind::Op && t.text == "=");
        let eq = eq.filter(|&i| {
            i > 0 && i + 1 < arg.len() && top_level(arg, i) && is_member_chain(&arg[..i])
        });
        if let Some(i) = eq {
            let left = text_of(src, arg[0].start, arg[i - 1].end);
            let mut value = text_of(src, arg[i + 1].start, arg[arg.len() - 1].end);
            let quoted = |q: char| value.len() >= 2 && value.starts_with(q) && value.ends_with(q);
            if quoted('"') || quoted('\'') || value == "\"" || value == "'" {
                value = strip_ends(&value);
            }
            insert_unique(&mut args, Some(left), value)?;
        } else if arg.len() == 1
            && arg[0].kind == TokKind::Ident
            && (arg[0].text == "true" || !is_js_literal_word(&arg[0].text))
        {
            insert_unique(&mut args, None, arg[0].text.clone())?;
        }
    }
    Ok(Some(Call { name, args }))
}

/// Words tree-sitter gives their own node types (not `identifier`).
fn is_js_literal_word(word: &str) -> bool {
    matches!(
        word,
        "false" | "null" | "this" | "super" | "undefined" | "true"
    )
}

fn top_level(toks: &[Token], index: usize) -> bool {
    let mut depth = 0;
    for t in &toks[..index] {
        if t.kind == TokKind::Op {
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth -= 1,
                _ => {}
            }
        }
    }
    depth == 0
}

/// `a`, `a.b`, `a[0].b`: what may stand left of `=` in an argument.
fn is_member_chain(toks: &[Token]) -> bool {
    toks.first().is_some_and(|t| t.kind == TokKind::Ident)
        && toks
            .iter()
            .all(|t| t.kind != TokKind::Op || matches!(t.text.as_str(), "." | "[" | "]"))
}

fn split_top_level(toks: &[Token]) -> Vec<&[Token]> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, t) in toks.iter().enumerate() {
        if t.kind == TokKind::Op {
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth -= 1,
                "," if depth == 0 => {
                    parts.push(&toks[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    parts.push(&toks[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn py(text: &str) -> Value {
        calls_to_json(&decode_prompt(text, Language::Python).unwrap())
    }

    #[test]
    fn python_rules() {
        assert_eq!(
            py("```\n[math.factorial(number=5)]\n```"),
            json!([{"math.factorial": {"number": 5}}])
        );
        assert_eq!(
            py("f(x=1), g(y=2)"),
            json!([{"f": {"x": 1}}, {"g": {"y": 2}}])
        );
        assert_eq!(
            py("[f(1, x=+3, y=not True, z=true, w=2**3)]"),
            json!([{"f": {"x": -3, "y": -1, "z": "true", "w": 8}}])
        );
        assert_eq!(
            py("[f(a=np.array([1,2]), b=g(k=1), c=d[0], e=...)]"),
            json!([{"f": {"a": "np.array([1, 2])", "b": {"g": {"k": 1}}, "c": "d[0]", "e": "..."}}])
        );
        assert_eq!(py("[f(x=1, x=2)]"), json!([{"f": {"x": 2}}]));
        assert_eq!(py(""), json!([]));
        assert_eq!(py("[]"), json!([]));
        for bad in [
            "```python\n[f(x=1)]\n```",
            "[f(x=1)] some text",
            "'[f(x=1)]'",
            "[f(x=a.b)]",
            "[f(x={1, 2})]",
            "[f(x=-y)]",
            "[f(x=lambda: 1)]",
            "[1]",
        ] {
            assert!(
                matches!(
                    decode_prompt(bad, Language::Python),
                    Err(DecodeError::Failed(_))
                ),
                "{bad}"
            );
        }
        let tuple = decode_prompt("[f(x=(1, 2.5))]", Language::Python).unwrap();
        assert_eq!(
            tuple[0].arg("x"),
            Some(&PyValue::Tuple(vec![PyValue::Int(1), PyValue::Float(2.5)]))
        );
    }

    #[test]
    fn java_rules() {
        let calls = decode_prompt(
            r#"[Intro.step(w=800, h="six", c='c', a=new int[]{1, 2}, m=new HashMap<String, Object>() {{ put("k", 1); }}, l=new ArrayList<>(Arrays.asList("a", "b")), n=-5)]"#,
            Language::Java,
        )
        .unwrap();
        assert_eq!(
            calls_to_json(&calls),
            json!([{"Intro.step": {"w": "800", "h": "six", "c": "c", "a": "new int[]{1,2}",
                "m": "new HashMap<String,Object>()", "l": "new ArrayList<>(Arrays.asList(\"a\", \"b\"))", "n": "-5"}}])
        );
        let first_only = decode_prompt("[A.b(x=1); C.d(y=2)]", Language::Java).unwrap();
        assert_eq!(calls_to_json(&first_only), json!([{"A.b": {"x": "1"}}]));
        assert!(matches!(
            decode_prompt("[A.b(x=1), C.d(y=2)]", Language::Java),
            Err(DecodeError::Failed(_))
        ));
        assert!(matches!(
            decode_prompt("[]", Language::Java),
            Err(DecodeError::WrongFormat(_))
        ));
        assert!(matches!(
            decode_prompt("[A.b(x=new int[3])]", Language::Java),
            Err(DecodeError::Failed(_))
        ));
    }

    #[test]
    fn javascript_rules() {
        let calls = decode_prompt(
            "[a.b(x='s', y=[1, 2], z={k: 'v'}, flag, 3)]",
            Language::JavaScript,
        )
        .unwrap();
        assert_eq!(
            calls_to_json(&calls),
            json!([{"a.b": {"x": "s", "y": "[1, 2]", "z": "{k: 'v'}", "null": "flag"}}])
        );
        assert!(matches!(
            decode_prompt("[f(x=1), g(y=2)]", Language::JavaScript),
            Err(DecodeError::WrongFormat(_))
        ));
        assert!(matches!(
            decode_prompt("[f(x=1, x=2)]", Language::JavaScript),
            Err(DecodeError::Failed(_))
        ));
        // Two unnamed arguments share the `None` name: BFCL raises.
        assert!(matches!(
            decode_prompt("[f(flag, true)]", Language::JavaScript),
            Err(DecodeError::Failed(_))
        ));
        assert!(matches!(
            decode_prompt("hello world", Language::JavaScript),
            Err(DecodeError::Failed(_))
        ));
    }

    #[test]
    fn fc_and_json_shapes() {
        let calls = decode_fc(&[("math_factorial".into(), r#"{"number": 5.0}"#.into())]).unwrap();
        assert_eq!(calls[0].arg("number"), Some(&PyValue::Float(5.0)));
        assert!(matches!(
            decode_fc(&[("f".into(), "{".into())]),
            Err(DecodeError::Failed(_))
        ));
        assert!(matches!(
            decode_fc(&[("f".into(), "[1]".into())]),
            Err(DecodeError::WrongFormat(_))
        ));
        assert_eq!(decode_fc_text(""), Ok(vec![]));
        assert!(matches!(
            calls_from_json(&json!([{"f": 1}])),
            Err(DecodeError::WrongFormat(_))
        ));
        assert!(matches!(
            calls_from_json(&json!(null)),
            Err(DecodeError::Failed(_))
        ));
    }
}
