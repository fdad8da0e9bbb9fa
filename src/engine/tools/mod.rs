//! Function calling in each model family's own syntax ([`ToolFormat`]): how the offered tools are
//! described to a model whose chat template does not render them, how its earlier calls are
//! written back into the conversation, how calls are found in its answer as it streams
//! ([`ToolCallSplitter`]), and the grammar that makes it call (`tool_choice: "required"`).

mod hermes;
mod llama_json;
mod minicpm_xml;
mod mistral;

use super::error::{Error, Result};
use super::tokenizer::{partial_tag_len, Message};
use serde_json::{json, Value};

/// A call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (what OpenAI's API carries).
    pub arguments: String,
}

/// The families' call syntaxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen2/Qwen3, Hermes, ChatML models).
    Hermes,
    /// `<function name="f"><param name="k">v</param></function>` (MiniCPM-SALA, MiniCPM4.x;
    /// SGLang's `minicpm4_xml`).
    MiniCpmXml,
    /// `{"name": …, "parameters": {…}}`, several joined by `; `, optionally after `<|python_tag|>`
    /// (Llama 3.1 and later).
    Llama3Json,
    /// `[TOOL_CALLS] [{"name": …, "arguments": {…}}]`, or `[TOOL_CALLS]name[ARGS]{…}` per call
    /// (Mistral, by tokenizer version).
    Mistral,
}

impl ToolFormat {
    /// Every format by its name (SGLang's parser names where it has one).
    pub const ALL: [(&'static str, ToolFormat); 4] =
        [("hermes", ToolFormat::Hermes), ("minicpm4_xml", ToolFormat::MiniCpmXml), ("llama3_json", ToolFormat::Llama3Json), ("mistral", ToolFormat::Mistral)];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, f)| *f == self).map(|(n, _)| *n).expect("every format is named")
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
            Error::Usage(format!("unknown tool-call format `{name}`; choose one of {}", names.join(", ")))
        })
    }

    /// The syntax a chat template writes calls in, if it shows one.
    pub fn from_template(chat_template: &str) -> Option<Self> {
        if chat_template.contains("<function name=") || chat_template.contains("<param name=") {
            Some(ToolFormat::MiniCpmXml)
        } else if chat_template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if chat_template.contains("<|python_tag|>") {
            Some(ToolFormat::Llama3Json)
        } else if chat_template.contains("<tool_call>") {
            Some(ToolFormat::Hermes)
        } else {
            None
        }
    }

    fn syntax(self) -> &'static dyn CallSyntax {
        match self {
            ToolFormat::Hermes => &hermes::Hermes,
            ToolFormat::MiniCpmXml => &minicpm_xml::MiniCpmXml,
            ToolFormat::Llama3Json => &llama_json::Llama3Json,
            ToolFormat::Mistral => &mistral::Mistral,
        }
    }

    /// Lark rules for `calls`: a call (several with `parallel`) to one of `tools` (only `only`,
    /// when named), its arguments valid under the function's parameter schema.
    pub fn calls_grammar(self, tools: &[Value], only: Option<&str>, parallel: bool) -> String {
        let offered = Tools::new(tools);
        let chosen: Vec<&Function> = offered.0.iter().filter(|f| only.is_none_or(|o| o == f.name)).collect();
        self.syntax().grammar(&chosen, parallel)
    }

    /// Lark rules for `answer` when the model may call or answer in text (`tool_choice: "auto"`):
    /// text in which no call opens, or calls (after such text where the syntax allows); so
    /// whatever opens a call is a well-formed call.
    pub fn auto_grammar(self, tools: &[Value], parallel: bool) -> String {
        let syntax = self.syntax();
        let escape = |text: &str| regex::escape(text).replace('/', "\\/");
        let anywhere: Vec<String> = syntax.openers().iter().filter(|o| !o.at_start_only).map(|o| escape(o.text)).collect();
        let at_start: Vec<String> = syntax.openers().iter().filter(|o| o.at_start_only).map(|o| escape(o.text)).collect();
        let mut text = "/(.|\\n)+/".to_string();
        if !anywhere.is_empty() {
            text.push_str(&format!(" & ~/(.|\\n)*({})(.|\\n)*/", anywhere.join("|")));
        }
        if !at_start.is_empty() {
            text.push_str(&format!(" & ~/[ \\t\\r\\n]*({})(.|\\n)*/", at_start.join("|")));
        }
        let calls = self.calls_grammar(tools, None, parallel);
        match syntax.grammar_opener() {
            // Text up to the first opener is one lazy lexeme (a greedy one would run past it).
            Some(opener) => format!("answer: FREE_TEXT? | lead calls_opened\nlead[lazy]: /(.|\\n)*{}/\nFREE_TEXT: {text}\n{calls}", escape(opener)),
            None => format!("answer: FREE_TEXT? | calls\nFREE_TEXT: {text}\n{calls}"),
        }
    }

    /// `messages` rewritten for a template that knows nothing of tools: the tools block joins the
    /// system prompt, an assistant's earlier calls become call text, and tool results become a
    /// user turn of `<tool_response>` blocks (consecutive results share one turn).
    pub fn plain_template_messages(self, messages: &[Message], tools: &[Value]) -> Vec<Message> {
        let syntax = self.syntax();
        let mut out: Vec<Message> = Vec::new();
        if !tools.is_empty() {
            let block = syntax.tools_prompt(tools);
            match messages.first().filter(|m| m.role == "system") {
                Some(system) => out.push(Message::new("system", &format!("{}\n\n{block}", system.content))),
                None => out.push(Message::new("system", &block)),
            }
        }
        let rest = if tools.is_empty() || messages.first().is_none_or(|m| m.role != "system") { messages } else { &messages[1..] };
        for m in rest {
            match m.role.as_str() {
                "assistant" if m.tool_calls.is_some() => {
                    let calls: Vec<String> = m
                        .tool_calls
                        .iter()
                        .flatten()
                        .map(|call| {
                            let function = call.get("function").unwrap_or(call);
                            // An arguments string is shown as the object it holds.
                            let arguments = match function.get("arguments") {
                                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                                Some(v) => v.clone(),
                                None => json!({}),
                            };
                            syntax.render_call(function.get("name").and_then(Value::as_str).unwrap_or_default(), &arguments)
                        })
                        .collect();
                    let mut text = m.content.clone();
                    if !calls.is_empty() {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&syntax.join_calls(&calls));
                    }
                    out.push(Message::new("assistant", &text));
                }
                "tool" => {
                    let block = format!("<tool_response>\n{}\n</tool_response>", m.content);
                    match out.last_mut() {
                        Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                            last.content.push('\n');
                            last.content.push_str(&block);
                        }
                        _ => out.push(Message::new("user", &block)),
                    }
                }
                _ => out.push(Message::new(&m.role, &m.content)),
            }
        }
        out
    }
}

