//! Asking a model BFCL's questions. Prompt mode: BFCL's default system prompt with the function
//! docs, and the reply decoded as `[func(a=1), ...]` (Python syntax for every language, as BFCL
//! asks). FC mode: the docs as OpenAI tools through the chat template (or the Hermes tools block
//! for templates without tools, as `sala serve` does), the reply's `<tool_call>` blocks parsed as
//! the server parses them, names with dots written with `_` (BFCL's `underscore_to_dot`).

use super::checker::{evaluate, Verdict};
use super::data::{Category, Entry};
use super::decode::{calls_to_json, decode_fc, decode_fc_text, decode_prompt, Call, DecodeError};
use super::prompt;
use crate::engine::error::Result;
use crate::engine::model::LanguageModel;
use crate::engine::tokenizer::{Message, TextTokenizer};
use crate::engine::tools::ToolCallSplitter;
use crate::eval::ask::{ask_tokens, Budget};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// BFCL's system prompt; calls written as Python
    Prompt,
    /// Function calling through the chat template's tools
    Fc,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Prompt => "prompt",
            Mode::Fc => "fc",
        }
    }
}

pub struct Settings {
    pub mode: Mode,
    pub think: bool,
    pub max_tokens: usize,
    pub prefill_step: usize,
}

/// One answered entry.
pub struct Sample {
    pub entry_id: String,
    pub category: Category,
    /// The reply (without its think block).
    pub raw: String,
    pub decoded: std::result::Result<Vec<Call>, DecodeError>,
    pub verdict: Verdict,
    pub gen_tokens: usize,
    pub seconds: f64,
}

fn engine_messages(messages: &[super::data::Message]) -> Vec<Message> {
    messages.iter().map(|m| Message::new(&m.role, &m.content)).collect()
}

/// Asks `entry` and checks the reply.
pub fn run_entry(model: &dyn LanguageModel, tokenizer: &TextTokenizer, entry: &Entry, settings: &Settings) -> Result<Sample> {
    let hinted = prompt::hinted_functions(&entry.functions, entry.category);
    let (prompt_text, tool_names) = match settings.mode {
        Mode::Prompt => (tokenizer.apply_chat_template(&engine_messages(&prompt::messages(entry)), settings.think)?, Vec::new()),
        Mode::Fc => {
            let tools = prompt::tools(&hinted);
            let names = tools.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_string)).collect();
            (tokenizer.apply_chat_template_with_tools(&engine_messages(&entry.question), &tools, settings.think)?, names)
        }
    };
    let ids = tokenizer.encode(&prompt_text)?;
    let budget = Budget { max_tokens: settings.max_tokens, prefill_step: settings.prefill_step };
    let answer = ask_tokens(model, tokenizer, &prompt_text, &ids, &budget, |_, _| {})?;
    let decoded = match settings.mode {
        // BFCL decodes irrelevance replies as Python whatever the language.
        Mode::Prompt => decode_prompt(&answer.text, if entry.category == Category::Irrelevance { super::data::Language::Python } else { entry.category.language() }),
        Mode::Fc => {
            let mut splitter = ToolCallSplitter::new(tool_names);
            let shown = splitter.push(&answer.text);
            let (rest, calls) = splitter.finish();
            if calls.is_empty() {
                decode_fc_text(&(shown + &rest))
            } else {
                decode_fc(&calls.into_iter().map(|c| (c.name, c.arguments)).collect::<Vec<_>>())
            }
        }
    };
    let verdict = evaluate(entry.category, &entry.functions, &decoded, entry.ground_truth.as_ref(), settings.mode == Mode::Fc);
    Ok(Sample {
        entry_id: entry.id.clone(),
        category: entry.category,
        raw: answer.text,
        decoded,
        verdict,
        gen_tokens: answer.stats.generated_tokens,
        seconds: answer.stats.prompt_seconds + answer.stats.decode_seconds,
    })
}

/// A per-sample JSONL record: the raw reply, what it decoded to, and the verdict.
pub fn sample_json(model: &str, mode: Mode, s: &Sample) -> Value {
    json!({
        "model": model,
        "mode": mode.name(),
        "id": s.entry_id,
        "category": s.category.name(),
        "valid": s.verdict.valid,
        "error_type": s.verdict.error_type,
        "error": s.verdict.message,
        "raw": s.raw,
        "decoded": s.decoded.as_ref().map(|c| calls_to_json(c)).unwrap_or(Value::Null),
        "gen_tokens": s.gen_tokens,
        "seconds": (s.seconds * 1000.0).round() / 1000.0,
    })
}
