//! The MiniCPM-SALA / MiniCPM4.x syntax (SGLang's `minicpm4_xml`): each call one XML element,
//! string values as text (CDATA for multi-line ones), other values as JSON or Python literals.
//!
//! ```text
//! <function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>
//! ```

use super::{tools_block, CallSyntax, Function, Opener, Read, ToolCall, Tools};
use crate::engine::grammar::lark_json;
use regex_syntax::hir::{Dot, Hir, HirKind, Look, Repetition};
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
                let choices: Vec<String> = match (schema.get("enum"), schema.get("const")) {
                    (Some(Value::Array(values)), _) => values.iter().filter_map(Value::as_str).map(|s| lark_literal(&element_text(s))).collect(),
                    (_, Some(Value::String(value))) => vec![lark_literal(&element_text(value))],
                    _ => Vec::new(),
                };
                let constraints = string_constraints(&schema);
                let value_and_close = if !is_string(Some(&schema)) || constraints.is_none() {
                    // A format llguidance does not know is refused by it, with its message.
                    format!("{} {}", lark_json(&schema), lark_literal(PARAM_CLOSE))
                } else if choices.is_empty() {
                    let name = format!("value_{i}_{j}");
                    rules.push_str(&string_value_rules(&name, &constraints.unwrap_or_default()));
                    name
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
        let open = lark_literal(CALL_OPEN);
        format!(
            "calls: {open} calls_opened\ncalls_opened: call_body{more}\ncall: {open} call_body\ncall_body: {}\n{rules}",
            calls.join(" | ")
        )
    }
}

/// Lark rules `NAME`: a string parameter's text and its `</param>`, such that the text reads back
/// (see `value_text`) as a string valid under `schema` (`minLength`, `maxLength`, `pattern`,
/// `format`). Either plain text, which reads back as it is (no entity, no whitespace at its
/// ends, not a CDATA section), or a CDATA section; neither holds a `</param>` or `</function>`
/// before its end, so the first `</param>` ends the value and it can always end.
fn string_value_rules(name: &str, constraints: &[String]) -> String {
    let any = "(?s:.*)";
    let close = r"<\/param>";
    let mut plain = vec![format!("/{any}{close}/")];
    let mut cdata = vec![format!(r"/<!\[CDATA\[{any}\]\]>{close}/")];
    for c in constraints {
        plain.push(format!("/(?:{c}){close}/"));
        cdata.push(format!(r"/<!\[CDATA\[(?:{c})\]\]>{close}/"));
    }
    let markup = [format!("~/{any}{close}(?s:.+)/"), format!(r"~/{any}<\/function>{any}/")];
    plain.extend(markup.iter().cloned());
    plain.extend([format!(r"~/\s{any}/"), format!(r"~/{any}\s{close}/"), format!("~/{any}&(?:lt|gt|amp|quot|apos);{any}/"), format!(r"~/<!\[CDATA\[{any}/")]);
    cdata.extend(markup.iter().cloned());
    cdata.push(format!(r"~/<!\[CDATA\[{any}\]\]>{any}\]\]>{close}/"));
    format!("{name}: {name}_plain | {name}_cdata\n{name}_plain[lazy]: {}\n{name}_cdata[lazy]: {}\n", plain.join(" & "), cdata.join(" & "))
}

/// Regexes (Lark syntax, whole-match) a string under `schema` must each match; `None` for a
/// `format` llguidance does not know.
fn string_constraints(schema: &Value) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    match schema.get("maxLength").and_then(Value::as_u64) {
        Some(max) => out.push(format!("(?s:.{{{min},{max}}})")),
        None if min > 0 => out.push(format!("(?s:.{{{min},}})")),
        None => {}
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        out.push(search_regex(pattern));
    }
    if let Some(format) = schema.get("format").and_then(Value::as_str) {
        if let Some(rx) = format_regex(format)? {
            out.push(llguidance::regex_to_lark(&rx, ""));
        }
    }
    Some(out)
}

/// A JSON Schema `pattern` (ECMA-262: found anywhere in the string unless anchored, `\d` and
/// `\w` ASCII) as a whole-match regex, its `^` and `$` dropped where they anchor it.
fn search_regex(pattern: &str) -> String {
    let lark = llguidance::regex_to_lark(pattern, "dw");
    match regex_syntax::parse(&lark) {
        Ok(hir) => llguidance::regex_to_lark(&searched(hir).to_string(), ""),
        // One that does not parse is passed on as it is, for llguidance to name its fault.
        Err(_) => lark,
    }
}

