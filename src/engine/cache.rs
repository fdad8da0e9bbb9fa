//! Per-sequence model state, one entry per layer, model-agnostic:
//! * [`KvCache`]: keys/values of softmax-attention layers, growing along the sequence axis, with
//!   optional per-window key summaries that a model defines (e.g. the key compression of block-sparse
//!   attention), kept up to date incrementally;
//! * [`RecurrentState`]: the fixed-size state of a linear-attention/recurrent layer.
//!
//! Everything is an MLX array, so cloning a cache is cheap and gives an independent snapshot
//! (arrays are immutable; the next write makes a new buffer).

use crate::engine::ops::scalar;
use mlx_rs::{error::Result, ops, ops::indexing::TryIndexMutOp, ops::indexing::TryIndexOp, Array, Dtype};

/// An array `[B, H, capacity, D]` that grows along axis 2 with room to spare, so appending a
/// token does not copy the whole history, plus a small buffer of the most recent tokens for
/// appends made while the device may still be reading the history (pipelined decoding).
///
/// Why two parts: MLX writes a slice in place only when nothing else holds the buffer, and the
/// previous step's kernels hold it until the device has run them. A decode step queued before
/// the previous one finished would copy the whole history on every token
/// (eval/results/kernel-notes.md). [`SeqBuffer::append_recent`]
/// writes into `recent` instead (a copy of at most [`SeqBuffer::RECENT`] tokens) and moves it
/// into the history once it is full (a copy of the history at most once per `RECENT` tokens).
#[derive(Clone, Default)]
pub struct SeqBuffer {
    data: Option<Array>,
    /// Tokens in `data`.
    len: usize,
    recent: Option<Array>,
    /// Tokens in `recent`, which follow the `len` tokens of `data`.
    recent_len: usize,
    /// The length the history is expected to reach ([`SeqBuffer::reserve`]).
    reserved: usize,
}

impl SeqBuffer {
    const MIN_STEP: usize = 256;
    /// Capacity of the recent-token buffer.
    pub const RECENT: usize = 256;

    pub fn len(&self) -> usize {
        self.len + self.recent_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Expects `tokens` in all: the history's next growth that this covers makes it exactly that
    /// long, rather than rounding up by as much as an eighth.
    pub fn reserve(&mut self, tokens: usize) {
        self.reserved = tokens;
    }

    /// Appends `[B, H, T, D]` to the history (one contiguous buffer).
    pub fn append(&mut self, x: &Array) -> Result<()> {
        self.flush()?;
        self.append_settled(x)
    }

    /// Appends `[B, H, T, D]` behind the recent tokens when they have room (readers then take
    /// [`SeqBuffer::parts`]); see the type's docs for why.
    pub fn append_recent(&mut self, x: &Array) -> Result<()> {
        let t = x.shape()[2] as usize;
        if self.recent_len + t > Self::RECENT {
            self.flush()?;
            if t > Self::RECENT {
                return self.append_settled(x);
            }
        }
        if self.recent.is_none() {
            let s = x.shape();
            self.recent = Some(ops::zeros_dtype(&[s[0], s[1], Self::RECENT as i32, s[3]], x.dtype())?);
        }
        let recent = self.recent.as_mut().expect("allocated above");
        recent.try_index_mut((.., .., self.recent_len as i32..(self.recent_len + t) as i32, ..), x)?;
        self.recent_len += t;
        Ok(())
    }

    /// The recent-token buffer and the position in it of the next token, for a kernel that
    /// writes the token into a copy of the buffer ([`SeqBuffer::commit_recent`] takes that copy):
    /// the buffer is emptied into the history first when full, and when the history is empty
    /// (readers take the history from [`SeqBuffer::parts`]). `None` for an empty buffer.
    fn recent_slot(&mut self) -> Result<Option<(Array, usize)>> {
        if self.is_empty() {
            return Ok(None);
        }
        if self.len == 0 || self.recent_len == Self::RECENT {
            self.flush()?;
        }
        if self.recent.is_none() {
            let data = self.data.as_ref().expect("a non-empty history");
            let s = data.shape();
            self.recent = Some(ops::zeros_dtype(&[s[0], s[1], Self::RECENT as i32, s[3]], data.dtype())?);
        }
        Ok(Some((self.recent.clone().expect("allocated above"), self.recent_len)))
    }

    /// Takes the recent-token buffer written at the position [`SeqBuffer::recent_slot`] gave.
    fn commit_recent(&mut self, recent: Array) {
        debug_assert!(self.recent.as_ref().is_some_and(|r| r.shape() == recent.shape()));
        self.recent = Some(recent);
        self.recent_len += 1;
    }

    /// Moves the recent tokens into the history.
    fn flush(&mut self) -> Result<()> {
        if self.recent_len == 0 {
            return Ok(());
        }
        let recent = self.recent.as_ref().expect("recent tokens are stored").try_index((.., .., ..self.recent_len as i32, ..))?;
        self.recent_len = 0;
        self.append_settled(&recent)
    }

    fn append_settled(&mut self, x: &Array) -> Result<()> {
        let t = x.shape()[2] as usize;
        let capacity = self.data.as_ref().map_or(0, |d| d.shape()[2] as usize);
        if self.len + t > capacity {
            // Grow by at least 1/8 of the length: amortised O(1) copies, ≤ 12.5% slack.
            let step = Self::MIN_STEP.max(self.len / 8);
            let new_capacity = match self.reserved {
                r if r >= self.len + t => r,
                _ => (self.len + t).div_ceil(step) * step,
            };
            let s = x.shape();
            let fresh = ops::zeros_dtype(&[s[0], s[1], (new_capacity - self.len) as i32, s[3]], x.dtype())?;
            self.data = Some(match &self.data {
                Some(d) if self.len > 0 => {
                    ops::concatenate(&[d.try_index((.., .., ..self.len as i32, ..))?, fresh], 2)?
                }
                _ => fresh,
            });
        }
        let data = self.data.as_mut().expect("allocated above");
        let range = self.len as i32..(self.len + t) as i32;
        data.try_index_mut((.., .., range, ..), x)?;
        self.len += t;
        Ok(())
    }

    /// The filled part `[B, H, len, D]` as one array (moves the recent tokens into the history).
    pub fn view(&mut self) -> Result<Option<Array>> {
        self.flush()?;
        match &self.data {
            Some(d) if self.len > 0 => Ok(Some(d.try_index((.., .., ..self.len as i32, ..))?)),
            _ => Ok(None),
        }
    }

    /// Positions `start..end` `[B, H, end − start, D]`, which may span both parts.
    pub fn range(&self, start: usize, end: usize) -> Result<Array> {
        let slice = |a: &Option<Array>, s: usize, e: usize| {
            a.as_ref().expect("positions below len are stored").try_index((.., .., s as i32..e as i32, ..))
        };
        debug_assert!(start < end && end <= self.len());
        if end <= self.len {
            slice(&self.data, start, end)
        } else if start >= self.len {
            slice(&self.recent, start - self.len, end - self.len)
        } else {
            ops::concatenate(&[slice(&self.data, start, self.len)?, slice(&self.recent, 0, end - self.len)?], 2)
        }
    }

    /// The buffers as they are, for kernels that read in place: the history `[B, H, capacity,
    /// D]`, the recent tokens `[B, H, RECENT, D]` (`None` when there are none) and how many
    /// positions the history holds (the recent buffer holds the rest). A buffer holding only
    /// recent tokens moves them into the history first (kernels read the history).
    pub fn parts(&mut self) -> Result<Option<(&Array, Option<&Array>, usize)>> {
        if self.len == 0 {
            self.flush()?;
        }
        let recent = self.recent.as_ref().filter(|_| self.recent_len > 0);
        Ok(self.data.as_ref().filter(|_| self.len > 0).map(|d| (d, recent, self.len)))
    }

    /// Keeps only the first `len` entries (speculative-decoding rollback).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            self.recent_len = self.recent_len.min(len - self.len);
        } else {
            self.len = len;
            self.recent_len = 0;
        }
    }

    /// Drops entries `start..end`, closing the gap (one copy of what is kept).
    pub fn remove(&mut self, start: usize, end: usize) -> Result<()> {
        self.flush()?;
        let (Some(data), true) = (&self.data, start < end && end <= self.len) else { return Ok(()) };
        let head = data.try_index((.., .., ..start as i32, ..))?;
        let tail = data.try_index((.., .., end as i32..self.len as i32, ..))?;
        self.data = Some(ops::concatenate(&[head, tail], 2)?);
        self.len -= end - start;
        Ok(())
    }

    pub fn nbytes(&self) -> usize {
        self.data.iter().chain(&self.recent).map(Array::nbytes).sum()
    }

    /// The arrays it holds (to evaluate with a step's output).
    fn arrays(&self) -> impl Iterator<Item = Array> + '_ {
        self.data.iter().chain(&self.recent).cloned()
    }

    /// The history, the recent-token buffer and the history's length, readied for a decode step
    /// that writes at a place the device holds ([`StepCounts`]): the recent tokens go to the
    /// history first when their buffer is full. `None` while empty.
    fn fixed_step_parts(&mut self) -> Result<Option<(Array, Array, usize)>> {
        let Some((recent, _)) = self.recent_slot()? else { return Ok(None) };
        Ok(Some((self.data.clone().expect("a non-empty history after recent_slot"), recent, self.len)))
    }

    /// This buffer holding `history` and `recent` in place of its own arrays (same shapes).
    fn with_arrays(&self, history: Array, recent: Array) -> SeqBuffer {
        SeqBuffer { data: Some(history), recent: Some(recent), ..self.clone() }
    }
}

