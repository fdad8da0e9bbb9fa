//! `sala chat`: an interactive multi-turn conversation. The model state is kept across turns
//! (`ChatSession`), so each turn prefills only what is new; `/retry` and `/edit` restore the state
//! saved at the last message boundary instead of re-reading the history.

use super::{DraftArgs, ModelArgs, PromptCacheArgs, SamplingArgs};
use crate::load::{load, LoadOptions, LoadedModel};
use crate::engine::generate::{Flow, GenerateOptions, StopReason};
use crate::engine::sampler::Sampler;
use crate::engine::session::ChatSession;
use crate::engine::tokenizer::{Message, StreamDecoder, TextTokenizer, ThinkFilter};
use anyhow::{bail, Context};
use clap::Args;
use rustyline::error::ReadlineError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use nix::sys::termios::{self, LocalFlags, SetArg, Termios};
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Args)]
#[command(after_help = "Examples:\n  sala chat --model ./MiniCPM-SALA\n  sala chat -m SmolLM2.gguf --system \"Answer briefly.\" --temperature 0\n  sala chat --model ./MiniCPM-SALA --system \"$(cat contract.txt)\" --prompt-cache contract.cache\n\nIn the chat, /help lists the commands; \"\"\" starts and ends a multi-line message; Ctrl-C stops an answer (what was written stays in the conversation); Ctrl-D or /bye leaves.")]
pub struct ChatArgs {
    #[command(flatten)]
    pub load: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub prompt_cache: PromptCacheArgs,
    /// System prompt
    #[arg(long)]
    pub system: Option<String>,
    /// Start with thinking off (`/think on` turns it back on)
    #[arg(long)]
    pub no_think: bool,
    /// Most tokens per answer
    #[arg(long, default_value_t = 2048)]
    pub max_tokens: usize,
}

const HELP: &str = "\
/help              this list
/clear             start a new conversation (keeps the system prompt)
/system [TEXT]     set the system prompt (empty: none)
/think on|off      let the model think (shown) or ask it not to
/retry             answer the last message again
/edit TEXT         replace the last message and answer it
/save FILE         write the conversation as JSON
/load FILE         continue a saved conversation
/bye, /quit        leave (or Ctrl-D)
\"\"\"                start/end a multi-line message; a line ending in \\ continues too
Ctrl-C             stop the answer being written (what was written stays in the conversation)";

/// A conversation as `/save` writes it.
#[derive(Serialize, Deserialize, Default)]
struct Conversation {
    system: Option<String>,
    messages: Vec<Message>,
    think: bool,
}

impl Conversation {
    fn rendered(&self) -> Vec<Message> {
        let mut all: Vec<Message> = self.system.iter().map(|s| Message::new("system", s)).collect();
        all.extend(self.messages.iter().cloned());
        all
    }
}

static ANSWERING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);

/// While an answer is written, SIGINT stops it, and the terminal stays cooked (Ctrl-C raises
/// SIGINT) but keys typed are not echoed into the answer and SIGINT does not flush them (NOFLSH):
/// type-ahead reaches the next prompt's line as typed. All is put back when the answer ends.
struct Answering(Option<Termios>);

