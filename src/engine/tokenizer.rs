//! Text ↔ token ids (`tokenizer.json` through the `tokenizers` crate), the chat prompt (the
//! model's own Jinja `chat_template`, ChatML otherwise), streaming detokenisation and the
//! `<think>…</think>` filter.

use super::contain::contain;
use super::error::{Error, Result};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;

/// The tag that opens a reasoning block.
const THINK_OPEN: &str = "<think>";

/// ChatML, used when the model ships no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    /// An assistant's function calls (OpenAI objects, arguments as JSON objects for templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None }
    }
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<(u32, String)>,
    eos_token: Option<String>,
    add_bos: bool,
    chat_template: String,
    /// Built on the first constrained request: it indexes every token.
    grammar: std::sync::OnceLock<super::grammar::GrammarCompiler>,
    /// Special tokens left out of decoded text (all but [`SHOWN_SPECIAL_TOKENS`]).
    hidden: std::collections::HashSet<u32>,
    /// Each token's bytes, built on first use (APIs that report tokens).
    token_bytes: std::sync::OnceLock<Vec<Vec<u8>>>,
    /// Bytes of the longest token, found on first use.
    longest_token: std::sync::OnceLock<usize>,
    /// Whether the template renders think blocks, found on first use.
    can_think: std::sync::OnceLock<bool>,
}

/// Special tokens that stay in decoded text: they mark tool calls and reasoning, which the answer
/// parsers read (`[TOOL_CALLS]` is a special token in Mistral's vocabulary, `<|python_tag|>` in
/// Llama's, the call tags in some MiniCPM ones).
pub const SHOWN_SPECIAL_TOKENS: &[&str] = &[
    "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|python_tag|>", "<tool_call>", "</tool_call>", "<function", "</function>", "<param", "</param>",
    "<tool_sep>", "<think>", "</think>",
];

/// The tokenizer's source texts, wherever they came from (a model directory, a `.sala` file's
/// metadata, a GGUF file's vocabulary).
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    /// Where they came from, for messages.
    pub source: std::path::PathBuf,
    /// `tokenizer.json`.
    pub tokenizer_json: String,
    /// `tokenizer_config.json` (bos/eos tokens, add_bos_token, chat_template), or `Null`.
    pub config: Value,
    /// `chat_template.jinja`, when shipped separately.
    pub chat_template: Option<String>,
}

impl TokenizerFiles {
    pub const TOKENIZER: &'static str = "tokenizer.json";
    pub const CONFIG: &'static str = "tokenizer_config.json";
    pub const TEMPLATE: &'static str = "chat_template.jinja";

    /// Reads them from a model directory; `Ok(None)` when it has no `tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let mut files = std::collections::BTreeMap::new();
        for name in [Self::TOKENIZER, Self::CONFIG, Self::TEMPLATE] {
            let path = dir.join(name);
            if path.is_file() {
                files.insert(name.to_string(), std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?);
            }
        }
        Self::from_texts(dir, &files)
    }

    /// Picks them out of a model's side files (name → text); `Ok(None)` without `tokenizer.json`.
    pub fn from_texts(source: &Path, files: &std::collections::BTreeMap<String, String>) -> Result<Option<Self>> {
        let Some(tokenizer_json) = files.get(Self::TOKENIZER) else { return Ok(None) };
        let config = match files.get(Self::CONFIG) {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Error::Json { path: source.join(Self::CONFIG), message: e.to_string() })?,
            None => Value::Null,
        };
        Ok(Some(Self {
            source: source.to_path_buf(),
            tokenizer_json: tokenizer_json.clone(),
            config,
            chat_template: files.get(Self::TEMPLATE).cloned(),
        }))
    }
}

impl TextTokenizer {
    /// Loads the tokenizer of the model directory `dir`; `Ok(None)` when it has none.
    /// `bos_fallback` is the model config's bos id, used when the tokenizer config names none.
    pub fn from_dir(dir: &Path, bos_fallback: Option<u32>) -> Result<Option<Self>> {
        TokenizerFiles::from_dir(dir)?.map(|files| Self::new(&files, bos_fallback)).transpose()
    }

