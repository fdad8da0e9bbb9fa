//! Drawing tokens where the logits are: temperature, top-k, top-p and min-p as MLX ops over a
//! batch of logits rows, so only the chosen ids come back to the host (and the next step can be
//! queued before they do). A draw is the Gumbel-max trick — the argmax of the filtered, scaled
//! logits plus Gumbel noise is a sample of their softmax — with the noise made from each row's
//! own key by a counter-based hash, so a seeded sequence draws the same tokens whatever else
//! shares its batch. The host sampler (`sampler.rs`) stays the reference for the same filters.

use super::error::Result;
use super::sampler::SamplingParams;
use super::ops::{bitwise_and, bitwise_xor, right_shift};
use mlx_rs::{Array, Dtype};

/// One row's settings for one draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowDraw {
    /// 0: greedy (the argmax; the other settings are ignored).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the most likely tokens until their probability reaches this (1 = off).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0 = off).
    pub min_p: f32,
    /// This row's noise for this step.
    pub key: DrawKey,
}

/// A sequence's `draw`-th draw: its noise comes from [`draw_key`] of the two. Kept apart (not
/// hashed) so a kernel can work out the keys of later draws itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DrawKey {
    pub seed: u64,
    pub draw: u64,
}

impl DrawKey {
    pub fn new(seed: u64, draw: u64) -> Self {
        Self { seed, draw }
    }

    /// [`draw_key`] of the seed and the draw.
    pub fn value(self) -> u32 {
        draw_key(self.seed, self.draw)
    }
}

/// The key of a sequence's `step`-th draw: a hash of its seed and the step, so a draw depends
/// only on the sequence, never on its place in a batch.
pub fn draw_key(seed: u64, step: u64) -> u32 {
    let mix = |x: u64| {
        // splitmix64's finaliser: every input bit reaches every output bit.
        let x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    let h = mix(seed.wrapping_add(mix(step.wrapping_add(0x9E37_79B9_7F4A_7C15))));
    (h ^ (h >> 32)) as u32
}

/// One token per row of `logits` (`[rows, vocab]`, any float dtype), drawn with `rows[i]`'s
/// settings; `[rows]` uint32, still on the device.
pub fn draw(logits: &Array, rows: &[RowDraw]) -> Result<Array> {
    let shape = logits.shape();
    let (n, vocab) = (shape[0], shape[1]);
    debug_assert_eq!(n as usize, rows.len());
    let logits = logits.as_dtype(Dtype::Float32)?;
    let greedy = column(rows, |r| f32::from(r.temperature == 0.0));
    // A greedy row is scaled by 1 and gets no noise: its argmax is the logits'.
    let temperature = column(rows, |r| if r.temperature == 0.0 { 1.0 } else { r.temperature });
    let scaled = logits.divide(&temperature)?;
    let mut filtered = scaled.clone();
    let neg_inf = Array::from_f32(f32::NEG_INFINITY);
    let sampled = rows.iter().filter(|r| r.temperature > 0.0);
    // Top-k and top-p compare each logit with one taken from the row sorted high to low.
    if sampled.clone().any(|r| r.top_k > 0 || r.top_p < 1.0) {
        let descending = mlx_rs::ops::sort_axis(scaled.negative()?, -1)?.negative()?;
        let kth = |k: &RowDraw| if k.top_k == 0 || k.top_k as i32 > vocab { vocab - 1 } else { k.top_k as i32 - 1 };
        let kth = Array::from_slice(&rows.iter().map(kth).collect::<Vec<i32>>(), &[n, 1]);
        let floor_k = descending.take_along_axis(&kth, -1)?;
        // Top-p over what top-k kept, as the host sampler renormalises: the probabilities of the
        // sorted row with everything below the k-th value removed.
        // Ties with the k-th value are kept, here as in the final filter.
        let within_k = descending.ge(&floor_k)?;
        let kept = mlx_rs::ops::select(&within_k, &descending, &neg_inf)?;
        let probs = mlx_rs::ops::softmax_axis(&kept, -1, None)?;
        let before = mlx_rs::ops::cumsum(&probs, -1, None, None)?.subtract(&probs)?;
        let top_p = column(rows, |r| if r.top_p >= 1.0 { f32::INFINITY } else { r.top_p });
        // The smallest head reaching top_p: every token with less than top_p before it.
        let count = before.lt(&top_p)?.logical_and(&within_k)?.sum_axis(-1, true)?.as_dtype(Dtype::Int32)?;
        let last = mlx_rs::ops::maximum(count.subtract(Array::from_int(1))?, Array::from_int(0))?;
        let floor_p = descending.take_along_axis(&last, -1)?;
        let floor = mlx_rs::ops::maximum(&floor_k, &floor_p)?;
        filtered = mlx_rs::ops::select(filtered.lt(&floor)?, &neg_inf, &filtered)?;
    }
    if sampled.clone().any(|r| r.min_p > 0.0) {
        // p ≥ min_p · p_max, in scaled logits: l ≥ l_max + ln(min_p).
        let offset = column(rows, |r| if r.min_p > 0.0 { r.min_p.ln() } else { f32::NEG_INFINITY });
        let floor = filtered.max_axis(-1, true)?.add(&offset)?;
        filtered = mlx_rs::ops::select(filtered.lt(&floor)?, &neg_inf, &filtered)?;
    }
    let keys = Array::from_slice(&rows.iter().map(|r| r.key.value()).collect::<Vec<u32>>(), &[n, 1]);
    let noise = gumbel(&keys, vocab)?.multiply(Array::from_f32(1.0).subtract(&greedy)?)?;
    // Greedy rows take the argmax of their logits unfiltered.
    let choice = mlx_rs::ops::select(greedy.gt(Array::from_f32(0.5))?, &scaled, &filtered.add(&noise)?)?;
    Ok(mlx_rs::ops::indexing::argmax_axis(&choice, -1, None)?.as_dtype(Dtype::Uint32)?)
}

/// One row's penalties for one draw (the host sampler's settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowPenalties {
    /// Divides positive (multiplies negative) logits of tokens seen in the window (1 = off).
    pub repetition: f32,
    /// Subtracted once per generated occurrence of a token.
    pub frequency: f32,
    /// Subtracted once from every token generated.
    pub presence: f32,
}