/// A [`SeqBuffer`] of rows quantized when appended, in MLX's affine format (as mlx-lm's quantized
/// KV cache): each `group` values of a row `[.., D]` become `bits`-bit codes packed in u32 words,
/// one scale and one bias, so a 128-value bf16 row of 256 bytes takes 136 at 8 bits. Codes,
/// scales and biases are three buffers that grow, roll back and drop tokens in lockstep; readers
/// get the rows dequantized, in the dtype they were appended in.
///
/// Quantized once, at append, including the recent tokens: a token then reads back the same
/// whichever path wrote it (a prefill chunk, a decode step, a speculative draft).
#[derive(Clone)]
pub struct QuantizedSeqBuffer {
    codes: SeqBuffer,
    scales: SeqBuffer,
    biases: SeqBuffer,
    bits: i32,
    group: i32,
    /// The shape `[B, H, 1, D]` and dtype of one token's rows (after the first append), for
    /// [`QuantizedSeqBuffer::token_slot`]. Not an array kept from then: made lazily on one
    /// thread's stream, it could not be evaluated by a decode step encoded on another
    /// (`engine::encoder`).
    token: Option<([i32; 4], Dtype)>,
}

impl QuantizedSeqBuffer {
    pub fn new(bits: i32, group: i32) -> Self {
        Self { codes: SeqBuffer::default(), scales: SeqBuffer::default(), biases: SeqBuffer::default(), bits, group, token: None }
    }

    pub fn len(&self) -> usize {
        self.codes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }

    /// Codes, scales and biases: every edit applies to the three alike.
    fn planes(&mut self) -> [&mut SeqBuffer; 3] {
        [&mut self.codes, &mut self.scales, &mut self.biases]
    }

    /// See [`SeqBuffer::reserve`].
    pub fn reserve(&mut self, tokens: usize) {
        self.planes().into_iter().for_each(|p| p.reserve(tokens));
    }

    /// Quantizes `[B, H, T, D]` rows; refuses a D that is not a whole number of groups.
    fn quantize(&mut self, x: &Array) -> Result<(Array, Array, Array)> {
        let s = x.shape();
        let d = *s.last().unwrap_or(&0);
        if d % self.group != 0 {
            return Err(mlx_rs::error::Exception::custom(format!(
                "a {}-bit KV cache quantizes groups of {} values of a head's row, and this head dimension is {d}: run without --kv-bits",
                self.bits, self.group
            )));
        }
        self.token.get_or_insert(([s[0], s[1], 1, d], x.dtype())); // x is [B, H, T, D]
        ops::quantize(x, self.group, self.bits)
    }

    /// Appends `[B, H, T, D]` to the history (see [`SeqBuffer::append`]).
    pub fn append(&mut self, x: &Array) -> Result<()> {
        let (codes, scales, biases) = self.quantize(x)?;
        self.planes().into_iter().zip([codes, scales, biases]).try_for_each(|(p, part)| p.append(&part))
    }

    /// Appends `[B, H, T, D]` behind the recent tokens (see [`SeqBuffer::append_recent`]).
    pub fn append_recent(&mut self, x: &Array) -> Result<()> {
        let (codes, scales, biases) = self.quantize(x)?;
        self.planes().into_iter().zip([codes, scales, biases]).try_for_each(|(p, part)| p.append_recent(&part))
    }

    fn dequantize(&self, codes: &Array, scales: &Array, biases: &Array) -> Result<Array> {
        ops::dequantize(codes, scales, biases, self.group, self.bits)
    }

    /// The filled rows `[B, H, len, D]`, dequantized (see [`SeqBuffer::view`]).
    pub fn view(&mut self) -> Result<Option<Array>> {
        let (Some(codes), Some(scales), Some(biases)) = (self.codes.view()?, self.scales.view()?, self.biases.view()?) else {
            return Ok(None);
        };
        self.dequantize(&codes, &scales, &biases).map(Some)
    }

    /// Positions `start..end` `[B, H, end − start, D]`, dequantized (see [`SeqBuffer::range`]).
    pub fn range(&self, start: usize, end: usize) -> Result<Array> {
        self.dequantize(&self.codes.range(start, end)?, &self.scales.range(start, end)?, &self.biases.range(start, end)?)
    }

    /// Keeps only the first `len` entries.
    pub fn truncate(&mut self, len: usize) {
        self.planes().into_iter().for_each(|p| p.truncate(len));
    }

    /// Drops entries `start..end` (see [`SeqBuffer::remove`]).
    pub fn remove(&mut self, start: usize, end: usize) -> Result<()> {
        self.planes().into_iter().try_for_each(|p| p.remove(start, end))
    }

    pub fn nbytes(&self) -> usize {
        self.codes.nbytes() + self.scales.nbytes() + self.biases.nbytes()
    }

