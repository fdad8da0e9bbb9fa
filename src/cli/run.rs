//! `sala run`: one prompt in, a streamed answer out, a summary line on stderr.

use super::{DraftArgs, ModelArgs, PromptCacheArgs, SamplingArgs, TpArgs};
use crate::load::LoadOptions;
use crate::load::load;
use crate::engine::device::{self, DeviceKind};
use crate::engine::generate::{generate, Flow, GenerateOptions, Generation};
use crate::engine::grammar::{Grammar, Reasoning};
use crate::engine::model::LanguageModel;
use crate::engine::sampler::Sampler;
use crate::engine::tokenizer::{Message, StreamDecoder, TextTokenizer, ThinkFilter};
use anyhow::{bail, Context};
use clap::Args;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

#[derive(Args)]
#[command(after_help = "Examples:\n  sala run --model ./MiniCPM-SALA \"Why is the sky blue?\"\n  echo \"Summarise: ...\" | sala run --model ./MiniCPM-SALA -\n  sala run --model ./case --input-ids 1,2,3 --temperature 0 --json\n  sala run --model ./MiniCPM-SALA --draft-layers 8 --num-draft 4 \"Write a haiku\"\n  sala run --model ./MiniCPM-SALA --prompt-cache book.cache --system \"$(cat book.txt)\" \"Who is the narrator?\"")]
pub struct RunArgs {
    /// The prompt; `-` (or nothing, with piped input) reads it from stdin
    pub prompt: Option<String>,
    #[command(flatten)]
    pub load: ModelArgs,
    /// Most tokens to generate
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub prompt_cache: PromptCacheArgs,
    /// System prompt
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as-is, without the chat template
    #[arg(long)]
    pub raw: bool,
    /// Ask the model not to think, and hide any <think>…</think> from the output
    #[arg(long)]
    pub no_think: bool,
    /// Keep generating past end-of-sequence tokens
    #[arg(long)]
    pub ignore_eos: bool,
    /// Prompt token ids, comma-separated (bypasses tokenizer and template)
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub input_ids: Option<Vec<u32>>,
    /// Write the logits every generated token was drawn from to this safetensors file
    /// (tensor `logits`, float32 [generated, vocab])
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print {"token_ids": [...], "text": "...", "sampling": {...}} instead of streaming text
    #[arg(long)]
    pub json: bool,
    /// Answer with JSON valid under this JSON Schema (constrained decoding: the answer parses
    /// whatever the model prefers)
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Answer in this grammar, in llguidance's Lark syntax (`%json {…}` embeds a JSON Schema);
    /// the model is asked not to think, as the grammar applies from the first token
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
    #[command(flatten)]
    pub tp: TpArgs,
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let tp = args.tp.rank(args.load.runtime.device())?;
    if !tp.is_single() && args.prompt_cache.prompt_cache.is_some() {
        bail!("--prompt-cache cannot be used with --tp yet: each rank holds only its part of the state; drop one of them");
    }
    // Flags are checked before the (long) load; the model's own defaults join after it.
    args.sampling.params(&Default::default())?;
    let keeps_states = args.prompt_cache.prompt_cache.is_some();
    let loaded = load(&LoadOptions { tp: tp.clone(), keeps_states, ..args.load.options()? }, args.max_tokens)?;
    let mut sampling = args.sampling.params(&loaded.generation)?;
    if !tp.is_single() {
        // Every rank draws the same tokens from the same logits: one seed for all.
        sampling.seed = Some(tp.share_u64(|| anyhow::Ok(sampling.seed.unwrap_or_else(rand::random)))?);
    }
    let (model, tokenizer, model_dir) = (loaded.model.as_ref(), loaded.tokenizer.as_ref(), loaded.path.as_path());
    // The prompt is read once, by rank 0 (stdin is its alone), and handed to the others.
    let (prompt_ids, prompt_text) = if tp.is_single() {
        prompt_tokens(&args, model_dir, tokenizer)?
    } else {
        let shared = tp.share_bytes(|| anyhow::Ok(serde_json::to_vec(&prompt_tokens(&args, model_dir, tokenizer)?)?))?;
        serde_json::from_slice(&shared).context("internal: rank 0's prompt does not parse")?
    };
    loaded.check_fits(prompt_ids.len() + args.max_tokens)?;
    // With a prompt cache, all but the last prompt token go in (from the file where it holds
    // them) before generation starts.
    let (mut cache, run_from) = match &args.prompt_cache.prompt_cache {
        Some(_) => {
            let (cache, _) = args.prompt_cache.prefill(&loaded, &prompt_ids, args.load.runtime.prefill_step())?;
            (cache, prompt_ids.len() - 1)
        }
        None => (model.new_cache(), 0),
    };
    // f32 → the decimal it was written as (0.6, not 0.6000000238418579).
    let decimal = |x: f32| x.to_string().parse::<f64>().unwrap_or(x as f64);
    let settings = serde_json::json!({
        "temperature": decimal(sampling.temperature), "top_p": decimal(sampling.top_p), "top_k": sampling.top_k,
        "min_p": decimal(sampling.min_p), "repetition_penalty": decimal(sampling.repetition_penalty),
    });
    let mut sampler = Sampler::new(sampling);
    if let Some((grammar, flag, path)) = requested_grammar(&args)? {
        let tokenizer = tokenizer.with_context(|| format!("{flag} needs the model's tokenizer, and {} has none", model_dir.display()))?;
        let reasoning = Reasoning::after_prompt(&prompt_text, tokenizer.can_think() && may_think(&args) && !args.raw);
        let info = model.info();
        let constraint = tokenizer
            .grammar_compiler(info.vocab_size, &info.eos_token_ids)
            .and_then(|compiler| compiler.compile(&grammar, reasoning))
            .with_context(|| format!("{flag} {}", path.display()))?;
        sampler = sampler.constrained(constraint);
    }
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        prefill_step: args.load.runtime.prefill_step(),
        keep_logits: args.logits_out.is_some(),
        draft: args.draft.draft(model)?,
    };

    let progress = crate::progress::prefill_bar(prompt_ids.len() - run_from);
    let mut stdout = std::io::stdout().lock();
    let mut decoder = StreamDecoder::default();
    let mut think = ThinkFilter::after_prompt(&prompt_text);
    // Only rank 0 speaks; the others compute their part alongside it.
    let speaks = tp.is_leader();
    let stream = speaks && !args.json && tokenizer.is_some();
    let mut write_error = None;
    let mut emit = |piece: String, think: &mut ThinkFilter, out: &mut std::io::StdoutLock| {
        let visible = if args.no_think { think.push(&piece) } else { piece };
        if let Err(e) = out.write_all(visible.as_bytes()).and_then(|_| out.flush()) {
            write_error.get_or_insert(e);
        }
    };
    let generation = generate(
        model,
        &mut cache,
        &prompt_ids[run_from..],
        &mut sampler,
        &opts,
        |done, total| {
            if let Some(bar) = &progress {
                bar.set_position(done as u64);
                if done == total {
                    bar.finish_and_clear();
                }
            }
        },
        |token| {
            if stream {
                let tok = tokenizer.expect("stream implies a tokenizer");
                match decoder.push(tok, token) {
                    Ok(piece) => emit(piece, &mut think, &mut stdout),
                    Err(_) => return Flow::Stop,
                }
            }
            Flow::Continue
        },
    )?;
    if stream {
        let tail = decoder.finish(tokenizer.expect("stream implies a tokenizer"))?;
        emit(tail, &mut think, &mut stdout);
        let rest = if args.no_think { think.finish() } else { String::new() };
        writeln!(stdout, "{rest}")?;
    }
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    tp.check_agree(&[token_digest(&generation.tokens)], "the tokens they generated")?;
    if !speaks {
        return Ok(());
    }
    if args.json {
        let text = match tokenizer {
            Some(tok) => {
                let text = tok.decode(&generation.tokens)?;
                if args.no_think {
                    think.push(&text) + &think.finish()
                } else {
                    text
                }
            }
            None => String::new(),
        };
        let json = serde_json::json!({ "token_ids": generation.tokens, "text": text, "sampling": settings });
        writeln!(stdout, "{json}")?;
    }
    if let Some(path) = &args.logits_out {
        write_logits(path, &generation, model.info().vocab_size)?;
    }
    print_summary(&generation, model, loaded.device);
    Ok(())
}