/// The logits as the host sampler adjusts them before drawing, for every row at once and in its
/// order: the grammar's mask (`words`, `[rows, ⌈vocab/32⌉]`, bit i % 32 of word i / 32 set for
/// an allowed token i), the logit bias (`[rows, vocab]`), the frequency and presence penalties
/// over `generated` (`[rows, vocab]` counts of generated tokens), then the repetition penalty
/// over `seen` (counts of tokens in the window).
pub fn adjust(logits: &Array, words: Option<&Array>, bias: Option<&Array>, generated: Option<&Array>, seen: Option<&Array>, rows: &[RowPenalties]) -> Result<Array> {
    let mut logits = logits.as_dtype(Dtype::Float32)?;
    if let Some(words) = words {
        logits = mask(&logits, words)?;
    }
    if let Some(bias) = bias {
        logits = logits.add(bias)?;
    }
    if let Some(generated) = generated.filter(|_| rows.iter().any(|r| r.frequency != 0.0 || r.presence != 0.0)) {
        let frequency = column(rows, |r| r.frequency);
        let presence = column(rows, |r| r.presence);
        let present = generated.gt(Array::from_f32(0.0))?.as_dtype(Dtype::Float32)?;
        logits = logits.subtract(generated.multiply(&frequency)?.add(present.multiply(&presence)?)?)?;
    }
    if let Some(seen) = seen.filter(|_| rows.iter().any(|r| r.repetition != 1.0)) {
        let repetition = column(rows, |r| r.repetition);
        let penalised = mlx_rs::ops::select(logits.gt(Array::from_f32(0.0))?, logits.divide(&repetition)?, logits.multiply(&repetition)?)?;
        logits = mlx_rs::ops::select(seen.gt(Array::from_f32(0.0))?, &penalised, &logits)?;
    }
    Ok(logits)
}

