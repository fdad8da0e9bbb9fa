//! Token sampling on host-side float32 logits: logit bias, repetition penalty (llama.cpp style) and
//! frequency/presence penalties (OpenAI style) over the generated tokens, then greedy
//! (temperature 0) or temperature + top-k + top-p + min-p, drawn from a seeded generator.

use super::device_sampler::DrawKey;
use super::error::Result;
use super::grammar::{Constraint, TokenMask};
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches this (1 = off).
    pub top_p: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Drop tokens less likely than min_p × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this (1 = off).
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repetition_window: usize,
    /// Subtracted once per occurrence of a token already generated (OpenAI `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Subtracted once from every token already generated (OpenAI `presence_penalty`).
    pub presence_penalty: f32,
    /// Added to the logits of these tokens (OpenAI `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_window: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

/// A sampling setting out of range: which one (by its command-line flag and its API field) and
/// what it must be. Shown as the flag; the server names the request field instead.
#[derive(Debug, Clone, PartialEq)]
pub struct InvalidSampling {
    pub flag: &'static str,
    pub field: &'static str,
    /// "must be …", with the value given.
    pub rule: String,
}

impl std::fmt::Display for InvalidSampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.flag, self.rule)
    }
}

impl SamplingParams {
    /// Checks ranges; the error names the setting.
    pub fn validate(&self) -> Result<(), InvalidSampling> {
        let bad = |flag, field, rule: String| Err(InvalidSampling { flag, field, rule });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("--temperature", "temperature", format!("must be ≥ 0 (got {})", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("--top-p", "top_p", format!("must be in (0, 1] (got {})", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("--min-p", "min_p", format!("must be in [0, 1] (got {})", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("--repeat-penalty", "repetition_penalty", format!("must be > 0 (got {})", self.repetition_penalty));
        }
        for (field, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(field, field, format!("must be in [-2, 2] (got {v})"));
            }
        }
        if let Some((id, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return bad("logit_bias", "logit_bias", format!("for token {id} must be in [-100, 100] (got {b})"));
        }
        Ok(())
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// What the answer must match, followed token by token.
    constraint: Option<Constraint>,
    /// The constraint's allowed tokens for the next draw, worked out ahead.
    mask: Option<TokenMask>,
    /// Draws on the device: the seed their keys come from, and how many were made.
    seed: u64,
    draws: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rand::random);
        let rng = StdRng::seed_from_u64(seed);
        Self { params, rng, constraint: None, mask: None, seed, draws: 0 }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next draw on the device (the seed and the draws made; its key is their hash), so a
    /// seeded sampler draws the same tokens from the same logits in any batch.
    pub fn next_key(&mut self) -> DrawKey {
        self.draws += 1;
        DrawKey::new(self.seed, self.draws - 1)
    }

    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// The constraint's allowed tokens for the next draw (worked out now unless
    /// [`Sampler::prepare`] did already); `None` when unconstrained.
    pub fn take_mask(&mut self) -> Result<Option<TokenMask>> {
        self.prepare()?;
        Ok(self.mask.take())
    }

    /// Records a token drawn elsewhere (on the device) in the constraint.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        match self.constraint.as_mut() {
            Some(constraint) => constraint.commit(token),
            None => Ok(()),
        }
    }

    /// Draws only what keeps the answer valid under `constraint`.
    pub fn constrained(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Works out which tokens the next draw may take (a no-op unless constrained); callers run
    /// it while the device computes the logits, so the mask costs no device time.
    pub fn prepare(&mut self) -> Result<()> {
        if let (Some(constraint), None) = (self.constraint.as_mut(), &self.mask) {
            self.mask = Some(constraint.mask()?);
        }
        Ok(())
    }

    /// Picks the next token from `logits` (one row, float32) given the tokens so far (`history`:
    /// the prompt and what was generated, the last `generated` of them generated).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.draw(logits, history, 0, None)
    }

    /// [`Sampler::sample`] with frequency/presence penalties over the last `generated` tokens,
    /// and under the constraint if there is one (the token drawn is then recorded in it).
    pub fn sample_with(&mut self, logits: &[f32], history: &[u32], generated: usize) -> Result<u32> {
        self.prepare()?;
        let mask = self.mask.take();
        let token = self.draw(logits, history, generated, mask.as_ref());
        if let Some(constraint) = self.constraint.as_mut() {
            constraint.commit(token)?;
        }
        Ok(token)
    }

    fn draw(&mut self, logits: &[f32], history: &[u32], generated: usize, allowed: Option<&TokenMask>) -> u32 {
        let mut logits = logits.to_vec();
        if let Some(mask) = allowed {
            mask.apply(&mut logits);
        }
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            let mut counts: std::collections::HashMap<u32, f32> = std::collections::HashMap::new();
            for &id in &history[history.len().saturating_sub(generated)..] {
                *counts.entry(id).or_default() += 1.0;
            }
            for (id, n) in counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= n * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        if p.repetition_penalty != 1.0 {
            let start = history.len().saturating_sub(p.repetition_window);
            let mut seen: Vec<u32> = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.temperature == 0.0 {
            return argmax(&logits);
        }
        // Candidates sorted by logit (descending; ties to the lower id). With top-k only the k best
        // are sorted, after an O(vocab) selection (a full sort of the vocabulary costs
        // milliseconds a token).
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        if p.top_k > 0 && p.top_k < order.len() {
            order.select_nth_unstable_by(p.top_k - 1, by_logit);
            order.truncate(p.top_k);
        }
        order.sort_unstable_by(by_logit);
        let max = logits[order[0] as usize];
        let mut probs: Vec<f32> =
            order.iter().map(|&id| ((logits[id as usize] - max) / p.temperature).exp()).collect();
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cumulative = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    cumulative += x;
                    cumulative >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            order.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p;
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
            order.truncate(keep);
        }
        let total: f32 = probs.iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, &x) in probs.iter().enumerate() {
            if r < x {
                return order[i];
            }
            r -= x;
        }
        *order.last().expect("at least one candidate")
    }
}

/// Index of the largest value; the lowest index among equals (like numpy/torch).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, seed: Some(7), ..Default::default() }
    }

