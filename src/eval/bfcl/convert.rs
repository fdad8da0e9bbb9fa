//! BFCL's Java and JavaScript type converters.
//!
//! In Java/JavaScript categories every decoded argument is a string of
//! source text.  Before type-checking, BFCL's checker converts it according
//! to the parameter's declared type with a handful of regular expressions;
//! when the text does not match, the string is kept unchanged (and the type
//! check usually fails, unless the ground truth itself is a string — a
//! "variable").  The rules, all reproduced here:
//! * Java integer types `^-?\d+$`; `float` needs an `f`/`F` suffix, `double`
//!   must not have one; `long` needs `l`/`L`; `boolean` is `true`/`false`;
//!   `char` never converts (its pattern `^\'.$\'` cannot match); arrays are
//!   `new T[]{a, b}`, ArrayLists `new ArrayList<>(Arrays.asList(a, b))` or
//!   `{{ add(a); }}` bodies, HashMaps `new HashMap<..>() {{ put("k", v); }}`;
//!   elements split on `,` with no regard for quoting.
//! * JavaScript `String` strips one pair of quotes; `integer` `^-?\d+$`;
//!   `float` `^-?\d+(\.\d+)?$`; `Bigint` `^-?\d+n$`; `Boolean`; `array`
//!   `[a, b]` (one- or two-dimensional) or `new Array(a, b)`; `dict` `{k: v}`
//!   up to the first `}`.
//!
//! Python's `$` also matches before a final newline; the patterns here
//! allow that.  Python's `\d` and `int()` accept any Unicode decimal digit;
//! here only ASCII digits convert.

use std::sync::OnceLock;

use regex::Regex;

use super::value::{py_float_from_str, py_int_from_str, py_strip, PyValue};

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("valid converter pattern"))
}

macro_rules! pattern {
    ($name:ident, $re:expr) => {
        fn $name() -> &'static Regex {
            static CELL: OnceLock<Regex> = OnceLock::new();
            regex(&CELL, $re)
        }
    };
}

pattern!(re_int, r"^-?[0-9]+\n?$");
pattern!(
    re_java_float,
    r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?[fF]\n?$"
);
pattern!(
    re_java_double,
    r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?\n?$"
);
pattern!(re_java_long, r"^-?[0-9]+[lL]\n?$");
pattern!(re_java_array, r"new\s+\w+\[\]\s*\{(.*?)\}");
pattern!(
    re_arraylist_aslist,
    r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)"
);
pattern!(
    re_arraylist_add,
    r"(?s)new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}"
);
pattern!(re_add_item, r"add\((.+?)\)");
pattern!(re_arraylist_empty, r"new\s+ArrayList<\w*>\(\)");
pattern!(
    re_hashmap,
    r"(?s)new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}"
);
pattern!(re_put_item, r#"put\("(.*?)",\s*(.*?)\)"#);
pattern!(re_hashmap_empty, r"new\s+HashMap<.*?>\s*\(\)");
pattern!(re_js_float, r"^-?[0-9]+(\.[0-9]+)?\n?$");
pattern!(re_js_bigint, r"^-?[0-9]+n\n?$");
pattern!(
    re_js_array_2d,
    r"^(?:\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\))"
);
pattern!(re_js_array, r"^(?:\[(.*?)\]|\bnew\s+Array\((.*?)\))");
pattern!(re_js_inner_array, r"\[(.*?)\]");
pattern!(re_js_dict, r"^\{(.*?)\}");

/// The text without the one trailing newline Python's `$` tolerates.
fn without_final_newline(s: &str) -> &str {
    s.strip_suffix('\n').unwrap_or(s)
}

fn int_or_str(value: &str, digits: &str) -> PyValue {
    py_int_from_str(digits).map_or_else(|| PyValue::Str(value.to_string()), PyValue::Int)
}

fn float_or_str(value: &str, text: &str) -> PyValue {
    py_float_from_str(text).map_or_else(|| PyValue::Str(value.to_string()), PyValue::Float)
}

/// Python `s.strip(chars)`.
fn strip_chars<'a>(s: &'a str, chars: &[char]) -> &'a str {
    s.trim_matches(|c| chars.contains(&c))
}

/// Python `s[1:-1]`.
fn strip_ends(s: &str) -> String {
    let n = s.chars().count();
    s.chars().skip(1).take(n.saturating_sub(2)).collect()
}

