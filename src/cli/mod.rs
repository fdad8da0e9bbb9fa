//! Command-line interface: one module per subcommand.

pub mod bench;
pub mod bfcl;
pub mod chat;
pub mod completions;
pub mod doctor;
pub mod list;
pub mod needle;
pub mod pack;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod show;

use crate::engine::cache::Window;
use crate::engine::device::DeviceKind;
use crate::engine::error::Error;
use crate::engine::generate::{default_prefill_step, Draft};
use crate::engine::generation_config::{GenerationDefaults, SamplingChoice};
use crate::engine::memory;
use crate::engine::model::LanguageModel;
use crate::engine::sampler::SamplingParams;
use crate::load::{LoadOptions, LoadedModel};
use crate::progress::{bytes_progress, progress_bar, progress_to};
use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};
use mlx_rs::Dtype;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sala",
    version,
    propagate_version = true,
    about = "Run MiniCPM-SALA and other LLMs locally on MLX",
    after_help = "Examples:\n  sala pull\n  sala run -m moxin-org/MiniCPM4-SALA-9B-8bit-mlx \"Why is the sky blue?\"\n  sala chat -m ./MiniCPM-SALA-8bit\n  sala doctor\n\nsala COMMAND --help shows each command's options and examples."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt and stream it to stdout
    Run(run::RunArgs),
    /// Chat with a model interactively (multi-turn, streaming)
    Chat(chat::ChatArgs),
    /// Serve a model over an OpenAI-compatible HTTP API
    Serve(serve::ServeArgs),
    /// Write an MLX-quantized (8/4-bit) copy of a model
    Quantize(quantize::QuantizeArgs),
    /// Pack a model into one .sala file (weights, config, tokenizer, template), or extract one
    Pack(pack::PackArgs),
    /// Show what a model is: architecture, parameters, quantization, files, memory needed
    Show(show::ShowArgs),
    /// Download a model into the store (the HuggingFace cache), verified
    Pull(pull::PullArgs),
    /// List the models in the store (the HuggingFace cache)
    List(list::ListArgs),
    /// Delete a model from the store
    Rm(list::RmArgs),
    /// Measure prompt and generation speed (llama-bench's test matrix), or answer quality
    Bench(bench::BenchArgs),
    /// Needle-in-a-haystack retrieval over context lengths × depths (table, CSV, SVG heatmap)
    Needle(needle::NeedleArgs),
    /// Function calling: BFCL v4's non-live categories, checked like the leaderboard
    Bfcl(bfcl::BfclArgs),
    /// Check the setup: MLX and its backend, GPU, memory, model store, hub access
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(completions::CompletionsArgs),
}

pub fn main() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    crate::engine::device::configure_runtime();
    match command {
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Show(args) => show::run(args),
        Command::Pull(args) => pull::run(args),
        Command::List(args) => list::list(args),
        Command::Rm(args) => list::rm(args),
        Command::Bench(args) => bench::run(args),
        Command::Needle(args) => needle::run(args),
        Command::Bfcl(args) => bfcl::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Completions(args) => completions::run(args),
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Gpu,
}

