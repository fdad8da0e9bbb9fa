//! Python values as BFCL's checker sees them.
//!
//! BFCL's checker compares decoded model arguments with ground-truth
//! alternatives using Python's `==`, `in` and `type(x) == T`.  Those rules
//! differ from JSON equality in ways that decide verdicts: `1 == 1.0 == True`,
//! a list never equals a tuple, dict equality ignores order, `x in "str"` is a
//! substring test, and `type(True)` is not `int`.  [`PyValue`] models just the
//! value kinds the decoders can produce, with those semantics.

use serde_json::{Map, Number, Value};

/// A Python value produced by a decoder or read from the ground truth.
///
/// Integers are `i128`: Python's are unbounded, and a decoder gives up
/// (decode failure) on a literal or arithmetic result outside this range.
#[derive(Clone, Debug)]
pub enum PyValue {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    /// A complex number (real, imaginary), from literals such as `5j`.
    Complex(f64, f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<PyValue>),
    Tuple(Vec<PyValue>),
    /// Insertion-ordered; keys are unique under Python `==` (so `1` and
    /// `1.0` are one key, as in a Python dict).
    Dict(Vec<(PyValue, PyValue)>),
}

/// Python's `type(x)`: what the checker's `type(value) == expected` compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyType {
    NoneType,
    Bool,
    Int,
    Float,
    Complex,
    Str,
    Bytes,
    List,
    Tuple,
    Dict,
    /// Java's `Set` maps to Python `set`, which no decoded value ever has.
    Set,
}

impl PyType {
    /// The name Python prints for the type (`type(x).__name__`).
    pub fn name(self) -> &'static str {
        match self {
            PyType::NoneType => "NoneType",
            PyType::Bool => "bool",
            PyType::Int => "int",
            PyType::Float => "float",
            PyType::Complex => "complex",
            PyType::Str => "str",
            PyType::Bytes => "bytes",
            PyType::List => "list",
            PyType::Tuple => "tuple",
            PyType::Dict => "dict",
            PyType::Set => "set",
        }
    }
}