/// What matches a whole text holding `hir` (each alternative anchored as it says).
fn searched(hir: Hir) -> Hir {
    if let HirKind::Alternation(branches) = hir.kind() {
        return Hir::alternation(branches.iter().cloned().map(searched).collect());
    }
    let any = || Hir::repetition(Repetition { min: 0, max: None, greedy: true, sub: Box::new(Hir::dot(Dot::AnyChar)) });
    let (hir, start) = match strip_look(&hir, Look::Start) {
        Some(rest) => (rest, true),
        None => (hir, false),
    };
    let (hir, end) = match strip_look(&hir, Look::End) {
        Some(rest) => (rest, true),
        None => (hir, false),
    };
    let mut parts = Vec::new();
    if !start {
        parts.push(any());
    }
    parts.push(hir);
    if !end {
        parts.push(any());
    }
    Hir::concat(parts)
}

/// `hir` without the `look` (`^` or `$`) it always starts (ends) with, if it has one.
fn strip_look(hir: &Hir, look: Look) -> Option<Hir> {
    match hir.kind() {
        HirKind::Look(l) if *l == look => Some(Hir::empty()),
        HirKind::Capture(capture) => strip_look(&capture.sub, look),
        HirKind::Concat(parts) if !parts.is_empty() => {
            let mut parts = parts.clone();
            let at = if look == Look::Start { 0 } else { parts.len() - 1 };
            parts[at] = strip_look(&parts[at], look)?;
            Some(Hir::concat(parts))
        }
        _ => None,
    }
}

