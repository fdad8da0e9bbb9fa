//! Scores and the leaderboard's `data_non_live.csv`, as BFCL computes them.
//!
//! * A category's accuracy is correct answers / answers.
//! * Simple AST = the unweighted mean of the three simple categories.
//! * AST Summary = the unweighted mean of Simple, Multiple, Parallel and
//!   Parallel Multiple; it shows `N/A` when any of them is missing.
//! * Non-Live Overall Acc = the same mean, but missing categories count as
//!   0 and the cell is never `N/A`.  Irrelevance is a separate column.
//! * Cells are `"{:.2f}%"` of accuracy × 100 (Python rounds the exact binary
//!   value half-to-even; so does Rust's formatting); a missing category is
//!   `N/A`.  Rows are sorted by Non-Live Overall descending (stable), ranks
//!   start at 1, cells are joined with `,` unquoted, lines end with `\n`
//!   except the last.

use super::data::Category;

pub const NON_LIVE_CSV_HEADER: &str = "Rank,Model,Non-Live Overall Acc,AST Summary,Simple AST,Python Simple AST,Java Simple AST,JavaScript Simple AST,Multiple AST,Parallel AST,Parallel Multiple AST,Irrelevance Detection";

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CategoryScore {
    pub category: Category,
    pub correct: usize,
    pub total: usize,
}

impl CategoryScore {
    pub fn accuracy(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

/// The `data_non_live.csv` numbers for one model; `None` = not evaluated
/// (`N/A`).
#[derive(Clone, Debug, PartialEq)]
pub struct NonLiveSummary {
    pub overall: f64,
    pub ast_summary: Option<f64>,
    pub simple: Option<f64>,
    pub python_simple: Option<f64>,
    pub java_simple: Option<f64>,
    pub javascript_simple: Option<f64>,
    pub multiple: Option<f64>,
    pub parallel: Option<f64>,
    pub parallel_multiple: Option<f64>,
    pub irrelevance: Option<f64>,
}

/// Mean where a missing value counts as 0; `None` if any is missing.
fn unweighted(values: &[Option<f64>]) -> (f64, Option<f64>) {
    let mean = values.iter().map(|v| v.unwrap_or(0.0)).sum::<f64>() / values.len() as f64;
    (mean, values.iter().all(Option::is_some).then_some(mean))
}

pub fn summarize(scores: &[CategoryScore]) -> NonLiveSummary {
    let get = |c: Category| {
        scores
            .iter()
            .find(|s| s.category == c)
            .map(CategoryScore::accuracy)
    };
    let python_simple = get(Category::SimplePython);
    let java_simple = get(Category::SimpleJava);
    let javascript_simple = get(Category::SimpleJavascript);
    let (simple_value, simple) = unweighted(&[python_simple, java_simple, javascript_simple]);
    let multiple = get(Category::Multiple);
    let parallel = get(Category::Parallel);
    let parallel_multiple = get(Category::ParallelMultiple);
    // The Simple cell is N/A when a simple category is missing, but its
    // value (missing ones as 0) still enters the overall mean.
    let simple_for_mean = if simple.is_some() {
        simple
    } else {
        Some(simple_value)
    };
    let (overall, _) = unweighted(&[simple_for_mean, multiple, parallel, parallel_multiple]);
    let (_, ast_summary) = unweighted(&[simple, multiple, parallel, parallel_multiple]);
    NonLiveSummary {
        overall,
        ast_summary,
        simple,
        python_simple,
        java_simple,
        javascript_simple,
        multiple,
        parallel,
        parallel_multiple,
        irrelevance: get(Category::Irrelevance),
    }
}

/// A cell: `"{:.2f}%"` of the accuracy in percent, or `N/A`.
pub fn percent_cell(value: Option<f64>) -> String {
    value.map_or_else(|| "N/A".to_string(), |v| format!("{:.2}%", v * 100.0))
}

/// One CSV row (without the line break).
pub fn csv_row(rank: usize, model: &str, s: &NonLiveSummary) -> String {
    let cells = [
        Some(s.overall),
        s.ast_summary,
        s.simple,
        s.python_simple,
        s.java_simple,
        s.javascript_simple,
        s.multiple,
        s.parallel,
        s.parallel_multiple,
        s.irrelevance,
    ];
    let mut row = vec![rank.to_string(), model.to_string()];
    row.extend(cells.iter().map(|c| percent_cell(*c)));
    row.join(",")
}

/// The whole `data_non_live.csv` for (display name, summary) rows.
pub fn non_live_csv(models: &[(String, NonLiveSummary)]) -> String {
    let mut sorted: Vec<&(String, NonLiveSummary)> = models.iter().collect();
    sorted.sort_by(|a, b| b.1.overall.total_cmp(&a.1.overall));
    let mut lines = vec![NON_LIVE_CSV_HEADER.to_string()];
    lines.extend(
        sorted
            .iter()
            .enumerate()
            .map(|(i, (name, s))| csv_row(i + 1, name, s)),
    );
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(category: Category, correct: usize, total: usize) -> CategoryScore {
        CategoryScore {
            category,
            correct,
            total,
        }
    }

    #[test]
    fn summary_means_and_na() {
        let all = [
            score(Category::SimplePython, 300, 400),
            score(Category::SimpleJava, 50, 100),
            score(Category::SimpleJavascript, 25, 50),
            score(Category::Multiple, 100, 200),
            score(Category::Parallel, 200, 200),
            score(Category::ParallelMultiple, 0, 200),
            score(Category::Irrelevance, 120, 240),
        ];
        let s = summarize(&all);
        let simple = (0.75 + 0.5 + 0.5) / 3.0;
        assert_eq!(s.simple, Some(simple));
        assert_eq!(s.overall, (simple + 0.5 + 1.0 + 0.0) / 4.0);
        assert_eq!(s.ast_summary, Some(s.overall));
        let partial = summarize(&all[..1]);
        assert_eq!(partial.simple, None);
        assert_eq!(partial.ast_summary, None);
        assert_eq!(partial.overall, 0.75 / 3.0 / 4.0);
        assert_eq!(
            csv_row(1, "m", &partial),
            "1,m,6.25%,N/A,N/A,75.00%,N/A,N/A,N/A,N/A,N/A,N/A"
        );
    }

    #[test]
    fn percent_rounding_matches_python() {
        // Expected values printed by Python's "{:.2f}%".format(x * 100).
        assert_eq!(percent_cell(Some(0.12125)), "12.12%");
        assert_eq!(percent_cell(Some(0.00125)), "0.12%");
        assert_eq!(percent_cell(Some(0.56125)), "56.12%");
        assert_eq!(percent_cell(Some(2.0 / 3.0)), "66.67%");
        assert_eq!(percent_cell(Some(1.0)), "100.00%");
        assert_eq!(percent_cell(Some(0.0)), "0.00%");
    }

    #[test]
    fn csv_is_sorted_with_header_and_no_trailing_newline() {
        let low = summarize(&[score(Category::Multiple, 1, 2)]);
        let high = summarize(&[score(Category::Multiple, 2, 2)]);
        let csv = non_live_csv(&[("low".into(), low), ("high".into(), high)]);
        let lines: Vec<&str> = csv.split('\n').collect();
        assert_eq!(lines[0], NON_LIVE_CSV_HEADER);
        assert!(lines[1].starts_with("1,high,25.00%"));
        assert!(lines[2].starts_with("2,low,12.50%"));
        assert!(!csv.ends_with('\n'));
    }
}
