//! Kernel timings on the GPU, each next to its MLX-ops version (`cargo bench --bench kernels`;
//! `eval/device-kernels.sh` runs it on the lent GPU). Medians of 20 timed runs after warm-up; the
//! quantized products rotate over 8 weight sets (more than the L2 cache) and report the achieved
//! bandwidth, so compare it with the device's measured copy bandwidth.

use mlx_rs::{ops, random, transforms::eval, Array, Dtype};
use sala::engine::cache::{KvCache, KvParts};
use sala::engine::device::{select, DeviceKind};
use sala::engine::device_sampler::{DrawKey, RowDraw};
use sala::kernels::draw::{draw, draw_mlx};
use sala::engine::quant::{QuantFormat, QuantizedMatrix};
use sala::models::layers::Matrix;
use sala::kernels::custom::{backend, Backend};
use sala::kernels::gla::{alibi_slopes, simple_gla, simple_gla_mlx, simple_gla_recurrent, simple_gla_step};
use sala::kernels::qmv::{
    quantized_matmul_t, quantized_matmul_t_mlx, quantized_matmul_t_normed, quantized_matmul_t_then, with_tiling, Epilogue,
    general_tiling, GateIn, MmaTiling, QmvTiling, RmsNormIn, MMA_ROWS_PER_WARP,
};
use sala::kernels::sparse::{
    decode_attention, decode_attention_mlx, with_decode_kernel, with_decode_splits, with_window_tiles, BlockSelection, DecodeKernel, DecodeQuery,
};
use sala::models::sala::infllm::{block_sparse_attention, block_sparse_attention_mlx, compressed_keys, select_blocks, select_blocks_chunked, select_blocks_mlx};
use std::time::Instant;

/// `simple_gla_step` / `simple_gla_recurrent`.
type GlaStep = fn(&Array, &Array, &Array, &Array, Option<&Array>, f32) -> mlx_rs::error::Result<(Array, Array)>;

fn randn(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap().as_dtype(dtype).unwrap()
}

/// The int8 prompt product (x rounded to 8 bits, then the int8 tensor cores) against MLX's
/// quantized matmul and against what the models run for prompt chunks (the matrix dequantized,
/// then MLX's bf16 matmul), 8 bits, groups of 64, 2048-row chunks.
fn int8_prompt_products() {
    use sala::kernels::qmm_i8::{product, quantize_rows_i8, quantized_matmul_t_i8};
    println!(
        "| product | MLX qmm µs | dequantize + matmul µs | int8 µs (rounding x) | product only µs | MLX qmm TFLOP/s | dequantize + matmul TFLOP/s | int8 TOP/s | against dequantize + matmul |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let m = 2048;
    for (n, k) in [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288), (16384, 4096), (4096, 16384)] {
        let w = randn(&[n, k], 3, Dtype::Bfloat16);
        let (p, s, b) = ops::quantize(&w, 64, 8).unwrap();
        let x = randn(&[m, k], 4, Dtype::Bfloat16);
        let mlx = time(|| vec![quantized_matmul_t_mlx(&x, &p, &s, &b, 64, 8).unwrap()]);
        // What the models run for prompt chunks on a GPU (models::layers, GPU_DEQUANTIZE_ROWS).
        let dequantized = time(|| vec![x.matmul(ops::dequantize(&p, &s, &b, 64, 8).unwrap().t()).unwrap()]);
        let int8 = time(|| vec![quantized_matmul_t_i8(&x, &p, &s, &b, 64).unwrap()]);
        let rows = quantize_rows_i8(&x, 64).unwrap();
        eval([&rows.xq, &rows.xs, &rows.sum_hi, &rows.sum_lo]).unwrap();
        let only = time(|| vec![product(&rows, &p, &s, &b, 64, Dtype::Bfloat16).unwrap()]);
        let ops_count = 2.0 * m as f64 * n as f64 * k as f64;
        println!(
            "| {m}×{k}·{k}×{n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2}× |",
            mlx * 1e6,
            dequantized * 1e6,
            int8 * 1e6,
            only * 1e6,
            ops_count / mlx / 1e12,
            ops_count / dequantized / 1e12,
            ops_count / only / 1e12,
            dequantized / int8
        );
    }
}

/// The FP8 prompt product (x and W rounded to e4m3 a row, wgmma) against what the models run
/// for prompt chunks (the matrix expanded by kernels::dequantize, then MLX's bf16 matmul), 8 bits
/// in groups of 64, 2048-row chunks: the whole path as the models take it (rounding x, rounding W
/// from its packed form, the product), the roundings alone, and the product alone in each tiling.
fn fp8_prompt_products() {
    use sala::kernels::dequantize::dequantize;
    use sala::kernels::fp8::{matmul_t, product, quantized_to_e4m3, rows_to_e4m3, weight_tile_rows};
    // The bulk form (tiled x and W, the models') and the row-major one.
    let forms = [("bulk", Some((128, 256))), ("row-major", None)];
    println!(
        "| product | dequantize + matmul µs | FP8 µs (rounding x and W) | rounding x µs | rounding W µs | {} | dequantize + matmul TFLOP/s | best FP8 product TFLOP/s | FP8 against dequantize + matmul |\n|---|---:|---:|---:|---:|{}---:|---:|---:|",
        forms.map(|(f, _)| format!("{f} product µs")).join(" | "),
        "---:|".repeat(forms.len())
    );
    let m = 2048;
    for (n, k) in [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288), (16384, 4096), (4096, 16384)] {
        let w = randn(&[n, k], 3, Dtype::Bfloat16);
        let (p, s, b) = ops::quantize(&w, 64, 8).unwrap();
        let x = randn(&[m, k], 4, Dtype::Bfloat16);
        let exact = time(|| vec![x.matmul(dequantize(&p, &s, &b, 64, 8).unwrap().t()).unwrap()]);
        let fp8 = time(|| vec![matmul_t(&x, &quantized_to_e4m3(&p, &s, &b, 64, 8, weight_tile_rows()).unwrap()).unwrap()]);
        let rounding_x = time(|| {
            let r = rows_to_e4m3(&x, weight_tile_rows().map(|_| 128)).unwrap();
            vec![r.q, r.s]
        });
        let rounding_w = time(|| {
            let w = quantized_to_e4m3(&p, &s, &b, 64, 8, weight_tile_rows()).unwrap();
            vec![w.q, w.s]
        });
        let products: Vec<f64> = forms
            .iter()
            .map(|&(_, tiles)| {
                let (rows, w8) = (rows_to_e4m3(&x, tiles.map(|t| t.0)).unwrap(), quantized_to_e4m3(&p, &s, &b, 64, 8, tiles.map(|t| t.1)).unwrap());
                eval([&rows.q, &rows.s, &w8.q, &w8.s]).unwrap();
                time(|| vec![product(&rows, &w8, Dtype::Bfloat16).unwrap()])
            })
            .collect();
        let best = products.iter().copied().fold(f64::INFINITY, f64::min);
        let flops = 2.0 * m as f64 * n as f64 * k as f64;
        println!(
            "| {m}×{k}·{k}×{n} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.0} | {:.0} | {:.2}× |",
            exact * 1e6,
            fp8 * 1e6,
            rounding_x * 1e6,
            rounding_w * 1e6,
            products.iter().map(|t| format!("{:.1}", t * 1e6)).collect::<Vec<_>>().join(" | "),
            flops / exact / 1e12,
            flops / best / 1e12,
            exact / fp8
        );
    }
}

/// Each FP8 kernel once on a 2048 × 4096 · 4096 × 4096 product (`kernels fp8-profile`, for a
/// kernel profiler): the roundings of x and W and the product, tiled (the models' form), then
/// row-major.
fn fp8_kernels_once() {
    use sala::kernels::fp8::{product, quantized_to_e4m3, rows_to_e4m3};
    let (p, s, b) = ops::quantize(randn(&[4096, 4096], 3, Dtype::Bfloat16), 64, 8).unwrap();
    let x = randn(&[2048, 4096], 4, Dtype::Bfloat16);
    for tiles in [Some((128, 256)), None] {
        let rows = rows_to_e4m3(&x, tiles.map(|t| t.0)).unwrap();
        let w = quantized_to_e4m3(&p, &s, &b, 64, 8, tiles.map(|t| t.1)).unwrap();
        eval([&rows.q, &rows.s, &w.q, &w.s]).unwrap();
        eval([&product(&rows, &w, Dtype::Bfloat16).unwrap()]).unwrap();
    }
}

