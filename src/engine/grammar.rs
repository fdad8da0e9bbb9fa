//! Constrained decoding: what the output must look like (a JSON Schema, any JSON object, a Lark
//! grammar) compiled by llguidance against the tokenizer's vocabulary. A [`Constraint`] follows
//! one answer token by token and gives, before each step, the tokens that keep the output valid;
//! the sampler draws only among those, so the answer parses whatever the model prefers.

use super::contain::contain;
use super::error::{Error, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// Most object properties the schemas of one answer may declare together (OpenAI's limit for
/// structured outputs): llguidance compiles an object's optional properties in time quadratic in
/// their number.
pub const MAX_SCHEMA_PROPERTIES: usize = 5000;
/// Longest a grammar may take to compile; past it the answer is refused (the compile finishes in
/// the background, bounded by llguidance's own limits).
pub const COMPILE_TIME_LIMIT: Duration = Duration::from_secs(10);
/// Stack of the thread that compiles: llguidance recurses once per property of an object, past
/// the 2 MiB of a runtime's worker thread (only the pages touched are ever committed).
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Refuses schemas that together declare more than [`MAX_SCHEMA_PROPERTIES`] object properties,
/// counted without recursion (a schema is as deep as its sender makes it).
pub fn check_schema_size<'a>(schemas: impl IntoIterator<Item = &'a Value>) -> Result<()> {
    let mut pending: Vec<&Value> = schemas.into_iter().collect();
    let mut properties = 0usize;
    while let Some(value) = pending.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(declared)) = map.get("properties") {
                    properties += declared.len();
                }
                pending.extend(map.values());
            }
            Value::Array(items) => pending.extend(items),
            _ => {}
        }
    }
    if properties > MAX_SCHEMA_PROPERTIES {
        return Err(Error::Grammar(format!(
            "the schemas declare {properties} object properties, over the limit of {MAX_SCHEMA_PROPERTIES} that can be enforced \
             (larger ones take too long to compile); split the request or declare fewer properties"
        )));
    }
    Ok(())
}

/// Runs `work` on a thread with [`COMPILE_STACK_BYTES`] of stack, waiting at most `limit`.
fn on_compile_thread<T: Send + 'static>(limit: Duration, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("grammar-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| Error::Grammar(format!("no thread to compile the grammar on: {e}")))?;
    match rx.recv_timeout(limit) {
        Ok(compiled) => compiled,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::Grammar(format!(
            "compiling it took longer than {} s, the limit; make the schema or grammar smaller",
            limit.as_secs_f32()
        ))),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Grammar("the grammar compiler stopped without an answer".into())),
    }
}

/// What an answer must be.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Grammar {
    /// Any JSON object (OpenAI `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid under this schema.
    JsonSchema(Value),
    /// Lark rules defining the rule `answer` (what follows the model's reasoning, if any).
    Answer(String),
    /// A whole grammar in llguidance's Lark dialect (`%json {…}` embeds a schema), from the
    /// answer's first token.
    Lark(String),
}

