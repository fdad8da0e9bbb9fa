//! BFCL's AST checker: is a decoded answer correct for an entry?
//!
//! The rules of BFCL's checker, all mirrored here (quirks included):
//! * simple categories need exactly one call; `multiple` needs as many calls
//!   as the ground truth (one) and checks the first; `parallel*` match
//!   ground-truth calls in order, each taking the **first** still-unmatched
//!   model call that passes (greedy, not a maximum matching).
//! * A call passes when its name equals the doc's (with `.` → `_` for
//!   models whose config has `underscore_to_dot`), every `required` param
//!   of the doc is present, every supplied param is in both the doc and the
//!   ground truth, each value passes the type and value checks, and every
//!   ground-truth param not supplied lists `""` (optional) among its
//!   alternatives.  Checks run in that order and stop at the first failure.
//! * Types are Python's, compared exactly (`bool` is not `int`), except that
//!   an `int` given for a top-level Python `float` param is promoted.  A
//!   value whose type equals the ground truth's (first non-`""`
//!   alternative's) instead of the declared one is a "variable": it is then
//!   only compared with `==`.  Lists get a one-level element type check.
//! * Strings compare after standardisation (drop ` ,./-_*^`, lowercase,
//!   `'` → `"`); lists compare with their top-level strings standardised;
//!   dicts key by key against each dict alternative; lists of dicts element
//!   by element.  Everything else by Python `==` membership.
//! * Java/JavaScript values are source-text strings, converted by the
//!   declared type first (see `convert.rs`).
//!
//! Where BFCL's checker would crash (e.g. a non-dict element reaching the
//! list-of-dict check), the verdict is invalid with error type
//! `checker_error`.

use serde_json::Value;

use super::convert::{java_convert, js_convert};
use super::data::{Category, Language};
use super::decode::{Call, DecodeError};
use super::value::{PyType, PyValue};

/// The outcome for one entry: `error_type` is BFCL's string
/// (`simple_function_checker:missing_required`, `value_error:string`…).
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub valid: bool,
    pub error_type: Option<String>,
    pub message: Option<String>,
}

impl Verdict {
    pub fn correct() -> Verdict {
        Verdict {
            valid: true,
            error_type: None,
            message: None,
        }
    }

    fn wrong(error_type: &str, message: impl Into<String>) -> Verdict {
        Verdict {
            valid: false,
            error_type: Some(error_type.to_string()),
            message: Some(message.into()),
        }
    }
}

/// A Python exception inside BFCL's checker: it would abort the run.
fn crash(message: String) -> Verdict {
    Verdict::wrong("checker_error", message)
}

/// The full runner step for one entry: decode outcome, format check, then
/// the AST checker (or the irrelevance rule).  `functions` are the docs as
/// stored (without language hints); `ground_truth` is `None` only for
/// irrelevance.
pub fn evaluate(
    category: Category,
    functions: &[Value],
    decoded: &Result<Vec<Call>, DecodeError>,
    ground_truth: Option<&Value>,
    underscore_to_dot: bool,
) -> Verdict {
    if category == Category::Irrelevance {
        return check_irrelevance(decoded.as_ref().ok().map(Vec::as_slice));
    }
    match decoded {
        Err(DecodeError::Failed(m)) => Verdict::wrong(
            "ast_decoder:decoder_failed",
            format!("Invalid syntax. Failed to decode AST. {}", m),
        ),
        Err(DecodeError::WrongFormat(m)) => Verdict::wrong(
            "ast_decoder:decoder_wrong_output_format",
            format!("Did not output in the specified format. {}", m),
        ),
        Ok(calls) => match ground_truth {
            Some(gt) => check(category, functions, calls, gt, underscore_to_dot),
            None => crash(format!("{} has no ground truth", category)),
        },
    }
}

/// Irrelevance: correct iff no call was made.  `None` = the reply did not
/// decode (or was not in call format), which counts as no call, like `[]`.
pub fn check_irrelevance(decoded: Option<&[Call]>) -> Verdict {
    match decoded {
        Some(calls) if !calls.is_empty() => Verdict::wrong(
            "irrelevance_error:decoder_success",
            "Valid syntax. Successfully decode AST when it should not.",
        ),
        _ => Verdict::correct(),
    }
}

