//! `generation_config.json`: the sampling settings a model ships with and the tokens that end its
//! answers. As in vLLM and ollama, its temperature, top_p, top_k, min_p and repetition_penalty
//! are the defaults when neither a flag nor the request sets them (`do_sample` is not consulted,
//! as vLLM does not), and its `eos_token_id` list adds to the config's.

use super::config::ConfigFile;
use super::error::Result;
use super::sampler::SamplingParams;

pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The model's own sampling defaults and end tokens; no defaults where its file is silent (or
/// it has no file).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerationDefaults {
    #[serde(flatten)]
    pub sampling: SamplingChoice,
    /// End-of-sequence tokens it names (added to the config's).
    pub eos_token_ids: Vec<u32>,
}

impl GenerationDefaults {
    /// A model without `generation_config.json`.
    pub const NONE: GenerationDefaults = GenerationDefaults { sampling: SamplingChoice::NONE, eos_token_ids: Vec::new() };

    /// Each value is checked as the matching flag is (`SamplingParams::validate`): out of range,
    /// the key is named.
    pub fn parse(file: &ConfigFile) -> Result<Self> {
        let number = |key: &str| file.opt(key).map(|_| file.f64(key).map(|v| v as f32)).transpose();
        let sampling = SamplingChoice {
            temperature: number("temperature")?,
            top_p: number("top_p")?,
            top_k: file.opt("top_k").map(|_| file.usize("top_k")).transpose()?,
            min_p: number("min_p")?,
            repetition_penalty: number("repetition_penalty")?,
        };
        sampling.apply(SamplingParams::default()).validate().map_err(|e| file.invalid(e.field, e.rule))?;
        let eos_token_ids = match file.opt("eos_token_id") {
            Some(_) => file.token_ids("eos_token_id")?,
            None => Vec::new(),
        };
        Ok(Self { sampling, eos_token_ids })
    }

    /// `params` with each setting the caller left unset (`None` in `set`) taken from the model,
    /// else kept as `params` has it (the caller's own default).
    pub fn fill(&self, params: SamplingParams, set: &SamplingChoice) -> SamplingParams {
        set.or(&self.sampling).apply(params)
    }
}

/// Sampling settings that may each be left unset: what a user (flag) or a request (field) set
/// explicitly, or what a model's `generation_config.json` gives.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SamplingChoice {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl SamplingChoice {
    pub const NONE: SamplingChoice = SamplingChoice { temperature: None, top_p: None, top_k: None, min_p: None, repetition_penalty: None };

    /// Each setting given here, else `fallback`'s.
    pub fn or(&self, fallback: &SamplingChoice) -> SamplingChoice {
        SamplingChoice {
            temperature: self.temperature.or(fallback.temperature),
            top_p: self.top_p.or(fallback.top_p),
            top_k: self.top_k.or(fallback.top_k),
            min_p: self.min_p.or(fallback.min_p),
            repetition_penalty: self.repetition_penalty.or(fallback.repetition_penalty),
        }
    }

    /// `params` with each setting given here.
    pub fn apply(&self, params: SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(params.temperature),
            top_p: self.top_p.unwrap_or(params.top_p),
            top_k: self.top_k.unwrap_or(params.top_k),
            min_p: self.min_p.unwrap_or(params.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(params.repetition_penalty),
            ..params
        }
    }

    /// Each setting by its name, for `sala show`.
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
        let sampling = SamplingChoice { temperature: Some(0.6), top_p: Some(0.9), top_k: Some(20), min_p: None, repetition_penalty: Some(1.05) };
        assert_eq!(d, GenerationDefaults { sampling, eos_token_ids: vec![2, 73440] });
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
