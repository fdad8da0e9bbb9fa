//! Checkpoint layouts and dtypes: sharded safetensors, storage dtype detection, f16 compute.

mod common;

use common::golden;
use mlx_rs::{Array, Dtype};
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;

fn prefill_logits(dir: &std::path::Path, dtype: Option<Dtype>) -> Vec<f32> {
    let model = sala::models::load(dir, dtype).unwrap();
    let prompt: Vec<i32> = common::ids(&common::tokens("A_dense_f32"), "prompt_ids").iter().map(|&i| i as i32).collect();
    let mut cache = model.new_cache();
    let input = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    to_vec_f32(&model.forward(&input, &mut cache, Logits::Last, None).unwrap()).unwrap()
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let src = golden("A_dense_f32");
    let dir = std::env::temp_dir().join(format!("sala-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = st.tensors();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let half = tensors.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        for (name, _) in part {
            weight_map.insert(name.clone(), file.clone().into());
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = part.to_vec();
        std::fs::write(dir.join(&file), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    assert_eq!(prefill_logits(&dir, None), prefill_logits(&src, None));

    // A shard that the index names but that is missing is reported by name.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = sala::models::load(&dir, None).err().expect("must fail");
    assert!(err.to_string().contains("shard `model-00002-of-00002.safetensors`"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn storage_dtype_is_the_default_and_f16_runs() {
    let a = sala::models::load(&golden("A_dense_f32"), None).unwrap();
    assert_eq!(a.info().dtype, Dtype::Float32);
    let b = sala::models::load(&golden("B_chunk_boundary"), None).unwrap();
    assert_eq!(b.info().dtype, Dtype::Bfloat16);
    let f32_logits = prefill_logits(&golden("A_dense_f32"), None);
    let f16_logits = prefill_logits(&golden("A_dense_f32"), Some(Dtype::Float16));
    let diff = f32_logits.iter().zip(&f16_logits).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    assert!(diff < 0.05, "f16 vs f32 logits differ by {diff}");
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    assert_eq!(argmax(&f16_logits), argmax(&f32_logits));
}
