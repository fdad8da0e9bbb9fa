//! `sala run`: one prompt in, a streamed answer out, a summary line on stderr.

use crate::engine::cache::Window;
use crate::engine::device::{self, DeviceKind};
use crate::engine::error::Error;
use crate::engine::generate::{generate, Flow, GenerateOptions, Generation};
use crate::engine::model::LanguageModel;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::tokenizer::{Message, StreamDecoder, TextTokenizer, ThinkFilter};
use crate::models;
use crate::store::memory;
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use mlx_rs::Dtype;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Gpu,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DtypeArg {
    F32,
    Bf16,
    F16,
}

impl DtypeArg {
    pub fn dtype(self) -> Dtype {
        match self {
            DtypeArg::F32 => Dtype::Float32,
            DtypeArg::Bf16 => Dtype::Bfloat16,
            DtypeArg::F16 => Dtype::Float16,
        }
    }
}

#[derive(Args)]
#[command(after_help = "Examples:\n  sala run --model ./MiniCPM-SALA \"Why is the sky blue?\"\n  echo \"Summarise: ...\" | sala run --model ./MiniCPM-SALA -\n  sala run --model ./case --input-ids 1,2,3 --temperature 0 --json")]
pub struct RunArgs {
    /// The prompt; `-` (or nothing, with piped input) reads it from stdin
    pub prompt: Option<String>,
    /// Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file,
    /// or a name from `sala list`
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Most tokens to generate
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this total probability (1 = off)
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0 = off)
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off)
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last 64 (1 = off)
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Random seed for reproducible sampling
    #[arg(long)]
    pub seed: Option<u64>,
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
    /// Device to run on (default: the GPU when MLX has one)
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Compute dtype (default: the checkpoint's)
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Prompt token ids, comma-separated (bypasses tokenizer and template)
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub input_ids: Option<Vec<u32>>,
    /// Write the logits every generated token was drawn from to this safetensors file
    /// (tensor `logits`, float32 [generated, vocab])
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print {"token_ids": [...], "text": "..."} instead of streaming text
    #[arg(long)]
    pub json: bool,
    /// Prompt tokens per forward pass during prefill
    #[arg(long, default_value_t = 2048)]
    pub prefill_step: usize,
    /// StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so
    /// generation can run past N; dense models only
    #[arg(long, value_name = "N")]
    pub context_size: Option<usize>,
    /// StreamingLLM: tokens at the start that are never evicted (with --context-size)
    #[arg(long, value_name = "K", requires = "context_size")]
    pub num_sink_tokens: Option<usize>,
}

/// The StreamingLLM window the flags ask for (4 sink tokens unless told).
pub fn window(context_size: Option<usize>, sinks: Option<usize>) -> anyhow::Result<Option<Window>> {
    let Some(capacity) = context_size else { return Ok(None) };
    Ok(Some(Window { capacity, sinks: sinks.unwrap_or(4) }.validate().map_err(Error::Usage)?))
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..Default::default()
    };
    sampling.validate().map_err(Error::Usage)?;
    let Some(model_dir) = args.model.as_deref() else {
        bail!("no model given: pass --model PATH (a model directory, a .sala file or a .gguf file)");
    };
    let device = device::select(args.device.map(|d| match d {
        DeviceArg::Cpu => DeviceKind::Cpu,
        DeviceArg::Gpu => DeviceKind::Gpu,
    }))?;
    // Preflight: the weights and a cache for the generated tokens must fit before anything loads.
    let mut source = models::open(model_dir).with_context(|| format!("opening {}", model_dir.display()))?;
    let cfg = source.config()?;
    let dtype = args.dtype.map(DtypeArg::dtype).or_else(|| source.weights.storage_dtype()).unwrap_or(Dtype::Bfloat16);
    let weights_bytes = memory::weights_bytes(&source, dtype);
    // A StreamingLLM window caps what the cache holds.
    let cache_bytes = |tokens: usize| {
        let held = args.context_size.map_or(tokens, |n| tokens.min(n + n / 8));
        models::cache_bytes(&cfg, held, memory::dtype_bytes(dtype))
    };
    memory::check_fits(&model_dir.display().to_string(), weights_bytes, cache_bytes(args.max_tokens)?, args.max_tokens)?;
    let mut model = models::build(&cfg, &mut source.weights, Some(dtype))
        .with_context(|| format!("loading {}", model_dir.display()))?;
    let tokenizer = match source.tokenizer_files()? {
        Some(files) => Some(TextTokenizer::new(&files, model.info().bos_token_id)?),
        None => None,
    };
    if let Some(window) = window(args.context_size, args.num_sink_tokens)? {
        model.set_window(window)?;
    }

    let (prompt_ids, prompt_text) = prompt_tokens(&args, model_dir, tokenizer.as_ref())?;
    let context = prompt_ids.len() + args.max_tokens;
    memory::check_fits(&model_dir.display().to_string(), weights_bytes, cache_bytes(context)?, context)?;
    let mut cache = model.new_cache();
    let mut sampler = Sampler::new(sampling);
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        prefill_step: args.prefill_step,
        keep_logits: args.logits_out.is_some(),
    };

    let progress = prefill_progress(prompt_ids.len());
    let mut stdout = std::io::stdout().lock();
    let mut decoder = StreamDecoder::default();
    let mut think = ThinkFilter::after_prompt(&prompt_text);
    let stream = !args.json && tokenizer.is_some();
    let mut write_error = None;
    let mut emit = |piece: String, think: &mut ThinkFilter, out: &mut std::io::StdoutLock| {
        let visible = if args.no_think { think.push(&piece) } else { piece };
        if let Err(e) = out.write_all(visible.as_bytes()).and_then(|_| out.flush()) {
            write_error.get_or_insert(e);
        }
    };
    let generation = generate(
        model.as_ref(),
        &mut cache,
        &prompt_ids,
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
                let tok = tokenizer.as_ref().expect("stream implies a tokenizer");
                match decoder.push(tok, token) {
                    Ok(piece) => emit(piece, &mut think, &mut stdout),
                    Err(_) => return Flow::Stop,
                }
            }
            Flow::Continue
        },
    )?;
    if stream {
        let tail = decoder.finish(tokenizer.as_ref().expect("stream implies a tokenizer"))?;
        emit(tail, &mut think, &mut stdout);
        let rest = if args.no_think { think.finish() } else { String::new() };
        writeln!(stdout, "{rest}")?;
    }
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    if args.json {
        let text = match &tokenizer {
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
        let json = serde_json::json!({ "token_ids": generation.tokens, "text": text });
        writeln!(stdout, "{json}")?;
    }
    if let Some(path) = &args.logits_out {
        write_logits(path, &generation, model.info().vocab_size)?;
    }
    print_summary(&generation, model.as_ref(), device);
    Ok(())
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
        tokenizer.apply_chat_template(&messages, !args.no_think)?
    };
    Ok((tokenizer.encode(&text)?, text))
}

fn read_stdin() -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the prompt from stdin")?;
    Ok(text)
}

/// A progress bar for long prompts, when stderr is a terminal.
fn prefill_progress(tokens: usize) -> Option<indicatif::ProgressBar> {
    if tokens < 4096 || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(tokens as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("prefill {bar:40} {pos}/{len} tokens ({per_sec}, eta {eta})")
            .expect("valid template"),
    );
    Some(bar)
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
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | peak memory: {:.2} GB | {} {:?} on {}",
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
