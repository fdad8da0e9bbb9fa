//! Building blocks shared by the model families.

use crate::engine::distributed::TensorParallel;
use crate::engine::error::{Error, Result};
use crate::engine::model::{Logits, Trace};
use crate::engine::ops::scalar;
use crate::engine::quant::QuantizedMatrix;
use crate::engine::weights::{Part, Weights};
use crate::engine::device::on_cpu;
use crate::kernels::dequantize::dequantize;
use crate::kernels::epilogue::apply_epilogue;
use crate::kernels::fp8;
use crate::kernels::qmv::{quantized_matmul_t, quantized_matmul_t_normed, quantized_matmul_t_then, swiglu_mlx, Epilogue, GateIn, RmsNormIn};
use mlx_rs::{fast, ops, ops::indexing::TryIndexOp, Array, Dtype};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// A projection's input: x itself, or RMSNorm(x) not yet applied, so that the quantized decode
/// kernel can fold the normalisation into its product (one operation fewer before each of them).
#[derive(Clone, Copy)]
pub enum Input<'a> {
    Plain(&'a Array),
    Normed(&'a Array, &'a RmsNorm),
    /// RMSNorm(x) ⊙ σ(z), the output norm and gate of a lightning layer.
    NormGated(&'a Array, &'a RmsNorm, GateIn<'a>),
}

impl Input<'_> {
    /// The input's shape (the normalisation keeps it).
    pub fn shape(&self) -> &[i32] {
        match self {
            Input::Plain(x) | Input::Normed(x, _) | Input::NormGated(x, ..) => x.shape(),
        }
    }

    /// The input as an array (normalised and gated by MLX's RMSNorm or the norm-gate kernel).
    pub fn array(&self) -> Result<Array> {
        match self {
            Input::Plain(x) => Ok((*x).clone()),
            Input::Normed(x, norm) => norm.forward(x),
            Input::NormGated(x, norm, gate) => Ok(norm.input(Some(*gate)).apply(x)?),
        }
    }
}

/// A `[out, in]` matrix, in float or MLX-quantized.
#[derive(Clone)]
pub enum Matrix {
    Dense(Array),
    Quantized(QuantizedMatrix),
}

impl Matrix {
    /// Loads `{module}.weight` (and `.scales`/`.biases` when the checkpoint quantized it).
    pub fn load(weights: &Weights, module: &str, dtype: Dtype) -> Result<Self> {
        Self::load_part(weights, module, dtype, Part::Whole)
    }

    /// Loads `part` of the `[out, in]` matrix `module`: a block of output rows or of input
    /// columns, in the matrix's own (unpacked) units. A quantized matrix is split as stored,
    /// never expanded: its packed words and its scales and biases by whole quantization groups.
    pub fn load_part(weights: &Weights, module: &str, dtype: Dtype, part: Part) -> Result<Self> {
        let weight = format!("{module}.weight");
        Ok(match weights.quantized(module) {
            Some(format) => {
                let (packed, groups) = match &part {
                    Part::Cols(c) => {
                        let g = format.group_size as usize;
                        if c.start % g != 0 || c.len() % g != 0 {
                            return Err(Error::Usage(format!(
                                "tensor parallelism gives each rank {} of `{module}`'s input columns, not a multiple of its \
                                 quantization group size {g}: choose a --tp whose share is a multiple of {g}",
                                c.len()
                            )));
                        }
                        let words = |n: usize| n * format.bits as usize / 32;
                        (Part::Cols(words(c.start)..words(c.end)), Part::Cols(c.start / g..c.end / g))
                    }
                    rows => (rows.clone(), rows.clone()),
                };
                Matrix::Quantized(
                    QuantizedMatrix {
                        packed: weights.raw_part(&weight, &packed)?,
                        scales: weights.raw_part(&format!("{module}.scales"), &groups)?,
                        biases: weights.raw_part(&format!("{module}.biases"), &groups)?,
                        format,
                    }
                    .for_device(dtype)?,
                )
            }
            None => Matrix::Dense(weights.get_part(&weight, &part, dtype)?),
        })
    }

