//! A decode step traced once and replayed (`engine::fixed_step`) against the same step built
//! afresh: the comparison tests/fixed_step.rs and tests/dense_families.rs run.

use mlx_rs::Array;
use sala::engine::fixed_step::FixedSteps;
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;

fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i as u32).unwrap()
}

/// Decodes `steps` greedy tokens after a `prompt_len`-token prompt twice, built afresh and through
/// [`FixedSteps`] (the ordinary forward where it declines), and checks each step's logits agree
/// within `tolerance`. Returns how many steps were fixed.
pub fn compare_fixed_steps(model: &dyn LanguageModel, prompt_len: usize, steps: usize, tolerance: f32) -> usize {
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