    pub fn new(files: &TokenizerFiles, bos_fallback: Option<u32>) -> Result<Self> {
        let bad = |e: &dyn std::fmt::Display| Error::Tokenizer(format!("{}: {e}", files.source.display()));
        // Syntax first: the tokenizers crate panics on some malformed JSON instead of failing.
        serde_json::from_str::<serde::de::IgnoredAny>(&files.tokenizer_json).map_err(|e| bad(&format!("tokenizer.json is not valid JSON: {e}")))?;
        let inner: tokenizers::Tokenizer = contain("reading tokenizer.json", || files.tokenizer_json.parse().map_err(|e| bad(&e))).map_err(|e| match e {
            Error::Usage(panicked) => bad(&panicked),
            e => e,
        })?;
        let config = &files.config;
        let token_text = |key: &str| -> Option<String> {
            match config.get(key)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }
        };
        let bos = match token_text("bos_token") {
            Some(text) => inner.token_to_id(&text).map(|id| (id, text)),
            None => bos_fallback.and_then(|id| inner.id_to_token(id).map(|text| (id, text))),
        };
        let add_bos = match config.get("add_bos_token").and_then(Value::as_bool) {
            Some(v) => v && bos.is_some(),
            // No setting: follow the tokenizer's own post-processor.
            None => match &bos {
                Some((id, _)) => inner
                    .encode("a", true)
                    .map(|e| e.get_ids().first() == Some(id))
                    .unwrap_or(false),
                None => false,
            },
        };
        let chat_template = match config.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(named)) => named
                .iter()
                .find(|n| n.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|n| n.get("template")?.as_str())
                .ok_or_else(|| {
                    Error::Template(format!("{}: no `default` chat_template", files.source.display()))
                })?
                .to_string(),
            _ => files.chat_template.clone().unwrap_or_else(|| CHATML_TEMPLATE.to_string()),
        };
        let hidden = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special && !SHOWN_SPECIAL_TOKENS.contains(&token.content.as_str()))
            .map(|(id, _)| id)
            .collect();
        Ok(Self {
            inner,
            bos,
            eos_token: token_text("eos_token"),
            add_bos,
            chat_template,
            grammar: std::sync::OnceLock::new(),
            hidden,
            token_bytes: std::sync::OnceLock::new(),
            longest_token: std::sync::OnceLock::new(),
            can_think: std::sync::OnceLock::new(),
        })
    }

    /// Whether the model writes `<think>` blocks (a reasoning model): decided from what its chat
    /// template renders, not its source (a template may build the tag from pieces): a reply
    /// carrying reasoning, or the generation prompt with thinking on or off, shows a `<think>`.
    /// Only when none of those renders is the source searched for the tag.
    pub fn can_think(&self) -> bool {
        *self.can_think.get_or_init(|| {
            let user = json!({"role": "user", "content": "Hi"});
            let reply = json!({"role": "assistant", "content": "Hello", "reasoning_content": "Greet back", "reasoning": "Greet back"});
            let probes = [(json!([user, reply, user]), true), (json!([user, reply]), false), (json!([user]), true), (json!([user]), false)];
            let rendered: Vec<String> = probes
                .iter()
                .filter_map(|(messages, thinking)| self.render(minijinja::Value::from(minijinja::value::Serde(messages)), None, *thinking).ok())
                .collect();
            match rendered.is_empty() {
                false => rendered.iter().any(|text| text.contains(THINK_OPEN)),
                true => self.chat_template.contains(THINK_OPEN),
            }
        })
    }

    /// Compiles grammars against this vocabulary for a model with `vocab_size` logits that ends
    /// answers with `eos`.
    pub fn grammar_compiler(&self, vocab_size: usize, eos: &[u32]) -> Result<super::grammar::GrammarCompiler> {
        if let Some(compiler) = self.grammar.get() {
            return Ok(compiler.clone());
        }
        let json = serde_json::to_value(&self.inner).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let compiler = super::grammar::GrammarCompiler::new(&json, vocab_size, eos)?;
        Ok(self.grammar.get_or_init(|| compiler).clone())
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Token ids of `text`, with the BOS token exactly once when the model wants one (a template
    /// that already wrote it is not given a second).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_plain(text)?;
        if let (true, Some((bos, _))) = (self.add_bos, &self.bos) {
            if ids.first() != Some(bos) {
                ids.insert(0, *bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of `text` alone: no BOS (for pieces of a prompt).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        contain("tokenizing", || Ok(self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?.get_ids().to_vec()))
    }

    /// A lower bound on the tokens of `text`, found with little memory (tokenizing costs hundreds
    /// of bytes per byte of text, so a prompt past the context is refused on this first): its
    /// bytes over the longest token's, and over 4 again since a normalizer may shrink text (NFC
    /// joins up to three code points into one); then, for a large text that may fit in `limit`,
    /// the tokens of its pieces cut at whitespace, each dropped once counted, less what a cut
    /// can add. Stops as soon as the bound passes `limit`.
    pub fn fewest_tokens(&self, text: &str, limit: usize) -> Result<usize> {
        /// Texts up to this size are tokenized whole.
        const WHOLE_BYTES: usize = 1 << 20;
        const PIECE_BYTES: usize = 256 << 10;
        /// Tokens a cut may add (a word split in two, a prefix space added to the next piece).
        const CUT_SLACK: usize = 16;
        let longest = *self.longest_token.get_or_init(|| (0..self.vocab_size() as u32).map(|id| self.token_bytes(id).len()).max().unwrap_or(1).max(1));
        let quick = text.len() / (4 * longest);
        if quick > limit || text.len() <= WHOLE_BYTES {
            return Ok(quick);
        }
        let (mut counted, mut cuts, mut rest) = (0usize, 0usize, text);
        while !rest.is_empty() {
            let mut end = rest.len().min(PIECE_BYTES);
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            if end < rest.len() {
                // At the last whitespace, where a pre-tokenizer splits anyway.
                end = rest[..end].rfind(char::is_whitespace).filter(|&at| at > 0).unwrap_or(end);
                cuts += 1;
            }
            counted += self.encode_plain(&rest[..end])?.len();
            rest = &rest[end..];
            let fewest = counted.saturating_sub(CUT_SLACK * cuts);
            if fewest > limit {
                return Ok(fewest);
            }
        }
        Ok(quick.max(counted.saturating_sub(CUT_SLACK * cuts)))
    }

    /// The text of `ids`, without special tokens other than [`SHOWN_SPECIAL_TOKENS`].
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let shown: Vec<u32> = ids.iter().copied().filter(|id| !self.hidden.contains(id)).collect();
        contain("detokenizing", || self.inner.decode(&shown, false).map_err(|e| Error::Tokenizer(e.to_string())))
    }

    /// The text of `ids` with every token in it, special ones too: what tokenizing the text
    /// gives back (vLLM's `/detokenize`).
    pub fn decode_all(&self, ids: &[u32]) -> Result<String> {
        contain("detokenizing", || self.inner.decode(ids, false).map_err(|e| Error::Tokenizer(e.to_string())))
    }

    /// Token `id` as the vocabulary writes it (`Ġthe`), as HF's `convert_ids_to_tokens` gives.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The end-of-sequence token's text, as the tokenizer's config names it.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The beginning-of-sequence token's text, and whether [`Self::encode`] puts it first.
    pub fn bos_token(&self) -> (Option<&str>, bool) {
        (self.bos.as_ref().map(|(_, text)| text.as_str()), self.add_bos)
    }

    /// The bytes token `id` stands for, whether or not they are whole UTF-8 (a byte-level piece
    /// of a character is one byte); an added or special token's text. Empty for an unknown id.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let table = self.token_bytes.get_or_init(|| {
            // Byte-level and byte-fallback vocabularies map exactly to bytes; others decode alone.
            let json = serde_json::to_value(&self.inner).ok();
            let mut table = json
                .and_then(|j| contain("reading the vocabulary", || llguidance::token_bytes_from_tokenizer_json(&j).map_err(|e| Error::Tokenizer(e.to_string()))).ok())
                .unwrap_or_default();
            // Added tokens stand for their text (llguidance marks special ones with a prefix byte).
            for (added, token) in self.inner.get_added_tokens_decoder() {
                if table.len() <= added as usize {
                    table.resize(added as usize + 1, Vec::new());
                }
                table[added as usize] = token.content.into_bytes();
            }
            table
        });
        match table.get(id as usize) {
            Some(bytes) if !bytes.is_empty() => bytes.clone(),
            _ => self.inner.decode(&[id], false).map(String::into_bytes).unwrap_or_default(),
        }
    }

    /// Renders the chat prompt. `enable_thinking` is passed to templates that understand it.
    pub fn apply_chat_template(&self, messages: &[Message], enable_thinking: bool) -> Result<String> {
        self.apply_chat_template_with_tools(messages, &[], super::tools::ToolFormat::Hermes, enable_thinking)
    }

    /// The chat template (Jinja source).
    pub fn chat_template(&self) -> &str {
        &self.chat_template
    }

    /// Renders the chat prompt offering `tools` (OpenAI tool objects): through the template when it
    /// handles tools, else written into the messages in `format`
    /// ([`super::tools::ToolFormat::plain_template_messages`]).
    pub fn apply_chat_template_with_tools(&self, messages: &[Message], tools: &[Value], format: super::tools::ToolFormat, enable_thinking: bool) -> Result<String> {
        let template_knows_tools = self.chat_template.contains("tools");
        let rewritten;
        let messages = if template_knows_tools || (tools.is_empty() && messages.iter().all(|m| m.tool_calls.is_none() && m.role != "tool")) {
            messages
        } else {
            rewritten = format.plain_template_messages(messages, tools);
            &rewritten
        };
        let tools = (template_knows_tools && !tools.is_empty()).then_some(tools);
        self.render(minijinja::Value::from(minijinja::value::Serde(messages)), tools, enable_thinking)
    }

    /// The template rendered over `messages` (a list), with the generation prompt.
    fn render(&self, messages: minijinja::Value, tools: Option<&[Value]>, enable_thinking: bool) -> Result<String> {
        let items = messages.len().unwrap_or(0) + tools.map_or(0, <[Value]>::len);
        let mut env = minijinja::Environment::new();
        // A template is code from the model file: bounded in steps, generously per message.
        env.set_fuel(Some(TEMPLATE_FUEL_BASE + TEMPLATE_FUEL_PER_ITEM * items as u64));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template("chat", &self.chat_template).map_err(|e| Error::Template(e.to_string()))?;
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos.as_ref().map(|(_, t)| t.clone()).unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
            enable_thinking => enable_thinking,
            tools => tools.map(|t| minijinja::Value::from(minijinja::value::Serde(t))),
        };
        env.get_template("chat")
            .and_then(|t| t.render(context))
            .map_err(|e| Error::Template(e.to_string()))
    }
}