/// BFCL's `ast_checker` for a decoded answer.
pub fn check(
    category: Category,
    functions: &[Value],
    decoded: &[Call],
    ground_truth: &Value,
    underscore_to_dot: bool,
) -> Verdict {
    if category == Category::Irrelevance {
        return check_irrelevance(Some(decoded));
    }
    let gt = match ground_truth {
        Value::Array(calls) => calls.iter().map(PyValue::from_json).collect::<Vec<_>>(),
        _ => return crash("ground truth is not a list".into()),
    };
    let ctx = Context {
        language: category.language(),
        underscore_to_dot,
    };
    match category {
        Category::Parallel | Category::ParallelMultiple => {
            ctx.parallel_no_order(functions, decoded, &gt)
        }
        Category::Multiple => {
            if decoded.len() != gt.len() {
                return Verdict::wrong(
                    "multiple_function_checker:wrong_count",
                    "Wrong number of functions.",
                );
            }
            match gt.first() {
                Some(expected) => ctx.simple_for_expected(functions, &decoded[0], expected),
                None => crash("empty ground truth".into()),
            }
        }
        _ => {
            if decoded.len() != 1 {
                return Verdict::wrong(
                    "simple_function_checker:wrong_count",
                    "Wrong number of functions.",
                );
            }
            match (functions.first(), gt.first()) {
                (Some(doc), Some(expected)) => ctx.simple(doc, &decoded[0], expected),
                _ => crash("no function doc or ground truth".into()),
            }
        }
    }
}

/// `standardize_string`: drop ` ,./-_*^`, lowercase, `'` → `"`.
pub fn standardize_string(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | ',' | '.' | '/' | '-' | '_' | '*' | '^'))
        .collect::<String>()
        .to_lowercase()
        .replace('\'', "\"")
}

/// A standardised copy if the value is a str.
fn standardized(v: &PyValue) -> PyValue {
    match v {
        PyValue::Str(s) => PyValue::Str(standardize_string(s)),
        other => other.clone(),
    }
}

/// The single `{name: params}` of a ground-truth call.
fn gt_single(expected: &PyValue) -> Option<(&PyValue, &PyValue)> {
    match expected {
        PyValue::Dict(pairs) => pairs.first().map(|(k, v)| (k, v)),
        _ => None,
    }
}

/// The Python type a declared parameter type maps to (BFCL's
/// `PYTHON_TYPE_MAPPING`, `JAVA_TYPE_CONVERSION`, `JS_TYPE_CONVERSION`).
fn expected_type(language: Language, declared: &str) -> Option<PyType> {
    use PyType as T;
    let t = match language {
        Language::Python => match declared {
            "string" | "any" => T::Str,
            "integer" => T::Int,
            "float" => T::Float,
            "boolean" => T::Bool,
            "array" | "tuple" => T::List,
            "dict" => T::Dict,
            _ => return None,
        },
        Language::Java => match declared {
            "byte" | "short" | "integer" | "long" => T::Int,
            "float" | "double" => T::Float,
            "boolean" => T::Bool,
            "char" | "String" | "any" => T::Str,
            "Array" | "ArrayList" | "Queue" | "Stack" => T::List,
            "Set" => T::Set,
            "HashMap" | "Hashtable" => T::Dict,
            _ => return None,
        },
        Language::JavaScript => match declared {
            "String" | "any" => T::Str,
            "integer" | "Bigint" => T::Int,
            "float" => T::Float,
            "Boolean" => T::Bool,
            "dict" => T::Dict,
            "array" => T::List,
            _ => return None,
        },
    };
    Some(t)
}

/// Declared types whose elements are checked (and, for Java/JS, converted).
fn has_nested_type(language: Language, declared: &str) -> bool {
    match language {
        Language::Python => matches!(declared, "array" | "tuple"),
        Language::Java | Language::JavaScript => {
            matches!(declared, "Array" | "ArrayList" | "array")
        }
    }
}