    fn arrays(&self) -> impl Iterator<Item = Array> + '_ {
        self.codes.arrays().chain(self.scales.arrays()).chain(self.biases.arrays())
    }

    /// Appends rows quantized before (by [`QuantizedSeqBuffer::append`], read back from a file)
    /// as they are: codes, scales and biases `[B, H, T, ·]` of this buffer's bits and group.
    fn restore(&mut self, codes: &Array, scales: &Array, biases: &Array) -> Result<()> {
        let (c, s) = (codes.shape(), scales.shape());
        let d = c.last().copied().unwrap_or(0) * 32 / self.bits;
        if c.len() != 4 || s.len() != 4 || s != biases.shape() || c[..3] != s[..3] || s[3] * self.group != d || codes.dtype() != Dtype::Uint32 {
            return Err(mlx_rs::error::Exception::custom(format!(
                "codes {c:?} {:?}, scales {s:?}: not {}-bit rows in groups of {}",
                codes.dtype(),
                self.bits,
                self.group
            )));
        }
        self.token.get_or_insert(([s[0], s[1], 1, d], scales.dtype()));
        self.planes().into_iter().zip([codes, scales, biases]).try_for_each(|(p, part)| p.append(part))
    }

    /// Its codes', scales' and biases' buffers as they are (see [`SeqBuffer::parts`]), the three
    /// alike: they hold the same positions.
    #[allow(clippy::type_complexity)]
    fn parts(&mut self) -> Result<Option<[(Array, Option<Array>, usize); 3]>> {
        let mut planes = Vec::with_capacity(3);
        for p in self.planes() {
            let Some((history, recent, settled)) = p.parts()? else { return Ok(None) };
            planes.push((history.clone(), recent.cloned(), settled));
        }
        Ok(planes.try_into().ok())
    }

    /// A buffer `[B, H, 1, D]` in the rows' dtype for a kernel to write one token into, which
    /// [`QuantizedSeqBuffer::append_recent`] then takes; `None` before the first append.
    fn token_slot(&self) -> Result<Option<Array>> {
        self.token.map(|(shape, dtype)| ops::zeros_dtype(&shape, dtype)).transpose()
    }
}

/// How a KV cache keeps its rows: as computed, or quantized when appended (`--kv-bits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvFormat {
    #[default]
    Plain,
    /// MLX's affine format ([`QuantizedSeqBuffer`]): `bits`-bit codes, one scale and one bias per
    /// `group` values of a head's row.
    Quantized { bits: i32, group: i32 },
}

impl KvFormat {
    /// 8-bit rows of `head_dim` values, in groups of 64 values, or of 32 where 64 does not
    /// divide the row; other widths, and other numbers of bits, are refused, naming the fix.
    pub fn quantized(bits: i32, head_dim: i32) -> std::result::Result<Self, String> {
        if bits != 8 {
            return Err(format!("--kv-bits {bits}: a quantized KV cache has 8 bits a value; give --kv-bits 8"));
        }
        match [64, 32].into_iter().find(|g| head_dim % g == 0) {
            Some(group) => Ok(KvFormat::Quantized { bits, group }),
            None => Err(format!(
                "--kv-bits {bits}: a quantized KV cache takes rows of whole groups of 32 or 64 values, and this model's heads have {head_dim}; run without --kv-bits"
            )),
        }
    }

    /// What files call it: `plain`, or `affine-BITS-GROUP`.
    pub fn name(self) -> String {
        match self {
            KvFormat::Plain => "plain".into(),
            KvFormat::Quantized { bits, group } => format!("affine-{bits}-{group}"),
        }
    }

    /// Bytes of one stored row of `head_dim` values computed in `dtype_bytes`-byte floats.
    pub fn row_bytes(self, head_dim: usize, dtype_bytes: usize) -> u64 {
        let (d, item) = (head_dim as u64, dtype_bytes as u64);
        match self {
            KvFormat::Plain => d.saturating_mul(item),
            // Codes, then a scale and a bias per group, in the rows' dtype.
            KvFormat::Quantized { bits, group } => {
                let scales = d.div_ceil(group as u64).saturating_mul(2 * item);
                d.saturating_mul(bits as u64).div_ceil(8).saturating_add(scales)
            }
        }
    }
}

/// One of a [`KvCache`]'s key or value buffers, in its [`KvFormat`].
#[derive(Clone)]
enum Rows {
    Plain(SeqBuffer),
    // Boxed: three buffers, where most caches hold one.
    Quantized(Box<QuantizedSeqBuffer>),
}

impl Default for Rows {
    fn default() -> Self {
        Rows::Plain(SeqBuffer::default())
    }
}

impl Rows {
    fn new(format: KvFormat) -> Self {
        match format {
            KvFormat::Plain => Rows::default(),
            KvFormat::Quantized { bits, group } => Rows::Quantized(Box::new(QuantizedSeqBuffer::new(bits, group))),
        }
    }

    fn len(&self) -> usize {
        match self {
            Rows::Plain(b) => b.len(),
            Rows::Quantized(b) => b.len(),
        }
    }

    fn reserve(&mut self, tokens: usize) {
        match self {
            Rows::Plain(b) => b.reserve(tokens),
            Rows::Quantized(b) => b.reserve(tokens),
        }
    }

    fn append(&mut self, x: &Array) -> Result<()> {
        match self {
            Rows::Plain(b) => b.append(x),
            Rows::Quantized(b) => b.append(x),
        }
    }

    fn append_recent(&mut self, x: &Array) -> Result<()> {
        match self {
            Rows::Plain(b) => b.append_recent(x),
            Rows::Quantized(b) => b.append_recent(x),
        }
    }

    fn view(&mut self) -> Result<Option<Array>> {
        match self {
            Rows::Plain(b) => b.view(),
            Rows::Quantized(b) => b.view(),
        }
    }

    fn range(&self, start: usize, end: usize) -> Result<Array> {
        match self {
            Rows::Plain(b) => b.range(start, end),
            Rows::Quantized(b) => b.range(start, end),
        }
    }

    fn truncate(&mut self, len: usize) {
        match self {
            Rows::Plain(b) => b.truncate(len),
            Rows::Quantized(b) => b.truncate(len),
        }
    }

    fn remove(&mut self, start: usize, end: usize) -> Result<()> {
        match self {
            Rows::Plain(b) => b.remove(start, end),
            Rows::Quantized(b) => b.remove(start, end),
        }
    }

    fn nbytes(&self) -> usize {
        match self {
            Rows::Plain(b) => b.nbytes(),
            Rows::Quantized(b) => b.nbytes(),
        }
    }

    fn arrays(&self) -> Box<dyn Iterator<Item = Array> + '_> {
        match self {
            Rows::Plain(b) => Box::new(b.arrays()),
            Rows::Quantized(b) => Box::new(b.arrays()),
        }
    }

    /// The filled rows as held, named after `what` (see [`LayerState::Attention`]); none while
    /// empty.
    fn stored(&mut self, what: &str) -> Result<Vec<(String, Array)>> {
        let planes = match self {
            Rows::Plain(b) => vec![("", b.view()?)],
            Rows::Quantized(b) => {
                let [codes, scales, biases] = b.planes();
                vec![(".codes", codes.view()?), (".scales", scales.view()?), (".biases", biases.view()?)]
            }
        };
        Ok(planes.into_iter().filter_map(|(suffix, a)| Some((format!("{what}{suffix}"), a?))).collect())
    }

    /// Takes rows [`Rows::stored`] gave (of an empty buffer of the same format) as they are.
    fn restore(&mut self, rows: &[(String, Array)]) -> Result<()> {
        match (self, rows) {
            (Rows::Plain(b), [(_, a)]) => b.append(a),
            (Rows::Quantized(b), [(_, codes), (_, scales), (_, biases)]) => b.restore(codes, scales, biases),
            (_, rows) => Err(mlx_rs::error::Exception::custom(format!("{} arrays, not those of this cache's format", rows.len()))),
        }
    }
}