/// Steps a chat template may take: a base, plus this per message and per tool (real templates
/// take a few hundred per message).
const TEMPLATE_FUEL_BASE: u64 = 10_000_000;
const TEMPLATE_FUEL_PER_ITEM: u64 = 100_000;

/// Turns a growing token sequence into text pieces: tokenizers' own stream decoding (incomplete
/// UTF-8 held back, only a short window decoded, so the cost does not grow with the output),
/// with the special tokens [`TextTokenizer::decode`] hides left out.
#[derive(Default)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl StreamDecoder {
    pub fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<String> {
        if tokenizer.hidden.contains(&id) {
            return Ok(String::new());
        }
        let (ids, prefix, prefix_index) = (&mut self.ids, &mut self.prefix, &mut self.prefix_index);
        contain("detokenizing", || {
            match tokenizers::tokenizer::step_decode_stream(&tokenizer.inner, vec![id], false, ids, prefix, prefix_index) {
                Ok(piece) => Ok(piece.unwrap_or_default()),
                // The window does not extend the text shown yet (a decoder rewrote its start): wait.
                Err(e) if e.is::<tokenizers::tokenizer::DecodeStreamError>() => Ok(String::new()),
                Err(e) => Err(Error::Tokenizer(e.to_string())),
            }
        })
    }

    /// Whatever is still held back (e.g. a dangling partial character).
    pub fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<String> {
        let ids = std::mem::take(&mut self.ids);
        let prefix = std::mem::take(&mut self.prefix);
        self.prefix_index = 0;
        let all = contain("detokenizing", || tokenizer.inner.decode(&ids, false).map_err(|e| Error::Tokenizer(e.to_string())))?;
        Ok(all.strip_prefix(prefix.as_str()).unwrap_or_default().to_string())
    }
}