    /// x · Wᵀ.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        self.matmul_t_then(x, Epilogue::Plain)
    }

    /// x · Wᵀ followed by `epilogue` (one kernel on the quantized decode path).
    pub fn matmul_t_then(&self, x: &Array, epilogue: Epilogue) -> Result<Array> {
        match self {
            Matrix::Dense(w) if in_fp8(x, w.shape()[1], w.shape()[0]) => Ok(apply_epilogue(&fp8::matmul_t(x, &fp8::rows_to_e4m3(w, fp8::weight_tile_rows())?)?, epilogue)?),
            Matrix::Dense(w) => Ok(apply_epilogue(&x.matmul(w.t())?, epilogue)?),
            Matrix::Quantized(q) => quantized_product(q, x, epilogue),
        }
    }

    /// [`Matrix::matmul_t_then`] of an [`Input`].
    pub fn matmul_t_in(&self, x: Input, epilogue: Epilogue) -> Result<Array> {
        match (self, x) {
            (Matrix::Quantized(q), Input::Normed(x, norm)) => quantized_product_normed(q, x, norm.input(None), epilogue),
            (Matrix::Quantized(q), Input::NormGated(x, norm, gate)) => quantized_product_normed(q, x, norm.input(Some(gate)), epilogue),
            (_, Input::Plain(x)) => self.matmul_t_then(x, epilogue),
            (Matrix::Dense(_), x) => self.matmul_t_then(&x.array()?, epilogue),
        }
    }

    fn eval(&self) -> Result<()> {
        match self {
            Matrix::Dense(w) => mlx_rs::transforms::eval([w])?,
            Matrix::Quantized(q) => mlx_rs::transforms::eval([&q.packed, &q.scales, &q.biases])?,
        }
        Ok(())
    }

    /// Output rows.
    pub fn out_features(&self) -> i32 {
        match self {
            Matrix::Dense(w) => w.shape()[0],
            Matrix::Quantized(q) => q.packed.shape()[0],
        }
    }

    /// The matrices stacked along their output rows, when they are stored alike (all float, or all
    /// quantized in one format); `None` otherwise.
    fn stack(parts: &[&Matrix]) -> Result<Option<Matrix>> {
        let dense: Option<Vec<&Array>> = parts.iter().map(|m| if let Matrix::Dense(w) = m { Some(w) } else { None }).collect();
        if let Some(ws) = dense {
            return Ok(Some(Matrix::Dense(ops::concatenate(&ws, 0)?)));
        }
        let quantized: Option<Vec<&QuantizedMatrix>> =
            parts.iter().map(|m| if let Matrix::Quantized(q) = m { Some(q) } else { None }).collect();
        let Some(qs) = quantized.filter(|qs| qs.iter().all(|q| q.format == qs[0].format)) else { return Ok(None) };
        let join = |pick: fn(&QuantizedMatrix) -> &Array| ops::concatenate(&qs.iter().map(|q| pick(q)).collect::<Vec<_>>(), 0);
        Ok(Some(Matrix::Quantized(QuantizedMatrix {
            packed: join(|q| &q.packed)?,
            scales: join(|q| &q.scales)?,
            biases: join(|q| &q.biases)?,
            format: qs[0].format,
        })))
    }
}

/// Input rows from which the CPU multiplies by the dequantized matrix through BLAS: MLX's CPU
/// quantized product takes one row at a time (eval/results/kernel-notes.md).
const CPU_DEQUANTIZE_ROWS: i32 = 6;
/// Input rows (prefill chunks) from which a GPU multiplies by the dequantized matrix: the matrix
/// units beat MLX's CUDA quantized product there (eval/results/kernel-notes.md).
pub(crate) const GPU_DEQUANTIZE_ROWS: i32 = 256;

/// Whether prompt chunks multiply in FP8 (`--prompt-fp8`), set by the loading path: e4m3 products
/// are not the exact ones, so only a user's choice turns them on.
static PROMPT_FP8: AtomicBool = AtomicBool::new(false);

/// Prompt chunks of this process multiply in FP8 ([`fp8`]) where its kernels run, or exactly.
pub fn set_prompt_fp8(on: bool) {
    PROMPT_FP8.store(on, Ordering::Relaxed);
}

/// Whether a product of x (`[…, k]`) into `n` outputs runs in FP8: asked for, a prompt chunk
/// (as many rows as take the dequantized product), and a shape the kernels take.
fn in_fp8(x: &Array, k: i32, n: i32) -> bool {
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    PROMPT_FP8.load(Ordering::Relaxed) && rows >= GPU_DEQUANTIZE_ROWS && fp8::supports(k, n) && fp8::available()
}

