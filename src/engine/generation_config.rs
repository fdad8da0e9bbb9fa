//! `generation_config.json`: the sampling settings a model ships with and the tokens that end its
//! answers. As in vLLM and ollama, its temperature, top_p, top_k, min_p and repetition_penalty
//! are the defaults when neither a flag nor the request sets them (`do_sample` is not consulted,
//! as vLLM does not), and its `eos_token_id` list adds to the config's.

use super::config::ConfigFile;
use super::error::Result;
use super::sampler::SamplingParams;

pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The model's own sampling defaults; `None` where its file is silent (or has no file).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// End-of-sequence tokens it names (added to the config's).
    pub eos_token_ids: Vec<u32>,
}

impl GenerationDefaults {
    /// A model without `generation_config.json`.
    pub const NONE: GenerationDefaults =
        GenerationDefaults { temperature: None, top_p: None, top_k: None, min_p: None, repetition_penalty: None, eos_token_ids: Vec::new() };

    /// Each value is checked as the matching flag is: out of range, the key is named.
    pub fn parse(file: &ConfigFile) -> Result<Self> {
        let number = |key: &str, ok: fn(f64) -> bool, rule: &str| -> Result<Option<f32>> {
            match file.opt(key) {
                None => Ok(None),
                Some(_) => {
                    let v = file.f64(key)?;
                    if ok(v) {
                        Ok(Some(v as f32))
                    } else {
                        Err(file.invalid(key, format!("{v}: {rule}")))
                    }
                }
            }
        };
        let defaults = Self {
            temperature: number("temperature", |v| v.is_finite() && v >= 0.0, "must be ≥ 0")?,
            top_p: number("top_p", |v| v > 0.0 && v <= 1.0, "must be in (0, 1]")?,
            top_k: file.opt("top_k").map(|_| file.usize("top_k")).transpose()?,
            min_p: number("min_p", |v| (0.0..=1.0).contains(&v), "must be in [0, 1]")?,
            repetition_penalty: number("repetition_penalty", |v| v.is_finite() && v > 0.0, "must be > 0")?,
            eos_token_ids: match file.opt("eos_token_id") {
                Some(_) => file.token_ids("eos_token_id")?,
                None => Vec::new(),
            },
        };
        Ok(defaults)
    }

    /// `params` with each setting the caller left unset (`None` in `set`) taken from the model,
    /// else kept as `params` has it (the caller's own default).
    pub fn fill(&self, params: SamplingParams, set: &SamplingChoice) -> SamplingParams {
        SamplingParams {
            temperature: set.temperature.or(self.temperature).unwrap_or(params.temperature),
            top_p: set.top_p.or(self.top_p).unwrap_or(params.top_p),
            top_k: set.top_k.or(self.top_k).unwrap_or(params.top_k),
            min_p: set.min_p.or(self.min_p).unwrap_or(params.min_p),
            repetition_penalty: set.repetition_penalty.or(self.repetition_penalty).unwrap_or(params.repetition_penalty),
            ..params
        }
    }

    /// Each setting with where it comes from, for `sala show`.
    pub fn describe(&self) -> Vec<(&'static str, Option<String>)> {
        vec![
            ("temperature", self.temperature.map(|v| v.to_string())),
            ("top_p", self.top_p.map(|v| v.to_string())),
            ("top_k", self.top_k.map(|v| v.to_string())),
            ("min_p", self.min_p.map(|v| v.to_string())),
            ("repetition_penalty", self.repetition_penalty.map(|v| v.to_string())),
        ]
    }
}

/// The sampling settings a user (flag) or a request (field) set explicitly; `None` = left to the
/// model's defaults, then the caller's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingChoice {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<GenerationDefaults> {
        GenerationDefaults::parse(&ConfigFile::parse(Path::new("generation_config.json"), text)?)
    }

    #[test]
    fn reads_the_sampling_keys_and_the_eos_list() {
        let d = parse(r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "eos_token_id": [2, 73440], "bos_token_id": 1}"#).unwrap();
        assert_eq!(
            d,
            GenerationDefaults { temperature: Some(0.6), top_p: Some(0.9), top_k: Some(20), min_p: None, repetition_penalty: Some(1.05), eos_token_ids: vec![2, 73440] }
        );
        assert_eq!(parse(r#"{"eos_token_id": 7}"#).unwrap().eos_token_ids, vec![7]);
        assert_eq!(parse("{}").unwrap(), GenerationDefaults::default());
    }

    #[test]
    fn a_value_out_of_range_is_refused_by_name() {
        for (text, key) in [(r#"{"temperature": -1}"#, "temperature"), (r#"{"top_p": 0}"#, "top_p"), (r#"{"top_k": -3}"#, "top_k"), (r#"{"top_p": "high"}"#, "top_p"), (r#"{"eos_token_id": "x"}"#, "eos_token_id")] {
            let message = parse(text).unwrap_err().to_string();
            assert!(message.contains(&format!("`{key}`")) && message.contains("generation_config.json"), "{text}: {message}");
        }
    }

    #[test]
    fn a_choice_wins_over_the_model_which_wins_over_the_callers_default() {
        let model = parse(r#"{"temperature": 0.6, "top_p": 0.9}"#).unwrap();
        let base = SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 40, ..Default::default() };
        let p = model.fill(base.clone(), &SamplingChoice::default());
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.6, 0.9, 40));
        let p = model.fill(base, &SamplingChoice { temperature: Some(0.0), ..Default::default() });
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.0, 0.9, 40));
    }
}
