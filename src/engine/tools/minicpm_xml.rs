//! The MiniCPM-SALA / MiniCPM4.x syntax (SGLang's `minicpm4_xml`): each call one XML element,
//! string values as text (CDATA for multi-line ones), other values as JSON or Python literals.
//!
//! ```text
//! <function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>
//! ```

use super::{tools_block, CallSyntax, Function, Opener, Read, ToolCall, Tools};
use crate::engine::grammar::lark_json;
use serde_json::{Map, Value};

const CALL_OPEN: &str = "<function";
const CALL_CLOSE: &str = "</function>";
const PARAM_CLOSE: &str = "</param>";
const TOOL_SEP: &str = "<tool_sep>";
const CDATA_OPEN: &str = "<![CDATA[";
const CDATA_CLOSE: &str = "]]>";

pub struct MiniCpmXml;

impl CallSyntax for MiniCpmXml {
    fn openers(&self) -> &'static [Opener] {
        &[Opener { text: CALL_OPEN, at_start_only: false }]
    }

    fn grammar_opener(&self) -> Option<&'static str> {
        Some(CALL_OPEN)
    }

    fn read(&self, text: &str, tools: &Tools, ended: bool) -> Read {
        match text.find(CALL_CLOSE) {
            Some(close) => {
                let len = close + CALL_CLOSE.len();
                Read::Done { len, calls: parse(&text[..close], tools).map(|c| vec![c]) }
            }
            // Never closed: not a call.
            None if ended => Read::Done { len: text.len(), calls: None },
            None => Read::Incomplete,
        }
    }

    fn separator(&self, text: &str) -> usize {
        let mut at = 0;
        loop {
            let rest = &text[at..];
            let trimmed = rest.trim_start();
            at += rest.len() - trimmed.len();
            if trimmed.starts_with(TOOL_SEP) {
                at += TOOL_SEP.len();
            } else if trimmed.len() > 1 && TOOL_SEP.starts_with(trimmed) {
                // `<t…`: a `<tool_sep>` still coming (the splitter waits on an empty rest; a lone
                // `<` it waits on anyway, as the start of a call).
                return text.len();
            } else {
                return at;
            }
        }
    }

    fn tools_prompt(&self, tools: &[Value]) -> String {
        format!(
            "{}\n\nTool usage guidelines:\n\
             - When calling a function, return an XML object within <function ... </function> using:\n\
             <function name=\"function-name\"><param name=\"param-name\">param-value</param></function>\n\
             - Write a value that spans several lines or contains < or & as <![CDATA[value]]>, and a value \
             that is not a string as JSON.\n\
             - To call several functions, write one call per line.",
            tools_block(tools)
        )
    }

    fn render_call(&self, name: &str, arguments: &Value) -> String {
        let mut text = function_tag(name);
        for (key, value) in arguments.as_object().into_iter().flatten() {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            text.push_str(&format!("{}{}{PARAM_CLOSE}", param_tag(key), element_text(&value)));
        }
        text.push_str(CALL_CLOSE);
        text
    }

    fn grammar(&self, functions: &[&Function], parallel: bool) -> String {
        let mut rules = String::new();
        let mut calls = Vec::new();
        for (i, f) in functions.iter().enumerate() {
            let required = f.required();
            let mut params = String::new();
            for (j, key) in f.property_names().into_iter().enumerate() {
                let schema = f.property(key).cloned().unwrap_or(Value::Bool(true));
                let choices: Vec<String> =
                    schema.get("enum").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(|s| lark_literal(&element_text(s))).collect();
                let value_and_close = if !is_string(Some(&schema)) {
                    format!("{} {}", lark_json(&schema), lark_literal(PARAM_CLOSE))
                } else if choices.is_empty() {
                    "string_value".to_string()
                } else {
                    format!("({}) {}", choices.join(" | "), lark_literal(PARAM_CLOSE))
                };
                rules.push_str(&format!("param_{i}_{j}: {} {value_and_close}\n", lark_literal(&param_tag(key))));
                params.push_str(&format!(" param_{i}_{j}{}", if required.contains(&key) { "" } else { "?" }));
            }
            // What follows `<function`: calls may come after text (see `grammar_opener`).
            let opened = &function_tag(&f.name)[CALL_OPEN.len()..];
            rules.push_str(&format!("call_{i}: {}{params} {}\n", lark_literal(opened), lark_literal(CALL_CLOSE)));
            calls.push(format!("call_{i}"));
        }
        let more = if parallel { " (\"\\n\" call)*" } else { "" };
        // Text up to the first `</param>`, which ends it, and never a `</function>`, which would end the call.
        let string_value = r"string_value[lazy]: /(.|\n)*<\/param>/ & ~/(.|\n)*<\/function>(.|\n)*/";
        let open = lark_literal(CALL_OPEN);
        format!(
            "calls: {open} calls_opened\ncalls_opened: call_body{more}\ncall: {open} call_body\ncall_body: {}\n{rules}{string_value}\n",
            calls.join(" | ")
        )
    }
}