/// Median seconds of `f` (which builds the outputs lazily) including its evaluation.
fn time(mut f: impl FnMut() -> Vec<Array>) -> f64 {
    for _ in 0..3 {
        eval(&f()).unwrap();
    }
    let mut times: Vec<f64> = (0..20)
        .map(|_| {
            let start = Instant::now();
            eval(&f()).unwrap();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The kernel-against-MLX table's header, once (modes that print other tables print none).
fn kernel_table_header() {
    static HEADER: std::sync::Once = std::sync::Once::new();
    HEADER.call_once(|| println!("| kernel | kernel µs | MLX µs | speed-up | note |\n|---|---:|---:|---:|---|"));
}

fn row(name: &str, kernel: f64, mlx: f64, extra: &str) {
    kernel_table_header();
    println!("| {name} | {:.1} | {:.1} | {:.2}× | {extra} |", kernel * 1e6, mlx * 1e6, mlx / kernel);
}

fn main() {
    // MLX's settings as `sala` makes them (before MLX's first call).
    sala::engine::device::configure_runtime();
    let gpu = select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu;
    // `kernels host-cost`: the host's time per operation, by kind of operation (the MLX rows run
    // on the CPU too).
    if std::env::args().skip(1).any(|a| a == "host-cost") {
        host_cost_per_operation();
        return;
    }
    // `kernels fixed-step [CONTEXT]`: a decode step built afresh against a fixed step replayed.
    if std::env::args().skip(1).any(|a| a == "fixed-step") {
        fixed_step_against_afresh();
        return;
    }
    if !gpu {
        println!("no GPU backend in this MLX build: nothing to time");
        return;
    }
    let sel = BlockSelection { block: 64, kernel: 32, stride: 16, kernel2: 128, stride2: 64, init_blocks: 1, local_blocks: 32, topk: 96 };
    // `kernels sparse-step` times only the sparse layer's step on a cache; `kernels
    // sparse-profile` runs such steps for a kernel profiler.
    if std::env::args().skip(1).any(|a| a == "sparse-step" || a == "sparse-profile") {
        sparse_step_on_a_cache(&sel);
        return;
    }
    // `kernels prefill [ROWS] [CONTEXTS]` times the pieces of one prefill chunk of the 9B (ROWS
    // tokens, default 2048) at each context (K tokens, comma-separated; default 32,128,512,1024).
    if std::env::args().skip(1).any(|a| a == "prefill") {
        prefill_chunk_pieces(&sel);
        return;
    }
    // `kernels decode-step` splits the 9B's decode step into host and device time.
    if std::env::args().skip(1).any(|a| a == "decode-step") {
        decode_step_split();
        return;
    }
    // `kernels decode-profile`: a short prompt, then two decode steps evaluated one by one, for a
    // kernel profiler (the last steps' kernels are the decode step's).
    if std::env::args().skip(1).any(|a| a == "decode-profile") {
        decode_steps_for_a_profiler();
        return;
    }
    // `kernels decode-graph`: the operations one decode step builds, counted by kind.
    if std::env::args().skip(1).any(|a| a == "decode-graph") {
        decode_step_graph();
        return;
    }
    // `kernels host-profile`: where the host's time goes in pipelined decoding, by function.
    if std::env::args().skip(1).any(|a| a == "host-profile") {
        host_profile_of_decoding();
        return;
    }
    // `kernels qmv-tiling`: the GEMV kernels' tilings on the 9B's decode products, for a profiler.
    if std::env::args().skip(1).any(|a| a == "qmv-tiling") {
        qmv_tiling_sweep();
        return;
    }
    // `kernels prefill-attention`: a prefill chunk's attention the first time its shape comes and
    // again (MLX-CUDA plans each shape with cuDNN).
    if std::env::args().skip(1).any(|a| a == "prefill-attention") {
        prefill_attention_first_and_again();
        return;
    }
    // `kernels decode-attention`: dense decode attention over a whole cache, Qwen3-8B's heads.
    if std::env::args().skip(1).any(|a| a == "decode-attention") {
        decode_attention_by_depth();
        return;
    }
    // `kernels draw [TEXT]`: the draw kernel on decode-sized logits, as `serve` and a sampled `run`
    // draw (only the cases whose name holds TEXT).
    if std::env::args().skip(1).any(|a| a == "draw") {
        draw_on_decode_logits();
        return;
    }
    // `kernels fp8`: the FP8 prompt product against the models' path for prompt chunks.
    if std::env::args().skip(1).any(|a| a == "fp8") {
        fp8_prompt_products();
        return;
    }
    if std::env::args().skip(1).any(|a| a == "fp8-profile") {
        fp8_kernels_once();
        return;
    }
    // `kernels qmm-i8`: the int8 prompt product against MLX's 8-bit quantized matmul on prompt
    // chunks of Qwen3-8B's and SALA-9B's products.
    if std::env::args().skip(1).any(|a| a == "qmm-i8") {
        int8_prompt_products();
        return;
    }
    // `kernels dequantize`: MLX's dequantize against the kernel (kernels::dequantize) on the
    // matrices of a 9B layer, alone and before a prompt chunk's bf16 product.
    if std::env::args().skip(1).any(|a| a == "dequantize") {
        dequantize_layer_matrices();
        return;
    }
    // `kernels gemm`: MLX's bf16 matmul on a prompt chunk's products in three layouts.
    if std::env::args().skip(1).any(|a| a == "gemm") {
        gemm_layouts();
        return;
    }
    // `kernels qmv` times only the quantized GEMV kernel on the 9B's decode shapes.
    if std::env::args().skip(1).any(|a| a == "qmv") {
        qmv_on_decode_shapes();
        return;
    }
    qmv_table(&[(4096, 4096), (16384, 4096), (4096, 16384), (73448, 4096)], &[1, 2, 4, 8, 16], 1);
    // Prefill-sized products: MLX's quantized matmul against dequantize + matmul.
    for bits in [8, 4] {
        let (n, k, m) = (16384, 4096, 2048);
        let w = randn(&[n, k], 3, Dtype::Bfloat16);
        let (p, s, b) = ops::quantize(&w, 64, bits).unwrap();
        let x = randn(&[m, k], 4, Dtype::Bfloat16);
        let qmm = time(|| vec![quantized_matmul_t_mlx(&x, &p, &s, &b, 64, bits).unwrap()]);
        let deq = time(|| vec![x.matmul(ops::dequantize(&p, &s, &b, 64, bits).unwrap().t()).unwrap()]);
        let flops = 2.0 * n as f64 * k as f64 * m as f64;
        row(
            &format!("dequantize+matmul vs qmm q{bits} {m}×{k}·{k}×{n}"),
            deq,
            qmm,
            &format!("{:.0} vs {:.0} TFLOP/s", flops / deq / 1e12, flops / qmm / 1e12),
        );
    }
    // Lightning decode step, 24 layers' worth of state per token on the 9B.
    {
        let (h, d) = (32, 128);
        let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
        let q = randn(&[1, h, 1, d], 1, Dtype::Float32);
        let kk = randn(&[1, h, 1, d], 2, Dtype::Float32);
        let v = randn(&[1, h, 1, d], 3, Dtype::Float32);
        let s0 = randn(&[1, h, d, d], 4, Dtype::Float32);
        // 24 chained steps (one token through the 9B's lightning layers) per evaluation.
        let chain = |step: GlaStep| {
            let mut s = s0.clone();
            let mut outs = Vec::new();
            for _ in 0..24 {
                let (o, next) = step(&q, &kk, &v, &slopes, Some(&s), 0.1).unwrap();
                outs.push(o);
                s = next;
            }
            outs.push(s);
            outs
        };
        let kern = time(|| chain(simple_gla_step)) / 24.0;
        let mlx = time(|| chain(simple_gla_recurrent)) / 24.0;
        row("GLA decode step H=32 d=128 (24 chained)", kern, mlx, "");
    }
    // InfLLM-V2 on the 9B geometry: decode at 32K and 128K, a 512-query prefill chunk at 32K.
    for (kv_len, t) in [(32768usize, 1i32), (131072, 1), (32768, 512)] {
        let (hq, hkv, d) = (32, 2, 128);
        let first = kv_len - t as usize;
        let n1 = ((kv_len - 32) / 16 + 1) as i32;
        let n2 = ((kv_len - 128) / 64 + 1) as i32;
        let q = randn(&[1, hq, t, d], 11, Dtype::Bfloat16);
        let c1 = randn(&[1, hkv, n1, d], 12, Dtype::Bfloat16);
        let c2 = randn(&[1, hkv, n2, d], 13, Dtype::Bfloat16);
        let k = randn(&[1, hkv, kv_len as i32, d], 14, Dtype::Bfloat16);
        let v = randn(&[1, hkv, kv_len as i32, d], 15, Dtype::Bfloat16);
        eval([&q, &c1, &c2, &k, &v]).unwrap();
        // 8 layers' worth per evaluation, as in one decode step of the 9B (bf16 pooled keys, as
        // the cache keeps them).
        let kern = time(|| (0..8).map(|_| select_blocks(&q, &c1, &c2, first, kv_len, &sel, Dtype::Bfloat16).unwrap()).collect()) / 8.0;
        let mlx = time(|| (0..8).map(|_| select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Bfloat16).unwrap().blocks).collect()) / 8.0;
        row(&format!("block selection L={kv_len} T={t} (×8)"), kern, mlx, "");
        let blocks = select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Bfloat16).unwrap().blocks;
        eval([&blocks]).unwrap();
        let scale = (d as f32).powf(-0.5);
        let kern = time(|| (0..8).map(|_| block_sparse_attention(&q, &KvParts::history(&k, &v, kv_len), &blocks, first, 64, scale, None).unwrap()).collect()) / 8.0;
        let mlx = time(|| (0..8).map(|_| block_sparse_attention_mlx(&q, &k, &v, &blocks, first, 64, scale).unwrap()).collect()) / 8.0;
        row(&format!("block-sparse attention L={kv_len} T={t} (×8)"), kern, mlx, "");
    }
    sparse_step_on_a_cache(&sel);
}

/// A piece of stage 1 given the pooled keys (both levels) and the query's position.
type Stage1Piece<'a> = dyn Fn(&Array, &Array, usize) -> Vec<Array> + 'a;

/// One decoding query's attention over a whole cache, bfloat16, with Qwen3-8B's heads (32 query
/// heads, 8 KV heads of 128) and SALA-9B's (32 over 2), at the depths of the speed table, one
/// sequence and 16: each kernel (tensor cores, CUDA cores) at its default splits and a sweep of
/// split counts, against MLX's attention, with the bandwidth of the keys and values read.
fn decode_attention_by_depth() {
    let d = 128;
    let scale = (d as f32).powf(-0.5);
    let shapes = [("Qwen3-8B", 32, 8), ("SALA-9B", 32, 2)];
    for (model, hq, hkv) in shapes {
        for (batch, len) in [(1usize, 4096usize), (1, 32768), (1, 131072), (16, 4096)] {
            let caches: Vec<(Array, Array)> = (0..batch)
                .map(|i| {
                    let seed = 300 + 2 * i as u64;
                    (randn(&[1, hkv, len as i32, d], seed, Dtype::Bfloat16), randn(&[1, hkv, len as i32, d], seed + 1, Dtype::Bfloat16))
                })
                .collect();
            let rows = randn(&[batch as i32, 1, hq * d], 9, Dtype::Bfloat16);
            let query = DecodeQuery { rows: &rows, heads: hq, head_dim: d, q_col: 0, gate_col: None };
            let q = query.heads().unwrap();
            eval(caches.iter().flat_map(|(k, v)| [k, v]).chain([&q, &rows])).unwrap();
            let parts: Vec<KvParts> = caches.iter().map(|(k, v)| KvParts::history(k, v, len)).collect();
            let bytes = (batch * 2 * len * hkv as usize * d as usize * 2) as f64;
            let mlx = time(|| vec![decode_attention_mlx(&q, &parts, scale).unwrap()]);
            let name = format!("decode attention {model} B={batch} L={len}");
            for (kernel, label) in [(DecodeKernel::TensorCores, "tensor cores"), (DecodeKernel::CudaCores, "CUDA cores")] {
                with_decode_kernel(kernel, || {
                    let t = time(|| vec![decode_attention(&query, &parts, scale).unwrap()]);
                    row(&format!("{name}, {label}"), t, mlx, &format!("default splits: {:.0} GB/s (MLX {:.0} GB/s)", bytes / t / 1e9, bytes / mlx / 1e9));
                    for splits in [8, 16, 32, 64, 128, 256] {
                        let t = with_decode_splits(splits, || time(|| vec![decode_attention(&query, &parts, scale).unwrap()]));
                        row(&format!("{name}, {label}, ≤{splits} splits"), t, mlx, &format!("{:.0} GB/s", bytes / t / 1e9));
                    }
                });
            }
        }
    }
}

/// Prefill attention of a chunk of queries over a prompt's keys so far (Qwen3-8B's heads, causal),
/// the first time a shape comes in the process and again: what a server pays per chunk at a new
/// offset, which the pace counts as a chunk's fixed cost.
fn prefill_attention_first_and_again() {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
    use sala::models::layers::{padded_attention_shape, prompt_attention_padded};
    let (hq, hkv, d) = (32, 8, 128);
    let scale = (d as f32).powf(-0.5);
    // Milliseconds to build and evaluate one attention call.
    let time_one = |f: &dyn Fn() -> Array| {
        let started = Instant::now();
        eval([&f()]).unwrap();
        started.elapsed().as_secs_f64() * 1e3
    };
    let causal = |q: &Array, k: &Array, v: &Array| time_one(&|| scaled_dot_product_attention(q, k, v, scale, ScaledDotProductAttentionMask::Causal, None).unwrap());
    let padded = |q: &Array, k: &Array, v: &Array| time_one(&|| prompt_attention_padded(q, k, v, scale).unwrap());
    // The device's and cuDNN's own start-up, at a shape the table does not use.
    let warm = randn(&[1, hq, 64, d], 1, Dtype::Bfloat16);
    causal(&warm, &randn(&[1, hkv, 64, d], 2, Dtype::Bfloat16), &randn(&[1, hkv, 64, d], 3, Dtype::Bfloat16));
    println!("Causal attention at its exact shape (as a chunk at a new offset meets it), and padded to repeating shapes");
    println!("(`prompt_attention_padded`: mask and copies included): at a new padded shape, then 64 keys on (a new offset, the same");
    println!("padded shape), then again.");
    println!();
    println!("| queries | keys | causal first ms | causal again ms | padded to | padded first ms | padded, 64 keys on, first ms | padded again ms |");
    println!("|---:|---:|---:|---:|---|---:|---:|---:|");
    for queries in [256, 512, 2048] {
        let q = randn(&[1, hq, queries, d], 4, Dtype::Bfloat16);
        for base in [3000, 16384, 32768, 131072] {
            let keys = base + queries;
            let kv = |n: i32| (randn(&[1, hkv, n, d], 5, Dtype::Bfloat16), randn(&[1, hkv, n, d], 6, Dtype::Bfloat16));
            let ((k, v), (k2, v2)) = (kv(keys), kv(keys + 64));
            eval([&q, &k, &v, &k2, &v2]).unwrap();
            let best = |f: &dyn Fn() -> f64| (0..5).map(|_| f()).fold(f64::MAX, f64::min);
            let causal_first = causal(&q, &k, &v);
            let causal_again = best(&|| causal(&q, &k, &v));
            let (pq, pw) = padded_attention_shape(queries, keys);
            let padded_first = padded(&q, &k, &v);
            let padded_next = padded(&q, &k2, &v2);
            let padded_again = best(&|| padded(&q, &k2, &v2));
            println!("| {queries} | {keys} | {causal_first:.2} | {causal_again:.2} | {pq}×{pw} | {padded_first:.2} | {padded_next:.2} | {padded_again:.2} |");
        }
    }
}

/// The draw kernel against its MLX-ops version on logits of SALA's and Qwen3's vocabularies, one
/// row and 16, under each setting a client sends (the served bench's temperature 0.8 and top-p
/// 0.95 among them), on logits spread as a trained model's (σ 3) and as random weights' (σ 0.3).
fn draw_on_decode_logits() {
    let only: Option<String> = std::env::args().skip_while(|a| a != "draw").nth(1);
    let base = RowDraw { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.0, key: DrawKey::default() };
    let settings = [
        ("t 0.8", base),
        ("t 0.8 top-p 0.95", RowDraw { top_p: 0.95, ..base }),
        ("t 0.8 top-k 40", RowDraw { top_k: 40, ..base }),
        ("t 0.7 top-k 20 top-p 0.8 min-p 0.05", RowDraw { temperature: 0.7, top_k: 20, top_p: 0.8, min_p: 0.05, ..base }),
    ];
    for (model, vocab) in [("SALA-9B", 73448), ("Qwen3-8B", 151936)] {
        for rows in [1, 16] {
            for (spread, sigma) in [("trained", 3.0f32), ("random", 0.3)] {
                let logits = randn(&[rows, vocab], 77, Dtype::Float32).multiply(Array::from_f32(sigma)).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
                eval([&logits]).unwrap();
                for (label, setting) in settings {
                    let name = format!("draw {model} {rows}×{vocab} {spread} logits, {label}");
                    if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
                        continue;
                    }
                    let draws: Vec<RowDraw> = (0..rows).map(|r| RowDraw { key: DrawKey::new(5, r as u64), ..setting }).collect();
                    let kernel = time(|| vec![draw(&logits, None, &draws).unwrap()]);
                    let mlx = time(|| vec![draw_mlx(&logits, None, &draws).unwrap()]);
                    row(&name, kernel, mlx, "");
                }
            }
        }
    }
}