/// BFCL's `java_type_converter(value, expected_type, nested_type)`.
/// `Err` where BFCL raises (types it does not implement).
pub fn java_convert(
    value: &str,
    expected_type: &str,
    nested_type: Option<&str>,
) -> Result<PyValue, String> {
    let keep = || Ok(PyValue::Str(value.to_string()));
    match expected_type {
        "byte" | "short" | "integer" => {
            if !re_int().is_match(value) {
                return keep();
            }
            Ok(int_or_str(value, value))
        }
        "float" => {
            if !re_java_float().is_match(value) {
                return keep();
            }
            let core = without_final_newline(value);
            Ok(float_or_str(value, &core[..core.len() - 1]))
        }
        "double" => {
            if !re_java_double().is_match(value) {
                return keep();
            }
            Ok(float_or_str(value, value))
        }
        "long" => {
            if !re_java_long().is_match(value) {
                return keep();
            }
            let core = without_final_newline(value);
            Ok(int_or_str(value, &core[..core.len() - 1]))
        }
        "boolean" => match value {
            "true" => Ok(PyValue::Bool(true)),
            "false" => Ok(PyValue::Bool(false)),
            _ => keep(),
        },
        "char" | "String" | "any" => keep(),
        "Array" => Ok(java_array(value, nested_type)?),
        "ArrayList" => Ok(java_arraylist(value, nested_type)?),
        "HashMap" => Ok(java_hashmap(value)),
        "Set" | "Hashtable" | "Queue" | "Stack" => {
            Err(format!("{} conversion is not implemented", expected_type))
        }
        other => Err(format!("Unsupported type: {}", other)),
    }
}

fn java_element(text: &str, nested_type: Option<&str>) -> Result<PyValue, String> {
    match nested_type {
        Some(t) => java_convert(text, t, None),
        None => Ok(parse_java_value(text)),
    }
}

fn java_array(value: &str, nested_type: Option<&str>) -> Result<PyValue, String> {
    let Some(caps) = re_java_array().captures(value) else {
        return Ok(PyValue::Str(value.to_string()));
    };
    let mut items = Vec::new();
    for part in caps[1].split(',') {
        let part = py_strip(part);
        if !part.is_empty() {
            items.push(java_element(part, nested_type)?);
        }
    }
    Ok(PyValue::List(items))
}

/// ArrayList elements: `char`/`String` elements lose their first and last
/// character (the quotes), others convert by the element type.
fn java_list_element(text: &str, nested_type: Option<&str>) -> Result<PyValue, String> {
    match nested_type {
        Some("char") | Some("String") => Ok(PyValue::Str(strip_ends(text))),
        _ => java_element(text, nested_type),
    }
}

fn java_arraylist(value: &str, nested_type: Option<&str>) -> Result<PyValue, String> {
    if let Some(caps) = re_arraylist_aslist().captures(value) {
        let items = caps[1]
            .split(',')
            .map(|part| java_list_element(py_strip(part), nested_type))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(PyValue::List(items));
    }
    if let Some(caps) = re_arraylist_add().captures(value) {
        let items = re_add_item()
            .captures_iter(&caps[1])
            .map(|m| java_list_element(py_strip(&m[1]), nested_type))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(PyValue::List(items));
    }
    if re_arraylist_empty().is_match(value) {
        return Ok(PyValue::List(Vec::new()));
    }
    Ok(PyValue::Str(value.to_string()))
}

fn java_hashmap(value: &str) -> PyValue {
    if let Some(caps) = re_hashmap().captures(value) {
        let mut pairs: Vec<(PyValue, PyValue)> = Vec::new();
        let puts = &caps[1];
        if !py_strip(puts).is_empty() {
            for m in re_put_item().captures_iter(puts) {
                let key = PyValue::Str(m[1].to_string());
                let val = parse_java_value(py_strip(&m[2]));
                match pairs.iter_mut().find(|(k, _)| *k == key) {
                    Some(slot) => slot.1 = val,
                    None => pairs.push((key, val)),
                }
            }
        }
        return PyValue::Dict(pairs);
    }
    if re_hashmap_empty().is_match(value) {
        return PyValue::Dict(Vec::new());
    }
    PyValue::Str(value.to_string())
}

/// BFCL's `parse_java_value`: booleans, quoted strings, `L`/`f` suffixed
/// numbers, then Python `int()`, then `float()`, else the text.
fn parse_java_value(text: &str) -> PyValue {
    match text {
        "true" => return PyValue::Bool(true),
        "false" => return PyValue::Bool(false),
        _ => {}
    }
    if text.starts_with('"') && text.ends_with('"') {
        return PyValue::Str(strip_ends(text));
    }
    if re_java_long().is_match(text) {
        if let Some(i) = py_int_from_str(&text[..text.len() - 1]) {
            return PyValue::Int(i);
        }
    }
    if re_java_float().is_match(text) {
        let core = without_final_newline(text);
        if let Some(f) = py_float_from_str(&core[..core.len() - 1]) {
            return PyValue::Float(f);
        }
    }
    if let Some(i) = py_int_from_str(text) {
        return PyValue::Int(i);
    }
    if let Some(f) = py_float_from_str(text) {
        return PyValue::Float(f);
    }
    PyValue::Str(text.to_string())
}