/// The call in a block (without its `</function>`), if it is one: an offered function, each
/// parameter named once, declared (when the function declares any), every required one given.
fn parse(block: &str, tools: &Tools) -> Option<ToolCall> {
    let (attributes, tag_len) = open_tag(block, "function")?;
    let name = attribute(&attributes, "name")?;
    let function = tools.get(name.trim())?;
    let declared = function.property_names();
    let mut arguments = Map::new();
    // Other text and tags (the legacy `<arguments>` wrapper) between parameters are ignored.
    let mut rest = &block[tag_len..];
    while let Some(at) = find_tag(rest, "param") {
        let (attributes, tag_len) = open_tag(&rest[at..], "param")?;
        let key = attribute(&attributes, "name").filter(|k| !k.is_empty())?;
        if (!declared.is_empty() && !declared.contains(&key.as_str())) || arguments.contains_key(&key) {
            return None;
        }
        let body = &rest[at + tag_len..];
        let end = body.find(PARAM_CLOSE)?;
        let value = typed(function.property(&key), value_text(&body[..end]));
        arguments.insert(key, value);
        rest = &body[end + PARAM_CLOSE.len()..];
    }
    if function.required().iter().any(|r| !arguments.contains_key(*r)) {
        return None;
    }
    Some(ToolCall { name: function.name.clone(), arguments: Value::Object(arguments).to_string() })
}

/// Where the next `<TAG` tag starts in `text` (not a longer name such as `<params`).
fn find_tag(text: &str, tag: &str) -> Option<usize> {
    let open = format!("<{tag}");
    let mut from = 0;
    while let Some(at) = text[from..].find(&open) {
        let after = from + at + open.len();
        if text[after..].starts_with(|c: char| c.is_whitespace() || c == '>' || c == '/') {
            return Some(from + at);
        }
        from = after;
    }
    None
}

/// The attributes (values decoded) of the opening tag `<TAG …>` that starts `text`, and the
/// tag's length; `None` when it is not one (a self-closing tag is not).
fn open_tag(text: &str, tag: &str) -> Option<(Vec<(String, String)>, usize)> {
    let mut rest = text.strip_prefix('<')?.strip_prefix(tag)?;
    if !rest.starts_with(|c: char| c.is_whitespace() || c == '>') {
        return None;
    }
    let mut attributes = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('>') {
            return Some((attributes, text.len() - after.len()));
        }
        let key_len = rest.find(|c: char| c == '=' || c.is_whitespace() || c == '>' || c == '/' || c == '"' || c == '\'')?;
        if key_len == 0 {
            return None;
        }
        let key = &rest[..key_len];
        let value = rest[key_len..].trim_start().strip_prefix('=')?.trim_start();
        let quote = value.chars().next().filter(|&c| c == '"' || c == '\'')?;
        let (inner, after) = value[1..].split_once(quote)?;
        attributes.push((key.to_string(), decode_entities(inner)));
        rest = after;
    }
}

