//! A small Python expression parser, for BFCL's prompt-mode decoder.
//!
//! BFCL decodes a Python-style reply with `ast.parse(text, mode="eval")` and
//! then walks the tree.  This module parses the same expression grammar
//! (Python 3.11: literals with all string/number forms, operators with
//! their precedences, calls, subscripts and slices, comprehensions, lambda,
//! walrus…), so that a reply Python would reject is rejected here too, and
//! provides the three things BFCL's walk needs:
//! * [`resolve_call`]: the walk itself (see `decode.rs` for the rules);
//! * [`unparse`]: Python's `ast.unparse` text, used for calls without
//!   keyword arguments and for subscripts;
//! * [`eval_expr`]: Python's evaluation of a binary operation (BFCL runs
//!   `eval(ast.unparse(node))` on it).
//!
//! Known differences from CPython, all on inputs no BFCL answer needs:
//! integers beyond 128 bits, `\N{...}` escapes, lone surrogates, and
//! non-ASCII identifiers needing NFKC normalisation are decode failures
//! here; `eval` covers literals, arithmetic (int, float, complex, str,
//! list, tuple, bytes), comparisons and `and`/`or`/`if`, but not names,
//! builtins (`len`), `%` formatting, `**` on complex or `is`; `unparse` does
//! not render f-strings.

use super::value::{bytes_repr, float_repr, str_repr, PyValue};

// ---------------------------------------------------------------- tokens

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Int(i128),
    Float(f64),
    Imag(f64),
    Str(StrPiece),
    Op(&'static str),
    /// A line break outside brackets: ends the expression.
    Newline,
    End,
}

#[derive(Clone, Debug, PartialEq)]
enum StrPiece {
    Str {
        value: String,
        u_prefix: bool,
    },
    Bytes(Vec<u8>),
    /// An f-string: an `ast.JoinedStr`, which BFCL never resolves.
    FString,
}

/// Longest first, so that `**=` wins over `**` and `*`.
const OPERATORS: [&str; 47] = [
    "**=", "//=", ">>=", "<<=", "...", "!=", "%=", "&=", "**", "*=", "+=", "-=", "->", "//", "/=",
    ":=", "<<", "<=", "==", ">=", ">>", "@=", "^=", "|=", "%", "&", "(", ")", "*", "+", ",", "-",
    ".", "/", ":", ";", "<", "=", ">", "@", "[", "]", "^", "{", "|", "}", "~",
];

const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

fn is_keyword(name: &str) -> bool {
    KEYWORDS.contains(&name)
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

fn tokenize(src: &str) -> Result<Vec<Tok>, String> {
    if src.contains('\0') {
        return Err("source code string cannot contain null bytes".into());
    }
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut brackets: Vec<char> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\x0c' => i += 1,
            '\\' => {
                // Explicit line joining.
                match (chars.get(i + 1), chars.get(i + 2)) {
                    (Some('\n'), _) => i += 2,
                    (Some('\r'), Some('\n')) => i += 3,
                    (Some('\r'), _) => i += 2,
                    _ => {
                        return Err("unexpected character after line continuation character".into())
                    }
                }
            }
            '#' => {
                while i < chars.len() && chars[i] != '\n' && chars[i] != '\r' {
                    i += 1;
                }
            }
            '\n' | '\r' => {
                if brackets.is_empty() && toks.last() != Some(&Tok::Newline) && !toks.is_empty() {
                    toks.push(Tok::Newline);
                }
                i += 1;
            }
            '\'' | '"' => {
                let (tok, next) = lex_string(&chars, i, "")?;
                toks.push(tok);
                i = next;
            }
            c if is_ident_start(c) => {
                let start = i;
                while i < chars.len() && is_ident_continue(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                let is_prefix = matches!(
                    name.to_ascii_lowercase().as_str(),
                    "r" | "u" | "b" | "f" | "br" | "rb" | "fr" | "rf"
                );
                if is_prefix && matches!(chars.get(i), Some('\'') | Some('"')) {
                    let (tok, next) = lex_string(&chars, i, &name)?;
                    toks.push(tok);
                    i = next;
                } else {
                    toks.push(Tok::Name(name));
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())) =>
            {
                let (tok, next) = lex_number(&chars, i)?;
                toks.push(tok);
                i = next;
            }
            _ => {
                let rest: String = chars[i..chars.len().min(i + 3)].iter().collect();
                let op = OPERATORS
                    .iter()
                    .find(|op| rest.starts_with(**op))
                    .ok_or_else(|| format!("invalid character {:?}", c))?;
                match *op {
                    "(" | "[" | "{" => brackets.push(c),
                    ")" | "]" | "}" => {
                        let open = brackets.pop().ok_or_else(|| format!("unmatched '{}'", c))?;
                        let expected = match open {
                            '(' => ')',
                            '[' => ']',
                            _ => '}',
                        };
                        if expected != c {
                            return Err(format!(
                                "closing parenthesis '{}' does not match '{}'",
                                c, open
                            ));
                        }
                    }
                    _ => {}
                }
                toks.push(Tok::Op(op));
                i += op.len();
            }
        }
    }
    if let Some(open) = brackets.last() {
        return Err(format!("'{}' was never closed", open));
    }
    toks.push(Tok::End);
    Ok(toks)
}

/// Digits (of the given radix) with single underscores between them.
fn digit_run_ok(s: &str, radix: u32) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && s.chars().all(|c| c == '_' || c.is_digit(radix))
}

fn lex_number(chars: &[char], start: usize) -> Result<(Tok, usize), String> {
    let mut i = start;
    let radix = match (chars[i], chars.get(i + 1).map(|c| c.to_ascii_lowercase())) {
        ('0', Some('x')) => 16,
        ('0', Some('o')) => 8,
        ('0', Some('b')) => 2,
        _ => 10,
    };
    let tok = if radix != 10 {
        i += 2;
        let body_start = i;
        while i < chars.len() && (chars[i] == '_' || chars[i].is_ascii_alphanumeric()) {
            i += 1;
        }
        let body: String = chars[body_start..i].iter().collect();
        // An underscore may follow the base prefix: 0x_ff.
        let digits = body.strip_prefix('_').unwrap_or(&body);
        if !digit_run_ok(digits, radix) {
            return Err(format!("invalid literal {:?}", body));
        }
        let clean: String = digits.chars().filter(|c| *c != '_').collect();
        Tok::Int(
            i128::from_str_radix(&clean, radix)
                .map_err(|_| "integer literal too large".to_string())?,
        )
    } else {
        let take_digits = |i: &mut usize| {
            let s = *i;
            while *i < chars.len() && (chars[*i].is_ascii_digit() || chars[*i] == '_') {
                *i += 1;
            }
            chars[s..*i].iter().collect::<String>()
        };
        let int_part = take_digits(&mut i);
        let mut is_float = false;
        let mut frac_part = String::new();
        if chars.get(i) == Some(&'.') {
            is_float = true;
            i += 1;
            frac_part = take_digits(&mut i);
        }
        let mut exp_part = String::new();
        if matches!(chars.get(i), Some('e') | Some('E')) {
            let mut j = i + 1;
            let mut sign = String::new();
            if matches!(chars.get(j), Some('+') | Some('-')) {
                sign.push(chars[j]);
                j += 1;
            }
            if chars.get(j).is_some_and(|c| c.is_ascii_digit()) {
                i = j;
                exp_part = format!("{}{}", sign, take_digits(&mut i));
                is_float = true;
            }
        }
        let imaginary = matches!(chars.get(i), Some('j') | Some('J'));
        if imaginary {
            i += 1;
        }
        if (!int_part.is_empty() && !digit_run_ok(&int_part, 10))
            || (!frac_part.is_empty() && !digit_run_ok(&frac_part, 10))
            || (!exp_part.is_empty() && !digit_run_ok(exp_part.trim_start_matches(['+', '-']), 10))
        {
            return Err("invalid decimal literal".into());
        }
        let clean = |s: &str| s.chars().filter(|c| *c != '_').collect::<String>();
        if is_float || imaginary {
            let text = format!(
                "{}.{}{}",
                if int_part.is_empty() {
                    "0".to_string()
                } else {
                    clean(&int_part)
                },
                if frac_part.is_empty() {
                    "0".to_string()
                } else {
                    clean(&frac_part)
                },
                if exp_part.is_empty() {
                    String::new()
                } else {
                    format!("e{}", clean(&exp_part))
                }
            );
            let value: f64 = text
                .parse()
                .map_err(|_| "invalid float literal".to_string())?;
            if imaginary {
                Tok::Imag(value)
            } else {
                Tok::Float(value)
            }
        } else {
            let digits = clean(&int_part);
            if digits.len() > 1 && digits.starts_with('0') && digits.chars().any(|c| c != '0') {
                return Err("leading zeros in decimal integer literals are not permitted".into());
            }
            Tok::Int(
                digits
                    .parse()
                    .map_err(|_| "integer literal too large".to_string())?,
            )
        }
    };
    if chars.get(i).is_some_and(|c| is_ident_continue(*c)) {
        return Err("invalid decimal literal".into());
    }
    Ok((tok, i))
}