impl PyValue {
    pub fn py_type(&self) -> PyType {
        match self {
            PyValue::None => PyType::NoneType,
            PyValue::Bool(_) => PyType::Bool,
            PyValue::Int(_) => PyType::Int,
            PyValue::Float(_) => PyType::Float,
            PyValue::Complex(..) => PyType::Complex,
            PyValue::Str(_) => PyType::Str,
            PyValue::Bytes(_) => PyType::Bytes,
            PyValue::List(_) => PyType::List,
            PyValue::Tuple(_) => PyType::Tuple,
            PyValue::Dict(_) => PyType::Dict,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            PyValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Whether Python could use the value as a dict key.
    pub fn is_hashable(&self) -> bool {
        match self {
            PyValue::List(_) | PyValue::Dict(_) => false,
            PyValue::Tuple(items) => items.iter().all(PyValue::is_hashable),
            _ => true,
        }
    }

    /// Python `needle in self`.  `Err` where Python raises `TypeError`.
    pub fn contains(&self, needle: &PyValue) -> Result<bool, String> {
        match self {
            PyValue::List(items) | PyValue::Tuple(items) => Ok(items.iter().any(|x| x == needle)),
            PyValue::Dict(pairs) => {
                if !needle.is_hashable() {
                    return Err(format!("unhashable type: '{}'", needle.py_type().name()));
                }
                Ok(pairs.iter().any(|(k, _)| k == needle))
            }
            // `"" in "abc"` is True: substring test.
            PyValue::Str(haystack) => match needle {
                PyValue::Str(n) => Ok(haystack.contains(n.as_str())),
                other => Err(format!(
                    "'in <string>' requires string as left operand, not {}",
                    other.py_type().name()
                )),
            },
            PyValue::Bytes(haystack) => match needle {
                PyValue::Bytes(n) => {
                    Ok(n.is_empty() || haystack.windows(n.len()).any(|w| w == n.as_slice()))
                }
                PyValue::Int(i) => Ok(haystack.iter().any(|b| i128::from(*b) == *i)),
                other => Err(format!(
                    "a bytes-like object is required, not '{}'",
                    other.py_type().name()
                )),
            },
            other => Err(format!(
                "argument of type '{}' is not iterable",
                other.py_type().name()
            )),
        }
    }

    /// The items Python's `for x in self` yields (a str yields its
    /// characters, a dict its keys).  `Err` where Python raises `TypeError`.
    pub fn iter_items(&self) -> Result<Vec<PyValue>, String> {
        match self {
            PyValue::List(items) | PyValue::Tuple(items) => Ok(items.clone()),
            PyValue::Str(s) => Ok(s.chars().map(|c| PyValue::Str(c.to_string())).collect()),
            PyValue::Bytes(b) => Ok(b.iter().map(|x| PyValue::Int(i128::from(*x))).collect()),
            PyValue::Dict(pairs) => Ok(pairs.iter().map(|(k, _)| k.clone()).collect()),
            other => Err(format!(
                "'{}' object is not iterable",
                other.py_type().name()
            )),
        }
    }

    /// Python `len(self)`.
    #[allow(clippy::len_without_is_empty)] // fallible: not every value has a length
    pub fn len(&self) -> Result<usize, String> {
        match self {
            PyValue::List(items) | PyValue::Tuple(items) => Ok(items.len()),
            PyValue::Str(s) => Ok(s.chars().count()),
            PyValue::Bytes(b) => Ok(b.len()),
            PyValue::Dict(pairs) => Ok(pairs.len()),
            other => Err(format!(
                "object of type '{}' has no len()",
                other.py_type().name()
            )),
        }
    }

    /// Python `self[key]` for a dict.
    pub fn dict_get(&self, key: &PyValue) -> Option<&PyValue> {
        match self {
            PyValue::Dict(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python `self[i]` for a list, tuple or str.
    pub fn index(&self, i: usize) -> Result<PyValue, String> {
        match self {
            PyValue::List(items) | PyValue::Tuple(items) => items
                .get(i)
                .cloned()
                .ok_or_else(|| "index out of range".to_string()),
            PyValue::Str(s) => s
                .chars()
                .nth(i)
                .map(|c| PyValue::Str(c.to_string()))
                .ok_or_else(|| "string index out of range".to_string()),
            other => Err(format!(
                "'{}' object is not subscriptable",
                other.py_type().name()
            )),
        }
    }

    /// Python truthiness (`bool(x)`).
    pub fn truthy(&self) -> bool {
        match self {
            PyValue::None => false,
            PyValue::Bool(b) => *b,
            PyValue::Int(i) => *i != 0,
            PyValue::Float(f) => *f != 0.0,
            PyValue::Complex(re, im) => *re != 0.0 || *im != 0.0,
            PyValue::Str(s) => !s.is_empty(),
            PyValue::Bytes(b) => !b.is_empty(),
            PyValue::List(v) | PyValue::Tuple(v) => !v.is_empty(),
            PyValue::Dict(v) => !v.is_empty(),
        }
    }

    /// The value `json.loads` gives for a JSON document: integers → int,
    /// numbers with a fraction or exponent → float, arrays → list, objects →
    /// dict with str keys.
    pub fn from_json(value: &Value) -> PyValue {
        match value {
            Value::Null => PyValue::None,
            Value::Bool(b) => PyValue::Bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    PyValue::Int(i128::from(i))
                } else if let Some(u) = n.as_u64() {
                    PyValue::Int(i128::from(u))
                } else {
                    PyValue::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => PyValue::Str(s.clone()),
            Value::Array(items) => PyValue::List(items.iter().map(PyValue::from_json).collect()),
            Value::Object(map) => PyValue::Dict(
                map.iter()
                    .map(|(k, v)| (PyValue::Str(k.clone()), PyValue::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// JSON as Python's `json.dumps` would write it (tuples become arrays,
    /// non-str keys are stringified).  Values without a JSON form become
    /// `null` (non-finite floats) or their Python repr (bytes, complex).
    pub fn to_json(&self) -> Value {
        match self {
            PyValue::None => Value::Null,
            PyValue::Bool(b) => Value::Bool(*b),
            PyValue::Int(i) => {
                if let Ok(x) = i64::try_from(*i) {
                    Value::Number(x.into())
                } else if let Ok(x) = u64::try_from(*i) {
                    Value::Number(x.into())
                } else {
                    Number::from_f64(*i as f64).map_or(Value::Null, Value::Number)
                }
            }
            PyValue::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            PyValue::Str(s) => Value::String(s.clone()),
            PyValue::Complex(..) | PyValue::Bytes(_) => Value::String(self.repr()),
            PyValue::List(items) | PyValue::Tuple(items) => {
                Value::Array(items.iter().map(PyValue::to_json).collect())
            }
            PyValue::Dict(pairs) => {
                let mut map = Map::new();
                for (k, v) in pairs {
                    map.insert(json_key(k), v.to_json());
                }
                Value::Object(map)
            }
        }
    }

    /// Python's `repr(x)`.
    pub fn repr(&self) -> String {
        match self {
            PyValue::None => "None".into(),
            PyValue::Bool(true) => "True".into(),
            PyValue::Bool(false) => "False".into(),
            PyValue::Int(i) => i.to_string(),
            PyValue::Float(f) => float_repr(*f),
            PyValue::Complex(re, im) => complex_repr(*re, *im),
            PyValue::Str(s) => str_repr(s),
            PyValue::Bytes(b) => bytes_repr(b),
            PyValue::List(items) => {
                format!(
                    "[{}]",
                    items
                        .iter()
                        .map(PyValue::repr)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            PyValue::Tuple(items) if items.len() == 1 => format!("({},)", items[0].repr()),
            PyValue::Tuple(items) => {
                format!(
                    "({})",
                    items
                        .iter()
                        .map(PyValue::repr)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            PyValue::Dict(pairs) => format!(
                "{{{}}}",
                pairs
                    .iter()
                    .map(|(k, v)| format!("{}: {}", k.repr(), v.repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// How `json.dumps` writes a non-str dict key.
fn json_key(key: &PyValue) -> String {
    match key {
        PyValue::Str(s) => s.clone(),
        PyValue::None => "null".into(),
        PyValue::Bool(b) => b.to_string(),
        PyValue::Float(f) => float_repr(*f),
        other => other.repr(),
    }
}

/// The numeric value of a bool/int/float/complex, for cross-type `==`.
enum Num {
    Int(i128),
    Float(f64),
    Complex(f64, f64),
}

fn as_num(v: &PyValue) -> Option<Num> {
    match v {
        PyValue::Bool(b) => Some(Num::Int(i128::from(*b))),
        PyValue::Int(i) => Some(Num::Int(*i)),
        PyValue::Float(f) => Some(Num::Float(*f)),
        PyValue::Complex(re, im) => Some(Num::Complex(*re, *im)),
        _ => None,
    }
}

/// Python compares int and float exactly (not by rounding the int).
fn int_eq_float(i: i128, f: f64) -> bool {
    f.is_finite() && f.fract() == 0.0 && f.abs() < 1.7e38 && f as i128 == i
}

impl PartialEq for PyValue {
    /// Python `==`.
    fn eq(&self, other: &PyValue) -> bool {
        if let (Some(a), Some(b)) = (as_num(self), as_num(other)) {
            return match (a, b) {
                (Num::Int(x), Num::Int(y)) => x == y,
                (Num::Float(x), Num::Float(y)) => x == y,
                (Num::Int(i), Num::Float(f)) | (Num::Float(f), Num::Int(i)) => int_eq_float(i, f),
                (Num::Complex(r1, i1), Num::Complex(r2, i2)) => r1 == r2 && i1 == i2,
                (Num::Complex(re, im), other) | (other, Num::Complex(re, im)) => {
                    im == 0.0
                        && match other {
                            Num::Int(i) => int_eq_float(i, re),
                            Num::Float(f) => f == re,
                            Num::Complex(..) => unreachable!("handled above"),
                        }
                }
            };
        }
        match (self, other) {
            (PyValue::None, PyValue::None) => true,
            (PyValue::Str(a), PyValue::Str(b)) => a == b,
            (PyValue::Bytes(a), PyValue::Bytes(b)) => a == b,
            (PyValue::List(a), PyValue::List(b)) | (PyValue::Tuple(a), PyValue::Tuple(b)) => a == b,
            (PyValue::Dict(a), PyValue::Dict(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(k, v)| b.iter().any(|(k2, v2)| k == k2 && v == v2))
            }
            _ => false,
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, fixed
/// notation for exponents in [-4, 16), scientific (`1e+16`, `1e-05`) outside.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `{:e}` gives the same shortest digits, e.g. "-1.2345e-5".
    let sci = format!("{:e}", f);
    let (mantissa, exp) = sci
        .split_once('e')
        .expect("LowerExp always has an exponent");
    let exp: i32 = exp.parse().expect("LowerExp exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() <= point {
                format!("{}{}.0", digits, "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        }
    } else {
        let rest = &digits[1..];
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{}", rest)
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{}{}e{}{:02}", &digits[..1], frac, esign, exp.abs())
    };
    format!("{}{}", sign, body)
}

/// A float as a part of Python's complex repr: `repr` without the `.0`.
fn complex_part(f: f64) -> String {
    let text = float_repr(f);
    text.strip_suffix(".0").map(str::to_string).unwrap_or(text)
}

/// Python's `repr(complex)`: `5j`, `(1.5+2j)`, `(-0-5j)`.
pub fn complex_repr(re: f64, im: f64) -> String {
    let imag = complex_part(im);
    if re == 0.0 && re.is_sign_positive() {
        return format!("{}j", imag);
    }
    let sign = if imag.starts_with('-') { "" } else { "+" };
    format!("({}{}{}j)", complex_part(re), sign, imag)
}

/// Approximation of Python's `str.isprintable` for one character: control
/// and format characters and non-ASCII spaces are not printable.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c as u32,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x180E | 0x200B..=0x200F
        | 0x202A..=0x202E | 0x2060..=0x206F | 0xFEFF | 0xFFF9..=0xFFFB
        | 0xD800..=0xDFFF | 0xE000..=0xF8FF | 0xF0000..=0x10FFFF)
}

/// Python's `repr(str)`.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if is_printable(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr(bytes)`.
pub fn bytes_repr(b: &[u8]) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut out = String::from("b");
    out.push(quote as char);
    for &x in b {
        match x {
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            x if x == quote => {
                out.push('\\');
                out.push(x as char);
            }
            0x20..=0x7e => out.push(x as char),
            x => out.push_str(&format!("\\x{:02x}", x)),
        }
    }
    out.push(quote as char);
    out
}

/// Python's `str.isspace` for one character (`str.strip()` with no
/// argument strips these; it includes U+001C..U+001F, which Unicode's
/// White_Space does not).
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `int(s)` for a str, base 10: surrounding whitespace, a sign,
/// and single underscores between digits are allowed.  ASCII digits only
/// (Python also accepts other Unicode decimal digits).
pub fn py_int_from_str(s: &str) -> Option<i128> {
    let s = py_strip(s);
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if !valid_digit_run(body) {
        return None;
    }
    let digits: String = body.chars().filter(|c| *c != '_').collect();
    let magnitude: i128 = digits.parse().ok()?;
    Some(if neg { -magnitude } else { magnitude })
}

/// Digits with single underscores between them, at least one digit.
fn valid_digit_run(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_digit()
        && b[b.len() - 1].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'_')
        && !s.contains("__")
}

/// Python's `float(s)` for a str: decimal forms with optional underscores
/// between digits, `inf`/`infinity`/`nan` in any case, surrounding whitespace.
pub fn py_float_from_str(s: &str) -> Option<f64> {
    let s = py_strip(s);
    let (sign, body) = match s.as_bytes().first() {
        Some(b'-') => (-1.0, &s[1..]),
        Some(b'+') => (1.0, &s[1..]),
        _ => (1.0, s),
    };
    let lower = body.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Some(sign * f64::INFINITY);
    }
    if lower == "nan" {
        return Some(f64::NAN);
    }
    let (mantissa, exponent) = match lower.find('e') {
        Some(i) => (&lower[..i], Some(&lower[i + 1..])),
        None => (lower.as_str(), None),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], Some(&mantissa[i + 1..])),
        None => (mantissa, None),
    };
    let int_ok = int_part.is_empty() || valid_digit_run(int_part);
    let frac_ok = frac_part.is_none_or(|f| f.is_empty() || valid_digit_run(f));
    let has_digit = !int_part.is_empty() || frac_part.is_some_and(|f| !f.is_empty());
    let exp_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        valid_digit_run(e)
    });
    if !(int_ok && frac_ok && has_digit && exp_ok) {
        return None;
    }
    let cleaned: String = lower.chars().filter(|c| *c != '_').collect();
    cleaned.parse::<f64>().ok().map(|f| sign * f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_across_bool_int_float() {
        assert_eq!(PyValue::Int(1), PyValue::Float(1.0));
        assert_eq!(PyValue::Bool(true), PyValue::Int(1));
        assert_ne!(PyValue::Int(1), PyValue::Float(1.5));
        assert_eq!(
            PyValue::List(vec![PyValue::Int(1), PyValue::Int(2)]),
            PyValue::List(vec![PyValue::Float(1.0), PyValue::Float(2.0)])
        );
    }

    #[test]
    fn list_is_never_tuple_and_dicts_ignore_order() {
        let items = vec![PyValue::Int(1)];
        assert_ne!(PyValue::List(items.clone()), PyValue::Tuple(items));
        let a = PyValue::from_json(&json!({"a": 1, "b": 2}));
        let b = PyValue::from_json(&json!({"b": 2, "a": 1}));
        assert_eq!(a, b);
    }

    #[test]
    fn json_keeps_int_float_distinction() {
        assert_eq!(PyValue::from_json(&json!(5)).py_type(), PyType::Int);
        assert_eq!(PyValue::from_json(&json!(5.0)).py_type(), PyType::Float);
        assert_eq!(PyValue::from_json(&json!(true)).py_type(), PyType::Bool);
    }

    #[test]
    fn str_containment_is_substring() {
        let s = PyValue::Str("epoch_millis".into());
        assert_eq!(s.contains(&PyValue::Str("".into())), Ok(true));
        assert_eq!(s.contains(&PyValue::Str("och".into())), Ok(true));
        assert!(s.contains(&PyValue::Int(1)).is_err());
    }

    #[test]
    fn reprs_match_python() {
        assert_eq!(float_repr(1e16), "1e+16");
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(123.0), "123.0");
        assert_eq!(float_repr(-2.5e-7), "-2.5e-07");
        assert_eq!(float_repr(1234567890123456.7), "1234567890123456.8");
        assert_eq!(str_repr("it's"), "\"it's\"");
        assert_eq!(str_repr("a'b\"c\n"), "'a\\'b\"c\\n'");
        assert_eq!(PyValue::Tuple(vec![PyValue::Int(1)]).repr(), "(1,)");
        assert_eq!(complex_repr(-0.0, -5.0), "(-0-5j)");
        assert_eq!(complex_repr(0.0, 1e16), "1e+16j");
        assert_eq!(complex_repr(1.5, 2.0), "(1.5+2j)");
    }

    #[test]
    fn python_number_parsing() {
        assert_eq!(py_int_from_str(" 1_000 "), Some(1000));
        assert_eq!(py_int_from_str("1__0"), None);
        assert_eq!(py_float_from_str("1e5"), Some(1e5));
        assert_eq!(py_float_from_str("-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(py_float_from_str(".5"), Some(0.5));
        assert_eq!(py_float_from_str("."), None);
    }
}
