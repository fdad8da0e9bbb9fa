//! `sala bench --suite quality`: short math and reasoning questions with exact answers
//! (`eval/quality.jsonl`, written for this project), asked greedily with a token cap. A question
//! counts as answered when the model ends by itself with an answer outside its think block; one
//! that hits the cap or loops while thinking is a think loop. Scoring reads the final answer: a
//! `\boxed{}` or `Answer:` line if there is one, else the whole answer; numbers compare as numbers
//! (the last one given), words as the first or last word.

use super::ask::{ask, Answer, Budget};
use super::report::{Records, Report};
use crate::engine::error::{Error, Result};
use crate::engine::model::LanguageModel;
use crate::engine::tokenizer::{Message, TextTokenizer};
use serde::Deserialize;
use serde_json::json;

const QUESTIONS: &str = include_str!("../../eval/quality.jsonl");

#[derive(Debug, Clone, Deserialize)]
pub struct Item {
    pub id: String,
    pub category: String,
    pub question: String,
    pub answer: String,
}

/// The shipped questions, in file order.
pub fn items() -> Result<Vec<Item>> {
    QUESTIONS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| Error::Json { path: format!("eval/quality.jsonl line {}", i + 1).into(), message: e.to_string() })
        })
        .collect()
}

/// One question's outcome.
pub struct Outcome {
    pub item: Item,
    pub answer: Answer,
    /// What was read as the final answer.
    pub extracted: String,
    pub correct: bool,
}

pub fn run_item(model: &dyn LanguageModel, tokenizer: &TextTokenizer, item: &Item, enable_thinking: bool, max_tokens: usize, prefill_step: usize) -> Result<Outcome> {
    let messages = [Message::new("user", &item.question)];
    let answer = ask(model, tokenizer, &messages, enable_thinking, &Budget { max_tokens, prefill_step }, |_, _| {})?;
    let extracted = final_answer(&answer.text);
    let correct = answer.answered() && matches(&extracted, &item.answer);
    Ok(Outcome { item: item.clone(), answer, extracted, correct })
}

/// The part of an answer that states the result.
pub fn final_answer(text: &str) -> String {
    if let Some(start) = text.rfind("\\boxed{") {
        let rest = &text[start + "\\boxed{".len()..];
        // Up to the matching brace.
        let mut depth = 1;
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return rest[..i].trim().to_string();
                    }
                }
                _ => {}
            }
        }
    }
    for line in text.lines().rev() {
        let lower = line.to_lowercase();
        let lower = lower.trim_start_matches(['*', '#', ' ']);
        for prefix in ["final answer:", "answer:", "final answer is", "the answer is"] {
            if let Some(pos) = lower.find(prefix) {
                return lower[pos + prefix.len()..].trim_matches(['*', ':', ' ']).to_string();
            }
        }
    }
    text.trim().to_string()
}

/// Whether `answer` states `expected`: numerically for a number (the last number in the answer;
/// `1,830` and `$32.40` count), else as its first or last word, case-insensitively.
pub fn matches(answer: &str, expected: &str) -> bool {
    if let Ok(want) = expected.parse::<f64>() {
        return numbers(answer).last().is_some_and(|got| (got - want).abs() <= 1e-9 * want.abs().max(1.0));
    }
    let words: Vec<String> = answer.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    let want = expected.to_lowercase();
    words.first() == Some(&want) || words.last() == Some(&want)
}