/// How a model sums up key windows: `span` holds the keys `[B, H, L, D]` of `windows` consecutive
/// windows of `kernel` keys, `stride` apart (L = (windows − 1)·stride + kernel); the result is one
/// row per window, `[B, H, windows, D]`.
pub type WindowSummary = fn(span: &Array, kernel: usize, stride: usize, windows: usize) -> Result<Array>;

/// One row per complete key window `[stride·c, stride·c + kernel)`, made by a model's
/// [`WindowSummary`] and kept up to date as keys are added.
///
/// Stored window-major, as `[B, 1, n, H·D]` rows, so that the first n windows of a sequence are
/// one contiguous piece of the buffer: [`KeyWindows::view`] hands them out without a copy (kernels
/// read them in place).
#[derive(Clone)]
pub struct KeyWindows {
    pub kernel: usize,
    pub stride: usize,
    windows: SeqBuffer,
    /// Heads and head dim of the keys (known from the first update).
    heads: i32,
    dim: i32,
}

impl KeyWindows {
    /// Number of complete windows in `len` keys.
    pub fn count_for(&self, len: usize) -> usize {
        if len < self.kernel {
            0
        } else {
            (len - self.kernel) / self.stride + 1
        }
    }

    fn update(&mut self, keys: &Rows, len: usize, summarize: WindowSummary) -> Result<()> {
        let done = self.windows.len();
        let wanted = self.count_for(len);
        if wanted <= done {
            return Ok(());
        }
        let new = wanted - done;
        let start = done * self.stride;
        let span = keys.range(start, start + (new - 1) * self.stride + self.kernel)?;
        let rows = summarize(&span, self.kernel, self.stride, new)?;
        let s = rows.shape();
        (self.heads, self.dim) = (s[1], s[3]);
        self.windows.append(&rows.swap_axes(1, 2)?.reshape(&[s[0], 1, new as i32, s[1] * s[3]])?)
    }

    /// The windows `[B, H, n, D]`: a transposed view of the window-major rows (`None` while empty).
    fn view(&mut self) -> Result<Option<Array>> {
        let (h, d) = (self.heads, self.dim);
        let Some((data, _, n)) = self.windows.parts()? else { return Ok(None) };
        if data.shape()[0] == 1 {
            // The first n rows of the buffer, strided as a buffer of their own: MLX takes a slice
            // of [1, 1, capacity, H·D] as not contiguous and would copy it on every reshape.
            let rows = data.as_strided(&[n as i32, h, d][..], &[(h * d) as i64, d as i64, 1][..], 0)?;
            return Ok(Some(rows.expand_dims(0)?.swap_axes(1, 2)?));
        }
        let rows = self.windows.view()?.expect("windows are stored");
        Ok(Some(rows.reshape(&[rows.shape()[0], -1, h, d])?.swap_axes(1, 2)?))
    }
}

/// StreamingLLM: keep the first `sinks` tokens plus the most recent ones, at most `capacity` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub capacity: usize,
    pub sinks: usize,
}

impl Window {
    pub fn validate(self) -> std::result::Result<Self, String> {
        if self.capacity < 16 || self.sinks + 8 > self.capacity {
            return Err(format!(
                "--context-size {} with --num-sink-tokens {}: the window must hold at least 16 tokens and 8 more than the sinks",
                self.capacity, self.sinks
            ));
        }
        Ok(self)
    }

    /// Tokens dropped at once when the window overflows, so eviction (a copy of the cache) happens
    /// once every `batch` decode steps rather than every step.
    fn batch(self) -> usize {
        ((self.capacity - self.sinks) / 8).max(1)
    }
}

/// A cache's keys and values as stored (see [`SeqBuffer`]): positions `0..settled` in the
/// history buffers `keys`/`values` `[B, Hkv, capacity, d]`, positions `settled..len` in the
/// recent-token buffers (`None` when `settled == len`). Kernels read the buffers in place: they
/// must be whole, row-contiguous arrays (as a cache's are), not views. (The arrays are handles:
/// holding them shares the cache's buffers.) A quantized cache's buffers hold codes
/// `[B, Hkv, capacity, d·bits/32]` (u32), with their scales and biases in `scales`.
#[derive(Clone)]
pub struct KvParts {
    pub keys: Array,
    pub values: Array,
    pub recent: Option<(Array, Array)>,
    pub settled: usize,
    pub len: usize,
    pub scales: Option<KvScales>,
    /// In a fixed decode step, the device's counts (`len` is then the host's count when the
    /// step was traced: not to be read; `settled` holds for the step's graph).
    pub counts: Option<StepCounts>,
}

/// The integers of one sequence's decode step that the device holds instead of the host, so
/// that the step's graph is the same at every token (engine::fixed_step): `[1]` int32 each.
#[derive(Clone)]
pub struct StepCounts {
    /// The new token's position.
    pub position: Array,
    /// Where in the recent-token buffers the new token goes (the tokens there before it).
    pub recent_at: Array,
    /// Tokens in the recent-token buffers with the new one.
    pub recent_filled: Array,
    /// Tokens in the cache with the new one (the next token's position).
    pub len: Array,
}

impl StepCounts {
    /// The counts of a step at `position` (`[1]` int32) on a cache whose history holds `settled`
    /// tokens (the rest are recent tokens).
    pub fn new(position: &Array, settled: usize) -> Result<Self> {
        let recent_at = position.subtract(Array::from_int(settled as i32))?;
        let one = Array::from_int(1);
        Ok(Self { recent_filled: recent_at.add(&one)?, recent_at, len: position.add(&one)?, position: position.clone() })
    }
}

/// The scales and biases of a quantized cache's codes ([`QuantizedSeqBuffer`]), buffer by buffer
/// as [`KvParts`] holds the codes: `[B, Hkv, capacity, d / group]` each, in the rows' dtype.
#[derive(Clone)]
pub struct KvScales {
    pub bits: i32,
    pub group: i32,
    /// The history's key scales, key biases, value scales and value biases.
    pub history: [Array; 4],
    /// The recent tokens' likewise (`Some` exactly when [`KvParts::recent`] is).
    pub recent: Option<[Array; 4]>,
}

impl KvParts {
    /// Buffers `[B, Hkv, capacity, d]` holding all `len` positions (no recent tokens).
    pub fn history(keys: &Array, values: &Array, len: usize) -> Self {
        Self { keys: keys.clone(), values: values.clone(), recent: None, settled: len, len, scales: None, counts: None }
    }

