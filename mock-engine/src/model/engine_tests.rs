//! Behaviour tests of the whole engine on a virtual clock: admission, the step loop,
//! prefix hits and counters, chunked prefill, LRU eviction, preemption, abort. Every time is
//! virtual, so results are exact and independent of the machine.

use super::block_hash::extend_hashes;
use super::*;

/// A small engine with easy numbers: 10 ms per step, nothing else costs time.
pub(super) fn tiny_profile(block_size: usize, num_gpu_blocks: usize) -> EngineProfile {
    EngineProfile {
        name: "tiny".into(),
        max_num_seqs: 4,
        max_num_batched_tokens: 32,
        block_size,
        num_gpu_blocks,
        max_model_len: 64,
        frontend_overhead: 0.0,
        t0: 0.01,
        a_d: 0.0,
        c_kv: 0.0,
        a_p: 0.0,
        c_att: 0.0,
    }
}

pub(super) fn request(prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        prompt,
        max_tokens,
        ignore_eos: true,
    }
}

/// Runs the engine to idle, checking invariants after every step; bounded by `max_steps`.
pub(super) fn run_to_idle(engine: &mut EngineModel, max_steps: usize) -> Vec<TokenOutput> {
    let mut outputs = Vec::new();
    for _ in 0..max_steps {
        let Some(at) = engine.next_wakeup() else {
            return outputs;
        };
        outputs.extend(engine.advance(at));
        engine
            .check_invariants()
            .expect("invariants hold after every step");
    }
    panic!("engine still busy after {max_steps} steps");
}

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn admission_errors_carry_vllm_messages() {
    let mut engine = EngineModel::new(tiny_profile(4, 33));
    assert_eq!(
        engine.submit(request(vec![], 4), 0.0),
        Err(AdmissionError::EmptyPrompt)
    );
    assert_eq!(
        engine.submit(request(vec![1], 0), 0.0),
        Err(AdmissionError::ZeroMaxTokens)
    );
    let too_long = engine.submit(request(tokens(0..65), 1), 0.0);
    let message = too_long.expect_err("65 > 64").to_string();
    assert!(
        message.contains("maximum context length is 64 tokens"),
        "{message}"
    );
    assert!(message.contains("65 input tokens"), "{message}");
    let too_many = engine.submit(request(tokens(0..60), 5), 0.0);
    let message = too_many.expect_err("60 + 5 > 64").to_string();
    assert!(
        message.contains("too large: 5") && message.contains("(5 > 64 - 60)"),
        "{message}"
    );
    assert!(engine.submit(request(tokens(0..60), 4), 0.0).is_ok());
    assert_eq!(engine.next_wakeup(), Some(0.0));
}