/// −∞ where a row's packed mask has the token's bit clear.
fn mask(logits: &Array, words: &Array) -> Result<Array> {
    let shape = logits.shape();
    let (n, vocab) = (shape[0], shape[1]);
    let index = token_ids(vocab)?;
    let word = right_shift(&index, &u32s(5))?.as_dtype(Dtype::Int32)?;
    let word = mlx_rs::ops::broadcast_to(&word, &[n, vocab])?;
    let bits = words.take_along_axis(&word, -1)?;
    let bit = bitwise_and(&right_shift(&bits, &bitwise_and(&index, &u32s(31))?)?, &u32s(1))?;
    Ok(mlx_rs::ops::select(bit.eq(u32s(0))?, Array::from_f32(f32::NEG_INFINITY), logits)?)
}

/// `[rows, vocab]` float32 counts of each row's tokens: what [`adjust`] takes as `generated`
/// (the tokens a sequence generated) or `seen` (those in its repetition window).
pub fn counts(tokens: &[&[u32]], vocab: usize) -> Result<Array> {
    let mut counts = vec![0.0f32; tokens.len() * vocab];
    for (row, ids) in tokens.iter().enumerate() {
        for &id in ids.iter().filter(|&&id| (id as usize) < vocab) {
            counts[row * vocab + id as usize] += 1.0;
        }
    }
    Ok(Array::from_slice(&counts, &[tokens.len() as i32, vocab as i32]))
}

/// `counts` with one more of each row's token in `tokens` (`[rows]` uint32, still on the device:
/// the step's draw) and, with `leaving` (`[rows]` uint32, on the host or the device), one less of
/// each row's token there (the token that left the repetition window; [`NO_TOKEN`] for none).
pub fn recount(counts: &Array, tokens: &Array, leaving: Option<&Array>) -> Result<Array> {
    let shape = counts.shape();
    let (n, vocab) = (shape[0], shape[1]);
    let index = token_ids(vocab)?;
    let added = index.eq(tokens.as_dtype(Dtype::Uint32)?.reshape(&[n, 1])?)?.as_dtype(Dtype::Float32)?;
    let mut counts = counts.add(&added)?;
    if let Some(leaving) = leaving {
        counts = counts.subtract(index.eq(leaving.as_dtype(Dtype::Uint32)?.reshape(&[n, 1])?)?.as_dtype(Dtype::Float32)?)?;
    }
    Ok(counts)
}

/// Matches no token: a row with nothing leaving its window.
pub const NO_TOKEN: u32 = u32::MAX;

/// One sequence's drawing on the device: its settings, and what its penalties and logit bias
/// look at, kept on the device so no step needs the history from the host.
pub struct SequenceDraws {
    settings: RowDraw,
    penalties: RowPenalties,
    /// `[1, vocab]` logit bias.
    bias: Option<Array>,
    /// `[1, vocab]` counts of the generated tokens (frequency and presence penalties).
    generated: Option<Array>,
    /// `[1, vocab]` counts of the tokens in the repetition window.
    seen: Option<Array>,
    window: usize,
}

impl SequenceDraws {
    /// The state before a sequence's first generated token, `history` the tokens before it.
    pub fn new(params: &SamplingParams, history: &[u32], vocab: usize) -> Result<Self> {
        let penalties = RowPenalties { repetition: params.repetition_penalty, frequency: params.frequency_penalty, presence: params.presence_penalty };
        let bias = (!params.logit_bias.is_empty()).then(|| {
            let mut row = vec![0.0f32; vocab];
            for &(id, b) in params.logit_bias.iter().filter(|(id, _)| (*id as usize) < vocab) {
                row[id as usize] += b;
            }
            Array::from_slice(&row, &[1, vocab as i32])
        });
        let generated = (penalties.frequency != 0.0 || penalties.presence != 0.0).then(|| counts(&[&[]], vocab)).transpose()?;
        let window = params.repetition_window;
        let seen = (penalties.repetition != 1.0).then(|| counts(&[&history[history.len().saturating_sub(window)..]], vocab)).transpose()?;
        let settings = RowDraw { temperature: params.temperature, top_k: params.top_k, top_p: params.top_p, min_p: params.min_p, key: DrawKey::default() };
        Ok(Self { settings, penalties, bias, generated, seen, window })
    }