/// An offered function: its name and parameter schema.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub parameters: Value,
}

impl Function {
    /// The schema of parameter `key`, if the function declares it.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.parameters.get("properties")?.get(key)
    }

    /// The declared parameter names, in order.
    pub fn property_names(&self) -> Vec<&str> {
        self.parameters.get("properties").and_then(Value::as_object).map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default()
    }

    pub fn required(&self) -> Vec<&str> {
        self.parameters.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
    }
}

/// The offered functions (OpenAI tool objects, or bare function objects).
#[derive(Debug, Clone, Default)]
pub struct Tools(pub Vec<Function>);

impl Tools {
    pub fn new(tools: &[Value]) -> Self {
        Self(
            tools
                .iter()
                .filter_map(|t| {
                    let f = t.get("function").unwrap_or(t);
                    Some(Function {
                        name: f.get("name")?.as_str()?.to_string(),
                        parameters: f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                    })
                })
                .collect(),
        )
    }

    pub fn get(&self, name: &str) -> Option<&Function> {
        self.0.iter().find(|f| f.name == name)
    }
}

/// What reading a call at the start of some text found.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// The first `len` bytes are done: the calls they hold, or `None` when they do not parse or
    /// name a function that was not offered (they stay in the answer's text).
    Done { len: usize, calls: Option<Vec<ToolCall>> },
    /// The call is not complete yet.
    Incomplete,
}

/// Text that opens a call.
pub struct Opener {
    pub text: &'static str,
    /// Only at the start of the answer (a bare JSON object opens a call only there).
    pub at_start_only: bool,
}