/// BFCL's `js_type_converter(value, expected_type, nested_type)`.
pub fn js_convert(
    value: &str,
    expected_type: &str,
    nested_type: Option<&str>,
) -> Result<PyValue, String> {
    let keep = || Ok(PyValue::Str(value.to_string()));
    match expected_type {
        "String" => {
            let quoted = |q: char| value.starts_with(q) && value.ends_with(q);
            if quoted('"') || quoted('\'') {
                Ok(PyValue::Str(strip_ends(value)))
            } else {
                keep()
            }
        }
        "integer" => {
            if !re_int().is_match(value) {
                return keep();
            }
            Ok(int_or_str(value, value))
        }
        "float" => {
            if !re_js_float().is_match(value) {
                return keep();
            }
            Ok(float_or_str(value, value))
        }
        "Bigint" => {
            if !re_js_bigint().is_match(value) {
                return keep();
            }
            Ok(int_or_str(value, &value[..value.len() - 1]))
        }
        "Boolean" => match value {
            "true" => Ok(PyValue::Bool(true)),
            "false" => Ok(PyValue::Bool(false)),
            _ => keep(),
        },
        "dict" => Ok(js_dict(value)),
        "array" => Ok(js_array(value, nested_type)),
        "any" => keep(),
        other => Err(format!("Unsupported type: {}", other)),
    }
}

/// BFCL's `parse_js_collection(code, "array", nested_type)`; any failure
/// while converting elements gives back the (stripped) text.
fn js_array(value: &str, nested_type: Option<&str>) -> PyValue {
    let code = py_strip(value);
    let keep = || PyValue::Str(code.to_string());
    if let Some(m) = re_js_array_2d().find(code) {
        let mut rows = Vec::new();
        for (idx, caps) in re_js_inner_array().captures_iter(m.as_str()).enumerate() {
            let mut inner = py_strip(caps.get(1).map_or("", |g| g.as_str()));
            if idx == 0 && inner.starts_with('[') {
                inner = &inner[1..];
            }
            rows.push(PyValue::List(
                inner
                    .split(',')
                    .map(|e| parse_js_value(py_strip(e)))
                    .collect(),
            ));
        }
        return PyValue::List(rows);
    }
    let Some(caps) = re_js_array().captures(code) else {
        return keep();
    };
    let body = caps
        .get(1)
        .or_else(|| caps.get(2))
        .map_or("", |g| g.as_str());
    let body = py_strip(body);
    let elements: Vec<&str> = if body.is_empty() {
        Vec::new()
    } else {
        body.split(',').collect()
    };
    let mut items = Vec::new();
    for e in elements {
        let e = py_strip(e);
        let item = match nested_type {
            Some(t) => match js_convert(e, t, None) {
                Ok(v) => v,
                Err(_) => return keep(),
            },
            None => parse_js_value(e),
        };
        items.push(item);
    }
    PyValue::List(items)
}

/// BFCL's `parse_js_collection(code, "dict")`: the text up to the first
/// `}` is split into `key: value` pairs by the pattern
/// `([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)`.
fn js_dict(value: &str) -> PyValue {
    let code = py_strip(value);
    if code == "{}" {
        return PyValue::Dict(Vec::new());
    }
    let Some(caps) = re_js_dict().captures(code) else {
        return PyValue::Str(code.to_string());
    };
    let mut pairs: Vec<(PyValue, PyValue)> = Vec::new();
    for (key, val) in js_dict_pairs(&caps[1]) {
        let key = strip_chars(py_strip(&key), &['\'', '"']).to_string();
        let val = py_strip(&val);
        let parsed = if val.starts_with('[') && val.ends_with(']') {
            js_array(val, None)
        } else if val.starts_with('{') && val.ends_with('}') {
            js_dict(val)
        } else {
            parse_js_value(strip_chars(val, &['\'', '"']))
        };
        let key = PyValue::Str(key);
        match pairs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = parsed,
            None => pairs.push((key, parsed)),
        }
    }
    PyValue::Dict(pairs)
}