/// Tensor parallelism (shared by the commands that run a model, and `doctor`).
#[derive(Args, Clone, Copy)]
pub struct TpArgs {
    /// Tensor parallelism: split the model over N devices, one process each (NCCL on CUDA GPUs,
    /// MLX's ring backend on CPUs and Macs)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub tp: usize,
    /// How the --tp processes talk: auto (nccl on a CUDA GPU, else ring), ring (TCP) or nccl
    #[arg(long, value_enum, value_name = "BACKEND", default_value_t = TpBackendArg::Auto)]
    pub tp_backend: TpBackendArg,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum TpBackendArg {
    Auto,
    Ring,
    Nccl,
}

impl TpArgs {
    /// This process's rank: it joins the group as one of the ranks or, without --tp, is a single
    /// device. With --tp N and no rank of its own, it starts the N ranks, supervises them and
    /// exits with their code, never returning. `device`: the device the command runs on (`None`:
    /// the GPU when MLX has one).
    pub fn rank(&self, device: Option<DeviceKind>) -> anyhow::Result<crate::engine::distributed::TensorParallel> {
        let backend = match self.tp_backend {
            TpBackendArg::Auto => None,
            TpBackendArg::Ring => Some(crate::engine::distributed::Backend::Ring),
            TpBackendArg::Nccl => Some(crate::engine::distributed::Backend::Nccl),
        };
        match crate::launch::start(self.tp, backend, device)? {
            crate::launch::Start::Rank(tp) => Ok(tp),
            crate::launch::Start::Finished(code) => std::process::exit(code),
        }
    }
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

/// Where a model runs and in what precision (shared by every command that runs one).
#[derive(Args, Clone, Copy)]
pub struct RuntimeArgs {
    /// Device to run on (default: the GPU when MLX has one)
    #[arg(long, value_enum)]
    pub device: Option<DeviceArg>,
    /// Compute dtype (default: the checkpoint's on a GPU, f32 on the CPU)
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// Prompt tokens per forward pass during prefill [default: 8192 on CUDA, else 4096; serve: 2048]
    #[arg(long)]
    pub prefill_step: Option<usize>,
    /// Keep the KV cache's keys and values quantized to 8 bits (as llama.cpp's -ctk/-ctv q8_0):
    /// about half the memory of a long context; logits stay within the tolerance the README states
    #[arg(long, value_name = "BITS", value_parser = parse_kv_bits)]
    pub kv_bits: Option<i32>,
    /// Multiply prompt chunks in FP8 (e4m3 activations and weights, one scale a row) on an NVIDIA
    /// Hopper GPU's FP8 tensor cores: faster prefill, not the exact product (docs/architecture.md
    /// states the measured loss); decoding stays exact
    #[arg(long)]
    pub prompt_fp8: bool,
}

impl RuntimeArgs {
    /// `--prefill-step` of a one-stream command, else this build's default (at least a token).
    pub fn prefill_step(&self) -> usize {
        self.prefill_step_or(default_prefill_step())
    }

    /// `--prefill-step`, else the command's `default` (at least a token).
    pub fn prefill_step_or(&self, default: usize) -> usize {
        self.prefill_step.unwrap_or(default).max(1)
    }
}

fn parse_kv_bits(text: &str) -> Result<i32, String> {
    match text.parse::<i32>() {
        Ok(8) => Ok(8),
        _ => Err("a quantized KV cache has 8 bits a value: give --kv-bits 8, or leave it out for the model's dtype".into()),
    }
}

/// Which model, where it runs, and how its cache behaves (shared by `run`, `chat`, `serve`).
#[derive(Args)]
pub struct ModelArgs {
    /// Model: a directory (config.json, *.safetensors, tokenizer.json), a .sala file, a .gguf file,
    /// or a name from `sala list` (default: the model `sala pull` fetches; pulled first if absent)
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// StreamingLLM: keep at most N tokens in the cache (sink tokens + the most recent ones) so
    /// generation can run past N; dense models only
    #[arg(long, value_name = "N")]
    pub context_size: Option<usize>,
    /// StreamingLLM: tokens at the start that are never evicted (with --context-size)
    #[arg(long, value_name = "K", requires = "context_size")]
    pub num_sink_tokens: Option<usize>,
    /// Without --model, when the default model is not in the store: refuse instead of pulling it
    /// first (HF_HUB_OFFLINE=1 refuses too)
    #[arg(long)]
    pub no_pull: bool,
}

/// Sampling flags (shared by `run` and `chat`). A flag left out takes the model's
/// `generation_config.json` value, else the default shown.
#[derive(Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy [default: the model's generation_config.json, else 0.8]
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling: keep the most likely tokens up to this total probability (1 = off)
    /// [default: the model's generation_config.json, else 0.95]
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the k most likely tokens (0 = off) [default: the model's generation_config.json,
    /// else 40]
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off) [default: the
    /// model's generation_config.json, else 0.05]
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens seen in the last 64 (1 = off) [default: the model's generation_config.json
    /// (repetition_penalty), else 1]
    #[arg(long, value_name = "N")]
    pub repeat_penalty: Option<f32>,
    /// Random seed for reproducible sampling
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The settings in force: each flag given, else `model`'s default, else sala's.
    pub fn params(&self, model: &GenerationDefaults) -> anyhow::Result<SamplingParams> {
        let ours = SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 40, min_p: 0.05, repetition_penalty: 1.0, seed: self.seed, ..Default::default() };
        let chosen = SamplingChoice {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
        };
        let params = model.fill(ours, &chosen);
        params.validate().map_err(|e| Error::Usage(e.to_string()))?;
        Ok(params)
    }
}

/// How tool calls are written (shared by `serve` and `bfcl`).
#[derive(Args)]
pub struct ToolCallArgs {
    /// The model's tool-call syntax: hermes, minicpm4_xml, llama3_json or mistral (default: what
    /// its chat template writes, else its family's)
    #[arg(long, value_name = "NAME", value_parser = parse_tool_format)]
    pub tool_call_parser: Option<crate::engine::tools::ToolFormat>,
}

fn parse_tool_format(name: &str) -> Result<crate::engine::tools::ToolFormat, String> {
    crate::engine::tools::ToolFormat::from_name(name).map_err(|e| e.to_string())
}

/// Self-speculative decoding flags (shared by `run` and `chat`).
#[derive(Args)]
pub struct DraftArgs {
    /// Self-speculative decoding: the model's first N layers guess tokens ahead and one pass of
    /// the whole model checks them; the output is the same, faster when the guesses are good
    #[arg(long, value_name = "N")]
    pub draft_layers: Option<usize>,
    /// Tokens the draft guesses ahead per round (with --draft-layers)
    #[arg(long, value_name = "K", default_value_t = 4, requires = "draft_layers")]
    pub num_draft: usize,
}

impl DraftArgs {
    pub fn draft(&self, model: &dyn LanguageModel) -> anyhow::Result<Option<Draft>> {
        let Some(layers) = self.draft_layers else { return Ok(None) };
        Ok(Some(Draft { layers, tokens: self.num_draft }.validate(model, &model.new_cache())?))
    }
}

impl RuntimeArgs {
    /// The device asked for (`None`: the GPU when MLX has one).
    pub fn device(&self) -> Option<DeviceKind> {
        self.device.map(|d| match d {
            DeviceArg::Cpu => DeviceKind::Cpu,
            DeviceArg::Gpu => DeviceKind::Gpu,
        })
    }