    /// The repetition window, when the repetition penalty looks at one.
    pub fn window(&self) -> Option<usize> {
        self.seen.as_ref().map(|_| self.window)
    }

    /// The arrays a draw leaves (to evaluate with it).
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.generated.iter().chain(&self.seen)
    }
}

/// [`draw`] of the logits under a packed mask (`words`, as [`adjust`] takes it), computed some
/// faster way: the fused kernel of `kernels::draw`, which the engine cannot name (it sits above).
pub type DrawKernel = fn(&Array, Option<&Array>, &[RowDraw]) -> Result<Array>;

static DRAW_KERNEL: std::sync::OnceLock<DrawKernel> = std::sync::OnceLock::new();

/// Makes [`draw_rows`] draw through `kernel` from now on (set once, at load).
pub fn use_draw_kernel(kernel: DrawKernel) {
    let _ = DRAW_KERNEL.set(kernel);
}

/// One row of [`draw_rows`].
pub struct DrawRow<'a> {
    pub state: &'a mut SequenceDraws,
    /// The sequence's seed and draw.
    pub key: DrawKey,
    /// The grammar's allowed tokens.
    pub mask: Option<&'a [u32]>,
    /// `[1]` uint32: the token leaving the repetition window as this draw's enters it.
    pub leaving: Option<Array>,
}

/// One token per row of `logits` (`[rows, vocab]`) under each row's settings, penalties, bias
/// and mask, as `[rows]` uint32 on the device; each row's counts take in its draw (lazily).
pub fn draw_rows(logits: &Array, rows: &mut [DrawRow]) -> Result<Array> {
    let vocab = logits.shape()[1];
    let plain = |r: &DrawRow| r.mask.is_none() && r.state.bias.is_none() && r.state.generated.is_none() && r.state.seen.is_none();
    if rows.iter().all(|r| plain(r) && r.state.settings.temperature == 0.0) {
        // Plain greedy: the argmax, as the pipelined benchmark's steps take it.
        return Ok(mlx_rs::ops::indexing::argmax_axis(logits, -1, None)?.as_dtype(Dtype::Uint32)?);
    }
    let stack = |row: &dyn Fn(&DrawRow) -> Option<Array>| -> Result<Option<Array>> {
        if rows.iter().all(|r| row(r).is_none()) {
            return Ok(None);
        }
        let zeros = super::ops::zeros(&[1, vocab], Dtype::Float32)?;
        let parts: Vec<Array> = rows.iter().map(|r| row(r).unwrap_or_else(|| zeros.clone())).collect();
        Ok(Some(mlx_rs::ops::concatenate(&parts, 0)?))
    };
    let words = if rows.iter().any(|r| r.mask.is_some()) {
        let width = (vocab as usize).div_ceil(32);
        let mut packed = vec![u32::MAX; rows.len() * width];
        for (r, row) in rows.iter().enumerate() {
            if let Some(mask) = row.mask {
                let line = &mut packed[r * width..(r + 1) * width];
                line.fill(0);
                let n = mask.len().min(width);
                line[..n].copy_from_slice(&mask[..n]);
            }
        }
        Some(Array::from_slice(&packed, &[rows.len() as i32, width as i32]))
    } else {
        None
    };
    let bias = stack(&|r| r.state.bias.clone())?;
    let generated = stack(&|r| r.state.generated.clone())?;
    let seen = stack(&|r| r.state.seen.clone())?;
    let penalties: Vec<RowPenalties> = rows.iter().map(|r| r.state.penalties).collect();
    let settings: Vec<RowDraw> = rows.iter().map(|r| RowDraw { key: r.key, ..r.state.settings }).collect();
    let tokens = match DRAW_KERNEL.get() {
        // The kernel applies the mask itself and takes the logits in their own dtype.
        Some(kernel) => {
            let adjusted = if bias.is_some() || generated.is_some() || seen.is_some() {
                adjust(logits, None, bias.as_ref(), generated.as_ref(), seen.as_ref(), &penalties)?
            } else {
                logits.clone()
            };
            kernel(&adjusted, words.as_ref(), &settings)?
        }
        None => draw(&adjust(logits, words.as_ref(), bias.as_ref(), generated.as_ref(), seen.as_ref(), &penalties)?, &settings)?,
    };
    for (i, row) in rows.iter_mut().enumerate() {
        if row.state.generated.is_none() && row.state.seen.is_none() {
            continue;
        }
        use mlx_rs::ops::indexing::TryIndexOp;
        let token = tokens.try_index(i as i32..i as i32 + 1)?;
        if let Some(generated) = &row.state.generated {
            row.state.generated = Some(recount(generated, &token, None)?);
        }
        if let Some(seen) = &row.state.seen {
            row.state.seen = Some(recount(seen, &token, row.leaving.as_ref())?);
        }
    }
    Ok(tokens)
}