/// Bytes at the end of `text` that could be the start of `tag` (held back from a stream until the
/// next piece shows whether the tag completes).
pub fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| text.len() >= n && text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// Separates `<think>…</think>` reasoning from the answer in streamed text, also when a tag is
/// split across pieces.
#[derive(Default)]
pub struct ThinkFilter {
    inside: bool,
    pending: String,
    /// After a closing tag, leading whitespace of the answer is dropped.
    trim_next: bool,
}

/// What a piece of streamed text adds to the reasoning and to the answer.
#[derive(Debug, Default, PartialEq)]
pub struct ThinkSplit {
    pub reasoning: String,
    pub answer: String,
}

impl ThinkFilter {
    const OPEN: &'static str = "<think>";
    const CLOSE: &'static str = "</think>";

    /// `inside`: the prompt already opened a think block.
    pub fn new(inside: bool) -> Self {
        Self { inside, ..Default::default() }
    }

    /// A filter for the answer to `prompt`: inside a think block when the prompt opened one.
    pub fn after_prompt(prompt: &str) -> Self {
        Self::new(prompt.trim_end().ends_with(Self::OPEN))
    }

    /// The answer text only (reasoning hidden).
    pub fn push(&mut self, text: &str) -> String {
        self.split(text).answer
    }

    pub fn split(&mut self, text: &str) -> ThinkSplit {
        self.pending.push_str(text);
        let mut out = ThinkSplit::default();
        loop {
            let tag = if self.inside { Self::CLOSE } else { Self::OPEN };
            if let Some(at) = self.pending.find(tag) {
                let part = if self.inside { &mut out.reasoning } else { &mut out.answer };
                part.push_str(&self.pending[..at]);
                self.pending.drain(..at + tag.len());
                self.inside = !self.inside;
                self.trim_next = !self.inside;
                continue;
            }
            // Keep a suffix that could still become the tag; release the rest.
            let keep = partial_tag_len(&self.pending, tag);
            let release: String = self.pending.drain(..self.pending.len() - keep).collect();
            if self.inside {
                out.reasoning.push_str(&release);
            } else {
                out.answer.push_str(&release);
            }
            break;
        }
        if self.trim_next {
            let trimmed = out.answer.trim_start();
            if !trimmed.is_empty() {
                self.trim_next = false;
            }
            out.answer = trimmed.to_string();
        }
        out
    }

