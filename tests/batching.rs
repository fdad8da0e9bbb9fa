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

/// A server's warm-up (decode steps of several batch sizes over throwaway one-token histories,
/// prompts of several lengths) runs every shape it is given and leaves nothing behind: the
/// answers after it are the answers of a model that never ran it, bit for bit.
#[test]
fn warming_up_leaves_the_answers_as_they_were() {
    let case = "C_sparse_prefill";
    let model = sala::models::load(&golden(case), Some(Dtype::Float32)).unwrap();
    let prompt = ids(&tokens(case), "prompt_ids");
    let prompts = vec![prompt[..300].to_vec(), prompt[700..740].to_vec()];
    let before = alone(model.as_ref(), &prompts);
    let mut shapes = 0;
    sala::engine::generate::warm_up(model.as_ref(), &[1, 3, 9], &[65, 257], || shapes += 1).unwrap();
    assert_eq!(shapes, 5);
    let after = alone(model.as_ref(), &prompts);
    for ((tokens, logits), (want_tokens, want_logits)) in after.iter().zip(&before) {
        assert_eq!(tokens, want_tokens);
        assert_eq!(logits, want_logits);
    }
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

/// Logits rows `[n, vocab]` as vectors.
fn rows_of(logits: &mlx_rs::Array) -> Vec<Vec<f32>> {
    let vocab = logits.shape()[1] as usize;
    sala::engine::ops::to_vec_f32(logits).unwrap().chunks(vocab).map(<[f32]>::to_vec).collect()
}

fn assert_rows_close(got: &[Vec<f32>], want: &[Vec<f32>], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (r, (a, b)) in got.iter().zip(want).enumerate() {
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff <= tolerance, "{what}, row {r}: logits differ by {diff}");
    }
}

/// A decode step and prompt chunks in one forward call (a server round with prompts riding the
/// step) give the logits of the step and of each chunk run apart, and leave caches that continue
/// alike: three sequences decoding at different lengths; a prompt half in whose chunk ends it;
/// a prompt's first chunk on an empty cache (the forward call long enough to be paced); a
/// one-token chunk that ends its prompt.
#[test]
fn a_decode_step_with_prompt_chunks_riding_matches_them_apart() {
    use mlx_rs::Array;
    use sala::engine::model::Logits;
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let model = model.as_ref();
    assert!(model.mixes_chunks());
    let ids = |start: u32, n: usize| -> Vec<i32> { (start..start + n as u32).map(|t| t as i32).collect() };
    let row = |ids: &[i32]| Array::from_slice(ids, &[1, ids.len() as i32]);
    let prefilled = |start: u32, n: usize| {
        let mut cache = model.new_cache();
        model.forward(&row(&ids(start, n)), &mut cache, Logits::Last, None).unwrap();
        cache
    };
    let decoding = vec![prefilled(100, 5), prefilled(2000, 61), prefilled(7000, 23)];
    let chunked = vec![prefilled(400, 20), model.new_cache(), prefilled(900, 40)];
    let step = Array::from_slice(&[17i32, 4000, 255], &[3, 1]);
    let chunks = vec![row(&ids(420, 37)), row(&ids(5000, 300)), row(&[33])];
    let ends = [true, false, true];

    // Apart: the step batched, then each chunk in a forward call of its own.
    let (mut apart, mut apart_chunks) = (decoding.clone(), chunked.clone());
    let mut want = {
        let mut refs: Vec<&mut _> = apart.iter_mut().collect();
        rows_of(&model.forward_batch(&step, &mut refs, Logits::Last, None).unwrap())
    };
    for ((chunk, cache), &end) in chunks.iter().zip(&mut apart_chunks).zip(&ends) {
        let logits = model.forward(chunk, cache, Logits::Last, None).unwrap();
        if end {
            want.extend(rows_of(&logits));
        }
    }

    // Together.
    let (mut mixed, mut mixed_chunks) = (decoding.clone(), chunked.clone());
    let got = {
        let mut refs: Vec<&mut _> = mixed.iter_mut().collect();
        let mut chunk_refs: Vec<&mut _> = mixed_chunks.iter_mut().collect();
        rows_of(&model.forward_mixed(&step, &mut refs, &chunks, &mut chunk_refs, &ends).unwrap())
    };
    assert_eq!(got.len(), 5, "three decode rows and the two chunks that end their prompts");
    assert_rows_close(&got, &want, 1e-4, "the mixed forward");

    // Every cache holds what it would apart: one more step over all six agrees.
    let next = Array::from_slice(&[8i32, 9, 10, 11, 12, 13], &[6, 1]);
    let next_step = |caches: &mut Vec<sala::engine::cache::ModelCache>| {
        let mut refs: Vec<&mut _> = caches.iter_mut().collect();
        rows_of(&model.forward_batch(&next, &mut refs, Logits::Last, None).unwrap())
    };
    apart.extend(apart_chunks);
    mixed.extend(mixed_chunks);
    for (a, m) in apart.iter().zip(&mixed) {
        assert_eq!(a.len(), m.len());
    }
    assert_rows_close(&next_step(&mut mixed), &next_step(&mut apart), 1e-4, "the step after");

    // What the mixed forward cannot take is refused, not run.
    let mut one = [decoding[0].clone()];
    let mut refs: Vec<&mut _> = one.iter_mut().collect();
    let mut empty = [model.new_cache()];
    let mut empty_refs: Vec<&mut _> = empty.iter_mut().collect();
    assert!(model.forward_mixed(&step, &mut refs, &chunks[..1], &mut empty_refs, &ends[..1]).is_err(), "three decode rows for one cache");
}

