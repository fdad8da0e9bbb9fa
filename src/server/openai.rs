//! The OpenAI chat-completions request, read field by field so that every wrong type or value is
//! answered with a 4xx error naming the parameter, and the error type itself.

use crate::engine::grammar::{Constraint, Grammar, Reasoning};
use crate::engine::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::engine::tools::ToolFormat;
use crate::engine::generation_config::{GenerationDefaults, SamplingChoice};
use crate::engine::sampler::SamplingParams;
use crate::engine::tokenizer::{Message, TextTokenizer};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: &'static str,
    pub param: Option<String>,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, code: &'static str, param: Option<&str>, message: &str) -> Self {
        Self { status, kind, code, param: param.map(str::to_string), message: message.to_string() }
    }

    pub fn bad_request(param: &str, message: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_value", Some(param), message)
    }

    pub fn not_found(message: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", None, message)
    }
}

impl ApiError {
    /// The error object, as a response body or a streamed event.
    pub fn to_json(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.to_json())).into_response()
    }
}

/// A validated chat-completions request.
#[derive(Debug)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// The API's defaults where the request is silent, until [`prepare`] puts the model's in.
    pub sampling: SamplingParams,
    /// The sampling fields the request set.
    pub sampling_set: SamplingChoice,
    pub max_tokens: Option<usize>,
    /// vLLM's extension: go on past end-of-sequence tokens (to measure at a fixed length).
    pub ignore_eos: bool,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub enable_thinking: bool,
    /// The offered functions (OpenAI tool objects); empty with `tool_choice: "none"`.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// The served model's call syntax.
    pub tool_format: ToolFormat,
    /// `response_format`: the JSON Schema the answer must follow (`{"type": "object"}` for
    /// `json_object`); `None` for free text.
    pub response_format: Option<Value>,
    /// The field that gave `response_format`, as errors about its schema name it.
    pub response_format_param: &'static str,
    /// `logprobs: true`: the answer's tokens with their log-probabilities and this many
    /// alternatives each (`top_logprobs`).
    pub logprobs: Option<usize>,
    /// `max_tokens` is only a cap: past the room the context leaves, it is lowered to that room
    /// (Anthropic clients ask for far more than a small model holds) instead of refused.
    pub cap_max_tokens: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model may answer or call.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this one.
    Function(String),
}

/// The names of the functions in `tools`, each checked.
fn tool_names(tools: &[Value]) -> Result<Vec<String>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let param = format!("tools[{i}]");
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(wrong(&format!("{param}.type"), "\"function\""));
            }
            let function = tool.get("function").and_then(Value::as_object).ok_or_else(|| wrong(&format!("{param}.function"), "an object"))?;
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(wrong(&format!("{param}.function.name"), "1 to 64 letters, digits, underscores or dashes"));
            }
            if function.get("parameters").is_some_and(|p| !p.is_object()) {
                return Err(wrong(&format!("{param}.function.parameters"), "a JSON Schema object"));
            }
            Ok(name.to_string())
        })
        .collect()
}

/// The sampling fields `obj` sets (`null` counts as unset), with the values `sampling` read.
pub(crate) fn sampling_set(obj: &Map<String, Value>, sampling: &SamplingParams) -> SamplingChoice {
    let set = |key: &str| obj.get(key).is_some_and(|v| !v.is_null());
    SamplingChoice {
        temperature: set("temperature").then_some(sampling.temperature),
        top_p: set("top_p").then_some(sampling.top_p),
        top_k: set("top_k").then_some(sampling.top_k),
        min_p: set("min_p").then_some(sampling.min_p),
        repetition_penalty: set("repetition_penalty").then_some(sampling.repetition_penalty),
    }
}

pub(crate) fn wrong(param: &str, expected: &str) -> ApiError {
    ApiError::bad_request(param, &format!("`{param}` must be {expected}"))
}

pub(crate) fn number(obj: &Map<String, Value>, key: &str, range: std::ops::RangeInclusive<f64>) -> Result<Option<f64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_f64().ok_or_else(|| wrong(key, "a number"))?;
            if !range.contains(&x) {
                return Err(wrong(key, &format!("between {} and {}", range.start(), range.end())));
            }
            Ok(Some(x))
        }
    }
}

pub(crate) fn integer(obj: &Map<String, Value>, key: &str, min: u64) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_u64().filter(|&x| x >= min).ok_or_else(|| wrong(key, &format!("an integer ≥ {min}")))?;
            Ok(Some(x))
        }
    }
}

pub(crate) fn boolean(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong(key, "true or false")),
    }
}