    /// What the loading path needs to load `model` as these flags ask.
    pub fn options(&self, model: Option<PathBuf>) -> LoadOptions {
        LoadOptions {
            model,
            device: self.device(),
            dtype: self.dtype.map(DtypeArg::dtype),
            kv_bits: self.kv_bits,
            prompt_fp8: self.prompt_fp8,
            prefill_step: self.prefill_step,
            ..LoadOptions::default()
        }
    }
}

impl ModelArgs {
    /// What the loading path needs to load the model as these flags ask.
    pub fn options(&self) -> anyhow::Result<LoadOptions> {
        let window = match self.context_size {
            Some(capacity) => Some(Window { capacity, sinks: self.num_sink_tokens.unwrap_or(4) }.validate().map_err(Error::Usage)?),
            None => None,
        };
        Ok(LoadOptions { window, no_pull: self.no_pull, ..self.runtime.options(self.model.clone()) })
    }
}

/// A size on the command line (`8GB`, `512MiB`, `0`).
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    parse_size::parse_size(text).map_err(|e| format!("{e}; give a size such as 8GB, 512MiB or 0"))
}

/// `--prompt-cache FILE` (shared by `run` and `chat`): a prompt's state kept on disk.
#[derive(Args, Clone)]
pub struct PromptCacheArgs {
    /// Keep the prompt's model state in FILE: a later run whose prompt starts the same (a long
    /// document, then another question) loads it and prefills only the rest. Made on first use,
    /// rewritten when a prompt adds to it; refused if another model or tokenizer made it
    #[arg(long, value_name = "FILE")]
    pub prompt_cache: Option<PathBuf>,
    /// Only read --prompt-cache, never write it
    #[arg(long, requires = "prompt_cache")]
    pub prompt_cache_ro: bool,
}

impl PromptCacheArgs {
    /// Brings the model's state to all of `prompt` but its last token, starting from FILE's state
    /// where it holds a start of the prompt, and saves that state to FILE when FILE did not hold
    /// it already. Returns the state and how many prompt tokens came from FILE.
    pub fn prefill(&self, loaded: &LoadedModel, prompt: &[u32], step: usize) -> anyhow::Result<(crate::engine::cache::ModelCache, usize)> {
        use crate::engine::prefix_cache::{Start, Trail};
        use crate::engine::state_file::{self, StateFile};
        let model = loaded.model.as_ref();
        let Some((_, head)) = prompt.split_last() else { bail!("the prompt is empty") };
        let mut held: Option<StateFile> = None;
        let Start { tokens: reused, mut cache, mut trail } = match self.prompt_cache.as_deref().filter(|p| p.exists()) {
            Some(path) => {
                let file = StateFile::open(path, &loaded.fingerprint)?;
                let bar = bytes_progress("reading prompt cache", 0);
                let start = state_file::start_from(&file, model, prompt, model.new_cache(), &mut progress_to(&bar))?;
                bar.finish_and_clear();
                held = Some(file);
                start
            }
            None => {
                let cache = model.new_cache();
                Start { tokens: 0, trail: Trail::new(&cache), cache }
            }
        };
        if let Some(path) = &self.prompt_cache {
            eprintln!("prompt cache: {reused} of {} prompt tokens from {}", prompt.len(), path.display());
        }
        let todo = head.len() - reused;
        let bar = (todo > 0).then(|| progress_bar(todo as u64, "prefill {bar:40} {pos}/{len} tokens ({per_sec}, eta {eta})"));
        crate::engine::generate::extend_along(model, &mut cache, &mut trail, &head[reused..], step, |done| {
            if let Some(bar) = &bar {
                bar.set_position(done as u64);
            }
        })?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        // The state kept is of all the prompt but its last token: a one-token prompt leaves none,
        // and the file (if any) stays as it was.
        match self.prompt_cache.as_deref().filter(|_| !self.prompt_cache_ro) {
            Some(path) if head.is_empty() => eprintln!("prompt cache: a one-token prompt leaves no state to keep; {} not written", path.display()),
            Some(path) if held.as_ref().is_none_or(|f| f.tokens != head) => {
                trail.mark_end(&cache)?;
                let bar = bytes_progress("writing prompt cache", 0);
                // The file's restart points before where this prompt started are kept in the new one.
                if let Some(file) = &held {
                    trail.prepend(file.points_before(model, reused, &mut progress_to(&bar))?);
                }
                let bytes = state_file::save(path, &loaded.fingerprint, head, &cache, &trail, &mut progress_to(&bar))
                    .map_err(|e| crate::load::naming(e, "saving the prompt cache", path))?;
                bar.finish_and_clear();
                eprintln!("prompt cache: saved {} tokens to {} ({})", head.len(), path.display(), memory::human(bytes));
            }
            _ => {}
        }
        Ok((cache, reused))
    }
}

#[cfg(test)]
mod tests {
    use super::RuntimeArgs;
    use crate::engine::device::gpu_backend;
    use crate::engine::generate::{CUDA_PREFILL_STEP, PREFILL_STEP};
    use crate::server::SERVE_PREFILL_STEP;
    use clap::Parser;

    #[derive(Parser)]
    struct Runtime {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    fn parse(args: &[&str]) -> RuntimeArgs {
        Runtime::try_parse_from(std::iter::once("sala").chain(args.iter().copied())).unwrap().runtime
    }

    /// One stream takes 4096-token prompt chunks (8192 on CUDA), `serve` 2048, and a given step
    /// wins over both.
    #[test]
    fn prefill_step_defaults_by_command() {
        assert_eq!((PREFILL_STEP, CUDA_PREFILL_STEP, SERVE_PREFILL_STEP), (4096, 8192, 2048));
        let one_stream = if gpu_backend() == Some("cuda") { 8192 } else { 4096 };
        assert_eq!(parse(&[]).prefill_step(), one_stream);
        assert_eq!(parse(&[]).prefill_step_or(SERVE_PREFILL_STEP), 2048);
        assert_eq!(parse(&["--prefill-step", "512"]).prefill_step_or(SERVE_PREFILL_STEP), 512);
        assert_eq!(parse(&["--prefill-step", "0"]).prefill_step(), 1);
    }
}
