//! `POST /v1/completions`: OpenAI's legacy text completions. The prompt is raw text (no chat
//! template) or token ids, several prompts giving one choice each; `echo` puts the prompt before
//! the answer, and with `logprobs` reports the prompt's tokens too (the first with no
//! log-probability), which is how evaluation harnesses score text (`echo`, `max_tokens: 0`,
//! `logprobs`). `n`, `best_of` and `suffix` are refused by name.

use super::openai::{self, boolean, check_model, integer, json_object, number, wrong, ApiError, Served};
use super::scheduler::{AnswerToken, Event, Job};
use super::AppState;
use crate::engine::generate::LogprobOptions;
use crate::engine::logprobs::TokenLogprobs;
use crate::engine::generation_config::SamplingChoice;
use crate::engine::sampler::SamplingParams;
use crate::engine::tokenizer::{StreamDecoder, TextTokenizer};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Answer length when a request gives none (OpenAI's legacy default).
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Most alternatives per token (OpenAI's limit for this endpoint).
pub const MAX_LOGPROBS: usize = 5;
/// Most prompts in one request (each is a request to the worker; they run batched).
pub const MAX_PROMPTS: usize = 64;

/// A validated completions request.
#[derive(Debug)]
pub struct CompletionRequest {
    pub prompts: Vec<PromptInput>,
    /// The API's defaults where the request is silent, until [`prepare`] puts the model's in.
    pub sampling: SamplingParams,
    /// The sampling fields the request set.
    pub sampling_set: SamplingChoice,
    pub max_tokens: usize,
    /// vLLM's extension: go on past end-of-sequence tokens.
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub echo: bool,
    /// `logprobs: N`: each token's log-probability and the N most likely alternatives.
    pub logprobs: Option<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
fn prompts(value: Option<&Value>) -> Result<Vec<PromptInput>, ApiError> {
    let expected = "a string, a list of strings, a list of token ids or a list of lists of token ids";
    let ids = |items: &[Value]| -> Option<Vec<u32>> { items.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok())).collect() };
    let prompts = match value {
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(wrong("prompt", expected)),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().map(|v| PromptInput::Text(v.as_str().unwrap_or_default().to_string())).collect()
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![PromptInput::Ids(ids(items).ok_or_else(|| wrong("prompt", "token ids: integers from 0"))?)],
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| {
                let list = v.as_array().map(Vec::as_slice).unwrap_or_default();
                ids(list).map(PromptInput::Ids).ok_or_else(|| wrong("prompt", "lists of token ids: integers from 0"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(wrong("prompt", expected)),
    };
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::bad_request("prompt", &format!("at most {MAX_PROMPTS} prompts per request (this one has {})", prompts.len())));
    }
    Ok(prompts)
}

/// A field that changes the answer in a way this server does not do: absent, null or `ok`.
fn refuse_unless(obj: &Map<String, Value>, key: &str, ok: impl Fn(&Value) -> bool, why: &str) -> Result<(), ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(v) if ok(v) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "unsupported_parameter", Some(key), &format!("`{key}` is not supported: {why}"))),
    }
}