/// Result of `type_checker`.
struct TypeCheck {
    valid: bool,
    is_variable: bool,
    error_type: &'static str,
    message: String,
}

/// The type of the first alternative that is not `""`.
fn answer_type(possible: &PyValue) -> Result<Option<PyType>, String> {
    let empty = PyValue::Str(String::new());
    Ok(possible
        .iter_items()?
        .into_iter()
        .find(|a| *a != empty)
        .map(|a| a.py_type()))
}

/// BFCL's `type_checker` (one level of nesting).
fn type_checker(
    param: &str,
    value: &PyValue,
    possible: &PyValue,
    declared: &str,
    expected: PyType,
    nested: Option<PyType>,
) -> Result<TypeCheck, String> {
    let mut result = TypeCheck {
        valid: true,
        is_variable: false,
        error_type: "type_error:simple",
        message: String::new(),
    };
    let gt_type = answer_type(possible)?;
    let is_variable = gt_type.is_some_and(|t| t != expected);
    if value.py_type() == expected {
        let Some(nested) = nested else {
            result.is_variable = is_variable;
            return Ok(result);
        };
        for alternative in possible.iter_items()? {
            // A non-list alternative (such as `""`) passes right away.
            let mut all_match = true;
            if alternative.py_type() == PyType::List {
                for item in value.iter_items()? {
                    let inner =
                        type_checker(param, &item, &alternative, nested.name(), nested, None)?;
                    if !inner.valid {
                        all_match = false;
                        break;
                    }
                }
            }
            if all_match {
                return Ok(TypeCheck {
                    valid: true,
                    is_variable,
                    error_type: "",
                    message: String::new(),
                });
            }
        }
        result.valid = false;
        result.error_type = "type_error:nested";
        result.message = format!(
            "Nested type checking failed for parameter {:?}. Expected outer type {} with inner type {}. Parameter value: {}.",
            param,
            declared,
            nested.name(),
            value.repr()
        );
    }
    if gt_type == Some(value.py_type()) {
        result.is_variable = true;
        return Ok(result);
    }
    result.valid = false;
    result.error_type = "type_error:simple";
    result.message = format!(
        "Incorrect type for parameter {:?}. Expected type {}, got {}. Parameter value: {}.",
        param,
        declared,
        value.py_type().name(),
        value.repr()
    );
    Ok(result)
}

fn string_checker(param: &str, value: &str, possible: &PyValue) -> Result<Option<Verdict>, String> {
    let target = standardize_string(value);
    let found = possible
        .iter_items()?
        .iter()
        .any(|a| a.as_str().is_some_and(|s| standardize_string(s) == target));
    Ok((!found).then(|| {
        Verdict::wrong(
            "value_error:string",
            format!(
                "Invalid value for parameter {:?}: {:?}. Expected one of {}. Case insensitive.",
                param,
                value,
                possible.repr()
            ),
        )
    }))
}

fn list_checker(
    param: &str,
    value: &PyValue,
    possible: &PyValue,
) -> Result<Option<Verdict>, String> {
    let model = PyValue::List(value.iter_items()?.iter().map(standardized).collect());
    for alternative in possible.iter_items()? {
        let alt = PyValue::List(alternative.iter_items()?.iter().map(standardized).collect());
        if alt == model {
            return Ok(None);
        }
    }
    Ok(Some(Verdict::wrong(
        "value_error:list/tuple",
        format!(
            "Invalid value for parameter {:?}: {}. Expected one of {}.",
            param,
            value.repr(),
            possible.repr()
        ),
    )))
}

