//! `sala bench` output: llama-bench's field names in CSV / JSON / JSONL, a markdown (or terminal)
//! table, and a side-by-side table with ratios when several models ran. Files are appended to, so
//! a CI job can keep one history file.

use super::bench::{BenchPlan, BenchRow};
use super::report::MarkdownRows;
pub use super::report::Format;
use super::report::{Records, Report};
use crate::engine::memory::human;
use serde_json::{json, Value};
use std::io::Write;
use std::path::PathBuf;

/// The CSV columns, in order (llama-bench's names where it has one).
pub const FIELDS: &[&str] = &[
    "model_filename", "model_type", "model_size", "n_params", "backend", "dtype", "n_batch", "n_prompt", "n_gen", "n_depth",
    "n_seq", "draft_layers", "n_draft", "acceptance", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts", "peak_mem",
    "prefix", "n_cached", "prefix_bytes", "prefix_mem", "grammar",
    "build_ms", "encode_ms", "other_ms", "blocked_ms", "device_wait_ms", "ops", "device_ms", "device_gaps_ms", "device_draw_ms",
];

/// One row as `FIELDS` → value.
pub fn record(row: &BenchRow, test_time: &str) -> Vec<(&'static str, Value)> {
    let m = &row.model;
    let values = vec![
        json!(m.model_filename), json!(m.model_type), json!(m.model_size), json!(m.n_params), json!(m.backend), json!(m.dtype),
        json!(row.n_batch), json!(row.n_prompt()), json!(row.n_gen()), json!(row.depth), json!(row.n_seq()),
        json!(row.draft().map(|d| d.0)), json!(row.draft().map(|d| d.1)), json!(row.acceptance), json!(test_time),
        json!(row.avg_ns().round() as u64), json!(row.stddev_ns().round() as u64), json!(row.avg_ts()), json!(row.stddev_ts()),
        json!(row.samples_ns), json!(row.samples_ts()), json!(row.peak_mem),
        json!(row.prefix().map(|p| p.name())), json!(row.reuse.map(|r| r.cached_tokens)), json!(row.reuse.map(|r| r.kept_bytes)),
        json!(row.reuse.and_then(|r| r.measured_bytes)), json!(row.grammar()),
        json!(row.host.map(|h| h.build_ms)), json!(row.host.map(|h| h.encode_ms)), json!(row.host.map(|h| h.other_ms)),
        json!(row.host.map(|h| h.blocked_ms)), json!(row.host.map(|h| h.device_wait_ms)), json!(row.host.map(|h| h.ops)),
        json!(row.host.and_then(|h| h.device_ms)), json!(row.host.and_then(|h| h.device_gaps_ms)),
        json!(row.host.and_then(|h| h.device_draw_ms)),
    ];
    FIELDS.iter().copied().zip(values).collect()
}

/// The rows as records with `FIELDS`.
fn records(rows: &[BenchRow], test_time: &str) -> Records {
    let mut records = Records::new(FIELDS);
    for r in rows {
        records.push(record(r, test_time).into_iter().map(|(_, v)| v).collect());
    }
    records
}

/// Which table a run's rows make and its optional columns: known from the plan before any row
/// exists, so rows can be printed as they finish.
#[derive(Clone, Copy)]
pub struct Columns {
    pub follow_up: bool,
    pub speculative: bool,
    pub constrained: bool,
    /// Served rows beside pipelined ones (the speed suite): each served row's share of them.
    pub served: bool,
    /// `--profile`: the host's time per step of generation tests, and its graphs' operations.
    pub profile: bool,
}

impl Columns {
    pub fn of_plan(plan: &BenchPlan) -> Self {
        let generates = plan.generations.iter().any(|&n| n > 0);
        Self {
            follow_up: plan.follow_ups,
            speculative: !plan.follow_ups && !plan.grammar && generates && plan.draft_layers.iter().any(|&l| l > 0),
            constrained: !plan.follow_ups && plan.grammar && generates,
            served: !plan.follow_ups && !plan.grammar && generates && !plan.seqs.is_empty(),
            profile: !plan.follow_ups && plan.profile && generates,
        }
    }
}

