//! `mlx-sys/src/bindings.rs` is generated once and checked in, so the build needs no libclang.
//! This test holds it to mlx-c's headers without libclang: every declared function, enum constant
//! and struct of the headers appears in the bindings with the same signature (C types translated
//! the way bindgen does), and the bindings declare nothing the headers do not.

use regex::Regex;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::LazyLock;

static C_FN_PTR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(?s)(.*?)\(\s*\*\s*\w*\s*\)\s*\((.*)\)$").unwrap());
static C_TOKEN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\w+|\*").unwrap());
static RUST_FN_PTR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#"^(?s)Option<\s*unsafe extern "C" fn\((.*)\)\s*(->\s*(.*))?>$"#).unwrap());
static SPACES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\s+").unwrap());
static BLOCK_COMMENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?s)/\*.*?\*/").unwrap());
static LINE_COMMENT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"//[^\n]*").unwrap());
/// A struct field's name: `type name` or a function pointer `ret (*name)(params)`.
static FIELD_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[^(]*\(\s*\*\s*(\w+)\s*\)|(\w+)\s*$").unwrap());

fn headers_dir() -> PathBuf {
    PathBuf::from(env!("SALA_MLX_C_DIR")).join("mlx").join("c")
}

fn bindings_text() -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mlx-sys/src/bindings.rs")).unwrap()
}

/// The headers' text without comments or preprocessor lines, concatenated in name order.
fn headers_text() -> String {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(headers_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    paths.sort();
    assert!(paths.len() > 20, "mlx-c headers missing in {}", headers_dir().display());
    let mut all = String::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        let text = BLOCK_COMMENT.replace_all(&text, " ");
        let text = LINE_COMMENT.replace_all(&text, " ");
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            all.push_str(line);
            all.push('\n');
        }
    }
    all.replace("extern \"C\" {", " ")
}

/// Splits at commas outside brackets (the `>` of `->` closes none).
fn split_top(list: &str) -> Vec<String> {
    let (mut depth, mut parts, mut current) = (0i32, Vec::new(), String::new());
    let mut previous = ' ';
    for c in list.chars() {
        let arrow = previous == '-';
        previous = c;
        match c {
            '(' | '<' | '[' => depth += 1,
            '>' if arrow => {}
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(current.trim().to_string());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        parts.push(current.trim().to_string());
    }
    parts
}

const C_WORDS: &[&str] = &["unsigned", "signed", "int", "long", "short", "char", "float", "double", "void", "bool", "_Bool"];

/// A C type (with or without a parameter name) in bindgen's Rust spelling.
fn c_type(decl: &str) -> String {
    let decl = decl.trim();
    // A function pointer: `ret (*name)(params)`.
    if let Some(c) = C_FN_PTR.captures(decl) {
        return format!("Option<fn({}){}>", c_params(&c[2]).join(","), c_return(&c[1]));
    }
    let tokens: Vec<String> = C_TOKEN
        .find_iter(decl)
        .map(|m| m.as_str().to_string())
        .collect();
    let mut base_words = Vec::new();
    let mut base_const = false;
    let mut pointers: Vec<bool> = Vec::new(); // per `*`: whether a `const` follows it
    let mut named_base = false;
    for token in &tokens {
        match token.as_str() {
            "const" if pointers.is_empty() => base_const = true,
            "const" => *pointers.last_mut().unwrap() = true,
            "*" => pointers.push(false),
            word if pointers.is_empty() && C_WORDS.contains(&word) && !named_base => base_words.push(word.to_string()),
            word if pointers.is_empty() && base_words.is_empty() => {
                base_words.push(word.to_string());
                named_base = true;
            }
            _ => {} // the parameter's name
        }
    }
    let base = match base_words.join(" ").as_str() {
        "int" | "signed int" => "c_int".to_string(),
        "unsigned int" | "unsigned" => "c_uint".into(),
        "char" => "c_char".into(),
        "long" => "c_long".into(),
        "unsigned long" => "c_ulong".into(),
        "long long" => "c_longlong".into(),
        "unsigned long long" => "c_ulonglong".into(),
        "float" => "f32".into(),
        "double" => "f64".into(),
        "bool" | "_Bool" => "bool".into(),
        "void" if !pointers.is_empty() => "c_void".into(),
        "void" => "()".into(),
        "size_t" | "uintptr_t" => "usize".into(),
        "int8_t" => "i8".into(),
        "int16_t" => "i16".into(),
        "int32_t" => "i32".into(),
        "int64_t" => "i64".into(),
        "uint8_t" => "u8".into(),
        "uint16_t" => "u16".into(),
        "uint32_t" => "u32".into(),
        "uint64_t" => "u64".into(),
        other => other.to_string(),
    };
    let mut rust = base;
    let mut pointee_const = base_const;
    for is_const in pointers {
        rust = format!("*{} {rust}", if pointee_const { "const" } else { "mut" });
        pointee_const = is_const;
    }
    rust
}

fn c_params(list: &str) -> Vec<String> {
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return Vec::new();
    }
    split_top(list).iter().map(|p| if p == "..." { "...".to_string() } else { c_type(p) }).collect()
}