/// x · Wᵀ for a quantized W, then `epilogue`: the decode kernel (kernels::qmv) where it runs,
/// else the product of the dequantized matrix. On the CPU in float32: MLX's CPU kernel
/// accumulates in the input dtype, which loses precision in bf16 (eval/results/kernel-notes.md).
fn quantized_product(q: &QuantizedMatrix, x: &Array, epilogue: Epilogue) -> Result<Array> {
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    let in_float32_dequantized = || -> Result<Array> {
        let y = x.as_dtype(Dtype::Float32)?.matmul(expanded(q)?.as_dtype(Dtype::Float32)?.t())?;
        Ok(apply_epilogue(&y.as_dtype(x.dtype())?, epilogue)?)
    };
    if on_cpu() {
        if rows >= CPU_DEQUANTIZE_ROWS {
            return in_float32_dequantized();
        }
    } else if in_fp8(x, q.in_features(), q.packed.shape()[0]) {
        let w = fp8::quantized_to_e4m3(&q.packed, &q.scales, &q.biases, q.format.group_size, q.format.bits, fp8::weight_tile_rows())?;
        return Ok(apply_epilogue(&fp8::matmul_t(x, &w)?, epilogue)?);
    } else if dequantizes_on_gpu(q, rows) {
        // The expanded copy lives for one product.
        return Ok(apply_epilogue(&x.matmul(expanded(q)?.as_dtype(x.dtype())?.t())?, epilogue)?);
    }
    let fmt = q.format;
    if scales_wider_than(q, x) {
        // The product in float32, the epilogue in x's dtype.
        let y = quantized_matmul_t(&x.as_dtype(Dtype::Float32)?, &q.packed, &q.scales, &q.biases, fmt.group_size, fmt.bits)?;
        return Ok(apply_epilogue(&y.as_dtype(x.dtype())?, epilogue)?);
    }
    Ok(quantized_matmul_t_then(x, &q.packed, &q.scales, &q.biases, fmt.group_size, fmt.bits, epilogue)?)
}

/// [`quantized_product`] of `RMSNorm(x)` (gated or not): the norm folded into the decode kernel
/// where that runs the product, applied first otherwise.
fn quantized_product_normed(q: &QuantizedMatrix, x: &Array, norm: RmsNormIn, epilogue: Epilogue) -> Result<Array> {
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    let kernel_path = !on_cpu() && !dequantizes_on_gpu(q, rows) && !scales_wider_than(q, x);
    if !kernel_path {
        return quantized_product(q, &norm.apply(x)?, epilogue);
    }
    let fmt = q.format;
    Ok(quantized_matmul_t_normed(x, norm, &q.packed, &q.scales, &q.biases, fmt.group_size, fmt.bits, epilogue)?)
}

/// Whether a GPU product of `rows` input rows multiplies the expanded weights: prefill chunks, and
/// matrices narrower than 128 columns (MLX 0.32.2's CUDA quantized product is wrong for K = 64,
/// tests/quantize.rs).
fn dequantizes_on_gpu(q: &QuantizedMatrix, rows: i32) -> bool {
    q.in_features() < 128 || rows >= GPU_DEQUANTIZE_ROWS
}

/// The matrix expanded to its scales' dtype, for a product of many rows.
fn expanded(q: &QuantizedMatrix) -> Result<Array> {
    Ok(dequantize(&q.packed, &q.scales, &q.biases, q.format.group_size, q.format.bits)?)
}

/// Whether the scales are float32 and x is not (the product then runs in float32).
fn scales_wider_than(q: &QuantizedMatrix, x: &Array) -> bool {
    q.scales.dtype() == Dtype::Float32 && x.dtype() != Dtype::Float32
}

/// Several projections of the same input (q/k/v, gate/up) multiplied as one stacked matrix: one
/// kernel launch instead of several, which is what a decode step is short of. Kept apart when
/// their storage differs (a mixed-precision quantization).
pub struct Projections<const N: usize> {
    stacked: Option<(Matrix, [i32; N])>,
    /// The stacked biases, added after the product (Qwen2's q/k/v).
    bias: Option<Array>,
    parts: Vec<Linear>,
}

impl<const N: usize> Projections<N> {
    /// The projections `names` (with their `.bias` vectors, if `bias`), each split by output rows
    /// over the ranks of `tp` (column-parallel).
    pub fn load(weights: &Weights, names: [String; N], dtype: Dtype, bias: bool, tp: &TensorParallel) -> Result<Self> {
        let rows = names.iter().map(|n| Linear::share(weights, n, 0, tp)).collect::<Result<Vec<_>>>()?;
        Self::load_rows(weights, names, rows, dtype, bias)
    }

