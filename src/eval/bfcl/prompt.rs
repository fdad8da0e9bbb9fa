//! What BFCL shows the model: hinted function docs, the default prompt-mode
//! system prompt, the chat messages, and the FC-mode tools.
//!
//! Facts from BFCL (see the notes for sources):
//! * For inference the docs get a language hint appended to every
//!   description; Java/JavaScript parameters additionally have their type
//!   described in words and replaced by `"string"` (values are written as
//!   source text).  Evaluation uses the docs without these changes.
//! * The default system prompt (`ret_fmt=python&tool_call_tag=False&
//!   func_doc_fmt=json&prompt_fmt=plaintext&style=classic`) is a fixed text
//!   followed by `json.dumps(docs, indent=4)` and a newline; persona and
//!   task are joined without a space ("functions.You") and an empty
//!   `{param_types}` leaves two spaces before "You SHOULD NOT".
//! * In FC mode no system prompt is added and the docs become OpenAI tools.

use serde_json::{Map, Value};

use super::data::{Category, Entry, Language, Message};
use super::value::float_repr;

/// The docs as BFCL shows them to the model (`include_language_specific_hint`).
pub fn hinted_functions(functions: &[Value], category: Category) -> Vec<Value> {
    let language = category.language();
    let (hint, language_name) = match language {
        Language::Python => (
            " Note that the provided function is in Python 3 syntax.",
            "Python",
        ),
        Language::Java => (
            " Note that the provided function is in Java 8 SDK syntax.",
            "Java",
        ),
        Language::JavaScript => (
            " Note that the provided function is in JavaScript syntax.",
            "JavaScript",
        ),
    };
    let mut docs = functions.to_vec();
    for doc in &mut docs {
        if let Some(map) = doc.as_object_mut() {
            append_description(map, hint);
        }
        if language == Language::Python {
            continue;
        }
        let Some(properties) = doc
            .pointer_mut("/parameters/properties")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for schema in properties.values_mut() {
            let Some(schema) = schema.as_object_mut() else {
                continue;
            };
            let declared = schema
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let mut note = if declared == "any" {
                format!(
                    " This parameter can be of any type of {} object in string representation.",
                    language_name
                )
            } else {
                format!(
                    " This is {} {} type parameter in string representation.",
                    language_name, declared
                )
            };
            let is_list = match language {
                Language::Java => declared == "ArrayList" || declared == "Array",
                _ => declared == "array",
            };
            if is_list {
                let item_type = schema
                    .get("items")
                    .and_then(|items| items.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                note.push_str(&format!(
                    " The list elements are of type {}; they are not in string representation.",
                    item_type
                ));
                schema.shift_remove("items");
            }
            if language == Language::JavaScript && declared == "dict" {
                if let Some(nested) = schema.shift_remove("properties") {
                    note.push_str(&format!(
                        " The dictionary entries have the following schema; they are not in string representation. {}",
                        python_json(&nested, None)
                    ));
                }
            }
            append_description(schema, &note);
            schema.insert("type".into(), Value::String("string".into()));
        }
    }
    docs
}

fn append_description(map: &mut Map<String, Value>, suffix: &str) {
    let description = map
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let description = format!("{}{}", description, suffix);
    map.insert("description".into(), Value::String(description));
}

const SYSTEM_PROMPT_HEAD: &str = "You are an expert in composing functions.You are given a question and a set of possible functions. Based on the question, you will need to make one or more function/tool calls to achieve the purpose. If none of the functions can be used, point it out. If the given question lacks the parameters required by the function, also point it out.\n\nYou should only return the function calls in your response.\n\nIf you decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)].  You SHOULD NOT include any other text in the response.\n\nAt each turn, you should try your best to complete the tasks requested by the user within the current turn. Continue to output functions to call until you have fulfilled the user's request to the best of your ability. Once you have no more functions to call, the system will consider the current turn complete and proceed to the next turn or task.\n\nHere is a list of functions in json format that you can invoke.\n";

/// BFCL's default prompt-mode system prompt for the hinted docs.
pub fn system_prompt(hinted: &[Value]) -> String {
    format!(
        "{}{}\n",
        SYSTEM_PROMPT_HEAD,
        python_json(&Value::Array(hinted.to_vec()), Some(4))
    )
}

/// The prompt-mode conversation: the system prompt first, or merged into
/// an existing leading system message (`system_prompt + "\n\n" + content`).
pub fn messages(entry: &Entry) -> Vec<Message> {
    let prompt = system_prompt(&hinted_functions(&entry.functions, entry.category));
    let mut messages = entry.question.clone();
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{}", prompt, first.content)
        }
        _ => messages.insert(
            0,
            Message {
                role: "system".into(),
                content: prompt,
            },
        ),
    }
    messages
}