fn lex_string(chars: &[char], quote_at: usize, prefix: &str) -> Result<(Tok, usize), String> {
    let lower = prefix.to_ascii_lowercase();
    let raw = lower.contains('r');
    let bytes = lower.contains('b');
    let fstring = lower.contains('f');
    let q = chars[quote_at];
    let triple = chars.get(quote_at + 1) == Some(&q) && chars.get(quote_at + 2) == Some(&q);
    let mut i = quote_at + if triple { 3 } else { 1 };
    let mut body = String::new();
    loop {
        let c = *chars.get(i).ok_or("unterminated string literal")?;
        if c == '\\' {
            body.push(c);
            if let Some(&next) = chars.get(i + 1) {
                body.push(next);
            }
            i += 2;
            continue;
        }
        if !triple && (c == '\n' || c == '\r') {
            return Err("unterminated string literal".into());
        }
        if c == q && (!triple || (chars.get(i + 1) == Some(&q) && chars.get(i + 2) == Some(&q))) {
            i += if triple { 3 } else { 1 };
            break;
        }
        body.push(c);
        i += 1;
    }
    let piece = if fstring {
        StrPiece::FString
    } else if bytes {
        if !body.is_ascii() {
            return Err("bytes can only contain ASCII literal characters".into());
        }
        let text = if raw { body } else { unescape(&body, true)? };
        StrPiece::Bytes(text.chars().map(|c| c as u8).collect())
    } else {
        StrPiece::Str {
            value: if raw { body } else { unescape(&body, false)? },
            u_prefix: lower == "u",
        }
    };
    Ok((Tok::Str(piece), i))
}