    /// The projections `names` (with their `.bias` vectors, if `bias`), each its given block of
    /// output rows (`None`: all of them).
    pub fn load_rows(weights: &Weights, names: [String; N], rows: Vec<Option<Range<usize>>>, dtype: Dtype, bias: bool) -> Result<Self> {
        let parts = names.iter().zip(rows).map(|(n, rows)| Linear::rows_of(weights, n, dtype, bias, rows)).collect::<Result<Vec<_>>>()?;
        let matrices: Vec<&Matrix> = parts.iter().map(|p| &p.weight).collect();
        let Some(stacked) = Matrix::stack(&matrices)? else { return Ok(Self { stacked: None, bias: None, parts }) };
        let bias = bias.then(|| ops::concatenate(&parts.iter().filter_map(|p| p.bias.as_ref()).collect::<Vec<_>>(), 0)).transpose()?;
        // Built now, so the separate matrices are freed as loading goes rather than all being held
        // until the first forward pass.
        stacked.eval()?;
        let widths = std::array::from_fn(|i| matrices[i].out_features());
        Ok(Self { stacked: Some((stacked, widths)), bias, parts: Vec::new() })
    }

    /// The stacked product, then the biases.
    fn stacked_product(&self, matrix: &Matrix, x: Input, epilogue: Epilogue) -> Result<Array> {
        match &self.bias {
            None => matrix.matmul_t_in(x, epilogue),
            Some(b) => Ok(apply_epilogue(&matrix.matmul_t_in(x, Epilogue::Plain)?.add(b)?, epilogue)?),
        }
    }

    /// The projections of `x` side by side `[B, T, Σ out]`, in the order they were named.
    pub fn forward_joined(&self, x: Input) -> Result<Array> {
        match &self.stacked {
            Some((matrix, _)) => self.stacked_product(matrix, x, Epilogue::Plain),
            None => {
                let x = x.array()?;
                Ok(ops::concatenate(&self.parts.iter().map(|p| p.forward(&x)).collect::<Result<Vec<_>>>()?, -1)?)
            }
        }
    }