/// The body as a JSON object.
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_json", None, &format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad_request("body", "the body must be a JSON object")),
    }
}

/// The request's `model`, when given, must be the one served.
pub(crate) fn check_model(obj: &Map<String, Value>, served_model: &str) -> Result<(), ApiError> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if m == served_model => Ok(()),
        Some(Value::String(m)) => Err(not_served(m, served_model)),
        Some(_) => Err(wrong("model", "a string")),
    }
}

/// A request named a model this server does not serve.
pub(crate) fn not_served(requested: &str, served_model: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "model_not_found",
        Some("model"),
        &format!("model `{requested}` is not served here (this server serves `{served_model}`; see GET /v1/models)"),
    )
}

/// `stop`: a string or up to 4 non-empty strings.
pub(crate) fn stop_strings(value: Option<&Value>, param: &str) -> Result<Vec<String>, ApiError> {
    let stop = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let stops: Vec<String> = items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| wrong(param, "a string or a list of strings"))?;
            if stops.len() > 4 {
                return Err(ApiError::bad_request(param, &format!("at most 4 `{param}` strings")));
            }
            stops
        }
        Some(_) => return Err(wrong(param, "a string or a list of strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(param, &format!("`{param}` strings must not be empty")));
    }
    Ok(stop)
}

/// `logit_bias`: token id → bias in [-100, 100].
pub(crate) fn logit_bias(value: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                let id: u32 = k.parse().map_err(|_| wrong("logit_bias", "an object of token id → bias"))?;
                let bias = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| wrong("logit_bias", "biases between -100 and 100"))?;
                Ok((id, bias as f32))
            })
            .collect(),
        Some(_) => Err(wrong("logit_bias", "an object of token id → bias")),
    }
}

/// `stream_options.include_usage`.
pub(crate) fn include_usage(obj: &Map<String, Value>) -> Result<bool, ApiError> {
    match obj.get("stream_options") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Object(o)) => Ok(boolean(o, "include_usage")?.unwrap_or(false)),
        Some(_) => Err(wrong("stream_options", "an object")),
    }
}

