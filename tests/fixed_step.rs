//! A decode step whose per-token integers the device holds (`engine::fixed_step`), traced once and
//! replayed, gives the logits of the same step built afresh at every token: across a flush of the
//! recent-token buffer (a new graph), on a real checkpoint (SmolLM2) and on MiniCPM-SALA's golden
//! models (lightning states, dense attention up to `dense_len`, then InfLLM-V2 built afresh).
//! Caches it cannot take yet are left to the ordinary forward.

mod common;

use common::fixed_steps::compare_fixed_steps;
use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::fixed_step::{taken_on_this_thread, FixedSteps};
use sala::engine::generate::decode_pipelined;
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;

#[test]
fn replayed_fixed_steps_give_the_logits_of_steps_built_afresh() {
    // 300 steps: the recent-token buffer (256) fills and moves into the history once.
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    assert_eq!(compare_fixed_steps(model.as_ref(), 40, 300, 1e-3), 300);
}

#[test]
fn minicpm_sala_fixed_steps_match_up_to_its_sparse_attention() {
    // Lightning states in and out of the step, and the sparse layers' dense attention.
    let model = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    assert_eq!(compare_fixed_steps(model.as_ref(), 30, 280, 1e-4), 280);
    // dense_len 256: steps from there run InfLLM-V2, built afresh, on the cache fixed steps made.
    let sparse = sala::models::load(&golden("C_sparse_prefill"), Some(Dtype::Float32)).unwrap();
    let taken = compare_fixed_steps(sparse.as_ref(), 200, 100, 1e-4);
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