/// One family's call syntax.
trait CallSyntax: Sync {
    /// What opens a call.
    fn openers(&self) -> &'static [Opener];
    /// Reads the call(s) at the start of `text`, which begins with an opener; `ended`: no more
    /// text will come.
    fn read(&self, text: &str, tools: &Tools, ended: bool) -> Read;
    /// The separator at the start of `text` (between two calls), in bytes; dropped.
    fn separator(&self, text: &str) -> usize {
        text.len() - text.trim_start().len()
    }
    /// The system-prompt block describing `tools`, for templates that do not render them.
    fn tools_prompt(&self, tools: &[Value]) -> String;
    /// An earlier call as the model writes it.
    fn render_call(&self, name: &str, arguments: &Value) -> String;
    /// Several rendered calls as one answer.
    fn join_calls(&self, calls: &[String]) -> String {
        calls.join("\n")
    }
    /// Lark rules defining `calls`, and `calls_opened` (the same after [`Self::grammar_opener`]).
    fn grammar(&self, functions: &[&Function], parallel: bool) -> String;
    /// The text `calls` starts with, when calls may follow text.
    fn grammar_opener(&self) -> Option<&'static str> {
        None
    }
}

/// Splits a streamed answer into text (released as it comes, except a tail that could start a
/// call) and calls, each handed out once it is complete. Calls that do not parse, or name a
/// function that was not offered, stay in the text.
pub struct ToolCallSplitter {
    syntax: &'static dyn CallSyntax,
    tools: Tools,
    pending: String,
    /// After an opener: calls and separators are read until something else comes.
    in_calls: bool,
    /// Nothing but whitespace has come yet.
    at_start: bool,
    /// At the end: the text of a call the answer stopped inside (an opener and what followed it,
    /// or the start of an opener), apart so that a cut answer can leave it out.
    unfinished: String,
}

impl ToolCallSplitter {
    /// `tools`: the offered tools (OpenAI objects).
    pub fn new(format: ToolFormat, tools: &[Value]) -> Self {
        Self { syntax: format.syntax(), tools: Tools::new(tools), pending: String::new(), in_calls: false, at_start: true, unfinished: String::new() }
    }

    /// The text that can be shown now, and the calls this piece completed.
    pub fn push(&mut self, text: &str) -> (String, Vec<ToolCall>) {
        self.pending.push_str(text);
        self.scan(false)
    }