    /// Each projection of `x` `[B, T, in]`, in the order they were named.
    pub fn forward(&self, x: Input) -> Result<[Array; N]> {
        let outputs: Vec<Array> = match &self.stacked {
            None => {
                let x = x.array()?;
                self.parts.iter().map(|p| p.forward(&x)).collect::<Result<_>>()?
            }
            Some((matrix, widths)) => {
                let y = self.stacked_product(matrix, x, Epilogue::Plain)?;
                let mut start = 0;
                widths
                    .iter()
                    .map(|&w| {
                        start += w;
                        y.try_index((.., .., start - w..start))
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
        };
        Ok(outputs.try_into().unwrap_or_else(|_| unreachable!("N names give N outputs")))
    }
}

/// The output rows of a rank's heads in head-major projections: its query heads' (`q`) and its
/// key-value heads' (`kv`); `None` on one device (all rows).
#[derive(Debug, Clone)]
pub struct HeadRows {
    pub q: Option<Range<usize>>,
    pub kv: Option<Range<usize>>,
}

impl HeadRows {
    /// The query heads `heads` and KV heads `kv` (`TensorParallel::kv_heads`) a rank of `tp`
    /// holds, of `head_dim` rows each.
    pub fn of(tp: &TensorParallel, heads: &Range<usize>, kv: &Range<usize>, head_dim: usize) -> Self {
        let rows = |r: &Range<usize>| (!tp.is_single()).then(|| r.start * head_dim..r.end * head_dim);
        Self { q: rows(heads), kv: rows(kv) }
    }
}

/// An attention layer's q, k, v projections and, when it has one, its output-gate projection —
/// all of the same input, so stacked into one matrix with them (one launch fewer per layer and
/// decode step, which is bound by the host's work per operation).
pub enum QkvGate {
    Plain(Projections<3>),
    Gated(Projections<4>),
}

impl QkvGate {
    /// `{prefix}.q_proj`, `.k_proj`, `.v_proj` and `{prefix}.{gate}` when given: the rows of the
    /// query heads `heads.q` (and their gate) and of the KV heads `heads.kv`.
    pub fn load(weights: &Weights, prefix: &str, gate: Option<&str>, dtype: Dtype, heads: &HeadRows) -> Result<Self> {
        let name = |n: &str| format!("{prefix}.{n}");
        let (q, kv) = (heads.q.clone(), heads.kv.clone());
        Ok(match gate {
            None => Self::Plain(Projections::load_rows(weights, ["q_proj", "k_proj", "v_proj"].map(name), vec![q, kv.clone(), kv], dtype, false)?),
            Some(g) => Self::Gated(Projections::load_rows(weights, ["q_proj", "k_proj", "v_proj", g].map(name), vec![q.clone(), kv.clone(), kv, q], dtype, false)?),
        })
    }

    /// q, k, v and the gate's pre-activation (if any) of `x` side by side, `[B, T, W]`, in that order.
    pub fn forward_joined(&self, x: Input) -> Result<Array> {
        match self {
            Self::Plain(p) => p.forward_joined(x),
            Self::Gated(p) => p.forward_joined(x),
        }
    }

    /// q, k, v and the gate's pre-activation (if any) of `x` `[B, T, in]`.
    pub fn forward(&self, x: Input) -> Result<([Array; 3], Option<Array>)> {
        Ok(match self {
            Self::Plain(p) => (p.forward(x)?, None),
            Self::Gated(p) => {
                let [q, k, v, g] = p.forward(x)?;
                ([q, k, v], Some(g))
            }
        })
    }
}

/// y = x · Wᵀ (+ b). Under tensor parallelism a projection is either column-parallel (each rank
/// holds a block of W's output rows and computes that block of y) or row-parallel (each rank holds
/// a block of W's input columns, multiplies the matching block of x, and the ranks sum their
/// partial products before the bias).
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Array>,
    /// The ranks whose partial products are summed (row-parallel over more than one rank).
    sum_over: Option<TensorParallel>,
}

impl Linear {
    pub fn load(weights: &Weights, name: &str, dtype: Dtype) -> Result<Self> {
        Ok(Self { weight: Matrix::load(weights, name, dtype)?, bias: None, sum_over: None })
    }

    /// This rank's block of output rows of `name` (and of its bias vector `{name}.bias`, if `bias`).
    pub fn column_parallel(weights: &Weights, name: &str, dtype: Dtype, bias: bool, tp: &TensorParallel) -> Result<Self> {
        Self::rows_of(weights, name, dtype, bias, Self::share(weights, name, 0, tp)?)
    }

    /// The output rows `rows` of `name` (all when `None`), and of its bias vector if `bias`.
    pub fn rows_of(weights: &Weights, name: &str, dtype: Dtype, bias: bool, rows: Option<Range<usize>>) -> Result<Self> {
        let part = rows.map_or(Part::Whole, Part::Rows);
        let bias = bias.then(|| weights.get_part(&format!("{name}.bias"), &part, dtype)).transpose()?;
        Ok(Self { weight: Matrix::load_part(weights, name, dtype, part)?, bias, sum_over: None })
    }

    /// This rank's block of input columns of `name`; the bias `{name}.bias` (if `bias`) is whole,
    /// added once after the sum.
    pub fn row_parallel(weights: &Weights, name: &str, dtype: Dtype, bias: bool, tp: &TensorParallel) -> Result<Self> {
        let part = Self::share(weights, name, 1, tp)?.map_or(Part::Whole, Part::Cols);
        let bias = bias.then(|| weights.get(&format!("{name}.bias"), dtype)).transpose()?;
        Ok(Self { weight: Matrix::load_part(weights, name, dtype, part)?, bias, sum_over: (!tp.is_single()).then(|| tp.clone()) })
    }

    /// This rank's equal share of `name`'s dimension `axis` (0: rows, 1: columns); `None` on one
    /// device (all of it).
    fn share(weights: &Weights, name: &str, axis: usize, tp: &TensorParallel) -> Result<Option<std::ops::Range<usize>>> {
        if tp.is_single() {
            return Ok(None);
        }
        // A quantized matrix's header shape counts packed words; its scales count groups.
        let weight = format!("{name}.weight");
        let shape = &weights.infos().get(&weight).ok_or_else(|| Error::Usage(format!("internal: no tensor `{weight}`")))?.shape;
        let n = match (axis, weights.quantized(name)) {
            (1, Some(f)) => shape[1] as usize * 32 / f.bits as usize,
            _ => shape[axis] as usize,
        };
        let what = format!("`{name}`'s {}", if axis == 0 { "output rows" } else { "input columns" });
        Ok(Some(tp.part(n, &what)?))
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let mut y = self.weight.matmul_t(x)?;
        if let Some(tp) = &self.sum_over {
            y = tp.all_sum(&y)?;
        }
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    /// residual + α · (x · Wᵀ + b): a residual branch ending in this projection, added in one
    /// kernel with the product (and x's norm and gate, if any) on the quantized decode path.
    pub fn forward_residual(&self, x: Input, residual: &Array, alpha: f32) -> Result<Array> {
        let epilogue = Epilogue::Residual { residual, alpha };
        match (&self.bias, &self.sum_over) {
            (None, None) => self.weight.matmul_t_in(x, epilogue),
            (None, Some(tp)) => {
                // Rank 0 adds the residual in its product's kernel and the others add zeros, so
                // the sum is residual + α·Σ partials with one operation more than on one device.
                let zeros;
                let residual = if tp.is_leader() {
                    residual
                } else {
                    zeros = crate::engine::ops::zeros(residual.shape(), residual.dtype())?;
                    &zeros
                };
                let partial = self.weight.matmul_t_in(x, Epilogue::Residual { residual, alpha })?;
                Ok(tp.all_sum(&partial)?)
            }
            (Some(_), _) => Ok(apply_epilogue(&self.forward(&x.array()?)?, epilogue)?),
        }
    }
}

/// Token embeddings `[vocab, hidden]`; also the output projection when embeddings are tied.
pub struct Embedding {
    pub table: Matrix,
    dtype: Dtype,
}

impl Embedding {
    pub fn load(weights: &Weights, name: &str, dtype: Dtype) -> Result<Self> {
        Ok(Self { table: Matrix::load(weights, name, dtype)?, dtype })
    }

    /// `[B, T]` ids → `[B, T, hidden]` in the model's dtype.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        match &self.table {
            Matrix::Dense(w) => Ok(w.take_axis(ids, 0)?),
            Matrix::Quantized(q) => q.rows(ids, self.dtype),
        }
    }

    /// h · Eᵀ: logits through the tied embedding.
    pub fn as_linear(&self, h: &Array) -> Result<Array> {
        self.table.matmul_t(h)
    }
}

/// The model's end: final RMSNorm, an optional scale (muP), then the output projection (or the
/// tied embeddings); float32 logits `[B·T, vocab]`, only for the last position of each sequence
/// with [`Logits::Last`].
pub struct LmHead {
    pub norm: RmsNorm,
    pub proj: Option<Linear>,
    pub scale: f32,
}

impl LmHead {
    /// `model.norm` and, unless tied, `lm_head`.
    pub fn load(weights: &Weights, eps: f32, tied: bool, scale: f32, dtype: Dtype) -> Result<Self> {
        Ok(Self {
            norm: RmsNorm::load(weights, "model.norm", eps, dtype)?,
            proj: if tied { None } else { Some(Linear::load(weights, "lm_head", dtype)?) },
            scale,
        })
    }