/// `pp512 @ d4096`-style rows: model, size, params, backend, dtype, test, t/s (mean ± sd), peak
/// memory, and the draft acceptance when a speculative test ran. Follow-up rows get their own
/// table ([`follow_up_table`]). A row's cells depend only on it and the rows before it (a
/// follow-up's cold run, a grammar test's free run come first), so the last row of a growing
/// table is final when printed.
fn table(rows: &[BenchRow], Columns { follow_up, speculative, constrained, served, profile }: Columns) -> Report {
    if follow_up {
        return follow_up_table(rows);
    }
    let mut headers = vec!["model", "size", "params", "backend", "dtype", "test", "t/s", "peak mem"];
    if speculative {
        headers.push("accepted");
    }
    if constrained {
        headers.push("time vs free");
    }
    if served {
        headers.push("of pipelined");
    }
    if profile {
        headers.extend(["step ms", "build", "encode", "other", "blocked", "read wait", "ops", "device", "gaps", "draw"]);
    }
    let mut report = Report::new(&headers);
    for r in rows {
        let accepted = r.acceptance.map_or_else(String::new, |a| format!("{:.0}%", a * 100.0));
        // Grammar rows: how much longer each step took than the same decoding without masks.
        let free = rows.iter().find(|f| {
            f.grammar() == Some(false) && f.model.model_filename == r.model.model_filename && f.n_gen() == r.n_gen() && f.n_seq() == r.n_seq() && f.depth == r.depth
        });
        let vs_free = match (r.grammar(), free) {
            (Some(true), Some(f)) => format!("{:+.1}%", (r.avg_ns() / f.avg_ns() - 1.0) * 100.0),
            _ => String::new(),
        };
        // Served rows: the share of the pipelined decoding's rate users get.
        let pipelined = rows.iter().find(|p| {
            p.is_pipelined() && p.model.model_filename == r.model.model_filename && p.n_gen() == r.n_gen() && p.n_seq() == r.n_seq() && p.depth == r.depth
        });
        let of_pipelined = match (r.grammar(), pipelined) {
            (Some(false), Some(p)) => format!("{:.2}×", r.avg_ts() / p.avg_ts()),
            _ => String::new(),
        };
        let host = match (profile, r.host) {
            (false, _) => vec![],
            (true, None) => vec![String::new(); 10],
            (true, Some(h)) => {
                let step_ms = r.avg_ns() / 1e6 / r.n_gen().max(1) as f64;
                let mut cells: Vec<String> = [step_ms, h.build_ms, h.encode_ms, h.other_ms, h.blocked_ms, h.device_wait_ms].iter().map(|ms| format!("{ms:.2}")).collect();
                cells.push(format!("{:.0}", h.ops));
                cells.extend([h.device_ms, h.device_gaps_ms, h.device_draw_ms].map(|ms| ms.map_or_else(String::new, |ms| format!("{ms:.2}"))));
                cells
            }
        };
        report.push([vec![
            r.model.model_filename.clone(),
            human(r.model.model_size),
            params(r.model.n_params),
            r.model.backend.clone(),
            r.model.dtype.clone(),
            r.name(),
            format!("{:.2} ± {:.2}", r.avg_ts(), r.stddev_ts()),
            human(r.peak_mem),
        ], if speculative { vec![accepted] } else { vec![] }, if constrained { vec![vs_free] } else { vec![] }, if served { vec![of_pipelined] } else { vec![] }, host]
        .concat());
    }
    report
}

/// `ttft64 @ d131072 warm`-style rows: the time to first token (mean ± sd), how many times
/// faster than the same follow-up cold, the prompt tokens taken from the kept state, the bytes
/// kept (prefix cache: counted / measured growth of MLX's active memory; disk: the file) and
/// the peak memory.
pub fn follow_up_table(rows: &[BenchRow]) -> Report {
    let mut report = Report::new(&["model", "size", "backend", "dtype", "test", "ttft", "vs cold", "cached", "kept", "peak mem"]);
    for r in rows {
        let cold = rows.iter().find(|c| {
            c.prefix() == Some(super::bench::Prefix::Cold) && c.model.model_filename == r.model.model_filename && c.depth == r.depth && c.n_prompt() == r.n_prompt()
        });
        let speedup = match cold {
            Some(c) if r.avg_ns() > 0.0 => format!("{:.1}×", c.avg_ns() / r.avg_ns()),
            _ => "—".into(),
        };
        let kept = match r.reuse {
            Some(reuse) if reuse.kept_bytes > 0 => match reuse.measured_bytes {
                Some(m) => format!("{} ({} measured)", human(reuse.kept_bytes), human(m)),
                None => human(reuse.kept_bytes),
            },
            _ => "—".into(),
        };
        report.push(vec![
            r.model.model_filename.clone(),
            human(r.model.model_size),
            r.model.backend.clone(),
            r.model.dtype.clone(),
            r.name(),
            format!("{} ± {}", seconds(r.avg_ns()), seconds(r.stddev_ns())),
            speedup,
            r.reuse.map_or(0, |u| u.cached_tokens).to_string(),
            kept,
            human(r.peak_mem),
        ]);
    }
    report
}

