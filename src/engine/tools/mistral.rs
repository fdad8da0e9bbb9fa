//! Mistral: `[TOOL_CALLS]` and then a JSON list of `{"name": …, "arguments": {…}}` (tokenizers
//! before v11), or `[TOOL_CALLS]name[ARGS]{…}` once per call (v11 on, with `[CALL_ID]id` before
//! `[ARGS]` in v11 only).

use super::{call_from_json, json_call_rules, json_call_text, leading_json, tools_block, CallSyntax, Function, Opener, Read, ToolCall, Tools};
use serde_json::{json, Value};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

pub struct Mistral;

impl CallSyntax for Mistral {
    fn openers(&self) -> &'static [Opener] {
        &[Opener { text: TOOL_CALLS, at_start_only: false }]
    }

    fn grammar_opener(&self) -> Option<&'static str> {
        Some(TOOL_CALLS)
    }

    fn read(&self, text: &str, tools: &Tools, ended: bool) -> Read {
        let after = &text[TOOL_CALLS.len()..];
        let gap = after.len() - after.trim_start().len();
        let body = &after[gap..];
        let start = TOOL_CALLS.len() + gap;
        let waiting = || if ended { Read::Done { len: text.len(), calls: None } } else { Read::Incomplete };
        if body.starts_with('[') && !body.starts_with(ARGS) && !body.starts_with(CALL_ID) {
            return match leading_json(body) {
                Ok((Value::Array(items), len)) => {
                    let calls: Option<Vec<ToolCall>> = items.iter().map(|item| call_from_json(item, tools)).collect();
                    Read::Done { len: start + len, calls: calls.filter(|c| !c.is_empty()) }
                }
                Ok((_, len)) => Read::Done { len: start + len, calls: None },
                Err(true) => waiting(),
                Err(false) => Read::Done { len: TOOL_CALLS.len(), calls: None },
            };
        }
        // name[ARGS]{…}, or name[CALL_ID]id[ARGS]{…}
        let Some(args_at) = body.find(ARGS) else {
            return if body.contains(['{', '\n']) { Read::Done { len: TOOL_CALLS.len(), calls: None } } else { waiting() };
        };
        let name = body[..args_at].split(CALL_ID).next().unwrap_or_default().trim();
        let json_start = args_at + ARGS.len();
        match leading_json(&body[json_start..]) {
            Ok((arguments @ Value::Object(_), len)) => {
                let call = call_from_json(&json!({"name": name, "arguments": arguments}), tools);
                Read::Done { len: start + json_start + len, calls: call.map(|c| vec![c]) }
            }
            Ok((_, len)) => Read::Done { len: start + json_start + len, calls: None },
            Err(true) => waiting(),
            Err(false) => Read::Done { len: TOOL_CALLS.len(), calls: None },
        }
    }

    fn tools_prompt(&self, tools: &[Value]) -> String {
        format!(
            "{}\n\nTo call functions, answer {TOOL_CALLS} followed by a JSON list of calls: \
             [{{\"name\": <function-name>, \"arguments\": <args-json-object>}}].",
            tools_block(tools)
        )
    }

    fn render_call(&self, name: &str, arguments: &Value) -> String {
        json_call_text(name, "arguments", arguments)
    }

    fn join_calls(&self, calls: &[String]) -> String {
        format!("{TOOL_CALLS} [{}]", calls.join(", "))
    }

    fn grammar(&self, functions: &[&Function], parallel: bool) -> String {
        let (rules, calls) = json_call_rules(functions, "arguments");
        let more = if parallel { " (\", \" call)*" } else { "" };
        format!("calls: \"{TOOL_CALLS}\" calls_opened\ncalls_opened: \" [\" call{more} \"]\"\ncall: {}\n{rules}", calls)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{split, split_anywhere, weather_tools};
    use super::super::{ToolCall, ToolFormat};

    fn paris() -> ToolCall {
        ToolCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }
    }

    #[test]
    fn the_list_form_and_the_per_call_form() {
        let tools = weather_tools();
        let list = "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123XYZ\"}, {\"name\": \"noop\", \"arguments\": {}}]";
        let noop = ToolCall { name: "noop".into(), arguments: "{}".into() };
        assert_eq!(split_anywhere(ToolFormat::Mistral, &tools, list), ("Sure.".into(), vec![paris(), noop.clone()]));
        let each = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]noop[CALL_ID]a1b2c3d4e[ARGS]{}";
        assert_eq!(split_anywhere(ToolFormat::Mistral, &tools, each), (String::new(), vec![paris(), noop]));
    }

    #[test]
    fn unknown_names_and_broken_lists_stay_text() {
        let tools = weather_tools();
        let unknown = "[TOOL_CALLS]rm[ARGS]{\"path\": \"/\"}";
        assert_eq!(split(ToolFormat::Mistral, &tools, &[unknown]), (unknown.into(), vec![]));
        let one_bad = "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {}}, {\"name\": \"rm\", \"arguments\": {}}]";
        assert_eq!(split(ToolFormat::Mistral, &tools, &[one_bad]), (one_bad.into(), vec![]));
        let cut = "[TOOL_CALLS] [{\"name\": \"noop\"";
        assert_eq!(split(ToolFormat::Mistral, &tools, &[cut]), (cut.into(), vec![]));
    }
}
