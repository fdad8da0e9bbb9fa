//! The Hermes / Qwen syntax that ChatML models are trained on: tools listed as JSON inside
//! `<tools></tools>` in the system prompt, and each call answered as
//!
//! ```text
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```

use super::{call_from_json, json_call_rules, json_call_text, tools_block, CallSyntax, Function, Opener, Read, ToolCall, Tools};
use serde_json::Value;

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

pub struct Hermes;

impl CallSyntax for Hermes {
    fn openers(&self) -> &'static [Opener] {
        &[Opener { text: CALL_OPEN, at_start_only: false }]
    }

    fn grammar_opener(&self) -> Option<&'static str> {
        Some(CALL_OPEN)
    }

    fn read(&self, text: &str, tools: &Tools, ended: bool) -> Read {
        let body = &text[CALL_OPEN.len()..];
        match body.find(CALL_CLOSE) {
            Some(close) => Read::Done { len: CALL_OPEN.len() + close + CALL_CLOSE.len(), calls: parse(&body[..close], tools).map(|c| vec![c]) },
            // Cut short by the end of sequence before its closing tag: still a call.
            None if ended => Read::Done { len: text.len(), calls: parse(body, tools).map(|c| vec![c]) },
            None => Read::Incomplete,
        }
    }

    fn tools_prompt(&self, tools: &[Value]) -> String {
        format!(
            "{}\n\nFor each function call, return a json object with function name and arguments within \
             {CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n{CALL_CLOSE}",
            tools_block(tools)
        )
    }

    fn render_call(&self, name: &str, arguments: &Value) -> String {
        format!("{CALL_OPEN}\n{}\n{CALL_CLOSE}", json_call_text(name, "arguments", arguments))
    }

    fn grammar(&self, functions: &[&Function], parallel: bool) -> String {
        let (rules, calls) = json_call_rules(functions, "arguments");
        let more = if parallel { " (\"\\n\" call)*" } else { "" };
        format!(
            "calls: \"{CALL_OPEN}\" calls_opened\ncalls_opened: call_body{more}\ncall: \"{CALL_OPEN}\" call_body\n\
             call_body: \"\\n\" ({}) \"\\n{CALL_CLOSE}\"\n{rules}",
            calls
        )
    }
}

/// The text between `<tool_call>` and `</tool_call>`: a JSON object with `name` and `arguments`.
fn parse(body: &str, tools: &Tools) -> Option<ToolCall> {
    call_from_json(&serde_json::from_str(body.trim()).ok()?, tools)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{split, split_anywhere};
    use super::super::{ToolCall, ToolFormat};
    use serde_json::json;

    fn tools() -> Vec<serde_json::Value> {
        vec![json!({"type": "function", "function": {"name": "get_weather"}}), json!({"type": "function", "function": {"name": "add"}})]
    }

    #[test]
    fn finds_calls_split_anywhere() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>";
        let want = vec![
            ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() },
            ToolCall { name: "add".into(), arguments: "{\"a\": 1}".into() },
        ];
        assert_eq!(split_anywhere(ToolFormat::Hermes, &tools(), text), ("Let me check.".into(), want));
    }

    #[test]
    fn each_call_comes_out_once_complete() {
        let mut s = super::super::ToolCallSplitter::new(ToolFormat::Hermes, &tools());
        let (text, calls) = s.push("Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": ");
        assert_eq!((text.as_str(), calls.len()), ("Sure.", 1));
        let (text, calls) = s.push("\"add\", \"arguments\": {\"a\": 2}}\n</tool_call>\nDone.");
        assert_eq!((text.as_str(), calls[0].arguments.as_str()), ("\nDone.", "{\"a\":2}"));
        assert_eq!(s.finish(), (String::new(), vec![]));
    }

    #[test]
    fn leaves_text_and_bad_calls_alone() {
        assert_eq!(split(ToolFormat::Hermes, &tools(), &["a <tool", " b < c"]), ("a <tool b < c".into(), vec![]));
        let unknown = "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>";
        assert_eq!(split(ToolFormat::Hermes, &tools(), &[unknown]), (unknown.into(), vec![]));
        let broken = "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>";
        assert_eq!(split(ToolFormat::Hermes, &tools(), &[broken]), (broken.into(), vec![]));
        // Cut off by the end of sequence before the closing tag: still a call.
        let (text, calls) = split(ToolFormat::Hermes, &tools(), &["<tool_call>\n{\"name\": \"add\"}\n"]);
        assert_eq!((text.as_str(), calls[0].arguments.as_str()), ("", "{}"));
    }
}
