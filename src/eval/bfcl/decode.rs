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
//! * Java / JavaScript: the text between the added brackets is parsed with
//!   tree-sitter, as BFCL does (same grammars, same C runtime); a tree with
//!   an `ERROR` node fails, otherwise the **first** call found is kept,
//!   every argument value being a string of source text (see
//!   [`decode_java`], [`decode_js`]).
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
use tree_sitter::{Node, Parser, Tree};

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

// ---------------------------------------------------------------- Java and JavaScript

/// BFCL's decoders give up on a tree whose S-expression mentions `ERROR`.
/// That is not tree-sitter's `has_error`, which counts `MISSING` nodes too
/// (a `;` or `)` that error recovery inserted): those pass, and most Java
/// replies have one, a call without its `;`.  The runtime is pinned to the
/// C core that BFCL's Python binding bundles, so trees and error recovery
/// are the same.
fn parse_checked(
    source: &str,
    language: &tree_sitter::Language,
    what: &str,
) -> Result<Tree, DecodeError> {
    let mut parser = Parser::new();
    parser
        .set_language(language)
        .map_err(|e| DecodeError::Failed(format!("{what} grammar: {e}")))?;
    let tree = parser
        .parse(source, None)
        .ok_or_else(|| DecodeError::Failed(format!("{what}: parse cancelled")))?;
    if tree.root_node().to_sexp().contains("ERROR") {
        return Err(DecodeError::Failed(format!(
            "Error parsing the {what} source code."
        )));
    }
    Ok(tree)
}

fn children(node: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = node.walk();
    node.children(&mut cursor).collect()
}

/// Python's `node.children[i]`: every child counts (anonymous tokens and
/// comments too); an absent one raises.
fn child_at<'t>(node: Node<'t>, i: usize) -> Result<Node<'t>, DecodeError> {
    node.child(i)
        .ok_or_else(|| DecodeError::Failed(format!("{} has no child {}", node.kind(), i)))
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

/// BFCL's Java decoder is recursive Python: past the interpreter's
/// recursion limit it raises `RecursionError`, a decode failure.  Ours
/// counts the frames that Python would hold (see `Java`) and fails where it
/// does; that also keeps our own recursion well within the stack.
const PY_RECURSION_LIMIT: usize = 1000;

/// Frames under the decoder when `tests/reference/bfcl_official_check.py`
/// calls it (module, `main`, `check_line`, `default_decode_ast_prompting`,
/// `ast_parse`, `parse_java_function_call`): with it, replies nested a few
/// hundred levels deep fail exactly where they fail there.  BFCL's own
/// runner calls it from deeper in its stack, so gives up a few levels sooner.
const PY_BASE_FRAMES: usize = 6;

/// Python 3.11 counts a frame for each call to `traverse`,
/// `extract_arguments`, `traverse_node` and `get_text`; where `traverse_node`
/// joins its children's renderings the generator and the C-level `join`
/// count too (three a level, one where it recurses directly).
fn enter(frames: usize) -> Result<usize, DecodeError> {
    if frames > PY_RECURSION_LIMIT {
        Err(DecodeError::Failed(
            "maximum recursion depth exceeded".into(),
        ))
    } else {
        Ok(frames)
    }
}

struct Java {
    /// BFCL slices the Python *string* with the node's *byte* offsets, so
    /// after a non-ASCII character its texts are shifted; done the same
    /// way here (code points indexed by byte offsets, clamped like a slice).
    chars: Vec<char>,
}

impl Java {
    /// `get_text`, called from a frame at depth `caller`.
    fn text(&self, node: Node, caller: usize) -> Result<String, DecodeError> {
        enter(caller + 1)?;
        let len = self.chars.len();
        let (start, end) = (node.start_byte().min(len), node.end_byte().min(len));
        Ok(self.chars[start..end.max(start)].iter().collect())
    }