impl ChatRequest {
    pub fn parse(body: &[u8], served_model: &str, tool_format: ToolFormat) -> Result<Self, ApiError> {
        let obj = &json_object(body)?;
        check_model(obj, served_model)?;
        let tools = match obj.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(tools)) => tools.clone(),
            Some(_) => return Err(wrong("tools", "a list of tools")),
        };
        let names = tool_names(&tools)?;
        let bad_choice = || wrong("tool_choice", "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": …}}");
        let tool_choice = match obj.get("tool_choice") {
            None | Some(Value::Null) => Some(ToolChoice::Auto),
            Some(Value::String(s)) if s == "none" => None,
            Some(Value::String(s)) if s == "auto" => Some(ToolChoice::Auto),
            Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
            Some(Value::Object(o)) => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
                match name {
                    Some(name) if names.iter().any(|n| n == name) => Some(ToolChoice::Function(name.to_string())),
                    Some(name) => return Err(ApiError::bad_request("tool_choice", &format!("`tool_choice` names `{name}`, which is not in `tools`"))),
                    None => return Err(bad_choice()),
                }
            }
            Some(_) => return Err(bad_choice()),
        };
        if tools.is_empty() && matches!(tool_choice, Some(ToolChoice::Required | ToolChoice::Function(_))) {
            return Err(ApiError::bad_request("tool_choice", "`tool_choice` asks for a tool call but no `tools` are given"));
        }
        let parallel_tool_calls = boolean(obj, "parallel_tool_calls")?.unwrap_or(true);
        let response_format = response_format(obj.get("response_format"))?;
        let (tools, tool_choice) = match tool_choice {
            Some(choice) => (tools, choice),
            None => (Vec::new(), ToolChoice::Auto),
        };
        if let Some(n) = integer(obj, "n", 1)? {
            if n != 1 {
                return Err(ApiError::bad_request("n", "only n = 1 is supported"));
            }
        }
        let messages = parse_messages(obj.get("messages"))?;
        let stop = stop_strings(obj.get("stop"), "stop")?;
        let logit_bias = logit_bias(obj.get("logit_bias"))?;
        let top_logprobs = integer(obj, "top_logprobs", 0)?;
        let logprobs = match (boolean(obj, "logprobs")?.unwrap_or(false), top_logprobs) {
            (_, Some(n)) if n as usize > MAX_TOP_LOGPROBS => return Err(wrong("top_logprobs", &format!("an integer from 0 to {MAX_TOP_LOGPROBS}"))),
            (false, Some(_)) => return Err(ApiError::bad_request("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
            (true, n) => Some(n.unwrap_or(0) as usize),
            (false, None) => None,
        };
        let max_tokens = match integer(obj, "max_completion_tokens", 1)? {
            Some(n) => Some(n),
            None => integer(obj, "max_tokens", 1)?,
        };
        let stream = boolean(obj, "stream")?.unwrap_or(false);
        let include_usage = include_usage(obj)?;
        let enable_thinking = match obj.get("chat_template_kwargs") {
            None | Some(Value::Null) => true,
            Some(Value::Object(o)) => boolean(o, "enable_thinking")?.unwrap_or(true),
            Some(_) => return Err(wrong("chat_template_kwargs", "an object")),
        };
        let sampling = SamplingParams {
            temperature: number(obj, "temperature", 0.0..=2.0)?.unwrap_or(1.0) as f32,
            // OpenAI takes 0: only the most likely token.
            top_p: (number(obj, "top_p", 0.0..=1.0)?.unwrap_or(1.0) as f32).max(f32::MIN_POSITIVE),
            top_k: integer(obj, "top_k", 0)?.unwrap_or(0) as usize,
            min_p: number(obj, "min_p", 0.0..=1.0)?.unwrap_or(0.0) as f32,
            frequency_penalty: number(obj, "frequency_penalty", -2.0..=2.0)?.unwrap_or(0.0) as f32,
            presence_penalty: number(obj, "presence_penalty", -2.0..=2.0)?.unwrap_or(0.0) as f32,
            // vLLM's extension, so a request can override a model's generation_config.json.
            repetition_penalty: number(obj, "repetition_penalty", 0.0..=100.0)?.unwrap_or(1.0) as f32,
            logit_bias,
            seed: integer(obj, "seed", 0)?,
            ..Default::default()
        };
        sampling.validate().map_err(|e| ApiError::bad_request(e.field, &format!("`{}` {}", e.field, e.rule)))?;
        Ok(Self {
            messages,
            sampling_set: sampling_set(obj, &sampling),
            sampling,
            max_tokens: max_tokens.map(|n| n as usize),
            ignore_eos: boolean(obj, "ignore_eos")?.unwrap_or(false),
            stop,
            stream,
            include_usage,
            enable_thinking,
            tools,
            tool_choice,
            parallel_tool_calls,
            tool_format,
            response_format,
            response_format_param: "response_format",
            logprobs,
            cap_max_tokens: false,
        })
    }

    /// What the answer is constrained to, if anything: the forced tool calls; the JSON format;
    /// with tools offered freely, text or well-formed calls (or the JSON, when a format is asked).
    pub fn grammar(&self) -> Option<Grammar> {
        // A named function is one call to it, as OpenAI's API makes it.
        let calls = |only: Option<&str>| self.tool_format.calls_grammar(&self.tools, only, self.parallel_tool_calls && only.is_none());
        let json = self.response_format.as_ref().map(|schema| format!("json_answer: {}", crate::engine::grammar::lark_json(schema)));
        match (&self.tool_choice, json) {
            (ToolChoice::Required, _) if !self.tools.is_empty() => Some(Grammar::Answer(format!("answer: calls\n{}", calls(None)))),
            (ToolChoice::Function(name), _) if !self.tools.is_empty() => Some(Grammar::Answer(format!("answer: calls\n{}", calls(Some(name))))),
            (_, Some(json)) if !self.tools.is_empty() => Some(Grammar::Answer(format!("answer: calls | json_answer\n{json}\n{}", calls(None)))),
            (_, Some(json)) => Some(Grammar::Answer(format!("answer: json_answer\n{json}"))),
            // Free to answer or call: text, but whatever opens a call is a well-formed one.
            (_, None) if !self.tools.is_empty() => Some(Grammar::Answer(self.tool_format.auto_grammar(&self.tools, self.parallel_tool_calls))),
            _ => None,
        }
    }
}

/// `response_format` as the schema the answer must follow; unknown types are refused.
fn response_format(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let obj = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong("response_format", "an object such as {\"type\": \"json_object\"}")),
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let spec = obj.get("json_schema").and_then(Value::as_object).ok_or_else(|| wrong("response_format.json_schema", "an object with `name` and `schema`"))?;
            match spec.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(schema.clone())),
                // OpenAI makes `schema` optional: then any JSON object.
                None | Some(Value::Null) => Ok(Some(json!({"type": "object"}))),
                Some(_) => Err(wrong("response_format.json_schema.schema", "a JSON Schema object")),
            }
        }
        _ => Err(wrong("response_format.type", "\"text\", \"json_object\" or \"json_schema\"")),
    }
}

