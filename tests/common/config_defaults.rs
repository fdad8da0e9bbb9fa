//! Removes each config key a family gives a default to, in turn, and checks that the model then
//! behaves as with the default written out: a key whose value already is the default gives the
//! very same logits as the full config; one whose value differs gives the same logits (or the same
//! refusal) as the config with the default written in. Required keys are refused by name.

use mlx_rs::{Array, Dtype};
use sala::engine::config::{Fallback, KeyDefault};
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;
use sala::engine::source::ModelSource;
use serde_json::Value;
use std::path::Path;

/// What the model at `dir` gives with `config` as its config.json: float32 logits for `ids`,
/// or the refusal's message.
pub fn outcome(dir: &Path, config: &Value, ids: &[u32]) -> Result<Vec<f32>, String> {
    let mut source = sala::models::open(dir).map_err(|e| e.to_string())?;
    source.files.insert("config.json".into(), config.to_string());
    logits(&mut source, ids).map_err(|e| e.to_string())
}

fn logits(source: &mut ModelSource, ids: &[u32]) -> sala::engine::error::Result<Vec<f32>> {
    let cfg = source.config()?;
    let model = sala::models::build(&cfg, &mut source.weights, Some(Dtype::Float32), &Default::default())?;
    let input: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    let out = model.forward(&Array::from_slice(&input, &[1, ids.len() as i32]), &mut model.new_cache(), Logits::All, None)?;
    Ok(to_vec_f32(&out)?)
}

fn get<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    match key.split_once('.') {
        Some((outer, inner)) => config.get(outer)?.get(inner),
        None => config.get(key),
    }
}

fn set(config: &mut Value, key: &str, value: Option<Value>) {
    let (parent, leaf) = match key.split_once('.') {
        Some((outer, inner)) => (&mut config[outer], inner),
        None => (config, key),
    };
    let object = parent.as_object_mut().expect("an object");
    match value {
        Some(v) => object.insert(leaf.to_string(), v),
        None => object.remove(leaf),
    };
}

/// JSON values equal as a config reader sees them (12 and 12.0 are one number).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The value a `Computed` key takes (the rules docs/config-defaults.md states).
fn computed(key: &str, config: &Value, has_lm_head: bool) -> Option<Value> {
    let n = |k: &str| config.get(k).and_then(Value::as_u64);
    match key {
        "head_dim" => Some((n("hidden_size")? / n("num_attention_heads")?).into()),
        "rope_theta" => Some(config.get("rope_parameters").and_then(|p| p.get("rope_theta")).cloned().unwrap_or(10000.0.into())),
        // Whatever the class default, the checkpoint settles it: no lm_head.weight means tied.
        "tie_word_embeddings" => Some(Value::Bool(!has_lm_head)),
        _ => None,
    }
}

/// Checks every entry of `table` on the model at `dir` (its weights with `config`), forwarding
/// `ids`; returns how many keys were checked by logits, by equal outcome, and as required.
pub fn check_each_key(dir: &Path, config: &Value, table: &[KeyDefault], ids: &[u32]) -> (usize, usize, usize) {
    let full = outcome(dir, config, ids).expect("the full config loads");
    let has_lm_head = sala::models::open(dir).unwrap().weights.infos().contains_key("lm_head.weight");
    let (mut by_logits, mut by_outcome, mut required) = (0, 0, 0);
    for entry in table {
        let mut removed = config.clone();
        if get(config, entry.key).is_none() {
            continue;
        }
        set(&mut removed, entry.key, None);
        let default = match entry.fallback {
            Fallback::Json(text) => serde_json::from_str::<Value>(text).unwrap(),
            Fallback::SameAs(other) => get(config, other).cloned().expect("the key it follows is set"),
            Fallback::Computed(_) => computed(entry.key, config, has_lm_head).unwrap_or_else(|| panic!("no rule for computed key {}", entry.key)),
            Fallback::Off => Value::Null,
            Fallback::Required => {
                let message = outcome(dir, &removed, ids).expect_err(entry.key);
                assert!(message.contains(&format!("`{}`", entry.key)) && message.contains("no default"), "{}: {message}", entry.key);
                required += 1;
                continue;
            }
        };
        let got = outcome(dir, &removed, ids);
        if same(&config_value(config, entry.key), &default) {
            assert_eq!(got.as_ref().ok(), Some(&full), "{}: removing it (its value is the default) changed the logits: {got:?}", entry.key);
            by_logits += 1;
        } else {
            let mut written = config.clone();
            set(&mut written, entry.key, Some(default.clone()));
            let want = outcome(dir, &written, ids);
            assert_eq!(got, want, "{}: removing it differs from writing its default {default}", entry.key);
            by_outcome += 1;
        }
    }
    (by_logits, by_outcome, required)
}

fn config_value(config: &Value, key: &str) -> Value {
    get(config, key).cloned().unwrap_or(Value::Null)
}