fn dict_checker(value: &PyValue, alternatives: &[PyValue]) -> Result<Option<Verdict>, String> {
    let PyValue::Dict(model) = value else {
        return Err(format!(
            "'{}' object has no attribute 'items'",
            value.py_type().name()
        ));
    };
    let empty = PyValue::Str(String::new());
    let mut result = Verdict::wrong("dict_checker:unclear", "");
    for alternative in alternatives {
        if *alternative == empty {
            continue;
        }
        result = Verdict::wrong("dict_checker:unclear", "");
        let mut ok = true;
        for (key, v) in model {
            if !alternative.contains(key)? {
                result = Verdict::wrong(
                    "value_error:dict_key",
                    format!("Unexpected dict key parameter: {}.", key.repr()),
                );
                ok = false;
                break;
            }
            let allowed = match alternative {
                PyValue::Dict(_) => alternative.dict_get(key).cloned().unwrap_or(PyValue::None),
                other => {
                    return Err(format!(
                        "'{}' object is not subscriptable by key",
                        other.py_type().name()
                    ))
                }
            };
            let allowed: Vec<PyValue> = allowed.iter_items()?.iter().map(standardized).collect();
            if !allowed.contains(&standardized(v)) {
                result = Verdict::wrong(
                    "value_error:dict_value",
                    format!(
                        "Invalid value for parameter {}: {}. Expected one of {}.",
                        key.repr(),
                        v.repr(),
                        PyValue::List(allowed).repr()
                    ),
                );
                ok = false;
                break;
            }
        }
        // Runs even after a failure above, and may overwrite its error.
        let PyValue::Dict(alt_pairs) = alternative else {
            return Err(format!(
                "'{}' object has no attribute 'items'",
                alternative.py_type().name()
            ));
        };
        for (key, allowed) in alt_pairs {
            let supplied = model.iter().any(|(k, _)| k == key);
            if !supplied && !allowed.contains(&empty)? {
                result = Verdict::wrong(
                    "value_error:dict_key",
                    format!("Missing dict key parameter: {}.", key.repr()),
                );
                ok = false;
                break;
            }
        }
        if ok {
            return Ok(None);
        }
    }
    Ok(Some(result))
}

fn list_dict_checker(value: &PyValue, possible: &PyValue) -> Result<Option<Verdict>, String> {
    let items = value.iter_items()?;
    let mut result = Verdict::wrong("list_dict_checker:unclear", "");
    for alternative in possible.iter_items()? {
        if alternative.len()? != items.len() {
            result = Verdict::wrong(
                "value_error:list_dict_count",
                "Wrong number of dictionaries in the list.",
            );
            continue;
        }
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            match dict_checker(item, &[alternative.index(i)?])? {
                Some(failure) => {
                    result = failure;
                    ok = false;
                    break;
                }
                None => result = Verdict::correct(),
            }
        }
        if ok {
            return Ok(None);
        }
    }
    Ok(Some(result))
}

/// `java_convert` / `js_convert`.
type Converter = fn(&str, &str, Option<&str>) -> Result<PyValue, String>;

struct Context {
    language: Language,
    underscore_to_dot: bool,
}

impl Context {
    /// Finds the doc named like the expected call, then checks.
    fn simple_for_expected(&self, functions: &[Value], call: &Call, expected: &PyValue) -> Verdict {
        let Some((PyValue::Str(name), _)) = gt_single(expected) else {
            return crash("malformed ground-truth call".into());
        };
        match functions
            .iter()
            .find(|f| f.get("name").and_then(Value::as_str) == Some(name))
        {
            Some(doc) => self.simple(doc, call, expected),
            None => crash(format!("no function doc named {}", name)),
        }
    }

    fn parallel_no_order(&self, functions: &[Value], decoded: &[Call], gt: &[PyValue]) -> Verdict {
        if decoded.len() != gt.len() {
            return Verdict::wrong(
                "parallel_function_checker_no_order:wrong_count",
                "Wrong number of functions.",
            );
        }
        let mut matched = vec![false; decoded.len()];
        for (i, expected) in gt.iter().enumerate() {
            let mut found = false;
            let mut last = None;
            for (j, call) in decoded.iter().enumerate() {
                if matched[j] {
                    continue;
                }
                let verdict = self.simple_for_expected(functions, call, expected);
                if verdict.error_type.as_deref() == Some("checker_error") {
                    return verdict;
                }
                if verdict.valid {
                    matched[j] = true;
                    found = true;
                    break;
                }
                last = Some(verdict);
            }
            if !found {
                let detail = last.and_then(|v| v.message).unwrap_or_default();
                return Verdict::wrong(
                    "parallel_function_checker_no_order:cannot_find_match",
                    format!(
                        "Could not find a matching function for index {} of possible answers. {}",
                        i, detail
                    ),
                );
            }
        }
        Verdict::correct()
    }