    /// The rest of the text, and the last calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let (mut text, calls, unfinished) = self.finish_cut();
        text.push_str(&unfinished);
        (text, calls)
    }

    /// [`Self::finish`] with the text of a call the answer stopped inside apart, third (it ends
    /// the text when joined): an answer cut by `max_tokens` leaves it out of its content.
    pub fn finish_cut(&mut self) -> (String, Vec<ToolCall>, String) {
        let (text, calls) = self.scan(true);
        (text, calls, std::mem::take(&mut self.unfinished))
    }

    /// Where the first opener in `pending` starts, if one does.
    fn opener_at(&self) -> Option<usize> {
        let lead = self.pending.len() - self.pending.trim_start().len();
        self.syntax
            .openers()
            .iter()
            .filter_map(|o| match o.at_start_only {
                true => (self.at_start && self.pending[lead..].starts_with(o.text)).then_some(lead),
                false => self.pending.find(o.text),
            })
            .min()
    }

    /// Bytes at the end of `pending` that could still become an opener.
    fn partial_opener(&self) -> usize {
        let trimmed = self.pending.trim_start();
        self.syntax
            .openers()
            .iter()
            .map(|o| match o.at_start_only {
                true if self.at_start && o.text.starts_with(trimmed) => trimmed.len(),
                true => 0,
                false => partial_tag_len(&self.pending, o.text),
            })
            .max()
            .unwrap_or(0)
    }

    fn scan(&mut self, ended: bool) -> (String, Vec<ToolCall>) {
        let (mut text, mut calls) = (String::new(), Vec::new());
        loop {
            if self.in_calls {
                let sep = self.syntax.separator(&self.pending);
                let rest = &self.pending[sep..];
                // Among calls, every opener counts (a bare object after `; ` too).
                let opens = self.syntax.openers().iter().any(|o| rest.starts_with(o.text));
                if opens {
                    let read = self.syntax.read(rest, &self.tools, ended);
                    // At the end, a call that more text could still have completed was cut.
                    if ended && !matches!(read, Read::Done { calls: Some(_), .. }) && self.syntax.read(rest, &self.tools, false) == Read::Incomplete {
                        self.unfinished = rest.to_string();
                        self.pending.clear();
                        break;
                    }
                    match read {
                        Read::Incomplete if !ended => break,
                        Read::Incomplete => {
                            text.push_str(rest);
                            self.pending.clear();
                            break;
                        }
                        Read::Done { len, calls: found } => {
                            match found {
                                Some(found) => calls.extend(found),
                                None => text.push_str(&rest[..len]),
                            }
                            self.at_start = false;
                            self.pending.drain(..sep + len);
                        }
                    }
                    continue;
                }
                let could_open = self.syntax.openers().iter().any(|o| o.text.starts_with(rest));
                if !ended && (rest.is_empty() || could_open) {
                    break;
                }
                // Something other than a call: back to text, which keeps the whitespace before
                // it (separators end with the answer, though).
                self.in_calls = false;
                if rest.is_empty() {
                    self.pending.clear();
                    break;
                }
                let whitespace = (self.pending.len() - self.pending.trim_start().len()).min(sep);
                self.pending.replace_range(whitespace..sep, "");
                continue;
            }
            if let Some(at) = self.opener_at() {
                // The whitespace that separates the text from the calls is not part of either.
                text.push_str(self.pending[..at].trim_end());
                self.pending.drain(..at);
                self.in_calls = true;
                continue;
            }
            if ended {
                // A tail that could open a call (with the whitespace before it) may be one cut short.
                let keep = self.partial_opener();
                let release = self.pending[..self.pending.len() - keep].trim_end().len();
                let release = if keep == 0 { self.pending.len() } else { release };
                self.unfinished = self.pending.split_off(release);
                text.push_str(&std::mem::take(&mut self.pending));
                break;
            }
            let keep = self.partial_opener();
            // Trailing whitespace waits too: it may turn out to precede a call.
            let release = self.pending[..self.pending.len() - keep].trim_end().len();
            if release > 0 {
                self.at_start = false;
            }
            text.extend(self.pending.drain(..release));
            break;
        }
        (text, calls)
    }
}

/// A call from a JSON object with `name` and `arguments` (or `parameters`: an object, or a
/// string holding one), naming an offered function.
pub fn call_from_json(value: &Value, tools: &Tools) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?;
    tools.get(name)?;
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?;
            s.clone()
        }
        Some(v @ Value::Object(_)) => v.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name: name.to_string(), arguments })
}

/// A call as the JSON-object syntaxes write it: `{"name": "f", "<arguments>": {…}}`, name first.
fn json_call_text(name: &str, arguments_key: &str, arguments: &Value) -> String {
    format!("{{\"name\": {}, \"{arguments_key}\": {arguments}}}", Value::String(name.to_string()))
}

/// Lark rules `call_0`, `call_1`, … for those syntaxes, one per function (the object with its
/// name and arguments valid under its schema), and the alternatives naming them.
fn json_call_rules(functions: &[&Function], arguments_key: &str) -> (String, String) {
    let mut rules = String::new();
    let mut names = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let call = json!({
            "type": "object",
            "properties": {"name": {"const": f.name}, arguments_key: f.parameters},
            "required": ["name", arguments_key],
            "additionalProperties": false,
        });
        rules.push_str(&format!("call_{i}: {}\n", super::grammar::lark_json(&call)));
        names.push(format!("call_{i}"));
    }
    (rules, names.join(" | "))
}

/// The first JSON value in `text`: `Ok((value, bytes))`, `Err(true)` when `text` ends inside
/// it, `Err(false)` when it is not JSON.
pub fn leading_json(text: &str) -> std::result::Result<(Value, usize), bool> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match values.next() {
        Some(Ok(v)) => Ok((v, values.byte_offset())),
        Some(Err(e)) => Err(e.is_eof()),
        None => Err(true),
    }
}

