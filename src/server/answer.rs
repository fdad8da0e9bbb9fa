//! The model's raw answer text turned into what the API returns: `<think>` reasoning apart from
//! the answer (`reasoning_content`), and tool calls apart from text (`tool_calls`).

use crate::engine::tokenizer::ThinkFilter;
use crate::engine::tools::{ToolCall, ToolCallSplitter};
use serde_json::{json, Value};

/// What a piece of the answer adds.
#[derive(Debug, Default)]
pub struct Delta {
    pub reasoning: String,
    pub content: String,
}

impl Delta {
    /// The streaming `delta` objects for this piece (none when it adds nothing).
    pub fn chunks(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if !self.reasoning.is_empty() {
            out.push(json!({"reasoning_content": self.reasoning}));
        }
        if !self.content.is_empty() {
            out.push(json!({"content": self.content}));
        }
        out
    }
}

pub struct AnswerParser {
    think: ThinkFilter,
    tools: Option<ToolCallSplitter>,
    parallel_calls: bool,
}

impl AnswerParser {
    /// `prompt`: the rendered prompt (a trailing `<think>` means the answer starts reasoning);
    /// `tools`: the offered function names, `None` when calls are not looked for.
    pub fn new(prompt: &str, tools: Option<Vec<String>>, parallel_calls: bool) -> Self {
        Self { think: ThinkFilter::after_prompt(prompt), tools: tools.map(ToolCallSplitter::new), parallel_calls }
    }

    pub fn push(&mut self, text: &str) -> Delta {
        let split = self.think.split(text);
        let content = match self.tools.as_mut() {
            Some(t) => t.push(&split.answer),
            None => split.answer,
        };
        Delta { reasoning: split.reasoning, content }
    }

    /// The rest of the answer and the tool calls it made.
    pub fn finish(&mut self) -> (Delta, Vec<ToolCall>) {
        let split = self.think.finish_split();
        let Some(tools) = self.tools.as_mut() else {
            return (Delta { reasoning: split.reasoning, content: split.answer }, Vec::new());
        };
        let mut content = tools.push(&split.answer);
        let (rest, mut calls) = tools.finish();
        content.push_str(&rest);
        if !self.parallel_calls {
            calls.truncate(1);
        }
        (Delta { reasoning: split.reasoning, content }, calls)
    }
}

/// OpenAI `tool_calls` entries (with `index` for streaming chunks).
pub fn tool_calls_json(calls: &[ToolCall], with_index: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": format!("call_{:016x}", rand::random::<u64>()),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(parser: &mut AnswerParser, pieces: &[&str]) -> (String, String, Vec<ToolCall>) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        for p in pieces {
            let d = parser.push(p);
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
        }
        let (d, calls) = parser.finish();
        (reasoning + &d.reasoning, content + &d.content, calls)
    }

    #[test]
    fn reasoning_text_and_calls_come_apart() {
        let mut p = AnswerParser::new("<|im_start|>assistant\n<think>\n", Some(vec!["add".into()]), true);
        let (reasoning, content, calls) =
            run(&mut p, &["I should ", "add.</th", "ink>\n\nSure.\n<tool", "_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>"]);
        assert_eq!(reasoning, "I should add.");
        assert_eq!(content, "Sure.");
        assert_eq!(calls, vec![ToolCall { name: "add".into(), arguments: "{\"a\":2}".into() }]);
    }

    #[test]
    fn one_call_when_parallel_calls_are_off_and_none_without_tools() {
        let mut p = AnswerParser::new("prompt", Some(vec!["add".into()]), false);
        let (reasoning, content, calls) = run(&mut p, &["<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call><tool_call>{\"name\": \"add\"}</tool_call>"]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("", ""));
        // parallel_tool_calls = false keeps the first.
        assert_eq!(calls, vec![ToolCall { name: "add".into(), arguments: "{\"a\":1}".into() }]);
        let mut p = AnswerParser::new("prompt", None, true);
        assert_eq!(run(&mut p, &["<tool_call>{\"name\": \"add\"}</tool_call>"]).1, "<tool_call>{\"name\": \"add\"}</tool_call>");
    }
}