fn attribute(attributes: &[(String, String)], key: &str) -> Option<String> {
    attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// A parameter's text: trimmed, then the inside of a CDATA section that is all of it, else
/// with XML's five entities decoded. A raw `<` or `&` stays (SGLang's `minicpm5` behaviour; its
/// `minicpm4_xml` rejects such a block by a bug).
fn value_text(raw: &str) -> String {
    let text = raw.trim();
    match text.strip_prefix(CDATA_OPEN).and_then(|t| t.strip_suffix(CDATA_CLOSE)) {
        Some(inner) if !inner.contains(CDATA_CLOSE) => inner.to_string(),
        _ => decode_entities(text),
    }
}

fn decode_entities(text: &str) -> String {
    const ENTITIES: [(&str, char); 5] = [("&lt;", '<'), ("&gt;", '>'), ("&amp;", '&'), ("&quot;", '"'), ("&apos;", '\'')];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let (decoded, len) = ENTITIES.iter().find(|(e, _)| rest.starts_with(e)).map_or(('&', 1), |(e, c)| (*c, e.len()));
        out.push(decoded);
        rest = &rest[len..];
    }
    out.push_str(rest);
    out
}

/// Whether a parameter's schema says exactly `"type": "string"`.
fn is_string(schema: Option<&Value>) -> bool {
    schema.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("string")
}

/// A parameter's value: a string parameter's text as it is; any other's as JSON, else as a
/// Python literal, else the text as a string.
fn typed(schema: Option<&Value>, text: String) -> Value {
    if is_string(schema) {
        return Value::String(text);
    }
    serde_json::from_str(&text)
        .ok()
        .or_else(|| text.parse::<py_literal::Value>().ok().as_ref().and_then(from_python))
        .unwrap_or(Value::String(text))
}