    /// The filled keys and values `[B, Hkv, len, d]` as contiguous arrays (a copy when there
    /// are recent tokens, or the codes dequantized).
    pub fn filled(&self) -> Result<(Array, Array)> {
        if self.counts.is_some() {
            return Err(mlx_rs::error::Exception::custom("a fixed step's cache has no host length: read it with a mask"));
        }
        let join = |history: &Array, recent: Option<&Array>| -> Result<Array> {
            let settled = history.try_index((.., .., ..self.settled as i32, ..))?;
            match recent {
                Some(r) => ops::concatenate(&[settled, r.try_index((.., .., ..(self.len - self.settled) as i32, ..))?], 2),
                None => Ok(settled),
            }
        };
        let recent = self.recent.as_ref();
        let (keys, values) = (join(&self.keys, recent.map(|r| &r.0))?, join(&self.values, recent.map(|r| &r.1))?);
        let Some(q) = &self.scales else { return Ok((keys, values)) };
        let plane = |i: usize| join(&q.history[i], q.recent.as_ref().map(|r| &r[i]));
        let dequantize = |codes: &Array, s: usize| ops::dequantize(codes, &plane(s)?, &plane(s + 1)?, q.group, q.bits);
        Ok((dequantize(&keys, 0)?, dequantize(&values, 2)?))
    }

    /// These parts with plain rows, for readers of plain rows only: a quantized cache's rows
    /// dequantized into one history (a copy of the whole cache), else the buffers as they are.
    pub fn dequantized(&self) -> Result<KvParts> {
        if self.scales.is_none() {
            return Ok(self.clone());
        }
        let (keys, values) = self.filled()?;
        Ok(KvParts::history(&keys, &values, self.len))
    }
}

#[derive(Clone, Default)]
pub struct KvCache {
    keys: Rows,
    values: Rows,
    pooled: Vec<KeyWindows>,
    window: Option<Window>,
    /// Tokens dropped by the window so far (positions keep counting past them).
    evicted: usize,
    /// Set in a fixed decode step's view of the cache ([`KvCache::fixed_step_view`]).
    counts: Option<StepCounts>,
}

impl KvCache {
    /// An empty cache keeping its rows in `format`, with a StreamingLLM `window` if given.
    pub fn new(format: KvFormat, window: Option<Window>) -> Self {
        Self { keys: Rows::new(format), values: Rows::new(format), window, ..Self::default() }
    }

    pub fn windowed(window: Window) -> Self {
        Self::new(KvFormat::Plain, Some(window))
    }

    /// How it keeps its rows.
    pub fn format(&self) -> KvFormat {
        match &self.keys {
            Rows::Plain(_) => KvFormat::Plain,
            Rows::Quantized(b) => KvFormat::Quantized { bits: b.bits, group: b.group },
        }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Position of the next token: everything seen, including evicted tokens.
    pub fn position(&self) -> usize {
        self.keys.len() + self.evicted
    }

    /// With a window, drops the oldest non-sink tokens once the cache is over capacity. Called after
    /// attention, so the tokens of one forward pass all saw each other.
    pub fn evict(&mut self) -> Result<()> {
        let Some(w) = self.window else { return Ok(()) };
        let len = self.len();
        if len <= w.capacity {
            return Ok(());
        }
        let drop = (len - w.capacity + w.batch()).min(len - w.sinks);
        self.keys.remove(w.sinks, w.sinks + drop)?;
        self.values.remove(w.sinks, w.sinks + drop)?;
        self.evicted += drop;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Expects `tokens` in all (prompt and generation), so that the history is allocated at that
    /// length rather than grown past it (a windowed cache keeps its own bound).
    pub fn reserve(&mut self, tokens: usize) {
        if self.window.is_none() {
            self.keys.reserve(tokens);
            self.values.reserve(tokens);
        }
    }

    /// Appends `[B, Hkv, T, d]` keys and values; returns all keys and values so far.
    pub fn append(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        self.keys.append(k)?;
        self.values.append(v)?;
        Ok((self.keys.view()?.expect("just appended"), self.values.view()?.expect("just appended")))
    }

    /// Appends `[B, Hkv, T, d]` keys and values for readers of [`KvCache::parts`] (see
    /// [`SeqBuffer::append_recent`]: no copy of the history while the device still reads it).
    pub fn append_recent(&mut self, k: &Array, v: &Array) -> Result<()> {
        self.keys.append_recent(k)?;
        self.values.append_recent(v)
    }

    /// The recent-token buffers of keys and values `[B, Hkv, RECENT, d]` and the position in them
    /// of the next token, for a kernel that writes one token into copies of them (see
    /// [`SeqBuffer`]); `None` while the cache is empty. Hand the copies to
    /// [`KvCache::commit_recent`].
    ///
    /// A quantized cache hands out a one-token buffer instead, whose token
    /// [`KvCache::commit_recent`] quantizes and appends.
    pub fn recent_slot(&mut self) -> Result<Option<(Array, Array, usize)>> {
        match (&mut self.keys, &mut self.values) {
            (Rows::Plain(keys), Rows::Plain(values)) => {
                let (Some((keys, at)), Some((values, _))) = (keys.recent_slot()?, values.recent_slot()?) else {
                    return Ok(None);
                };
                Ok(Some((keys, values, at)))
            }
            (Rows::Quantized(keys), Rows::Quantized(values)) if !keys.is_empty() => {
                Ok(keys.token_slot()?.zip(values.token_slot()?).map(|(k, v)| (k, v, 0)))
            }
            _ => Ok(None),
        }
    }

    /// Takes the buffers of [`KvCache::recent_slot`] with the token written: one token more.
    pub fn commit_recent(&mut self, keys: Array, values: Array) -> Result<()> {
        match (&mut self.keys, &mut self.values) {
            (Rows::Plain(k), Rows::Plain(v)) => {
                k.commit_recent(keys);
                v.commit_recent(values);
                Ok(())
            }
            _ => self.append_recent(&keys, &values),
        }
    }

    /// The keys and values as they are stored, for kernels that read them in place (`None`
    /// while empty). The buffers are whole arrays, row-contiguous. A quantized cache gives its
    /// codes with their scales and biases ([`KvScales`]); [`KvParts::dequantized`] makes rows of
    /// them for readers of rows.
    pub fn parts(&mut self) -> Result<Option<KvParts>> {
        let len = self.len();
        if len == 0 {
            return Ok(None);
        }
        match (&mut self.keys, &mut self.values) {
            (Rows::Plain(keys), Rows::Plain(values)) => {
                let (Some((keys, recent_keys, settled)), Some((values, recent_values, _))) = (keys.parts()?, values.parts()?) else {
                    return Ok(None);
                };
                let recent = recent_keys.zip(recent_values).map(|(k, v)| (k.clone(), v.clone()));
                Ok(Some(KvParts { keys: keys.clone(), values: values.clone(), recent, settled, len, scales: None, counts: self.counts.clone() }))
            }
            (Rows::Quantized(keys), Rows::Quantized(values)) => {
                let (Some([codes_k, scales_k, biases_k]), Some([codes_v, scales_v, biases_v])) = (keys.parts()?, values.parts()?) else {
                    return Ok(None);
                };
                let settled = codes_k.2;
                let recent = codes_k.1.clone().zip(codes_v.1.clone());
                let recent_scales = match (scales_k.1, biases_k.1, scales_v.1, biases_v.1) {
                    (Some(a), Some(b), Some(c), Some(d)) => Some([a, b, c, d]),
                    _ => None,
                };
                let scales = KvScales {
                    bits: keys.bits,
                    group: keys.group,
                    history: [scales_k.0, biases_k.0, scales_v.0, biases_v.0],
                    recent: recent_scales,
                };
                Ok(Some(KvParts { keys: codes_k.0, values: codes_v.0, recent, settled, len, scales: Some(scales), counts: None }))
            }
            (keys, values) => Ok(Some(KvParts::history(&keys.range(0, len)?, &values.range(0, len)?, len))),
        }
    }

    /// The rows `[B, Hkv, n, d]` that `summarize` makes of the key windows of `kernel` keys,
    /// `stride` apart, brought up to date with the cache: computed in full on first use,
    /// incrementally afterwards. A transposed view of window-major storage (see [`KeyWindows`]).
    /// `None` while no window is complete. One summary is kept per (kernel, stride).
    pub fn key_windows(&mut self, kernel: usize, stride: usize, summarize: WindowSummary) -> Result<Option<Array>> {
        let i = match self.pooled.iter().position(|p| p.kernel == kernel && p.stride == stride) {
            Some(i) => i,
            None => {
                self.pooled.push(KeyWindows { kernel, stride, windows: SeqBuffer::default(), heads: 0, dim: 0 });
                self.pooled.len() - 1
            }
        };
        let len = self.len();
        if len > 0 {
            self.pooled[i].update(&self.keys, len, summarize)?;
        }
        self.pooled[i].view()
    }

    /// In a fixed decode step's view, the step's counts on the device.
    pub fn step_counts(&self) -> Option<&StepCounts> {
        self.counts.as_ref()
    }

    /// Readies the cache for a fixed decode step and gives what the step reads: the history
    /// and recent buffers of keys and values (in that order) and the history's length. `None`
    /// where such a step does not apply yet: an empty, quantized or windowed cache, or one with
    /// pooled key windows.
    pub fn fixed_step_inputs(&mut self) -> Result<Option<([Array; 4], usize)>> {
        if self.window.is_some() || !self.pooled.is_empty() || self.is_empty() {
            return Ok(None);
        }
        let (Rows::Plain(keys), Rows::Plain(values)) = (&mut self.keys, &mut self.values) else { return Ok(None) };
        let (Some((hk, rk, settled)), Some((hv, rv, _))) = (keys.fixed_step_parts()?, values.fixed_step_parts()?) else {
            return Ok(None);
        };
        Ok(Some(([hk, hv, rk, rv], settled)))
    }

    /// This cache holding `arrays` (as [`KvCache::fixed_step_inputs`] gave them) with the step's
    /// `counts`: what a fixed step's forward runs on while it is traced.
    pub fn fixed_step_view(&self, arrays: &[Array], counts: StepCounts) -> KvCache {
        let (Rows::Plain(keys), Rows::Plain(values)) = (&self.keys, &self.values) else {
            unreachable!("fixed_step_inputs takes plain rows only")
        };
        KvCache {
            keys: Rows::Plain(keys.with_arrays(arrays[0].clone(), arrays[2].clone())),
            values: Rows::Plain(values.with_arrays(arrays[1].clone(), arrays[3].clone())),
            counts: Some(counts),
            ..self.clone()
        }
    }

    /// The recent buffers of keys and values of a fixed step's view after its forward.
    pub fn fixed_step_outputs(&self) -> [Array; 2] {
        let (Rows::Plain(keys), Rows::Plain(values)) = (&self.keys, &self.values) else {
            unreachable!("fixed_step_inputs takes plain rows only")
        };
        [keys.recent.clone().expect("written"), values.recent.clone().expect("written")]
    }

    /// Whether it keeps a StreamingLLM window (and may drop tokens).
    pub fn is_windowed(&self) -> bool {
        self.window.is_some()
    }

    /// Rolls back to `len` tokens stored.
    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len);
        self.values.truncate(len);
        for p in &mut self.pooled {
            let keep = p.count_for(len);
            p.windows.truncate(keep);
        }
    }