/// How JSON is written under a constraint: `json.dumps`'s separators and no free whitespace, so
/// a model cannot pad its answer with blank lines until `max_tokens` runs out.
pub fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` as it is enforced: [`strict`], with [`json_layout`] attached (llguidance reads it
/// from `x-guidance`).
pub fn with_json_layout(schema: &Value) -> Value {
    let mut schema = match schema {
        Value::Object(_) => strict(schema),
        // `true` / `false` schemas have nowhere to carry options.
        Value::Bool(true) => json!({}),
        other => return other.clone(),
    };
    schema["x-guidance"] = json_layout();
    schema
}

/// `schema` read strictly, as llama.cpp's schema converter and xgrammar (vLLM's and SGLang's
/// default) read it for generation: an object schema that declares `properties` (itself, or
/// through `$ref`, `allOf`, `anyOf`, `oneOf`) and leaves `additionalProperties` unset admits
/// only the declared properties. llguidance writes declared properties once each, in order, so
/// no key comes twice. A bare `{"type": "object"}` stays any object, as in llama.cpp.
pub fn strict(schema: &Value) -> Value {
    let mut out = schema.clone();
    // A definition that refers to itself is closed in place: llguidance takes no keys beside a
    // circular `$ref`, so it cannot be closed where it is used.
    let mut references = Vec::new();
    refs_in(schema, &mut references);
    let recursive: Vec<String> = references.into_iter().filter(|r| is_recursive(schema, r)).collect();
    for reference in &recursive {
        if let Some(target) = reference.strip_prefix('#').and_then(|p| out.pointer_mut(p)) {
            strict_in(target, schema, &Names::new(), false, false, &recursive);
        }
    }
    strict_in(&mut out, schema, &Names::new(), false, false, &recursive);
    out
}

/// Every distinct `$ref` string in `schema`.
fn refs_in(schema: &Value, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                if !out.iter().any(|o| o == r) {
                    out.push(r.to_string());
                }
            }
            map.values().for_each(|v| refs_in(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs_in(v, out)),
        _ => {}
    }
}

/// Whether the local `reference` can be reached again from inside its own target.
fn is_recursive(root: &Value, reference: &str) -> bool {
    let (mut pending, mut seen) = (vec![reference.to_string()], Vec::new());
    while let Some(next) = pending.pop() {
        let Some(target) = local_ref(root, &next) else { continue };
        let mut inner = Vec::new();
        refs_in(target, &mut inner);
        for r in inner {
            if r == reference {
                return true;
            }
            if !seen.contains(&r) {
                seen.push(r.clone());
                pending.push(r);
            }
        }
    }
    false
}

/// Property names in the order they are declared (a map: serde_json keeps its keys in order).
type Names = serde_json::Map<String, Value>;

/// Whether an object schema says itself what other properties it admits.
fn says_more(map: &serde_json::Map<String, Value>) -> bool {
    map.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false)) || map.contains_key("unevaluatedProperties")
}

/// Makes `schema` strict in place. `root`: the whole schema, for local `$ref`s; `inherited`:
/// names an enclosing `allOf`/`anyOf`/`oneOf` declares (the object is their intersection, so
/// each part must admit them); `open`: a part of that object admits more, so none is closed;
/// `definition`: a `$defs` entry, made strict where it is used; `recursive`: the `$ref`s whose
/// targets refer to themselves (closed in place, so nothing is added beside them).
fn strict_in(schema: &mut Value, root: &Value, inherited: &Names, open: bool, definition: bool, recursive: &[String]) {
    let Value::Object(map) = schema else { return };
    let circular = map.get("$ref").and_then(Value::as_str).is_some_and(|r| recursive.iter().any(|c| c == r));
    let own: Names = map.get("properties").and_then(Value::as_object).map(|p| p.keys().map(|k| (k.clone(), Value::Null)).collect()).unwrap_or_default();
    let mut base = inherited.clone();
    base.extend(own.clone());
    let mut base_open = open || says_more(map);
    if let Some(target) = map.get("$ref").and_then(Value::as_str).and_then(|r| local_ref(root, r)) {
        base_open |= names(target, root, &mut base, &mut Vec::new());
    }
    for member in map.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        base_open |= names(member, root, &mut base, &mut Vec::new());
    }
    let (mut all, mut any_open) = (base.clone(), base_open);
    for key in ["anyOf", "oneOf"] {
        for member in map.get(key).and_then(Value::as_array).into_iter().flatten() {
            any_open |= names(member, root, &mut all, &mut Vec::new());
        }
    }
    let object = match map.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        _ => true,
    };
    let set = map.contains_key("additionalProperties") || map.contains_key("unevaluatedProperties");
    if !definition && !circular && !set && !any_open && object && (map.contains_key("properties") || !all.is_empty()) {
        map.insert("additionalProperties".into(), Value::Bool(false));
        // Names the object may carry through its parts are declared here too, as anything.
        if let Value::Object(declared) = map.entry("properties").or_insert_with(|| json!({})) {
            for name in all.keys().filter(|n| !own.contains_key(*n)) {
                declared.insert(name.clone(), Value::Bool(true));
            }
        }
    }
    let none = Names::new();
    // `not`, `if`, `then`, `else` stay as they are: strictness there would change their sense.
    for (key, value) in map.iter_mut() {
        let each = |value: &mut Value, f: &mut dyn FnMut(&mut Value)| match value {
            Value::Array(items) => items.iter_mut().for_each(f),
            Value::Object(items) => items.values_mut().for_each(f),
            _ => {}
        };
        match key.as_str() {
            "properties" | "patternProperties" => each(value, &mut |v| strict_in(v, root, &none, false, false, recursive)),
            "$defs" | "definitions" => each(value, &mut |v| strict_in(v, root, &none, false, true, recursive)),
            "additionalProperties" | "items" | "prefixItems" | "additionalItems" | "contains" if value.is_array() => {
                each(value, &mut |v| strict_in(v, root, &none, false, false, recursive))
            }
            "additionalProperties" | "items" | "additionalItems" | "contains" => strict_in(value, root, &none, false, false, recursive),
            "allOf" => each(value, &mut |v| strict_in(v, root, &all, base_open, false, recursive)),
            "anyOf" | "oneOf" => each(value, &mut |v| strict_in(v, root, &base, base_open, false, recursive)),
            _ => {}
        }
    }
}

/// Adds to `out` every property name `schema` may declare: its own, and those of its `$ref`,
/// `allOf`, `anyOf` and `oneOf` (`seen`: the references followed, so a cycle ends). True when
/// one of them admits more than it declares.
fn names(schema: &Value, root: &Value, out: &mut Names, seen: &mut Vec<String>) -> bool {
    let Value::Object(map) = schema else { return false };
    let mut open = says_more(map);
    if let Some(declared) = map.get("properties").and_then(Value::as_object) {
        out.extend(declared.keys().map(|k| (k.clone(), Value::Null)));
    }
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        if !seen.iter().any(|r| r == reference) {
            seen.push(reference.to_string());
            if let Some(target) = local_ref(root, reference) {
                open |= names(target, root, out, seen);
            }
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for member in map.get(key).and_then(Value::as_array).into_iter().flatten() {
            open |= names(member, root, out, seen);
        }
    }
    open
}

/// The subschema a local `$ref` (`#`, `#/$defs/…`) points to.
fn local_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    root.pointer(reference.strip_prefix('#')?)
}