fn parse_messages(value: Option<&Value>) -> Result<Vec<Message>, ApiError> {
    let items = value.and_then(Value::as_array).ok_or_else(|| wrong("messages", "a non-empty list of messages"))?;
    if items.is_empty() {
        return Err(wrong("messages", "a non-empty list of messages"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let obj = m.as_object().ok_or_else(|| wrong(&param, "an object"))?;
            let role = match obj.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
                _ => return Err(wrong(&format!("{param}.role"), "one of system, developer, user, assistant, tool")),
            };
            let content = match obj.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => Ok(t.to_string()),
                        _ => Err(wrong(&format!("{param}.content"), "a string or a list of text parts")),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(""),
                Some(_) => return Err(wrong(&format!("{param}.content"), "a string or a list of text parts")),
            };
            let mut message = Message::new(role, &content);
            if role == "assistant" {
                message.tool_calls = parse_tool_calls(obj.get("tool_calls"), &param)?;
            }
            if role == "tool" {
                match obj.get("tool_call_id") {
                    None | Some(Value::Null) => {}
                    Some(Value::String(id)) => message.tool_call_id = Some(id.clone()),
                    Some(_) => return Err(wrong(&format!("{param}.tool_call_id"), "a string")),
                }
            }
            Ok(message)
        })
        .collect()
}

/// An assistant message's earlier calls, with each `arguments` string turned back into the object
/// it holds (chat templates expect objects).
fn parse_tool_calls(value: Option<&Value>, param: &str) -> Result<Option<Vec<Value>>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong(&format!("{param}.tool_calls"), "a list of tool calls")),
    };
    items
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let p = format!("{param}.tool_calls[{j}]");
            let function = call.get("function").ok_or_else(|| wrong(&format!("{p}.function"), "an object with name and arguments"))?;
            let name = function.get("name").and_then(Value::as_str).ok_or_else(|| wrong(&format!("{p}.function.name"), "a string"))?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                    .ok()
                    .filter(Value::is_object)
                    .ok_or_else(|| wrong(&format!("{p}.function.arguments"), "a JSON object encoded as a string"))?,
                Some(v @ Value::Object(_)) => v.clone(),
                Some(_) => return Err(wrong(&format!("{p}.function.arguments"), "a JSON object encoded as a string")),
            };
            Ok(json!({"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": arguments}}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A chat request made ready for the worker: the rendered prompt and its tokens, with the answer
/// length checked against the context.
pub struct PreparedChat {
    pub request: ChatRequest,
    pub prompt_text: String,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// What the answer is held to (response_format, a forced tool call).
    pub constraint: Option<Constraint>,
}

/// What a request is checked against: the served model's tokenizer and shape.
pub struct Served<'a> {
    pub model_id: &'a str,
    pub tokenizer: &'a TextTokenizer,
    pub max_context: usize,
    pub vocab_size: usize,
    pub eos: &'a [u32],
    pub default_max_tokens: usize,
    /// How the model writes tool calls.
    pub tool_format: ToolFormat,
    /// Sampling defaults the model ships (`generation_config.json`) for what a request leaves out.
    pub generation: &'a GenerationDefaults,
}

/// Parses `body`, renders and tokenizes the prompt, checks that it and `max_tokens` fit in the
/// context, and compiles the answer's grammar (CPU work: the server runs it off the async threads).
pub fn prepare_chat(body: &[u8], served: &Served) -> Result<PreparedChat, ApiError> {
    prepare(ChatRequest::parse(body, served.model_id, served.tool_format)?, served)
}