/// Gumbel noise `[rows, vocab]`: element (r, i) from a hash of `keys[r]` and i, the same on
/// every device and in every batch.
fn gumbel(keys: &Array, vocab: i32) -> Result<Array> {
    let index = token_ids(vocab)?;
    // murmur3's finaliser over the index mixed with the key.
    let shift_xor = |x: &Array, s: u32| -> Result<Array> { Ok(bitwise_xor(x, &right_shift(x, &u32s(s))?)?) };
    let mut h = bitwise_xor(&index.multiply(u32s(0x9E37_79B1))?, keys)?;
    h = shift_xor(&h, 16)?.multiply(u32s(0x85EB_CA6B))?;
    h = shift_xor(&h, 13)?.multiply(u32s(0xC2B2_AE35))?;
    h = shift_xor(&h, 16)?;
    // The top 24 bits as a float in (0, 1): exact in float32, never 0 or 1.
    let top = right_shift(&h, &u32s(8))?.as_dtype(Dtype::Float32)?;
    let uniform = top.add(Array::from_f32(0.5))?.multiply(Array::from_f32(1.0 / 16_777_216.0))?;
    Ok(uniform.log()?.negative()?.log()?.negative()?)
}

/// One value per row, `[rows, 1]`, to broadcast along each row.
fn column<R>(rows: &[R], value: impl Fn(&R) -> f32) -> Array {
    Array::from_slice(&rows.iter().map(value).collect::<Vec<f32>>(), &[rows.len() as i32, 1])
}

/// The token ids `[1, vocab]`, uint32: what a row's values are matched against.
fn token_ids(vocab: i32) -> Result<Array> {
    Ok(Array::arange::<u32, u32>(None, vocab as u32, None)?.reshape(&[1, vocab])?)
}

