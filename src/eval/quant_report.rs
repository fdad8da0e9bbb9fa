//! How much quantization changed a model: the same fixed prompts through the source and the
//! quantized model, comparing every layer's output and the final distributions.

use crate::engine::error::Result;
use crate::engine::model::{LanguageModel, Logits, Trace};
use crate::engine::ops::to_vec_f32;
use crate::engine::tokenizer::{Message, TextTokenizer};
use crate::eval::report::Report;
use mlx_rs::Array;
use rand::{Rng, SeedableRng};

/// Texts covering prose, code, arithmetic and a chat turn.
const PROMPTS: [&str; 3] = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Question: A train travels 60 km in 45 minutes. What is its average speed in km/h?\nAnswer:",
];
const CHAT_PROMPT: &str = "Write a haiku about the sea.";

/// The fixed prompt set as token ids (random ids with a fixed seed when there is no tokenizer).
pub fn prompts(tokenizer: Option<&TextTokenizer>, vocab: usize) -> Result<Vec<Vec<u32>>> {
    match tokenizer {
        Some(tok) => {
            let mut out = PROMPTS.iter().map(|p| tok.encode(p)).collect::<Result<Vec<_>>>()?;
            out.push(tok.encode(&tok.apply_chat_template(&[Message::new("user", CHAT_PROMPT)], false)?)?);
            Ok(out)
        }
        None => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            Ok((0..4).map(|_| (0..32).map(|_| rng.random_range(0..vocab as u32)).collect()).collect())
        }
    }
}

/// One prompt's per-layer outputs and logits, on the host.
pub struct Outputs {
    layers: Vec<Vec<f32>>,
    logits: Vec<f32>,
    vocab: usize,
}

pub fn run(model: &dyn LanguageModel, prompts: &[Vec<u32>]) -> Result<Vec<Outputs>> {
    prompts
        .iter()
        .map(|ids| {
            let input = Array::from_slice(&ids.iter().map(|&i| i as i32).collect::<Vec<_>>(), &[1, ids.len() as i32]);
            let mut cache = model.new_cache();
            let mut trace = Trace::default();
            let logits = model.forward(&input, &mut cache, Logits::All, Some(&mut trace))?;
            let mut layers = Vec::new();
            while let Some(h) = trace.get(&format!("hidden.layer_out.{}", layers.len())) {
                layers.push(to_vec_f32(h)?);
            }
            Ok(Outputs { layers, logits: to_vec_f32(&logits)?, vocab: model.info().vocab_size })
        })
        .collect()
}

#[derive(Debug, Clone, Default)]
pub struct ErrorStats {
    pub max_abs: f64,
    sum_abs: f64,
    sum_ref: f64,
    count: usize,
}

impl ErrorStats {
    fn add(&mut self, reference: &[f32], other: &[f32]) {
        for (a, b) in reference.iter().zip(other) {
            let d = (*a as f64 - *b as f64).abs();
            self.max_abs = self.max_abs.max(d);
            self.sum_abs += d;
            self.sum_ref += (*a as f64).abs();
        }
        self.count += reference.len();
    }
    pub fn mean_abs(&self) -> f64 {
        self.sum_abs / self.count.max(1) as f64
    }
    /// Mean |Δ| relative to the mean |reference|.
    pub fn relative(&self) -> f64 {
        self.sum_abs / self.sum_ref.max(f64::MIN_POSITIVE)
    }
}

pub struct Comparison {
    pub layers: Vec<ErrorStats>,
    pub logits: ErrorStats,
    /// Mean and max KL(reference ‖ quantized) over all positions, in nats.
    pub kl_mean: f64,
    pub kl_max: f64,
    /// Fraction of positions whose most likely token is the same.
    pub top1_agreement: f64,
    pub positions: usize,
}

pub fn compare(reference: &[Outputs], other: &[Outputs]) -> Comparison {
    let n_layers = reference.first().map_or(0, |o| o.layers.len());
    let mut layers = vec![ErrorStats::default(); n_layers];
    let mut logits = ErrorStats::default();
    let (mut kl_sum, mut kl_max, mut agree, mut positions) = (0.0, 0.0f64, 0, 0);
    for (r, o) in reference.iter().zip(other) {
        for (stats, (a, b)) in layers.iter_mut().zip(r.layers.iter().zip(&o.layers)) {
            stats.add(a, b);
        }
        logits.add(&r.logits, &o.logits);
        for (p, q) in r.logits.chunks(r.vocab).zip(o.logits.chunks(o.vocab)) {
            let kl = kl_divergence(p, q);
            kl_sum += kl;
            kl_max = kl_max.max(kl);
            agree += usize::from(argmax(p) == argmax(q));
            positions += 1;
        }
    }
    Comparison {
        layers,
        logits,
        kl_mean: kl_sum / positions.max(1) as f64,
        kl_max,
        top1_agreement: agree as f64 / positions.max(1) as f64,
        positions,
    }
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// KL(p ‖ q) of two logit rows.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>().max(0.0)
}

fn argmax(x: &[f32]) -> usize {
    x.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i)
}

impl Comparison {
    pub fn report(&self) -> Report {
        let mut r = Report::new(&["output", "max |Δ|", "mean |Δ|", "mean |Δ| / mean |ref|", "KL mean", "KL max", "top-1 agree"]);
        let fmt = |v: f64| format!("{v:.3e}");
        for (i, s) in self.layers.iter().enumerate() {
            r.push(vec![format!("layer {i}"), fmt(s.max_abs), fmt(s.mean_abs()), format!("{:.4}", s.relative()), String::new(), String::new(), String::new()]);
        }
        let s = &self.logits;
        r.push(vec![
            "logits".into(),
            fmt(s.max_abs),
            fmt(s.mean_abs()),
            format!("{:.4}", s.relative()),
            format!("{:.5}", self.kl_mean),
            format!("{:.5}", self.kl_max),
            format!("{:.2}%", 100.0 * self.top1_agreement),
        ]);
        r
    }
}