    pub fn forward(&self, h: &Array, embed: &Embedding, logits: Logits, trace: Option<&mut Trace>) -> Result<Array> {
        let mut h = self.norm.forward(h)?;
        if let Some(t) = trace {
            t.record("hidden.final_norm", &h);
        }
        if logits == Logits::Last {
            let t = h.shape()[1];
            h = h.try_index((.., t - 1..t, ..))?;
        }
        if self.scale != 1.0 {
            h = scale(&h, self.scale)?;
        }
        let out = match &self.proj {
            Some(head) => head.forward(&h)?,
            None => embed.as_linear(&h)?,
        };
        let rows = out.shape()[0] * out.shape()[1];
        Ok(out.reshape(&[rows, -1])?.as_dtype(Dtype::Float32)?)
    }
}

pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(weights: &Weights, name: &str, eps: f32, dtype: Dtype) -> Result<Self> {
        Ok(Self { weight: weights.get(&format!("{name}.weight"), dtype)?, eps })
    }

    /// `part` of the weight vector (a rank's block of a norm split over ranks).
    pub fn load_part(weights: &Weights, name: &str, eps: f32, dtype: Dtype, part: Part) -> Result<Self> {
        Ok(Self { weight: weights.get_part(&format!("{name}.weight"), &part, dtype)?, eps })
    }

    /// RMS over the last axis in float32, then the weight.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// This norm (with a gate after it, if given) as the kernels take it.
    fn input<'a>(&'a self, gate: Option<GateIn<'a>>) -> RmsNormIn<'a> {
        RmsNormIn { weight: &self.weight, eps: self.eps, gate }
    }
}

/// A mixer's output before its output projection, with the RMSNorm and σ-gate still to apply:
/// the projection folds them into its decode kernel where it runs one.
pub struct MixerOutput<'a> {
    o: Array,
    norm: Option<&'a RmsNorm>,
    /// z as the columns from the offset of this array (only after a norm).
    gate: Option<(Array, i32)>,
}

