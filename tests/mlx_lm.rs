//! Checkpoints written by mlx-lm itself (PyPI `mlx-lm==0.32.2`): tiny random Llama / Qwen2 / Qwen3
//! models quantized by `mlx_lm.convert` (embeddings included, 4 and 8 bits, groups 32 and 64) must
//! load and give mlx-lm's own logits. mlx-lm runs from a venv cached under `$SALA_TEST_ASSETS`
//! (`SALA_MLX_LM_PYTHON` may name an interpreter that has it).

mod common;

use mlx_rs::Array;
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;
use std::path::PathBuf;
use std::process::Command;

/// A Python that can `import mlx_lm`.
fn python() -> PathBuf {
    common::venv_python("mlx-lm-venv", "SALA_MLX_LM_PYTHON", "mlx_lm", &["mlx[cpu]==0.32.2", "mlx-lm==0.32.2"])
}

#[test]
fn mlx_lm_quantized_checkpoints_give_mlx_lm_logits() {
    let out = std::env::temp_dir().join(format!("sala-mlx-lm-{}", std::process::id()));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/mlx_lm_quantized.py");
    let tokenizer = common::shared().join("assets/minicpm4-tokenizer");
    let status = Command::new(python()).arg(script).arg(&out).arg(tokenizer).output().unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let prompt: Vec<i32> = serde_json::from_str(&std::fs::read_to_string(out.join("prompt.json")).unwrap()).unwrap();
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    for case in ["llama_q4", "qwen2_q8", "qwen3_q4"] {
        let dir = out.join(case);
        let bytes = std::fs::read(dir.join("logits.f32")).unwrap();
        let want: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let model = sala::models::load(&dir, None).unwrap();
        let got = to_vec_f32(&model.forward(&input, &mut model.new_cache(), Logits::All, None).unwrap()).unwrap();
        assert_eq!(got.len(), want.len(), "{case}");
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        let spread = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        println!("{case}: max |Δlogit| {diff:.2e} (logits up to {spread:.2})");
        assert!(diff < 1e-3 && spread > 0.1, "{case}: logits differ from mlx-lm's by {diff}");
        // The summary sees mlx-lm's quantized embeddings.
        let (summary, _) = sala::store::summary::summarize(&dir, None).unwrap();
        assert!(summary.quantization.contains("-bit group"), "{case}: {}", summary.quantization);
    }
    std::fs::remove_dir_all(out).unwrap();
}
