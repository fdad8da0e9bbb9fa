//! Asking a model BFCL's questions. Prompt mode: BFCL's default system prompt with the function
//! docs, and the reply decoded as `[func(a=1), ...]` (Python syntax for every language, as BFCL
//! asks). FC mode: the docs as OpenAI tools through the chat template (or the model's own tools
//! block for templates without tools, as `sala serve` does), the reply's calls parsed in the
//! model's syntax as the server parses them, names with dots written with `_` (BFCL's
//! `underscore_to_dot`); optionally with the calls held to the tools' grammar.

use super::checker::{evaluate, Verdict};
use super::data::{Category, Entry};
use super::decode::{calls_to_json, decode_fc, decode_fc_text, decode_prompt, Call, DecodeError};
use super::prompt;
use crate::engine::error::Result;
use crate::engine::model::LanguageModel;
use crate::engine::tokenizer::{Message, TextTokenizer};
use crate::engine::grammar::{Grammar, Reasoning};
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::tools::{ToolCallSplitter, ToolFormat};
use crate::eval::ask::{ask_drawing, Budget};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    // Plain comments: a documented value would switch `sala bfcl --help` to clap's long layout.
    // BFCL's system prompt; calls written as Python.
    Prompt,
    // Function calling through the chat template's tools.
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
    /// FC mode: how the model writes calls.
    pub tool_format: ToolFormat,
    /// FC mode: calls constrained by the tools' grammar (a call, when made, parses).
    pub constrained: bool,
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
    let (prompt_text, tools) = match settings.mode {
        Mode::Prompt => (tokenizer.apply_chat_template(&engine_messages(&prompt::messages(entry)), settings.think)?, Vec::new()),
        Mode::Fc => {
            let tools = prompt::tools(&hinted);
            (tokenizer.apply_chat_template_with_tools(&engine_messages(&entry.question), &tools, settings.tool_format, settings.think)?, tools)
        }
    };
    let ids = tokenizer.encode(&prompt_text)?;
    let budget = Budget { max_tokens: settings.max_tokens, prefill_step: settings.prefill_step };
    let mut sampler = Sampler::new(SamplingParams::default());
    if settings.constrained && settings.mode == Mode::Fc {
        let info = model.info();
        let grammar = Grammar::Answer(settings.tool_format.auto_grammar(&tools, true));
        let reasoning = Reasoning::after_prompt(&prompt_text, tokenizer.can_think() && settings.think);
        sampler = sampler.constrained(tokenizer.grammar_compiler(info.vocab_size, &info.eos_token_ids)?.compile(&grammar, reasoning)?);
    }
    let answer = ask_drawing(model, tokenizer, &prompt_text, &ids, &budget, sampler, |_, _| {})?;
    let decoded = match settings.mode {
        // BFCL decodes irrelevance replies as Python whatever the language.
        Mode::Prompt => decode_prompt(&answer.text, if entry.category == Category::Irrelevance { super::data::Language::Python } else { entry.category.language() }),
        Mode::Fc => {
            let mut splitter = ToolCallSplitter::new(settings.tool_format, &tools);
            let (shown, mut calls) = splitter.push(&answer.text);
            let (rest, last) = splitter.finish();
            calls.extend(last);
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
pub fn sample_json(model: &str, mode: &str, s: &Sample) -> Value {
    json!({
        "model": model,
        "mode": mode,
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