/// One sparse layer's decode step on a real `KvCache` (keys in a buffer with spare capacity,
/// pooled keys kept up to date), built up piece by piece, each step evaluated before the next
/// (the attention also on the tensor-core decode kernel); then 64 whole steps queued back to back
/// as pipelined decoding does (each step's write queued while the previous step's kernels may
/// still read the cache), with the keys written into the history (a copy of it whenever the
/// device still holds it) and into the recent-token buffer, the latter alternating the
/// attention's two kernels. On caches of random keys and values, 32K and 128K tokens long or as
/// many as the numbers after the mode (multiples of 4096).
fn sparse_step_on_a_cache(sel: &BlockSelection) {
    kernel_table_header();
    let (hq, hkv, d) = (32, 2, 128);
    let scale = (d as f32).powf(-0.5);
    let profile = std::env::args().any(|a| a == "sparse-profile");
    let mode = if profile { "sparse-profile" } else { "sparse-step" };
    let lengths = numbers_after(mode, "[TOKENS …]");
    let lengths = if lengths.is_empty() { vec![32768, 131072] } else { lengths };
    for kv_len in lengths.into_iter().map(|n| n as usize) {
        let mut cache = KvCache::default();
        for chunk in 0..kv_len / 4096 {
            let seed = 1000 + 2 * chunk as u64;
            cache.append(&randn(&[1, hkv, 4096, d], seed, Dtype::Bfloat16), &randn(&[1, hkv, 4096, d], seed + 1, Dtype::Bfloat16)).unwrap();
            let parts = cache.parts().unwrap().unwrap();
            eval([&parts.keys, &parts.values]).unwrap();
        }
        let (k1, v1) = (randn(&[1, hkv, 1, d], 7, Dtype::Bfloat16), randn(&[1, hkv, 1, d], 8, Dtype::Bfloat16));
        let q = randn(&[1, hq, 1, d], 9, Dtype::Bfloat16);
        eval([&k1, &v1, &q]).unwrap();
        // One step up to piece `upto`: its outputs and the cache's arrays.
        let step = |cache: &mut KvCache, upto: usize, recent: bool| -> Vec<Array> {
            let first = cache.len();
            if recent {
                cache.append_recent(&k1, &v1).unwrap();
            } else {
                cache.append(&k1, &v1).unwrap();
            }
            let mut out = Vec::new();
            if upto >= 1 {
                let c1 = compressed_keys(cache, sel.kernel, sel.stride).unwrap().unwrap();
                let c2 = compressed_keys(cache, sel.kernel2, sel.stride2).unwrap().unwrap();
                if upto >= 2 {
                    let blocks = select_blocks(&q, &c1, &c2, first, first + 1, sel, Dtype::Bfloat16).unwrap();
                    if upto >= 3 {
                        let kv = cache.parts().unwrap().unwrap();
                        out.push(block_sparse_attention(&q, &kv, &blocks, first, sel.block, scale, None).unwrap());
                    }
                    out.push(blocks);
                }
                out.extend([c1, c2]);
            }
            let kv = cache.parts().unwrap().unwrap();
            out.extend([kv.keys.clone(), kv.values.clone()]);
            out.extend(kv.recent.iter().flat_map(|(k, v)| [(*k).clone(), (*v).clone()]));
            out
        };
        if profile {
            // One step a profiler started here sees (`ncu --profile-from-start off`) for each
            // number of level-1 tiles a thread block of the window scores takes, each warmed up.
            let profiled = |cache: &mut KvCache| {
                eval(&step(cache, 3, true)).unwrap();
                cuda_profiler(true);
                eval(&step(cache, 3, true)).unwrap();
                cuda_profiler(false);
            };
            for tiles in [4, 1, 2, 8] {
                with_window_tiles(tiles, || profiled(&mut cache));
            }
            // Then the block-sparse attention on the tensor-core decode kernel, at the default tiles.
            with_decode_kernel(DecodeKernel::TensorCores, || profiled(&mut cache));
            continue;
        }
        let names = ["append k, v", "+ pooled keys", "+ block selection", "+ block-sparse attention"];
        for (upto, name) in names.iter().enumerate() {
            let secs = time(|| step(&mut cache, upto, true));
            println!("| sparse layer step L={kv_len}: {name} | {:.1} | | | cumulative, one layer |", secs * 1e6);
        }
        let secs = with_decode_kernel(DecodeKernel::TensorCores, || time(|| step(&mut cache, 3, true)));
        println!("| sparse layer step L={kv_len}: + block-sparse attention on tensor cores | {:.1} | | | cumulative, one layer |", secs * 1e6);
        // The recent-buffer steps twice, alternating with the attention's tensor-core kernel.
        let queued = [
            (false, false, "keys written into the history"),
            (true, false, "keys written into the recent buffer"),
            (true, true, "keys written into the recent buffer, attention on tensor cores"),
            (true, false, "keys written into the recent buffer"),
            (true, true, "keys written into the recent buffer, attention on tensor cores"),
        ];
        for (recent, tensor_cores, name) in queued {
            let steps = |cache: &mut KvCache| {
                let start = Instant::now();
                let mut last = Vec::new();
                for _ in 0..64 {
                    last = step(cache, 3, recent);
                    mlx_rs::transforms::async_eval(&last).unwrap();
                }
                eval(&last).unwrap();
                start.elapsed().as_secs_f64() / 64.0
            };
            let per_step = if tensor_cores { with_decode_kernel(DecodeKernel::TensorCores, || steps(&mut cache)) } else { steps(&mut cache) };
            println!("| sparse layer step L={kv_len}, 64 steps queued, {name} | {:.1} | | | one layer, per step |", per_step * 1e6);
        }
        // Stage 1's pieces, 64 steps queued on a growing cache (fresh pooled-key views each step):
        // the score products as the selection does them (q·cᵀ with c a transposed view), with
        // the pooled keys as the left operand instead (c·qᵀ), and the whole selection.
        let g = hq / hkv;
        let qg = q.as_dtype(Dtype::Float32).unwrap().reshape(&[hkv, g, d]).unwrap();
        let qt = qg.swap_axes(1, 2).unwrap();
        eval([&qg, &qt]).unwrap();
        let pieces: [(&str, &Stage1Piece); 4] = [
            ("append + pooled keys", &|_c1: &Array, _c2: &Array, _first: usize| Vec::new()),
            ("+ score products q·cᵀ", &|c1: &Array, c2: &Array, _first: usize| {
                [c1, c2].map(|c| qg.matmul(c.reshape(&[hkv, -1, d]).unwrap().swap_axes(1, 2).unwrap()).unwrap()).to_vec()
            }),
            ("+ score products c·qᵀ", &|c1: &Array, c2: &Array, _first: usize| {
                [c1, c2].map(|c| c.reshape(&[hkv, -1, d]).unwrap().matmul(&qt).unwrap()).to_vec()
            }),
            ("+ whole selection", &|c1: &Array, c2: &Array, first: usize| {
                vec![select_blocks(&q, c1, c2, first, first + 1, sel, Dtype::Bfloat16).unwrap()]
            }),
        ];
        for (name, piece) in pieces {
            let start = Instant::now();
            let mut last = Vec::new();
            for _ in 0..64 {
                let first = cache.len();
                cache.append_recent(&k1, &v1).unwrap();
                let c1 = compressed_keys(&mut cache, sel.kernel, sel.stride).unwrap().unwrap();
                let c2 = compressed_keys(&mut cache, sel.kernel2, sel.stride2).unwrap().unwrap();
                last = piece(&c1, &c2, first);
                last.extend([c1, c2]);
                let kv = cache.parts().unwrap().unwrap();
                last.extend([kv.keys.clone(), kv.values.clone()]);
                last.extend(kv.recent.iter().flat_map(|(k, v)| [(*k).clone(), (*v).clone()]));
                mlx_rs::transforms::async_eval(&last).unwrap();
            }
            eval(&last).unwrap();
            let per_step = start.elapsed().as_secs_f64() / 64.0;
            println!("| stage 1 L={kv_len}, 64 steps queued: {name} | {:.1} | | | one layer, per step |", per_step * 1e6);
        }
        // Selection alone with the cache left as it is (same shapes every call): on the pooled
        // keys as the cache holds them (views into a buffer with spare capacity), then on
        // contiguous copies.
        let first = cache.len() - 1;
        let (c1, c2) = (compressed_keys(&mut cache, sel.kernel, sel.stride).unwrap().unwrap(), compressed_keys(&mut cache, sel.kernel2, sel.stride2).unwrap().unwrap());
        let (d1, d2) = (ops::add(&c1, Array::from_f32(0.0)).unwrap(), ops::add(&c2, Array::from_f32(0.0)).unwrap());
        eval([&c1, &c2, &d1, &d2]).unwrap();
        for (name, a, b) in [("views", &c1, &c2), ("contiguous", &d1, &d2)] {
            let secs = time(|| vec![select_blocks(&q, a, b, first, first + 1, sel, Dtype::Bfloat16).unwrap()]);
            println!("| block selection L={kv_len}, cache fixed, pooled keys as {name} | {:.1} | | | one layer |", secs * 1e6);
        }
    }
}