    /// BFCL's `simple_function_checker`.
    fn simple(&self, doc: &Value, call: &Call, expected: &PyValue) -> Verdict {
        match self.simple_inner(doc, call, expected) {
            Ok(v) => v,
            Err(e) => crash(e),
        }
    }

    fn simple_inner(
        &self,
        doc: &Value,
        call: &Call,
        expected: &PyValue,
    ) -> Result<Verdict, String> {
        let (_, possible) = gt_single(expected).ok_or("malformed ground-truth call")?;
        let PyValue::Dict(possible_params) = possible else {
            return Err("ground-truth params are not a dict".into());
        };
        let doc_name = doc
            .get("name")
            .and_then(Value::as_str)
            .ok_or("function doc without a name")?;
        let func_name = if self.underscore_to_dot && doc_name.contains('.') {
            doc_name.replace('.', "_")
        } else {
            doc_name.to_string()
        };
        if call.name != func_name {
            return Ok(Verdict::wrong(
                "simple_function_checker:wrong_func_name",
                format!("Function name {:?} not found in model output.", func_name),
            ));
        }
        let parameters = doc
            .get("parameters")
            .ok_or("function doc without parameters")?;
        let properties = parameters
            .get("properties")
            .and_then(Value::as_object)
            .ok_or("parameters without properties")?;
        let required = parameters
            .get("required")
            .and_then(Value::as_array)
            .ok_or("parameters without required")?;
        for param in required {
            let param = param.as_str().ok_or("non-string required entry")?;
            if call.arg(param).is_none() {
                return Ok(Verdict::wrong(
                    "simple_function_checker:missing_required",
                    format!("Missing required parameter: {:?}.", param),
                ));
            }
        }
        for (param, value) in &call.args {
            let alternatives = param.as_ref().and_then(|p| {
                let key = PyValue::Str(p.clone());
                possible_params
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v)
            });
            let (Some(param), Some(details), Some(alternatives)) = (
                param,
                param.as_ref().and_then(|p| properties.get(p)),
                alternatives,
            ) else {
                let shown = param
                    .as_ref()
                    .map_or("None".to_string(), |p| format!("{:?}", p));
                return Ok(Verdict::wrong(
                    "simple_function_checker:unexpected_param",
                    format!("Unexpected parameter: {}.", shown),
                ));
            };
            if let Some(failure) = self.check_param(param, value, details, alternatives)? {
                return Ok(failure);
            }
        }
        let empty = PyValue::Str(String::new());
        for (param, alternatives) in possible_params {
            let supplied = call
                .args
                .iter()
                .any(|(k, _)| k.as_deref() == param.as_str());
            if !supplied && !alternatives.contains(&empty)? {
                return Ok(Verdict::wrong(
                    "simple_function_checker:missing_optional",
                    format!(
                        "Optional parameter {} not provided and not marked as optional.",
                        param.repr()
                    ),
                ));
            }
        }
        Ok(Verdict::correct())
    }

    /// Type and value checks of one supplied parameter; `Some` on failure.
    fn check_param(
        &self,
        param: &str,
        value: &PyValue,
        details: &Value,
        alternatives: &PyValue,
    ) -> Result<Option<Verdict>, String> {
        let declared = details
            .get("type")
            .and_then(Value::as_str)
            .ok_or("parameter without a type")?;
        let expected = expected_type(self.language, declared)
            .ok_or_else(|| format!("unknown type {}", declared))?;
        let nested_declared = if has_nested_type(self.language, declared) {
            Some(
                details
                    .pointer("/items/type")
                    .and_then(Value::as_str)
                    .ok_or("array parameter without items type")?,
            )
        } else {
            None
        };
        let nested = match nested_declared {
            Some(t) => {
                Some(expected_type(self.language, t).ok_or_else(|| format!("unknown type {}", t))?)
            }
            None => None,
        };
        let mut value = value.clone();
        if self.language != Language::Python {
            let (convert, error_type): (Converter, &str) = match self.language {
                Language::Java => (java_convert, "type_error:java"),
                _ => (js_convert, "type_error:js"),
            };
            let PyValue::Str(text) = &value else {
                return Ok(Some(Verdict::wrong(
                    error_type,
                    format!(
                        "Incorrect type for parameter {:?}. Expected type String, got {}. Parameter value: {}.",
                        param,
                        value.py_type().name(),
                        value.repr()
                    ),
                )));
            };
            value = convert(text, declared, nested_declared)?;
        }
        if declared == "tuple" {
            if let PyValue::Tuple(items) = value {
                value = PyValue::List(items);
            }
        }
        if self.language == Language::Python && declared == "float" {
            if let PyValue::Int(i) = value {
                value = PyValue::Float(i as f64);
            }
        }
        let types = type_checker(param, &value, alternatives, declared, expected, nested)?;
        if !types.valid {
            return Ok(Some(Verdict::wrong(types.error_type, types.message)));
        }
        if !types.is_variable {
            let special = match expected {
                PyType::Dict => Some(dict_checker(&value, &alternatives.iter_items()?)?),
                PyType::List if nested == Some(PyType::Dict) => {
                    Some(list_dict_checker(&value, alternatives)?)
                }
                PyType::Str => Some(string_checker(
                    param,
                    value.as_str().unwrap_or_default(),
                    alternatives,
                )?),
                PyType::List => Some(list_checker(param, &value, alternatives)?),
                _ => None,
            };
            if let Some(outcome) = special {
                return Ok(outcome);
            }
        }
        if !alternatives.contains(&value)? {
            return Ok(Some(Verdict::wrong(
                "value_error:others",
                format!(
                    "Invalid value for parameter {:?}: {}. Expected one of {}.",
                    param,
                    value.repr(),
                    alternatives.repr()
                ),
            )));
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(name: &str, props: Value, required: Value) -> Value {
        json!({"name": name, "description": "", "parameters": {"type": "dict", "properties": props, "required": required}})
    }

    fn call(name: &str, args: Value) -> Call {
        super::super::decode::calls_from_json(&json!([{ name: args }]))
            .unwrap()
            .remove(0)
    }

    fn error(v: Verdict) -> Option<String> {
        v.error_type
    }

    #[test]
    fn float_promotion_is_top_level_only() {
        let docs = [doc(
            "f",
            json!({"x": {"type": "float"}, "v": {"type": "array", "items": {"type": "float"}}}),
            json!(["x"]),
        )];
        let gt = json!([{"f": {"x": [440.0], "v": [[12.0, 15.0]]}}]);
        let ok = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"x": 440, "v": [12.0, 15.0]}))],
            &gt,
            false,
        );
        assert!(ok.valid);
        let nested = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"x": 440, "v": [12, 15]}))],
            &gt,
            false,
        );
        assert_eq!(error(nested).as_deref(), Some("type_error:nested"));
        // A non-list alternative (`""`) lets any element types through.
        let optional = json!([{"f": {"x": [440.0], "v": [[12.0, 15.0], ""]}}]);
        assert!(
            check(
                Category::SimplePython,
                &docs,
                &[call("f", json!({"x": 440, "v": [12, 15]}))],
                &optional,
                false
            )
            .valid
        );
        let int_for_int = check(
            Category::SimplePython,
            &[doc("g", json!({"n": {"type": "integer"}}), json!([]))],
            &[call("g", json!({"n": 5.0}))],
            &json!([{"g": {"n": [5]}}]),
            false,
        );
        assert_eq!(error(int_for_int).as_deref(), Some("type_error:simple"));
    }

    #[test]
    fn strings_are_standardised_and_optional_params_may_be_omitted() {
        let docs = [doc(
            "f",
            json!({"s": {"type": "string"}, "o": {"type": "integer"}}),
            json!(["s"]),
        )];
        let gt = json!([{"f": {"s": ["New York, NY"], "o": [3, ""]}}]);
        assert!(
            check(
                Category::SimplePython,
                &docs,
                &[call("f", json!({"s": "new york ny"}))],
                &gt,
                false
            )
            .valid
        );
        let extra = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"s": "x", "z": 1}))],
            &gt,
            false,
        );
        assert_eq!(error(extra).as_deref(), Some("value_error:string"));
        let unexpected = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"s": "New York NY", "z": 1}))],
            &gt,
            false,
        );
        assert_eq!(
            error(unexpected).as_deref(),
            Some("simple_function_checker:unexpected_param")
        );
    }

    #[test]
    fn parallel_matching_is_greedy() {
        // GT 0 accepts either call; it takes the first, leaving GT 1 without a match.
        let docs = [doc("f", json!({"x": {"type": "integer"}}), json!([]))];
        let gt = json!([{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]);
        let calls = [call("f", json!({"x": 1})), call("f", json!({"x": 2}))];
        let v = check(Category::Parallel, &docs, &calls, &gt, false);
        assert_eq!(
            error(v).as_deref(),
            Some("parallel_function_checker_no_order:cannot_find_match")
        );
        let swapped = [call("f", json!({"x": 2})), call("f", json!({"x": 1}))];
        assert!(check(Category::Parallel, &docs, &swapped, &gt, false).valid);
    }

    #[test]
    fn dict_alternatives_and_bare_string_quirk() {
        let docs = [doc("f", json!({"d": {"type": "dict"}}), json!([]))];
        // A bare string where a list of alternatives belongs: `in` tests
        // characters, and `"" in "epoch_millis"` makes the key optional.
        let gt = json!([{"f": {"d": [{"format": "epoch_millis", "k": ["v"]}]}}]);
        assert!(
            check(
                Category::SimplePython,
                &docs,
                &[call("f", json!({"d": {"k": "v"}}))],
                &gt,
                false
            )
            .valid
        );
        let v = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"d": {"format": "e"}}))],
            &gt,
            false,
        );
        assert_eq!(error(v).as_deref(), Some("value_error:dict_key"));
        let all_optional = json!([{"f": {"d": [""]}}]);
        let v = check(
            Category::SimplePython,
            &docs,
            &[call("f", json!({"d": {}}))],
            &all_optional,
            false,
        );
        assert_eq!(error(v).as_deref(), Some("dict_checker:unclear"));
    }

    #[test]
    fn java_values_convert_by_declared_type() {
        let docs = [doc(
            "A.b",
            json!({"n": {"type": "long"}, "s": {"type": "String"}}),
            json!(["n"]),
        )];
        let gt = json!([{"A.b": {"n": [42], "s": ["x", ""]}}]);
        assert!(
            check(
                Category::SimpleJava,
                &docs,
                &[call("A.b", json!({"n": "42L"}))],
                &gt,
                false
            )
            .valid
        );
        let v = check(
            Category::SimpleJava,
            &docs,
            &[call("A.b", json!({"n": "42"}))],
            &gt,
            false,
        );
        assert_eq!(error(v).as_deref(), Some("type_error:simple"));
        let v = check(
            Category::SimpleJava,
            &docs,
            &[call("A.b", json!({"n": 42}))],
            &gt,
            false,
        );
        assert_eq!(error(v).as_deref(), Some("type_error:java"));
    }

    #[test]
    fn underscore_to_dot_and_irrelevance() {
        let docs = [doc("math.f", json!({}), json!([]))];
        let gt = json!([{"math.f": {}}]);
        assert!(
            check(
                Category::SimplePython,
                &docs,
                &[call("math_f", json!({}))],
                &gt,
                true
            )
            .valid
        );
        let v = check(
            Category::SimplePython,
            &docs,
            &[call("math.f", json!({}))],
            &gt,
            true,
        );
        assert_eq!(
            error(v).as_deref(),
            Some("simple_function_checker:wrong_func_name")
        );
        assert!(check_irrelevance(None).valid);
        assert!(check_irrelevance(Some(&[])).valid);
        assert!(!check_irrelevance(Some(&[call("f", json!({}))])).valid);
    }
}