impl Answering {
    fn start() -> Self {
        STOP.store(false, Ordering::SeqCst);
        ANSWERING.store(true, Ordering::SeqCst);
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(&stdin) else { return Self(None) };
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        quiet.local_flags.insert(LocalFlags::NOFLSH);
        // TCSANOW, never TCSAFLUSH: what was already typed stays queued.
        match termios::tcsetattr(&stdin, SetArg::TCSANOW, &quiet) {
            Ok(()) => Self(Some(saved)),
            Err(_) => Self(None),
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        ANSWERING.store(false, Ordering::SeqCst);
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, saved);
        }
    }
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    args.sampling.params(&Default::default())?;
    let loaded = load(&LoadOptions { keeps_states: args.prompt_cache.prompt_cache.is_some(), ..args.load.options()? }, args.max_tokens)?;
    let sampling = args.sampling.params(&loaded.generation)?;
    let model = loaded.model.as_ref();
    let Some(tokenizer) = loaded.tokenizer.as_ref() else {
        bail!("{} has no tokenizer, which a chat needs", loaded.path.display());
    };
    let mut conversation = Conversation { system: args.system.clone(), messages: Vec::new(), think: !args.no_think };
    let mut session = ChatSession::new(model);
    let mut sampler = Sampler::new(sampling);
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        prefill_step: args.load.runtime.prefill_step(),
        draft: args.draft.draft(model)?,
        ..Default::default()
    };
    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    // SIGINT (Ctrl-C in the cooked terminal of an answer, or `kill -INT`) stops the answer and never
    // leaves: at the prompt the line editor reads Ctrl-C as a key and says how to leave. Installed
    // after the editor, which takes SIGINT over when it is created (its handler only queues the
    // signal, so Ctrl-C could not stop an answer). Its `signal-hook` feature would leave SIGINT
    // alone but then ignores keys already read, stalling on type-ahead and pastes.
    ctrlc::set_handler(|| {
        if ANSWERING.load(Ordering::SeqCst) {
            STOP.store(true, Ordering::SeqCst);
        }
    })
    .context("installing the Ctrl-C handler")?;

    eprintln!("{} ({}) — /help for commands, Ctrl-D or /bye to leave", loaded.path.display(), model.info().model_type);

    loop {
        let input = match read_message(&mut editor) {
            Ok(Some(text)) => text,
            Ok(None) => break,
            Err(e) => return Err(e),
        };
        let text = input.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(command) = text.strip_prefix('/') {
            let (name, rest) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
            let rest = rest.trim();
            match name {
                "help" | "?" => println!("{HELP}"),
                "quit" | "exit" | "bye" => break,
                "clear" => {
                    conversation.messages.clear();
                    session.reset(model);
                    println!("(new conversation)");
                }
                "system" => {
                    conversation.system = (!rest.is_empty()).then(|| rest.to_string());
                    println!("(system prompt {})", if rest.is_empty() { "removed" } else { "set" });
                }
                "think" => match rest {
                    "on" => conversation.think = true,
                    "off" => conversation.think = false,
                    _ => println!("usage: /think on|off (now {})", if conversation.think { "on" } else { "off" }),
                },
                "save" if !rest.is_empty() => match std::fs::write(rest, serde_json::to_string_pretty(&conversation)?) {
                    Ok(()) => println!("(saved {} messages to {rest})", conversation.messages.len()),
                    Err(e) => println!("error: {rest}: {e}"),
                },
                "load" if !rest.is_empty() => {
                    match std::fs::read_to_string(rest).map_err(anyhow::Error::from).and_then(|t| Ok(serde_json::from_str(&t)?)) {
                        Ok(c) => {
                            conversation = c;
                            println!("(loaded {} messages from {rest})", conversation.messages.len());
                        }
                        Err(e) => println!("error: {rest}: {e}"),
                    }
                }
                "retry" | "edit" => {
                    if conversation.messages.last().is_some_and(|m| m.role == "assistant") {
                        conversation.messages.pop();
                    }
                    match conversation.messages.last_mut() {
                        Some(m) if m.role == "user" => {
                            if name == "edit" {
                                if rest.is_empty() {
                                    println!("usage: /edit NEW TEXT");
                                    continue;
                                }
                                m.content = rest.to_string();
                            }
                            answer(&mut conversation, &mut session, tokenizer, &loaded, &mut sampler, &opts, &args.prompt_cache)?;
                        }
                        _ => println!("(no message to answer again)"),
                    }
                }
                _ => println!("unknown command /{name}; /help lists them"),
            }
            continue;
        }
        conversation.messages.push(Message::new("user", text));
        answer(&mut conversation, &mut session, tokenizer, &loaded, &mut sampler, &opts, &args.prompt_cache)?;
    }
    Ok(())
}