/// The GEMV kernel alone, one and eight input rows, on every matrix shape of a 9B decode step (lightning
/// q/k/v/z, sparse q/k/v/gate, o_proj, gate/up, down, head), 32 products per evaluation so launch
/// overhead is shared.
fn qmv_on_decode_shapes() {
    let shapes = [(16384, 4096), (8704, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (73448, 4096)];
    qmv_table(&shapes, &[1, 8], 4);
}

/// `count` random `[n, k]` matrices quantized with group 64, evaluated: products rotate over them
/// so that their weights come from memory rather than the L2 cache.
fn quantized_weight_sets(count: usize, n: i32, k: i32, bits: i32) -> Vec<(Array, Array, Array)> {
    (0..count)
        .map(|i| {
            let (p, s, b) = ops::quantize(randn(&[n, k], 100 + i as u64, Dtype::Bfloat16), 64, bits).unwrap();
            eval([&p, &s, &b]).unwrap();
            (p, s, b)
        })
        .collect()
}

/// The GEMV kernel against MLX's quantized matmul for each shape `[n, k]` and input row count:
/// `rounds` passes over 8 weight sets (more than the L2 cache) per evaluation, time per product
/// and the achieved bandwidth.
fn qmv_table(shapes: &[(i32, i32)], rows: &[i32], rounds: usize) {
    const SETS: usize = 8;
    for bits in [8, 4] {
        for &(n, k) in shapes {
            let sets = quantized_weight_sets(SETS, n, k, bits);
            let bytes = (sets[0].0.nbytes() + sets[0].1.nbytes() + sets[0].2.nbytes()) as f64;
            for &r in rows {
                let x = randn(&[r, k], 7, Dtype::Bfloat16);
                type Product = fn(&Array, &Array, &Array, &Array, i32, i32) -> mlx_rs::error::Result<Array>;
                let per = |product: Product| {
                    time(|| (0..rounds).flat_map(|_| sets.iter().map(|(p, s, b)| product(&x, p, s, b, 64, bits).unwrap())).collect())
                        / (rounds * SETS) as f64
                };
                let (kern, mlx) = (per(quantized_matmul_t), per(quantized_matmul_t_mlx));
                row(
                    &format!("qmv q{bits} {n}×{k} rows {r}"),
                    kern,
                    mlx,
                    &format!("{:.0} GB/s vs {:.0} GB/s", bytes / kern / 1e9, bytes / mlx / 1e9),
                );
            }
        }
    }
}

/// The host's time per operation of a decode step's kinds: 400 independent operations on one
/// small input are built (the lazy graph), then encoded (`async_eval` returns once all are), then
/// waited for; per operation, median of 5 rounds. Custom kernels with no template arguments and a
/// one-line source, with the qmv kernel's 8 template arguments, and with those and a 20 KB
/// header (MLX rebuilds the whole source of a custom kernel at every call), against MLX's add.
fn host_cost_per_operation() {
    use sala::kernels::custom::{apply, KernelSource, Launch, TemplateArg};
    const BODY: &str = "if (threadIdx.x == 0 && blockIdx.x == 0) y[0] = x[0];";
    static TINY: KernelSource = KernelSource {
        name: "host_cost_tiny",
        inputs: &["x"],
        outputs: &["y"],
        cuda_header: "",
        cuda_body: BODY,
        metal_header: "",
        metal_body: "y[0] = x[0];",
        contiguous_inputs: true,
        shared_memory: 0,
    };
    // 20 KB of code (comments are stripped before MLX sees a header).
    let big_header: &'static str =
        Box::leak((0..256).map(|i| format!("__device__ inline int host_cost_padding_{i:04}() {{ return {i} * 7 + 3 + {i} * 11; }}\n")).collect::<String>().into_boxed_str());
    let big: &'static KernelSource = Box::leak(Box::new(KernelSource { name: "host_cost_big", cuda_header: big_header, ..TINY }));
    let x = randn(&[1, 64], 1, Dtype::Bfloat16);
    eval([&x]).unwrap();
    let x = &x;
    let template = || {
        ["T", "BITS", "GROUP", "ROWS", "WARPS", "NR", "SPLIT", "U"]
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, if i == 0 { TemplateArg::Type(Dtype::Bfloat16) } else { TemplateArg::Int(i as i32) }))
            .collect::<Vec<_>>()
    };
    fn tiny_launch(template: Vec<(&'static str, TemplateArg)>) -> Launch<'static> {
        Launch { grid: (32, 1, 1), threads: (32, 1, 1), outputs: vec![(vec![1], Dtype::Bfloat16)], template, init: None }
    }
    // Independent operations (each reads `x`), and chains (each reads the one before, as a
    // decode step's do), eager and replayed by MLX's compile: whether a replay cuts the encoding,
    // not only the building, decides how a decode step's host cost can fall (issue 58).
    type Op<'a> = Box<dyn Fn() -> Vec<Array> + 'a>;
    const N: usize = 400;
    let independent = |op: &'static (dyn Fn(&Array) -> Array + Sync)| -> Op { Box::new(move || (0..N).map(|_| op(x)).collect()) };
    let chain = |op: &'static (dyn Fn(&Array) -> Array + Sync)| -> Op {
        Box::new(move || {
            let mut y = x.clone();
            (0..N)
                .map(|_| {
                    y = op(&y);
                    y.clone()
                })
                .collect()
        })
    };
    let compiled_chain = |op: &'static (dyn Fn(&Array) -> Array + Sync)| -> Op {
        let compiled = std::rc::Rc::new(sala::engine::compiled::Compiled::new());
        Box::new(move || {
            compiled
                .call(&[x], |inputs| {
                    let mut y = inputs[0].clone();
                    Ok((0..N)
                        .map(|_| {
                            y = op(&y);
                            y.clone()
                        })
                        .collect())
                })
                .unwrap()
        })
    };
    static ADD: fn(&Array) -> Array = |x| x.add(x).unwrap();
    static TINY_ARGS: fn(&Array) -> Array = |x| apply(&TINY, &[x], tiny_launch(vec![])).unwrap().remove(0);
    let mut kinds: Vec<(String, Op)> = vec![
        ("MLX add".into(), independent(&ADD)),
        ("MLX add, chained".into(), chain(&ADD)),
        ("MLX add, chained, compiled (replayed)".into(), compiled_chain(&ADD)),
    ];
    if backend() != Backend::Cpu {
        let with_template: &'static (dyn Fn(&Array) -> Array + Sync) = Box::leak(Box::new(move |x: &Array| apply(&TINY, &[x], tiny_launch(template())).unwrap().remove(0)));
        let with_header: &'static (dyn Fn(&Array) -> Array + Sync) = Box::leak(Box::new(move |x: &Array| apply(big, &[x], tiny_launch(template())).unwrap().remove(0)));
        kinds.extend([
            ("custom kernel, no template arguments".to_string(), independent(&TINY_ARGS)),
            ("custom kernel, 8 template arguments".into(), independent(with_template)),
            ("custom kernel, 8 template arguments, 20 KB header (an #include on CUDA)".into(), independent(with_header)),
            ("custom kernel, 8 template arguments, chained".into(), chain(with_template)),
            ("custom kernel, 8 template arguments, chained, compiled (replayed)".into(), compiled_chain(with_template)),
        ]);
    }
    println!("| operation | build µs | encode µs | wait µs |");
    println!("|---|---:|---:|---:|");
    for (name, op) in kinds {
        let mut rounds = Vec::new();
        for _ in 0..6 {
            let t0 = Instant::now();
            let outs = op();
            let t1 = Instant::now();
            mlx_rs::transforms::async_eval(&outs).unwrap();
            let t2 = Instant::now();
            eval(&outs).unwrap();
            let t3 = Instant::now();
            let per = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6 / N as f64;
            rounds.push((per(t0, t1), per(t1, t2), per(t2, t3)));
        }
        rounds.remove(0); // compiles
        let median = |f: fn(&(f64, f64, f64)) -> f64| {
            let mut v: Vec<f64> = rounds.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!("| {name} | {:.2} | {:.2} | {:.2} |", median(|r| r.0), median(|r| r.1), median(|r| r.2));
    }
}