/// A uint32 constant (so integer arithmetic stays in uint32).
fn u32s(value: u32) -> Array {
    Array::from_slice(&[value], &[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drawn(logits: &[f32], rows: &[RowDraw]) -> Vec<u32> {
        let vocab = logits.len() / rows.len();
        let a = Array::from_slice(logits, &[rows.len() as i32, vocab as i32]);
        let t = draw(&a, rows).unwrap();
        t.as_slice::<u32>().to_vec()
    }

    fn row(temperature: f32, seed: u64) -> RowDraw {
        RowDraw { temperature, top_k: 0, top_p: 1.0, min_p: 0.0, key: DrawKey::new(seed, 0) }
    }

    #[test]
    fn keys_depend_on_seed_and_step_only() {
        assert_eq!(draw_key(7, 3), draw_key(7, 3));
        let keys: std::collections::HashSet<u32> = (0..1000).map(|s| draw_key(42, s)).chain((1000..2000).map(|s| draw_key(s, 0))).collect();
        assert_eq!(keys.len(), 2000);
    }

    #[test]
    fn greedy_rows_take_the_first_maximum_and_others_their_own_draws() {
        let logits = [0.1, 3.0, 3.0, -1.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(drawn(&logits, &[row(0.0, 1), row(0.0, 2)])[0], 1);
        // A row's draw depends on its key, not on the rows beside it.
        let one = drawn(&logits[4..], &[row(1.0, 99)]);
        let both = drawn(&logits, &[row(0.0, 5), row(1.0, 99)]);
        assert_eq!(both, [1, one[0]]);
    }

    #[test]
    fn filters_keep_the_head() {
        let logits = [0.0, 2.0, 1.9, -5.0];
        let draws = |r: RowDraw| -> Vec<u32> { (0..64).map(|k| drawn(&logits, &[RowDraw { key: DrawKey::new(1, k), ..r }])[0]).collect() };
        assert!(draws(RowDraw { top_k: 1, ..row(1.0, 0) }).iter().all(|&t| t == 1));
        assert!(draws(RowDraw { top_p: 0.3, ..row(1.0, 0) }).iter().all(|&t| t == 1));
        let two = draws(RowDraw { top_k: 2, ..row(5.0, 0) });
        assert!(two.iter().all(|&t| t == 1 || t == 2) && two.contains(&1) && two.contains(&2), "{two:?}");
        let min_p = draws(RowDraw { min_p: 0.5, ..row(1.0, 0) });
        assert!(min_p.iter().all(|&t| t == 1 || t == 2), "{min_p:?}");
    }

    /// Greedy after every adjustment picks what the host sampler picks, over random logits,
    /// histories, masks, biases and penalties.
    #[test]
    fn adjusted_greedy_matches_the_host_sampler() {
        use crate::engine::sampler::{Sampler, SamplingParams};
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (vocab, n) = (70usize, 64usize);
        let words = vocab.div_ceil(32);
        for _ in 0..8 {
            let logits: Vec<f32> = (0..n * vocab).map(|_| rng.random_range(-4.0..4.0)).collect();
            let histories: Vec<Vec<u32>> = (0..n).map(|_| (0..rng.random_range(0..40)).map(|_| rng.random_range(0..vocab as u32)).collect()).collect();
            let generated_len: Vec<usize> = histories.iter().map(|h| rng.random_range(0..=h.len())).collect();
            let params: Vec<SamplingParams> = (0..n)
                .map(|_| SamplingParams {
                    repetition_penalty: [1.0, 1.3, 0.8][rng.random_range(0..3)],
                    repetition_window: 16,
                    frequency_penalty: [0.0, 0.5, -0.4][rng.random_range(0..3)],
                    presence_penalty: [0.0, 0.7, -1.0][rng.random_range(0..3)],
                    logit_bias: (0..rng.random_range(0..4)).map(|_| (rng.random_range(0..vocab as u32), rng.random_range(-5.0..5.0))).collect(),
                    ..Default::default()
                })
                .collect();
            // Half the rows under a mask allowing a random third of the tokens.
            let allowed: Vec<Vec<bool>> = (0..n).map(|r| (0..vocab).map(|_| r % 2 == 0 || rng.random_range(0..3) == 0).collect()).collect();
            let mut packed = vec![0u32; n * words];
            for (r, row) in allowed.iter().enumerate() {
                for (i, _) in row.iter().enumerate().filter(|(_, a)| **a) {
                    packed[r * words + i / 32] |= 1 << (i % 32);
                }
            }
            let mut bias = vec![0.0f32; n * vocab];
            for (r, p) in params.iter().enumerate() {
                for &(id, b) in &p.logit_bias {
                    bias[r * vocab + id as usize] += b;
                }
            }
            let generated: Vec<&[u32]> = histories.iter().zip(&generated_len).map(|(h, &g)| &h[h.len() - g..]).collect();
            let window: Vec<&[u32]> = histories.iter().map(|h| &h[h.len().saturating_sub(16)..]).collect();
            let rows: Vec<RowPenalties> = params.iter().map(|p| RowPenalties { repetition: p.repetition_penalty, frequency: p.frequency_penalty, presence: p.presence_penalty }).collect();
            let adjusted = adjust(
                &Array::from_slice(&logits, &[n as i32, vocab as i32]),
                Some(&Array::from_slice(&packed, &[n as i32, words as i32])),
                Some(&Array::from_slice(&bias, &[n as i32, vocab as i32])),
                Some(&counts(&generated, vocab).unwrap()),
                Some(&counts(&window, vocab).unwrap()),
                &rows,
            )
            .unwrap();
            let greedy: Vec<RowDraw> = (0..n).map(|_| row(0.0, 0)).collect();
            let device = draw(&adjusted, &greedy).unwrap();
            let device = device.as_slice::<u32>();
            for r in 0..n {
                let mut row_logits = logits[r * vocab..(r + 1) * vocab].to_vec();
                for (i, a) in allowed[r].iter().enumerate() {
                    if !a {
                        row_logits[i] = f32::NEG_INFINITY;
                    }
                }
                let host = Sampler::new(params[r].clone()).sample_with(&row_logits, &histories[r], generated_len[r]).unwrap();
                assert_eq!(device[r], host, "row {r}: {:?}", params[r]);
            }
        }
    }

    /// Recounting on the device equals counting the tokens again on the host.
    #[test]
    fn recount_adds_the_draw_and_drops_what_left() {
        let before = counts(&[&[1, 2, 2], &[0]], 4).unwrap();
        let drawn = Array::from_slice(&[2u32, 3], &[2]);
        let after = recount(&before, &drawn, Some(&Array::from_slice(&[1u32, NO_TOKEN], &[2]))).unwrap();
        assert_eq!(after.as_slice::<f32>(), counts(&[&[2, 2, 2], &[0, 3]], 4).unwrap().as_slice::<f32>());
    }

    /// The distribution the host sampler draws from: temperature, then the k best, then the
    /// smallest head reaching top_p of what is left (renormalised), then min_p of the best.
    fn filtered_softmax(logits: &[f32], r: &RowDraw) -> Vec<f64> {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        if r.top_k > 0 {
            order.truncate(r.top_k);
        }
        let max = logits[order[0]] as f64;
        let weights: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - max) / r.temperature as f64).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut keep = order.len();
        let mut cumulative = 0.0;
        for (i, w) in weights.iter().enumerate() {
            cumulative += w / total;
            if cumulative >= r.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        let keep = weights[..keep].iter().take_while(|&&w| w >= weights[0] * r.min_p as f64).count().max(1);
        let total: f64 = weights[..keep].iter().sum();
        let mut probs = vec![0.0; logits.len()];
        for (j, &i) in order[..keep].iter().enumerate() {
            probs[i] = weights[j] / total;
        }
        probs
    }

    /// Chi-square of 20,000 draws (one batch, a key each) against the filtered softmax, under the
    /// 0.1% critical value; a token outside the filter is never drawn.
    #[test]
    fn draws_follow_the_filtered_softmax() {
        let logits = [1.2f32, 0.3, 2.0, -0.5, 1.9, 0.8];
        let settings = [
            row(0.7, 0),
            RowDraw { top_k: 3, ..row(1.0, 0) },
            RowDraw { top_p: 0.8, ..row(1.0, 0) },
            RowDraw { min_p: 0.2, ..row(1.3, 0) },
            RowDraw { top_k: 4, top_p: 0.9, min_p: 0.05, ..row(0.9, 0) },
        ];
        // 0.1% critical values of chi-square for 1..=5 degrees of freedom.
        let critical = [10.83, 13.82, 16.27, 18.47, 20.52];
        let n = 20_000;
        for (case, setting) in settings.iter().enumerate() {
            let rows: Vec<RowDraw> = (0..n).map(|k| RowDraw { key: DrawKey::new(case as u64, k as u64), ..*setting }).collect();
            let all: Vec<f32> = (0..n).flat_map(|_| logits).collect();
            let mut counts = [0usize; 6];
            for t in drawn(&all, &rows) {
                counts[t as usize] += 1;
            }
            let expected = filtered_softmax(&logits, setting);
            let mut chi2 = 0.0;
            for (i, &p) in expected.iter().enumerate() {
                if p == 0.0 {
                    assert_eq!(counts[i], 0, "case {case}: token {i} is filtered out but was drawn ({counts:?})");
                } else {
                    let e = p * n as f64;
                    chi2 += (counts[i] as f64 - e).powi(2) / e;
                }
            }
            let df = expected.iter().filter(|&&p| p > 0.0).count() - 1;
            assert!(df >= 1 && chi2 < critical[df - 1], "case {case}: chi-square {chi2:.2} with {df} degrees of freedom; drawn {counts:?}, expected {expected:?}");
        }
    }
}
