//! `sala bench`: throughput on llama-bench's test matrix, for one model or several side by side.

use super::{RuntimeArgs, TpArgs};
use crate::engine::distributed::TensorParallel;
use crate::load::{file_label, load, load_synthetic, LoadOptions, LoadedModel};
use crate::progress::{note, print_above, work_bar};
use crate::engine::device::{self, DeviceKind};
use crate::engine::generate::Draft;
use crate::engine::weights::dtype_name;
use crate::eval::bench::{run_follow_up, run_test, BenchPlan, FollowUpPlan, ModelMeta, Test};
use crate::eval::bench_report::{self, Columns, Format, RowStream};
use crate::eval::quality;
use crate::store::synthetic::SyntheticModel;
use crate::engine::memory;
use crate::engine::tokenizer::TextTokenizer;
use anyhow::Context;
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala bench -m model.gguf\n  sala bench --synthetic minicpm-sala-9b --synthetic qwen3-8b --bits 8 -p 1024 -n 128 -d 0,32768\n  sala bench -m sala-8bit -m qwen3-8b-8bit -p 512,4096 -n 128 -d 0,32768 -r 3\n  sala bench -m model -o csv --output-file results.csv      # appends\n  sala bench -m model -p 0 -n 128 --n-seq 1,8                # batched decode\n  sala bench -m model -p 0 -n 128 --draft-layers 0,8 --num-draft 4   # speculative vs plain\n  sala bench -m model --suite grammar -n 128 --n-seq 1,8    # token-mask cost")]
pub struct BenchArgs {
    /// Model to measure; repeat to compare several side by side
    #[arg(long = "model", short = 'm', required_unless_present = "synthetic")]
    pub models: Vec<PathBuf>,
    /// A model with random weights and the shapes of a preset (minicpm-sala-9b, qwen3-8b) or of a
    /// config.json, built in memory (no download); repeatable, measured after the --model ones
    #[arg(long, value_name = "PRESET|CONFIG")]
    pub synthetic: Vec<String>,
    /// Quantize the --synthetic models to this many bits (as `sala quantize`: group 64)
    #[arg(long, value_parser = clap::value_parser!(i32).range(2..=8), requires = "synthetic")]
    pub bits: Option<i32>,
    /// Prompt-processing tests: prompt lengths (comma-separated; 0 = none)
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub prompts: Vec<usize>,
    /// Generation tests: tokens to generate (comma-separated; 0 = none)
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub generations: Vec<usize>,
    /// Tokens already in the cache before each test (comma-separated)
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub depths: Vec<usize>,
    /// Generation tests: sequences decoded together in one batched step (comma-separated;
    /// t/s counts every sequence's tokens)
    #[arg(long = "n-seq", value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u64).range(1..))]
    pub seqs: Vec<u64>,
    /// Generation tests: also measure real greedy generation (every token read back as `sala run` does),
    /// self-speculative with a draft of the first N layers (comma-separated; 0 = no draft)
    #[arg(long, value_delimiter = ',', value_name = "N")]
    pub draft_layers: Vec<usize>,
    /// Tokens the draft guesses ahead per round (with --draft-layers)
    #[arg(long, value_name = "K", default_value_t = 4, requires = "draft_layers")]
    pub num_draft: usize,
    /// Timed runs per test (after one warm-up run)
    #[arg(short = 'r', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub repetitions: u32,
    /// Generation tests also give, per step, where the host's time went (building the graph,
    /// encoding it, other work, blocked), the operations in its graph and, on CUDA, the GPU's
    /// own time (busy, and idle between steps)
    #[arg(long)]
    pub profile: bool,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Format,
    /// Append the results to this file (in the --output format) and print the table
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// What to measure: `speed` (the test matrix above), `prefix-cache` (time to first token of a
    /// -p-token follow-up after a -d-token prefix: cold, kept in memory, read from a prompt cache
    /// file), `grammar` (-n tokens for each --n-seq, decoded as the server does, free and under
    /// a JSON grammar: what the token masks cost) or `quality` (math and reasoning questions from
    /// eval/quality.jsonl, greedy, answered / correct / think loops per category)
    #[arg(long, value_enum, default_value = "speed")]
    pub suite: Suite,
    /// Prefix-cache suite: the folder the prompt cache file is written to (removed afterwards;
    /// it needs room for one prefix's state)
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Prefix-cache suite: bytes the in-memory prefix cache may keep (as `sala serve`; default: a
    /// quarter of the memory free once the model is loaded)
    #[arg(long, value_name = "SIZE", value_parser = super::parse_byte_size)]
    pub cache_memory: Option<u64>,
    /// Grammar suite: the tokenizer (a folder with tokenizer.json) for a --synthetic model, which
    /// has none
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    /// Quality suite: most tokens per answer; an answer still thinking here is a think loop
    #[arg(long, default_value_t = 4096)]
    pub max_tokens: usize,
    /// Quality suite: answer without thinking (enable_thinking=false in the chat template)
    #[arg(long)]
    pub no_think: bool,
    /// Quality suite: only the first N questions of each category
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Quality suite: append every answer with its verdict to this JSONL file
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
    /// Device, dtype and prefill chunk (`--prefill-step` is llama-bench's n_batch)
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub tp: TpArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    Speed,
    PrefixCache,
    Grammar,
    Quality,
}

enum ModelChoice {
    Path(PathBuf),
    Synthetic(Box<SyntheticModel>),
}

impl ModelChoice {
    /// What reports call it (a synthetic model's folder: the model's name, as `--synthetic` gives).
    fn name(&self) -> anyhow::Result<String> {
        Ok(match self {
            ModelChoice::Path(path) => match SyntheticModel::in_folder(path)? {
                Some(synthetic) => synthetic.name,
                None => file_label(path),
            },
            ModelChoice::Synthetic(synthetic) => synthetic.name.clone(),
        })
    }
}

/// Loads (or builds) one model to measure, checking that `tokens` of context fit; returns it with
/// the name reports give it.
fn load_choice(choice: ModelChoice, args: &BenchArgs, tokens: usize, tp: &TensorParallel) -> anyhow::Result<(LoadedModel, String)> {
    // The prefix-cache suite writes and reads a prompt cache file.
    let keeps_states = args.suite == Suite::PrefixCache;
    let loaded = match choice {
        ModelChoice::Path(path) => load(&LoadOptions { tp: tp.clone(), keeps_states, ..args.runtime.options(Some(path)) }, tokens)?,
        ModelChoice::Synthetic(synthetic) => {
            let options = LoadOptions { tp: tp.clone(), keeps_states, ..args.runtime.options(None) };
            load_synthetic(&synthetic, &options, tokens)?
        }
    };
    let name = loaded.label.clone();
    Ok((loaded, name))
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let tp = args.tp.rank(args.runtime.device())?;
    if !tp.is_single() && args.suite != Suite::Speed {
        anyhow::bail!("--tp measures the speed suite only; drop --suite or --tp");
    }
    if args.suite == Suite::Quality {
        return run_quality(args);
    }
    let plan = BenchPlan {
        prompts: args.prompts.clone(),
        generations: args.generations.clone(),
        depths: args.depths.clone(),
        repetitions: args.repetitions as usize,
        prefill_step: args.runtime.prefill_step(),
        seqs: args.seqs.iter().map(|&n| n as usize).collect(),
        draft_layers: args.draft_layers.clone(),
        num_draft: args.num_draft,
        follow_ups: args.suite == Suite::PrefixCache,
        grammar: args.suite == Suite::Grammar,
        profile: args.profile,
    };
    let follow_ups = plan.follow_ups;
    let tests = plan.tests();
    if tests.is_empty() && follow_ups {
        anyhow::bail!("nothing to measure: the prefix-cache suite needs a prefix (-d above 0) and a follow-up (-p above 0)");
    }
    if tests.is_empty() {
        anyhow::bail!("nothing to measure: give -p and/or -n a length above 0");
    }
    if plan.grammar && !args.synthetic.is_empty() && args.tokenizer.is_none() {
        anyhow::bail!("the grammar suite compiles its grammar against a vocabulary, and a --synthetic model has no tokenizer; pass --tokenizer DIR");
    }
    let cache_dir = args.cache_dir.clone().unwrap_or_else(std::env::temp_dir);
    if follow_ups && !cache_dir.is_dir() {
        anyhow::bail!("--cache-dir {}: not a folder; give an existing folder with room for one prefix's state", cache_dir.display());
    }
    let test_time = bench_report::iso8601(crate::server::openai::now());
    // Only the leader of a tensor-parallel group reports; every rank measures.
    let leader = tp.is_leader();
    let mut choices: Vec<ModelChoice> = args.models.iter().map(|p| ModelChoice::Path(p.clone())).collect();
    for preset in &args.synthetic {
        choices.push(ModelChoice::Synthetic(Box::new(SyntheticModel::new(preset, args.bits)?)));
    }
    let names = choices.iter().map(ModelChoice::name).collect::<anyhow::Result<Vec<String>>>()?;
    let test_names: Vec<String> = tests.iter().map(|&(t, d)| t.name(d)).collect();
    let file = args.output_file.clone().filter(|_| leader);
    let mut stream = RowStream::new(args.output, file, &test_time, Columns::of_plan(&plan), &names, &test_names)?;
    // A follow-up test is four rows: cold, warm, disk and disk-cached, each one uncounted run
    // and the timed ones.
    let per_test = if follow_ups { 4 * plan.repetitions + 4 } else { plan.repetitions + 1 };
    let runs = (args.models.len() + args.synthetic.len()) * tests.len() * per_test;
    let bar = work_bar(runs as u64, "bench", "runs");
    let print = |text: String| -> std::io::Result<()> {
        if leader {
            print_above(&bar, &text)?;
        }
        Ok(())
    };
    let measured = (|| -> anyhow::Result<()> {
        for choice in choices {
            // Refuses up front when the deepest test will not fit in memory.
            let (loaded, name) = load_choice(choice, &args, plan.max_cached_tokens(), &tp)?;
            let info = loaded.model.info();
            for &layers in args.draft_layers.iter().filter(|&&l| l > 0) {
                Draft { layers, tokens: args.num_draft }.validate(loaded.model.as_ref(), &loaded.model.new_cache())?;
            }
            if plan.max_tokens() > info.max_context {
                anyhow::bail!(
                    "{name}: the deepest test needs {} tokens (depth + prompt/generation) but the model's context is {}; lower -d/-p/-n",
                    plan.max_tokens(),
                    info.max_context
                );
            }
            let meta = ModelMeta {
                model_filename: name,
                model_type: info.model_type.clone(),
                model_size: loaded.weights_bytes(),
                n_params: info.n_params,
                backend: {
                    let backend = match loaded.device {
                        DeviceKind::Cpu => "cpu",
                        DeviceKind::Gpu => device::gpu_backend().unwrap_or("gpu"),
                    };
                    if tp.is_single() {
                        backend.into()
                    } else {
                        format!("{backend} tp{}", tp.size)
                    }
                },
                dtype: {
                    let dtype = dtype_name(info.dtype).unwrap_or("?").to_ascii_lowercase();
                    // The rows say when prompt products were not the exact ones.
                    if args.runtime.prompt_fp8 && crate::kernels::fp8::available() {
                        format!("{dtype} fp8-prompt")
                    } else {
                        dtype
                    }
                },
            };
            let grammar = match (plan.grammar, &loaded.tokenizer, &args.tokenizer) {
                (false, _, _) => None,
                (true, _, Some(dir)) => {
                    let tokenizer = TextTokenizer::from_dir(dir, info.bos_token_id)?
                        .with_context(|| format!("--tokenizer {}: no tokenizer.json there", dir.display()))?;
                    Some(tokenizer.grammar_compiler(info.vocab_size, &info.eos_token_ids)?)
                }
                (true, Some(tokenizer), None) => Some(tokenizer.grammar_compiler(info.vocab_size, &info.eos_token_ids)?),
                (true, None, None) => anyhow::bail!("{}: no tokenizer to compile the grammar suite's grammar with; pass --tokenizer DIR", meta.model_filename),
            };
            let keep = FollowUpPlan {
                fingerprint: &loaded.fingerprint,
                dir: &cache_dir,
                budget: args.cache_memory.unwrap_or_else(memory::default_state_budget),
            };
            for &(test, depth) in &tests {
                bar.set_message(format!("{} {}", meta.model_filename, test.name(depth)));
                let rows = match test {
                    Test::FollowUp(prompt, _) => run_follow_up(loaded.model.as_ref(), &meta, &plan, &keep, depth, prompt, || bar.inc(1))?,
                    _ => vec![run_test(loaded.model.as_ref(), &meta, &plan, test, depth, grammar.as_ref(), || bar.inc(1))?],
                };
                for row in rows {
                    print(stream.push(row)?)?;
                }
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    // What was measured stays well-formed (a JSON array closed) when a later test fails.
    let (end, rows) = stream.finish()?;
    print(end)?;
    measured?;
    if let (Some(file), true) = (&args.output_file, leader) {
        eprintln!("appended {} results to {}", rows.len(), file.display());
    }
    Ok(())
}

/// `--suite quality`: every model answers the shipped questions.
fn run_quality(args: BenchArgs) -> anyhow::Result<()> {
    if !args.synthetic.is_empty() {
        anyhow::bail!("--suite quality needs trained weights: a --synthetic model has random ones");
    }
    if let Some(path) = args.models.iter().find(|p| crate::store::synthetic::is_synthetic(p)) {
        anyhow::bail!("--suite quality needs trained weights: {} is a synthetic model (random weights)", path.display());
    }
    let mut items = quality::items()?;
    if let Some(limit) = args.limit {
        let mut asked: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        items.retain(|item| {
            let count = asked.entry(item.category.clone()).or_default();
            *count += 1;
            *count <= limit
        });
    }
    // Questions are a few dozen tokens; the chat template adds a few more.
    let context = args.max_tokens + 512;
    let bar = work_bar((args.models.len() * items.len()) as u64, "quality", "questions");
    let stdout = &mut std::io::stdout().lock();
    let mut appended = 0;
    for path in &args.models {
        let (loaded, name) = load_choice(ModelChoice::Path(path.clone()), &args, context, &TensorParallel::single())?;
        let Some(tokenizer) = loaded.tokenizer.as_ref() else {
            anyhow::bail!("{}: no tokenizer; the quality suite asks questions in text", path.display());
        };
        let mut outcomes = Vec::new();
        for item in &items {
            let outcome = quality::run_item(
                loaded.model.as_ref(),
                tokenizer,
                item,
                !args.no_think,
                args.max_tokens,
                args.runtime.prefill_step(),
            )?;
            let verdict = match (&outcome, outcome.answer.stuck_thinking()) {
                (o, _) if o.correct => "correct",
                (_, true) => "still thinking (a think loop)",
                (o, false) if o.answer.answered() => "wrong",
                _ => "no answer",
            };
            note(&bar, &format!("{name} {}: {verdict} ({} tokens)", item.id, outcome.answer.stats.generated_tokens));
            outcomes.push(outcome);
            let correct = outcomes.iter().filter(|o| o.correct).count();
            bar.set_message(format!("{name}: {correct}/{} correct", outcomes.len()));
            bar.inc(1);
        }
        let (report, summary) = quality::summary(&name, &outcomes);
        if let Some(file) = &args.samples {
            quality::samples(&name, &outcomes).append(Format::Jsonl, file, "", "sala bench --suite quality")?;
        }
        bar.suspend(|| -> anyhow::Result<()> {
            if args.output == Format::Md || args.output_file.is_some() {
                writeln!(stdout, "{name}")?;
                if std::io::stdout().is_terminal() {
                    writeln!(stdout, "{}", report.table())?;
                } else {
                    write!(stdout, "{}", report.markdown())?;
                }
            } else {
                summary.write(args.output, true, stdout)?;
            }
            Ok(())
        })?;
        if let Some(file) = &args.output_file {
            summary.append(args.output, file, &format!("{name}\n{}", report.markdown()), "sala bench --suite quality")?;
            appended += summary.rows.len();
        }
    }
    bar.finish_and_clear();
    if let Some(file) = &args.output_file {
        eprintln!("appended {appended} results to {}", file.display());
    }
    Ok(())
}