/// What may come before the constrained part: a reasoning model writes `<think>…</think>`
/// first, freely, and the grammar applies from the answer on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reasoning {
    /// The answer starts at the first token.
    Off,
    /// The model may open a think block first.
    May,
    /// The prompt opened a think block: the answer starts after its `</think>`.
    Open,
}

impl Reasoning {
    /// For the answer to `prompt`: open when the prompt opened a think block, else `May` when the
    /// model may think (`may_think`), else off.
    pub fn after_prompt(prompt: &str, may_think: bool) -> Self {
        if prompt.trim_end().ends_with("<think>") {
            Reasoning::Open
        } else if may_think {
            Reasoning::May
        } else {
            Reasoning::Off
        }
    }
}

/// A Lark grammar whose answer is the rule `answer` (defined in `rules`), after the reasoning
/// `reasoning` allows.
pub fn lark_answer(rules: &str, reasoning: Reasoning) -> String {
    let start = match reasoning {
        Reasoning::Off => "start: answer",
        Reasoning::May => "start: (think THINK_GAP?)? answer\nthink[lazy]: /<think>(.|\\n)*<\\/think>/",
        Reasoning::Open => "start: think_rest THINK_GAP? answer\nthink_rest[lazy]: /(.|\\n)*<\\/think>/",
    };
    format!("{start}\nTHINK_GAP: /[ \\t\\r\\n]+/\n{rules}\n")
}

/// A JSON value under `schema`, as a Lark expression.
pub fn lark_json(schema: &Value) -> String {
    format!("%json {}", with_json_layout(schema))
}

impl Grammar {
    fn top_level(&self, reasoning: Reasoning) -> Result<TopLevelGrammar> {
        let json = |schema: &Value| match reasoning {
            Reasoning::Off => TopLevelGrammar::from_json_schema(with_json_layout(schema)),
            _ => TopLevelGrammar::from_lark(lark_answer(&format!("answer: {}", lark_json(schema)), reasoning)),
        };
        Ok(match self {
            Grammar::JsonObject => json(&json!({"type": "object"})),
            Grammar::JsonSchema(schema) => json(schema),
            Grammar::Answer(rules) => TopLevelGrammar::from_lark(lark_answer(rules, reasoning)),
            Grammar::Lark(text) if reasoning == Reasoning::Off => TopLevelGrammar::from_lark(text.clone()),
            Grammar::Lark(_) => return Err(Error::Grammar("a Lark grammar applies from the answer's first token; ask the model not to think".into())),
        })
    }
}

