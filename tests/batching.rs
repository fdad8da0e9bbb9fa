//! Continuous batching: decoding several sequences of different lengths in one batched forward,
//! with prompts going in a chunk per round in between, gives the same tokens and logits as
//! decoding each alone — for SALA (lightning states, dense and
//! InfLLM-V2 sparse attention, a sequence crossing `dense_len` mid-batch) and for a dense Llama.

mod common;

use common::*;
use mlx_rs::Dtype;
use sala::engine::cache::ModelCache;
use sala::engine::generate::{Decoding, GenerateOptions};
use sala::engine::model::LanguageModel;
use sala::engine::sampler::{Sampler, SamplingParams};

const STEPS: usize = 6;

fn greedy() -> Sampler {
    Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() })
}

fn options() -> GenerateOptions {
    GenerateOptions { max_tokens: STEPS, ignore_eos: true, keep_logits: true, prefill_step: 512, draft: None }
}

/// Each prompt decoded on its own: (tokens, logits rows).
fn alone(model: &dyn LanguageModel, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    prompts
        .iter()
        .map(|p| {
            let mut cache = model.new_cache();
            let mut d = Decoding::start(model, &mut cache, p, &options(), |_, _| {}).unwrap();
            let mut sampler = greedy();
            while d.next(model, &mut cache, &mut sampler).unwrap().is_some() {}
            let g = d.finish();
            (g.tokens, g.logits)
        })
        .collect()
}

/// All prompts decoded together the way the server does it: every round one prefill chunk (of
/// 100 tokens, so prompts go in over many rounds) for the oldest prompt not yet in, then one
/// batched forward for every sequence whose prompt is in.
fn batched(model: &dyn LanguageModel, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut caches: Vec<ModelCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut samplers: Vec<Sampler> = prompts.iter().map(|_| greedy()).collect();
    let opts = GenerateOptions { prefill_step: 100, ..options() };
    let mut decodings: Vec<Decoding> =
        prompts.iter().zip(&caches).map(|(p, c)| Decoding::begin(model, c, p, &opts).unwrap()).collect();
    let mut rounds = 0;
    loop {
        let got = server_round(model, &mut decodings, &mut caches, &mut samplers);
        rounds += 1;
        if decodings.iter().all(Decoding::is_prefilled) && got.iter().all(Option::is_none) {
            break;
        }
        assert!(rounds < 200, "batched decoding never finished");
    }
    decodings
        .into_iter()
        .map(|d| {
            let g = d.finish();
            (g.tokens, g.logits)
        })
        .collect()
}

fn assert_same(model: &dyn LanguageModel, prompts: &[Vec<u32>], tolerance: f32) {
    let want = alone(model, prompts);
    let got = batched(model, prompts);
    for (i, ((want_tokens, want_logits), (got_tokens, got_logits))) in want.iter().zip(&got).enumerate() {
        assert_eq!(got_tokens.len(), STEPS, "sequence {i}");
        assert_eq!(got_tokens, want_tokens, "sequence {i} (prompt of {} tokens)", prompts[i].len());
        for (step, (a, b)) in want_logits.iter().zip(got_logits).enumerate() {
            let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff <= tolerance, "sequence {i}, step {step}: logits differ by {diff}");
        }
    }
}

#[test]
fn sala_batched_decode_matches_one_at_a_time() {
    let case = "C_sparse_prefill";
    let model = sala::models::load(&golden(case), Some(Dtype::Float32)).unwrap();
    let prompt = ids(&tokens(case), "prompt_ids");
    // 1500 tokens (sparse), 254 (crosses dense_len = 256 during the batch), 40 (dense).
    let prompts = vec![prompt.clone(), prompt[..254].to_vec(), prompt[700..740].to_vec()];
    assert_same(model.as_ref(), &prompts, 1e-4);
}

#[test]
fn dense_batched_decode_matches_one_at_a_time() {
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let prompts: Vec<Vec<u32>> = [(1u32, 5usize), (300, 37), (9000, 64)]
        .iter()
        .map(|&(start, len)| (start..start + len as u32).collect())
        .collect();
    assert_same(model.as_ref(), &prompts, 1e-3);
}

/// After a batched step the lightning layers keep their states as rows of the one stacked state
/// the step made, so the next step over the same sequences in the same order reuses it as it is
/// (no slicing and re-stacking); any other batch takes the rows out, with the same results.
#[test]
fn lightning_states_stay_stacked_across_batched_steps() {
    use mlx_rs::Array;
    use sala::engine::cache::{LayerCache, RecurrentState};
    use sala::engine::model::Logits;
    let model = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    let forward = |caches: &mut [ModelCache], ids: &[i32]| {
        let mut refs: Vec<&mut ModelCache> = caches.iter_mut().collect();
        let input = Array::from_slice(ids, &[ids.len() as i32, 1]);
        sala::engine::ops::to_vec_f32(&model.forward_batch(&input, &mut refs, Logits::Last, None).unwrap()).unwrap()
    };
    let mut caches = vec![model.new_cache(), model.new_cache()];
    forward(&mut caches, &[5, 9]);
    forward(&mut caches, &[7, 3]);
    let lightning: Vec<usize> =
        (0..caches[0].layers.len()).filter(|&i| matches!(caches[0].layers[i], LayerCache::Recurrent(_))).collect();
    assert!(!lightning.is_empty());
    for &i in &lightning {
        let (first, second) = caches.split_at_mut(1);
        let a = first[0].layers[i].as_recurrent().unwrap();
        let b = second[0].layers[i].as_recurrent().unwrap();
        assert!(RecurrentState::stacked(&[a, b]).is_some(), "layer {i}: the rows of one stacked state");
        let (a, b) = (first[0].layers[i].as_recurrent().unwrap(), second[0].layers[i].as_recurrent().unwrap());
        assert!(RecurrentState::stacked(&[b, a]).is_none(), "layer {i}: another order must not reuse it");
        assert!(RecurrentState::stacked(&[first[0].layers[i].as_recurrent().unwrap()]).is_none(), "layer {i}: a sub-batch");
    }
    // The next step batched (reusing the stacked states) and each sequence alone (its row taken
    // out) give the same logits.
    let (mut one, mut two) = (vec![caches[0].clone()], vec![caches[1].clone()]);
    let together = forward(&mut caches, &[11, 2]);
    let apart: Vec<f32> = forward(&mut one, &[11]).into_iter().chain(forward(&mut two, &[2])).collect();
    assert_eq!(together.len(), apart.len());
    let diff = together.iter().zip(&apart).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff <= 1e-5, "batched and alone differ by {diff}");
}