impl<'a> MixerOutput<'a> {
    /// An output with nothing left to apply.
    pub fn done(o: Array) -> Self {
        Self { o, norm: None, gate: None }
    }

    /// RMSNorm(o), gated by σ(z) when `gate` gives z (see [`GateIn`]).
    pub fn normed(o: Array, norm: &'a RmsNorm, gate: Option<(Array, i32)>) -> Self {
        Self { o, norm: Some(norm), gate }
    }

    /// The projection's input.
    pub fn input(&self) -> Input<'_> {
        match (self.norm, &self.gate) {
            (None, _) => Input::Plain(&self.o),
            (Some(norm), None) => Input::Normed(&self.o, norm),
            (Some(norm), Some((src, offset))) => Input::NormGated(&self.o, norm, GateIn { src, offset: *offset }),
        }
    }
}

/// SwiGLU feed-forward: down(silu(gate(x)) ⊙ up(x)).
pub struct Mlp {
    gate_up: Projections<2>,
    down: Linear,
}

impl Mlp {
    /// gate and up split by output rows over the ranks of `tp`, down by input columns.
    pub fn load(weights: &Weights, prefix: &str, dtype: Dtype, tp: &TensorParallel) -> Result<Self> {
        Ok(Self {
            gate_up: Projections::load(weights, [format!("{prefix}.gate_proj"), format!("{prefix}.up_proj")], dtype, false, tp)?,
            down: Linear::row_parallel(weights, &format!("{prefix}.down_proj"), dtype, false, tp)?,
        })
    }

    /// `x` `[B, T, hidden]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.down.forward(&self.activation(Input::Plain(x))?)
    }

    /// residual + α · MLP(x) (see [`Linear::forward_residual`]).
    pub fn forward_residual(&self, x: Input, residual: &Array, alpha: f32) -> Result<Array> {
        self.down.forward_residual(Input::Plain(&self.activation(x)?), residual, alpha)
    }

    /// silu(x · W_gateᵀ) ⊙ (x · W_upᵀ): one kernel from the stacked matrix on the decode path.
    fn activation(&self, x: Input) -> Result<Array> {
        match &self.gate_up.stacked {
            Some((matrix, _)) => self.gate_up.stacked_product(matrix, x, Epilogue::SwiGlu),
            None => {
                let [gate, up] = self.gate_up.forward(x)?;
                Ok(swiglu_mlx(&gate, &up)?)
            }
        }
    }
}

/// x ⊙ σ(gate) — the output gates of both SALA layer types.
pub fn sigmoid_gate(x: &Array, gate: &Array) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(gate)?)?)
}

/// x · c with c in x's dtype (a float scalar would promote bf16 to f32).
pub fn scale(x: &Array, c: f32) -> Result<Array> {
    Ok(x.multiply(scalar(c, x.dtype())?)?)
}

/// Splits the `[B, …]` arrays `inputs` into their B sequences, runs `f` on each together with that
/// sequence's cache, and joins the outputs along axis 0. Attention runs this way in a batch: every
/// sequence has its own history length (and position).
pub fn per_sequence<C: ?Sized>(
    inputs: &[&Array],
    caches: &mut [&mut C],
    mut f: impl FnMut(&[Array], &mut C) -> Result<Array>,
) -> Result<Array> {
    if let [cache] = caches {
        let whole: Vec<Array> = inputs.iter().map(|a| (*a).clone()).collect();
        return f(&whole, cache);
    }
    // One split per input rather than a slice per sequence: a decode step is bound by the host's
    // work per operation, and a batch of 8 has 8 sparse layers × 3 inputs here.
    let mut rows = inputs.iter().map(|a| Ok(ops::split_equal(a, caches.len() as i32, 0)?.into_iter())).collect::<Result<Vec<_>>>()?;
    let mut outputs = Vec::with_capacity(caches.len());
    for cache in caches.iter_mut() {
        let parts: Vec<Array> = rows.iter_mut().map(|r| r.next().expect("one row per cache")).collect();
        outputs.push(f(&parts, cache)?);
    }
    Ok(ops::concatenate(&outputs, 0)?)
}

/// Largest mask (queries × keys) for which [`prompt_attention`] pads a chunk to repeating shapes:
/// cuDNN reads the mask once per query head, and past about the L2 cache that reading costs more
/// than planning a new shape.
const REPEATING_SHAPES_MAX_MASK: i64 = 1 << 25;

