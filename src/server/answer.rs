//! The model's raw answer text turned into what the API returns: `<think>` reasoning apart from
//! the answer (`reasoning_content`), and tool calls apart from text (`tool_calls`).

use crate::engine::tokenizer::ThinkFilter;
use crate::engine::tools::{ToolCall, ToolCallSplitter, ToolFormat};
use serde_json::{json, Value};

/// What a piece of the answer adds.
#[derive(Debug, Default)]
pub struct Delta {
    pub reasoning: String,
    pub content: String,
    /// Calls completed by this piece.
    pub calls: Vec<ToolCall>,
}

impl Delta {
    /// The streaming `delta` objects for this piece (none when it adds nothing); calls are
    /// numbered from `first_call` on.
    pub fn chunks(&self, first_call: usize) -> Vec<Value> {
        let mut out = Vec::new();
        if !self.reasoning.is_empty() {
            out.push(json!({"reasoning_content": self.reasoning}));
        }
        if !self.content.is_empty() {
            out.push(json!({"content": self.content}));
        }
        if !self.calls.is_empty() {
            out.push(json!({"tool_calls": tool_calls_json(&self.calls, Some(first_call))}));
        }
        out
    }
}

pub struct AnswerParser {
    think: ThinkFilter,
    tools: Option<ToolCallSplitter>,
    parallel_calls: bool,
    /// Calls handed out so far.
    calls: usize,
}

impl AnswerParser {
    /// `prompt`: the rendered prompt (a trailing `<think>` means the answer starts reasoning);
    /// `tools`: the syntax and offered tools, `None` when calls are not looked for.
    pub fn new(prompt: &str, tools: Option<(ToolFormat, &[Value])>, parallel_calls: bool) -> Self {
        let tools = tools.map(|(format, tools)| ToolCallSplitter::new(format, tools));
        Self { think: ThinkFilter::after_prompt(prompt), tools, parallel_calls, calls: 0 }
    }

