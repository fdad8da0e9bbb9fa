//! One question to a model, answered greedily with a token cap, the way the eval harnesses ask:
//! chat template, prefill, decode until end-of-sequence, the cap, or a loop (the same stretch of
//! tokens repeating, which greedy decoding never leaves). The answer comes back split from its
//! `<think>` block, with the timings.

use crate::engine::error::Result;
use crate::engine::generate::{generate, Flow, GenerateOptions, Stats, StopReason};
use crate::engine::model::LanguageModel;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::tokenizer::{Message, TextTokenizer, ThinkFilter};

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// End-of-sequence.
    Finished,
    /// The token cap.
    Cap,
    /// A repeating loop (stopped early).
    Loop,
}

impl Ending {
    pub fn name(self) -> &'static str {
        match self {
            Ending::Finished => "finished",
            Ending::Cap => "cap",
            Ending::Loop => "loop",
        }
    }
}

pub struct Answer {
    /// The answer without its `<think>` block.
    pub text: String,
    pub reasoning: String,
    /// Everything generated, as decoded.
    pub raw: String,
    pub ending: Ending,
    pub stats: Stats,
}

impl Answer {
    /// Ended by itself with something to say outside the think block.
    pub fn answered(&self) -> bool {
        self.ending == Ending::Finished && !self.text.trim().is_empty()
    }

    /// Stopped (cap or loop) before the think block closed.
    pub fn stuck_thinking(&self) -> bool {
        self.ending != Ending::Finished && self.text.trim().is_empty()
    }
}

/// How much an answer may take.
pub struct Budget {
    pub max_tokens: usize,
    pub prefill_step: usize,
}

/// Asks `messages` through the chat template; `on_prefill(done, total)` reports prefill progress.
pub fn ask(
    model: &dyn LanguageModel,
    tokenizer: &TextTokenizer,
    messages: &[Message],
    enable_thinking: bool,
    budget: &Budget,
    on_prefill: impl FnMut(usize, usize),
) -> Result<Answer> {
    let prompt = tokenizer.apply_chat_template(messages, enable_thinking)?;
    let ids = tokenizer.encode(&prompt)?;
    ask_tokens(model, tokenizer, &prompt, &ids, budget, on_prefill)
}

/// [`ask`] for a prompt already templated (`prompt`) and encoded (`ids`).
pub fn ask_tokens(
    model: &dyn LanguageModel,
    tokenizer: &TextTokenizer,
    prompt: &str,
    ids: &[u32],
    budget: &Budget,
    on_prefill: impl FnMut(usize, usize),
) -> Result<Answer> {
    ask_drawing(model, tokenizer, prompt, ids, budget, Sampler::new(SamplingParams::default()), on_prefill)
}

/// [`ask_tokens`] drawing with `sampler` (greedy under a constraint, say).
pub fn ask_drawing(
    model: &dyn LanguageModel,
    tokenizer: &TextTokenizer,
    prompt: &str,
    ids: &[u32],
    budget: &Budget,
    mut sampler: Sampler,
    on_prefill: impl FnMut(usize, usize),
) -> Result<Answer> {
    let opts = GenerateOptions { max_tokens: budget.max_tokens, prefill_step: budget.prefill_step, ..Default::default() };
    let mut cache = model.new_cache();
    let mut tokens = Vec::new();
    let mut looped = false;
    let generation = generate(model, &mut cache, ids, &mut sampler, &opts, on_prefill, |token| {
        tokens.push(token);
        looped = repeating_tail(&tokens);
        if looped {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })?;
    let raw = tokenizer.decode(&generation.tokens)?;
    let mut think = ThinkFilter::after_prompt(prompt);
    let (head, tail) = (think.split(&raw), think.finish_split());
    let ending = match generation.stop {
        _ if looped => Ending::Loop,
        StopReason::EndOfSequence => Ending::Finished,
        _ => Ending::Cap,
    };
    Ok(Answer {
        text: (head.answer + &tail.answer).trim().to_string(),
        reasoning: head.reasoning + &tail.reasoning,
        raw,
        ending,
        stats: generation.stats,
    })
}

/// Shortest stretch whose 8 back-to-back repeats make a loop.
const LOOP_REPEATS: usize = 8;
/// Longest period looked for.
const LOOP_PERIOD: usize = 64;

/// Whether `tokens` ends in `LOOP_REPEATS` copies of one stretch of at most `LOOP_PERIOD`
/// tokens (at least 32 tokens in all, so a short run like `...` is not a loop). Greedy decoding
/// that gets here repeats forever.
pub fn repeating_tail(tokens: &[u32]) -> bool {
    (1..=LOOP_PERIOD).any(|period| {
        let span = (period * LOOP_REPEATS).max(32);
        span <= tokens.len() && {
            let tail = &tokens[tokens.len() - span..];
            tail[period..].iter().zip(tail).all(|(a, b)| a == b)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::repeating_tail;

    #[test]
    fn loops_are_long_exact_repeats() {
        let cycle: Vec<u32> = [5, 6, 7].iter().cycle().take(24).copied().collect();
        assert!(!repeating_tail(&cycle), "24 tokens is under the 32-token minimum");
        let cycle: Vec<u32> = [5, 6, 7].iter().cycle().take(33).copied().collect();
        assert!(repeating_tail(&cycle));
        let mut text: Vec<u32> = (0..100).collect();
        assert!(!repeating_tail(&text));
        // A 40-token stretch repeated 7 times is not yet a loop, 8 times is.
        let stretch: Vec<u32> = (1000..1040).collect();
        for _ in 0..7 {
            text.extend(&stretch);
        }
        assert!(!repeating_tail(&text));
        text.extend(&stretch);
        assert!(repeating_tail(&text));
        text.push(1);
        assert!(!repeating_tail(&text));
    }
}