/// Compiles grammars for one tokenizer (built once per model: it indexes the whole vocabulary).
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
}

impl GrammarCompiler {
    /// `tokenizer_json`: the tokenizer's `tokenizer.json`; `vocab_size`: the model's logit rows
    /// (may exceed the tokenizer's tokens); `eos`: every id that ends an answer.
    pub fn new(tokenizer_json: &Value, vocab_size: usize, eos: &[u32]) -> Result<Self> {
        let bad = |e: &dyn std::fmt::Display| Error::Tokenizer(format!("building the vocabulary index for constrained decoding: {e}"));
        let mut words = contain("reading the vocabulary", || llguidance::token_bytes_from_tokenizer_json(tokenizer_json).map_err(|e| bad(&e)))?;
        if words.len() > vocab_size {
            return Err(bad(&format!("the tokenizer has {} tokens but the model only {vocab_size} logits", words.len())));
        }
        // Rows past the tokenizer's tokens are padding: no bytes, never allowed.
        words.resize(vocab_size, Vec::new());
        // An end token past the logits can never be drawn (small test models keep a big config).
        let eos: Vec<u32> = eos.iter().copied().filter(|&id| (id as usize) < vocab_size).collect();
        let first_eos = *eos.first().ok_or_else(|| bad(&"the model has no end-of-sequence token within its vocabulary"))?;
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = contain("indexing the vocabulary", || Ok(TokTrie::from(&info, &words).with_eos_tokens(&eos)))?;
        let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| bad(&e))?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory) })
    }

    /// A fresh constraint for one answer; a grammar the engine cannot compile (bad syntax, an
    /// unsupported or unsatisfiable schema) is an error naming the problem.
    /// Compiles on a thread of its own with a large stack, within [`COMPILE_TIME_LIMIT`]; schemas
    /// over [`MAX_SCHEMA_PROPERTIES`] are refused before.
    pub fn compile(&self, grammar: &Grammar, reasoning: Reasoning) -> Result<Constraint> {
        self.compile_within(grammar, reasoning, COMPILE_TIME_LIMIT)
    }

    fn compile_within(&self, grammar: &Grammar, reasoning: Reasoning, limit: Duration) -> Result<Constraint> {
        if let Grammar::JsonSchema(schema) = grammar {
            check_schema_size([schema])?;
        }
        let top = grammar.top_level(reasoning)?;
        let factory = self.factory.clone();
        let matcher = on_compile_thread(limit, move || {
            let parser = contain("compiling the grammar", || factory.create_parser(top).map_err(|e| Error::Grammar(format!("{e:#}"))))?;
            let matcher = Matcher::new(Ok(parser));
            match matcher.get_error() {
                Some(e) => Err(Error::Grammar(e)),
                None => Ok(matcher),
            }
        })?;
        Ok(Constraint { matcher, eos: self.factory.tok_env().tok_trie().eos_tokens().to_vec(), source: (grammar.clone(), reasoning) })
    }
}

/// One answer under a grammar.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    eos: Vec<u32>,
    /// What it was compiled from, so another process can compile the same (tensor parallelism).
    source: (Grammar, Reasoning),
}

/// The tokens allowed at one step.
#[derive(Debug, Clone)]
pub struct TokenMask(SimpleVob);

impl TokenMask {
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.0.len() && self.0.is_allowed(token)
    }

    /// Sets every disallowed logit to −∞.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.allows(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    pub fn count(&self) -> usize {
        self.0.num_set()
    }

    /// The mask packed 32 tokens a word, token i at bit i % 32 of word i / 32 (what the device
    /// unpacks).
    pub fn words(&self) -> &[u32] {
        self.0.as_slice()
    }
}

impl Constraint {
    /// The grammar and reasoning mode it was compiled from.
    pub fn source(&self) -> &(Grammar, Reasoning) {
        &self.source
    }

