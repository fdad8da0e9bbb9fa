//! `sala bfcl`: the Berkeley Function Calling Leaderboard's non-live categories (v4), asked in
//! prompt or FC mode and checked by our port of BFCL's AST checker; a per-category table, the
//! leaderboard row, `data_non_live.csv` and per-sample JSONL.

use super::RuntimeArgs;
use crate::load::{file_label, load};
use crate::progress::{bytes_progress, print_above, progress_to, work_bar};
use crate::eval::bfcl::harness::{run_entry, sample_json, Mode, Settings};
use crate::eval::bfcl::score::{non_live_csv, percent_cell, summarize, CategoryScore, NonLiveSummary};
use crate::eval::bfcl::{load as load_entries, Category};
use crate::eval::report::{MarkdownRows, Report};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala bfcl -m model --limit 50\n  sala bfcl -m model --mode fc --categories simple_python,parallel --samples out.jsonl\n  sala bfcl -m model --mode fc --constrain --limit 20\n  sala bfcl -m a -m b --csv data_non_live.csv")]
pub struct BfclArgs {
    /// Model to evaluate; repeat to rank several
    #[arg(long = "model", short = 'm', required = true)]
    pub models: Vec<PathBuf>,
    /// Device, dtype and prefill chunk
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Prompt mode (BFCL's system prompt, Python-syntax calls) or FC mode (the chat template's tools)
    #[arg(long, value_enum, default_value = "prompt")]
    pub mode: Mode,
    /// Categories (comma-separated): simple_python, simple_java, simple_javascript, multiple,
    /// parallel, parallel_multiple, irrelevance
    #[arg(long, value_delimiter = ',', default_value = "simple_python,simple_java,simple_javascript,multiple,parallel,parallel_multiple,irrelevance")]
    pub categories: Vec<String>,
    /// Only the first N entries of each category
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// BFCL's data folder (`bfcl_eval/data` of the bfcl-eval wheel); default: the pinned wheel,
    /// fetched from PyPI into ~/.cache/sala on first use
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Most tokens of a reply
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Let thinking models think (give --max-tokens room for it)
    #[arg(long)]
    pub think: bool,
    /// Write the leaderboard's data_non_live.csv (these models, ranked) here
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Append every reply with what it decoded to and its verdict to this JSONL file
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
    /// FC mode: ask every entry twice, freely and with calls held to the tools' grammar (a call,
    /// once opened, parses), and report both
    #[arg(long)]
    pub constrain: bool,
    #[command(flatten)]
    pub tool_calls: super::ToolCallArgs,
}

pub fn run(args: BfclArgs) -> anyhow::Result<()> {
    let categories = args
        .categories
        .iter()
        .map(|name| {
            Category::from_name(name).with_context(|| {
                let names: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
                format!("--categories: unknown category `{name}` (known: {})", names.join(", "))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let data = match &args.data {
        Some(dir) => dir.clone(),
        None => {
            let bar = bytes_progress("fetching bfcl-eval", 0);
            let dir = crate::eval::pypi::files(&crate::eval::pypi::BFCL_EVAL, "bfcl_eval/data", &progress_to(&bar))?;
            bar.finish_and_clear();
            dir
        }
    };
    let mut entries = Vec::new();
    for &category in &categories {
        entries.extend(load_entries(&data, category, args.limit).map_err(|e| anyhow::anyhow!("{e} (--data names the bfcl_eval/data folder)"))?);
    }
    let mut samples_file = match &args.samples {
        Some(path) => Some(
            std::fs::OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("opening {}", path.display()))?,
        ),
        None => None,
    };
    // Prompts are the docs plus the question: a few thousand tokens at most.
    let context = args.max_tokens + 4096;
    if args.constrain && args.mode != Mode::Fc {
        bail!("--constrain holds tool calls to a grammar: it needs --mode fc");
    }
    let variants: &[bool] = if args.constrain { &[false, true] } else { &[false] };
    let bar = work_bar((args.models.len() * variants.len() * entries.len()) as u64, "bfcl", "entries");
    let headers: Vec<String> = ["category", "entries", "correct", "accuracy"].map(String::from).into();
    let widest = categories.iter().map(|c| c.name().len()).max().unwrap_or(0);
    let table = MarkdownRows::new(&headers, &[widest, 7, 7, 8]);
    let mut summaries: Vec<(String, NonLiveSummary)> = Vec::new();
    let stdout = &mut std::io::stdout().lock();
    for path in &args.models {
        let loaded = load(&args.runtime.options(Some(path.clone())), context)?;
        let Some(tokenizer) = loaded.tokenizer.as_ref() else {
            bail!("{}: no tokenizer; BFCL asks questions in text", path.display());
        };
        let tool_format = args.tool_calls.tool_call_parser.unwrap_or_else(|| crate::models::tool_format(&loaded.model.info().model_type, tokenizer.chat_template()));
        for &constrained in variants {
            let name = if constrained { format!("{} +grammar", file_label(path)) } else { file_label(path) };
            let mode = if constrained { "fc+grammar" } else { args.mode.name() };
            let settings = Settings {
                mode: args.mode,
                tool_format,
                constrained,
                think: args.think,
                max_tokens: args.max_tokens,
                prefill_step: args.runtime.prefill_step(),
            };
            let mut scores: Vec<CategoryScore> = categories.iter().map(|&category| CategoryScore { category, correct: 0, total: 0 }).collect();
            print_above(&bar, &format!("{name} ({mode} mode, {} tool calls)\n{}", tool_format.name(), table.header(&headers)))?;
            for (k, entry) in entries.iter().enumerate() {
                let sample = run_entry(loaded.model.as_ref(), tokenizer, entry, &settings)?;
                let score = scores.iter_mut().find(|s| s.category == entry.category).expect("a score per category");
                score.total += 1;
                score.correct += usize::from(sample.verdict.valid);
                if let Some(file) = &mut samples_file {
                    writeln!(file, "{}", sample_json(&name, mode, &sample))?;
                }
                let (correct, total) = scores.iter().fold((0, 0), |(c, t), s| (c + s.correct, t + s.total));
                bar.set_message(format!("{name}: {} · {correct}/{total} correct", entry.category.name()));
                bar.inc(1);
                // Entries come a category at a time: its row is final with its last entry.
                if entries.get(k + 1).is_none_or(|next| next.category != entry.category) {
                    let s = scores.iter().find(|s| s.category == entry.category).expect("a score per category");
                    let row = [s.category.name().into(), s.total.to_string(), s.correct.to_string(), percent_cell(Some(s.accuracy()))];
                    print_above(&bar, &table.row(&row))?;
                }
            }
            print_above(&bar, "\n")?;
            let summary = summarize(&scores);
            summaries.push((name, summary));
        }
    }
    bar.finish_and_clear();
    // The leaderboard's columns, in its order and with its formula.
    let csv = non_live_csv(&summaries);
    let mut lines = csv.lines().map(|l| l.split(',').map(str::to_string).collect::<Vec<String>>());
    let headers = lines.next().expect("a header");
    let mut leaderboard = Report { headers, rows: lines.collect() };
    leaderboard.rows.iter_mut().for_each(|r| r.truncate(leaderboard.headers.len()));
    print_report(stdout, &leaderboard)?;
    if let Some(path) = &args.csv {
        std::fs::write(path, &csv).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn print_report(out: &mut dyn Write, report: &Report) -> anyhow::Result<()> {
    if std::io::stdout().is_terminal() {
        writeln!(out, "{}", report.table())?;
    } else {
        writeln!(out, "{}", report.markdown())?;
    }
    Ok(())
}
