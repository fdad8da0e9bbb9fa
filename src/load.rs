//! The one loading path that every command and the server take:
//! model source → device → dtype → memory preflight → model and tokenizer.
//! (docs/architecture.md, "Loading a model".)

use crate::engine::generation_config::GenerationDefaults;
use crate::engine::cache::Window;
use crate::engine::config::ConfigFile;
use crate::engine::device::{self, DeviceKind};
use crate::engine::distributed::TensorParallel;
use crate::engine::memory;
use crate::engine::model::LanguageModel;
use crate::engine::source::ModelSource;
use crate::engine::state_file::Fingerprint;
use crate::engine::tokenizer::TextTokenizer;
use crate::models;
use crate::store;
use crate::store::synthetic::SyntheticModel;
use anyhow::{bail, Context};
use mlx_rs::Dtype;
use std::path::{Path, PathBuf};

/// What to load and how, as the user asked (every field optional but the model).
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// A directory, a `.sala`/`.gguf` file or a store name; `None`: the model `sala pull` fetches
    /// by default, once it is in the store.
    pub model: Option<PathBuf>,
    /// `None`: the GPU when MLX has one.
    pub device: Option<DeviceKind>,
    /// `None`: f32 on the CPU, else the checkpoint's.
    pub dtype: Option<Dtype>,
    /// StreamingLLM: the cache keeps sink tokens and the most recent ones.
    pub window: Option<Window>,
    /// Keys and values quantized to this many bits as they are cached (`--kv-bits`).
    pub kv_bits: Option<i32>,
    /// Prompt chunks multiply in FP8 (`--prompt-fp8`; Hopper GPUs): faster, not exact.
    pub prompt_fp8: bool,
    /// Prompt tokens per forward pass (`--prefill-step`), whose working memory the memory check
    /// counts; `None`: this build's default.
    pub prefill_step: Option<usize>,
    /// With no model given and the default one not in the store: refuse instead of pulling it.
    pub no_pull: bool,
    /// This process's rank of a tensor-parallel group (a single device by default).
    pub tp: TensorParallel,
    /// The run writes or reads prompt states (`--prompt-cache`, `--prompt-cache-dir`): its
    /// fingerprint then covers every tensor's bytes, read once and cached ([`Fingerprint::of`]);
    /// else only the layout, so a plain load reads no weights twice.
    pub keeps_states: bool,
}

impl LoadOptions {
    /// The model at `path`, everything else by default.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { model: Some(path.into()), ..Self::default() }
    }

    /// The model asked for, else the default one, pulled into the store first if it is not there
    /// (as `ollama run` does) unless `no_pull` or HF_HUB_OFFLINE says not to.
    pub fn model_or_default(&self) -> anyhow::Result<PathBuf> {
        if let Some(path) = &self.model {
            return Ok(path.clone());
        }
        let name = store::pull::DEFAULT_REPO;
        let reference = store::cache::ModelRef::parse(name)?;
        if reference.snapshot(&store::cache::cache_dir()).is_some() {
            return Ok(PathBuf::from(name));
        }
        let refused = if self.no_pull {
            Some("--no-pull")
        } else if store::pull::offline() {
            Some("HF_HUB_OFFLINE is set")
        } else {
            None
        };
        if let Some(why) = refused {
            bail!(
                "no model given, and the default model, {name}, is not in the store ({why}): pass --model PATH \
                 (a model directory, a .sala or .gguf file, or a name from `sala list`), or fetch it with `sala pull`"
            );
        }
        eprintln!("no model given: pulling the default model, {name} (--model picks another, --no-pull refuses)");
        store::pull::pull(&reference, &crate::progress::bar_set(), Default::default())
            .with_context(|| format!("pulling the default model, {name}"))?;
        Ok(PathBuf::from(name))
    }
}

/// Opens the model at `path`, a store name resolved to its snapshot first (not a synthetic
/// model's folder: its weights are drawn by [`load`]).
pub fn open(path: &Path) -> anyhow::Result<ModelSource> {
    store::cache::open(path).map_err(|e| naming(e, "opening", path))
}

/// `e` after "`doing` PATH", unless its message names the path already: errors about a file say
/// which one, and saying it twice read "opening X: X: GGUF tensor …".
pub fn naming(e: impl Into<anyhow::Error>, doing: &str, path: &Path) -> anyhow::Error {
    let e = e.into();
    if format!("{e:#}").contains(&path.display().to_string()) {
        e
    } else {
        e.context(format!("{doing} {}", path.display()))
    }
}