/// The numbers in `text`, in order (`-12`, `3.5`, `1,830`).
fn numbers(text: &str) -> Vec<f64> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_digit() {
            let start = i;
            let mut s = String::new();
            while i < chars.len() {
                let c = chars[i];
                let digit_follows = chars.get(i + 1).is_some_and(char::is_ascii_digit);
                if c.is_ascii_digit() {
                    s.push(c);
                } else if c == ',' && digit_follows && !s.contains('.') {
                    // thousands separator
                } else if c == '.' && digit_follows && !s.contains('.') {
                    s.push(c);
                } else {
                    break;
                }
                i += 1;
            }
            let negative = start > 0 && (chars[start - 1] == '-' || chars[start - 1] == '−') && (start < 2 || !chars[start - 2].is_alphanumeric());
            if let Ok(v) = s.parse::<f64>() {
                out.push(if negative { -v } else { v });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Answered / correct / think loops per category (file order), then the total.
pub fn summary(model: &str, outcomes: &[Outcome]) -> (Report, Records) {
    let mut categories: Vec<&str> = Vec::new();
    for o in outcomes {
        if !categories.contains(&o.item.category.as_str()) {
            categories.push(&o.item.category);
        }
    }
    let mut report = Report::new(&["category", "questions", "answered", "correct", "think loops", "accuracy"]);
    let mut records = Records::new(SUMMARY_FIELDS);
    let groups = categories.iter().map(|c| (c.to_string(), outcomes.iter().filter(|o| o.item.category == *c).collect::<Vec<_>>()));
    for (category, group) in groups.chain([("total".to_string(), outcomes.iter().collect())]) {
        let n = group.len();
        let answered = group.iter().filter(|o| o.answer.answered()).count();
        let correct = group.iter().filter(|o| o.correct).count();
        let loops = group.iter().filter(|o| o.answer.stuck_thinking()).count();
        let tokens: usize = group.iter().map(|o| o.answer.stats.generated_tokens).sum();
        let accuracy = correct as f64 / n.max(1) as f64;
        report.push(vec![
            category.clone(),
            n.to_string(),
            answered.to_string(),
            correct.to_string(),
            loops.to_string(),
            format!("{:.1}%", 100.0 * accuracy),
        ]);
        records.push(vec![
            json!(model),
            json!(category),
            json!(n),
            json!(answered),
            json!(correct),
            json!(loops),
            json!(accuracy),
            json!(tokens as f64 / n.max(1) as f64),
        ]);
    }
    (report, records)
}

pub const SUMMARY_FIELDS: &[&str] =
    &["model_filename", "category", "questions", "answered", "correct", "think_loops", "accuracy", "avg_gen_tokens"];

pub const SAMPLE_FIELDS: &[&str] =
    &["model_filename", "id", "category", "expected", "extracted", "correct", "ending", "gen_tokens", "answer", "reasoning"];

/// One record per question, with the raw answer.
pub fn samples(model: &str, outcomes: &[Outcome]) -> Records {
    let mut records = Records::new(SAMPLE_FIELDS);
    for o in outcomes {
        records.push(vec![
            json!(model),
            json!(o.item.id),
            json!(o.item.category),
            json!(o.item.answer),
            json!(o.extracted),
            json!(o.correct),
            json!(o.answer.ending.name()),
            json!(o.answer.stats.generated_tokens),
            json!(o.answer.text),
            json!(o.answer.reasoning),
        ]);
    }
    records
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_questions_parse_and_cover_five_categories() {
        let items = items().unwrap();
        assert_eq!(items.len(), 40);
        let mut categories: Vec<&str> = items.iter().map(|i| i.category.as_str()).collect();
        categories.dedup();
        assert_eq!(categories, ["arithmetic", "algebra", "word-problems", "logic", "sequences"]);
        assert!(items.iter().all(|i| !i.answer.is_empty() && !i.answer.contains(' ')));
    }

    #[test]
    fn final_answers_are_read_like_a_grader() {
        assert_eq!(final_answer("Let me see.\n\\boxed{\\frac{7}{2}} is wrong, so \\boxed{3.5}"), "3.5");
        assert_eq!(final_answer("Working...\n**Final Answer:** 1,830"), "1,830");
        assert_eq!(final_answer("42"), "42");
        assert!(matches("1,830", "1830"));
        assert!(matches("$32.40", "32.4"));
        assert!(matches("x = -3", "-3"));
        assert!(!matches("x = 3", "-3"));
        assert!(!matches("23 or 24", "23"), "the last number counts");
        assert!(matches("3.5.", "3.5"));
        assert!(!matches("35", "3.5"));
        assert!(matches("Ben.", "ben"));
        assert!(matches("The tallest is Ben", "ben"));
        assert!(!matches("Dana, not Ben, is tallest", "ben"));
        assert!(!matches("", "7"));
    }
}
