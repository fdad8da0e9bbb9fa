//! The BFCL v4 non-live categories and their data files.
//!
//! The data directory is the `bfcl_eval/data` folder of the official
//! `bfcl-eval` wheel.  Each category has a question file
//! `BFCL_v4_<name>.json` and (except irrelevance) an answer file
//! `possible_answer/BFCL_v4_<name>.json`, both JSON Lines.  BFCL's runner
//! pairs the two files by line index; we do the same and insist that the
//! ids agree.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// A non-live BFCL category, in the leaderboard's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    SimplePython,
    SimpleJava,
    SimpleJavascript,
    Multiple,
    Parallel,
    ParallelMultiple,
    Irrelevance,
}

/// The language the model writes its calls in (and BFCL decodes them as).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    Python,
    Java,
    JavaScript,
}

impl Category {
    /// BFCL's `NON_LIVE_CATEGORY`, in its order.
    pub const ALL: [Category; 7] = [
        Category::SimplePython,
        Category::SimpleJava,
        Category::SimpleJavascript,
        Category::Multiple,
        Category::Parallel,
        Category::ParallelMultiple,
        Category::Irrelevance,
    ];

    /// The official category name (also the prefix of every entry id).
    pub fn name(self) -> &'static str {
        match self {
            Category::SimplePython => "simple_python",
            Category::SimpleJava => "simple_java",
            Category::SimpleJavascript => "simple_javascript",
            Category::Multiple => "multiple",
            Category::Parallel => "parallel",
            Category::ParallelMultiple => "parallel_multiple",
            Category::Irrelevance => "irrelevance",
        }
    }

    pub fn from_name(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The category of an entry id (`simple_python_97` → simple_python),
    /// found the official way: everything before the last `_`.
    pub fn from_id(id: &str) -> Option<Category> {
        Category::from_name(id.rsplit_once('_')?.0)
    }

    pub fn language(self) -> Language {
        match self {
            Category::SimpleJava => Language::Java,
            Category::SimpleJavascript => Language::JavaScript,
            _ => Language::Python,
        }
    }

    /// Irrelevance has no ground truth: any call is wrong.
    pub fn has_ground_truth(self) -> bool {
        self != Category::Irrelevance
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One test entry: the user turn, the function docs as stored (without the
/// language hints added for inference) and, except for irrelevance, the
/// ground truth `[{func_name: {param: [alternatives...]}}, ...]`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub id: String,
    pub category: Category,
    pub question: Vec<Message>,
    pub functions: Vec<Value>,
    pub ground_truth: Option<Value>,
}

#[derive(Deserialize)]
struct QuestionLine {
    id: String,
    /// Turns of messages; non-live entries have exactly one turn.
    question: Vec<Vec<Message>>,
    function: Vec<Value>,
}

#[derive(Deserialize)]
struct AnswerLine {
    id: String,
    ground_truth: Value,
}

/// Loads a category's entries (the first `limit` if given).
pub fn load(
    data_dir: &Path,
    category: Category,
    limit: Option<usize>,
) -> Result<Vec<Entry>, String> {
    let question_path = data_dir.join(format!("BFCL_v4_{}.json", category.name()));
    let questions: Vec<QuestionLine> = read_jsonl(&question_path, limit)?;
    let answers: Option<Vec<AnswerLine>> = if category.has_ground_truth() {
        let path = data_dir
            .join("possible_answer")
            .join(format!("BFCL_v4_{}.json", category.name()));
        let answers: Vec<AnswerLine> = read_jsonl(&path, limit)?;
        if answers.len() != questions.len() {
            return Err(format!(
                "{}: {} answers for {} questions in {}",
                path.display(),
                answers.len(),
                questions.len(),
                question_path.display()
            ));
        }
        for (line, (q, a)) in questions.iter().zip(&answers).enumerate() {
            if q.id != a.id {
                return Err(format!(
                    "{} line {}: id {:?} does not match {:?} in {}",
                    path.display(),
                    line + 1,
                    a.id,
                    q.id,
                    question_path.display()
                ));
            }
        }
        Some(answers)
    } else {
        None
    };
    let mut answers = answers.map(|a| a.into_iter());
    questions
        .into_iter()
        .enumerate()
        .map(|(line, q)| {
            let mut turns = q.question.into_iter();
            let question = match (turns.next(), turns.next()) {
                (Some(turn), None) => turn,
                _ => {
                    return Err(format!(
                        "{} line {}: expected exactly one turn",
                        question_path.display(),
                        line + 1
                    ))
                }
            };
            Ok(Entry {
                id: q.id,
                category,
                question,
                functions: q.function,
                ground_truth: answers
                    .as_mut()
                    .and_then(|a| a.next())
                    .map(|a| a.ground_truth),
            })
        })
        .collect()
}

fn read_jsonl<T: for<'de> Deserialize<'de>>(
    path: &Path,
    limit: Option<usize>,
) -> Result<Vec<T>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {}", path.display(), e))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .take(limit.unwrap_or(usize::MAX))
        .map(|(i, line)| {
            serde_json::from_str(line)
                .map_err(|e| format!("{} line {}: {}", path.display(), i + 1, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ids_map_to_categories() {
        for c in Category::ALL {
            assert_eq!(Category::from_name(c.name()), Some(c));
        }
        assert_eq!(
            Category::from_id("parallel_multiple_12"),
            Some(Category::ParallelMultiple)
        );
        assert_eq!(
            Category::from_id("simple_javascript_3"),
            Some(Category::SimpleJavascript)
        );
        assert_eq!(Category::SimpleJava.language(), Language::Java);
        assert_eq!(Category::Irrelevance.language(), Language::Python);
    }

    #[test]
    fn mismatched_ids_are_reported_with_file_and_line() {
        let dir = std::env::temp_dir().join(format!("bfcl_data_test_{}", std::process::id()));
        std::fs::create_dir_all(dir.join("possible_answer")).unwrap();
        let q = r#"{"id": "simple_python_0", "question": [[{"role": "user", "content": "hi"}]], "function": []}"#;
        std::fs::write(
            dir.join("BFCL_v4_simple_python.json"),
            format!("{q}\n{}", q.replace("_0", "_1")),
        )
        .unwrap();
        std::fs::write(
            dir.join("possible_answer/BFCL_v4_simple_python.json"),
            "{\"id\": \"simple_python_0\", \"ground_truth\": []}\n{\"id\": \"simple_python_7\", \"ground_truth\": []}",
        )
        .unwrap();
        let err = load(&dir, Category::SimplePython, None).unwrap_err();
        assert!(
            err.contains("line 2") && err.contains("simple_python_7"),
            "{err}"
        );
        assert_eq!(
            load(&dir, Category::SimplePython, Some(1)).unwrap().len(),
            1
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
