//! Log-probabilities of tokens under the model's own distribution: the log-softmax of the raw
//! logits, before logit bias, penalties, a grammar's mask, temperature or top-k/top-p filtering
//! (what OpenAI's `logprobs` report). One row on the host for generated tokens; a whole prompt
//! chunk on the device for scoring a prompt (`echo` with `logprobs`).

use super::error::{Error, Result};
use super::ops::{to_vec_f32, to_vec_i32};
use mlx_rs::ops::indexing::{take_along_axis, TryIndexOp};
use mlx_rs::{Array, Dtype};

/// The most alternatives a request may ask for (OpenAI's chat limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token's log-probability at one position, with the most likely tokens there.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    /// ln p(token) under the model's distribution at this position.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties: lower id).
    pub top: Vec<(u32, f32)>,
}

/// `token`'s log-probability in one row of float32 logits, and the `top` most likely tokens.
pub fn from_row(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Summed in f64 so a 150k-token vocabulary loses no precision.
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let logprob = |l: f32| (l as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in logits.iter().enumerate() {
            // Kept sorted, most likely first; a later id never displaces an equal earlier one.
            if best.len() == top && best.last().is_some_and(|&(_, worst)| l <= worst) {
                continue;
            }
            let at = best.partition_point(|&(_, v)| v >= l);
            best.insert(at, (id as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: best.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
    }
}

/// Scores a prompt chunk on the device: `logits` `[T, vocab]` float32, row i the distribution
/// after the chunk's token i; `next[i]` the token that follows it (rows past `next.len()`, e.g.
/// the last row of a whole prompt, are not scored). Only the chosen and top `top` values come
/// to the host.
pub fn for_rows(logits: &Array, next: &[u32], top: usize) -> Result<Vec<TokenLogprobs>> {
    let n = next.len();
    let rows = logits.shape().first().copied().unwrap_or(0) as usize;
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > rows {
        return Err(Error::Usage(format!("scoring {n} tokens needs as many logits rows; the forward gave {rows}")));
    }
    let vocab = logits.shape()[1];
    let scored = logits.try_index((0..n as i32, ..))?.as_dtype(Dtype::Float32)?;
    let logp = scored.subtract(scored.logsumexp_axis(-1, true)?)?;
    let ids: Vec<i32> = next.iter().map(|&t| t as i32).collect();
    let chosen = take_along_axis(&logp, Array::from_slice(&ids, &[n as i32, 1]), -1)?;
    let chosen = to_vec_f32(&chosen)?;
    let top = top.min(vocab as usize);
    let (top_ids, top_values) = if top == 0 {
        (Vec::new(), Vec::new())
    } else {
        // The `top` largest of each row (unordered), sorted on the host.
        let kth = vocab - top as i32;
        let idx = mlx_rs::ops::argpartition_axis(&logp, kth, -1)?.try_index((.., kth..))?;
        let values = take_along_axis(&logp, &idx, -1)?;
        (to_vec_i32(&idx)?, to_vec_f32(&values)?)
    };
    Ok((0..n)
        .map(|i| {
            let mut best: Vec<(u32, f32)> =
                (0..top).map(|j| (top_ids[i * top + j] as u32, top_values[i * top + j])).collect();
            best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            TokenLogprobs { token: next[i], logprob: chosen[i], top: best }
        })
        .collect())
}

/// A generated token's log-probabilities, computed on the device with its draw and read with
/// the token: one int32 array `[1 + 2·top]` (the chosen token's log-probability, the `top` ids,
/// their log-probabilities; floats carried bit for bit), so the row never comes to the host.
pub struct Queued {
    /// Shared, so a read of it can be matched to the token it belongs to.
    packed: std::rc::Rc<Array>,
    top: usize,
}

impl Queued {
    /// For the token `token` (`[1]`, on the device) drawn from `logits` (`[1, vocab]`).
    pub fn new(logits: &Array, token: &Array, top: usize) -> Result<Self> {
        let vocab = logits.shape()[1];
        let top = top.min(vocab as usize);
        let row = logits.as_dtype(Dtype::Float32)?;
        let logp = row.subtract(row.logsumexp_axis(-1, true)?)?;
        let chosen = take_along_axis(&logp, token.as_dtype(Dtype::Int32)?.reshape(&[1, 1])?, -1)?.reshape(&[1])?;
        let mut parts = vec![chosen.view::<i32>()?];
        if top > 0 {
            let kth = vocab - top as i32;
            let ids = mlx_rs::ops::argpartition_axis(&logp, kth, -1)?.try_index((.., kth..))?;
            let values = take_along_axis(&logp, &ids, -1)?;
            parts.push(ids.as_dtype(Dtype::Int32)?.reshape(&[top as i32])?);
            parts.push(values.view::<i32>()?.reshape(&[top as i32])?);
        }
        Ok(Self { packed: std::rc::Rc::new(mlx_rs::ops::concatenate(&parts, 0)?), top })
    }

    /// The array to evaluate (and read) with the draw.
    pub fn array(&self) -> &std::rc::Rc<Array> {
        &self.packed
    }

    /// The log-probabilities from the packed values read back.
    pub fn unpack(&self, token: u32, packed: &[i32]) -> TokenLogprobs {
        let float = |bits: i32| f32::from_bits(bits as u32);
        let mut top: Vec<(u32, f32)> = (0..self.top).map(|j| (packed[1 + j] as u32, float(packed[1 + self.top + j]))).collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        TokenLogprobs { token, logprob: float(packed[0]), top }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_gives_log_softmax_and_the_most_likely_tokens() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        let lp = from_row(&logits, 2, 3);
        assert!((lp.logprob as f64 - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2], "ties keep the lower id first");
        assert!((lp.top[0].1 as f64 - (3.0 - lse)).abs() < 1e-6);
        let total: f64 = (0..logits.len() as u32).map(|id| (from_row(&logits, id, 0).logprob as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "probabilities sum to 1: {total}");
        assert!(from_row(&logits, 0, 0).top.is_empty());
        assert_eq!(from_row(&logits, 9, 1).logprob, f32::NEG_INFINITY, "an id past the vocabulary has no probability");
    }

    #[test]
    fn device_rows_match_the_host_row() {
        let rows = [[0.5f32, -2.0, 4.0, 1.0, 1.0, 0.0], [3.0, 3.0, -1.0, 0.25, 2.0, -4.0], [0.0; 6]];
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        let logits = Array::from_slice(&flat, &[3, 6]);
        let scored = for_rows(&logits, &[2, 4], 3).unwrap();
        assert_eq!(scored.len(), 2, "only rows with a next token are scored");
        for (row, (got, token)) in rows.iter().zip(scored.iter().zip([2u32, 4])) {
            let want = from_row(row, token, 3);
            assert_eq!(got.token, token);
            assert!((got.logprob - want.logprob).abs() < 1e-5, "{got:?} vs {want:?}");
            assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), want.top.iter().map(|t| t.0).collect::<Vec<_>>());
            for (g, w) in got.top.iter().zip(&want.top) {
                assert!((g.1 - w.1).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn queued_logprobs_match_the_host_row() {
        let row = [0.5f32, -2.0, 4.0, 1.0, 1.0, 0.0, 3.5];
        for (token, top) in [(2u32, 4usize), (5, 0), (1, 7)] {
            let queued = Queued::new(&Array::from_slice(&row, &[1, 7]), &Array::from_slice(&[token], &[1]), top).unwrap();
            let got = queued.unpack(token, &to_vec_i32(queued.array()).unwrap());
            let want = from_row(&row, token, top);
            assert_eq!(got.token, token);
            assert!((got.logprob - want.logprob).abs() < 1e-5, "{got:?} vs {want:?}");
            assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), want.top.iter().map(|t| t.0).collect::<Vec<_>>());
            for (g, w) in got.top.iter().zip(&want.top) {
                assert!((g.1 - w.1).abs() < 1e-5);
            }
        }
    }
}