    /// An argument value as BFCL renders it (`traverse_node`, its frame at
    /// depth `frames`).  At the top (`nested` false) a string or char
    /// literal loses its first and last character.  Names, class literals
    /// and method calls are their source text; `new T[]...` is `new T[]` +
    /// its initializer (dimensions dropped, and no initializer raises);
    /// `new T(a, b)` is rebuilt from its type and arguments (an anonymous
    /// class body dropped); any other node is its children's renderings
    /// joined without spaces, a leaf its text.
    fn value(
        &self,
        node: Option<Node>,
        nested: bool,
        frames: usize,
    ) -> Result<String, DecodeError> {
        enter(frames)?;
        // BFCL reads a field that may be absent (`new int[3]` has no `value`)
        // and fails on the `None`.
        let node = node.ok_or_else(|| {
            DecodeError::Failed("'NoneType' object has no attribute 'type'".into())
        })?;
        match node.kind() {
            "string_literal" | "character_literal" => {
                let text = self.text(node, frames)?;
                Ok(if nested { text } else { strip_ends(&text) })
            }
            "identifier" | "class_literal" | "type_identifier" | "method_invocation" => {
                self.text(node, frames)
            }
            "array_creation_expression" => {
                let type_text = self.value(node.child_by_field_name("type"), true, frames + 1)?;
                let init = self.value(node.child_by_field_name("value"), true, frames + 1)?;
                Ok(format!("new {type_text}[]{init}"))
            }
            "object_creation_expression" => {
                let type_text = self.value(node.child_by_field_name("type"), true, frames + 1)?;
                let Some(arguments) = node.child_by_field_name("arguments") else {
                    return Ok(format!("new {type_text}()"));
                };
                let mut parts = Vec::new();
                for child in children(arguments) {
                    if !matches!(child.kind(), "," | "(" | ")") {
                        parts.push(self.value(Some(child), true, frames + 1)?);
                    }
                }
                Ok(format!("new {type_text}({})", parts.join(", ")))
            }
            _ if node.child_count() > 0 => children(node)
                .into_iter()
                .map(|child| self.value(Some(child), true, frames + 3))
                .collect(),
            _ => self.text(node, frames),
        }
    }