/// The server's rounds with each round's prompt chunks riding the decode step (drawn on the
/// device, greedy) give every sequence the tokens it gets alone: prompts going in over several
/// rounds, the first alone (nothing decoding yet), the rest beside the step, some of those
/// forward calls long enough to be paced through the evaluator thread.
#[test]
fn prompts_riding_decode_steps_answer_as_alone() {
    use sala::engine::generate::{next_batch_with_chunks, Chunk, Step};
    use sala::engine::prefix_cache::Trail;
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let opts = GenerateOptions { max_tokens: 12, ignore_eos: true, keep_logits: false, prefill_step: 512, draft: None };
    let prompts: Vec<Vec<u32>> = [(1u32, 5usize), (300, 700), (9000, 70), (4000, 1)].iter().map(|&(s, n)| (s..s + n as u32).collect()).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut cache = model.new_cache();
            let mut d = Decoding::start(model, &mut cache, p, &opts, |_, _| {}).unwrap();
            let mut sampler = greedy();
            while d.next(model, &mut cache, &mut sampler).unwrap().is_some() {}
            d.finish().tokens
        })
        .collect();

    let mut caches: Vec<ModelCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let trails: Vec<Trail> = caches.iter().map(Trail::new).collect();
    let mut samplers: Vec<Sampler> = prompts.iter().map(|_| greedy()).collect();
    let mut decodings: Vec<Decoding> = prompts.iter().zip(&caches).map(|(p, c)| Decoding::begin(model, c, p, &opts).unwrap()).collect();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let (mut rounds, mut rode) = (0, 0);
    while got.iter().map(Vec::len).sum::<usize>() < 12 * prompts.len() {
        rounds += 1;
        assert!(rounds < 200, "the rounds never finished");
        // Each round: a chunk (of 300 tokens at most) for the two oldest prompts not in yet.
        let decoding_now = decodings.iter().filter(|d| d.is_prefilled()).count();
        let (mut steps, mut chunks, mut order) = (Vec::new(), Vec::new(), Vec::new());
        for (i, ((d, c), s)) in decodings.iter_mut().zip(caches.iter_mut()).zip(samplers.iter_mut()).enumerate() {
            if d.is_prefilled() {
                steps.push(Step { decoding: d, cache: c, sampler: s });
                order.push(i);
            } else if chunks.len() < 2 {
                assert!(d.may_ride(c));
                let tokens = d.chunk_along(c, &trails[i], 300);
                chunks.push(Chunk { decoding: d, cache: c, tokens });
            }
        }
        if !chunks.is_empty() && decoding_now > 0 {
            rode += chunks.len();
        }
        for (i, token) in order.into_iter().zip(next_batch_with_chunks(model, &mut steps, &mut chunks).unwrap()) {
            got[i].extend(token);
        }
    }
    assert!(rode >= 3, "chunks rode decode steps {rode} times");
    assert_eq!(got, alone);
}