fn c_return(ret: &str) -> String {
    match c_type(ret).as_str() {
        "()" => String::new(),
        other => format!("->{other}"),
    }
}

/// A Rust type from the bindings, with paths dropped: `::std::os::raw::c_int` → `c_int`.
fn rust_type(ty: &str) -> String {
    let ty = ty.trim().replace("::std::os::raw::", "").replace("::std::option::", "").replace("core::ffi::", "");
    if let Some(c) = RUST_FN_PTR.captures(&ty) {
        let ret = c.get(3).map(|r| format!("->{}", rust_type(r.as_str()))).unwrap_or_default();
        return format!("Option<fn({}){ret}>", rust_params(&c[1]).join(","));
    }
    SPACES.replace_all(&ty, " ").to_string()
}

fn rust_params(list: &str) -> Vec<String> {
    split_top(list)
        .iter()
        .map(|p| match p.split_once(':') {
            Some((_, ty)) => rust_type(ty),
            None => p.trim().to_string(), // `...`
        })
        .collect()
}

/// Function name → normalised signature `(params)->ret`.
fn header_functions(text: &str) -> BTreeMap<String, String> {
    let flat = text.replace('\n', " ");
    // A declaration is a whole statement `ret name(params)`; statements end at `;`, `{` or `}`.
    let decl = Regex::new(r"^\s*([^()]*?)\b(_?mlx_\w+)\s*\((.*)\)\s*$").unwrap();
    flat.split([';', '{', '}'])
        .filter_map(|statement| decl.captures(statement))
        .filter(|c| !c[1].contains("typedef"))
        .map(|c| (c[2].to_string(), format!("({}){}", c_params(&c[3]).join(","), c_return(&c[1]))))
        .collect()
}

/// The bindings on one line, without the trailing commas of bindgen's multi-line lists.
fn flatten(bindings: &str) -> String {
    Regex::new(r",\s*([)>}])").unwrap().replace_all(&bindings.replace('\n', " "), "$1").to_string()
}

fn binding_functions(text: &str) -> BTreeMap<String, String> {
    let flat = flatten(text);
    let decl = Regex::new(r"pub fn (\w+)\s*\(").unwrap();
    let mut found = BTreeMap::new();
    for c in decl.captures_iter(&flat) {
        // The parameter list runs to the matching parenthesis; the return type to the `;`.
        let start = c.get(0).unwrap().end();
        let mut depth = 1;
        let mut end = start;
        for (i, ch) in flat[start..].char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = start + i;
                break;
            }
        }
        let rest = &flat[end + 1..];
        let ret = rest[..rest.find(';').unwrap()].trim();
        let ret = ret.strip_prefix("->").map(|r| format!("->{}", rust_type(r))).unwrap_or_default();
        found.insert(c[1].to_string(), format!("({}){ret}", rust_params(&flat[start..end]).join(",")));
    }
    found
}

