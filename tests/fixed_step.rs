//! A decode step whose per-token integers the device holds (`engine::fixed_step`), traced once and
//! replayed, gives the logits of the same step built afresh at every token: across a flush of the
//! recent-token buffer (a new graph), on a real checkpoint (SmolLM2) and on MiniCPM-SALA's golden
//! models (lightning states, dense attention up to `dense_len`, then InfLLM-V2 built afresh).
//! Caches it cannot take yet are left to the ordinary forward.

mod common;

use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::fixed_step::{taken_on_this_thread, FixedSteps};
use sala::engine::generate::decode_pipelined;
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Decodes `steps` greedy tokens after a `prompt_len`-token prompt twice, built afresh and through
/// [`FixedSteps`] (the ordinary forward where it declines), and checks each step's logits agree
/// within `tolerance`. Returns how many steps were fixed.
fn compare(model: &dyn LanguageModel, prompt_len: usize, steps: usize, tolerance: f32) -> usize {
    let vocab = model.info().vocab_size as u32;
    let prompt: Vec<i32> = (0..prompt_len as u32).map(|i| ((i * 7919 + 13) % vocab) as i32).collect();
    let prompt = Array::from_slice(&prompt, &[1, prompt.len() as i32]);
    let (mut afresh, mut fixed) = (model.new_cache(), model.new_cache());
    let first = model.forward(&prompt, &mut afresh, Logits::Last, None).unwrap();
    model.forward(&prompt, &mut fixed, Logits::Last, None).unwrap();
    let mut token = argmax(&to_vec_f32(&first).unwrap());
    let mut fixed_steps = FixedSteps::new();
    let (mut worst, mut spread, mut taken) = (0f32, 0f32, 0);
    for step in 0..steps {
        let input = Array::from_slice(&[token as i32], &[1, 1]);
        let want = to_vec_f32(&model.forward(&input, &mut afresh, Logits::Last, None).unwrap()).unwrap();
        let got = match fixed_steps.decode(model, &input, &mut fixed).unwrap() {
            Some((logits, _position)) => {
                taken += 1;
                logits
            }
            None => model.forward(&input, &mut fixed, Logits::Last, None).unwrap(),
        };
        let got = to_vec_f32(&got).unwrap();
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < tolerance, "{}: step {step}: logits differ by {diff}", model.info().model_type);
        assert_eq!(fixed.len(), afresh.len());
        worst = worst.max(diff);
        spread = spread.max(want.iter().fold(0f32, |m, x| m.max(x.abs())));
        token = argmax(&want);
    }
    assert!(spread > 0.5, "logits too flat ({spread}) for the comparison to mean anything");
    eprintln!("{}: {taken} of {steps} steps fixed, largest difference {worst:e}", model.info().model_type);
    taken
}

#[test]
fn replayed_fixed_steps_give_the_logits_of_steps_built_afresh() {
    // 300 steps: the recent-token buffer (256) fills and moves into the history once.
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    assert_eq!(compare(model.as_ref(), 40, 300, 1e-3), 300);
}

#[test]
fn minicpm_sala_fixed_steps_match_up_to_its_sparse_attention() {
    // Lightning states in and out of the step, and the sparse layers' dense attention.
    let model = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    assert_eq!(compare(model.as_ref(), 30, 280, 1e-4), 280);
    // dense_len 256: steps from there run InfLLM-V2, built afresh, on the cache fixed steps made.
    let sparse = sala::models::load(&golden("C_sparse_prefill"), Some(Dtype::Float32)).unwrap();
    let taken = compare(sparse.as_ref(), 200, 100, 1e-4);
    assert_eq!(taken, 255 - 200, "fixed up to the step that reaches dense_len");
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
    // MiniCPM-SALA past dense_len (InfLLM-V2's block selection reads host lengths).
    let sala = sala::models::load(&golden("C_sparse_prefill"), Some(Dtype::Float32)).unwrap();
    let mut cache = sala.new_cache();
    let ids: Vec<i32> = (0..300).map(|i| i % 200).collect();
    sala.forward(&Array::from_slice(&ids, &[1, 300]), &mut cache, Logits::Last, None).unwrap();
    assert!(steps.decode(sala.as_ref(), &input, &mut cache).unwrap().is_none());
}

#[test]
fn sala_bench_pipelined_steps_are_fixed_steps_when_asked() {
    // SALA_FIXED_STEP=on (read by decode_pipelined only; no other test here runs it).
    let model = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    let prompt = Array::from_slice(&[3i32, 1, 4, 1, 5, 9, 2, 6], &[1, 8]);
    let (mut afresh, mut fixed) = (model.new_cache(), model.new_cache());
    model.forward(&prompt, &mut afresh, Logits::Last, None).unwrap();
    model.forward(&prompt, &mut fixed, Logits::Last, None).unwrap();
    let known: Vec<Vec<u32>> = (0..40u32).map(|i| vec![(i * 37 + 11) % 512]).collect();
    let steps: Vec<&[u32]> = known.iter().map(Vec::as_slice).collect();
    decode_pipelined(model.as_ref(), &mut [&mut afresh], &steps).unwrap();
    let before = taken_on_this_thread();
    std::env::set_var("SALA_FIXED_STEP", "on");
    let run = decode_pipelined(model.as_ref(), &mut [&mut fixed], &steps);
    std::env::remove_var("SALA_FIXED_STEP");
    run.unwrap();
    assert_eq!(taken_on_this_thread() - before, 40, "every step was a fixed one");
    assert_eq!(fixed.len(), afresh.len());
    // The caches the two made give the next token the same logits.
    let next = Array::from_slice(&[7i32], &[1, 1]);
    let want = to_vec_f32(&model.forward(&next, &mut afresh, Logits::Last, None).unwrap()).unwrap();
    let got = to_vec_f32(&model.forward(&next, &mut fixed, Logits::Last, None).unwrap()).unwrap();
    let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(diff < 1e-4, "after pipelined fixed steps the logits differ by {diff}");
}