/// A Python literal as JSON, if it has one (no bytes, complex numbers, non-string dict keys,
/// integers beyond 64 bits, infinities or NaN).
fn from_python(value: &py_literal::Value) -> Option<Value> {
    use py_literal::Value as Py;
    Some(match value {
        Py::None => Value::Null,
        Py::Boolean(b) => Value::Bool(*b),
        Py::Integer(n) => i64::try_from(n).map(Value::from).or_else(|_| u64::try_from(n).map(Value::from)).ok()?,
        Py::Float(x) => Value::Number(serde_json::Number::from_f64(*x)?),
        Py::String(s) => Value::String(s.clone()),
        Py::List(items) | Py::Tuple(items) | Py::Set(items) => Value::Array(items.iter().map(from_python).collect::<Option<_>>()?),
        Py::Dict(pairs) => Value::Object(
            pairs
                .iter()
                .map(|(k, v)| match k {
                    Py::String(k) => Some((k.clone(), from_python(v)?)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        Py::Bytes(_) | Py::Complex(_) => return None,
    })
}

fn function_tag(name: &str) -> String {
    format!("<function name=\"{}\">", escape_markup(name))
}

fn param_tag(key: &str) -> String {
    format!("<param name=\"{}\">", escape_markup(key))
}

fn escape_markup(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `value` as a parameter's text that reads back unchanged: a CDATA section when it holds `<`,
/// `&`, a newline or whitespace at its ends; escaped when a CDATA section cannot hold it.
fn element_text(value: &str) -> String {
    if !value.contains(['<', '&', '\n']) && value.trim() == value {
        value.to_string()
    } else if ![CDATA_CLOSE, PARAM_CLOSE, CALL_CLOSE].iter().any(|end| value.contains(end)) {
        format!("{CDATA_OPEN}{value}{CDATA_CLOSE}")
    } else {
        escape_markup(value)
    }
}

/// `text` as a Lark string literal (JSON's escapes).
fn lark_literal(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{split, split_anywhere, weather_tools};
    use super::super::{CallSyntax, Read, ToolCall, ToolCallSplitter, ToolFormat, Tools};
    use super::MiniCpmXml;
    use crate::engine::grammar::tests::feed;
    use crate::engine::grammar::{Constraint, Grammar, GrammarCompiler, Reasoning};
    use serde_json::{json, Value};

    const XML: ToolFormat = ToolFormat::MiniCpmXml;

    /// SGLang's test tools, and one with an integer, an enum and a boolean.
    fn tools() -> Vec<Value> {
        let mut tools = weather_tools();
        tools.push(json!({"type": "function", "function": {"name": "set_config", "parameters": {"type": "object", "properties": {"config": {"type": "object"}}}}}));
        tools.push(json!({"type": "function", "function": {"name": "set_alarm", "parameters": {"type": "object", "properties": {
            "hour": {"type": "integer"}, "label": {"type": "string", "enum": ["work", "gym"]}, "loud": {"type": "boolean"}}, "required": ["hour"]}}}));
        tools
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }

    /// The calls in `text` read whole (the text left over, the calls).
    fn read_all(text: &str) -> (String, Vec<ToolCall>) {
        split(XML, &tools(), &[text])
    }

    #[test]
    fn a_call_between_text() {
        let text = "Intro before.\n<function name=\"get_weather\"><param name=\"city\">上海</param><param name=\"date\">2024-06-27</param></function>\nOutro after.\n";
        assert_eq!(read_all(text), ("Intro before.\nOutro after.\n".into(), vec![call("get_weather", r#"{"city":"上海","date":"2024-06-27"}"#)]));
    }

    #[test]
    fn cdata_keeps_its_newlines() {
        let text = "<function name=\"get_weather\"><param name=\"city\"><![CDATA[北\n京]]></param><param name=\"date\">2024-06-27</param></function>\n";
        assert_eq!(read_all(text).1, vec![call("get_weather", r#"{"city":"北\n京","date":"2024-06-27"}"#)]);
        // Around the section, whitespace goes; inside, it stays.
        let text = "<function name=\"get_weather\"><param name=\"city\">\n <![CDATA[ a < b ]]> \n</param></function>";
        assert_eq!(read_all(text).1, vec![call("get_weather", r#"{"city":" a < b "}"#)]);
    }

    #[test]
    fn values_are_typed_by_the_schema() {
        let text = "<function name=\"sum_values\"><param name=\"nums\">[1, 2, 3]</param><param name=\"exact\">true</param></function>";
        assert_eq!(read_all(text).1, vec![call("sum_values", r#"{"nums":[1,2,3],"exact":true}"#)]);
        // Python literals, then the raw text.
        let text = "<function name=\"sum_values\"><param name=\"nums\">(1, 2.5, None)</param><param name=\"exact\">True</param></function>";
        assert_eq!(read_all(text).1, vec![call("sum_values", r#"{"nums":[1,2.5,null],"exact":true}"#)]);
        let text = "<function name=\"set_config\"><param name=\"config\">{'a': 1, 'b': ['x', False]}</param></function>";
        assert_eq!(read_all(text).1, vec![call("set_config", r#"{"config":{"a":1,"b":["x",false]}}"#)]);
        let text = "<function name=\"set_alarm\"><param name=\"hour\">seven</param><param name=\"loud\">b'x'</param></function>";
        assert_eq!(read_all(text).1, vec![call("set_alarm", r#"{"hour":"seven","loud":"b'x'"}"#)]);
        // A string parameter keeps JSON-looking text as text.
        let text = "<function name=\"get_weather\"><param name=\"city\"> 42 </param></function>";
        assert_eq!(read_all(text).1, vec![call("get_weather", r#"{"city":"42"}"#)]);
    }

    #[test]
    fn entities_are_decoded_and_raw_markup_characters_accepted() {
        let text = "<function name=\"get_weather\"><param name=\"city\">&lt;b&gt; &amp; &quot;x&quot; &apos;y&apos; &copy; a < b && c</param></function>";
        assert_eq!(read_all(text).1, vec![call("get_weather", r#"{"city":"<b> & \"x\" 'y' &copy; a < b && c"}"#)]);
    }

    #[test]
    fn attributes_and_the_arguments_wrapper_are_read_leniently() {
        let text = "<function name='get_weather' id=\"1\">\n  <arguments>\n  <param name='city' lang=\"fr\">Paris</param>\n  </arguments>\n</function>";
        assert_eq!(read_all(text).1, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        assert_eq!(read_all("<function name=\"noop\"></function>\n"), (String::new(), vec![call("noop", "{}")]));
    }

    #[test]
    fn invalid_blocks_stay_text() {
        for bad in [
            "<function name=\"unknown\"><param name=\"x\">1</param></function>",
            "<function name=\"get_weather\"><param>北京</param><param name=\"date\">2024-06-27</param></function>",
            "<function name=\"get_weather\"><param name=\"city\">北京</param><param name=\"city\">上海</param></function>",
            "<function name=\"get_weather\"><param name=\"City\">北京</param></function>",
            "<function name=\"get_weather\"><param name=\"date\">2024-06-27</param></function>",
            "<function name=\"get_weather\"><param name=\"city\">北京</function>",
            "<function name=\"get_weather\"><param name=\"city\"/><param name=\"city\">北京</param></function>",
            "<functions name=\"noop\"></function>",
        ] {
            // The newline after it separates it from what follows, like a call's.
            assert_eq!(read_all(&format!("{bad}\n")), (bad.to_string(), vec![]), "{bad}");
        }
        let unterminated = "<function name=\"get_weather\"><param name=\"city\">北京</param>";
        assert_eq!(read_all(unterminated), (unterminated.into(), vec![]));
        assert_eq!(MiniCpmXml.read(unterminated, &Tools::new(&tools()), false), Read::Incomplete);
        assert_eq!(MiniCpmXml.read(unterminated, &Tools::new(&tools()), true), Read::Done { len: unterminated.len(), calls: None });
    }

    #[test]
    fn calls_among_text_and_separators() {
        let text = "Head\n<function name=\"get_weather\"><param name=\"city\">北京</param></function>\nTXT\n<function name=\"sum_values\"><param name=\"nums\">[7,8,9]</param><param name=\"exact\">false</param></function>\nTail\n";
        let want = vec![call("get_weather", r#"{"city":"北京"}"#), call("sum_values", r#"{"nums":[7,8,9],"exact":false}"#)];
        assert_eq!(read_all(text), ("Head\nTXT\nTail\n".into(), want));
        let text = "<function name=\"noop\"></function><tool_sep>\n<tool_sep><function name=\"noop\"></function>\n<tool_sep>";
        assert_eq!(read_all(text), (String::new(), vec![call("noop", "{}"), call("noop", "{}")]));
    }

    #[test]
    fn streams_in_pieces() {
        let mut s = ToolCallSplitter::new(XML, &tools());
        assert_eq!(s.push("Hello\n<function name=\"get_weather\">\n  <param name=\"city\">"), ("Hello".into(), vec![]));
        let (text, calls) = s.push("北京</param>\n  <param name=\"date\">2024-06-27</param>\n</function>\n");
        assert_eq!((text.as_str(), calls), ("", vec![call("get_weather", r#"{"city":"北京","date":"2024-06-27"}"#)]));
        assert_eq!(s.finish(), (String::new(), vec![]));
        let text = "Let me see.\n<function name=\"get_weather\"><param name=\"city\"><![CDATA[a\n<b>]]></param></function>\n<tool_sep><function name=\"set_alarm\"><param name=\"hour\">7</param></function>\nOK <tool";
        let want = vec![call("get_weather", r#"{"city":"a\n<b>"}"#), call("set_alarm", r#"{"hour":7}"#)];
        assert_eq!(split_anywhere(XML, &tools(), text), ("Let me see.\nOK <tool".into(), want));
    }

    #[test]
    fn rendered_calls_read_back() {
        let arguments = json!({"city": " <b>&\n ", "date": "x ]]> </param> y", "n": 1.5, "list": [1, "<"], "o": {"a": null}, "t": true, "plain": "Paris"});
        let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "date": {"type": "string"}, "n": {}, "list": {}, "o": {}, "t": {}, "plain": {"type": "string"}}}}})];
        let text = MiniCpmXml.render_call("f", &arguments);
        assert!(text.starts_with("<function name=\"f\"><param name=\"city\"><![CDATA[ <b>&\n ]]></param>"), "{text}");
        let (shown, calls) = split(XML, &tools, &[&text]);
        assert_eq!(shown, "");
        // `date` was escaped (a CDATA section cannot hold it), which keeps no edge whitespace.
        assert_eq!(serde_json::from_str::<Value>(&calls[0].arguments).unwrap(), arguments);
        assert_eq!(MiniCpmXml.render_call("noop", &json!({})), "<function name=\"noop\"></function>");
    }

    #[test]
    fn the_prompt_shows_the_syntax() {
        let prompt = MiniCpmXml.tools_prompt(&weather_tools());
        assert!(prompt.starts_with("# Tools\n") && prompt.contains("\"name\":\"get_weather\""), "{prompt}");
        assert!(prompt.contains("\n</tools>\n\nTool usage guidelines:\n"), "{prompt}");
        assert!(prompt.contains("<function name=\"function-name\"><param name=\"param-name\">param-value</param></function>"), "{prompt}");
    }

    /// A byte-level vocabulary of every printable ASCII character, as tokenizer.json.
    fn toy_tokenizer() -> Value {
        let mut vocab = serde_json::Map::new();
        let pieces = (0x21u8..0x7f).map(|b| (b as char).to_string()).chain(["Ġ", "Ċ", "<function", "<param", "</param>"].map(String::from));
        for (i, p) in pieces.enumerate() {
            vocab.insert(p, json!(i));
        }
        let n = vocab.len();
        json!({
            "added_tokens": [{"id": n, "content": "<eos>", "special": true}],
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        })
    }

    /// A constraint for calls to `tools` (only `only`, when named) under the format's grammar.
    fn constraint(tools: &[Value], only: Option<&str>, parallel: bool) -> (Constraint, Value) {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let rules = XML.calls_grammar(tools, only, parallel);
        (compiler.compile(&Grammar::Lark(format!("start: calls\n{rules}")), Reasoning::Off).unwrap(), tok)
    }

    #[test]
    fn the_grammar_allows_what_reads_as_a_call() {
        let tools = tools();
        let good = [
            MiniCpmXml.render_call("get_weather", &json!({"city": "a < b\n</para", "date": "today"})),
            // JSON as the grammar lays it out (`render_call` writes it compact).
            "<function name=\"sum_values\"><param name=\"nums\">[1, 2.5]</param><param name=\"exact\">false</param></function>".to_string(),
            MiniCpmXml.render_call("set_alarm", &json!({"hour": 7, "label": "gym"})),
            MiniCpmXml.render_call("noop", &json!({})),
        ];
        for text in &good {
            assert_eq!(read_all(text).1.len(), 1, "{text}");
            let (mut c, tok) = constraint(&tools, None, false);
            feed(&mut c, &tok, text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(c.is_complete(), "{text}");
        }
        let (mut c, tok) = constraint(&tools, None, true);
        feed(&mut c, &tok, &good.join("\n")).unwrap();
        assert!(c.is_complete());
        let (mut c, tok) = constraint(&tools, Some("sum_values"), false);
        assert!(feed(&mut c, &tok, &good[0]).unwrap_err().contains("refused"), "only the named function");
        let (mut c, tok) = constraint(&tools, None, false);
        feed(&mut c, &tok, &good[3]).unwrap();
        assert!(feed(&mut c, &tok, "\n").is_err(), "one call without parallel");
    }

    #[test]
    fn the_grammar_refuses_what_is_no_call() {
        for bad in [
            "<function name=\"get_weather\"><param name=\"country\">",
            "<function name=\"get_weather\"><param name=\"date\">",
            "<function name=\"get_weather\"></function>",
            "<function name=\"set_alarm\"><param name=\"hour\">7</param><param name=\"label\">home",
            "<function name=\"set_alarm\"><param name=\"hour\">seven",
            "<function name=\"get_weather\"><param name=\"city\">a</function>",
            "<function name=\"rm\">",
        ] {
            let (mut c, tok) = constraint(&tools(), None, true);
            let refused = feed(&mut c, &tok, bad).unwrap_err();
            assert!(refused.contains("refused"), "{bad}: {refused}");
        }
    }
}
