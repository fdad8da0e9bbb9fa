//! Result tables (printed with comfy-table on a terminal, markdown elsewhere) and result records
//! (CSV / JSON / JSONL files that are appended to, so a CI job can keep one history file).

use anyhow::Context;
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// How results are written (`-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Md,
    Csv,
    Json,
    Jsonl,
}

pub struct Report {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Report {
    pub fn new(headers: &[&str]) -> Self {
        Self { headers: headers.iter().map(|h| h.to_string()).collect(), rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.headers.len());
        self.rows.push(row);
    }

    pub fn table(&self) -> comfy_table::Table {
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
        table.set_header(&self.headers);
        for row in &self.rows {
            table.add_row(row);
        }
        // Numbers right-aligned, the first (label) column left.
        for column in table.column_iter_mut().skip(1) {
            column.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
        table
    }

    /// A markdown table (what `-o md` writes to a file or a pipe).
    pub fn markdown(&self) -> String {
        let mut out = format!("| {} |\n|", self.headers.join(" | "));
        for i in 0..self.headers.len() {
            out.push_str(if i == 0 { " --- |" } else { " ---: |" });
        }
        out.push('\n');
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }

    pub fn write_csv(&self, path: &Path) -> anyhow::Result<()> {
        let mut writer = csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
        writer.write_record(&self.headers)?;
        for row in &self.rows {
            writer.write_record(row)?;
        }
        writer.flush().with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}

/// A markdown table written a row at a time, as llama-bench prints it, so each result shows as
/// soon as it exists: columns padded to widths fixed up front (a longer cell widens its own row).
pub struct MarkdownRows {
    widths: Vec<usize>,
}

impl MarkdownRows {
    /// Each column as wide as its header or its `at_least` width, whichever is wider.
    pub fn new(headers: &[String], at_least: &[usize]) -> Self {
        let widths = headers.iter().enumerate().map(|(i, h)| h.chars().count().max(at_least.get(i).copied().unwrap_or(0))).collect();
        Self { widths }
    }

    /// The header line and the alignment line (the first column left, the rest right).
    pub fn header(&self, headers: &[String]) -> String {
        let rule: Vec<String> = self.widths.iter().enumerate().map(|(i, &w)| if i == 0 { "-".repeat(w) } else { format!("{}:", "-".repeat(w.max(2) - 1)) }).collect();
        format!("{}| {} |\n", self.row(headers), rule.join(" | "))
    }

    pub fn row(&self, cells: &[String]) -> String {
        let padded: Vec<String> = cells
            .iter()
            .zip(&self.widths)
            .enumerate()
            .map(|(i, (c, &w))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
            .collect();
        format!("| {} |\n", padded.join(" | "))
    }
}

/// Result rows with named fields, in the order of `fields`.
pub struct Records {
    pub fields: &'static [&'static str],
    pub rows: Vec<Vec<Value>>,
}

impl Records {
    pub fn new(fields: &'static [&'static str]) -> Self {
        Self { fields, rows: Vec::new() }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        debug_assert_eq!(row.len(), self.fields.len());
        self.rows.push(row);
    }

    /// The rows as JSON objects keyed by the field names.
    pub fn objects(&self) -> Vec<Value> {
        let object = |row: &Vec<Value>| Value::Object(self.fields.iter().map(|f| f.to_string()).zip(row.iter().cloned()).collect());
        self.rows.iter().map(object).collect()
    }

    /// Writes the rows as CSV (the header only when `header` is set: a new or empty file), JSON
    /// (one array) or JSONL. Markdown is the caller's table, not a record format.
    pub fn write(&self, format: Format, header: bool, out: &mut dyn Write) -> anyhow::Result<()> {
        match format {
            Format::Csv => {
                let mut w = csv::WriterBuilder::new().from_writer(out);
                if header {
                    w.write_record(self.fields)?;
                }
                for row in &self.rows {
                    w.write_record(row.iter().map(csv_cell))?;
                }
                w.flush()?;
            }
            Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&self.objects())?)?,
            Format::Jsonl => {
                for o in self.objects() {
                    writeln!(out, "{o}")?;
                }
            }
            Format::Md => anyhow::bail!("internal: markdown is written from a table"),
        }
        Ok(())
    }

    /// Appends to the results file `path`: a JSON file stays one array (extended), a CSV file must
    /// have the same columns (its header is written when new), `markdown` is what an md file gets.
    /// `writer` names the command, for the message when the file is someone else's.
    pub fn append(&self, format: Format, path: &Path, markdown: &str, writer: &str) -> anyhow::Result<()> {
        let existing = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if format == Format::Json {
            let mut all = self.earlier_json(path, existing)?;
            all.extend(self.objects());
            let text = serde_json::to_string_pretty(&all)? + "\n";
            // Written aside and renamed over: a run cut off mid-write keeps the earlier results.
            let part = path.with_extension("json.part");
            std::fs::write(&part, text).with_context(|| format!("writing {}", part.display()))?;
            return std::fs::rename(&part, path).with_context(|| format!("writing {}", path.display()));
        }
        self.check_appendable(format, path, writer)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        match format {
            Format::Md => file.write_all(markdown.as_bytes()).with_context(|| format!("writing {}", path.display())),
            _ => self.write(format, existing == 0, &mut file),
        }
    }

    /// Refuses a results file these records cannot be appended to (a JSON file that is not an
    /// array, a CSV file with other columns), so a long run finds out before it starts.
    pub fn check_appendable(&self, format: Format, path: &Path, writer: &str) -> anyhow::Result<()> {
        let existing = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        match format {
            Format::Json => self.earlier_json(path, existing).map(drop),
            Format::Csv if existing > 0 && read(path)?.lines().next() != Some(self.fields.join(",").as_str()) => anyhow::bail!(
                "{} has other columns than `{writer}` writes; append to a file it wrote, or start a new one",
                path.display()
            ),
            _ => Ok(()),
        }
    }

    /// The array a JSON results file already holds (none when it is new or empty).
    fn earlier_json(&self, path: &Path, existing: u64) -> anyhow::Result<Vec<Value>> {
        if existing == 0 {
            return Ok(Vec::new());
        }
        serde_json::from_str(&read(path)?).with_context(|| format!("{} is not a JSON array of results; use a new file", path.display()))
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// A CSV cell: strings bare, null empty, arrays space-separated, the rest as JSON.
fn csv_cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(items) => items.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" "),
        other => other.to_string(),
    }
}