impl CompletionRequest {
    pub fn parse(body: &[u8], served_model: &str) -> Result<Self, ApiError> {
        let obj = &json_object(body)?;
        check_model(obj, served_model)?;
        refuse_unless(obj, "n", |v| v.as_u64() == Some(1), "one choice per prompt (send the request again, or a list of prompts, for more)")?;
        refuse_unless(obj, "best_of", |v| v.as_u64() == Some(1), "candidates are not generated server-side (leave it out or set 1)")?;
        refuse_unless(obj, "suffix", |v| v.as_str() == Some(""), "text after the insertion point (fill-in-the-middle) is not supported")?;
        let prompts = prompts(obj.get("prompt"))?;
        let logprobs = match integer(obj, "logprobs", 0)? {
            Some(n) if n as usize > MAX_LOGPROBS => return Err(wrong("logprobs", &format!("an integer from 0 to {MAX_LOGPROBS}"))),
            n => n.map(|n| n as usize),
        };
        let sampling = SamplingParams {
            temperature: number(obj, "temperature", 0.0..=2.0)?.unwrap_or(1.0) as f32,
            top_p: (number(obj, "top_p", 0.0..=1.0)?.unwrap_or(1.0) as f32).max(f32::MIN_POSITIVE),
            top_k: integer(obj, "top_k", 0)?.unwrap_or(0) as usize,
            min_p: number(obj, "min_p", 0.0..=1.0)?.unwrap_or(0.0) as f32,
            frequency_penalty: number(obj, "frequency_penalty", -2.0..=2.0)?.unwrap_or(0.0) as f32,
            presence_penalty: number(obj, "presence_penalty", -2.0..=2.0)?.unwrap_or(0.0) as f32,
            repetition_penalty: number(obj, "repetition_penalty", 0.0..=100.0)?.unwrap_or(1.0) as f32,
            logit_bias: openai::logit_bias(obj.get("logit_bias"))?,
            seed: integer(obj, "seed", 0)?,
            ..Default::default()
        };
        sampling.validate().map_err(|e| ApiError::bad_request(e.field, &format!("`{}` {}", e.field, e.rule)))?;
        Ok(Self {
            prompts,
            sampling_set: openai::sampling_set(obj, &sampling),
            sampling,
            max_tokens: integer(obj, "max_tokens", 0)?.map_or(DEFAULT_MAX_TOKENS, |n| usize::try_from(n).unwrap_or(usize::MAX)),
            ignore_eos: boolean(obj, "ignore_eos")?.unwrap_or(false),
            stop: openai::stop_strings(obj.get("stop"), "stop")?,
            stream: boolean(obj, "stream")?.unwrap_or(false),
            include_usage: openai::include_usage(obj)?,
            echo: boolean(obj, "echo")?.unwrap_or(false),
            logprobs,
        })
    }
}

/// One prompt made ready for the worker.
pub struct PreparedPrompt {
    pub ids: Vec<u32>,
    /// What `echo` puts before the answer: the prompt as given, or its ids' text.
    pub echo_text: String,
    /// Where each prompt token's text starts in its decoded text (characters), for `echo` with
    /// `logprobs`.
    pub offsets: Vec<usize>,
}

/// Tokenizes each prompt and checks it, and the answer length, against the model.
pub fn prepare(body: &[u8], served: &Served) -> Result<(CompletionRequest, Vec<PreparedPrompt>), ApiError> {
    let mut request = CompletionRequest::parse(body, served.model_id)?;
    request.sampling = served.generation.fill(std::mem::take(&mut request.sampling), &request.sampling_set);
    let tokenizer = served.tokenizer;
    let many = request.prompts.len() > 1;
    let param = |i: usize| if many { format!("prompt[{i}]") } else { "prompt".to_string() };
    let prepared = request
        .prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let (ids, echo_text) = match prompt {
                PromptInput::Text(text) => {
                    openai::fits_before_tokenizing(tokenizer, text, served.max_context, &param(i))?;
                    (tokenizer.encode(text).map_err(|e| ApiError::bad_request(&param(i), &e.to_string()))?, text.clone())
                }
                PromptInput::Ids(ids) => {
                    if let Some(&id) = ids.iter().find(|&&id| id as usize >= served.vocab_size) {
                        return Err(ApiError::bad_request(&param(i), &format!("token id {id} is not below the vocabulary size {}", served.vocab_size)));
                    }
                    (ids.clone(), tokenizer.decode(ids).map_err(|e| ApiError::bad_request(&param(i), &e.to_string()))?)
                }
            };
            if ids.is_empty() {
                return Err(ApiError::bad_request(&param(i), "the prompt is empty: give at least one token of text"));
            }
            if ids.len().checked_add(request.max_tokens).is_none_or(|total| total > served.max_context) {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "context_length_exceeded",
                    Some(&param(i)),
                    &format!("this model's context is {} tokens; the prompt takes {} and max_tokens asks for {} more", served.max_context, ids.len(), request.max_tokens),
                ));
            }
            let offsets = if request.echo && request.logprobs.is_some() { char_offsets(tokenizer, &ids) } else { Vec::new() };
            Ok(PreparedPrompt { ids, echo_text, offsets })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((request, prepared))
}

