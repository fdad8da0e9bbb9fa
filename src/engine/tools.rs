//! Function calling in the Hermes/Qwen format that ChatML models are trained on (and that the
//! MiniCPM4 template's tools block describes): tools are listed as JSON inside `<tools></tools>`
//! in the system prompt, and the model answers a call with
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! Models whose chat template handles `tools` itself get them passed through; for templates that
//! don't, [`plain_template_messages`] writes the tools block and earlier calls/results into the
//! messages. [`ToolCallSplitter`] then separates calls from text as the answer streams.

use super::tokenizer::{partial_tag_len, Message};
use serde_json::{json, Value};

pub const CALL_OPEN: &str = "<tool_call>";
pub const CALL_CLOSE: &str = "</tool_call>";

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (what OpenAI's API carries).
    pub arguments: String,
}

/// The system-prompt block describing `tools` (OpenAI tool objects).
pub fn tools_prompt(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

/// `messages` rewritten for a template that knows nothing of tools: the tools block joins the
/// system prompt, an assistant's earlier calls become `<tool_call>` text, and tool results become
/// a user turn of `<tool_response>` blocks (consecutive results share one turn).
pub fn plain_template_messages(messages: &[Message], tools: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    if !tools.is_empty() {
        let block = tools_prompt(tools);
        match messages.first().filter(|m| m.role == "system") {
            Some(system) => out.push(Message::new("system", &format!("{}\n\n{block}", system.content))),
            None => out.push(Message::new("system", &block)),
        }
    }
    let rest = if tools.is_empty() || messages.first().is_none_or(|m| m.role != "system") { messages } else { &messages[1..] };
    for m in rest {
        match m.role.as_str() {
            "assistant" if m.tool_calls.is_some() => {
                let mut text = m.content.clone();
                for call in m.tool_calls.iter().flatten() {
                    let function = call.get("function").unwrap_or(call);
                    // Name first, as the model was shown (and an arguments string as its object).
                    let arguments = match function.get("arguments") {
                        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                        Some(v) => v.clone(),
                        None => json!({}),
                    };
                    let name = function.get("name").cloned().unwrap_or(Value::Null);
                    let rendered = format!("{{\"name\": {name}, \"arguments\": {arguments}}}");
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{CALL_OPEN}\n{rendered}\n{CALL_CLOSE}"));
                }
                out.push(Message::new("assistant", &text));
            }
            "tool" => {
                let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                match out.last_mut() {
                    Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                        last.content.push('\n');
                        last.content.push_str(&block);
                    }
                    _ => out.push(Message::new("user", &block)),
                }
            }
            _ => out.push(Message::new(&m.role, &m.content)),
        }
    }
    out
}

/// Lark rules for `calls`: a call (several with `parallel`) to one of `tools` (only `only`, when
/// named), its arguments valid under the function's parameter schema.
pub fn calls_grammar(tools: &[Value], only: Option<&str>, parallel: bool) -> String {
    let mut rules = String::new();
    let mut names = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let function = tool.get("function").unwrap_or(tool);
        let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
        if only.is_some_and(|only| only != name) {
            continue;
        }
        let parameters = function.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
        let call = json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        });
        rules.push_str(&format!("call_{i}: {}\n", super::grammar::lark_json(&call)));
        names.push(format!("call_{i}"));
    }
    let more = if parallel { " (\"\\n\" call)*" } else { "" };
    format!("calls: call{more}\ncall: \"{CALL_OPEN}\\n\" ({}) \"\\n{CALL_CLOSE}\"\n{rules}", names.join(" | "))
}

/// Parses the text between `<tool_call>` and `</tool_call>`: a JSON object with `name` and
/// `arguments` (an object, or a string holding one; `parameters` is accepted too).
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?;
            s.clone()
        }
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// Splits a streamed answer into plain text (released as it comes, except a tail that could be
/// the start of `<tool_call>`) and the tool calls, which are parsed when the answer ends. Calls
/// that don't parse, or name a function that wasn't offered, stay in the text.
pub struct ToolCallSplitter {
    known: Vec<String>,
    pending: String,
    /// From the first `<tool_call>` on, everything is held until the end.
    in_calls: bool,
}