/// A checksum of the generated ids, which every rank must agree on.
fn token_digest(tokens: &[u32]) -> i64 {
    tokens.iter().fold(tokens.len() as i64, |h, &t| h.wrapping_mul(1_000_003).wrapping_add(t as i64)) & i64::MAX
}

/// Whether the model is asked to think: not with --no-think, nor under a Lark grammar, which
/// applies from the answer's first token.
fn may_think(args: &RunArgs) -> bool {
    !args.no_think && args.grammar.is_none()
}

/// The grammar `--json-schema` or `--grammar` asks for, with the flag and file it came from.
fn requested_grammar(args: &RunArgs) -> anyhow::Result<Option<(Grammar, &'static str, &Path)>> {
    if let Some(path) = &args.json_schema {
        let text = std::fs::read_to_string(path).with_context(|| format!("--json-schema {}", path.display()))?;
        let schema: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("--json-schema {}: not valid JSON; give a JSON Schema file", path.display()))?;
        return Ok(Some((Grammar::JsonSchema(schema), "--json-schema", path)));
    }
    if let Some(path) = &args.grammar {
        let text = std::fs::read_to_string(path).with_context(|| format!("--grammar {}", path.display()))?;
        return Ok(Some((Grammar::Lark(text), "--grammar", path)));
    }
    Ok(None)
}