    /// Calls handed out before this piece.
    pub fn calls_so_far(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Delta {
        let split = self.think.split(text);
        self.answer(split.reasoning, split.answer, None)
    }

    /// The rest of the answer; `finish_reason`: why it ended (`"length"`: cut by `max_tokens` or
    /// the context, when a call it stopped inside is no call and its text no content).
    pub fn finish(&mut self, finish_reason: &str) -> Delta {
        let split = self.think.finish_split();
        self.answer(split.reasoning, split.answer, Some(finish_reason == "length"))
    }

    /// `cut`: `None` while the answer goes on; at its end, whether it was cut short.
    fn answer(&mut self, reasoning: String, answer: String, cut: Option<bool>) -> Delta {
        let Some(tools) = self.tools.as_mut() else { return Delta { reasoning, content: answer, calls: Vec::new() } };
        let (mut content, mut calls) = tools.push(&answer);
        if let Some(cut) = cut {
            let (rest, last, unfinished) = tools.finish_cut();
            content.push_str(&rest);
            // Ended by the model or a stop sequence the request chose: the text stays, as written.
            if !cut {
                content.push_str(&unfinished);
            }
            calls.extend(last);
        }
        if !self.parallel_calls {
            // parallel_tool_calls = false: the first call only.
            calls.truncate(usize::from(self.calls == 0));
        }
        self.calls += calls.len();
        Delta { reasoning, content, calls }
    }
}

/// OpenAI's `finish_reason` for an answer that ended for `finish_reason` (the worker's) and made
/// calls or not: an answer cut by `max_tokens` says so even after complete calls, as a client
/// must not take a cut answer for a whole one.
pub fn chat_finish_reason(finish_reason: &'static str, called: bool) -> &'static str {
    match (finish_reason, called) {
        ("length", _) => "length",
        (_, true) => "tool_calls",
        (reason, false) => reason,
    }
}

/// OpenAI `tool_calls` entries (with `index`, from `first_index` on, for streaming chunks).
pub fn tool_calls_json(calls: &[ToolCall], first_index: Option<usize>) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": format!("call_{:016x}", rand::random::<u64>()),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if let Some(first) = first_index {
                v["index"] = json!(first + i);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(parser: &mut AnswerParser, pieces: &[&str]) -> (String, String, Vec<ToolCall>) {
        ended(parser, pieces, "stop")
    }

    /// [`run`] for an answer that ended for `finish_reason`.
    fn ended(parser: &mut AnswerParser, pieces: &[&str], finish_reason: &str) -> (String, String, Vec<ToolCall>) {
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        let mut deltas: Vec<Delta> = pieces.iter().map(|p| parser.push(p)).collect();
        deltas.push(parser.finish(finish_reason));
        for d in deltas {
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            calls.extend(d.calls);
        }
        (reasoning, content, calls)
    }

    fn add() -> Vec<Value> {
        vec![json!({"type": "function", "function": {"name": "add"}})]
    }

    #[test]
    fn reasoning_text_and_calls_come_apart() {
        let tools = add();
        let mut p = AnswerParser::new("<|im_start|>assistant\n<think>\n", Some((ToolFormat::Hermes, &tools)), true);
        let (reasoning, content, calls) =
            run(&mut p, &["I should ", "add.</th", "ink>\n\nSure.\n<tool", "_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>"]);
        assert_eq!(reasoning, "I should add.");
        assert_eq!(content, "Sure.");
        assert_eq!(calls, vec![ToolCall { name: "add".into(), arguments: "{\"a\":2}".into() }]);
    }

    #[test]
    fn one_call_when_parallel_calls_are_off_and_none_without_tools() {
        let tools = add();
        let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), false);
        let (reasoning, content, calls) = run(&mut p, &["<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>", "<tool_call>{\"name\": \"add\"}</tool_call>"]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("", ""));
        assert_eq!(calls, vec![ToolCall { name: "add".into(), arguments: "{\"a\":1}".into() }]);
        let mut p = AnswerParser::new("prompt", None, true);
        assert_eq!(run(&mut p, &["<tool_call>{\"name\": \"add\"}</tool_call>"]).1, "<tool_call>{\"name\": \"add\"}</tool_call>");
    }

    #[test]
    fn streamed_calls_are_numbered_across_pieces() {
        let tools = add();
        let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), true);
        let first = p.push("<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>\n");
        assert_eq!(first.chunks(0)[0]["tool_calls"][0]["index"], 0);
        let at = p.calls_so_far();
        let second = p.push("<tool_call>\n{\"name\": \"add\", \"arguments\": {\"b\": 1}}\n</tool_call>");
        let chunk = &second.chunks(at)[0]["tool_calls"][0];
        assert_eq!((chunk["index"].as_u64(), chunk["function"]["arguments"].as_str()), (Some(1), Some("{\"b\":1}")));
    }

    #[test]
    fn a_call_cut_by_max_tokens_is_neither_call_nor_content() {
        let tools = add();
        let whole = "Sure.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"argu";
        let first = vec![ToolCall { name: "add".into(), arguments: "{\"a\":1}".into() }];
        for cut in [whole.len(), whole.rfind("\"argu").unwrap(), whole.rfind("<tool_call>").unwrap() + 5, whole.rfind("<tool_call>").unwrap() + 1] {
            let text = &whole[..cut];
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), true);
            assert_eq!(ended(&mut p, &pieces, "length"), (String::new(), "Sure.".to_string(), first.clone()), "{text:?}");
            // Ended otherwise (a stop sequence), the text stays as written.
            let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), true);
            let (_, content, calls) = ended(&mut p, &pieces, "stop");
            assert!(content.starts_with("Sure.") && content.ends_with(&text[text.rfind("\n<").unwrap() + 1..]) && calls == first, "{content:?}");
        }
        // Text that ends in what could open a call, cut there: the fragment goes with the cut.
        let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), true);
        assert_eq!(ended(&mut p, &["Let me add. <tool"], "length").1, "Let me add.");
        let mut p = AnswerParser::new("prompt", Some((ToolFormat::Hermes, &tools)), true);
        assert_eq!(ended(&mut p, &["Let me add. <tool"], "stop").1, "Let me add. <tool");
    }

    #[test]
    fn a_cut_answer_finishes_for_length_even_after_calls() {
        assert_eq!(chat_finish_reason("length", true), "length");
        assert_eq!(chat_finish_reason("length", false), "length");
        assert_eq!(chat_finish_reason("stop", true), "tool_calls");
        assert_eq!(chat_finish_reason("stop", false), "stop");
    }
}