/// Where each token's text starts (characters) when `ids` are decoded in a stream.
fn char_offsets(tokenizer: &TextTokenizer, ids: &[u32]) -> Vec<usize> {
    let mut decoder = StreamDecoder::default();
    let mut chars = 0;
    ids.iter()
        .map(|&id| {
            let at = chars;
            chars += decoder.push(tokenizer, id).map(|piece| piece.chars().count()).unwrap_or(0);
            at
        })
        .collect()
}

/// OpenAI's legacy `logprobs` object, or a piece of one (a streamed chunk's tokens).
#[derive(Default)]
struct Logprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
}

impl Logprobs {
    /// One token: its log-probability (none for a prompt's first token) and the `top` most
    /// likely alternatives with the token itself, as `{token: logprob}`.
    fn push(&mut self, tokenizer: &TextTokenizer, token: u32, scored: Option<&TokenLogprobs>, offset: usize) {
        let text = |id: u32| openai::token_text(&tokenizer.token_bytes(id));
        self.tokens.push(text(token));
        self.text_offset.push(offset);
        match scored {
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
            Some(t) => {
                self.token_logprobs.push(openai::logprob_value(t.logprob));
                let mut top = Map::new();
                for &(id, lp) in t.top.iter().chain(std::iter::once(&(t.token, t.logprob))) {
                    top.entry(text(id)).or_insert(openai::logprob_value(lp));
                }
                self.top_logprobs.push(Value::Object(top));
            }
        }
    }

    fn extend(&mut self, other: Logprobs) {
        self.tokens.extend(other.tokens);
        self.token_logprobs.extend(other.token_logprobs);
        self.top_logprobs.extend(other.top_logprobs);
        self.text_offset.extend(other.text_offset);
    }