    /// The first method invocation in document order (outermost first)
    /// that has an argument list, with the depth of its `traverse` frame.
    fn first_call<'t>(
        &self,
        node: Node<'t>,
        frames: usize,
    ) -> Result<Option<(Node<'t>, usize)>, DecodeError> {
        enter(frames)?;
        if node.kind() == "method_invocation" {
            return Ok(node
                .child_by_field_name("arguments")
                .is_some()
                .then_some((node, frames)));
        }
        for child in children(node) {
            if let Some(found) = self.first_call(child, frames + 1)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

/// BFCL's Java decoder (`parse_java_function_call`, tree-sitter-java
/// 0.21.0): a tree with an `ERROR` node fails; otherwise the first method
/// invocation found is the call, named `object.name` (source texts) or
/// just `name`.  Its arguments: `left = right` (any assignment operator,
/// `left` as source text) gives `left: value` with the value rendered by
/// BFCL's rules (see `Java::value`); a bare identifier or class literal goes
/// under a `None` name; other arguments are dropped; a repeated name fails.
/// No call at all is "wrong format" (BFCL returns `{}`).
pub fn decode_java(source: &str) -> Result<Vec<Call>, DecodeError> {
    // The walk recurses as deep as the reply nests, up to Python's limit of
    // a thousand levels: it runs on a thread with the stack for that,
    // whatever the caller's.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("bfcl-java-decoder".into())
            .stack_size(64 << 20)
            .spawn_scoped(scope, || walk_java(source))
            .map_err(|e| DecodeError::Failed(format!("cannot start the decoder thread: {e}")))?
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

fn walk_java(source: &str) -> Result<Vec<Call>, DecodeError> {
    let tree = parse_checked(source, &tree_sitter_java::language(), "java")?;
    let java = Java {
        chars: source.chars().collect(),
    };
    let Some((call, frames)) = java.first_call(tree.root_node(), PY_BASE_FRAMES + 1)? else {
        return Err(DecodeError::WrongFormat(
            "no method invocation found".into(),
        ));
    };
    let name = call
        .child_by_field_name("name")
        .ok_or_else(|| DecodeError::Failed("method invocation without a name".into()))?;
    let name = match call.child_by_field_name("object") {
        Some(object) => format!(
            "{}.{}",
            java.text(object, frames)?,
            java.text(name, frames)?
        ),
        None => java.text(name, frames)?,
    };
    let arguments = call
        .child_by_field_name("arguments")
        .expect("first_call checked");
    // `extract_arguments`, called from the `traverse` frame.
    let frames = enter(frames + 1)?;
    let mut args = Vec::new();
    for child in children(arguments) {
        match child.kind() {
            "assignment_expression" => {
                let key = java.text(child_at(child, 0)?, frames)?;
                let value = java.value(Some(child_at(child, 2)?), false, frames + 1)?;
                insert_unique(&mut args, Some(key), value)?;
            }
            // (BFCL also names a node type `set` here, which Java has not.)
            "identifier" | "class_literal" => {
                insert_unique(&mut args, None, java.value(Some(child), false, frames + 1)?)?
            }
            _ => {}
        }
    }
    Ok(vec![Call { name, args }])
}

/// BFCL's JavaScript decoder (`parse_javascript_function_call`,
/// tree-sitter-javascript 0.21.4): a tree with an `ERROR` node fails;
/// otherwise the first top-level expression statement that is a call
/// expression gives the call: its name is the source text of the callee
/// (the call's first child), its arguments come from its second child:
/// `left = right` gives `left: source text of right` (one pair of matching
/// outer quotes stripped), a bare identifier or `true` goes under a `None`
/// name; other arguments are dropped; a repeated name fails.  No such
/// statement (also `f(a=1), g(b=2)`, one sequence expression) is "wrong
/// format" (BFCL returns `None`).
pub fn decode_js(source: &str) -> Result<Vec<Call>, DecodeError> {
    let tree = parse_checked(source, &tree_sitter_javascript::LANGUAGE.into(), "js")?;
    let text = |node: Node| -> Result<String, DecodeError> {
        node.utf8_text(source.as_bytes())
            .map(str::to_string)
            .map_err(|e| DecodeError::Failed(e.to_string()))
    };
    for statement in children(tree.root_node()) {
        if statement.kind() != "expression_statement" {
            continue;
        }
        for call in children(statement) {
            if call.kind() != "call_expression" {
                continue;
            }
            let name = text(child_at(call, 0)?)?;
            let mut args = Vec::new();
            for child in children(child_at(call, 1)?) {
                match child.kind() {
                    "assignment_expression" => {
                        let key = text(child_at(child, 0)?)?;
                        let mut value = text(child_at(child, 2)?)?;
                        let quoted = |q: char| value.starts_with(q) && value.ends_with(q);
                        if quoted('"') || quoted('\'') {
                            value = strip_ends(&value);
                        }
                        insert_unique(&mut args, Some(key), value)?;
                    }
                    "identifier" | "true" => insert_unique(&mut args, None, text(child)?)?,
                    _ => {}
                }
            }
            return Ok(vec![Call { name, args }]);
        }
    }
    Err(DecodeError::WrongFormat(
        "no call expression statement".into(),
    ))
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
        // tree-sitter's error recovery: a lone short call without `;` is an
        // ERROR node, a longer one gets a MISSING `;` and passes.
        assert!(matches!(
            decode_prompt("[A.b(x=1)]", Language::Java),
            Err(DecodeError::Failed(_))
        ));
        let java = |text: &str| calls_to_json(&decode_prompt(text, Language::Java).unwrap());
        assert_eq!(
            java("[A.b(x=1, y=2)]"),
            json!([{"A.b": {"x": "1", "y": "2"}}])
        );
        // Children are counted as BFCL counts them: a comment is one.
        assert_eq!(
            java("[A.b(x /* c */ = 1, y = 2)]"),
            json!([{"A.b": {"x": "=", "y": "2"}}])
        );
        // Byte offsets into a string of code points: after `ã` every text
        // is one character late, as in BFCL.
        // BFCL's recursion runs out: 329 nested parentheses decode, 330 fail
        // (three Python frames a level); `new F(...)` costs one a level.
        let nested = |open: &str, close: &str, n: usize| {
            let value = format!("{}1{}", open.repeat(n), close.repeat(n));
            decode_prompt(&format!("[A.b(x={value}, y=2)]"), Language::Java)
        };
        assert!(nested("(", ")", 329).is_ok());
        assert!(matches!(nested("(", ")", 330), Err(DecodeError::Failed(_))));
        assert!(nested("new F(", ")", 988).is_ok());
        assert!(matches!(
            nested("new F(", ")", 989),
            Err(DecodeError::Failed(_))
        ));
        assert_eq!(
            java(r#"[A.b(x="São Paulo", y="abc")]"#),
            json!([{"A.b": {"x": "São Paulo\"", "=": "bc\""}}])
        );
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
        // JavaScript texts are byte-exact; a comment shifts the children.
        assert_eq!(
            calls_to_json(
                &decode_prompt("[f(x /* c */ = 1, y='é')]", Language::JavaScript).unwrap()
            ),
            json!([{"f": {"x": "=", "y": "é"}}])
        );
        assert!(matches!(
            decode_prompt("[f?.(x=1)]", Language::JavaScript).as_deref(),
            Ok([Call { args, .. }]) if args.is_empty()
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
