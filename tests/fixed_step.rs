//! A decode step whose per-token integers the device holds (`engine::fixed_step`), traced once and
//! replayed, gives the logits of the same step built afresh at every token: across a flush of the
//! recent-token buffer (a new graph), on a real checkpoint (SmolLM2). Caches it cannot take yet
//! are left to the ordinary forward.

mod common;

use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::fixed_step::FixedSteps;
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

#[test]
fn replayed_fixed_steps_give_the_logits_of_steps_built_afresh() {
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let vocab = model.info().vocab_size as u32;
    let prompt: Vec<i32> = (0..40).map(|i| ((i * 7919 + 13) % vocab) as i32).collect();
    let prompt = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    let (mut afresh, mut fixed) = (model.new_cache(), model.new_cache());
    let first = model.forward(&prompt, &mut afresh, Logits::Last, None).unwrap();
    model.forward(&prompt, &mut fixed, Logits::Last, None).unwrap();
    let mut token = argmax(&to_vec_f32(&first).unwrap());
    let mut steps = FixedSteps::new();
    let (mut worst, mut spread) = (0f32, 0f32);
    // 300 steps: the recent-token buffer (256) fills and moves into the history once.
    for step in 0..300 {
        let input = Array::from_slice(&[token as i32], &[1, 1]);
        let want = to_vec_f32(&model.forward(&input, &mut afresh, Logits::Last, None).unwrap()).unwrap();
        let got = steps.decode(model.as_ref(), &input, &mut fixed).unwrap().expect("a plain dense cache takes fixed steps");
        let got = to_vec_f32(&got).unwrap();
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-3, "step {step}: logits differ by {diff}");
        assert_eq!(fixed.len(), afresh.len());
        worst = worst.max(diff);
        spread = spread.max(want.iter().fold(0f32, |m, x| m.max(x.abs())));
        token = argmax(&want);
    }
    assert!(spread > 1.0, "logits too flat ({spread}) for the comparison to mean anything");
    eprintln!("largest difference over 300 steps: {worst:e}");
}

#[test]
fn caches_a_fixed_step_cannot_take_are_left_to_the_forward() {
    let mut model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let input = Array::from_slice(&[5i32], &[1, 1]);
    let mut steps = FixedSteps::new();
    // An empty cache (nothing to attend to yet), and an 8-bit one.
    assert!(steps.decode(model.as_ref(), &input, &mut model.new_cache()).unwrap().is_none());
    model.set_kv_bits(8).unwrap();
    let mut quantized = model.new_cache();
    model.forward(&Array::from_slice(&[1i32, 2, 3], &[1, 3]), &mut quantized, Logits::Last, None).unwrap();
    assert!(steps.decode(model.as_ref(), &input, &mut quantized).unwrap().is_none());
    assert_eq!(quantized.len(), 3, "the cache is untouched");
    // MiniCPM-SALA's lightning layers are recurrent: not yet.
    let sala = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    let mut cache = sala.new_cache();
    sala.forward(&Array::from_slice(&[1i32, 2, 3], &[1, 3]), &mut cache, Logits::Last, None).unwrap();
    assert!(steps.decode(sala.as_ref(), &input, &mut cache).unwrap().is_none());
}