    /// The answer text still held back.
    pub fn finish(&mut self) -> String {
        self.finish_split().answer
    }

    pub fn finish_split(&mut self) -> ThinkSplit {
        let rest = std::mem::take(&mut self.pending);
        if self.inside {
            ThinkSplit { reasoning: rest, answer: String::new() }
        } else {
            ThinkSplit { reasoning: String::new(), answer: rest }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ThinkFilter, ThinkSplit};

    #[test]
    fn decoded_text_keeps_the_special_tokens_that_mark_calls() {
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 2, "content": "[TOOL_CALLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
                {"id": 3, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            ],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"hi": 0, "x": 1, "[TOOL_CALLS]": 2, "</s>": 3}, "unk_token": "x"},
        });
        let files = super::TokenizerFiles { source: "toy".into(), tokenizer_json: json.to_string(), config: serde_json::Value::Null, chat_template: None };
        let tok = super::TextTokenizer::new(&files, None).unwrap();
        assert_eq!(tok.decode(&[0, 2, 1, 3]).unwrap(), "hi [TOOL_CALLS] x");
    }

    /// A toy tokenizer with `template` as its chat template.
    fn with_template(template: &str) -> super::TextTokenizer {
        let json = serde_json::json!({
            "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"hi": 0, "x": 1}, "unk_token": "x"},
        });
        let files = super::TokenizerFiles { source: "toy".into(), tokenizer_json: json.to_string(), config: serde_json::Value::Null, chat_template: Some(template.into()) };
        super::TextTokenizer::new(&files, None).unwrap()
    }

    /// Thinking is found in what a template renders: tags built from pieces count, a tag only
    /// in a comment does not.
    #[test]
    fn a_reasoning_model_is_known_by_what_its_template_renders() {
        let built = "{% for m in messages %}{% if m.role == 'assistant' and m.reasoning_content %}{{ '<' ~ 'think>' ~ m.reasoning_content ~ '</' ~ 'think>' }}{% endif %}{{ m.content }}{% endfor %}";
        let opened = "{% set tag = 'think' %}{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt and enable_thinking %}{{ '<' + tag + '>' }}{% endif %}";
        let macro_ = "{% macro wrap(t) %}<{{ t }}>{% endmacro %}{% for m in messages %}{{ m.content }}{% endfor %}{% if not enable_thinking %}{{ wrap('think') }}{{ wrap('/think') }}{% endif %}";
        for template in [built, opened, macro_] {
            assert!(!template.contains("<think>"));
            assert!(with_template(template).can_think(), "{template}");
        }
        let commented = "{# a model without <think> blocks #}{% for m in messages %}{{ m.content }}{% endfor %}";
        assert!(!with_template(commented).can_think());
        assert!(!with_template(super::CHATML_TEMPLATE).can_think());
        // A template that renders nothing it is given falls back to its source.
        assert!(with_template("{{ raise_exception('no') }}<think>").can_think());
    }

    fn run(pieces: &[&str], inside: bool) -> String {
        let mut f = ThinkFilter::new(inside);
        let mut out: String = pieces.iter().map(|p| f.push(p)).collect();
        out.push_str(&f.finish());
        out
    }

    #[test]
    fn hides_think_blocks_split_anywhere() {
        let text = "<think>\nplan the answer\n</think>\n\nParis is the capital.";
        let want = "Paris is the capital.";
        assert_eq!(run(&[text], false), want);
        for split in 1..text.len() {
            if text.is_char_boundary(split) {
                assert_eq!(run(&[&text[..split], &text[split..]], false), want, "split at {split}");
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&pieces, false), want);
    }

    #[test]
    fn keeps_the_reasoning_apart() {
        let text = "<think>\nplan the answer\n</think>\n\nParis.";
        for cut in 1..text.len() {
            let mut f = ThinkFilter::new(false);
            let (a, b, c) = (f.split(&text[..cut]), f.split(&text[cut..]), f.finish_split());
            let reasoning = [a.reasoning, b.reasoning, c.reasoning].concat();
            let answer = [a.answer, b.answer, c.answer].concat();
            assert_eq!((reasoning.as_str(), answer.as_str()), ("\nplan the answer\n", "Paris."), "cut at {cut}");
        }
        let mut f = ThinkFilter::new(true);
        assert_eq!(f.split("unfinished"), ThinkSplit { reasoning: "unfinished".into(), answer: String::new() });
    }

    #[test]
    fn passes_text_without_tags_and_handles_open_prompt() {
        assert_eq!(run(&["a < b", " and <thin", "g>"], false), "a < b and <thing>");
        assert_eq!(run(&["reasoning", "</thi", "nk> answer"], true), "answer");
        assert_eq!(run(&["<think>never closed"], false), "");
        let mut f = ThinkFilter::after_prompt("<|im_start|>assistant\n<think>\n");
        assert_eq!(f.push("plan</think>\nok"), "ok");
        assert!(!ThinkFilter::after_prompt("<|im_start|>assistant\n").inside);
    }
}