/// The prompt as token ids (and the text it came from, empty for `--input-ids`).
fn prompt_tokens(args: &RunArgs, model_dir: &Path, tokenizer: Option<&TextTokenizer>) -> anyhow::Result<(Vec<u32>, String)> {
    if let Some(ids) = &args.input_ids {
        if args.prompt.is_some() {
            bail!("give either a PROMPT or --input-ids, not both");
        }
        return Ok((ids.clone(), String::new()));
    }
    let prompt = match args.prompt.as_deref() {
        Some("-") => read_stdin()?,
        Some(p) => p.to_string(),
        None if !std::io::stdin().is_terminal() => read_stdin()?,
        None => bail!("no prompt: pass it as an argument, `-` to read stdin, or --input-ids"),
    };
    let Some(tokenizer) = tokenizer else {
        bail!("{} has no tokenizer; pass the prompt as --input-ids 1,2,3", model_dir.display());
    };
    let text = if args.raw {
        prompt
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system));
        }
        messages.push(Message::new("user", &prompt));
        tokenizer.apply_chat_template(&messages, may_think(args))?
    };
    Ok((tokenizer.encode(&text)?, text))
}

fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the prompt from stdin")?;
    Ok(text)
}

fn write_logits(path: &Path, generation: &Generation, vocab: usize) -> anyhow::Result<()> {
    let rows = generation.logits.len();
    let mut bytes = Vec::with_capacity(rows * vocab * 4);
    for row in &generation.logits {
        for v in row {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, vocab], &bytes)
        .context("building the logits tensor")?;
    safetensors::serialize_to_file([("logits", view)], None, path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn print_summary(generation: &Generation, model: &dyn LanguageModel, device: DeviceKind) {
    let s = &generation.stats;
    let draft = match s.acceptance() {
        Some(rate) => format!(" ({} of {} drafted tokens accepted, {:.0}%)", s.accepted_tokens, s.draft_tokens, rate * 100.0),
        None => String::new(),
    };
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s{draft} | peak memory: {:.2} GB | {} {:?} on {}",
        s.prompt_tokens,
        s.prompt_tps(),
        s.generated_tokens,
        s.decode_tps(),
        s.peak_memory_bytes as f64 / 1e9,
        model.info().model_type,
        model.info().dtype,
        device::describe(device),
    );
}
