//! `sala serve`: the OpenAI-compatible HTTP server.

use super::ModelArgs;
use clap::Args;

#[derive(Args)]
#[command(after_help = "Examples:\n  sala serve --model ./MiniCPM-SALA-8bit\n  sala serve -m org/name --host 0.0.0.0 --port 8080 --api-key secret\n\nThen: curl http://127.0.0.1:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}'\nEndpoints: /v1/chat/completions, /v1/completions, /v1/messages (Anthropic), /v1/models, /tokenize, /detokenize, /tokenizer_info, /metrics, /health")]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: one the system picks; the address is printed)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require the key on every endpoint but /health, as `Authorization: Bearer KEY` (OpenAI
    /// clients) or `x-api-key: KEY` (Anthropic clients). Printable ASCII, not empty, no space
    /// at either end (an empty key, as an unset `$KEY` gives, is refused)
    #[arg(long, value_name = "KEY", value_parser = parse_api_key)]
    pub api_key: Option<String>,
    /// Tokens per answer when a request does not say
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
    /// Requests decoded together in one batch; more wait in line
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Seconds a client may take to send a request's headers, and then its body
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// At SIGINT/SIGTERM, seconds running requests may take to finish before they are ended
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub shutdown_timeout: u64,
    /// Memory for prompt states kept for reuse across requests, e.g. 8GB or 512MiB (0 = off;
    /// default: a quarter of the memory free once the model is loaded)
    #[arg(long, value_name = "SIZE", value_parser = super::parse_byte_size)]
    pub cache_memory: Option<u64>,
    /// Memory the running requests' caches share, e.g. 40GB: a request waits until its cache,
    /// grown to its prompt and max_tokens, fits beside theirs (default: the memory free once the
    /// model is loaded, less --cache-memory and an eighth for the forward passes)
    #[arg(long, value_name = "SIZE", value_parser = super::parse_byte_size)]
    pub kv_memory: Option<u64>,
    /// Keep prompt states across restarts: those the prefix cache holds are saved in DIR at
    /// shutdown (one prompt cache file each) and read back at start, up to --cache-memory
    #[arg(long, value_name = "DIR")]
    pub prompt_cache_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub tool_calls: super::ToolCallArgs,
    /// Without --model (serving every model of the store): the most models loaded at once; the
    /// least recently used idle one is unloaded to make room
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_models: u16,
    /// Without --model: unload a model after it has been idle this long (e.g. 30s, 5m, 1h;
    /// "never" keeps it)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_keep_alive)]
    pub keep_alive: KeepAlive,
    /// The name clients give the model (`"model"` in a request) and `/v1/models` lists; its
    /// short id (file stem, folder or store name) and path are accepted too. Needs --model
    #[arg(long, value_name = "NAME", value_parser = parse_alias)]
    pub alias: Option<String>,
    /// Request log lines on stderr: text, or json (one object a line)
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: crate::server::log::LogFormat,
    /// Least severe log lines written: info logs every request, warn only failed ones (5xx), debug
    /// also each request as it arrives, the /health and /metrics probes and each
    /// scheduler round
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: crate::server::log::LogLevel,
    #[command(flatten)]
    pub tp: super::TpArgs,
}

/// `--alias`: a name a client can put in a JSON string and copy from `/v1/models`.
fn parse_alias(text: &str) -> Result<String, String> {
    if text.trim().is_empty() || text.trim() != text {
        return Err("the alias is empty or starts or ends with whitespace; give a name such as `smollm2`".into());
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(format!("the alias holds the control character {c:?}; give a printable name"));
    }
    Ok(text.to_string())
}

/// `--api-key`: a key a client can send in a header. An empty one (what `--api-key "$KEY"`
/// gives when the variable is unset) would otherwise serve everyone as if it were a key.
fn parse_api_key(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("the key is empty (an unset variable in `--api-key \"$KEY\"` gives this); set the key, or leave out --api-key to serve without one".into());
    }
    if text.trim() != text {
        return Err("the key starts or ends with whitespace, which HTTP headers drop, so no client could send it; remove the spaces".into());
    }
    if let Some(c) = text.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!("the key holds {c:?}, which an HTTP header cannot carry as is; use printable ASCII only"));
    }
    Ok(text.to_string())
}

/// `--keep-alive`: a duration, or never.
#[derive(Clone, Copy, Debug)]
pub struct KeepAlive(pub Option<std::time::Duration>);

fn parse_keep_alive(text: &str) -> Result<KeepAlive, String> {
    if text.trim() == "never" {
        return Ok(KeepAlive(None));
    }
    humantime::parse_duration(text.trim())
        .map(|d| KeepAlive(Some(d)))
        .map_err(|e| format!("{e}; give a duration such as 30s, 5m or 1h, or `never`"))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    if args.tp.tp > 1 && args.load.model.is_none() {
        anyhow::bail!("serve --tp serves one model split over the devices: give it with --model (serving the store is one device's)");
    }
    if args.tp.tp > 1 && args.prompt_cache_dir.is_some() {
        anyhow::bail!("--prompt-cache-dir cannot be used with --tp yet: each rank holds only its part of a prompt's state; drop one of them");
    }
    let tp = args.tp.rank(args.load.runtime.device())?;
    let options = crate::server::ServerOptions {
        host: args.host,
        port: args.port,
        api_key: args.api_key,
        default_max_tokens: args.max_tokens,
        parallel: args.parallel as usize,
        read_timeout: std::time::Duration::from_secs(args.timeout),
        shutdown_timeout: std::time::Duration::from_secs(args.shutdown_timeout),
        cache_memory: args.cache_memory,
        kv_memory: args.kv_memory,
        prompt_cache_dir: args.prompt_cache_dir,
        tool_format: args.tool_calls.tool_call_parser,
        prefill_step: args.load.runtime.prefill_step_or(crate::server::SERVE_PREFILL_STEP),
        max_models: args.max_models as usize,
        keep_alive: args.keep_alive.0,
        alias: args.alias,
        log_format: args.log_format,
        log_level: args.log_level,
    };
    let keeps_states = options.prompt_cache_dir.is_some();
    let load = crate::load::LoadOptions { tp: tp.clone(), keeps_states, prefill_step: Some(options.prefill_step), ..args.load.options()? };
    if tp.is_leader() {
        crate::server::serve(load, options)
    } else {
        crate::server::follow(load, options)
    }
}