/// `re.findall(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)", content)` for a
/// content without line breaks (it comes from a `.*?` group), emulated by
/// hand because the pattern needs a lookahead.
fn js_dict_pairs(content: &str) -> Vec<(String, String)> {
    let c: Vec<char> = content.chars().collect();
    let n = c.len();
    let text = |a: usize, b: usize| c[a..b].iter().collect::<String>();
    // `(?=[^,]+:)` at r: a ':' after at least one char, before any ','.
    let lookahead = |r: usize| {
        let comma = (r..n).find(|&j| c[j] == ',').unwrap_or(n);
        (r + 1..comma).any(|j| c[j] == ':')
    };
    let mut pairs = Vec::new();
    let mut pos = 0;
    while pos < n {
        if c[pos] == ':' {
            pos += 1;
            continue;
        }
        // `[^:]+` is greedy and can only stop at a ':'.
        let Some(colon) = (pos..n).find(|&j| c[j] == ':') else {
            break;
        };
        let mut value_start = colon + 1;
        while value_start < n && c[value_start].is_whitespace() {
            value_start += 1;
        }
        // `(.*?)` grows until the terminator matches; `$` always does at
        // the end, as the content has no line breaks.
        let mut end = n;
        let mut value_end = n;
        for q in value_start..n {
            if c[q] != ',' {
                continue;
            }
            let mut ws_end = q + 1;
            while ws_end < n && c[ws_end].is_whitespace() {
                ws_end += 1;
            }
            // `\s*` backs off one char at a time until the lookahead holds.
            if let Some(r) = (q + 1..=ws_end).rev().find(|&r| lookahead(r)) {
                value_end = q;
                end = r;
                break;
            }
        }
        pairs.push((text(pos, colon), text(value_start, value_end)));
        pos = end;
    }
    pairs
}

/// BFCL's `parse_js_value`.
fn parse_js_value(text: &str) -> PyValue {
    let text = py_strip(text);
    match text {
        "true" => return PyValue::Bool(true),
        "false" => return PyValue::Bool(false),
        _ => {}
    }
    let quoted = |q: char| text.starts_with(q) && text.ends_with(q);
    if quoted('"') || quoted('\'') {
        return PyValue::Str(strip_ends(text));
    }
    if let Some(i) = py_int_from_str(text) {
        return PyValue::Int(i);
    }
    if let Some(f) = py_float_from_str(text) {
        return PyValue::Float(f);
    }
    PyValue::Str(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(v: Result<PyValue, String>) -> String {
        v.unwrap().repr()
    }

    #[test]
    fn java_suffix_rules() {
        assert_eq!(repr(java_convert("42", "long", None)), "'42'");
        assert_eq!(repr(java_convert("42L", "long", None)), "42");
        assert_eq!(repr(java_convert("3.5", "float", None)), "'3.5'");
        assert_eq!(repr(java_convert("3.5f", "float", None)), "3.5");
        assert_eq!(repr(java_convert("3.5f", "double", None)), "'3.5f'");
        assert_eq!(repr(java_convert("'c'", "char", None)), "\"'c'\"");
    }

    #[test]
    fn java_collections() {
        assert_eq!(
            repr(java_convert("new int[]{1,2}", "Array", Some("integer"))),
            "[1, 2]"
        );
        assert_eq!(
            repr(java_convert(
                r#"new ArrayList<>(Arrays.asList("a", "b"))"#,
                "ArrayList",
                Some("String")
            )),
            "['a', 'b']"
        );
        assert_eq!(
            repr(java_convert(
                r#"new HashMap<String, Object>() {{ put("k", 1); put("s", "v"); }}"#,
                "HashMap",
                None
            )),
            "{'k': 1, 's': 'v'}"
        );
        assert_eq!(
            repr(java_convert(
                "new HashMap<String,Object>()",
                "HashMap",
                None
            )),
            "{}"
        );
    }

    #[test]
    fn js_rules() {
        assert_eq!(repr(js_convert("4", "float", None)), "4.0");
        assert_eq!(repr(js_convert("'x'", "String", None)), "'x'");
        assert_eq!(
            repr(js_convert("[1, 'two', true]", "array", None)),
            "[1, 'two', True]"
        );
        assert_eq!(
            repr(js_convert("[[1, 2], [3]]", "array", None)),
            "[[1, 2], [3]]"
        );
        assert_eq!(
            repr(js_convert("['a', 'b']", "array", Some("String"))),
            "['a', 'b']"
        );
        assert_eq!(
            repr(js_convert(
                "{'key1': 123, key2: 'value', 'key3': false}",
                "dict",
                None
            )),
            "{'key1': 123, 'key2': 'value', 'key3': False}"
        );
        assert_eq!(
            repr(js_convert("{a: 1, b: x, y}", "dict", None)),
            "{'a': 1, 'b': 'x, y'}"
        );
    }
}