    pub fn nbytes(&self) -> usize {
        self.keys.nbytes() + self.values.nbytes() + self.pooled.iter().map(|p| p.windows.nbytes()).sum::<usize>()
    }
}

/// The state of a recurrent (linear-attention) layer after `len` tokens.
#[derive(Clone, Default)]
pub struct RecurrentState {
    /// The sequence's own state `[1, …]` (None before the first token, or while `batch_row` holds it).
    state: Option<Array>,
    /// After a step decoded several sequences together: the stacked state `[B, …]` that step
    /// made, this sequence's row in it, and the step's number. The next batched step over the
    /// same sequences in the same order takes the stacked state as it is, instead of slicing B
    /// rows out and concatenating them back (2 operations per sequence and layer, which bounded
    /// batched decode on the host).
    batch_row: Option<(Array, usize, u64)>,
    pub len: usize,
    /// Set while speculative decoding verifies a draft: the layer then keeps `replay` for its
    /// next forward call, so the state can be rolled back to any length inside that call.
    pub record_replay: bool,
    /// The last forward call's starting point and inputs (only while `record_replay`; a call
    /// without it clears this, so a replay never describes anything but the last call).
    pub replay: Option<Replay>,
    /// Set in a fixed decode step's view of the state ([`ModelCache::fixed_step_view`]).
    counts: Option<StepCounts>,
}

impl RecurrentState {
    /// In a fixed decode step's view, the step's counts on the device.
    pub fn step_counts(&self) -> Option<&StepCounts> {
        self.counts.as_ref()
    }

    /// The state `[1, …]`, None before the first token (a row of a stacked state is sliced out).
    pub fn state(&self) -> Result<Option<Array>> {
        match &self.batch_row {
            Some((stacked, row, _)) => Ok(Some(stacked.try_index(*row as i32..*row as i32 + 1)?)),
            None => Ok(self.state.clone()),
        }
    }

    pub fn set_state(&mut self, state: Option<Array>) {
        self.state = state;
        self.batch_row = None;
    }

    /// Gives `states` the rows of `stacked` `[B, …]`, in order.
    pub fn set_stacked(states: &mut [&mut RecurrentState], stacked: &Array) {
        static STEPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let step = STEPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (row, s) in states.iter_mut().enumerate() {
            s.state = None;
            s.batch_row = Some((stacked.clone(), row, step));
        }
    }

    /// The stacked state of `states` if they are, in order, all the rows of one batched step's
    /// state ([`RecurrentState::set_stacked`]).
    pub fn stacked(states: &[&mut RecurrentState]) -> Option<Array> {
        let (stacked, _, step) = states.first()?.batch_row.as_ref()?;
        let whole = stacked.shape()[0] as usize == states.len()
            && states.iter().enumerate().all(|(i, s)| matches!(&s.batch_row, Some((_, row, st)) if *row == i && st == step));
        whole.then(|| stacked.clone())
    }

    fn nbytes(&self) -> usize {
        match &self.batch_row {
            Some((stacked, _, _)) => stacked.nbytes() / stacked.shape()[0].max(1) as usize,
            None => self.state.as_ref().map_or(0, |s| s.nbytes()),
        }
    }

    fn arrays(&self) -> Vec<Array> {
        self.state.iter().chain(self.batch_row.as_ref().map(|(stacked, _, _)| stacked)).cloned().collect()
    }
}

/// What a recurrent layer needs to recompute its state at any length inside one forward call:
/// the state before it and the call's per-token inputs (layer-specific, `[B, H, T, ·]`).
#[derive(Clone)]
pub struct Replay {
    pub state: Option<Array>,
    pub len: usize,
    pub inputs: Vec<Array>,
}

#[derive(Clone)]
pub enum LayerCache {
    Attention(KvCache),
    Recurrent(RecurrentState),
}