#[test]
fn every_header_function_is_bound_with_its_signature() {
    let headers = header_functions(&headers_text());
    let bindings = binding_functions(&bindings_text());
    assert!(headers.len() > 600, "found only {} functions in the headers", headers.len());
    let missing: Vec<_> = headers.keys().filter(|k| !bindings.contains_key(*k)).collect();
    let extra: Vec<_> = bindings.keys().filter(|k| !headers.contains_key(*k)).collect();
    assert!(missing.is_empty(), "functions in mlx-c's headers but not in bindings.rs: {missing:?}");
    assert!(extra.is_empty(), "functions in bindings.rs but not in mlx-c's headers: {extra:?}");
    let differing: Vec<String> = headers
        .iter()
        .filter(|(name, sig)| bindings[*name] != **sig)
        .map(|(name, sig)| format!("{name}: header {sig}, bindings {}", bindings[name]))
        .collect();
    assert!(differing.is_empty(), "{} signatures differ:\n{}", differing.len(), differing.join("\n"));
}

#[test]
fn enum_constants_and_structs_match_the_headers() {
    let headers = headers_text();
    let bindings = bindings_text();
    let enum_re = Regex::new(r"enum\s+(\w+)\s*\{([^}]*)\}").unwrap();
    let mut constants = 0;
    for c in enum_re.captures_iter(&headers) {
        let name = &c[1];
        let mut next = 0i64;
        for item in split_top(&c[2]) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim().to_string(), v.trim().parse::<i64>().expect("enum value")),
                None => (item.trim().to_string(), next),
            };
            next = value + 1;
            let line = format!("pub const {name}_{key}: {name} = {value};");
            assert!(bindings.contains(&line), "bindings.rs lacks `{line}`");
            constants += 1;
        }
    }
    assert!(constants > 20, "found only {constants} enum constants in the headers");
    assert_eq!(constants, bindings.matches("\npub const ").count(), "bindings.rs declares constants the headers lack");

    let struct_re = Regex::new(r"struct\s+(\w+)\s*\{([^}]*)\}").unwrap();
    let flat = flatten(&bindings);
    let mut structs = 0;
    for c in struct_re.captures_iter(&headers) {
        let name = &c[1];
        let fields: Vec<String> = c[2]
            .split(';')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| {
                let c = FIELD_NAME.captures(f).expect("field name");
                let field = c.get(1).or(c.get(2)).unwrap().as_str();
                format!("{field}:{}", c_type(f))
            })
            .collect();
        let rust = Regex::new(&format!(r"pub struct {name} \{{([^}}]*)\}}")).unwrap();
        let body = rust.captures(&flat).unwrap_or_else(|| panic!("bindings.rs lacks struct {name}"));
        let rust_fields: Vec<String> = split_top(&body[1])
            .iter()
            .map(|f| {
                let (field, ty) = f.trim().trim_start_matches("pub ").split_once(':').expect("field");
                format!("{}:{}", field.trim(), rust_type(ty))
            })
            .collect();
        assert_eq!(fields, rust_fields, "struct {name}");
        structs += 1;
    }
    assert!(structs > 30, "found only {structs} structs in the headers");
    assert_eq!(structs, Regex::new(r"\npub struct _?mlx_").unwrap().find_iter(&bindings).count(), "bindings.rs declares structs the headers lack");
}

/// The translation itself, on declarations of each shape the headers use.
#[test]
fn c_declarations_translate_as_bindgen_writes_them() {
    assert_eq!(c_type("const mlx_array a"), "mlx_array");
    assert_eq!(c_type("mlx_array* res"), "*mut mlx_array");
    assert_eq!(c_type("const int* shape"), "*const c_int");
    assert_eq!(c_type("const char** keys"), "*mut *const c_char");
    assert_eq!(c_type("unsigned long long x"), "c_ulonglong");
    assert_eq!(c_type("size_t"), "usize");
    assert_eq!(c_type("void (*dtor)(void*)"), "Option<fn(*mut c_void)>");
    assert_eq!(
        rust_type(r#"::std::option::Option<unsafe extern "C" fn(arg1: *mut ::std::os::raw::c_void)>"#),
        "Option<fn(*mut c_void)>"
    );
    let sig = header_functions("int mlx_f(int (*fun)(mlx_array*, const mlx_array), void* p);\nvoid mlx_g(void);");
    assert_eq!(sig["mlx_f"], "(Option<fn(*mut mlx_array,mlx_array)->c_int>,*mut c_void)->c_int");
    assert_eq!(sig["mlx_g"], "()");
}