/// How reports name the model at `path`: its file or folder name.
pub fn file_label(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().to_string())
}

pub use crate::engine::device::compute_dtype;

/// What a model's memory checks need: the weights' size, and what its cache and a prompt step
/// take for a given number of tokens.
struct MemoryPlan {
    cfg: ConfigFile,
    dtype: Dtype,
    weights_bytes: u64,
    window: Option<Window>,
    kv_bits: Option<i32>,
    /// Tensor-parallel ranks the model is split over (1: one device).
    ranks: usize,
    prefill_step: usize,
    quantized: bool,
}

impl MemoryPlan {
    fn new(cfg: ConfigFile, dtype: Dtype, weights_bytes: u64, options: &LoadOptions, quantized: bool) -> Self {
        let prefill_step = options.prefill_step.unwrap_or_else(crate::engine::generate::default_prefill_step).max(1);
        Self { cfg, dtype, weights_bytes, window: options.window, kv_bits: options.kv_bits, ranks: options.tp.size, prefill_step, quantized }
    }

    /// Tokens the cache holds after `tokens`: a StreamingLLM window caps them.
    fn held(&self, tokens: usize) -> usize {
        self.window.map_or(tokens, |w| tokens.min(w.capacity + w.capacity / 8))
    }

    /// Bytes one sequence's cache of `tokens` tokens takes on one of the ranks.
    fn cache_bytes(&self, tokens: usize) -> anyhow::Result<u64> {
        Ok(models::cache_bytes_per_rank(&self.cfg, self.held(tokens), memory::dtype_bytes(self.dtype), self.kv_bits, self.ranks)?)
    }

    /// Bytes the last prompt step of a `tokens`-token sequence holds while it runs on `device`.
    fn prompt_step_bytes(&self, tokens: usize, device: DeviceKind) -> anyhow::Result<u64> {
        let step = models::PromptStep {
            rows: self.prefill_step.min(tokens),
            context: self.held(tokens),
            dtype_bytes: memory::dtype_bytes(self.dtype),
            fused: device == DeviceKind::Gpu,
            tensor_cores: device == DeviceKind::Gpu && device::gpu_backend() == Some("cuda"),
            quantized: self.quantized,
            ranks: self.ranks,
        };
        Ok(models::prompt_step_bytes(&self.cfg, &step)?)
    }

    /// Refuses when the weights, one sequence's cache of `tokens` tokens and the working memory of
    /// its last prompt step will not fit in the memory of `device` (under tensor parallelism, one
    /// rank's share of each).
    fn check(&self, what: &str, tokens: usize, device: DeviceKind) -> anyhow::Result<()> {
        let needs = memory::Needs {
            weights: self.weights_bytes,
            cache: self.cache_bytes(tokens)?,
            prompt_step: self.prompt_step_bytes(tokens, device)?,
            tokens,
            prefill_step: self.prefill_step.min(tokens),
        };
        memory::check_fits(what, &needs, device)?;
        Ok(())
    }
}

/// Whether `cfg` describes quantized weights (MLX's `quantization` section).
fn quantized(cfg: &ConfigFile) -> bool {
    crate::engine::quant::QuantConfig::from_config(cfg).is_ok_and(|q| q.is_some())
}

/// A model ready to run, with what later memory checks need.
pub struct LoadedModel {
    pub model: Box<dyn LanguageModel>,
    pub tokenizer: Option<TextTokenizer>,
    pub path: PathBuf,
    /// How reports name it: its file or folder name, or a synthetic model's name
    /// (`minicpm-sala-9b-q8 (synthetic)`).
    pub label: String,
    pub device: DeviceKind,
    /// What model and tokenizer states made by it belong to (prompt cache files; over every
    /// tensor only when loaded with [`LoadOptions::keeps_states`]).
    pub fingerprint: Fingerprint,
    memory: MemoryPlan,
    /// `generation_config.json`'s sampling defaults (its end tokens are already in the model's info).
    pub generation: GenerationDefaults,
}

impl LoadedModel {
    /// Bytes of the weights as loaded.
    pub fn weights_bytes(&self) -> u64 {
        self.memory.weights_bytes
    }