impl LayerCache {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match self {
            LayerCache::Attention(kv) => kv.position(),
            LayerCache::Recurrent(r) => r.len,
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Attention(kv) => kv.nbytes(),
            LayerCache::Recurrent(r) => r.nbytes(),
        }
    }
}

/// The whole state of one sequence.
#[derive(Clone)]
pub struct ModelCache {
    pub layers: Vec<LayerCache>,
}

/// A point a [`ModelCache`] can go back to after a draft ran on it: each layer's length and the
/// recurrent states (holding them is free: arrays are immutable and a step makes a new state,
/// whereas a clone of the whole cache would make the next key write copy the key buffer).
#[derive(Clone)]
pub struct Checkpoint {
    lens: Vec<usize>,
    recurrent: Vec<Option<RecurrentState>>,
}

impl Checkpoint {
    /// Tokens the cache held.
    pub fn len(&self) -> usize {
        self.lens.first().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the recurrent states it keeps.
    pub fn nbytes(&self) -> usize {
        self.recurrent.iter().flatten().map(RecurrentState::nbytes).sum()
    }

    /// The recurrent states, by layer (`None` for attention layers).
    pub fn recurrent_states(&self) -> impl Iterator<Item = Option<&RecurrentState>> {
        self.recurrent.iter().map(Option::as_ref)
    }

    /// A checkpoint of `len` tokens with these recurrent states (one per layer, `None` for
    /// attention layers), as read back from a file.
    pub fn from_states(len: usize, recurrent: Vec<Option<RecurrentState>>) -> Self {
        Self { lens: vec![len; recurrent.len()], recurrent }
    }
}

impl ModelCache {
    /// Expects `tokens` in all in every attention layer ([`KvCache::reserve`]).
    pub fn reserve(&mut self, tokens: usize) {
        for layer in &mut self.layers {
            if let LayerCache::Attention(kv) = layer {
                kv.reserve(tokens);
            }
        }
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            lens: self.layers.iter().map(LayerCache::len).collect(),
            recurrent: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerCache::Recurrent(r) => Some(r.clone()),
                    LayerCache::Attention(_) => None,
                })
                .collect(),
        }
    }

    /// A checkpoint that owns its recurrent states outright (a row of a batched step's stacked
    /// state is copied out, so keeping it does not keep the whole batch's state alive), with
    /// every array evaluated: for keeping a state long after the step that made it.
    pub fn detached_checkpoint(&self) -> Result<Checkpoint> {
        let mut checkpoint = self.checkpoint();
        for r in checkpoint.recurrent.iter_mut().flatten() {
            let state = match r.state()? {
                // A computed copy: MLX shares the buffer of a slice (and of `copy`).
                Some(s) if r.batch_row.is_some() => Some(s.multiply(scalar(1.0, s.dtype())?)?),
                s => s,
            };
            *r = RecurrentState { state, batch_row: None, len: r.len, record_replay: false, replay: None, counts: None };
        }
        let arrays: Vec<Array> = checkpoint.recurrent.iter().flatten().filter_map(|r| r.state.clone()).collect();
        // Other sequences' decode steps may still be encoding (a server round): this thread
        // evaluates only once the evaluator is idle.
        super::encoder::Encoder::for_this_thread().wait()?;
        mlx_rs::transforms::eval(&arrays)?;
        Ok(checkpoint)
    }

    /// Whether any layer keeps a recurrent state (which cannot be cut back to a shorter prefix).
    pub fn has_recurrent(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Recurrent(_)))
    }

    /// Drops the recurrent states (a kept state whose recurrent layers are restored from a
    /// [`Checkpoint`] needs only its attention layers).
    pub fn clear_recurrent(&mut self) {
        for layer in &mut self.layers {
            if let LayerCache::Recurrent(r) = layer {
                *r = RecurrentState::default();
            }
        }
    }

    /// Bytes of the attention layers' buffers (keys, values, pooled keys), capacity included.
    pub fn attention_nbytes(&self) -> usize {
        self.layers.iter().filter(|l| matches!(l, LayerCache::Attention(_))).map(LayerCache::nbytes).sum()
    }

    /// Goes back to `checkpoint` (taken from this cache, with no tokens evicted since).
    pub fn restore(&mut self, checkpoint: Checkpoint) {
        for ((layer, len), recurrent) in self.layers.iter_mut().zip(checkpoint.lens).zip(checkpoint.recurrent) {
            match (layer, recurrent) {
                (LayerCache::Attention(kv), _) => kv.truncate(len),
                (LayerCache::Recurrent(r), Some(saved)) => *r = saved,
                (LayerCache::Recurrent(_), None) => {}
            }
        }
    }

    /// Makes recurrent layers record (or stop recording) a [`Replay`] of their next forward call.
    pub fn record_replay(&mut self, on: bool) {
        for layer in &mut self.layers {
            if let LayerCache::Recurrent(r) = layer {
                r.record_replay = on;
            }
        }
    }

    /// Rolls every attention layer back to `len` tokens (recurrent layers are the model's job).
    pub fn truncate_attention(&mut self, len: usize) -> crate::engine::error::Result<()> {
        for layer in &mut self.layers {
            if let LayerCache::Attention(kv) = layer {
                if kv.evicted > 0 {
                    return Err(crate::engine::error::Error::Usage(
                        "cannot roll back a cache that dropped tokens (--context-size window)".into(),
                    ));
                }
                kv.truncate(len);
            }
        }
        Ok(())
    }

    /// Whether any layer keeps a StreamingLLM window.
    pub fn is_windowed(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Attention(kv) if kv.is_windowed()))
    }

    /// How its attention layers keep their rows (all alike: one model made them).
    pub fn kv_format(&self) -> KvFormat {
        self.layers.iter().find_map(|l| if let LayerCache::Attention(kv) = l { Some(kv.format()) } else { None }).unwrap_or_default()
    }

    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerCache::nbytes).sum()
    }

    /// Readies every layer for a fixed decode step (engine::fixed_step) and gives the arrays the
    /// step reads (an attention layer's four, [`KvCache::fixed_step_inputs`]; a recurrent layer's
    /// state), with the history length every attention layer shares; `None` where such a step
    /// does not apply (an empty state, or one recording for speculative decoding, too).
    pub fn fixed_step_inputs(&mut self) -> Result<Option<(Vec<Array>, usize)>> {
        let mut arrays = Vec::with_capacity(4 * self.layers.len());
        let mut shared = None;
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attention(kv) => {
                    let Some((four, settled)) = kv.fixed_step_inputs()? else { return Ok(None) };
                    if *shared.get_or_insert(settled) != settled {
                        return Ok(None);
                    }
                    arrays.extend(four);
                }
                LayerCache::Recurrent(r) => {
                    let (false, Some(state)) = (r.record_replay, r.state()?) else { return Ok(None) };
                    arrays.push(state);
                }
            }
        }
        Ok(shared.map(|settled| (arrays, settled)))
    }

    /// This cache holding `arrays` ([`ModelCache::fixed_step_inputs`]'s) with `counts` in every
    /// layer.
    pub fn fixed_step_view(&self, arrays: &[Array], counts: &StepCounts) -> ModelCache {
        let mut arrays = arrays.iter();
        let layers = self
            .layers
            .iter()
            .map(|layer| match layer {
                LayerCache::Attention(kv) => {
                    let four: Vec<Array> = arrays.by_ref().take(4).cloned().collect();
                    LayerCache::Attention(kv.fixed_step_view(&four, counts.clone()))
                }
                LayerCache::Recurrent(r) => LayerCache::Recurrent(RecurrentState {
                    state: arrays.next().cloned(),
                    batch_row: None,
                    len: r.len,
                    record_replay: false,
                    replay: None,
                    counts: Some(counts.clone()),
                }),
            })
            .collect();
        ModelCache { layers }
    }

    /// What a fixed step's view holds after its forward: an attention layer's two recent
    /// buffers, a recurrent layer's state.
    pub fn fixed_step_outputs(&self) -> Vec<Array> {
        self.layers
            .iter()
            .flat_map(|layer| match layer {
                LayerCache::Attention(kv) => kv.fixed_step_outputs().to_vec(),
                LayerCache::Recurrent(r) => vec![r.state.clone().expect("a fixed step's state")],
            })
            .collect()
    }

    /// Takes a fixed step's [`ModelCache::fixed_step_outputs`]: one token more in every layer.
    pub fn finish_fixed_step(&mut self, outputs: &[Array]) -> Result<()> {
        let mut outputs = outputs.iter();
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attention(kv) => {
                    let (Some(keys), Some(values)) = (outputs.next(), outputs.next()) else { break };
                    kv.commit_recent(keys.clone(), values.clone())?;
                }
                LayerCache::Recurrent(r) => {
                    r.set_state(outputs.next().cloned());
                    r.len += 1;
                    r.replay = None;
                }
            }
        }
        Ok(())
    }

    /// Every array the cache holds, for evaluating them together with the logits.
    pub fn arrays(&self) -> Vec<Array> {
        (0..self.layers.len()).flat_map(|i| self.layer_arrays(i)).collect()
    }

    /// The arrays of layer `layer`'s cache.
    pub fn layer_arrays(&self, layer: usize) -> Vec<Array> {
        match &self.layers[layer] {
            LayerCache::Attention(kv) => {
                let pooled = kv.pooled.iter().flat_map(|p| p.windows.arrays());
                kv.keys.arrays().chain(kv.values.arrays()).chain(pooled).collect()
            }
            LayerCache::Recurrent(r) => r.arrays(),
        }
    }
}