/// `812 ms` or `1.53 s`.
fn seconds(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else {
        format!("{:.0} ms", ns / 1e6)
    }
}

fn params(n: usize) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2} B", n as f64 / 1e9)
    } else {
        format!("{:.1} M", n as f64 / 1e6)
    }
}

/// With several models: one row per test, each model's t/s side by side, and every model's ratio
/// to the first.
pub fn comparison(rows: &[BenchRow]) -> Option<Report> {
    let mut models: Vec<&str> = Vec::new();
    for r in rows {
        if !models.contains(&r.model.model_filename.as_str()) {
            models.push(&r.model.model_filename);
        }
    }
    if models.len() < 2 {
        return None;
    }
    let mut headers = vec!["test".to_string()];
    headers.extend(models.iter().map(|m| format!("{m} t/s")));
    headers.extend(models[1..].iter().map(|m| format!("{m} / {}", models[0])));
    let mut tests: Vec<String> = Vec::new();
    for r in rows {
        if !tests.contains(&r.name()) {
            tests.push(r.name());
        }
    }
    let mut report = Report { headers, rows: Vec::new() };
    for test in tests {
        let speed = |m: &str| rows.iter().find(|r| r.model.model_filename == m && r.name() == test).map(BenchRow::avg_ts);
        let speeds: Vec<Option<f64>> = models.iter().map(|m| speed(m)).collect();
        let mut row = vec![test];
        row.extend(speeds.iter().map(|s| s.map_or("—".into(), |v| format!("{v:.2}"))));
        row.extend(speeds[1..].iter().map(|s| match (s, speeds[0]) {
            (Some(s), Some(base)) if base > 0.0 => format!("{:.2}×", s / base),
            _ => "—".into(),
        }));
        report.rows.push(row);
    }
    Some(report)
}

/// Results written as each test finishes: to stdout in the `-o` format (a markdown table a row
/// at a time, CSV after its header, JSON lines, or one JSON array closed at the end) and appended
/// to the results file, so a long run shows each result at once and an interrupted one keeps what
/// it measured.
pub struct RowStream {
    /// What stdout gets: the `-o` format, or the markdown table when a results file takes it.
    printed: Format,
    /// The results file and its format.
    file: Option<(PathBuf, Format)>,
    test_time: String,
    columns: Columns,
    markdown: MarkdownRows,
    headers: Vec<String>,
    rows: Vec<BenchRow>,
}

impl RowStream {
    /// `models` and `tests` (names) set the markdown columns' widths. Refuses a results file the
    /// rows could not be appended to before anything is measured.
    pub fn new(format: Format, file: Option<PathBuf>, test_time: &str, columns: Columns, models: &[String], tests: &[String]) -> anyhow::Result<Self> {
        if let Some(path) = &file {
            Records::new(FIELDS).check_appendable(format, path, "sala bench")?;
        }
        let headers = table(&[], columns).headers;
        let widest = |names: &[String]| names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        // Room for typical values, so rows line up without knowing them in advance.
        let at_least: Vec<usize> = headers
            .iter()
            .map(|h| match h.as_str() {
                "model" => widest(models),
                "test" => widest(tests),
                "t/s" => 18,
                "ttft" => 16,
                "kept" => 12,
                "size" | "peak mem" => 10,
                "params" | "backend" => 8,
                _ => 0,
            })
            .collect();
        Ok(Self {
            printed: if file.is_some() { Format::Md } else { format },
            file: file.map(|f| (f, format)),
            test_time: test_time.to_string(),
            columns,
            markdown: MarkdownRows::new(&headers, &at_least),
            headers,
            rows: Vec::new(),
        })
    }

    /// Records a finished test: appends it to the results file and returns what stdout gets.
    pub fn push(&mut self, row: BenchRow) -> anyhow::Result<String> {
        let first = self.rows.is_empty();
        self.rows.push(row);
        let cells = table(&self.rows, self.columns).rows.pop().expect("the row just pushed");
        let line = self.markdown.row(&cells);
        let header = if first { self.markdown.header(&self.headers) } else { String::new() };
        let record = records(&self.rows[self.rows.len() - 1..], &self.test_time);
        if let Some((path, format)) = &self.file {
            record.append(*format, path, &format!("{header}{line}"), "sala bench")?;
        }
        let mut out = Vec::new();
        match self.printed {
            Format::Md => write!(out, "{header}{line}")?,
            Format::Json => {
                let object = serde_json::to_string_pretty(&record.objects()[0])?.replace('\n', "\n  ");
                write!(out, "{}  {object}", if first { "[\n" } else { ",\n" })?;
            }
            format => record.write(format, first, &mut out)?,
        }
        Ok(String::from_utf8(out)?)
    }

