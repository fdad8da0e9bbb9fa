//! Llama 3.1 and later: a call is a JSON object `{"name": "f", "parameters": {…}}`, at the start
//! of the answer or after `<|python_tag|>`; several are joined by `; `.

use super::{call_from_json, json_call_rules, json_call_text, leading_json, tools_block, CallSyntax, Function, Opener, Read, Tools};
use serde_json::Value;

const PYTHON_TAG: &str = "<|python_tag|>";

pub struct Llama3Json;

impl CallSyntax for Llama3Json {
    fn openers(&self) -> &'static [Opener] {
        &[Opener { text: PYTHON_TAG, at_start_only: false }, Opener { text: "{", at_start_only: true }]
    }

    fn read(&self, text: &str, tools: &Tools, ended: bool) -> Read {
        let tag = if text.starts_with(PYTHON_TAG) { PYTHON_TAG.len() } else { 0 };
        let gap = text[tag..].len() - text[tag..].trim_start().len();
        let body = &text[tag + gap..];
        match leading_json(body) {
            Ok((value, len)) => Read::Done { len: tag + gap + len, calls: call_from_json(&value, tools).map(|c| vec![c]) },
            Err(true) if !ended => Read::Incomplete,
            Err(true) => Read::Done { len: text.len(), calls: None },
            // Not JSON after the tag (a built-in tool's Python call): the tag stays text.
            Err(false) => Read::Done { len: tag.max(1), calls: None },
        }
    }

    fn separator(&self, text: &str) -> usize {
        text.len() - text.trim_start_matches(|c: char| c == ';' || c.is_whitespace()).len()
    }

    fn tools_prompt(&self, tools: &[Value]) -> String {
        format!(
            "{}\n\nTo call a function, answer with only a JSON object {{\"name\": <function-name>, \"parameters\": <args-json-object>}}; \
             separate several calls with \"; \".",
            tools_block(tools)
        )
    }

    fn render_call(&self, name: &str, arguments: &Value) -> String {
        json_call_text(name, "parameters", arguments)
    }

    fn join_calls(&self, calls: &[String]) -> String {
        calls.join("; ")
    }

    fn grammar(&self, functions: &[&Function], parallel: bool) -> String {
        let (rules, calls) = json_call_rules(functions, "parameters");
        let more = if parallel { " (\"; \" call)*" } else { "" };
        format!("calls: call{more}\ncall: {}\n{rules}", calls)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{split, split_anywhere, weather_tools};
    use super::super::{ToolCall, ToolFormat};

    #[test]
    fn calls_at_the_start_or_after_the_tag_joined_by_semicolons() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"noop\", \"arguments\": {}}";
        let want = vec![
            ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() },
            ToolCall { name: "noop".into(), arguments: "{}".into() },
        ];
        assert_eq!(split_anywhere(ToolFormat::Llama3Json, &weather_tools(), text), (String::new(), want.clone()));
        let tagged = format!("Checking.<|python_tag|>{text}");
        assert_eq!(split_anywhere(ToolFormat::Llama3Json, &weather_tools(), &tagged), ("Checking.".into(), want));
    }

    #[test]
    fn json_that_is_no_call_and_braces_in_prose_stay_text() {
        let tools = weather_tools();
        // An answer that is JSON but not a call (a response_format answer, say).
        let data = "{\"city\": \"Paris\"}";
        assert_eq!(split_anywhere(ToolFormat::Llama3Json, &tools, data), (data.into(), vec![]));
        // A brace later in the text opens nothing.
        let prose = "Use {\"name\": \"noop\", \"parameters\": {}} like this.";
        assert_eq!(split(ToolFormat::Llama3Json, &tools, &[prose]), (prose.into(), vec![]));
        let unknown = "{\"name\": \"rm\", \"parameters\": {}}";
        assert_eq!(split(ToolFormat::Llama3Json, &tools, &[unknown]), (unknown.into(), vec![]));
        // Cut short by the end of the answer: text.
        let cut = "{\"name\": \"noop\", \"parameters\": {";
        assert_eq!(split(ToolFormat::Llama3Json, &tools, &[cut]), (cut.into(), vec![]));
        let builtin = "<|python_tag|>brave_search.call(query=\"x\")";
        assert_eq!(split(ToolFormat::Llama3Json, &tools, &[builtin]), (builtin.into(), vec![]));
    }
}