/// The system-prompt preamble every format's tools block starts with: the tools as JSON, one a
/// line, inside `<tools></tools>` (Qwen's and MiniCPM-SALA's templates both write this).
pub fn tools_block(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str("\n</tools>");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` through a splitter: (all text shown, all calls).
    pub(super) fn split(format: ToolFormat, tools: &[Value], pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let mut s = ToolCallSplitter::new(format, tools);
        let (mut shown, mut calls) = (String::new(), Vec::new());
        for p in pieces {
            let (t, c) = s.push(p);
            shown.push_str(&t);
            calls.extend(c);
        }
        let (t, c) = s.finish();
        shown.push_str(&t);
        calls.extend(c);
        (shown, calls)
    }

    /// `text` cut at every char boundary into two pieces, and char by char: the same result each way.
    pub(super) fn split_anywhere(format: ToolFormat, tools: &[Value], text: &str) -> (String, Vec<ToolCall>) {
        let whole = split(format, tools, &[text]);
        for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
            assert_eq!(split(format, tools, &[&text[..cut], &text[cut..]]), whole, "cut at {cut}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(format, tools, &pieces), whole, "char by char");
        whole
    }

    pub(super) fn weather_tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}}}),
            json!({"type": "function", "function": {"name": "sum_values", "parameters": {"type": "object",
                "properties": {"nums": {"type": "array", "items": {"type": "number"}}, "exact": {"type": "boolean"}}, "required": ["nums"]}}}),
            json!({"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {"note": {"type": "string"}}, "required": []}}}),
        ]
    }

    /// A byte-level vocabulary of every printable ASCII character, as tokenizer.json.
    pub(super) fn toy_tokenizer() -> Value {
        let mut vocab = serde_json::Map::new();
        let pieces = (0x21u8..0x7f).map(|b| (b as char).to_string()).chain(["Ġ", "Ċ", "<function", "<param", "</param>"].map(String::from));
        for (i, p) in pieces.enumerate() {
            vocab.insert(p, json!(i));
        }
        let n = vocab.len();
        json!({
            "added_tokens": [{"id": n, "content": "<eos>", "special": true}],
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        })
    }

    /// A constraint for calls in `format` to `tools` (only `only`, when named), and its tokenizer.
    pub(super) fn constraint(format: ToolFormat, tools: &[Value], only: Option<&str>, parallel: bool) -> (crate::engine::grammar::Constraint, Value) {
        use crate::engine::grammar::{Grammar, GrammarCompiler, Reasoning};
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let rules = format.calls_grammar(tools, only, parallel);
        (compiler.compile(&Grammar::Lark(format!("start: calls\n{rules}")), Reasoning::Off).unwrap(), tok)
    }

    /// The JSON syntaxes hold the arguments to the function's schema, strictly: the issue's
    /// weather call, and the same with a key too many, a day out of bounds, a unit not listed.
    #[test]
    fn every_json_syntax_enforces_the_parameter_schema() {
        let tools = [json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 8}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "unit", "days"]}}})];
        let good = json!({"city": "Oslo", "unit": "celsius", "days": 3});
        for format in [ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::Mistral] {
            let syntax = format.syntax();
            let wrap = |arguments: &Value| {
                // The JSON layout the grammar writes (`render_call` writes compact JSON).
                let text = syntax.render_call("get_weather", arguments).replace("\":\"", "\": \"").replace(",\"", ", \"").replace("\":3", "\": 3").replace("\":9", "\": 9");
                if format == ToolFormat::Mistral { syntax.join_calls(&[text]) } else { text }
            };
            let text = wrap(&good);
            assert_eq!(split(format, &tools, &[&text]).1.len(), 1, "{text}");
            let (mut c, tok) = constraint(format, &tools, None, false);
            crate::engine::grammar::tests::feed(&mut c, &tok, &text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(c.is_complete(), "{text}");
            for bad in [
                json!({"city": "Oslo", "unit": "celsius", "days": 3, "required": "city"}),
                json!({"city": "Oslo", "unit": "celsius", "days": 9}),
                json!({"city": "Oslo", "unit": "kelvin", "days": 3}),
                json!({"city": "Reykjavik", "unit": "celsius", "days": 3}),
            ] {
                let text = wrap(&bad);
                let (mut c, tok) = constraint(format, &tools, None, false);
                assert!(crate::engine::grammar::tests::feed(&mut c, &tok, &text).is_err(), "{text}");
            }
        }
    }

    #[test]
    fn formats_are_chosen_from_the_template_then_the_family() {
        assert_eq!(ToolFormat::from_template("{{ messages }}"), None);
        assert_eq!(ToolFormat::from_template("<tool_call>"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::from_template("{{ '<|python_tag|>' }}"), Some(ToolFormat::Llama3Json));
        assert_eq!(ToolFormat::from_template("<|im_start|>"), None);
        assert_eq!(ToolFormat::from_template("{{ '[TOOL_CALLS]' }}"), Some(ToolFormat::Mistral));
        assert_eq!(ToolFormat::from_template("x <function name=\"f\"> y"), Some(ToolFormat::MiniCpmXml));
        assert_eq!(ToolFormat::from_name("minicpm4_xml").unwrap(), ToolFormat::MiniCpmXml);
        let Err(Error::Usage(message)) = ToolFormat::from_name("xml") else { panic!("accepted") };
        assert!(message.contains("hermes, minicpm4_xml, llama3_json, mistral"), "{message}");
    }

    #[test]
    fn plain_templates_get_tools_calls_and_results_as_text() {
        let tools = vec![json!({"type": "function", "function": {"name": "add"}})];
        let mut call = Message::new("assistant", "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}})]);
        let messages = vec![Message::new("system", "Be brief."), Message::new("user", "1+?"), call, Message::new("tool", "2"), Message::new("tool", "3")];
        let out = ToolFormat::Hermes.plain_template_messages(&messages, &tools);
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.starts_with("Be brief.\n\n# Tools") && out[0].content.contains(r#""name":"add""#));
        assert_eq!(out[2].content, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1}}\n</tool_call>");
        assert_eq!(out[3].content, "<tool_response>\n2\n</tool_response>\n<tool_response>\n3\n</tool_response>");
    }

    #[test]
    fn a_call_cut_at_the_end_comes_apart_from_the_text() {
        let tools = weather_tools();
        let first = ToolCall { name: "get_weather".into(), arguments: json!({"city": "Paris"}).to_string() };
        let second = ToolCall { name: "sum_values".into(), arguments: json!({"nums": [1, 2]}).to_string() };
        for (name, format) in ToolFormat::ALL {
            let syntax = format.syntax();
            let calls: Vec<String> = [&first, &second].iter().map(|c| syntax.render_call(&c.name, &serde_json::from_str(&c.arguments).unwrap())).collect();
            let text = syntax.join_calls(&calls);
            // Where the second call's own text starts (Mistral's list holds both: none).
            let second_at = (format != ToolFormat::Mistral).then(|| text.rfind(calls[1].as_str()).unwrap());
            for cut in (0..=text.len()).filter(|&c| text.is_char_boundary(c)) {
                let mut s = ToolCallSplitter::new(format, &tools);
                let (mut shown, mut found) = (String::new(), Vec::new());
                for ch in text[..cut].chars() {
                    let (t, c) = s.push(&ch.to_string());
                    shown.push_str(&t);
                    found.extend(c);
                }
                let (t, c, unfinished) = s.finish_cut();
                shown.push_str(&t);
                found.extend(c);
                assert_eq!(shown, "", "{name}, cut at {cut}: {:?}", &text[..cut]);
                assert!(found.len() <= 2 && found[..] == [first.clone(), second.clone()][..found.len()], "{name}, cut at {cut}: {found:?}");
                // Every call begun is a call found, or the cut left one unfinished.
                let begun = match second_at {
                    Some(at) => usize::from(cut > 0) + usize::from(cut > at),
                    None => 2 * usize::from(cut > 0),
                };
                assert_eq!(unfinished.is_empty(), found.len() == begun, "{name}, cut at {cut}: {unfinished:?}");
            }
            let mut s = ToolCallSplitter::new(format, &tools);
            s.push(&text[..text.len() - 3]);
            let (joined, _) = s.finish();
            assert_eq!(joined, text[second_at.unwrap_or(0)..text.len() - 3], "{name}: finish() keeps the cut call as text");
        }
    }
}