/// Causal attention of a prompt chunk: the last `t` positions' queries `[B, Hq, t, d]` over every
/// key so far `[B, Hkv, L, d]` (the chunk's own keys last).
///
/// MLX-CUDA plans cuDNN's attention once per exact shape, on the host while the device waits, so
/// a chunk at a new offset beside decoding paid a plan each round. On CUDA a chunk whose mask stays
/// small takes [`prompt_attention_padded`]'s few shapes instead; elsewhere there is no planning.
pub fn prompt_attention(q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
    let t = q.shape()[2];
    if t == 1 {
        return Ok(fast::scaled_dot_product_attention(q, keys, values, scale, None, None)?);
    }
    let (queries, width) = padded_attention_shape(t, keys.shape()[2]);
    if crate::kernels::custom::backend() == crate::kernels::custom::Backend::Cuda && queries as i64 * width as i64 <= REPEATING_SHAPES_MAX_MASK {
        return prompt_attention_padded(q, keys, values, scale);
    }
    Ok(fast::scaled_dot_product_attention(q, keys, values, scale, fast::ScaledDotProductAttentionMask::Causal, None)?)
}

/// The queries and keys [`prompt_attention_padded`] pads `t` queries over `len` keys to: queries
/// to a multiple of 64, keys to 4096 or one of four lengths an octave (at most a quarter more).
pub fn padded_attention_shape(t: i32, len: i32) -> (i32, i32) {
    const MIN_KEYS: i32 = 4096;
    let queries = (t + 63) / 64 * 64;
    if len <= MIN_KEYS {
        return (queries, MIN_KEYS);
    }
    let step = 1 << (31 - (len - 1).leading_zeros() - 2);
    (queries, (len + step - 1) / step * step)
}

/// [`prompt_attention`] with its shapes from [`padded_attention_shape`]: padding keys and values
/// are zeros behind the real ones, padding queries repeat the last real one's mask, and the
/// causal mask is an explicit additive one shared by every head.
pub fn prompt_attention_padded(q: &Array, keys: &Array, values: &Array, scale: f32) -> Result<Array> {
    let (t, len) = (q.shape()[2], keys.shape()[2]);
    let (queries, width) = padded_attention_shape(t, len);
    // Contiguous copies: a cache's keys are a slice of a buffer whose capacity (in the strides,
    // which cuDNN's plans are keyed on too) differs from one sequence to the next.
    let pad = |x: &Array, to: i32| -> Result<Array> {
        let s = x.shape();
        if s[2] == to {
            return Ok(x.contiguous()?);
        }
        let fill = crate::engine::ops::zeros(&[s[0], s[1], to - s[2], s[3]], x.dtype())?;
        Ok(ops::concatenate(&[x.clone(), fill], 2)?)
    };
    let mask = padded_causal_mask(t, len, q.dtype())?;
    let o = fast::scaled_dot_product_attention(&pad(q, queries)?, &pad(keys, width)?, &pad(values, width)?, scale, &mask, None)?;
    Ok(o.try_index((.., .., ..t, ..))?)
}

/// [`prompt_attention_padded`]'s additive mask `[1, 1, queries, width]` for `t` queries over `len`
/// keys: query row i sees keys up to position (len − t) + i, padding rows what the last real one
/// sees. Every layer of a forward asks for the same mask, so the last one made is kept (per thread).
fn padded_causal_mask(t: i32, len: i32, dtype: Dtype) -> Result<Array> {
    /// Queries, keys and dtype, and the mask made for them.
    type Kept = Option<((i32, i32, Dtype), Array)>;
    thread_local! {
        static LAST: std::cell::RefCell<Kept> = const { std::cell::RefCell::new(None) };
    }
    if let Some(mask) = LAST.with(|last| last.borrow().as_ref().filter(|(key, _)| *key == (t, len, dtype)).map(|(_, m)| m.clone())) {
        return Ok(mask);
    }
    let (queries, width) = padded_attention_shape(t, len);
    let row = ops::minimum(crate::engine::ops::arange_i32(0, queries as usize)?, Array::from_int(t - 1))?;
    let last_key = row.add(Array::from_int(len - t))?.reshape(&[queries, 1])?;
    let key = crate::engine::ops::arange_i32(0, width as usize)?.reshape(&[1, width])?;
    let mask = ops::select(&key.le(&last_key)?, &scalar(0.0, dtype)?, &scalar(f32::NEG_INFINITY, dtype)?)?.reshape(&[1, 1, queries, width])?;
    LAST.with(|last| *last.borrow_mut() = Some(((t, len, dtype), mask.clone())));
    Ok(mask)
}