/// Layer `layer`'s caches of every sequence in a batch, all of the kind `pick` accepts; an error
/// names the layer when a cache belongs to another model.
pub fn layer_caches<'a, T>(
    caches: &'a mut [&mut ModelCache],
    layer: usize,
    pick: impl Fn(&mut LayerCache) -> Option<&mut T>,
) -> crate::engine::error::Result<Vec<&'a mut T>> {
    caches
        .iter_mut()
        .map(|c| {
            c.layers
                .get_mut(layer)
                .and_then(&pick)
                .ok_or_else(|| crate::engine::error::Error::Usage(format!("layer {layer}: cache does not belong to this model")))
        })
        .collect()
}

/// What layer `layer` of a forward call leaves behind: the hidden state `h` and every sequence's
/// cache of that layer (for [`crate::engine::ops::Pacer`]).
pub fn layer_outputs(h: &Array, caches: &[&mut ModelCache], layer: usize) -> Vec<Array> {
    std::iter::once(h.clone()).chain(caches.iter().flat_map(|c| c.layer_arrays(layer))).collect()
}

impl LayerCache {
    pub fn as_attention(&mut self) -> Option<&mut KvCache> {
        match self {
            LayerCache::Attention(kv) => Some(kv),
            LayerCache::Recurrent(_) => None,
        }
    }

    pub fn as_recurrent(&mut self) -> Option<&mut RecurrentState> {
        match self {
            LayerCache::Recurrent(r) => Some(r),
            LayerCache::Attention(_) => None,
        }
    }
}

/// One layer's state as plain arrays (for files): an attention layer's filled keys and values
/// as stored, and pooled key windows, or a recurrent layer's state.
pub enum LayerState {
    /// `rows`: named arrays `[1, Hkv, len, ·]`: `keys` and `values` `[…, d]`, or for a quantized
    /// cache `keys.codes`, `keys.scales`, `keys.biases` and the same of the values, exactly as
    /// held (read back without quantizing again). Empty while no token is stored.
    Attention { rows: Vec<(String, Array)>, pooled: Vec<KeyWindowsState> },
    Recurrent { state: Option<Array>, len: usize },
}

/// Pooled key windows as stored: window-major rows `[1, 1, n, H·d]`.
pub struct KeyWindowsState {
    pub kernel: usize,
    pub stride: usize,
    pub heads: i32,
    pub dim: i32,
    pub windows: Array,
}

impl ModelCache {
    /// Every layer's state as plain arrays (copies where tokens sit in two buffers). A windowed
    /// cache (tokens dropped) is refused: it no longer holds the tokens it counts.
    pub fn export(&self) -> crate::engine::error::Result<Vec<LayerState>> {
        if self.is_windowed() {
            return Err(crate::engine::error::Error::Usage(
                "a cache with a --context-size window cannot be saved: it has dropped tokens".into(),
            ));
        }
        let mut cache = self.clone();
        let mut layers = Vec::new();
        for layer in &mut cache.layers {
            layers.push(match layer {
                LayerCache::Attention(kv) => {
                    let mut rows = kv.keys.stored("keys")?;
                    rows.extend(kv.values.stored("values")?);
                    let mut pooled = Vec::new();
                    for p in &mut kv.pooled {
                        if let Some(windows) = p.windows.view()? {
                            pooled.push(KeyWindowsState { kernel: p.kernel, stride: p.stride, heads: p.heads, dim: p.dim, windows });
                        }
                    }
                    LayerState::Attention { rows, pooled }
                }
                LayerCache::Recurrent(r) => LayerState::Recurrent { state: r.state()?, len: r.len },
            });
        }
        Ok(layers)
    }

    /// A cache holding `layers` (from [`ModelCache::export`]), built on `fresh` (the model's own
    /// empty cache): each layer must be of the kind the model has there.
    pub fn import(fresh: ModelCache, layers: Vec<LayerState>) -> std::result::Result<ModelCache, String> {
        if fresh.layers.len() != layers.len() {
            return Err(format!("it holds {} layers, the model has {}", layers.len(), fresh.layers.len()));
        }
        let mut cache = fresh;
        for (i, (layer, state)) in cache.layers.iter_mut().zip(layers).enumerate() {
            match (layer, state) {
                (LayerCache::Attention(kv), LayerState::Attention { rows, pooled }) => {
                    if !rows.is_empty() {
                        let (keys, values) = rows.split_at(rows.len() / 2);
                        kv.keys.restore(keys).map_err(|e| format!("layer {i} keys: {e}"))?;
                        kv.values.restore(values).map_err(|e| format!("layer {i} values: {e}"))?;
                    }
                    for p in pooled {
                        let mut windows = SeqBuffer::default();
                        windows.append(&p.windows).map_err(|e| e.to_string())?;
                        kv.pooled.push(KeyWindows { kernel: p.kernel, stride: p.stride, windows, heads: p.heads, dim: p.dim });
                    }
                }
                (LayerCache::Recurrent(r), LayerState::Recurrent { state, len }) => {
                    r.set_state(state);
                    r.len = len;
                }
                _ => return Err(format!("layer {i} is of another kind (attention or recurrent) than the model's")),
            }
        }
        Ok(cache)
    }
}