impl ToolCallSplitter {
    /// `known`: the names of the offered functions.
    pub fn new(known: Vec<String>) -> Self {
        Self { known, pending: String::new(), in_calls: false }
    }

    /// The text that can be shown now.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        if self.in_calls {
            return String::new();
        }
        if let Some(at) = self.pending.find(CALL_OPEN) {
            self.in_calls = true;
            // The whitespace that separates the text from the calls is not part of either.
            let text = self.pending[..at].trim_end().to_string();
            self.pending.drain(..at);
            return text;
        }
        let keep = partial_tag_len(&self.pending, CALL_OPEN);
        // Trailing whitespace waits too: it may turn out to precede a call.
        let release = self.pending[..self.pending.len() - keep].trim_end().len();
        self.pending.drain(..release).collect()
    }

    /// The rest of the text, and the calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.pending);
        if !self.in_calls {
            return (held, Vec::new());
        }
        let mut calls = Vec::new();
        let mut text = String::new();
        let mut rest = held.as_str();
        while let Some(open) = rest.find(CALL_OPEN) {
            text.push_str(&rest[..open]);
            let after = &rest[open + CALL_OPEN.len()..];
            // The last call may be cut short by the end of sequence before its closing tag.
            let (body, next) = match after.find(CALL_CLOSE) {
                Some(close) => (&after[..close], &after[close + CALL_CLOSE.len()..]),
                None => (after, ""),
            };
            match parse_call(body).filter(|c| self.known.contains(&c.name)) {
                Some(call) => calls.push(call),
                None => text.push_str(&rest[open..rest.len() - next.len()]),
            }
            rest = next;
        }
        text.push_str(rest);
        if !calls.is_empty() {
            text = text.trim().to_string();
        }
        (text, calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallSplitter::new(vec!["get_weather".into(), "add".into()]);
        let mut shown: String = pieces.iter().map(|p| s.push(p)).collect();
        let (rest, calls) = s.finish();
        shown.push_str(&rest);
        (shown, calls)
    }

    #[test]
    fn finds_calls_split_anywhere() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>";
        let want = vec![
            ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() },
            ToolCall { name: "add".into(), arguments: "{\"a\": 1}".into() },
        ];
        for cut in 0..=text.len() {
            let (shown, calls) = split(&[&text[..cut], &text[cut..]]);
            assert_eq!(shown, "Let me check.", "cut at {cut}");
            assert_eq!(calls, want, "cut at {cut}");
        }
    }

    #[test]
    fn leaves_text_and_bad_calls_alone() {
        assert_eq!(split(&["a <tool", " b < c"]), ("a <tool b < c".into(), vec![]));
        let unknown = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
        assert_eq!(split(&[unknown]), (unknown.into(), vec![]));
        let broken = "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>";
        assert_eq!(split(&[broken]), (broken.into(), vec![]));
        // Cut off by the end of sequence before the closing tag: still a call.
        let (text, calls) = split(&["<tool_call>\n{\"name\": \"add\"}\n"]);
        assert_eq!((text.as_str(), calls[0].arguments.as_str()), ("", "{}"));
    }

    #[test]
    fn plain_templates_get_tools_calls_and_results_as_text() {
        let tools = vec![json!({"type": "function", "function": {"name": "add"}})];
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}})]);
        let messages = vec![
            Message::new("system", "Be brief."),
            Message::new("user", "1+?"),
            call,
            Message::new("tool", "2"),
            Message::new("tool", "3"),
        ];
        let out = plain_template_messages(&messages, &tools);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools") && out[0].content.contains(r#""name":"add""#));
        assert_eq!(out[2].content, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call>");
        assert_eq!(out[3].content, "<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response>");
    }
}
