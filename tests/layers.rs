//! The crate's layering (docs/architecture.md): each top-level module of `src/` may name only
//! itself and the modules of the layers below it. Every `crate::…` / `super::…` path in the
//! source, `use` line or not, is checked against the table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Lowest first; modules in one layer are peers and may not name each other.
const LAYERS: &[&[&str]] = &[
    &["progress"],
    &["engine"],
    &["kernels"],
    &["models"],
    &["store"],
    &["load", "launch"],
    &["eval", "server"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The module path of a source file: `src/cli/bench.rs` → `[cli, bench]`, `src/cli/mod.rs` → `[cli]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let file = parts.pop().expect("a file name");
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_string());
    }
    parts
}

/// The first path segment of each item of a `{a::b, c, d::{e}}` group starting at `text[0] == '{'`.
fn group_heads(text: &str) -> Vec<String> {
    let (mut depth, mut item, mut heads) = (0, String::new(), Vec::new());
    for c in text.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth > 1 {
                    item.push(c);
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    heads.push(std::mem::take(&mut item));
                    break;
                }
                item.push(c);
            }
            ',' if depth == 1 => heads.push(std::mem::take(&mut item)),
            _ => item.push(c),
        }
    }
    heads.iter().filter_map(|i| ident_at(i.trim_start())).collect()
}

fn ident_at(text: &str) -> Option<String> {
    let ident: String = text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!ident.is_empty()).then_some(ident)
}

/// The crate's top-level modules that the source `text` of the module at `path` names.
fn named_modules(text: &str, path: &[String]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let bytes = text.as_bytes();
    for (start, _) in text.match_indices("crate::").chain(text.match_indices("super::")) {
        // A whole path: not the tail of a longer identifier (`sala_crate::`) or path (`a::super::`).
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_' || bytes[start - 1] == b':') {
            continue;
        }
        let mut rest = &text[start..];
        let mut depth = path.len();
        if rest.starts_with("crate::") {
            depth = 0;
            rest = &rest["crate::".len()..];
        } else {
            while let Some(tail) = rest.strip_prefix("super::") {
                depth = depth.saturating_sub(1);
                rest = tail;
            }
        }
        if depth > 0 {
            continue; // Still inside this file's own top-level module.
        }
        if rest.starts_with('{') {
            named.extend(group_heads(rest));
        } else if let Some(ident) = ident_at(rest) {
            named.insert(ident);
        }
    }
    named
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `(file, module it names)` that breaks the table, and how many cross-module names were seen.
fn violations() -> (Vec<String>, usize) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let (mut bad, mut seen) = (Vec::new(), 0);
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let path = module_path(relative);
        let Some(top) = path.first().filter(|t| !matches!(t.as_str(), "lib" | "main")) else { continue };
        let Some(own) = layer_of(top) else {
            bad.push(format!("{}: module `{top}` is in no layer; add it to tests/layers.rs and docs/architecture.md", relative.display()));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for named in named_modules(&text, &path) {
            if &named == top {
                continue;
            }
            seen += 1;
            match layer_of(&named) {
                Some(layer) if layer < own => {}
                Some(layer) => bad.push(format!(
                    "{}: `{top}` (layer {own}) names `{named}` (layer {layer}); a module may name only lower layers",
                    relative.display()
                )),
                None => {}
            }
        }
    }
    (bad, seen)
}

#[test]
fn modules_name_only_the_layers_below_them() {
    let (bad, seen) = violations();
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
    // The scan sees the crate's real references (it is not vacuously empty).
    assert!(seen > 50, "only {seen} cross-module references found");
}

#[test]
fn the_scanner_finds_upward_names_in_every_form() {
    let engine = vec!["engine".to_string(), "quant".to_string()];
    let text = "use crate::kernels::qmv;\nfn f() { crate::store::cache::resolve(p) }\nuse crate::{models::x, cli};\nuse super::super::server;\nuse super::ops;\nlet a = not_crate::cli;";
    let named: Vec<_> = named_modules(text, &engine).into_iter().collect();
    assert_eq!(named, ["cli", "kernels", "models", "server", "store"]);
    assert_eq!(module_path(Path::new("cli/mod.rs")), ["cli"]);
    assert_eq!(module_path(Path::new("models/sala/infllm.rs")), ["models", "sala", "infllm"]);
}

#[test]
fn the_engine_knows_no_model_architecture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for word in ["InfLLM", "lightning", "compressed keys", "SalaConfig"] {
            assert!(!text.contains(word), "{} mentions `{word}`: model-specific code belongs in src/models", file.display());
        }
    }
}