    /// The tokens that may come next (the end-of-sequence tokens once the output is complete).
    pub fn mask(&mut self) -> Result<TokenMask> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| Error::Grammar(format!("{e:#}")))?;
        if mask.num_set() == 0 {
            return Err(Error::Grammar("no token can continue the output under its grammar".into()));
        }
        Ok(TokenMask(mask))
    }

    /// Records the token drawn; one the grammar does not allow is an error.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        if self.eos.contains(&token) && self.matcher.is_accepting().unwrap_or(false) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| Error::Grammar(format!("token {token}: {e:#}")))
    }

    /// Whether the output so far is complete under the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte-level vocabulary of single characters plus a few words, as tokenizer.json.
    fn toy_tokenizer() -> Value {
        let mut vocab = serde_json::Map::new();
        let pieces: Vec<String> = " \n{}[]\":,<>/_abcdefghijklmnopqrstuvwxyz0123456789"
            .chars()
            .map(|c| match c {
                ' ' => "Ġ".to_string(),
                '\n' => "Ċ".to_string(),
                c => c.to_string(),
            })
            .collect();
        for (i, p) in pieces.iter().chain(["{\"", "\":", "Ġ\"", "true", "false"].map(String::from).iter()).enumerate() {
            vocab.insert(p.clone(), json!(i));
        }
        let n = vocab.len();
        json!({
            "added_tokens": [{"id": n, "content": "<eos>", "special": true}],
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        })
    }

    fn id_of(tokenizer: &Value, piece: &str) -> u32 {
        tokenizer["model"]["vocab"][piece].as_u64().unwrap() as u32
    }

    /// Greedily feeds `text` (longest known piece first), checking each token against the mask.
    pub(crate) fn feed(c: &mut Constraint, tokenizer: &Value, text: &str) -> std::result::Result<(), String> {
        let vocab = tokenizer["model"]["vocab"].as_object().unwrap();
        let mut rest = text.replace(' ', "Ġ").replace('\n', "Ċ");
        while !rest.is_empty() {
            let piece = vocab.keys().filter(|k| rest.starts_with(k.as_str())).max_by_key(|k| k.len()).ok_or("no piece")?.clone();
            let id = id_of(tokenizer, &piece);
            if !c.mask().map_err(|e| e.to_string())?.allows(id) {
                return Err(format!("`{piece}` refused before {rest:?}"));
            }
            c.commit(id).map_err(|e| e.to_string())?;
            rest = rest[piece.len()..].to_string();
        }
        Ok(())
    }

    /// An object of `n` string properties, all optional.
    fn wide_schema(n: usize) -> Value {
        let properties: serde_json::Map<String, Value> = (0..n).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        json!({"type": "object", "properties": properties, "additionalProperties": false})
    }

    /// 10,000 properties overflowed a 2 MiB stack and aborted the server; now they are refused by
    /// name, and the largest allowed compiles on the caller's small stack.
    #[test]
    fn a_schema_too_wide_is_refused_and_the_widest_allowed_compiles_on_a_small_stack() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 8, &[eos]).unwrap();
        let Err(Error::Grammar(message)) = compiler.compile(&Grammar::JsonSchema(wide_schema(10_000)), Reasoning::Off) else { panic!("compiled") };
        assert!(message.contains("10000 object properties") && message.contains("5000"), "{message}");
        // Spread over nested objects and arrays, the count is the same.
        let nested = json!({"type": "array", "items": [wide_schema(3000), {"anyOf": [wide_schema(2001)]}]});
        let Err(Error::Grammar(message)) = compiler.compile(&Grammar::JsonSchema(nested), Reasoning::Off) else { panic!("compiled") };
        assert!(message.contains("5001 object properties"), "{message}");
        let widest = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || compiler.compile(&Grammar::JsonSchema(wide_schema(MAX_SCHEMA_PROPERTIES)), Reasoning::Off).map(|mut c| c.mask().map(|m| m.count())))
            .unwrap()
            .join()
            .expect("no overflow");
        assert!(matches!(widest, Ok(Ok(n)) if n > 0), "{:?}", widest.map(|r| r.is_ok()));
    }

    #[test]
    fn a_compile_past_its_time_limit_is_refused() {
        let Err(Error::Grammar(message)) = on_compile_thread(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(500));
            Ok(())
        }) else {
            panic!("waited")
        };
        assert!(message.contains("longer than 0.05 s"), "{message}");
        assert_eq!(on_compile_thread(Duration::from_secs(5), || Ok(7)).unwrap(), 7);
    }

    #[test]
    fn a_schema_allows_exactly_its_values() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 8, &[eos]).unwrap();
        let schema = Grammar::JsonSchema(json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}));
        let mut c = compiler.compile(&schema, Reasoning::Off).unwrap();
        assert!(!c.mask().unwrap().allows(eos), "an empty answer is not valid");
        feed(&mut c, &tok, "{\"ok\": true}").unwrap();
        let end = c.mask().unwrap();
        assert!(end.allows(eos) && end.count() == 1, "only the end may follow a complete object");
        assert!(c.is_complete());
        // Another key, a wrong type, free whitespace: each refused where it starts.
        for bad in ["{\"no", "{\"ok\": 1", "{ \"ok\""] {
            let mut c = compiler.compile(&schema, Reasoning::Off).unwrap();
            assert!(feed(&mut c, &tok, bad).is_err(), "{bad}");
        }
        // Padding rows past the tokenizer are never allowed.
        let mut c = compiler.compile(&Grammar::JsonObject, Reasoning::Off).unwrap();
        let first = c.mask().unwrap();
        assert!(first.allows(id_of(&tok, "{")) && !first.allows(eos + 3) && !first.allows(id_of(&tok, "a")));
        let mut logits = vec![1.0; eos as usize + 8];
        first.apply(&mut logits);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), first.count());
    }

    /// Whether `text` is a whole answer under `schema`.
    fn admits(compiler: &GrammarCompiler, tok: &Value, schema: &Value, text: &str) -> bool {
        let mut c = compiler.compile(&Grammar::JsonSchema(schema.clone()), Reasoning::Off).unwrap();
        feed(&mut c, tok, text).is_ok() && c.is_complete()
    }

    /// The weather tool wandered into `"required": "city", "required": …` until
    /// `max_tokens`: without `additionalProperties`, only the declared keys, each once.
    #[test]
    fn schemas_are_strict_unless_they_allow_more() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let weather = json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}},
            "required": ["city", "unit", "days"]});
        assert!(admits(&compiler, &tok, &weather, "{\"city\": \"oslo\", \"unit\": \"c\", \"days\": 3}"));
        for bad in ["{\"city\": \"oslo\", \"unit\": \"c\", \"days\": 3, \"required\": \"city\"}", "{\"city\": \"a\", \"city\": \"b\""] {
            assert!(!admits(&compiler, &tok, &weather, bad), "{bad}");
        }
        let mut open = weather.clone();
        open["additionalProperties"] = json!(true);
        assert!(admits(&compiler, &tok, &open, "{\"city\": \"oslo\", \"unit\": \"c\", \"days\": 3, \"note\": \"x\"}"));
        open["additionalProperties"] = json!({"type": "integer"});
        assert!(admits(&compiler, &tok, &open, "{\"city\": \"oslo\", \"unit\": \"c\", \"days\": 3, \"n\": 4}"));
        assert!(!admits(&compiler, &tok, &open, "{\"city\": \"oslo\", \"unit\": \"c\", \"days\": 3, \"n\": \"x\"}"));
        // Nested objects and items too; a bare object stays any object (`json_object`).
        let nested = json!({"type": "object", "properties": {"at": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "all": {"type": "array", "items": {"properties": {"y": {"type": "integer"}}}}, "free": {"type": "object"}}});
        assert!(admits(&compiler, &tok, &nested, "{\"at\": {\"x\": 1}, \"all\": [{\"y\": 2}], \"free\": {\"any\": true}}"));
        assert!(!admits(&compiler, &tok, &nested, "{\"at\": {\"x\": 1, \"z\": 1}}"));
        assert!(!admits(&compiler, &tok, &nested, "{\"all\": [{\"y\": 2, \"z\": 1}]}"));
        assert!(admits(&compiler, &tok, &json!({"type": "object"}), "{\"a\": 1}"));
    }

    /// A definition that refers to itself compiles (llguidance takes no keys beside a circular
    /// `$ref`) and is strict in place.
    #[test]
    fn a_recursive_definition_compiles_and_is_strict() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"});
        assert!(admits(&compiler, &tok, &tree, "{\"children\": [{\"children\": []}, {}]}"));
        assert!(!admits(&compiler, &tok, &tree, "{\"children\": [{\"x\": 1}]}"));
        assert!(!admits(&compiler, &tok, &tree, "{\"x\": 1}"));
    }

    /// Parts of an object (`allOf`, a `$ref`, `anyOf` branches) each admit what the others
    /// declare, so the whole admits their union and nothing else.
    #[test]
    fn strict_objects_built_of_parts_admit_the_union_of_their_properties() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let schema = json!({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
            "allOf": [{"$ref": "#/$defs/point"}, {"properties": {"z": {"type": "integer"}}}],
            "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]});
        for good in ["{\"x\": 1, \"z\": 2, \"a\": 3}", "{\"x\": 1, \"b\": 3}"] {
            assert!(admits(&compiler, &tok, &schema, good), "{good}");
        }
        for bad in ["{\"x\": 1, \"a\": 3, \"b\": 4}", "{\"x\": 1, \"w\": 2, \"a\": 3}", "{\"x\": 1, \"a\": 3, \"w\": 2}"] {
            assert!(!admits(&compiler, &tok, &schema, bad), "{bad}");
        }
        // A definition used on its own is strict where it is used; one left open stays open.
        let schema = json!({"definitions": {"p": {"properties": {"x": {"type": "integer"}}}, "q": {"properties": {"x": {}}, "additionalProperties": true}},
            "type": "array", "items": [{"$ref": "#/definitions/p"}, {"$ref": "#/definitions/q"}]});
        assert!(admits(&compiler, &tok, &schema, "[{\"x\": 1}, {\"x\": 1, \"y\": 2}]"));
        assert!(!admits(&compiler, &tok, &schema, "[{\"x\": 1, \"y\": 2}, {}]"));
    }

    #[test]
    fn reasoning_comes_first_and_free() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let schema = Grammar::JsonSchema(json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}));
        let mut c = compiler.compile(&schema, Reasoning::Open).unwrap();
        feed(&mut c, &tok, "so, \"ok\": {yes}</think> {\"ok\": true}").unwrap();
        assert!(c.is_complete());
        for answer in ["{\"ok\": false}", "<think>{no}</think>{\"ok\": false}"] {
            let mut c = compiler.compile(&schema, Reasoning::May).unwrap();
            feed(&mut c, &tok, answer).unwrap();
            assert!(c.is_complete(), "{answer}");
        }
        let mut c = compiler.compile(&schema, Reasoning::May).unwrap();
        assert!(feed(&mut c, &tok, "hmm").is_err(), "free text only inside a think block");
    }

    #[test]
    fn tool_calls_under_auto_parse_or_do_not_open() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let tools = [json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})];
        let grammar = Grammar::Answer(crate::engine::tools::ToolFormat::Hermes.auto_grammar(&tools, true));
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n</tool_call>";
        for answer in ["hi there, a < b", call, &format!("ok\n{call}\n{call}")] {
            let mut c = compiler.compile(&grammar, Reasoning::Off).unwrap();
            feed(&mut c, &tok, answer).unwrap();
            assert!(c.is_complete(), "{answer}");
        }
        // Once a call opens it must be one: a wrong key, an unknown function, text after it.
        for bad in ["ok <tool_call>\n{\"nam\": 1", "<tool_call>\n{\"name\": \"rm", &format!("{call} bye")] {
            let mut c = compiler.compile(&grammar, Reasoning::Off).unwrap();
            assert!(feed(&mut c, &tok, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lark_grammars_compile_and_bad_ones_say_why() {
        let tok = toy_tokenizer();
        let eos = tok["added_tokens"][0]["id"].as_u64().unwrap() as u32;
        let compiler = GrammarCompiler::new(&tok, eos as usize + 1, &[eos]).unwrap();
        let mut c = compiler.compile(&Grammar::Lark("start: \"yes\" | \"no\"".into()), Reasoning::Off).unwrap();
        assert!(feed(&mut c, &tok, "maybe").is_err());
        let mut c = compiler.compile(&Grammar::Lark("start: \"yes\" | \"no\"".into()), Reasoning::Off).unwrap();
        feed(&mut c, &tok, "no").unwrap();
        assert!(c.is_complete());
        let Err(Error::Grammar(message)) = compiler.compile(&Grammar::Lark("start: undefined_rule".into()), Reasoning::Off) else { panic!("compiled") };
        assert!(message.contains("undefined_rule"), "{message}");
        let Err(Error::Grammar(message)) = compiler.compile(&Grammar::JsonSchema(json!({"type": "frobnicate"})), Reasoning::Off) else { panic!("compiled") };
        assert!(message.contains("frobnicate"), "{message}");
    }
}