/// The regex of a JSON Schema `format` llguidance knows (`Some(None)`: any string), written
/// from the RFCs that define them (3339 dates and times, 5321 mailboxes, 1123 host names, 4291
/// IPv6, 4122 UUIDs, 3986 URIs); `None` for a format it does not know.
fn format_regex(format: &str) -> Option<Option<String>> {
    const DATE: &str = "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))";
    const TIME: &str = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)(?:\\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    const LABEL: &str = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const OCTET: &str = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
    const HEX: &str = "[0-9a-fA-F]{1,4}";
    let host = format!("{LABEL}(?:\\.{LABEL})*");
    Some(Some(match format {
        "date" => DATE.to_string(),
        "time" => TIME.to_string(),
        "date-time" => format!("{DATE}[tT]{TIME}"),
        "duration" => {
            let date = "(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)";
            let time = "T(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)";
            format!("P(?:[0-9]+W|{date}(?:{time})?|{time})")
        }
        "email" => {
            let atom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
            format!("{atom}(?:\\.{atom})*@{host}")
        }
        "hostname" => host,
        "ipv4" => format!("{OCTET}(?:\\.{OCTET}){{3}}"),
        "ipv6" => {
            // Eight groups, or `::` standing for one or more: `left` groups before it, at most `7 - left` after.
            let groups = |n: usize| if n == 0 { String::new() } else { format!("{HEX}(?::{HEX}){{0,{}}}", n - 1) };
            let mut forms = vec![format!("(?:{HEX}:){{7}}{HEX}")];
            for left in 0..=7usize {
                let before = if left == 0 { String::new() } else { format!("{HEX}(?::{HEX}){{{}}}", left - 1) };
                let after = if left == 7 { String::new() } else { format!("(?:{})?", groups(7 - left)) };
                forms.push(format!("{before}::{after}"));
            }
            format!("(?:{})", forms.join("|"))
        }
        "uuid" => "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}".to_string(),
        "uri" => "[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~!$&'()*+,;=:@/?#\\[\\]-]|%[0-9A-Fa-f]{2})*".to_string(),
        "unknown" => return Some(None),
        _ => return None,
    }))
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
    use super::super::tests::toy_tokenizer;
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

    /// A constraint for calls to `tools` (only `only`, when named) under the format's grammar.
    fn constraint(tools: &[Value], only: Option<&str>, parallel: bool) -> (Constraint, Value) {
        super::super::tests::constraint(XML, tools, only, parallel)
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

    /// A tool whose parameters carry every constraint a value can have.
    fn bounded_tools() -> Vec<Value> {
        vec![json!({"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 2, "maxLength": 5},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
            "ref": {"type": "string", "pattern": "[0-9]+"},
            "day": {"type": "string", "format": "date"},
            "seats": {"type": "integer", "minimum": 1, "maximum": 9},
            "class": {"type": "string", "enum": ["eco", "biz"]},
            "meta": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            "required": ["city"]}}})]
    }

    /// Whether the grammar for `tools` takes `text` as a whole call; it must also read back.
    fn takes(tools: &[Value], text: &str) -> bool {
        let (mut c, tok) = constraint(tools, None, false);
        feed(&mut c, &tok, text).is_ok() && c.is_complete()
    }

    /// A string value was free text to `max_tokens`: now it honours `minLength`, `maxLength`,
    /// `pattern` (anchored or not) and `format`, other values their JSON schema (bounds, strict
    /// objects), and what the grammar takes reads back as the same valid call.
    #[test]
    fn values_honour_their_schema_inside_the_xml() {
        let tools = bounded_tools();
        let call = |params: &str| format!("<function name=\"book\">{params}</function>");
        let good = [
            (call("<param name=\"city\">Oslo</param>"), json!({"city": "Oslo"})),
            (call("<param name=\"city\"><![CDATA[ a<b ]]></param><param name=\"ref\">ab12cd</param>"), json!({"city": " a<b ", "ref": "ab12cd"})),
            (
                call("<param name=\"city\">Rome</param><param name=\"code\">FCO</param><param name=\"day\">2024-02-29</param><param name=\"seats\">9</param><param name=\"class\">biz</param><param name=\"meta\">{\"a\": 1}</param>"),
                json!({"city": "Rome", "code": "FCO", "day": "2024-02-29", "seats": 9, "class": "biz", "meta": {"a": 1}}),
            ),
        ];
        for (text, arguments) in &good {
            assert!(takes(&tools, text), "{text}");
            let calls = split(XML, &tools, &[text]).1;
            assert_eq!(serde_json::from_str::<Value>(&calls[0].arguments).unwrap(), *arguments, "{text}");
        }
        for bad in [
            "<param name=\"city\">Lisbon</param>",
            "<param name=\"city\">X</param>",
            "<param name=\"city\"> Oslo</param>",
            "<param name=\"city\">Oslo </param>",
            "<param name=\"city\">a&lt;b</param>",
            "<param name=\"city\">Oslo</param><param name=\"code\">FCOX</param>",
            "<param name=\"city\">Oslo</param><param name=\"code\">fco</param>",
            "<param name=\"city\">Oslo</param><param name=\"ref\">abc</param>",
            "<param name=\"city\">Oslo</param><param name=\"day\">2024-13-01</param>",
            "<param name=\"city\">Oslo</param><param name=\"seats\">10</param>",
            "<param name=\"city\">Oslo</param><param name=\"class\">first</param>",
            "<param name=\"city\">Oslo</param><param name=\"meta\">{\"a\": 1, \"b\": 2}</param>",
        ] {
            assert!(!takes(&tools, &call(bad)), "{bad}");
        }
        // At `maxLength` only the closing tag may follow; without one, it always may.
        let (mut c, tok) = constraint(&tools, None, false);
        feed(&mut c, &tok, "<function name=\"book\"><param name=\"city\">Paris").unwrap();
        let mask = c.mask().unwrap();
        assert!(mask.allows(tok["model"]["vocab"]["</param>"].as_u64().unwrap() as u32) && !mask.allows(tok["model"]["vocab"]["s"].as_u64().unwrap() as u32));
        let (mut c, tok) = constraint(&self::tools(), None, false);
        feed(&mut c, &tok, "<function name=\"get_weather\"><param name=\"city\">a long way, &c. <b></b>").unwrap();
        assert!(c.mask().unwrap().allows(tok["model"]["vocab"]["</param>"].as_u64().unwrap() as u32));
    }

    #[test]
    fn a_format_llguidance_does_not_know_is_refused_by_name() {
        let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "format": "zipcode"}}}}})];
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let Err(e) = compiler.compile(&Grammar::Lark(format!("start: calls\n{}", XML.calls_grammar(&tools, None, false))), Reasoning::Off) else { panic!("compiled") };
        assert!(e.to_string().contains("zipcode"), "{e}");
        // Every format it knows compiles, and its examples are taken.
        for (format, value) in [("date-time", "2024-06-27T10:00:00Z"), ("time", "23:59:60.5+01:00"), ("duration", "P1Y2M3DT4H"), ("email", "a.b@c-d.org"),
            ("hostname", "a.example"), ("ipv4", "192.168.0.255"), ("ipv6", "fe80::1:2"), ("uuid", "123e4567-e89b-12d3-a456-426614174000"),
            ("uri", "https://x.org/a?b=c#d"), ("unknown", "anything")] {
            let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "format": format}}}}})];
            assert!(takes(&tools, &format!("<function name=\"f\"><param name=\"x\">{value}</param></function>")), "{format}");
        }
        let ipv6 = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "format": "ipv6"}}}}})];
        for bad in ["1:2:3:4:5:6:7:8:9", "1::2::3", "1:2:3:4:5:6:7::8"] {
            assert!(!takes(&ipv6, &format!("<function name=\"f\"><param name=\"x\">{bad}</param></function>")), "{bad}");
        }
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