/// BFCL's `GORILLA_TO_OPENAPI` (unknown types become "string").
fn openapi_type(declared: &str) -> &'static str {
    match declared {
        "integer" | "byte" | "short" | "long" | "Bigint" => "integer",
        "number" | "float" | "double" => "number",
        "boolean" | "bool" => "boolean",
        "array" | "list" | "tuple" | "ArrayList" | "Array" | "Queue" | "Stack" => "array",
        "dict" | "object" | "HashMap" | "Hashtable" => "object",
        _ => "string",
    }
}

/// BFCL's `_cast_to_openai_type` on a `properties` map: map every type;
/// `float` also gets `"format": "float"` and a description note; recurse
/// into `properties` of objects/arrays, else map `items.type` and one more
/// level (`items.items.type`, or `items.properties`).
fn cast_properties(properties: &mut Map<String, Value>) {
    for schema in properties.values_mut() {
        let Some(schema) = schema.as_object_mut() else {
            continue;
        };
        let declared = schema
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mapped = match declared.as_deref() {
            None => "string",
            Some(t) => {
                if t == "float" {
                    schema.insert("format".into(), Value::String("float".into()));
                    append_description(schema, " This is a float type value.");
                }
                openapi_type(t)
            }
        };
        schema.insert("type".into(), Value::String(mapped.into()));
        if mapped != "array" && mapped != "object" {
            continue;
        }
        if let Some(nested) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            cast_properties(nested);
        } else if let Some(items) = schema.get_mut("items").and_then(Value::as_object_mut) {
            let item_type = openapi_type(
                items
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            );
            items.insert("type".into(), Value::String(item_type.into()));
            if item_type == "array" {
                if let Some(inner) = items.get_mut("items").and_then(Value::as_object_mut) {
                    let inner_type = openapi_type(
                        inner
                            .get("type")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    );
                    inner.insert("type".into(), Value::String(inner_type.into()));
                }
            } else if item_type == "object" {
                if let Some(nested) = items.get_mut("properties").and_then(Value::as_object_mut) {
                    cast_properties(nested);
                }
            }
        }
    }
}

/// The hinted docs as OpenAI chat-completions tools, as BFCL's OpenAI
/// handler builds them (dots in names become underscores).
pub fn tools(hinted: &[Value]) -> Vec<Value> {
    hinted
        .iter()
        .map(|doc| {
            let mut function = doc.clone();
            if let Some(map) = function.as_object_mut() {
                if let Some(name) = map.get("name").and_then(Value::as_str) {
                    let name = name.replace('.', "_");
                    map.insert("name".into(), Value::String(name));
                }
                if let Some(parameters) = map.get_mut("parameters").and_then(Value::as_object_mut) {
                    parameters.insert("type".into(), Value::String("object".into()));
                    if let Some(properties) = parameters
                        .get_mut("properties")
                        .and_then(Value::as_object_mut)
                    {
                        cast_properties(properties);
                    }
                }
            }
            serde_json::json!({"type": "function", "function": function})
        })
        .collect()
}

/// Python's `json.dumps(value, indent=indent)` with default settings:
/// `ensure_ascii` (non-ASCII as `\uXXXX`, surrogate pairs above U+FFFF),
/// separators `", "`/`": "` (`","` at line ends when indenting), floats as
/// Python's `repr`, `Infinity`/`NaN` for non-finite numbers.
pub fn python_json(value: &Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    write_json(value, indent, 0, &mut out);
    out
}

fn write_json(value: &Value, indent: Option<usize>, level: usize, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() {
                out.push_str(&n.to_string());
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                out.push_str(&match float_repr(f).as_str() {
                    "inf" => "Infinity".to_string(),
                    "-inf" => "-Infinity".to_string(),
                    "nan" => "NaN".to_string(),
                    other => other.to_string(),
                });
            }
        }
        Value::String(s) => write_json_string(s, out),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                write_separator(i, indent, level + 1, out);
                write_json(item, indent, level + 1, out);
            }
            write_closing(indent, level, out);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                write_separator(i, indent, level + 1, out);
                write_json_string(k, out);
                out.push_str(": ");
                write_json(v, indent, level + 1, out);
            }
            write_closing(indent, level, out);
            out.push('}');
        }
    }
}