#[test]
fn one_request_gets_exact_times_and_counters() {
    let mut profile = tiny_profile(4, 33);
    profile.frontend_overhead = 0.05;
    let mut engine = EngineModel::new(profile);
    assert_eq!(engine.next_wakeup(), None);
    let id = engine.submit(request(tokens(0..8), 3), 1.0).expect("valid");
    assert_eq!(engine.next_wakeup(), Some(1.05));
    assert!(engine.advance(1.04).is_empty());
    assert_eq!(engine.num_running(), 0, "still in the frontend");
    let outputs = run_to_idle(&mut engine, 10);
    let at: Vec<f64> = outputs.iter().map(|o| o.at).collect();
    let expected = [1.06, 1.07, 1.08];
    assert_eq!(at.len(), 3);
    for (got, want) in at.iter().zip(expected) {
        assert!((got - want).abs() < 1e-9, "{at:?}");
    }
    assert!(outputs.iter().all(|o| o.id == id && o.prompt_tokens == 8));
    assert_eq!(
        outputs.iter().map(|o| o.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(outputs[2].finish, Some(FinishReason::Length));
    assert!(outputs[..2].iter().all(|o| o.finish.is_none()));
    assert_eq!(
        outputs[0].token,
        crate::tokenizer::generated_token(id, 0),
        "tokens are the tokenizer's deterministic output"
    );

    let m = engine.metrics();
    assert_eq!((m.prefix_cache_queries, m.prefix_cache_hits), (8, 0));
    assert_eq!((m.prompt_tokens, m.generation_tokens), (8, 3));
    assert_eq!(m.request_success.length, 1);
    assert_eq!((m.ttft.count, m.inter_token_latency.count), (1, 2));
    assert!((m.ttft.sum - 0.06).abs() < 1e-9);
    assert!((m.inter_token_latency.sum - 0.02).abs() < 1e-9);
    assert!((m.e2e_request_latency.sum - 0.08).abs() < 1e-9);
    assert_eq!(m.request_queue_time.count, 1);
    assert!(
        m.request_queue_time.sum.abs() < 1e-9,
        "an idle engine schedules at once"
    );
    assert_eq!(m.iteration_tokens.count, 3);
    assert!(
        (m.iteration_tokens.sum - 10.0).abs() < 1e-9,
        "8 prompt + 2 decode tokens"
    );
    assert_eq!(
        engine.kv_usage(),
        0.0,
        "finished blocks are free (and cached)"
    );
    assert_eq!(engine.next_wakeup(), None);
}

#[test]
fn a_repeated_prompt_hits_all_full_blocks_below_the_last_token() {
    for (len, expected_hit) in [(100u32, 96u32), (96, 80), (16, 0), (17, 16), (1, 0)] {
        let mut profile = tiny_profile(16, 200);
        profile.max_model_len = 128;
        profile.max_num_batched_tokens = 256;
        let mut engine = EngineModel::new(profile);
        engine
            .submit(request(tokens(0..len), 1), 0.0)
            .expect("valid");
        run_to_idle(&mut engine, 100);
        engine
            .submit(request(tokens(0..len), 1), 1.0)
            .expect("valid");
        let outputs = run_to_idle(&mut engine, 100);
        assert_eq!(outputs[0].cached_tokens, expected_hit, "prompt of {len}");
        let m = engine.metrics();
        assert_eq!(m.prefix_cache_queries, 2 * u64::from(len));
        assert_eq!(m.prefix_cache_hits, u64::from(expected_hit));
        assert_eq!(
            m.prompt_tokens,
            2 * u64::from(len),
            "cached tokens still count"
        );
    }
}

#[test]
fn a_shared_family_prefix_hits_exactly_its_full_blocks() {
    // The matrix's worked example: 4704 shared (294 blocks) + 336 private = 5040 tokens.
    let mut engine = EngineModel::new(EngineProfile::builtin("fast").expect("builtin"));
    let family = tokens(1_000_000..1_004_704);
    let with_tail = |tail: u32| {
        let mut prompt = family.clone();
        prompt.extend((0..336).map(|i| 2_000_000 + tail * 1000 + i));
        prompt
    };
    engine.submit(request(with_tail(0), 2), 0.0).expect("valid");
    run_to_idle(&mut engine, 100);
    let before = engine.metrics().clone();
    engine.submit(request(with_tail(1), 2), 1.0).expect("valid");
    let outputs = run_to_idle(&mut engine, 100);
    assert_eq!(outputs[0].cached_tokens, 4704);
    assert_eq!(outputs[0].prompt_tokens, 5040);
    let m = engine.metrics();
    assert_eq!(m.prefix_cache_queries - before.prefix_cache_queries, 5040);
    assert_eq!(m.prefix_cache_hits - before.prefix_cache_hits, 4704);
}

#[test]
fn chunked_prefill_emits_only_after_the_last_chunk() {
    let mut profile = tiny_profile(4, 33);
    profile.max_num_batched_tokens = 16;
    let mut engine = EngineModel::new(profile);
    engine
        .submit(request(tokens(0..40), 2), 0.0)
        .expect("valid");
    // 40 tokens in chunks of 16, 16, 8: the first token ends the third step.
    let outputs = run_to_idle(&mut engine, 20);
    assert!((outputs[0].at - 0.03).abs() < 1e-9, "{outputs:?}");
    assert!((outputs[1].at - 0.04).abs() < 1e-9);
    let m = engine.metrics();
    assert_eq!(m.iteration_tokens.count, 4);
    assert_eq!(m.prefix_cache_queries, 40, "queried once, at admission");
}

#[test]
fn running_requests_never_exceed_max_num_seqs_and_the_rest_wait_fcfs() {
    let mut engine = EngineModel::new(tiny_profile(4, 200));
    let ids: Vec<RequestId> = (0..7)
        .map(|i| {
            engine
                .submit(request(tokens(i * 100..i * 100 + 8), 5), 0.0)
                .expect("valid")
        })
        .collect();
    engine.advance(0.0);
    assert_eq!((engine.num_running(), engine.num_waiting()), (4, 3));
    assert_eq!(engine.scheduler().running(), &ids[..4]);
    assert_eq!(
        engine.scheduler().waiting().collect::<Vec<_>>(),
        ids[4..].to_vec()
    );
    let outputs = run_to_idle(&mut engine, 100);
    let first_token_order: Vec<RequestId> = outputs
        .iter()
        .filter(|o| o.index == 0)
        .map(|o| o.id)
        .collect();
    assert_eq!(first_token_order, ids, "first tokens come in arrival order");
    assert_eq!(engine.metrics().request_success.length, 7);
}

#[test]
fn the_token_budget_caps_each_step() {
    let mut profile = tiny_profile(4, 200);
    profile.max_num_batched_tokens = 20;
    profile.max_num_seqs = 8;
    let mut engine = EngineModel::new(profile);
    for i in 0..5 {
        engine
            .submit(request(tokens(i * 100..i * 100 + 12), 3), 0.0)
            .expect("valid");
    }
    let mut steps = 0;
    while let Some(at) = engine.next_wakeup() {
        let before = engine.metrics().iteration_tokens.clone();
        engine.advance(at);
        let after = &engine.metrics().iteration_tokens;
        // A step started by this advance adds one observation; it must fit the budget.
        if after.count > before.count {
            assert!(after.sum - before.sum <= 20.0 + 1e-9, "step over budget");
        }
        steps += 1;
        assert!(steps < 200, "bounded");
    }
    assert_eq!(engine.metrics().request_success.length, 5);
}

#[test]
fn freed_blocks_are_evicted_last_block_first() {
    // 20 usable blocks of 4 tokens. A and B (4 blocks each) run one after the other and
    // finish; C then needs 14 blocks: the 12 never used, then A's last two blocks.
    let mut profile = tiny_profile(4, 21);
    profile.max_model_len = 60;
    let mut engine = EngineModel::new(profile);
    let a = tokens(0..16);
    let b = tokens(100..116);
    engine.submit(request(a.clone(), 1), 0.0).expect("valid");
    run_to_idle(&mut engine, 10);
    engine.submit(request(b.clone(), 1), 1.0).expect("valid");
    run_to_idle(&mut engine, 10);
    engine
        .submit(request(tokens(200..256), 1), 2.0)
        .expect("valid");
    run_to_idle(&mut engine, 10);

    let hashes = |prompt: &[u32]| {
        let mut h = Vec::new();
        extend_hashes(&mut h, prompt, 4);
        h
    };
    let pool = engine.scheduler().pool();
    let cached = |p: &[u32]| {
        hashes(p)
            .iter()
            .map(|h| pool.is_cached(*h))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cached(&a),
        vec![true, true, false, false],
        "A's tail evicted first"
    );
    assert_eq!(cached(&b), vec![true; 4], "B freed later, kept");
}

#[test]
fn preemption_recomputes_the_newest_and_both_finish() {
    // 10 usable blocks of 4 tokens; two requests of 16 + 20 tokens need up to 9 blocks
    // each, so decoding runs out of blocks and the newer one is preempted.
    let mut profile = tiny_profile(4, 11);
    profile.max_model_len = 40;
    let mut engine = EngineModel::new(profile);
    let x = engine
        .submit(request(tokens(0..16), 20), 0.0)
        .expect("valid");
    let y = engine
        .submit(request(tokens(100..116), 20), 0.0)
        .expect("valid");
    let mut outputs = Vec::new();
    let mut saw_preempted_waiting = false;
    for _ in 0..500 {
        let Some(at) = engine.next_wakeup() else {
            break;
        };
        outputs.extend(engine.advance(at));
        engine.check_invariants().expect("invariants");
        if engine.metrics().preemptions > 0 && engine.num_waiting() == 1 {
            saw_preempted_waiting = true;
            assert_eq!(engine.scheduler().waiting().collect::<Vec<_>>(), vec![y]);
        }
    }
    assert!(engine.metrics().preemptions >= 1);
    assert!(saw_preempted_waiting);
    for id in [x, y] {
        let mine: Vec<&TokenOutput> = outputs.iter().filter(|o| o.id == id).collect();
        assert_eq!(mine.len(), 20, "request {id}");
        assert!(mine.iter().enumerate().all(|(i, o)| o.index as usize == i));
        assert_eq!(mine[19].finish, Some(FinishReason::Length));
    }
    let m = engine.metrics();
    assert_eq!(m.request_success.length, 2);
    assert_eq!(
        m.ttft.count, 2,
        "TTFT once per request, not again after recompute"
    );
    assert!(m.prefix_cache_queries > 32, "re-admission queries again");
    assert_eq!(engine.kv_usage(), 0.0);
}

#[test]
fn a_waiting_request_that_does_not_fit_blocks_the_queue() {
    // 10 usable blocks; the running request holds 9 at the end. The next (needs 4) waits,
    // and the small one behind it does not jump the queue.
    let mut profile = tiny_profile(4, 11);
    profile.max_model_len = 40;
    let mut engine = EngineModel::new(profile);
    let big = engine
        .submit(request(tokens(0..36), 1), 0.0)
        .expect("valid");
    engine.advance(0.0);
    let next = engine
        .submit(request(tokens(100..116), 1), 0.001)
        .expect("valid");
    let small = engine
        .submit(request(tokens(200..202), 1), 0.002)
        .expect("valid");
    let outputs = run_to_idle(&mut engine, 50);
    let order: Vec<RequestId> = outputs.iter().map(|o| o.id).collect();
    assert_eq!(order, vec![big, next, small]);
}

#[test]
fn abort_frees_blocks_and_drops_the_tokens_in_flight() {
    let mut engine = EngineModel::new(tiny_profile(4, 33));
    let id = engine
        .submit(request(tokens(0..20), 10), 0.0)
        .expect("valid");
    let outputs = engine.advance(0.015); // first step ends at 0.01; second is in flight
    assert_eq!(outputs.len(), 1);
    assert!(engine.kv_usage() > 0.0);
    engine.abort(id, 0.015);
    assert_eq!(engine.kv_usage(), 0.0);
    assert_eq!((engine.num_running(), engine.num_waiting()), (0, 0));
    assert!(
        run_to_idle(&mut engine, 10).is_empty(),
        "no token after abort"
    );
    engine.abort(id, 0.03); // finished: no-op
    engine.abort(999, 0.03); // unknown: no-op
    let m = engine.metrics();
    assert_eq!(m.request_success.abort, 1);
    assert_eq!(m.e2e_request_latency.count, 1);
    // The blocks it computed stay cached: the same prompt hits them.
    engine
        .submit(request(tokens(0..20), 1), 1.0)
        .expect("valid");
    let outputs = run_to_idle(&mut engine, 10);
    assert_eq!(outputs[0].cached_tokens, 16);
}

#[test]
fn abort_in_the_frontend_never_reaches_the_scheduler() {
    let mut profile = tiny_profile(4, 33);
    profile.frontend_overhead = 0.1;
    let mut engine = EngineModel::new(profile);
    let id = engine.submit(request(tokens(0..8), 2), 0.0).expect("valid");
    engine.abort(id, 0.05);
    assert_eq!(engine.next_wakeup(), None);
    assert!(run_to_idle(&mut engine, 10).is_empty());
    let m = engine.metrics();
    assert_eq!((m.request_success.abort, m.prefix_cache_queries), (1, 0));
    assert_eq!(m.request_queue_time.count, 0, "never queued");
}

#[test]
fn times_before_the_clock_and_nan_are_harmless() {
    let mut engine = EngineModel::new(tiny_profile(4, 33));
    engine.submit(request(tokens(0..8), 2), 5.0).expect("valid");
    let outputs = engine.advance(10.0);
    assert_eq!(outputs.len(), 2);
    assert!(engine.advance(f64::NAN).is_empty());
    // Submitted "in the past": treated as arriving now, so outputs never go backwards.
    engine.submit(request(tokens(0..8), 1), 1.0).expect("valid");
    let late = run_to_idle(&mut engine, 10);
    assert!(late[0].at >= 10.0, "{late:?}");
    engine
        .submit(request(tokens(50..58), 1), f64::NAN)
        .expect("valid");
    assert_eq!(engine.advance(f64::INFINITY).len(), 1);
    assert_eq!(engine.next_wakeup(), None);
}

#[test]
fn a_request_arriving_mid_step_joins_at_the_next_step_boundary() {
    let mut engine = EngineModel::new(tiny_profile(4, 33));
    let a = engine.submit(request(tokens(0..8), 5), 0.0).expect("valid");
    engine.advance(0.015);
    assert_eq!(
        engine.next_wakeup(),
        Some(0.02),
        "the step in flight ends at 0.02"
    );
    let b = engine
        .submit(request(tokens(100..108), 2), 0.015)
        .expect("valid");
    let outputs = run_to_idle(&mut engine, 20);
    let first_b = outputs
        .iter()
        .find(|o| o.id == b)
        .expect("b produced tokens");
    assert!((first_b.at - 0.03).abs() < 1e-9, "{outputs:?}");
    // Both are batched in the same steps from then on.
    let a_at_03 = outputs
        .iter()
        .any(|o| o.id == a && (o.at - 0.03).abs() < 1e-9);
    assert!(a_at_03);
    assert!(
        engine.metrics().request_queue_time.sum > 0.004,
        "b queued for 5 ms"
    );
}