/// Python's escape sequences.  For bytes, `\u`, `\U` and `\N` are not
/// escapes, and every char of the result is below 256.
fn unescape(body: &str, bytes: bool) -> Result<String, String> {
    let chars: Vec<char> = body.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let hex = |from: usize, n: usize| -> Result<u32, String> {
        let digits: String = chars
            .get(from..from + n)
            .ok_or("truncated escape")?
            .iter()
            .collect();
        if digits.len() != n || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err("truncated \\xXX escape".into());
        }
        Ok(u32::from_str_radix(&digits, 16).expect("checked hex digits"))
    };
    while i < chars.len() {
        let c = chars[i];
        if c != '\\' || i + 1 >= chars.len() {
            out.push(c);
            i += 1;
            continue;
        }
        let e = chars[i + 1];
        i += 2;
        match e {
            '\n' => {}
            '\r' => {
                if chars.get(i) == Some(&'\n') {
                    i += 1;
                }
            }
            '\\' | '\'' | '"' => out.push(e),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\x0b'),
            '0'..='7' => {
                let mut value = e.to_digit(8).expect("octal digit");
                let mut n = 1;
                while n < 3 && chars.get(i).is_some_and(|d| d.is_digit(8)) {
                    value = value * 8 + chars[i].to_digit(8).expect("octal digit");
                    i += 1;
                    n += 1;
                }
                if bytes && value > 0xff {
                    return Err("octal escape out of range".into());
                }
                out.push(char::from_u32(value).expect("octal escapes are valid chars"));
            }
            'x' => {
                out.push(char::from_u32(hex(i, 2)?).expect("two hex digits are a valid char"));
                i += 2;
            }
            'u' | 'U' if !bytes => {
                let n = if e == 'u' { 4 } else { 8 };
                let code = hex(i, n)?;
                out.push(char::from_u32(code).ok_or("unsupported code point in \\u escape")?);
                i += n;
            }
            'N' if !bytes => return Err("\\N{...} escapes are not supported".into()),
            other => {
                // Unknown escapes keep their backslash.
                out.push('\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- syntax tree

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum UnaryOp {
    Not,
    Invert,
    Plus,
    Minus,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum BinOp {
    Add,
    Sub,
    Mul,
    MatMul,
    Div,
    FloorDiv,
    Mod,
    Pow,
    LShift,
    RShift,
    BitOr,
    BitXor,
    BitAnd,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Expr {
    /// A str/bytes/int/float/bool/None literal; the flag records a `u"..."`
    /// prefix, which `ast.unparse` reproduces.
    Const(PyValue, bool),
    Ellipsis,
    Imag(f64),
    FString,
    Name(String),
    Attribute(Box<Expr>, String),
    Call {
        func: Box<Expr>,
        args: Vec<Expr>,
        keywords: Vec<(Option<String>, Expr)>,
    },
    Subscript(Box<Expr>, Box<Expr>),
    Slice(Option<Box<Expr>>, Option<Box<Expr>>, Option<Box<Expr>>),
    Starred(Box<Expr>),
    Unary(UnaryOp, Box<Expr>),
    Bin(Box<Expr>, BinOp, Box<Expr>),
    /// `and` / `or` chain (`true` = `and`).
    BoolOp(bool, Vec<Expr>),
    Compare(Box<Expr>, Vec<(&'static str, Expr)>),
    IfExp {
        body: Box<Expr>,
        test: Box<Expr>,
        orelse: Box<Expr>,
    },
    /// `target := value` (`ast.NamedExpr`).
    Walrus(Box<Expr>, Box<Expr>),
    Await(Box<Expr>),
    Lambda {
        params: LambdaParams,
        body: Box<Expr>,
    },
    Comprehension {
        kind: ComprehensionKind,
        element: Box<Expr>,
        value: Option<Box<Expr>>,
        generators: Vec<Generator>,
    },
    List(Vec<Expr>),
    Tuple(Vec<Expr>),
    Set(Vec<Expr>),
    /// `None` key = `**mapping`.
    Dict(Vec<(Option<Expr>, Expr)>),
}

/// A lambda's parameters, in source order within each group.
#[derive(Clone, Debug, PartialEq, Default)]
pub(super) struct LambdaParams {
    positional_only: Vec<(String, Option<Expr>)>,
    positional: Vec<(String, Option<Expr>)>,
    /// `Some(None)` = a bare `*` before keyword-only parameters.
    var_positional: Option<Option<String>>,
    keyword_only: Vec<(String, Option<Expr>)>,
    var_keyword: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum ComprehensionKind {
    List,
    Set,
    Dict,
    Generator,
}

/// One `[async] for target in iter [if cond]...` clause.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Generator {
    is_async: bool,
    target: Expr,
    iter: Expr,
    ifs: Vec<Expr>,
}

// ---------------------------------------------------------------- parser

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

type PResult = Result<Expr, String>;

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.pos]
    }

    fn peek_at(&self, n: usize) -> &Tok {
        self.toks.get(self.pos + n).unwrap_or(&Tok::End)
    }

    fn advance(&mut self) -> Tok {
        let t = self.toks[self.pos].clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Tok::Op(o) if *o == op)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        if self.is_op(op) {
            self.advance();
            true
        } else {
            false
        }
    }

    fn expect_op(&mut self, op: &str) -> Result<(), String> {
        if self.eat_op(op) {
            Ok(())
        } else {
            Err(format!(
                "invalid syntax: expected '{}', found {:?}",
                op,
                self.peek()
            ))
        }
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Tok::Name(n) if n == kw)
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.is_kw(kw) {
            self.advance();
            true
        } else {
            false
        }
    }

    /// Whether the next token can begin an expression (to tell a trailing
    /// comma from a further element).
    fn starts_expression(&self) -> bool {
        match self.peek() {
            Tok::Name(n) => {
                !is_keyword(n)
                    || matches!(
                        n.as_str(),
                        "True" | "False" | "None" | "not" | "lambda" | "await"
                    )
            }
            Tok::Int(_) | Tok::Float(_) | Tok::Imag(_) | Tok::Str(_) => true,
            Tok::Op(o) => matches!(*o, "(" | "[" | "{" | "-" | "+" | "~" | "..." | "*"),
            Tok::Newline | Tok::End => false,
        }
    }

    /// `eval` input: `expressions NEWLINE* ENDMARKER`.
    fn parse_eval(&mut self) -> PResult {
        let first = self.expression()?;
        let body = if self.is_op(",") {
            let mut items = vec![first];
            while self.eat_op(",") {
                if !self.starts_expression() {
                    break;
                }
                items.push(self.expression()?);
            }
            Expr::Tuple(items)
        } else {
            first
        };
        while matches!(self.peek(), Tok::Newline) {
            self.advance();
        }
        match self.peek() {
            Tok::End => Ok(body),
            other => Err(format!("invalid syntax at {:?}", other)),
        }
    }

    fn expression(&mut self) -> PResult {
        if self.is_kw("lambda") {
            return self.lambda();
        }
        let body = self.disjunction()?;
        if self.eat_kw("if") {
            let test = self.disjunction()?;
            if !self.eat_kw("else") {
                return Err("expected 'else' after 'if' expression".into());
            }
            let orelse = self.expression()?;
            return Ok(Expr::IfExp {
                body: Box::new(body),
                test: Box::new(test),
                orelse: Box::new(orelse),
            });
        }
        Ok(body)
    }

    fn param_name(&mut self) -> Result<String, String> {
        match self.advance() {
            Tok::Name(n) if !is_keyword(&n) => Ok(n),
            other => Err(format!("invalid lambda parameter {:?}", other)),
        }
    }

    fn lambda(&mut self) -> PResult {
        self.advance();
        let mut params = LambdaParams::default();
        while !self.is_op(":") {
            if self.eat_op("**") {
                params.var_keyword = Some(self.param_name()?);
            } else if self.eat_op("*") {
                let name = if matches!(self.peek(), Tok::Name(_)) {
                    Some(self.param_name()?)
                } else {
                    None
                };
                params.var_positional = Some(name);
            } else if self.eat_op("/") {
                params.positional_only.append(&mut params.positional);
            } else {
                let name = self.param_name()?;
                let default = if self.eat_op("=") {
                    Some(self.expression()?)
                } else {
                    None
                };
                if params.var_positional.is_some() {
                    params.keyword_only.push((name, default));
                } else {
                    params.positional.push((name, default));
                }
            }
            if !self.eat_op(",") {
                break;
            }
        }
        self.expect_op(":")?;
        let body = self.expression()?;
        Ok(Expr::Lambda {
            params,
            body: Box::new(body),
        })
    }

    fn named_expression(&mut self) -> PResult {
        if let (Tok::Name(n), Tok::Op(":=")) = (self.peek(), self.peek_at(1)) {
            if !is_keyword(n) {
                let target = Expr::Name(n.clone());
                self.advance();
                self.advance();
                let value = self.expression()?;
                return Ok(Expr::Walrus(Box::new(target), Box::new(value)));
            }
        }
        self.expression()
    }

    fn star_named_expression(&mut self) -> PResult {
        if self.eat_op("*") {
            return Ok(Expr::Starred(Box::new(self.bitwise_or()?)));
        }
        self.named_expression()
    }

    fn disjunction(&mut self) -> PResult {
        self.bool_chain("or", Self::conjunction, false)
    }

    fn conjunction(&mut self) -> PResult {
        self.bool_chain("and", Self::inversion, true)
    }

    fn bool_chain(&mut self, kw: &str, operand: fn(&mut Self) -> PResult, is_and: bool) -> PResult {
        let first = operand(self)?;
        if !self.is_kw(kw) {
            return Ok(first);
        }
        let mut values = vec![first];
        while self.eat_kw(kw) {
            values.push(operand(self)?);
        }
        Ok(Expr::BoolOp(is_and, values))
    }

    fn inversion(&mut self) -> PResult {
        if self.eat_kw("not") {
            return Ok(Expr::Unary(UnaryOp::Not, Box::new(self.inversion()?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> PResult {
        let left = self.bitwise_or()?;
        let mut ops = Vec::new();
        loop {
            let op: &'static str = match self.peek() {
                Tok::Op(o) if matches!(*o, "==" | "!=" | "<" | "<=" | ">" | ">=") => {
                    let o = *o;
                    self.advance();
                    o
                }
                Tok::Name(n) if n == "in" => {
                    self.advance();
                    "in"
                }
                Tok::Name(n)
                    if n == "not" && matches!(self.peek_at(1), Tok::Name(m) if m == "in") =>
                {
                    self.advance();
                    self.advance();
                    "not in"
                }
                Tok::Name(n) if n == "is" => {
                    self.advance();
                    if self.eat_kw("not") {
                        "is not"
                    } else {
                        "is"
                    }
                }
                _ => break,
            };
            ops.push((op, self.bitwise_or()?));
        }
        if ops.is_empty() {
            Ok(left)
        } else {
            Ok(Expr::Compare(Box::new(left), ops))
        }
    }

    /// One left-associative binary level.
    fn binary_level(
        &mut self,
        ops: &[(&str, BinOp)],
        operand: fn(&mut Self) -> PResult,
    ) -> PResult {
        let mut left = operand(self)?;
        'outer: loop {
            for (text, op) in ops {
                if self.eat_op(text) {
                    let right = operand(self)?;
                    left = Expr::Bin(Box::new(left), *op, Box::new(right));
                    continue 'outer;
                }
            }
            return Ok(left);
        }
    }

    fn bitwise_or(&mut self) -> PResult {
        self.binary_level(&[("|", BinOp::BitOr)], Self::bitwise_xor)
    }

    fn bitwise_xor(&mut self) -> PResult {
        self.binary_level(&[("^", BinOp::BitXor)], Self::bitwise_and)
    }

    fn bitwise_and(&mut self) -> PResult {
        self.binary_level(&[("&", BinOp::BitAnd)], Self::shift)
    }

    fn shift(&mut self) -> PResult {
        self.binary_level(&[("<<", BinOp::LShift), (">>", BinOp::RShift)], Self::sum)
    }

    fn sum(&mut self) -> PResult {
        self.binary_level(&[("+", BinOp::Add), ("-", BinOp::Sub)], Self::term)
    }

    fn term(&mut self) -> PResult {
        self.binary_level(
            &[
                ("*", BinOp::Mul),
                ("/", BinOp::Div),
                ("//", BinOp::FloorDiv),
                ("%", BinOp::Mod),
                ("@", BinOp::MatMul),
            ],
            Self::factor,
        )
    }

    fn factor(&mut self) -> PResult {
        for (text, op) in [
            ("+", UnaryOp::Plus),
            ("-", UnaryOp::Minus),
            ("~", UnaryOp::Invert),
        ] {
            if self.eat_op(text) {
                return Ok(Expr::Unary(op, Box::new(self.factor()?)));
            }
        }
        self.power()
    }

    fn power(&mut self) -> PResult {
        let base = if self.eat_kw("await") {
            Expr::Await(Box::new(self.primary()?))
        } else {
            self.primary()?
        };
        if self.eat_op("**") {
            let exponent = self.factor()?;
            return Ok(Expr::Bin(Box::new(base), BinOp::Pow, Box::new(exponent)));
        }
        Ok(base)
    }

    fn primary(&mut self) -> PResult {
        let mut e = self.atom()?;
        loop {
            if self.eat_op(".") {
                match self.advance() {
                    Tok::Name(n) if !is_keyword(&n) => e = Expr::Attribute(Box::new(e), n),
                    other => return Err(format!("invalid attribute name {:?}", other)),
                }
            } else if self.eat_op("(") {
                e = self.call_arguments(e)?;
            } else if self.eat_op("[") {
                let slice = self.slices()?;
                self.expect_op("]")?;
                e = Expr::Subscript(Box::new(e), Box::new(slice));
            } else {
                return Ok(e);
            }
        }
    }

    fn call_arguments(&mut self, func: Expr) -> PResult {
        let mut args = Vec::new();
        let mut keywords: Vec<(Option<String>, Expr)> = Vec::new();
        let mut seen_double_star = false;
        while !self.eat_op(")") {
            if self.eat_op("*") {
                if seen_double_star {
                    return Err(
                        "iterable argument unpacking follows keyword argument unpacking".into(),
                    );
                }
                args.push(Expr::Starred(Box::new(self.expression()?)));
            } else if self.eat_op("**") {
                keywords.push((None, self.expression()?));
                seen_double_star = true;
            } else if let (Tok::Name(n), Tok::Op("=")) = (self.peek(), self.peek_at(1)) {
                if is_keyword(n) {
                    return Err("cannot assign to keyword".into());
                }
                let name = n.clone();
                self.advance();
                self.advance();
                keywords.push((Some(name), self.expression()?));
            } else {
                let value = self.named_expression()?;
                if self.is_kw("for") || self.is_kw("async") {
                    let generator =
                        self.comprehension(ComprehensionKind::Generator, value, None)?;
                    if !args.is_empty() || !keywords.is_empty() || !self.is_op(")") {
                        return Err("Generator expression must be parenthesized".into());
                    }
                    args.push(generator);
                    continue;
                }
                if !keywords.is_empty() {
                    return Err("positional argument follows keyword argument".into());
                }
                args.push(value);
            }
            if !self.eat_op(",") {
                self.expect_op(")")?;
                break;
            }
        }
        Ok(Expr::Call {
            func: Box::new(func),
            args,
            keywords,
        })
    }

    fn slices(&mut self) -> PResult {
        let first = self.slice_item()?;
        if !self.is_op(",") {
            return Ok(first);
        }
        let mut items = vec![first];
        while self.eat_op(",") {
            if self.is_op("]") {
                break;
            }
            items.push(self.slice_item()?);
        }
        Ok(Expr::Tuple(items))
    }

    fn slice_item(&mut self) -> PResult {
        let lower = if self.is_op(":") {
            None
        } else if self.eat_op("*") {
            return Ok(Expr::Starred(Box::new(self.bitwise_or()?)));
        } else {
            let e = self.named_expression()?;
            if !self.is_op(":") {
                return Ok(e);
            }
            Some(Box::new(e))
        };
        self.expect_op(":")?;
        let bound = |p: &mut Self| -> Result<Option<Box<Expr>>, String> {
            if p.is_op(":") || p.is_op(",") || p.is_op("]") {
                Ok(None)
            } else {
                Ok(Some(Box::new(p.expression()?)))
            }
        };
        let upper = bound(self)?;
        let step = if self.eat_op(":") { bound(self)? } else { None };
        Ok(Expr::Slice(lower, upper, step))
    }

    /// The `for ... in ... [if ...]` clauses after a comprehension's element.
    fn comprehension(
        &mut self,
        kind: ComprehensionKind,
        element: Expr,
        value: Option<Expr>,
    ) -> PResult {
        let mut generators = Vec::new();
        while self.is_kw("for") || self.is_kw("async") {
            let is_async = self.eat_kw("async");
            if !self.eat_kw("for") {
                return Err("expected 'for'".into());
            }
            let mut targets = Vec::new();
            let mut comma = false;
            loop {
                targets.push(if self.eat_op("*") {
                    Expr::Starred(Box::new(self.bitwise_or()?))
                } else {
                    self.bitwise_or()?
                });
                if !self.eat_op(",") {
                    break;
                }
                comma = true;
                if self.is_kw("in") {
                    break;
                }
            }
            let target = if comma {
                Expr::Tuple(targets)
            } else {
                targets.pop().expect("one target")
            };
            if !is_assignment_target(&target) {
                return Err("cannot assign to expression".into());
            }
            if !self.eat_kw("in") {
                return Err("expected 'in' in comprehension".into());
            }
            let iter = self.disjunction()?;
            let mut ifs = Vec::new();
            while self.eat_kw("if") {
                ifs.push(self.disjunction()?);
            }
            generators.push(Generator {
                is_async,
                target,
                iter,
                ifs,
            });
        }
        Ok(Expr::Comprehension {
            kind,
            element: Box::new(element),
            value: value.map(Box::new),
            generators,
        })
    }

    /// Elements of a list/tuple/set display after the first one.
    fn rest_of_display(&mut self, first: Expr, close: &str) -> Result<Vec<Expr>, String> {
        let mut items = vec![first];
        while self.eat_op(",") {
            if self.is_op(close) {
                break;
            }
            items.push(self.star_named_expression()?);
        }
        self.expect_op(close)?;
        Ok(items)
    }

    fn atom(&mut self) -> PResult {
        match self.advance() {
            Tok::Name(n) => match n.as_str() {
                "True" => Ok(Expr::Const(PyValue::Bool(true), false)),
                "False" => Ok(Expr::Const(PyValue::Bool(false), false)),
                "None" => Ok(Expr::Const(PyValue::None, false)),
                n if is_keyword(n) => Err(format!("invalid syntax at keyword '{}'", n)),
                _ => Ok(Expr::Name(n)),
            },
            Tok::Int(i) => Ok(Expr::Const(PyValue::Int(i), false)),
            Tok::Float(f) => Ok(Expr::Const(PyValue::Float(f), false)),
            Tok::Imag(f) => Ok(Expr::Imag(f)),
            Tok::Str(first) => self.string_concatenation(first),
            Tok::Op("...") => Ok(Expr::Ellipsis),
            Tok::Op("(") => {
                if self.eat_op(")") {
                    return Ok(Expr::Tuple(Vec::new()));
                }
                if self.is_kw("yield") {
                    return Err("yield expressions are not supported".into());
                }
                let first = self.star_named_expression()?;
                if self.is_kw("for") || self.is_kw("async") {
                    let generator =
                        self.comprehension(ComprehensionKind::Generator, first, None)?;
                    self.expect_op(")")?;
                    return Ok(generator);
                }
                if self.eat_op(")") {
                    if matches!(first, Expr::Starred(_)) {
                        return Err("cannot use starred expression here".into());
                    }
                    return Ok(first);
                }
                if !self.is_op(",") {
                    return Err(format!("invalid syntax at {:?}", self.peek()));
                }
                Ok(Expr::Tuple(self.rest_of_display(first, ")")?))
            }
            Tok::Op("[") => {
                if self.eat_op("]") {
                    return Ok(Expr::List(Vec::new()));
                }
                let first = self.star_named_expression()?;
                if self.is_kw("for") || self.is_kw("async") {
                    let list = self.comprehension(ComprehensionKind::List, first, None)?;
                    self.expect_op("]")?;
                    return Ok(list);
                }
                Ok(Expr::List(self.rest_of_display(first, "]")?))
            }
            Tok::Op("{") => self.brace_display(),
            other => Err(format!("invalid syntax at {:?}", other)),
        }
    }

    fn brace_display(&mut self) -> PResult {
        if self.eat_op("}") {
            return Ok(Expr::Dict(Vec::new()));
        }
        let first: (Option<Expr>, Expr) = if self.eat_op("**") {
            (None, self.bitwise_or()?)
        } else {
            let key = self.star_named_expression()?;
            if !self.is_op(":") || matches!(key, Expr::Starred(_)) {
                // A set display or comprehension.
                if self.is_kw("for") || self.is_kw("async") {
                    let set = self.comprehension(ComprehensionKind::Set, key, None)?;
                    self.expect_op("}")?;
                    return Ok(set);
                }
                return Ok(Expr::Set(self.rest_of_display(key, "}")?));
            }
            self.advance();
            let value = self.expression()?;
            if self.is_kw("for") || self.is_kw("async") {
                let dict = self.comprehension(ComprehensionKind::Dict, key, Some(value))?;
                self.expect_op("}")?;
                return Ok(dict);
            }
            (Some(key), value)
        };
        let mut items = vec![first];
        while self.eat_op(",") {
            if self.is_op("}") {
                break;
            }
            if self.eat_op("**") {
                items.push((None, self.bitwise_or()?));
            } else {
                let key = self.expression()?;
                self.expect_op(":")?;
                items.push((Some(key), self.expression()?));
            }
        }
        self.expect_op("}")?;
        Ok(Expr::Dict(items))
    }

    /// Adjacent string literals are one constant (`"a" "b"` == `"ab"`).
    fn string_concatenation(&mut self, first: StrPiece) -> PResult {
        let mut pieces = vec![first];
        while let Tok::Str(p) = self.peek() {
            pieces.push(p.clone());
            self.advance();
        }
        let is_bytes = |p: &StrPiece| matches!(p, StrPiece::Bytes(_));
        if pieces.iter().any(is_bytes) && !pieces.iter().all(is_bytes) {
            return Err("cannot mix bytes and nonbytes literals".into());
        }
        if pieces.iter().any(|p| matches!(p, StrPiece::FString)) {
            return Ok(Expr::FString);
        }
        let u_prefix = matches!(pieces[0], StrPiece::Str { u_prefix: true, .. });
        if pieces.iter().all(is_bytes) {
            let mut joined = Vec::new();
            for p in pieces {
                if let StrPiece::Bytes(b) = p {
                    joined.extend(b);
                }
            }
            return Ok(Expr::Const(PyValue::Bytes(joined), false));
        }
        let mut joined = String::new();
        for p in pieces {
            if let StrPiece::Str { value, .. } = p {
                joined.push_str(&value);
            }
        }
        Ok(Expr::Const(PyValue::Str(joined), u_prefix))
    }
}

/// Parses `src` as `ast.parse(src, mode="eval")` does and returns the body.
pub(super) fn parse_eval(src: &str) -> PResult {
    let toks = tokenize(src)?;
    Parser { toks, pos: 0 }.parse_eval()
}

/// What may follow `for` in a comprehension.
fn is_assignment_target(e: &Expr) -> bool {
    match e {
        Expr::Name(_) | Expr::Attribute(..) | Expr::Subscript(..) => true,
        Expr::Starred(inner) => is_assignment_target(inner),
        Expr::Tuple(items) | Expr::List(items) => items.iter().all(is_assignment_target),
        _ => false,
    }
}

// ---------------------------------------------------------------- BFCL's walk

/// A decoded call: dotted name and keyword arguments in source order
/// (`None` name = a `**mapping` argument).  A repeated keyword keeps its
/// first position and last value, like the dict BFCL builds.
pub(super) type ResolvedCall = (String, Vec<(Option<String>, PyValue)>);

/// BFCL's `resolve_ast_call`: the name is the chain of attributes (plus
/// the base name if the chain ends in one); positional arguments are
/// dropped; keyword values go through [`resolve_value`].
pub(super) fn resolve_call(
    func: &Expr,
    keywords: &[(Option<String>, Expr)],
) -> Result<ResolvedCall, String> {
    let mut parts = Vec::new();
    let mut f = func;
    while let Expr::Attribute(value, attr) = f {
        parts.push(attr.clone());
        f = value;
    }
    if let Expr::Name(id) = f {
        parts.push(id.clone());
    }
    parts.reverse();
    let mut args: Vec<(Option<String>, PyValue)> = Vec::new();
    for (name, value) in keywords {
        let value = resolve_value(value)?;
        match args.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => args.push((name.clone(), value)),
        }
    }
    Ok((parts.join("."), args))
}

/// BFCL's `resolve_ast_by_type`.
fn resolve_value(e: &Expr) -> Result<PyValue, String> {
    match e {
        Expr::Const(v, _) => Ok(v.clone()),
        Expr::Ellipsis => Ok(PyValue::Str("...".into())),
        Expr::Imag(f) => Ok(PyValue::Complex(0.0, *f)),
        // BFCL negates the operand's constant for every unary operator
        // (`+3` → -3, `not True` → -1); a non-constant operand fails.
        Expr::Unary(_, operand) => match operand.as_ref() {
            Expr::Const(v, _) => negate(v),
            Expr::Imag(f) => negate(&PyValue::Complex(0.0, *f)),
            _ => Err("unary operand is not a constant".into()),
        },
        Expr::List(elts) => Ok(PyValue::List(
            elts.iter().map(resolve_value).collect::<Result<_, _>>()?,
        )),
        Expr::Tuple(elts) => Ok(PyValue::Tuple(
            elts.iter().map(resolve_value).collect::<Result<_, _>>()?,
        )),
        Expr::Dict(items) => {
            let mut pairs = Vec::new();
            for (k, v) in items {
                let key = resolve_value(k.as_ref().ok_or("Unsupported AST type: NoneType")?)?;
                let value = resolve_value(v)?;
                insert_dict(&mut pairs, key, value)?;
            }
            Ok(PyValue::Dict(pairs))
        }
        Expr::Bin(..) => eval_expr(e),
        Expr::Name(id) => Ok(PyValue::Str(id.clone())),
        Expr::Call { func, keywords, .. } => {
            if keywords.is_empty() {
                Ok(PyValue::Str(unparse(e)?))
            } else {
                let (name, args) = resolve_call(func, keywords)?;
                let args = args
                    .into_iter()
                    .map(|(k, v)| (k.map_or(PyValue::None, PyValue::Str), v))
                    .collect();
                Ok(PyValue::Dict(vec![(
                    PyValue::Str(name),
                    PyValue::Dict(args),
                )]))
            }
        }
        Expr::Subscript(value, slice) => Ok(PyValue::Str(format!(
            "{}[{}]",
            unparse(value)?,
            unparse(slice)?
        ))),
        Expr::Lambda { .. } => Err("lambda arguments cannot be resolved".into()),
        other => Err(format!("Unsupported AST type: {}", node_name(other))),
    }
}

fn node_name(e: &Expr) -> &'static str {
    match e {
        Expr::Attribute(..) => "Attribute",
        Expr::Set(_) => "Set",
        Expr::FString => "JoinedStr",
        Expr::Compare(..) => "Compare",
        Expr::BoolOp(..) => "BoolOp",
        Expr::IfExp { .. } => "IfExp",
        Expr::Starred(_) => "Starred",
        Expr::Slice(..) => "Slice",
        Expr::Walrus(..) => "NamedExpr",
        Expr::Await(_) => "Await",
        Expr::Comprehension { .. } => "comprehension",
        _ => "expression",
    }
}

/// Python dict assignment: an equal key keeps its slot, the value changes.
fn insert_dict(
    pairs: &mut Vec<(PyValue, PyValue)>,
    key: PyValue,
    value: PyValue,
) -> Result<(), String> {
    if !key.is_hashable() {
        return Err(format!("unhashable type: '{}'", key.py_type().name()));
    }
    match pairs.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => pairs.push((key, value)),
    }
    Ok(())
}

/// Python's unary minus on a constant.
fn negate(v: &PyValue) -> Result<PyValue, String> {
    match v {
        PyValue::Int(i) => Ok(PyValue::Int(i.checked_neg().ok_or("integer overflow")?)),
        PyValue::Bool(b) => Ok(PyValue::Int(-i128::from(*b))),
        PyValue::Float(f) => Ok(PyValue::Float(-f)),
        PyValue::Complex(re, im) => Ok(PyValue::Complex(-re, -im)),
        other => Err(format!(
            "bad operand type for unary -: '{}'",
            other.py_type().name()
        )),
    }
}

// ---------------------------------------------------------------- eval

/// Python's evaluation of a literal expression (what BFCL's
/// `eval(ast.unparse(node))` computes for a binary operation).
pub(super) fn eval_expr(e: &Expr) -> Result<PyValue, String> {
    match e {
        Expr::Const(v, _) => Ok(v.clone()),
        Expr::Imag(f) => Ok(PyValue::Complex(0.0, *f)),
        Expr::Unary(op, operand) => {
            let v = eval_expr(operand)?;
            match op {
                UnaryOp::Not => Ok(PyValue::Bool(!v.truthy())),
                UnaryOp::Minus => negate(&v),
                UnaryOp::Plus => match v {
                    PyValue::Bool(b) => Ok(PyValue::Int(i128::from(b))),
                    PyValue::Int(_) | PyValue::Float(_) | PyValue::Complex(..) => Ok(v),
                    other => Err(format!(
                        "bad operand type for unary +: '{}'",
                        other.py_type().name()
                    )),
                },
                UnaryOp::Invert => match v {
                    PyValue::Bool(b) => Ok(PyValue::Int(!i128::from(b))),
                    PyValue::Int(i) => Ok(PyValue::Int(!i)),
                    other => Err(format!(
                        "bad operand type for unary ~: '{}'",
                        other.py_type().name()
                    )),
                },
            }
        }
        Expr::Bin(l, op, r) => binop(*op, eval_expr(l)?, eval_expr(r)?),
        Expr::BoolOp(is_and, values) => {
            // `and`/`or` return the deciding operand, evaluating lazily.
            let mut last = PyValue::None;
            for v in values {
                last = eval_expr(v)?;
                if last.truthy() != *is_and {
                    break;
                }
            }
            Ok(last)
        }
        Expr::IfExp { body, test, orelse } => {
            if eval_expr(test)?.truthy() {
                eval_expr(body)
            } else {
                eval_expr(orelse)
            }
        }
        Expr::Compare(left, ops) => {
            let mut a = eval_expr(left)?;
            for (op, right) in ops {
                let b = eval_expr(right)?;
                if !compare(op, &a, &b)? {
                    return Ok(PyValue::Bool(false));
                }
                a = b;
            }
            Ok(PyValue::Bool(true))
        }
        Expr::List(elts) => Ok(PyValue::List(
            elts.iter().map(eval_expr).collect::<Result<_, _>>()?,
        )),
        Expr::Tuple(elts) => Ok(PyValue::Tuple(
            elts.iter().map(eval_expr).collect::<Result<_, _>>()?,
        )),
        Expr::Dict(items) => {
            let mut pairs = Vec::new();
            for (k, v) in items {
                let key = eval_expr(k.as_ref().ok_or("dict unpacking is not evaluated")?)?;
                insert_dict(&mut pairs, key, eval_expr(v)?)?;
            }
            Ok(PyValue::Dict(pairs))
        }
        other => Err(format!("cannot evaluate {}", node_name(other))),
    }
}

/// One comparison of a chain (`is` is not evaluated: it depends on object
/// identity).
fn compare(op: &str, a: &PyValue, b: &PyValue) -> Result<bool, String> {
    use std::cmp::Ordering::*;
    Ok(match op {
        "==" => a == b,
        "!=" => a != b,
        "in" => b.contains(a)?,
        "not in" => !b.contains(a)?,
        "<" => order(a, b)? == Less,
        "<=" => order(a, b)? != Greater,
        ">" => order(a, b)? == Greater,
        ">=" => order(a, b)? != Less,
        other => return Err(format!("cannot evaluate '{}'", other)),
    })
}

/// Python's ordering of numbers, strings, and lists/tuples (lexicographic).
fn order(a: &PyValue, b: &PyValue) -> Result<std::cmp::Ordering, String> {
    let unorderable = || {
        format!(
            "'<' not supported between '{}' and '{}'",
            a.py_type().name(),
            b.py_type().name()
        )
    };
    match (a, b) {
        (PyValue::Str(x), PyValue::Str(y)) => Ok(x.cmp(y)),
        (PyValue::Bytes(x), PyValue::Bytes(y)) => Ok(x.cmp(y)),
        (PyValue::List(x), PyValue::List(y)) | (PyValue::Tuple(x), PyValue::Tuple(y)) => {
            for (p, q) in x.iter().zip(y) {
                if p != q {
                    return order(p, q);
                }
            }
            Ok(x.len().cmp(&y.len()))
        }
        _ => match (as_num(a), as_num(b)) {
            (Some(Num::Int(x)), Some(Num::Int(y))) => Ok(x.cmp(&y)),
            (Some(x), Some(y)) => {
                let f = |n: Num| match n {
                    Num::Int(i) => i as f64,
                    Num::Float(f) => f,
                };
                // NaN compares false every way; `order` cannot say that.
                f(x).partial_cmp(&f(y))
                    .ok_or_else(|| "comparison with NaN".to_string())
            }
            _ => Err(unorderable()),
        },
    }
}

enum Num {
    Int(i128),
    Float(f64),
}

fn as_num(v: &PyValue) -> Option<Num> {
    match v {
        PyValue::Bool(b) => Some(Num::Int(i128::from(*b))),
        PyValue::Int(i) => Some(Num::Int(*i)),
        PyValue::Float(f) => Some(Num::Float(*f)),
        _ => None,
    }
}

fn as_index(v: &PyValue) -> Option<i128> {
    match v {
        PyValue::Bool(b) => Some(i128::from(*b)),
        PyValue::Int(i) => Some(*i),
        _ => None,
    }
}

/// Refuse repetitions that would build absurdly large values.
const MAX_REPEAT_LEN: i128 = 10_000_000;

fn repeat<T: Clone>(items: &[T], n: i128) -> Result<Vec<T>, String> {
    if n <= 0 {
        return Ok(Vec::new());
    }
    if (items.len() as i128).saturating_mul(n) > MAX_REPEAT_LEN {
        return Err("repetition too large".into());
    }
    Ok(items
        .iter()
        .cloned()
        .cycle()
        .take(items.len() * n as usize)
        .collect())
}

fn binop(op: BinOp, a: PyValue, b: PyValue) -> Result<PyValue, String> {
    use PyValue as V;
    match (op, &a, &b) {
        (BinOp::Add, V::Str(x), V::Str(y)) => return Ok(V::Str(format!("{}{}", x, y))),
        (BinOp::Add, V::Bytes(x), V::Bytes(y)) => return Ok(V::Bytes([x.as_slice(), y].concat())),
        (BinOp::Add, V::List(x), V::List(y)) => return Ok(V::List([x.as_slice(), y].concat())),
        (BinOp::Add, V::Tuple(x), V::Tuple(y)) => return Ok(V::Tuple([x.as_slice(), y].concat())),
        (BinOp::Mul, seq, n) | (BinOp::Mul, n, seq)
            if matches!(seq, V::Str(_) | V::Bytes(_) | V::List(_) | V::Tuple(_))
                && as_index(n).is_some() =>
        {
            let n = as_index(n).expect("checked index");
            return match seq {
                V::Str(s) => {
                    let chars: Vec<char> = s.chars().collect();
                    Ok(V::Str(repeat(&chars, n)?.into_iter().collect()))
                }
                V::Bytes(x) => Ok(V::Bytes(repeat(x, n)?)),
                V::List(x) => Ok(V::List(repeat(x, n)?)),
                V::Tuple(x) => Ok(V::Tuple(repeat(x, n)?)),
                _ => unreachable!("matched sequence kinds"),
            };
        }
        (BinOp::BitAnd | BinOp::BitOr | BinOp::BitXor, V::Bool(x), V::Bool(y)) => {
            return Ok(V::Bool(match op {
                BinOp::BitAnd => x & y,
                BinOp::BitOr => x | y,
                _ => x ^ y,
            }))
        }
        _ => {}
    }
    let type_error = || {
        format!(
            "unsupported operand type(s) for {:?}: '{}' and '{}'",
            op,
            a.py_type().name(),
            b.py_type().name()
        )
    };
    if matches!(a, V::Complex(..)) || matches!(b, V::Complex(..)) {
        let (Some(x), Some(y)) = (as_complex(&a), as_complex(&b)) else {
            return Err(type_error());
        };
        return complex_binop(op, x, y);
    }
    match (
        as_num(&a).ok_or_else(type_error)?,
        as_num(&b).ok_or_else(type_error)?,
    ) {
        (Num::Int(x), Num::Int(y)) => int_binop(op, x, y),
        (x, y) => {
            let f = |n: Num| match n {
                Num::Int(i) => i as f64,
                Num::Float(f) => f,
            };
            float_binop(op, f(x), f(y))
        }
    }
}

fn as_complex(v: &PyValue) -> Option<(f64, f64)> {
    match v {
        PyValue::Complex(re, im) => Some((*re, *im)),
        other => match as_num(other)? {
            Num::Int(i) => Some((i as f64, 0.0)),
            Num::Float(f) => Some((f, 0.0)),
        },
    }
}

/// Python's complex `+ - * /` (division by Smith's method, as CPython).
fn complex_binop(op: BinOp, (ar, ai): (f64, f64), (br, bi): (f64, f64)) -> Result<PyValue, String> {
    let (re, im) = match op {
        BinOp::Add => (ar + br, ai + bi),
        BinOp::Sub => (ar - br, ai - bi),
        BinOp::Mul => (ar * br - ai * bi, ar * bi + ai * br),
        BinOp::Div => {
            if br.abs() >= bi.abs() {
                if br == 0.0 {
                    return Err("complex division by zero".into());
                }
                let ratio = bi / br;
                let denom = br + bi * ratio;
                ((ar + ai * ratio) / denom, (ai - ar * ratio) / denom)
            } else if bi.abs() >= br.abs() {
                let ratio = br / bi;
                let denom = br * ratio + bi;
                ((ar * ratio + ai) / denom, (ai * ratio - ar) / denom)
            } else {
                (f64::NAN, f64::NAN)
            }
        }
        _ => return Err(format!("unsupported complex operation {:?}", op)),
    };
    Ok(PyValue::Complex(re, im))
}

fn int_binop(op: BinOp, x: i128, y: i128) -> Result<PyValue, String> {
    let overflow = || "integer result too large".to_string();
    let zero = || "integer division or modulo by zero".to_string();
    let v = match op {
        BinOp::Add => x.checked_add(y).ok_or_else(overflow)?,
        BinOp::Sub => x.checked_sub(y).ok_or_else(overflow)?,
        BinOp::Mul => x.checked_mul(y).ok_or_else(overflow)?,
        BinOp::Div => {
            if y == 0 {
                return Err("division by zero".into());
            }
            return Ok(PyValue::Float(x as f64 / y as f64));
        }
        BinOp::FloorDiv => {
            if y == 0 {
                return Err(zero());
            }
            x.checked_div_euclid(y).ok_or_else(overflow)?;
            let q = x / y;
            if x % y != 0 && ((x < 0) != (y < 0)) {
                q - 1
            } else {
                q
            }
        }
        BinOp::Mod => {
            if y == 0 {
                return Err(zero());
            }
            let r = x.checked_rem(y).ok_or_else(overflow)?;
            if r != 0 && ((r < 0) != (y < 0)) {
                r + y
            } else {
                r
            }
        }
        BinOp::Pow => {
            if y < 0 {
                return float_binop(op, x as f64, y as f64);
            }
            let exp = u32::try_from(y).map_err(|_| overflow())?;
            x.checked_pow(exp).ok_or_else(overflow)?
        }
        BinOp::LShift | BinOp::RShift => {
            if y < 0 {
                return Err("negative shift count".into());
            }
            if op == BinOp::RShift {
                if y >= 127 {
                    if x < 0 {
                        -1
                    } else {
                        0
                    }
                } else {
                    x >> y
                }
            } else if x == 0 {
                0
            } else {
                let shifted = if y < 127 {
                    x.checked_shl(y as u32)
                } else {
                    None
                };
                match shifted {
                    Some(s) if s >> y == x => s,
                    _ => return Err(overflow()),
                }
            }
        }
        BinOp::BitAnd => x & y,
        BinOp::BitOr => x | y,
        BinOp::BitXor => x ^ y,
        BinOp::MatMul => return Err("unsupported operand type(s) for @".into()),
    };
    Ok(PyValue::Int(v))
}

/// Python's float arithmetic, including its `divmod` and `pow` rules.
fn float_binop(op: BinOp, x: f64, y: f64) -> Result<PyValue, String> {
    let v = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => {
            if y == 0.0 {
                return Err("float division by zero".into());
            }
            x / y
        }
        BinOp::FloorDiv | BinOp::Mod => {
            if y == 0.0 {
                return Err("float floor division by zero".into());
            }
            let mut m = x % y;
            let mut div = (x - m) / y;
            if m != 0.0 {
                if (y < 0.0) != (m < 0.0) {
                    m += y;
                    div -= 1.0;
                }
            } else {
                m = 0.0f64.copysign(y);
            }
            if op == BinOp::Mod {
                m
            } else if div != 0.0 {
                let mut floor = div.floor();
                if div - floor > 0.5 {
                    floor += 1.0;
                }
                floor
            } else {
                0.0f64.copysign(x / y)
            }
        }
        BinOp::Pow => {
            if x == 0.0 && y < 0.0 {
                return Err("0.0 cannot be raised to a negative power".into());
            }
            if x < 0.0 && y.is_finite() && y.fract() != 0.0 {
                return Err("negative number to a fractional power gives a complex result".into());
            }
            let r = x.powf(y);
            if r.is_infinite() && x.is_finite() && y.is_finite() {
                return Err("float power overflow".into());
            }
            r
        }
        _ => return Err(format!("unsupported operand type(s) for {:?}: 'float'", op)),
    };
    Ok(PyValue::Float(v))
}

// ---------------------------------------------------------------- unparse

// `ast.unparse`'s precedence levels (`_Precedence`); BOR equals EXPR.
const P_NAMED_EXPR: u8 = 0;
const P_TUPLE: u8 = 1;
const P_TEST: u8 = 3;
const P_OR: u8 = 4;
const P_AND: u8 = 5;
const P_NOT: u8 = 6;
const P_CMP: u8 = 7;
const P_EXPR: u8 = 8;
const P_BXOR: u8 = 9;
const P_BAND: u8 = 10;
const P_SHIFT: u8 = 11;
const P_ARITH: u8 = 12;
const P_TERM: u8 = 13;
const P_FACTOR: u8 = 14;
const P_POWER: u8 = 15;
const P_AWAIT: u8 = 16;
const P_ATOM: u8 = 17;

/// Python's `ast.unparse(node)` for a node at the top (precedence TEST).
pub(super) fn unparse(e: &Expr) -> Result<String, String> {
    let mut out = String::new();
    write_expr(e, P_TEST, &mut out)?;
    Ok(out)
}

fn binop_text(op: BinOp) -> (&'static str, u8) {
    match op {
        BinOp::Add => ("+", P_ARITH),
        BinOp::Sub => ("-", P_ARITH),
        BinOp::Mul => ("*", P_TERM),
        BinOp::MatMul => ("@", P_TERM),
        BinOp::Div => ("/", P_TERM),
        BinOp::FloorDiv => ("//", P_TERM),
        BinOp::Mod => ("%", P_TERM),
        BinOp::Pow => ("**", P_POWER),
        BinOp::LShift => ("<<", P_SHIFT),
        BinOp::RShift => (">>", P_SHIFT),
        BinOp::BitOr => ("|", P_EXPR),
        BinOp::BitXor => ("^", P_BXOR),
        BinOp::BitAnd => ("&", P_BAND),
    }
}

/// `_write_constant`: floats (and complex) spell infinity `1e309`.
fn constant_text(v: &PyValue) -> String {
    match v {
        PyValue::Float(f) => float_repr(*f)
            .replace("inf", "1e309")
            .replace("nan", "(1e309-1e309)"),
        PyValue::Str(s) => str_repr(s),
        PyValue::Bytes(b) => bytes_repr(b),
        other => other.repr(),
    }
}

fn write_items(items: &[Expr], out: &mut String) -> Result<(), String> {
    if items.len() == 1 {
        write_expr(&items[0], P_TEST, out)?;
        out.push(',');
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_expr(item, P_TEST, out)?;
    }
    Ok(())
}

fn write_joined(items: &[Expr], out: &mut String) -> Result<(), String> {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_expr(item, P_TEST, out)?;
    }
    Ok(())
}

/// Writes `e` as `ast.unparse` does when its parent assigned it precedence
/// `ctx`: parentheses appear where `ctx` binds tighter than the node.
fn write_expr(e: &Expr, ctx: u8, out: &mut String) -> Result<(), String> {
    let open = |needed: bool, out: &mut String| {
        if needed {
            out.push('(');
        }
        needed
    };
    let close = |opened: bool, out: &mut String| {
        if opened {
            out.push(')');
        }
    };
    match e {
        Expr::Const(v, u_prefix) => {
            if *u_prefix {
                out.push('u');
            }
            out.push_str(&constant_text(v));
        }
        Expr::Ellipsis => out.push_str("..."),
        Expr::Imag(f) => {
            let text = float_repr(*f);
            let text = text.strip_suffix(".0").unwrap_or(&text);
            out.push_str(&format!("{}j", text).replace("inf", "1e309"));
        }
        Expr::Name(id) => out.push_str(id),
        Expr::Attribute(value, attr) => {
            write_expr(value, P_ATOM, out)?;
            if matches!(
                value.as_ref(),
                Expr::Const(PyValue::Int(_) | PyValue::Bool(_), _)
            ) {
                out.push(' ');
            }
            out.push('.');
            out.push_str(attr);
        }
        Expr::Call {
            func,
            args,
            keywords,
        } => {
            write_expr(func, P_ATOM, out)?;
            out.push('(');
            let mut first = true;
            for arg in args {
                if !first {
                    out.push_str(", ");
                }
                first = false;
                write_expr(arg, P_TEST, out)?;
            }
            for (name, value) in keywords {
                if !first {
                    out.push_str(", ");
                }
                first = false;
                match name {
                    Some(n) => {
                        out.push_str(n);
                        out.push('=');
                    }
                    None => out.push_str("**"),
                }
                write_expr(value, P_TEST, out)?;
            }
            out.push(')');
        }
        Expr::Subscript(value, slice) => {
            write_expr(value, P_ATOM, out)?;
            out.push('[');
            match slice.as_ref() {
                Expr::Tuple(elts) if !elts.is_empty() => write_items(elts, out)?,
                other => write_expr(other, P_TEST, out)?,
            }
            out.push(']');
        }
        Expr::Slice(lower, upper, step) => {
            if let Some(l) = lower {
                write_expr(l, P_TEST, out)?;
            }
            out.push(':');
            if let Some(u) = upper {
                write_expr(u, P_TEST, out)?;
            }
            if let Some(s) = step {
                out.push(':');
                write_expr(s, P_TEST, out)?;
            }
        }
        Expr::Starred(value) => {
            out.push('*');
            write_expr(value, P_EXPR, out)?;
        }
        Expr::Unary(op, operand) => {
            let (text, prec) = match op {
                UnaryOp::Not => ("not ", P_NOT),
                UnaryOp::Invert => ("~", P_FACTOR),
                UnaryOp::Plus => ("+", P_FACTOR),
                UnaryOp::Minus => ("-", P_FACTOR),
            };
            let p = open(ctx > prec, out);
            out.push_str(text);
            write_expr(operand, prec, out)?;
            close(p, out);
        }
        Expr::Bin(left, op, right) => {
            let (text, prec) = binop_text(*op);
            let p = open(ctx > prec, out);
            let (lp, rp) = if *op == BinOp::Pow {
                (prec + 1, prec)
            } else {
                (prec, prec + 1)
            };
            write_expr(left, lp, out)?;
            out.push_str(&format!(" {} ", text));
            write_expr(right, rp, out)?;
            close(p, out);
        }
        Expr::BoolOp(is_and, values) => {
            let mut prec = if *is_and { P_AND } else { P_OR };
            let p = open(ctx > prec, out);
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    out.push_str(if *is_and { " and " } else { " or " });
                }
                // ast.unparse raises the level for each successive operand.
                prec += 1;
                write_expr(v, prec, out)?;
            }
            close(p, out);
        }
        Expr::Compare(left, ops) => {
            let p = open(ctx > P_CMP, out);
            write_expr(left, P_CMP + 1, out)?;
            for (op, right) in ops {
                out.push_str(&format!(" {} ", op));
                write_expr(right, P_CMP + 1, out)?;
            }
            close(p, out);
        }
        Expr::IfExp { body, test, orelse } => {
            let p = open(ctx > P_TEST, out);
            write_expr(body, P_TEST + 1, out)?;
            out.push_str(" if ");
            write_expr(test, P_TEST + 1, out)?;
            out.push_str(" else ");
            write_expr(orelse, P_TEST, out)?;
            close(p, out);
        }
        Expr::Walrus(target, value) => {
            let p = open(ctx > P_NAMED_EXPR, out);
            write_expr(target, P_ATOM, out)?;
            out.push_str(" := ");
            write_expr(value, P_ATOM, out)?;
            close(p, out);
        }
        Expr::Await(value) => {
            let p = open(ctx > P_AWAIT, out);
            out.push_str("await ");
            write_expr(value, P_ATOM, out)?;
            close(p, out);
        }
        Expr::List(elts) => {
            out.push('[');
            write_joined(elts, out)?;
            out.push(']');
        }
        Expr::Tuple(elts) => {
            let p = open(elts.is_empty() || ctx > P_TUPLE, out);
            write_items(elts, out)?;
            close(p, out);
        }
        Expr::Set(elts) => {
            out.push('{');
            write_joined(elts, out)?;
            out.push('}');
        }
        Expr::Dict(items) => {
            out.push('{');
            for (i, (k, v)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match k {
                    Some(k) => {
                        write_expr(k, P_TEST, out)?;
                        out.push_str(": ");
                        write_expr(v, P_TEST, out)?;
                    }
                    None => {
                        out.push_str("**");
                        write_expr(v, P_EXPR, out)?;
                    }
                }
            }
            out.push('}');
        }
        Expr::Lambda { params, body } => {
            let p = open(ctx > P_TEST, out);
            out.push_str("lambda");
            let mut rendered = String::new();
            write_lambda_params(params, &mut rendered)?;
            if !rendered.is_empty() {
                out.push(' ');
                out.push_str(&rendered);
            }
            out.push_str(": ");
            write_expr(body, P_TEST, out)?;
            close(p, out);
        }
        Expr::Comprehension {
            kind,
            element,
            value,
            generators,
        } => {
            let (start, end) = match kind {
                ComprehensionKind::List => ('[', ']'),
                ComprehensionKind::Generator => ('(', ')'),
                ComprehensionKind::Set | ComprehensionKind::Dict => ('{', '}'),
            };
            out.push(start);
            write_expr(element, P_TEST, out)?;
            if let Some(value) = value {
                out.push_str(": ");
                write_expr(value, P_TEST, out)?;
            }
            for g in generators {
                out.push_str(if g.is_async { " async for " } else { " for " });
                write_expr(&g.target, P_TUPLE, out)?;
                out.push_str(" in ");
                write_expr(&g.iter, P_TEST + 1, out)?;
                for cond in &g.ifs {
                    out.push_str(" if ");
                    write_expr(cond, P_TEST + 1, out)?;
                }
            }
            out.push(end);
        }
        Expr::FString => return Err("unparse of f-strings is not supported".into()),
    }
    Ok(())
}