/// [`prepare_chat`] for a request already read (the Anthropic endpoint makes one from its own format).
pub fn prepare(mut request: ChatRequest, served: &Served) -> Result<PreparedChat, ApiError> {
    request.sampling = served.generation.fill(std::mem::take(&mut request.sampling), &request.sampling_set);
    let tokenizer = served.tokenizer;
    let prompt_text = tokenizer
        .apply_chat_template_with_tools(&request.messages, &request.tools, request.tool_format, request.enable_thinking)
        .map_err(|e| ApiError::bad_request("messages", &e.to_string()))?;
    let max_context = served.max_context;
    fits_before_tokenizing(tokenizer, &prompt_text, max_context, "messages")?;
    let prompt = tokenizer.encode(&prompt_text).map_err(|e| ApiError::bad_request("messages", &e.to_string()))?;
    let room = max_context.saturating_sub(prompt.len());
    let max_tokens = match request.max_tokens {
        Some(n) if request.cap_max_tokens => n.min(room.max(1)),
        Some(n) => n,
        None => served.default_max_tokens.min(room).max(1),
    };
    // Checked: max_tokens comes from the request and may be up to 2^64 - 1.
    if prompt.len().checked_add(max_tokens).is_none_or(|total| total > max_context) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "context_length_exceeded",
            Some("messages"),
            &format!(
                "this model's context is {max_context} tokens; the messages take {} and max_tokens asks for {max_tokens} more",
                prompt.len()
            ),
        ));
    }
    let constraint = match request.grammar() {
        None => None,
        Some(grammar) => {
            // Every schema goes into one grammar: their properties count together.
            let tool_schemas = request.tools.iter().filter_map(|t| t.get("function")?.get("parameters"));
            crate::engine::grammar::check_schema_size(request.response_format.iter().chain(tool_schemas))
                .map_err(|e| {
                    let param = if request.tools.is_empty() { request.response_format_param } else { "tools" };
                    ApiError::bad_request(param, &format!("`{param}`: {e}"))
                })?;
            let compiler = tokenizer
                .grammar_compiler(served.vocab_size, served.eos)
                .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "grammar_unavailable", None, &e.to_string()))?;
            let reasoning = Reasoning::after_prompt(&prompt_text, tokenizer.can_think() && request.enable_thinking);
            let compiled = compiler.compile(&grammar, reasoning);
            // Under `auto` the grammar holds every schema, so when it compiles they all do; else
            // (it failed, or a forced call leaves the other schemas out) each is compiled alone,
            // so a bad one is named with the engine's reason.
            if compiled.is_err() || request.tool_choice != ToolChoice::Auto {
                let schemas = request.response_format.iter().map(|s| (request.response_format_param.to_string(), s)).chain(request.tools.iter().enumerate().filter_map(|(i, t)| {
                    Some((format!("tools[{i}].function.parameters"), t.get("function")?.get("parameters")?))
                }));
                for (param, schema) in schemas {
                    if let Err(e) = compiler.compile(&Grammar::JsonSchema(schema.clone()), Reasoning::Off) {
                        return Err(ApiError::bad_request(&param, &format!("`{param}` cannot be enforced: {e}")));
                    }
                }
            }
            Some(compiled.map_err(|e| ApiError::bad_request("tools", &format!("the answer's grammar cannot be built: {e}")))?)
        }
    };
    let stop = request.stop.clone();
    Ok(PreparedChat { request, prompt_text, prompt, max_tokens, stop, constraint })
}

/// Refuses `text` when even its fewest possible tokens ([`TextTokenizer::fewest_tokens`]) are
/// more than the context, before the memory and time of tokenizing it are spent.
pub fn fits_before_tokenizing(tokenizer: &TextTokenizer, text: &str, max_context: usize, param: &str) -> Result<(), ApiError> {
    let fewest = tokenizer.fewest_tokens(text, max_context).map_err(|e| ApiError::bad_request(param, &e.to_string()))?;
    if fewest <= max_context {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "context_length_exceeded",
        Some(param),
        &format!("this model's context is {max_context} tokens; the {} bytes of `{param}` take at least {fewest}", text.len()),
    ))
}

/// OpenAI's usage object; `cached` prompt tokens came from the prefix cache.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

pub fn completion_id() -> String {
    response_id("chatcmpl")
}

/// A unique id for a response: `prefix`, the time, a counter.
pub fn response_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}-{}", now(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A token as the APIs show it: its text, or `bytes:\xNN…` when its bytes are not whole UTF-8
/// (a piece of a character), as OpenAI writes them.
pub fn token_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_string(),
        Err(_) => "bytes:".to_string() + &bytes.iter().map(|b| format!("\\x{b:02x}")).collect::<String>(),
    }
}

/// Chat `logprobs.content` entries: each token with its log-probability, bytes and alternatives.
pub fn chat_logprobs(tokenizer: &TextTokenizer, tokens: &[TokenLogprobs]) -> Value {
    let entry = |id: u32, logprob: f32| {
        let bytes = tokenizer.token_bytes(id);
        json!({"token": token_text(&bytes), "logprob": logprob_value(logprob), "bytes": bytes})
    };
    Value::Array(
        tokens
            .iter()
            .map(|t| {
                let mut e = entry(t.token, t.logprob);
                e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                e
            })
            .collect(),
    )
}

/// A log-probability as JSON: −∞ (a token the model rules out) has no JSON number, so it is the
/// most negative finite f32, as other servers write it.
pub fn logprob_value(logprob: f32) -> Value {
    json!(if logprob.is_finite() { logprob } else { f32::MIN })
}

pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