    fn to_json(&self) -> Value {
        json!({"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top_logprobs, "text_offset": self.text_offset})
    }
}

/// One choice as its events arrive.
struct Choice {
    prompt: PreparedPrompt,
    echo: bool,
    logprobs: bool,
    /// The answer so far (without the echo), and a cursor turning its byte offsets into characters.
    answer: String,
    cursor: (usize, usize),
    /// Characters before the answer (the echoed prompt).
    before: usize,
    /// Prompt, completion and cached tokens, once done.
    usage: Option<(usize, usize, usize)>,
}

impl Choice {
    fn new(prompt: PreparedPrompt, echo: bool, logprobs: bool) -> Self {
        let before = if echo { prompt.echo_text.chars().count() } else { 0 };
        Self { prompt, echo, logprobs, answer: String::new(), cursor: (0, 0), before, usage: None }
    }

    /// The echoed prompt, once its log-probabilities are known (at once without `logprobs`).
    fn echo(&self, tokenizer: &TextTokenizer, scored: &[TokenLogprobs]) -> (String, Logprobs) {
        let mut logprobs = Logprobs::default();
        if self.logprobs {
            for (i, &id) in self.prompt.ids.iter().enumerate() {
                let score = i.checked_sub(1).and_then(|j| scored.get(j));
                logprobs.push(tokenizer, id, score, self.prompt.offsets.get(i).copied().unwrap_or(0));
            }
        }
        (self.prompt.echo_text.clone(), logprobs)
    }

    /// More answer text and its tokens.
    fn text(&mut self, tokenizer: &TextTokenizer, text: &str, tokens: &[AnswerToken]) -> Logprobs {
        self.answer.push_str(text);
        let mut logprobs = Logprobs::default();
        for t in tokens {
            let (byte, chars) = &mut self.cursor;
            let to = t.offset.min(self.answer.len());
            if to > *byte && self.answer.is_char_boundary(to) {
                *chars += self.answer[*byte..to].chars().count();
                *byte = to;
            }
            logprobs.push(tokenizer, t.logprobs.token, Some(&t.logprobs), self.before + *chars);
        }
        logprobs
    }
}

pub(crate) async fn handle(
    State(state): State<Arc<AppState>>,
    Extension(peer): Extension<super::Peer>,
    Extension(log): Extension<super::log::RequestLog>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let received = std::time::Instant::now();
    let (bytes, lease) = super::accept(&state, &headers, body, &log).await?;
    let (request, prompts) = super::prepare_blocking(&state, &lease, bytes.len(), move |served| prepare(&bytes, served)).await?;
    let tokenizer = lease.ready().tokenizer.clone();
    // Each prompt is its own job; their events come in through one channel, tagged by choice.
    let (merged, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Event)>();
    let mut choices = Vec::new();
    for (index, prompt) in prompts.into_iter().enumerate() {
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        let logprobs = LogprobOptions { generated: request.logprobs, prompt: request.logprobs.filter(|_| request.echo) };
        let job = Job {
            prompt: prompt.ids.clone(),
            sampling: request.sampling.clone(),
            constraint: None,
            max_tokens: request.max_tokens,
            ignore_eos: request.ignore_eos,
            stop: request.stop.clone(),
            logprobs,
            received,
            events: tx,
            lease: None,
        };
        super::submit(&lease, job)?;
        let merged = merged.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                if merged.send((index, event)).is_err() {
                    break;
                }
            }
        });
        choices.push(Choice::new(prompt, request.echo, request.logprobs.is_some()));
    }
    drop(merged);
    let id = openai::response_id("cmpl");
    let created = openai::now();
    let model = lease.id.clone();
    if request.stream {
        let (out, out_rx) = tokio::sync::mpsc::unbounded_channel();
        let include_usage = request.include_usage;
        log.streaming();
        tokio::spawn(async move {
            let chunk = |index: usize, text: String, logprobs: Option<Logprobs>, finish: Option<&str>| {
                let mut c = json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": text, "index": index, "logprobs": logprobs.map(|l| l.to_json()), "finish_reason": finish}]});
                if include_usage {
                    c["usage"] = Value::Null;
                }
                c
            };
            let send = |v: Value| out.send(Ok::<_, std::convert::Infallible>(SseEvent::default().data(v.to_string()))).is_ok();
            let wants_logprobs = request.logprobs.is_some();
            // Without prompt log-probabilities to wait for, the echo goes out first.
            for (index, choice) in choices.iter().enumerate() {
                if choice.echo && !wants_logprobs {
                    send(chunk(index, choice.prompt.echo_text.clone(), None, None));
                }
            }
            let mut open = choices.len();
            while let Some((index, event)) = rx.recv().await {
                log.see(&event);
                let choice = &mut choices[index];
                let more = match event {
                    Event::Started { .. } => true,
                    Event::PromptLogprobs(scored) => {
                        if choice.echo {
                            let (text, logprobs) = choice.echo(&tokenizer, &scored);
                            send(chunk(index, text, Some(logprobs), None))
                        } else {
                            true
                        }
                    }
                    Event::Text { text, logprobs } => {
                        let scored = choice.text(&tokenizer, &text, &logprobs);
                        send(chunk(index, text, wants_logprobs.then_some(scored), None))
                    }
                    Event::Done { finish_reason, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                        choice.usage = Some((prompt_tokens, completion_tokens, cached_tokens));
                        open -= 1;
                        send(chunk(index, String::new(), None, Some(finish_reason))) && open > 0
                    }
                    Event::Error(e) => {
                        send(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "generation_failed", None, &e).to_json());
                        false
                    }
                    Event::Shutdown => {
                        send(super::shutting_down().to_json());
                        false
                    }
                };
                if !more {
                    break;
                }
            }
            if open == 0 {
                log.finished();
            }
            if open == 0 && include_usage {
                let (prompt, completion, cached) = choices.iter().filter_map(|c| c.usage).fold((0, 0, 0), |(p, c, k), (a, b, d)| (p + a, c + b, k + d));
                let mut last = chunk(0, String::new(), None, None);
                last["choices"] = json!([]);
                last["usage"] = openai::usage(prompt, completion, cached);
                send(last);
            }
            let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
        });
        return Ok(Sse::new(tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx)).keep_alive(KeepAlive::default()).into_response());
    }
    peer.unless_hung_up(async move {
    let mut texts: Vec<String> = choices.iter().map(|c| if c.echo { c.prompt.echo_text.clone() } else { String::new() }).collect();
    let mut logprobs: Vec<Logprobs> = choices.iter().map(|_| Logprobs::default()).collect();
    let mut finish: Vec<Option<&'static str>> = vec![None; choices.len()];
    let (mut prompt_total, mut completion_total, mut cached_total) = (0, 0, 0);
    while let Some((index, event)) = rx.recv().await {
        log.see(&event);
        let choice = &mut choices[index];
        match event {
            Event::Started { .. } => {}
            Event::PromptLogprobs(scored) => {
                if choice.echo {
                    let (_, echoed) = choice.echo(&tokenizer, &scored);
                    // The prompt's tokens come first, whatever arrived before.
                    let answer = std::mem::take(&mut logprobs[index]);
                    logprobs[index] = echoed;
                    logprobs[index].extend(answer);
                }
            }
            Event::Text { text, logprobs: tokens } => {
                let scored = choice.text(&tokenizer, &text, &tokens);
                texts[index].push_str(&text);
                logprobs[index].extend(scored);
            }
            Event::Done { finish_reason, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                finish[index] = Some(finish_reason);
                prompt_total += prompt_tokens;
                completion_total += completion_tokens;
                cached_total += cached_tokens;
                if finish.iter().all(Option::is_some) {
                    break;
                }
            }
            Event::Error(e) => return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "generation_failed", None, &e)),
            Event::Shutdown => return Err(super::shutting_down()),
        }
    }
    if finish.iter().any(Option::is_none) {
        return Err(super::worker_gone());
    }
    let choices: Vec<Value> = (0..choices.len())
        .map(|i| {
            let logprobs = request.logprobs.map(|_| logprobs[i].to_json());
            json!({"text": texts[i], "index": i, "logprobs": logprobs, "finish_reason": finish[i]})
        })
        .collect();
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": lease.id,
        "choices": choices,
        "usage": openai::usage(prompt_total, completion_total, cached_total),
    }))
    .into_response())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<CompletionRequest, ApiError> {
        CompletionRequest::parse(body.to_string().as_bytes(), "m")
    }

    #[test]
    fn prompts_in_every_shape() {
        assert_eq!(parse(json!({"prompt": "hi"})).unwrap().prompts, vec![PromptInput::Text("hi".into())]);
        assert_eq!(parse(json!({"prompt": ["a", "b"]})).unwrap().prompts.len(), 2);
        assert_eq!(parse(json!({"prompt": [1, 2, 3]})).unwrap().prompts, vec![PromptInput::Ids(vec![1, 2, 3])]);
        assert_eq!(parse(json!({"prompt": [[1], [2, 3]]})).unwrap().prompts, vec![PromptInput::Ids(vec![1]), PromptInput::Ids(vec![2, 3])]);
        for bad in [json!({}), json!({"prompt": []}), json!({"prompt": ["a", 1]}), json!({"prompt": [-1]}), json!({"prompt": 5})] {
            assert_eq!(parse(bad.clone()).unwrap_err().param.as_deref(), Some("prompt"), "{bad}");
        }
    }

    #[test]
    fn defaults_and_refusals_name_the_field() {
        let r = parse(json!({"prompt": "x"})).unwrap();
        assert_eq!((r.max_tokens, r.echo, r.logprobs, r.sampling.temperature), (DEFAULT_MAX_TOKENS, false, None, 1.0));
        let r = parse(json!({"prompt": "x", "max_tokens": 0, "echo": true, "logprobs": 5, "n": 1, "best_of": 1, "suffix": null})).unwrap();
        assert_eq!((r.max_tokens, r.echo, r.logprobs), (0, true, Some(5)));
        for (field, body) in [
            ("n", json!({"prompt": "x", "n": 2})),
            ("best_of", json!({"prompt": "x", "best_of": 3})),
            ("suffix", json!({"prompt": "x", "suffix": "end"})),
            ("logprobs", json!({"prompt": "x", "logprobs": 6})),
            ("temperature", json!({"prompt": "x", "temperature": 3})),
            ("model", json!({"prompt": "x", "model": "other"})),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
            assert!(e.message.contains(field), "{}", e.message);
        }
    }
}