/// One message from the user: a line, a `"""` block, or lines joined by a trailing `\`.
/// `Ok(None)` on end of input.
fn read_message(editor: &mut rustyline::DefaultEditor) -> anyhow::Result<Option<String>> {
    let mut lines: Vec<String> = Vec::new();
    let mut block = false;
    let mut interrupts = 0;
    loop {
        let prompt = if lines.is_empty() { ">>> " } else { "... " };
        match editor.readline(prompt) {
            Ok(line) => {
                interrupts = 0;
                if lines.is_empty() && line.trim_start().starts_with("\"\"\"") {
                    block = true;
                    let first = line.trim_start().trim_start_matches("\"\"\"");
                    if let Some(done) = first.strip_suffix("\"\"\"") {
                        return Ok(Some(done.to_string()));
                    }
                    lines.push(first.to_string());
                    continue;
                }
                if block {
                    if let Some(last) = line.trim_end().strip_suffix("\"\"\"") {
                        lines.push(last.to_string());
                        let text = lines.join("\n");
                        let _ = editor.add_history_entry(text.as_str());
                        return Ok(Some(text));
                    }
                    lines.push(line);
                    continue;
                }
                if let Some(more) = line.strip_suffix('\\') {
                    lines.push(more.to_string());
                    continue;
                }
                lines.push(line);
                let text = lines.join("\n");
                let _ = editor.add_history_entry(text.as_str());
                return Ok(Some(text));
            }
            Err(ReadlineError::Interrupted) => {
                lines.clear();
                block = false;
                interrupts += 1;
                if interrupts == 1 {
                    eprintln!("(Ctrl-D or /bye leaves)");
                } else {
                    eprintln!("(Ctrl-C does not leave the chat: it stops an answer and clears the line. To leave, press Ctrl-D on an empty line or type /bye)");
                }
            }
            Err(ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Answers the conversation's last message, streaming, and records the answer.
fn answer(
    conversation: &mut Conversation,
    session: &mut ChatSession,
    tokenizer: &TextTokenizer,
    loaded: &LoadedModel,
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    prompt_cache: &PromptCacheArgs,
) -> anyhow::Result<()> {
    let model = loaded.model.as_ref();
    let prompt_text = tokenizer.apply_chat_template(&conversation.rendered(), conversation.think)?;
    let prompt = tokenizer.encode(&prompt_text)?;
    // From here to the last token a Ctrl-C stops the answer (a prefill runs to its end first).
    let _answering = Answering::start();
    if let Err(e) = loaded.check_fits(prompt.len() + opts.max_tokens) {
        conversation.messages.pop();
        eprintln!("error: {e:#}");
        return Ok(());
    }
    // A conversation's first prompt starts from the prompt cache (and is saved to it).
    if session.is_empty() && prompt_cache.prompt_cache.is_some() {
        match prompt_cache.prefill(loaded, &prompt, opts.prefill_step) {
            Ok((cache, _)) => session.resume(cache, prompt[..prompt.len().saturating_sub(1)].to_vec()),
            Err(e) => {
                conversation.messages.pop();
                eprintln!("error: {e:#}");
                return Ok(());
            }
        }
    }
    let mut stdout = std::io::stdout().lock();
    let mut decoder = StreamDecoder::default();
    let mut think = ThinkFilter::after_prompt(&prompt_text);
    let hide_thinking = !conversation.think;
    let stopped = || if STOP.load(Ordering::SeqCst) { Flow::Stop } else { Flow::Continue };
    // A long message (a pasted document) shows its prefill, and Ctrl-C stops it between chunks.
    let bar = crate::progress::prefill_bar(prompt.len().saturating_sub(session.len()));
    let on_prefill = |done: usize, _total: usize| {
        if let Some(bar) = &bar {
            bar.set_position(done as u64);
        }
        stopped()
    };
    let result = session.turn(model, &prompt, sampler, opts, on_prefill, |token| {
        if let Ok(piece) = decoder.push(tokenizer, token) {
            let visible = if hide_thinking { think.push(&piece) } else { piece };
            let _ = stdout.write_all(visible.as_bytes()).and_then(|_| stdout.flush());
        }
        stopped()
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let turn = match result {
        Ok(turn) => turn,
        Err(e) => {
            conversation.messages.pop();
            writeln!(stdout)?;
            eprintln!("error: {e}");
            return Ok(());
        }
    };
    if turn.generation.stop == StopReason::Cancelled && turn.generation.tokens.is_empty() {
        // Stopped before the answer began: the message is taken back, as if never sent.
        conversation.messages.pop();
        drop(stdout);
        eprintln!("(stopped while reading the message; it was not kept)");
        return Ok(());
    }
    let tail = decoder.finish(tokenizer)?;
    let tail = if hide_thinking { think.push(&tail) + &think.finish() } else { tail };
    writeln!(stdout, "{tail}")?;
    drop(stdout);
    let g = &turn.generation;
    let eos = model.info().eos_token_ids.clone();
    let kept: Vec<u32> = g.tokens.iter().copied().filter(|t| !eos.contains(t)).collect();
    conversation.messages.push(Message::new("assistant", &tokenizer.decode(&kept)?));
    let stopped = if g.stop == StopReason::Cancelled { ", stopped" } else { "" };
    eprintln!(
        "[prefilled {} of {} prompt tokens | {} tokens, {:.1} tok/s{stopped}]",
        turn.prefilled,
        turn.prompt_tokens,
        g.tokens.len(),
        g.stats.decode_tps()
    );
    Ok(())
}