    /// Bytes one sequence's cache of `tokens` tokens takes on this process's device (a bound: the
    /// size the cache has once it holds them).
    pub fn cache_bytes(&self, tokens: usize) -> u64 {
        self.memory.cache_bytes(tokens).unwrap_or(u64::MAX)
    }

    /// Refuses when the weights, a cache of `tokens` tokens and a prompt step's working memory
    /// will not fit in memory.
    pub fn check_fits(&self, tokens: usize) -> anyhow::Result<()> {
        self.memory.check(&self.path.display().to_string(), tokens, self.device)
    }
}

/// Selects the device, checks that weights + a cache of `tokens` fit, and loads the model and its
/// tokenizer.
pub fn load(options: &LoadOptions, tokens: usize) -> anyhow::Result<LoadedModel> {
    let path = options.model_or_default()?;
    if let Some(synthetic) = SyntheticModel::in_folder(&path).map_err(|e| naming(e, "loading", &path))? {
        return load_synthetic(&synthetic, options, tokens);
    }
    let device = device::select(options.device)?;
    let source = open(&path)?;
    load_source(source, path, device, options, tokens)
}

/// [`load`] for a synthetic model: its random weights drawn on the device selected, in bf16
/// unless asked otherwise, once the memory check has passed.
pub fn load_synthetic(synthetic: &SyntheticModel, options: &LoadOptions, tokens: usize) -> anyhow::Result<LoadedModel> {
    let device = device::select(options.device)?;
    let dtype = compute_dtype(options.dtype, device, Some(Dtype::Bfloat16));
    let bytes = synthetic.weights_bytes(dtype);
    let quantize = match (synthetic.folder(), synthetic.bits()) {
        (Some(dir), None) => format!("set \"bits\": 8 or 4 in {} to quantize it", dir.join(store::synthetic::SYNTHETIC_FILE).display()),
        (Some(dir), Some(bits)) => format!("fewer \"bits\" than {bits} in {} make it smaller", dir.join(store::synthetic::SYNTHETIC_FILE).display()),
        (None, None) => "--bits 8 or 4 quantizes it".into(),
        (None, Some(bits)) => format!("--bits below {bits} make it smaller"),
    };
    // Under tensor parallelism each rank draws the whole model and keeps its part.
    MemoryPlan::new(synthetic.cfg.clone(), dtype, bytes, options, synthetic.bits().is_some())
        .check(&synthetic.name, tokens, device)
        .map_err(|e| anyhow::anyhow!("{e}; for a synthetic model, {quantize}"))?;
    let bar = crate::progress::bytes_progress(&format!("building {}", synthetic.name), bytes);
    let built = synthetic.build(dtype, |n| bar.inc(n));
    bar.finish_and_clear();
    let source = built?;
    let path = synthetic.folder().map_or_else(|| PathBuf::from(&synthetic.name), Path::to_path_buf);
    let mut loaded = load_source(source, path, device, options, tokens)?;
    loaded.label = synthetic.name.clone();
    Ok(loaded)
}

/// Compiles, side by side, the GPU kernels whose self-checks this process will run, instead of one
/// by one at the first request (kernels::selfcheck::compile_ahead); a bar when there are any.
fn compile_kernels_ahead(show: bool) {
    let began = std::time::Instant::now();
    let mut bar = CompileBar::new(show, "compiling GPU kernels for this machine");
    crate::kernels::selfcheck::compile_ahead(&models::kernel_checks(), false, |done, total| bar.progress(done, total));
    bar.finish(|n| format!("compiled {n} GPU kernels for this machine in {:.1} s (once: later starts load them)", began.elapsed().as_secs_f64()));
}

/// Then the model's own decode kernels, which meet new shapes as batches grow and contexts
/// lengthen (LanguageModel::launch_kernels_ahead): their checks have run by now, so what they
/// launch is what requests would meet. Best effort: a failure leaves them to compile when met.
fn compile_model_kernels_ahead(model: &dyn LanguageModel, show: bool) {
    let began = std::time::Instant::now();
    if let Err(e) = model.launch_kernels_ahead() {
        eprintln!("warning: the model's decode kernels were not compiled ahead ({e}); they compile as requests meet them");
    }
    let mut bar = CompileBar::new(show, "compiling this model's decode kernels");
    crate::kernels::module_cache::settle_reporting(|done, total| bar.progress(done, total));
    bar.finish(|n| format!("compiled {n} decode kernels for this model in {:.1} s (once per machine)", began.elapsed().as_secs_f64()));
}