    #[test]
    fn greedy_takes_first_maximum() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_can_flip_greedy_choice() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..params(0.0) });
        assert_eq!(s.sample(&[1.0, 1.5, 0.0], &[1]), 0); // 1.5 / 2 = 0.75 < 1.0
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_head() {
        let logits = [0.0, 2.0, 1.9, -5.0];
        let mut s = Sampler::new(SamplingParams { top_k: 1, ..params(1.0) });
        assert!((0..50).all(|_| s.sample(&logits, &[]) == 1));
        let mut s = Sampler::new(SamplingParams { top_p: 0.3, ..params(1.0) });
        assert!((0..50).all(|_| s.sample(&logits, &[]) == 1));
    }

    #[test]
    fn min_p_drops_unlikely_tokens_and_seed_repeats() {
        let logits = [5.0, 4.9, -10.0, -10.0];
        let mut s = Sampler::new(SamplingParams { min_p: 0.5, ..params(1.0) });
        let draws: Vec<u32> = (0..200).map(|_| s.sample(&logits, &[])).collect();
        assert!(draws.iter().all(|&t| t < 2));
        assert!(draws.contains(&0) && draws.contains(&1));
        let mut again = Sampler::new(SamplingParams { min_p: 0.5, ..params(1.0) });
        let repeat: Vec<u32> = (0..200).map(|_| again.sample(&logits, &[])).collect();
        assert_eq!(draws, repeat);
    }

    #[test]
    fn logit_bias_and_openai_penalties() {
        let mut s = Sampler::new(SamplingParams { logit_bias: vec![(2, 5.0)], ..params(0.0) });
        assert_eq!(s.sample(&[1.0, 2.0, 0.0], &[]), 2);
        // Token 1 was generated twice: 2.0 − 2·0.4 − 0.3 = 0.9 < 1.0. The prompt does not count.
        let mut s = Sampler::new(SamplingParams { frequency_penalty: 0.4, presence_penalty: 0.3, ..params(0.0) });
        assert_eq!(s.sample_with(&[1.0, 2.0, 0.0], &[1, 1, 1, 1], 2).unwrap(), 0);
        assert_eq!(s.sample_with(&[1.0, 2.0, 0.0], &[1, 1, 1, 1], 1).unwrap(), 1);
        assert!(SamplingParams { presence_penalty: 3.0, ..params(0.0) }.validate().is_err());
    }

    #[test]
    fn temperature_sampling_matches_softmax_frequencies() {
        let logits = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let mut s = Sampler::new(params(1.0));
        let ones = (0..4000).filter(|_| s.sample(&logits, &[]) == 1).count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }
}