fn write_separator(index: usize, indent: Option<usize>, level: usize, out: &mut String) {
    match indent {
        Some(width) => {
            if index > 0 {
                out.push(',');
            }
            out.push('\n');
            out.push_str(&" ".repeat(width * level));
        }
        None => {
            if index > 0 {
                out.push_str(", ");
            }
        }
    }
}

fn write_closing(indent: Option<usize>, level: usize, out: &mut String) {
    if let Some(width) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * level));
    }
}

fn write_json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn factorial_doc() -> Value {
        json!({"name": "math.factorial", "description": "Calculate the factorial of a given number.",
            "parameters": {"type": "dict", "properties": {"number": {"type": "integer", "description": "The number to compute factorial."}}, "required": ["number"]}})
    }

    #[test]
    fn system_prompt_matches_official_text() {
        let hinted = hinted_functions(&[factorial_doc()], Category::SimplePython);
        let expected = "You are an expert in composing functions.You are given a question and a set of possible functions. Based on the question, you will need to make one or more function/tool calls to achieve the purpose. If none of the functions can be used, point it out. If the given question lacks the parameters required by the function, also point it out.\n\nYou should only return the function calls in your response.\n\nIf you decide to invoke any of the function(s), you MUST put it in the format of [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)].  You SHOULD NOT include any other text in the response.\n\nAt each turn, you should try your best to complete the tasks requested by the user within the current turn. Continue to output functions to call until you have fulfilled the user's request to the best of your ability. Once you have no more functions to call, the system will consider the current turn complete and proceed to the next turn or task.\n\nHere is a list of functions in json format that you can invoke.\n[\n    {\n        \"name\": \"math.factorial\",\n        \"description\": \"Calculate the factorial of a given number. Note that the provided function is in Python 3 syntax.\",\n        \"parameters\": {\n            \"type\": \"dict\",\n            \"properties\": {\n                \"number\": {\n                    \"type\": \"integer\",\n                    \"description\": \"The number to compute factorial.\"\n                }\n            },\n            \"required\": [\n                \"number\"\n            ]\n        }\n    }\n]\n";
        assert_eq!(system_prompt(&hinted), expected);
    }

    #[test]
    fn python_json_escapes_and_numbers() {
        let v = json!({"a": "é😀\"\u{7f}", "b": [1.0, 1e-5, 2], "c": {}, "d": []});
        assert_eq!(
            python_json(&v, None),
            r#"{"a": "\u00e9\ud83d\ude00\"\u007f", "b": [1.0, 1e-05, 2], "c": {}, "d": []}"#
        );
    }

    #[test]
    fn java_hints_and_tools() {
        let doc = json!({"name": "A.b", "description": "D.", "parameters": {"type": "dict", "properties": {
            "xs": {"type": "ArrayList", "description": "X.", "items": {"type": "String"}},
            "f": {"type": "float", "description": "F."}}, "required": []}});
        let hinted = hinted_functions(&[doc], Category::SimpleJava);
        assert_eq!(
            hinted[0]["parameters"]["properties"]["xs"],
            json!({"type": "string", "description": "X. This is Java ArrayList type parameter in string representation. The list elements are of type String; they are not in string representation."})
        );
        let py = hinted_functions(
            &[
                json!({"name": "a.b", "description": "", "parameters": {"type": "dict", "properties": {
            "f": {"type": "float", "description": "F."}, "l": {"type": "array", "description": "", "items": {"type": "float"}}}, "required": []}}),
            ],
            Category::SimplePython,
        );
        let tool = &tools(&py)[0];
        assert_eq!(tool["function"]["name"], "a_b");
        assert_eq!(tool["function"]["parameters"]["type"], "object");
        assert_eq!(
            tool["function"]["parameters"]["properties"]["f"],
            json!({"type": "number", "description": "F. This is a float type value.", "format": "float"})
        );
        assert_eq!(
            tool["function"]["parameters"]["properties"]["l"]["items"],
            json!({"type": "number"})
        );
    }
}