/// `ast.unparse` of lambda parameters (`x, /, y=2, *a, z, w=3, **k`).
fn write_lambda_params(params: &LambdaParams, out: &mut String) -> Result<(), String> {
    let mut parts: Vec<String> = Vec::new();
    let with_default = |(name, default): &(String, Option<Expr>)| -> Result<String, String> {
        let mut text = name.clone();
        if let Some(d) = default {
            text.push('=');
            write_expr(d, P_TEST, &mut text)?;
        }
        Ok(text)
    };
    for (i, param) in params.positional_only.iter().enumerate() {
        let mut text = with_default(param)?;
        if i + 1 == params.positional_only.len() {
            text.push_str(", /");
        }
        parts.push(text);
    }
    for param in &params.positional {
        parts.push(with_default(param)?);
    }
    if params.var_positional.is_some() || !params.keyword_only.is_empty() {
        let name = params.var_positional.clone().flatten().unwrap_or_default();
        parts.push(format!("*{}", name));
    }
    for param in &params.keyword_only {
        parts.push(with_default(param)?);
    }
    if let Some(name) = &params.var_keyword {
        parts.push(format!("**{}", name));
    }
    out.push_str(&parts.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unparse_src(src: &str) -> String {
        unparse(&parse_eval(src).unwrap()).unwrap()
    }

    fn eval_src(src: &str) -> PyValue {
        eval_expr(&parse_eval(src).unwrap()).unwrap()
    }

    #[test]
    fn unparse_normalises_like_python() {
        assert_eq!(unparse_src("np.array( [1,2] )"), "np.array([1, 2])");
        assert_eq!(
            unparse_src("f(\"a\", 0x10, 1e3, (1,), *a, k=2, **kw)"),
            "f('a', 16, 1000.0, (1,), *a, k=2, **kw)"
        );
        assert_eq!(unparse_src("(a + b) * c ** -d"), "(a + b) * c ** (-d)");
        assert_eq!(unparse_src("a[1:2, ::3]"), "a[1:2, ::3]");
        assert_eq!(unparse_src("1 .real"), "1 .real");
        assert_eq!(
            unparse_src("x if not a and b or c else y"),
            "x if not a and b or c else y"
        );
        assert_eq!(unparse_src("u'x' 'y'"), "u'xy'");
        assert_eq!(unparse_src("g(x for x in y)"), "g((x for x in y))");
        assert_eq!(
            unparse_src("g([x*2 for x, y in z if x if y])"),
            "g([x * 2 for x, y in z if x if y])"
        );
        assert_eq!(
            unparse_src("g(lambda x, /, y=2, *a, z, w=3, **k: x + y)"),
            "g(lambda x, /, y=2, *a, z, w=3, **k: x + y)"
        );
        assert_eq!(
            unparse_src("g(lambda *, k: k, lambda: 1)"),
            "g(lambda *, k: k, lambda: 1)"
        );
        assert_eq!(unparse_src("g(-(5j), 1+2j)"), "g(-5j, 1 + 2j)");
    }

    #[test]
    fn eval_follows_python_arithmetic() {
        assert_eq!(eval_src("2**3").repr(), "8");
        assert_eq!(eval_src("7 // -2").repr(), "-4");
        assert_eq!(eval_src("-7 % 3").repr(), "2");
        assert_eq!(eval_src("7.5 // 2").repr(), "3.0");
        assert_eq!(eval_src("2 ** -1").repr(), "0.5");
        assert_eq!(eval_src("'a' + 'b' * 2").repr(), "'abb'");
        assert_eq!(eval_src("1 / 4").repr(), "0.25");
        assert_eq!(
            eval_src("[1, 5 < 6, 0 or 'x', 2 if 0 else 3] + []").repr(),
            "[1, True, 'x', 3]"
        );
        assert!(eval_expr(&parse_eval("1 / 0").unwrap()).is_err());
    }

    #[test]
    fn rejects_what_python_rejects() {
        for bad in [
            "f(x=1, 2)",
            "f(**k, *a)",
            "[1, 2",
            "01",
            "f(True=1)",
            "a b",
            "'abc",
            "f(a.b=1)",
            "b'é'",
        ] {
            assert!(parse_eval(bad).is_err(), "{bad} should not parse");
        }
        for good in [
            "f(x for x in y)",
            "[a, *b]",
            "{**a, 'b': 1}",
            "lambda x, *a, k=1: x",
            "a[...]",
            "0_0",
            "(yield_ := 1)",
        ] {
            assert!(parse_eval(good).is_ok(), "{good} should parse");
        }
    }

    #[test]
    fn string_escapes() {
        let Expr::Const(PyValue::Str(s), _) = parse_eval(r#""a\tb\x41\u00e9\q\101""#).unwrap()
        else {
            panic!()
        };
        assert_eq!(s, "a\tbAé\\qA");
        let Expr::Const(PyValue::Str(s), _) = parse_eval(r#"r"a\"b""#).unwrap() else {
            panic!()
        };
        assert_eq!(s, "a\\\"b");
    }
}