/// The decode products of the 9B as the model runs them, each with several tilings of the GEMV
/// kernel (one input row) and of the tensor-core kernel (8 rows), and MLX's quantized matmul, for
/// `ncu --profile-from-start off --metrics gpu__time_duration.sum`: each (product, tiling) is
/// profiled on its own (16 launches rotating over 8 weight sets) and printed as
/// `TILING<TAB>label<TAB>launches` in launch order; `eval/qmv_tiling.py` pairs them with the
/// profiler's durations.
fn qmv_tiling_sweep() {
    #[derive(Clone, Copy)]
    enum Product {
        Normed,
        NormedSwiGlu,
        /// A lightning layer's o_proj: its output norm and σ-gate folded in, then the residual.
        NormGatedResidual,
        Residual,
        Plain,
    }
    const SETS: usize = 8;
    const ROUNDS: usize = 2;
    let cases = [
        ("lightning qkvz", 16384, 4096, Product::Normed),
        ("sparse qkvg", 8704, 4096, Product::Normed),
        ("o_proj", 4096, 4096, Product::Residual),
        ("lightning o_proj", 4096, 4096, Product::NormGatedResidual),
        ("gate/up", 32768, 4096, Product::NormedSwiGlu),
        ("down", 4096, 16384, Product::Residual),
        ("head", 73448, 4096, Product::Plain),
    ];
    let mma = |t, u, g, a| MmaTiling { out_tiles: t, in_flight: u, grid_warps: g, async_copy: a };
    // `qmv-tiling 8` or `qmv-tiling 4`: one width only; `qmv-tiling 8 o_proj`: one product too
    // (`all`: every product); `qmv-tiling 8 all 8`: one count of input rows (1, 8 or 16) too;
    // `qmv-tiling 8 all 1 async`: the default and the cp.async tilings only (at 4 bits, register
    // loads of up to 8 steps are swept for the tensor-core form only).
    let args: Vec<String> = std::env::args().skip_while(|a| a != "qmv-tiling").skip(1).take_while(|a| !a.starts_with('-')).collect();
    let only: Option<i32> = args.first().map(|b| match b.parse() {
        Ok(bits @ (4 | 8)) => bits,
        _ => panic!("kernels qmv-tiling [BITS [PRODUCT]]: BITS is 4 or 8, not `{b}`"),
    });
    let product_filter = args.get(1).filter(|p| p.as_str() != "all").cloned();
    let rows_filter: Option<i32> = args.get(2).map(|r| match r.parse() {
        Ok(rows @ (1 | 8 | 16 | 32 | 64)) => rows,
        _ => panic!("kernels qmv-tiling [BITS [PRODUCT [ROWS]]]: ROWS is 1, 8, 16, 32 or 64, not `{r}`"),
    });
    let async_only = args.get(3).is_some_and(|a| a == "async");
    // `qmv-tiling 4 all 1 tc`: the default and the tensor-core tilings only.
    let tensor_cores_only = args.get(3).is_some_and(|a| a == "tc");
    // `qmv-tiling 4 all 1 options`: each product's default tiling alone, and with its 4-bit
    // weights' unpacking in pairs switched the other way.
    let options_only = args.get(3).is_some_and(|a| a == "options");
    let start = Instant::now();
    for bits in [8, 4].into_iter().filter(|b| only.is_none_or(|o| o == *b)) {
        for &(name, n, k, product) in cases.iter().filter(|c| product_filter.as_ref().is_none_or(|p| c.0.contains(p.as_str()))) {
            eprintln!("{name} q{bits} at {:.0} s", start.elapsed().as_secs_f64());
            let sets = quantized_weight_sets(SETS, n, k, bits);
            let norm = randn(&[k], 5, Dtype::Bfloat16);
            // 16 rows and more (a decode batch of several tiles) only when asked for.
            for rows in [1, 8, 16, 32, 64].into_iter().filter(|r| rows_filter.map_or(*r < 16, |o| o == *r)) {
                let x = randn(&[rows, 1, k], 7, Dtype::Bfloat16);
                let residual = randn(&[rows, 1, n], 8, Dtype::Bfloat16);
                // The gate's source as a lightning layer's qkvz output, z its last quarter.
                let gate_src = randn(&[rows, 1, 4 * k], 9, Dtype::Bfloat16);
                let rms = RmsNormIn { weight: &norm, eps: 1e-6, gate: None };
                let gated = RmsNormIn { gate: Some(GateIn { src: &gate_src, offset: 3 * k }), ..rms };
                // Several rows: the model normalises them first (the tensor-core kernel has no norm folded in).
                let xn = mlx_rs::fast::rms_norm(&x, Some(&norm), 1e-6).unwrap();
                let xg = gated.apply(&x).unwrap();
                eval([&x, &xn, &xg, &residual, &norm]).unwrap();
                let add_residual = Epilogue::Residual { residual: &residual, alpha: 0.5 };
                let run = |mlx: bool| -> Vec<Array> {
                    (0..ROUNDS)
                        .flat_map(|_| sets.iter())
                        .map(|(p, s, b)| {
                            if mlx {
                                return quantized_matmul_t_mlx(&x, p, s, b, 64, bits).unwrap();
                            }
                            match product {
                                Product::Normed if rows > 1 => quantized_matmul_t(&xn, p, s, b, 64, bits),
                                Product::NormedSwiGlu if rows > 1 => quantized_matmul_t_then(&xn, p, s, b, 64, bits, Epilogue::SwiGlu),
                                Product::Normed => quantized_matmul_t_normed(&x, rms, p, s, b, 64, bits, Epilogue::Plain),
                                Product::NormedSwiGlu => quantized_matmul_t_normed(&x, rms, p, s, b, 64, bits, Epilogue::SwiGlu),
                                Product::Residual => quantized_matmul_t_then(&x, p, s, b, 64, bits, add_residual),
                                Product::NormGatedResidual if rows > 1 => quantized_matmul_t_then(&xg, p, s, b, 64, bits, add_residual),
                                Product::NormGatedResidual => quantized_matmul_t_normed(&x, gated, p, s, b, 64, bits, add_residual),
                                Product::Plain => quantized_matmul_t(&x, p, s, b, 64, bits),
                            }
                            .unwrap()
                        })
                        .collect()
                };
                let profile = |label: String, f: &dyn Fn() -> Vec<Array>| {
                    eval(&f()).unwrap(); // compiles the kernel
                    cuda_profiler(true);
                    eval(&f()).unwrap();
                    cuda_profiler(false);
                    println!("TILING\t{label}\t{}", ROUNDS * SETS);
                };
                let base = format!("q{bits} {name} {n}x{k} rows {rows}");
                profile(format!("{base} | mlx"), &|| run(true));
                let swiglu = matches!(product, Product::NormedSwiGlu);
                let normed = matches!(product, Product::Normed | Product::NormedSwiGlu | Product::NormGatedResidual);
                if rows == 1 && options_only {
                    let default = general_tiling(n, k * bits / 128, bits, swiglu, if normed { k as usize * 2 } else { 0 });
                    let flipped = if default.half_pairs { "default, without half pairs" } else { "default, half pairs" };
                    let options = [("default", true, default), (flipped, bits == 4, QmvTiling { half_pairs: !default.half_pairs, ..default })];
                    for (label, _, t) in options.into_iter().filter(|o| o.1) {
                        profile(format!("{base} | {label}"), &|| with_tiling(Some(t), None, || run(false)));
                    }
                } else if rows == 1 {
                    let chunks = k * bits / 128;
                    let mut tilings = vec![None];
                    // At 4 bits, 16 weight rows a warp is the tensor-core form.
                    let outputs: &[i32] = if bits == 4 { &[1, 2, 4, 8, 16] } else { &[1, 2] };
                    for &o in outputs {
                        for split in [1, 2, 4, 8] {
                            // Register loads with 1, 2 or 4 chunks in flight; cp.async rings of 2, 3,
                            // 4 and 6 slots (those that fit beside the staged x of a normed product).
                            let register = [1, 2, 4, 8].map(|u| (u, false));
                            let ring = [2, 3, 4, 6].map(|u| (u, true));
                            for (u, a) in register.into_iter().filter(|_| !async_only).chain(ring) {
                                let t = QmvTiling::new(8, o, split, u, a);
                                let tensor_cores = bits == 4 && (if swiglu { 2 * o } else { o }) % MMA_ROWS_PER_WARP == 0;
                                // Every lane of a warp gets U chunks (the tensor-core form: the 4
                                // lanes of a row take 4 a step).
                                let per_round = if tensor_cores { 4 * u } else { 32 * u };
                                // (More than 4 rows a warp on the CUDA cores do not fit in registers.)
                                let fits = chunks / split >= per_round
                                    && !(tensor_cores && a)
                                    && (tensor_cores || (o <= 4 && u <= 4 && !tensor_cores_only));
                                let staged = if normed { k as usize * 2 } else { 0 };
                                let ring_fits = !a || t.ring_fits(swiglu, staged);
                                // Enough warps to fill the GPU.
                                let warps_total = n / if swiglu { 2 } else { 1 } / o * split;
                                let least = if tensor_cores { 1024 } else { 4096 };
                                if fits && ring_fits && (least..=80000).contains(&warps_total) {
                                    tilings.push(Some(t));
                                }
                            }
                        }
                    }
                    for t in tilings {
                        let label = t.map_or("default".to_string(), |t| format!("w{} o{} s{} u{}{}", t.warps, t.outputs_per_warp, t.split, t.in_flight, if t.async_copy { " async" } else { "" }));
                        profile(format!("{base} | {label}"), &|| with_tiling(t, None, || run(false)));
                    }
                } else {
                    // Past one tile of input rows, a short list (each tiling compiles a kernel).
                    let many: &[(i32, i32, i32)] = &[(1, 2, 8192), (1, 1, 8192), (1, 4, 8192), (2, 2, 8192), (2, 1, 8192), (1, 2, 16384), (4, 1, 8192)];
                    let tilings = [
                        (1, 1, 8192),
                        (1, 2, 16384),
                        (2, 2, 8192),
                        (1, 1, 16384),
                        (2, 1, 8192),
                        (4, 1, 8192),
                        (4, 2, 8192),
                        (4, 1, 16384),
                        (1, 4, 8192),
                        (1, 2, 4096),
                        (2, 1, 16384),
                        (2, 2, 16384),
                        (8, 1, 8192),
                        (8, 1, 32768),
                        (4, 1, 32768),
                    ];
                    // Through the cp.async ring: 2–4 steps a warp.
                    let ring = [(1, 2, 8192), (1, 3, 8192), (1, 4, 8192), (2, 3, 8192), (2, 4, 8192), (1, 4, 16384), (4, 3, 8192)];
                    // (8 SwiGLU tiles a block are 16 with their up tiles: more than fit in registers.)
                    let ring: &[(i32, i32, i32)] = if rows > 16 { &[(1, 3, 8192), (2, 3, 8192)] } else { &ring };
                    let tilings: Vec<_> = if rows > 16 { many.to_vec() } else { tilings.to_vec() };
                    let tilings = tilings
                        .into_iter()
                        .map(|(o, u, g)| (o, u, g, false))
                        .chain(ring.iter().map(|&(o, u, g)| (o, u, g, true)))
                        .filter(|&(o, _, _, _)| !(swiglu && o > 4));
                    for t in std::iter::once(None).chain(tilings.map(|(o, u, g, a)| Some(mma(o, u, g, a)))) {
                        let label = t.map_or("default".to_string(), |t| {
                            format!("tiles {} u{} grid {}{}", t.out_tiles, t.in_flight, t.grid_warps, if t.async_copy { " async" } else { "" })
                        });
                        profile(format!("{base} | {label}"), &|| with_tiling(None, t, || run(false)));
                    }
                }
            }
        }
    }
}