/// A bar over the module cache's compiles, shown once there are any.
struct CompileBar {
    show: bool,
    title: &'static str,
    bar: Option<indicatif::ProgressBar>,
}

impl CompileBar {
    fn new(show: bool, title: &'static str) -> Self {
        CompileBar { show, title, bar: None }
    }

    fn progress(&mut self, done: usize, total: usize) {
        if self.show && total > 0 {
            let bar = self.bar.get_or_insert_with(|| crate::progress::work_bar(total as u64, self.title, "kernels"));
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    }

    /// Clears the bar and prints `line(kernels compiled)` if there was one.
    fn finish(self, line: impl FnOnce(u64) -> String) {
        if let Some(bar) = self.bar {
            let line = line(bar.length().unwrap_or(0));
            bar.finish_and_clear();
            eprintln!("{line}");
        }
    }
}

/// [`load`] for a model already opened (or built in memory) on `device`, which is selected;
/// `path` is what the user named it.
pub fn load_source(mut source: ModelSource, path: PathBuf, device: DeviceKind, options: &LoadOptions, tokens: usize) -> anyhow::Result<LoadedModel> {
    if options.prompt_fp8 && options.keeps_states {
        // A saved state would later be read as if its prompt had been multiplied exactly.
        anyhow::bail!("--prompt-fp8 does not go with a prompt cache: states saved from FP8 products would be reused as exact ones; drop one of the two");
    }
    crate::engine::device_sampler::use_draw_kernel(crate::kernels::draw::draw);
    crate::engine::step_profile::use_stamp_kernel(crate::kernels::stamp::stamp);
    crate::engine::device::use_kernel_compile_wait(crate::kernels::module_cache::settle);
    let cfg = source.config()?;
    let dtype = compute_dtype(options.dtype, device, source.weights.storage_dtype());
    let tp = &options.tp;
    let weights_bytes = memory::weights_bytes_per_rank(&source, dtype, tp.size);
    let integer_tensors = source.weights.infos().values().any(|info| crate::engine::weights::float_dtype(&info.dtype).is_none());
    let plan = MemoryPlan::new(cfg.clone(), dtype, weights_bytes, options, quantized(&cfg) || integer_tensors);
    plan.check(&path.display().to_string(), tokens, device)?;
    let fingerprint = if options.keeps_states { Fingerprint::of(&source, dtype)? } else { Fingerprint::of_layout(&source, dtype)? };
    // Every rank must hold its part of the same model in the same dtype, or their sums are garbage.
    tp.check_agree(&fingerprint.digest_words(), "the model they loaded (its config, tensors or dtype differ)")?;
    let generation = source.generation_defaults()?;
    // One bar for the group (the leader's), for weights still to be read from their files.
    let to_read = source.weights.file_bytes();
    let bar = (tp.is_leader() && to_read > 0).then(|| crate::progress::bytes_progress(&format!("loading {}", file_label(&path)), to_read));
    source.weights.report_reads(bar.clone());
    let built = models::build(&cfg, &mut source.weights, Some(dtype), tp);
    source.weights.report_reads(None);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let mut model = built.map_err(|e| naming(e, "loading", &path))?;
    compile_kernels_ahead(tp.is_leader());
    if options.prompt_fp8 && !crate::kernels::fp8::available() {
        eprintln!("warning: --prompt-fp8 needs an NVIDIA Hopper GPU (compute capability 9), whose FP8 tensor cores it uses; prompt products stay exact");
    }
    models::layers::set_prompt_fp8(options.prompt_fp8);
    model.info_mut().add_eos_tokens(&generation.eos_token_ids);
    if let Some(window) = options.window {
        model.set_window(window)?;
    }
    if let Some(bits) = options.kv_bits {
        model.set_kv_bits(bits)?;
    }
    compile_model_kernels_ahead(&*model, tp.is_leader());
    let tokenizer = source.tokenizer(model.info().bos_token_id)?;
    Ok(LoadedModel {
        model,
        tokenizer,
        label: file_label(&path),
        path,
        device,
        fingerprint,
        memory: plan,
        generation,
    })
}