    /// The end of the output (a JSON array's close; with several models, the side-by-side
    /// comparison) and the rows.
    pub fn finish(self) -> anyhow::Result<(String, Vec<BenchRow>)> {
        let comparison = comparison(&self.rows).map(|c| format!("\n{}", c.markdown())).unwrap_or_default();
        if let Some((path, Format::Md)) = &self.file {
            Records::new(FIELDS).append(Format::Md, path, &comparison, "sala bench")?;
        }
        let end = match self.printed {
            Format::Md => comparison,
            Format::Json if self.rows.is_empty() => "[]\n".into(),
            Format::Json => "\n]\n".into(),
            _ => String::new(),
        };
        Ok((end, self.rows))
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time (UTC).
pub fn iso8601(unix: u64) -> String {
    let (days, secs) = ((unix / 86400) as i64, unix % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::bench::{BenchRow, Decode, ModelMeta, Test};

    fn row(model: &str, test: Test, depth: usize, samples_ns: Vec<u64>) -> BenchRow {
        let model = ModelMeta {
            model_filename: model.into(),
            model_type: "llama".into(),
            model_size: 1000,
            n_params: 2_000_000_000,
            backend: "cpu".into(),
            dtype: "f32".into(),
        };
        BenchRow { model, test, depth, n_batch: 512, samples_ns, peak_mem: 4096, acceptance: None, reuse: None, host: None }
    }

    #[test]
    fn statistics_names_and_ratios() {
        let a = row("a.gguf", Test::Generate(100, Decode::Pipelined { seqs: 1 }), 0, vec![1_000_000_000, 2_000_000_000]);
        assert_eq!((a.name(), a.samples_ts()), ("tg100".to_string(), vec![100.0, 50.0]));
        assert_eq!(a.avg_ts(), 75.0);
        assert!((a.stddev_ts() - 35.355339).abs() < 1e-5);
        let b = row("b.gguf", Test::Generate(100, Decode::Pipelined { seqs: 1 }), 0, vec![500_000_000; 3]);
        assert_eq!(row("a", Test::Prompt(512), 4096, vec![1]).name(), "pp512 @ d4096");
        // Batched: aggregate tokens/s over the sequences.
        let batched = row("a", Test::Generate(100, Decode::Pipelined { seqs: 8 }), 0, vec![1_000_000_000]);
        assert_eq!((batched.name(), batched.avg_ts()), ("tg100 x8".to_string(), 800.0));
        let draft = Test::Generate(64, Decode::Greedy { draft_layers: 8, num_draft: 4 });
        assert_eq!(row("a", draft, 4096, vec![1]).name(), "tg64 draft 8/4 @ d4096");
        let c = comparison(&[a.clone(), b]).unwrap();
        assert_eq!(c.headers, ["test", "a.gguf t/s", "b.gguf t/s", "b.gguf / a.gguf"]);
        assert_eq!(c.rows, vec![vec!["tg100", "75.00", "200.00", "2.67×"]]);
        assert!(comparison(&[a]).is_none());
    }

    #[test]
    fn csv_and_jsonl_carry_every_field() {
        let rows = [row("a.gguf", Test::Prompt(64), 0, vec![2_000_000, 4_000_000])];
        let mut out = Vec::new();
        records(&rows, "2026-01-01T00:00:00Z").write(Format::Csv, true, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), FIELDS.join(","));
        let cells: Vec<&str> = lines.next().unwrap().split(',').collect();
        let want = "a.gguf,llama,1000,2000000000,cpu,f32,512,64,0,0,1,,,,2026-01-01T00:00:00Z,3000000,1414214,24000.0,SD,2000000 4000000,32000.0 16000.0,4096,,,,";
        for (i, (got, want)) in cells.iter().zip(want.split(',')).enumerate() {
            match want {
                // sqrt(2) · 8000, to the last digit the float printer chooses
                "SD" => assert!((got.parse::<f64>().unwrap() - 2f64.sqrt() * 8000.0).abs() < 1e-9, "{got}"),
                _ => assert_eq!(*got, want, "column {}", FIELDS[i]),
            }
        }
        assert_eq!(cells.len(), FIELDS.len());
        let mut out = Vec::new();
        records(&rows, "t").write(Format::Jsonl, false, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((v["n_prompt"].as_u64(), v["avg_ts"].as_f64(), v["samples_ns"][1].as_u64()), (Some(64), Some(24000.0), Some(4_000_000)));
        assert_eq!(iso8601(1_795_300_000), "2026-11-21T22:26:40Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
    }
}