/// The pieces of one 2048-token prefill chunk of the 9B (8-bit), each as the model runs it: per
/// layer the dequantize + matmul products, the chunked GLA of a lightning layer, and a sparse
/// layer's block selection and block-sparse attention (one call each for all 2048 queries) at
/// 32K, 128K, 512K and 1M tokens; the time of one layer and of all of its kind.
fn prefill_chunk_pieces(sel: &BlockSelection) {
    let args: Vec<String> = std::env::args().skip_while(|a| a != "prefill").skip(1).collect();
    let t: i32 = args.first().map_or(2048, |a| a.parse().expect("ROWS: a number of tokens"));
    let contexts: Vec<usize> = args.get(1).map_or(vec![32, 128, 512, 1024], |a| a.split(',').map(|c| c.parse().expect("CONTEXTS: K tokens")).collect());
    println!("| piece ({t} tokens) | µs per layer | layers | ms per chunk |");
    println!("|---|---:|---:|---:|");
    let line = |name: &str, secs: f64, layers: usize| {
        println!("| {name} | {:.0} | {layers} | {:.1} |", secs * 1e6, secs * layers as f64 * 1e3);
    };
    // One (lightning) layer's products: q/k/v/gate stacked, o, the MLP's gate/up stacked, down.
    let weights: Vec<_> = [(16384, 4096), (4096, 4096), (32768, 4096), (4096, 16384)]
        .iter()
        .enumerate()
        .map(|(i, &(n, k))| {
            let (p, s, b) = ops::quantize(randn(&[n, k], 20 + i as u64, Dtype::Bfloat16), 64, 8).unwrap();
            eval([&p, &s, &b]).unwrap();
            (p, s, b, k)
        })
        .collect();
    let inputs: Vec<_> = weights.iter().map(|w| randn(&[t, w.3], 30, Dtype::Bfloat16)).collect();
    eval(&inputs).unwrap();
    let matrices: Vec<_> = weights
        .into_iter()
        .map(|(packed, scales, biases, _)| Matrix::Quantized(QuantizedMatrix { packed, scales, biases, format: QuantFormat { group_size: 64, bits: 8 } }))
        .collect();
    let products = time(|| matrices.iter().zip(&inputs).map(|(w, x)| w.matmul_t(x).unwrap()).collect());
    line("dequantize + matmul, one layer's products", products, 32);
    {
        let (h, d) = (32, 128);
        let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
        let (q, k, v) = (randn(&[1, h, t, d], 2, Dtype::Bfloat16), randn(&[1, h, t, d], 3, Dtype::Bfloat16), randn(&[1, h, t, d], 4, Dtype::Bfloat16));
        let state = randn(&[1, h, d, d], 5, Dtype::Float32);
        eval([&q, &k, &v, &state]).unwrap();
        let gla = time(|| {
            let (o, s) = simple_gla(&q, &k, &v, &slopes, Some(&state), 0.088).unwrap();
            vec![o, s]
        });
        line("chunked GLA H=32 d=128", gla, 24);
        // The lightning layer's heads from its stacked projection: QK-norm, RoPE, head-major layout.
        {
            use sala::kernels::rope::{prompt_heads, prompt_heads_mlx, QkHeads, RopeAngles};
            let rows = randn(&[1, t, 4 * h * d], 6, Dtype::Bfloat16);
            let (qn, kn) = (randn(&[d], 7, Dtype::Bfloat16), randn(&[d], 8, Dtype::Bfloat16));
            let offsets = Array::from_slice(&[30720], &[1]);
            eval([&rows, &qn, &kn, &offsets]).unwrap();
            let heads = QkHeads { heads: h, kv_heads: h, head_dim: d, norms: Some((&qn, &kn, 1e-6)) };
            let angles = RopeAngles { dims: d, base: 10000.0, periods: None, position_scale: 1.0, mscale: 1.0 };
            // GLA reads its inputs contiguous: MLX's form is copied where it is a view.
            let ready = |qkv: [Array; 3]| qkv.iter().map(|a| a.contiguous().unwrap()).collect::<Vec<_>>();
            let kernel = time(|| ready(prompt_heads(&rows, heads, Some(&angles), &offsets).unwrap()));
            line("lightning heads (QK-norm, RoPE, layout)", kernel, 24);
            let mlx = time(|| ready(prompt_heads_mlx(&rows, heads, Some(&angles), &offsets).unwrap()));
            line("  in MLX operations", mlx, 24);
        }
        let gla_mlx = time(|| {
            let (o, s) = simple_gla_mlx(&q, &k, &v, &slopes, Some(&state), 0.088).unwrap();
            vec![o, s]
        });
        line("  in MLX operations (float32)", gla_mlx, 24);
    }
    for kv_len in contexts.iter().map(|k| k * 1024) {
        let (hq, hkv, d) = (32, 2, 128);
        let first = kv_len - t as usize;
        let n1 = ((kv_len - 32) / 16 + 1) as i32;
        let n2 = ((kv_len - 128) / 64 + 1) as i32;
        let q = randn(&[1, hq, t, d], 11, Dtype::Bfloat16);
        let c1 = randn(&[1, hkv, n1, d], 12, Dtype::Bfloat16);
        let c2 = randn(&[1, hkv, n2, d], 13, Dtype::Bfloat16);
        let k = randn(&[1, hkv, kv_len as i32, d], 14, Dtype::Bfloat16);
        let v = randn(&[1, hkv, kv_len as i32, d], 15, Dtype::Bfloat16);
        eval([&q, &c1, &c2, &k, &v]).unwrap();
        // All queries in one call, as SparseAttention makes it (select_blocks chunks them itself).
        let selection = time(|| vec![select_blocks(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap()]);
        line(&format!("block selection at {}K", kv_len / 1024), selection, 8);
        // Stage 1 on mma.sync, the form before wgmma (the same on GPUs other than Hopper).
        let on_mma_sync = sala::kernels::sparse::with_selection_on_mma_sync(|| {
            time(|| vec![select_blocks(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap()])
        });
        line("  stage 1 on mma.sync", on_mma_sync, 8);
        // Pooling and top-k past 2048 blocks in 512-block chunks and a merge (decode's form; a
        // prompt chunk's queries took it past 1024 blocks until 2026-12-06).
        let in_chunks = sala::kernels::sparse::with_topk_in_chunks(|| {
            time(|| vec![select_blocks(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap()])
        });
        line("  top-k in 512-block chunks", in_chunks, 8);
        // Every key through the radix passes, without the candidates in shared memory.
        let every_key = sala::kernels::sparse::with_topk_candidates(0, || {
            time(|| vec![select_blocks(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap()])
        });
        line("  top-k through every key (no candidates)", every_key, 8);
        // Bigger query chunks than the model's working-memory bound (256 queries at 1M): more
        // thread blocks a launch, where the window scores' grid fills two blocks an SM.
        for chunk in [1024, 2048] {
            let bigger = time(|| vec![select_blocks_chunked(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16, chunk, false).unwrap().0]);
            line(&format!("  in {chunk}-query chunks"), bigger, 8);
        }
        // The same from float32 pooled keys (staged as bf16 hi + lo, two products each).
        let (c1f, c2f) = (c1.as_dtype(Dtype::Float32).unwrap(), c2.as_dtype(Dtype::Float32).unwrap());
        eval([&c1f, &c2f]).unwrap();
        let split = time(|| vec![select_blocks(&q, &c1f, &c2f, first, kv_len, sel, Dtype::Bfloat16).unwrap()]);
        line(&format!("  from float32 pooled keys at {}K", kv_len / 1024), split, 8);
        // With float32 queries: the score products by MLX, then the selection kernel (the form
        // before the tensor-core stage 1).
        let q32 = q.as_dtype(Dtype::Float32).unwrap();
        let general = time(|| vec![select_blocks(&q32, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap()]);
        line(&format!("  float32 queries (products + kernel) at {}K", kv_len / 1024), general, 8);
        let blocks = select_blocks(&q, &c1, &c2, first, kv_len, sel, Dtype::Bfloat16).unwrap();
        eval([&blocks]).unwrap();
        let kv = KvParts::history(&k, &v, kv_len);
        // All queries in one call, as SparseAttention makes it.
        let attend = || block_sparse_attention(&q, &kv, &blocks, first, sel.block, (d as f32).powf(-0.5), None);
        let attention = time(|| vec![attend().unwrap()]);
        line(&format!("block-sparse attention at {}K", kv_len / 1024), attention, 8);
        // The earlier form, and its largest difference from the model's (the same attention;
        // only the order of sums may differ).
        let default = attend().unwrap();
        eval([&default]).unwrap();
        let union_walk = sala::kernels::sparse::with_union_prefill_walk(|| {
            let out = attend().and_then(|a| eval([&a]).map(|_| a))?;
            let diff = out.subtract(&default)?.abs()?.max(None)?.as_dtype(Dtype::Float32)?;
            eval([&diff])?;
            Ok::<_, mlx_rs::error::Exception>((time(|| vec![attend().unwrap()]), diff.as_slice::<f32>()[0]))
        });
        let name = "  every block through the shared walk";
        match union_walk {
            Ok((timing, diff)) => line(&format!("{name} (max |Δ| {diff:.1e} from the default)"), timing, 8),
            Err(e) => println!("| {name} | failed: {} | | | |", e.what().lines().next().unwrap_or("")),
        }
    }
}

/// The matrices `[N, K]` of a prompt chunk's products: SALA-9B's lightning layer (q/k/v/gate
/// stacked, o, gate/up stacked, down), then Qwen3-8B's q/k/v, gate/up and down.
const PROMPT_PRODUCT_MATRICES: [(i32, i32); 7] = [(16384, 4096), (4096, 4096), (32768, 4096), (4096, 16384), (6144, 4096), (24576, 4096), (4096, 12288)];

/// MLX's bf16 matmul for x `[M, K]` and W `[N, K]` as the models call it (x · Wᵀ), as (W · xᵀ)ᵀ
/// (cuBLASLt's other operand order; y then copied to `[M, N]`), and with W stored as `[K, N]`.
fn gemm_layouts() {
    println!("| product | M | x·Wᵀ µs | TFLOP/s | (W·xᵀ)ᵀ µs | TFLOP/s | x·(Wᵀ stored) µs | TFLOP/s |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for m in [2048, 4096] {
        for &(n, k) in &PROMPT_PRODUCT_MATRICES {
            let x = randn(&[m, k], 4, Dtype::Bfloat16);
            let w = randn(&[n, k], 3, Dtype::Bfloat16);
            let wt = w.t().contiguous().unwrap();
            eval([&x, &w, &wt]).unwrap();
            let flop = 2.0 * m as f64 * n as f64 * k as f64;
            let a = time(|| vec![x.matmul(w.t()).unwrap()]);
            let b = time(|| vec![w.matmul(x.t()).unwrap().t().contiguous().unwrap()]);
            let c = time(|| vec![x.matmul(&wt).unwrap()]);
            println!(
                "| {m}×{k}·{k}×{n} | {m} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} |",
                a * 1e6,
                flop / a / 1e12,
                b * 1e6,
                flop / b / 1e12,
                c * 1e6,
                flop / c / 1e12
            );
        }
    }
}

/// MLX's dequantize against the kernel on each of [`PROMPT_PRODUCT_MATRICES`] at 8 and 4 bits,
/// alone and followed by a 2048-row bf16 product.
fn dequantize_layer_matrices() {
    use sala::kernels::dequantize::{dequantize, dequantize_mlx};
    println!("| matrix | bits | MLX dequantize µs | kernel µs | kernel GB/s | speed-up | + 2048-row product, MLX µs | kernel µs |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for bits in [8, 4] {
        for &(n, k) in &PROMPT_PRODUCT_MATRICES {
            let (p, s, b) = ops::quantize(randn(&[n, k], 3, Dtype::Bfloat16), 64, bits).unwrap();
            let x = randn(&[2048, k], 4, Dtype::Bfloat16);
            eval([&p, &s, &b, &x]).unwrap();
            let mlx = time(|| vec![dequantize_mlx(&p, &s, &b, 64, bits).unwrap()]);
            let kernel = time(|| vec![dequantize(&p, &s, &b, 64, bits).unwrap()]);
            let mlx_product = time(|| vec![x.matmul(dequantize_mlx(&p, &s, &b, 64, bits).unwrap().t()).unwrap()]);
            let kernel_product = time(|| vec![x.matmul(dequantize(&p, &s, &b, 64, bits).unwrap().t()).unwrap()]);
            // Codes, scales and biases read; the bf16 copy written.
            let bytes = (p.size() * 4 + 2 * s.size() * 2 + (n as usize * k as usize) * 2) as f64;
            println!(
                "| {n}×{k} | {bits} | {:.1} | {:.1} | {:.0} | {:.2}× | {:.1} | {:.1} |",
                mlx * 1e6,
                kernel * 1e6,
                bytes / kernel / 1e9,
                mlx / kernel,
                mlx_product * 1e6,
                kernel_product * 1e6
            );
        }
    }
}

/// The synthetic 9B, or the preset `SALA_KERNELS_MODEL` names (e.g. qwen3-8b), quantized to 8
/// bits, or 4 with `SALA_KERNELS_BITS=4`.
fn synthetic_9b() -> Box<dyn sala::engine::model::LanguageModel> {
    let bits = match std::env::var("SALA_KERNELS_BITS").as_deref() {
        Ok("4") => 4,
        Ok("8") | Err(_) => 8,
        Ok(other) => panic!("SALA_KERNELS_BITS={other}: the synthetic 9B is quantized to 4 or 8 bits"),
    };
    let preset = std::env::var("SALA_KERNELS_MODEL").unwrap_or_else(|_| "minicpm-sala-9b".into());
    let synthetic = sala::store::synthetic::SyntheticModel::new(&preset, Some(bits)).unwrap();
    let mut source = synthetic.build(Dtype::Bfloat16, |_| {}).unwrap();
    let cfg = source.config().unwrap();
    sala::models::build(&cfg, &mut source.weights, Some(Dtype::Bfloat16), &Default::default()).unwrap()
}

/// Puts `len` random tokens (seeded by `seed`) into `cache`, 2048 a forward call.
fn prefill_random(model: &dyn sala::engine::model::LanguageModel, cache: &mut sala::engine::cache::ModelCache, len: i32, seed: u64) {
    for start in (0..len).step_by(2048) {
        let chunk = 2048.min(len - start);
        let key = random::key(seed + start as u64).unwrap();
        let ids = random::randint::<_, i32>(0, 1000, &[1, chunk], &key).unwrap();
        let logits = model.forward(&ids, cache, sala::engine::model::Logits::Last, None).unwrap();
        eval(std::iter::once(&logits).chain(cache.arrays().iter())).unwrap();
    }
}

/// Decode steps of the synthetic model (`SALA_KERNELS_MODEL`, a preset or a config.json) after
/// CONTEXT tokens (default 512), one sequence: each step built and evaluated before the next, as
/// the model builds it at every token and as `engine::fixed_step` replays it. Per step, the
/// host's time to build it, to hand it to the device (MLX's encoding) and the whole step's,
/// medians of 5 rounds of 32 steps; the tokens are checked to agree.
fn fixed_step_against_afresh() {
    use sala::engine::fixed_step::FixedSteps;
    use sala::engine::model::Logits;
    let context = numbers_after("fixed-step", "[CONTEXT]").first().copied().unwrap_or(512);
    let model = synthetic_9b();
    let (mut afresh, mut fixed) = (model.new_cache(), model.new_cache());
    prefill_random(model.as_ref(), &mut afresh, context, 5);
    prefill_random(model.as_ref(), &mut fixed, context, 5);
    let mut steps = FixedSteps::new();
    const STEPS: usize = 32;
    let mut rounds = vec![Vec::new(), Vec::new()];
    let mut tokens = [7i32, 7];
    for round in 0..6 {
        for (which, cache) in [&mut afresh, &mut fixed].into_iter().enumerate() {
            let (mut build, mut encode, start) = (0.0, 0.0, Instant::now());
            for _ in 0..STEPS {
                let input = Array::from_slice(&[tokens[which]], &[1, 1]);
                let t0 = Instant::now();
                let (logits, position) = match which {
                    0 => (model.forward(&input, cache, Logits::Last, None).unwrap(), None),
                    _ => {
                        let (logits, position) = steps.decode(model.as_ref(), &input, cache).unwrap().expect("this model takes fixed steps");
                        (logits, Some(position))
                    }
                };
                let next = ops::indexing::argmax_axis(&logits, -1, None).unwrap();
                let outputs: Vec<Array> = std::iter::once(next.clone()).chain(cache.arrays()).chain(position).collect();
                let t1 = Instant::now();
                mlx_rs::transforms::async_eval(&outputs).unwrap();
                let t2 = Instant::now();
                eval(&outputs).unwrap();
                build += (t1 - t0).as_secs_f64();
                encode += (t2 - t1).as_secs_f64();
                tokens[which] = next.as_slice::<u32>()[0] as i32;
            }
            if round > 0 {
                let per = |t: f64| t / STEPS as f64;
                rounds[which].push((per(build), per(encode), per(start.elapsed().as_secs_f64())));
            }
        }
        assert_eq!(tokens[0], tokens[1], "round {round}: the fixed step drew another token");
    }
    println!("context {context}, {STEPS} steps a round\n\n| step | build µs | encode µs | step µs |\n|---|---:|---:|---:|");
    for (name, mut r) in ["built afresh", "fixed, replayed"].into_iter().zip(rounds) {
        r.sort_by(|a, b| a.2.total_cmp(&b.2));
        let (build, encode, step) = r[r.len() / 2];
        println!("| {name} | {:.0} | {:.0} | {:.0} |", build * 1e6, encode * 1e6, step * 1e6);
    }
}

/// The numbers after the mode `mode` on the command line (`usage` names them in the panic on a
/// word that is not one). cargo bench appends `--bench`: flags are not numbers.
fn numbers_after(mode: &str, usage: &str) -> Vec<i32> {
    std::env::args()
        .skip_while(|a| a != mode)
        .skip(1)
        .take_while(|a| !a.starts_with('-'))
        .map(|n| n.parse().unwrap_or_else(|_| panic!("kernels {mode} {usage}: `{n}` is not a number")))
        .collect()
}

/// The prompt is 512 tokens, or as many as the number after `decode-profile` (in 2048-token
/// chunks); a second number decodes that many sequences together (each with such a prompt).
fn decode_steps_for_a_profiler() {
    use sala::engine::model::Logits;
    let numbers = numbers_after("decode-profile", "CONTEXT [SEQUENCES]");
    let context = numbers.first().copied().unwrap_or(512);
    let seqs = numbers.get(1).copied().unwrap_or(1);
    let model = synthetic_9b();
    let mut caches: Vec<_> = (0..seqs).map(|_| model.new_cache()).collect();
    for (i, cache) in caches.iter_mut().enumerate() {
        prefill_random(model.as_ref(), cache, context, 3 + i as u64);
    }
    let tokens = Array::from_slice(&vec![7i32; seqs as usize], &[seqs, 1]);
    // Only the decode steps are profiled under `ncu --profile-from-start off`.
    cuda_profiler(true);
    for _ in 0..2 {
        let mut batch: Vec<_> = caches.iter_mut().collect();
        let logits = model.forward_batch(&tokens, &mut batch, Logits::Last, None).unwrap();
        eval(std::iter::once(&logits).chain(caches.iter().flat_map(|c| c.arrays()).collect::<Vec<_>>().iter())).unwrap();
        println!("decode step done");
    }
    cuda_profiler(false);
}

/// cuProfilerStart / cuProfilerStop from the CUDA driver MLX loaded (MLX links the runtime
/// statically).
fn cuda_profiler(start: bool) {
    extern "C" {
        fn dlopen(file: *const std::ffi::c_char, mode: i32) -> *mut std::ffi::c_void;
        fn dlsym(handle: *mut std::ffi::c_void, name: *const std::ffi::c_char) -> *mut std::ffi::c_void;
    }
    const RTLD_NOW: i32 = 2;
    const RTLD_NOLOAD: i32 = 4;
    for lib in [c"libcuda.so.1"] {
        let name = if start { c"cuProfilerStart" } else { c"cuProfilerStop" };
        unsafe {
            let handle = dlopen(lib.as_ptr(), RTLD_NOW | RTLD_NOLOAD);
            if handle.is_null() {
                continue;
            }
            let f = dlsym(handle, name.as_ptr());
            if !f.is_null() {
                let f: extern "C" fn() -> i32 = std::mem::transmute(f);
                f();
                return;
            }
        }
    }
    eprintln!("no CUDA driver loaded: a profiler sees the whole run");
}

/// One decode step of the synthetic 9B at 4K context (or the number after `decode-step`), batch
/// 1 and 8 (batch 1 only above 16K), split into where the time goes: building the lazy graph, encoding it for the device (`async_eval` returns once
/// every operation is encoded), and waiting for the device after that; then the same steps
/// pipelined on one thread (the host encodes step n+1 while the device runs step n), and as `sala
/// bench` runs them, the evaluator thread encoding step n while this one builds step n+1
/// (engine::encoder). Pipelined ≈ build + encode means the host bounds decode; ≈ build + encode
/// + wait, the device; threaded ≈ max(build, encode), the host still.
fn decode_step_split() {
    use mlx_rs::transforms::async_eval;
    use sala::engine::cache::ModelCache;
    use sala::engine::model::Logits;
    let context = numbers_after("decode-step", "[CONTEXT]").first().copied().unwrap_or(4096);
    let model = synthetic_9b();
    println!("context {context}");
    println!("| batch | build µs | encode µs | wait µs | sequential µs | pipelined µs | threaded µs |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let batches: &[usize] = if context > 16384 { &[1] } else { &[1, 8] };
    for &batch in batches {
        let mut caches: Vec<ModelCache> = (0..batch).map(|_| model.new_cache()).collect();
        for (i, cache) in caches.iter_mut().enumerate() {
            prefill_random(model.as_ref(), cache, context, 10 * i as u64);
        }
        let tokens = Array::from_slice(&vec![7i32; batch], &[batch as i32, 1]);
        let step = |caches: &mut Vec<ModelCache>| {
            let mut refs: Vec<&mut ModelCache> = caches.iter_mut().collect();
            let logits = model.forward_batch(&tokens, &mut refs, Logits::Last, None).unwrap();
            std::iter::once(logits).chain(caches.iter().flat_map(|c| c.arrays())).collect::<Vec<_>>()
        };
        let (mut build, mut encode, mut wait) = (0.0, 0.0, 0.0);
        const STEPS: usize = 24;
        for i in 0..STEPS + 4 {
            let t0 = Instant::now();
            let outputs = step(&mut caches);
            let t1 = Instant::now();
            async_eval(outputs.iter()).unwrap();
            let t2 = Instant::now();
            eval(outputs.iter()).unwrap();
            let t3 = Instant::now();
            if i >= 4 {
                build += (t1 - t0).as_secs_f64();
                encode += (t2 - t1).as_secs_f64();
                wait += (t3 - t2).as_secs_f64();
            }
        }
        let start = Instant::now();
        let mut last = Vec::new();
        for _ in 0..STEPS {
            last = step(&mut caches);
            async_eval(last.iter()).unwrap();
        }
        eval(last.iter()).unwrap();
        let pipelined = start.elapsed().as_secs_f64();
        let known: Vec<Vec<u32>> = vec![vec![7; batch]; STEPS];
        let known: Vec<&[u32]> = known.iter().map(Vec::as_slice).collect();
        let start = Instant::now();
        sala::engine::generate::decode_pipelined(model.as_ref(), &mut caches.iter_mut().collect::<Vec<_>>(), &known).unwrap();
        let threaded = start.elapsed().as_secs_f64();
        let us = |x: f64| x / STEPS as f64 * 1e6;
        println!(
            "| {batch} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            us(build),
            us(encode),
            us(wait),
            us(build + encode + wait),
            us(pipelined),
            us(threaded)
        );
    }
}

/// Decode steps of the synthetic model as `sala bench` runs them (engine::generate::decode_pipelined:
/// this thread builds, the evaluator thread encodes; context from the number after `host-profile`,
/// default 4096) for about 6 s under a sampling profiler of the host's threads: each thread's busy
/// time and the functions with the most samples, on the stack (inclusive) and at its top (self),
/// so the host's part of a decode step can be taken apart without perf (the lent machines have
/// none). A thread busy for the whole step bounds decode.
fn host_profile_of_decoding() {
    use sala::engine::cache::ModelCache;
    use std::collections::{HashMap, HashSet};
    let context = numbers_after("host-profile", "[CONTEXT]").first().copied().unwrap_or(4096);
    let model = synthetic_9b();
    let mut cache: ModelCache = model.new_cache();
    prefill_random(model.as_ref(), &mut cache, context, 3);
    const RUN: usize = 32;
    let known: Vec<&[u32]> = vec![&[7u32][..]; RUN];
    let decode = |cache: &mut ModelCache| sala::engine::generate::decode_pipelined(model.as_ref(), &mut [cache], &known).unwrap();
    decode(&mut cache);
    let guard = pprof::ProfilerGuardBuilder::default().frequency(2000).build().expect("the profiler starts");
    let cpu_before = process_cpu_seconds();
    let start = Instant::now();
    let mut steps = 0;
    while start.elapsed().as_secs_f64() < 6.0 {
        decode(&mut cache);
        steps += RUN;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu_before;
    let report = guard.report().build().expect("the profile is read");
    // Per thread: samples, and per function the samples it is on the stack of (once each) and on top of.
    let mut threads: HashMap<String, usize> = HashMap::new();
    let (mut inclusive, mut own): (HashMap<String, usize>, HashMap<String, usize>) = Default::default();
    let mut total = 0;
    for (frames, &count) in &report.data {
        let count = count.max(0) as usize;
        *threads.entry(frames.thread_name.clone()).or_default() += count;
        total += count;
        let names: Vec<String> = frames.frames.iter().filter_map(|f| f.first()).map(|s| short_symbol(&s.name())).collect();
        if let Some(top) = names.first() {
            *own.entry(top.clone()).or_default() += count;
        }
        for name in names.into_iter().collect::<HashSet<_>>() {
            *inclusive.entry(name).or_default() += count;
        }
    }
    println!(
        "context {context}: {steps} steps in {seconds:.2} s, {:.0} µs a step; {:.0} µs of the process's CPU time a step; {total} samples",
        seconds / steps as f64 * 1e6,
        cpu / steps as f64 * 1e6
    );
    // The profiler samples CPU time: a sample's share of the process's CPU time.
    let per_step = |n: usize| n as f64 / total as f64 * cpu / steps as f64 * 1e6;
    let print = |title: &str, map: &HashMap<String, usize>, n: usize| {
        let mut rows: Vec<_> = map.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1));
        println!("\n| {title} | samples | µs a step |\n|---|---:|---:|");
        for (name, &count) in rows.into_iter().take(n) {
            println!("| `{name}` | {count} | {:.1} |", per_step(count));
        }
    };
    print("thread", &threads, 8);
    print("function (inclusive)", &inclusive, 70);
    print("function (self)", &own, 50);
}

/// User and system CPU time of this process, all threads, in seconds (/proc/self/stat).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat is readable");
    // Fields after the command name in parentheses; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A demangled symbol without its argument list, and cut to 110 characters.
fn short_symbol(name: &str) -> String {
    let name = match name.find('(') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    };
    name.chars().take(110).collect::<String>().replace('|', "¦")
}

/// The lazy graph of one decode step of the synthetic 9B at 4K context, batch 1 and 8, as MLX
/// prints it (`mlx_print_graph`, one line per operation), counted by primitive: every operation
/// costs the host its building and its encoding, kernel or not.
fn decode_step_graph() {
    use sala::engine::model::Logits;
    extern "C" {
        fn fopen(path: *const std::ffi::c_char, mode: *const std::ffi::c_char) -> *mut mlx_sys::FILE;
        fn fclose(f: *mut mlx_sys::FILE) -> i32;
    }
    let model = synthetic_9b();
    for batch in [1usize, 8] {
        let mut caches: Vec<_> = (0..batch).map(|_| model.new_cache()).collect();
        for (i, cache) in caches.iter_mut().enumerate() {
            prefill_random(model.as_ref(), cache, 4096, 10 * i as u64);
        }
        let tokens = Array::from_slice(&vec![7i32; batch], &[batch as i32, 1]);
        // One step evaluated first, so the graph printed is a steady step's.
        for round in 0..2 {
            let mut refs: Vec<_> = caches.iter_mut().collect();
            let logits = model.forward_batch(&tokens, &mut refs, Logits::Last, None).unwrap();
            let outputs: Vec<Array> = std::iter::once(logits).chain(caches.iter().flat_map(|c| c.arrays())).collect();
            if round == 1 {
                let path = std::env::temp_dir().join(format!("sala-decode-graph-{batch}.txt"));
                let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
                unsafe {
                    let f = fopen(c_path.as_ptr(), c"w".as_ptr());
                    assert!(!f.is_null(), "cannot write {}", path.display());
                    let v = mlx_sys::mlx_vector_array_new();
                    for o in &outputs {
                        mlx_sys::mlx_vector_array_append_value(v, o.as_ptr());
                    }
                    let namer = mlx_sys::mlx_node_namer_new();
                    mlx_sys::mlx_print_graph(f, namer, v);
                    mlx_sys::mlx_node_namer_free(namer);
                    mlx_sys::mlx_vector_array_free(v);
                    fclose(f);
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let mut counts = std::collections::BTreeMap::<String, usize>::new();
                for line in text.lines() {
                    let kind = line.split_whitespace().next().unwrap_or("").to_string();
                    *counts.entry(kind).or_default() += 1;
                }
                let mut counts: Vec<_> = counts.into_iter().collect();
                counts.sort_by_key(|c| std::cmp::Reverse(c.1));
                println!("batch {batch}: {} lines ({})", text.lines().count(), path.display());
                for (kind, n) in counts {
                    println!("{n:6} {kind}");
                }
            }
            eval(outputs.iter()).unwrap();
        }
    }
}
