//! Property test: any sequence of submits, aborts and clock advances keeps block accounting
//! exact (every block's references equal the requests holding it, used + free = usable, the
//! cache map agrees with the blocks), never runs more than `max_num_seqs`, emits tokens in
//! time order, and ends with every request finished: `max_tokens` tokens in order, or aborted.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::engine_tests::{request, tiny_profile};
use super::*;

#[derive(Clone, Debug)]
enum Op {
    /// A prompt of `len` tokens whose first `shared` come from family `family`.
    Submit {
        family: u32,
        shared: usize,
        len: usize,
        max_tokens: u32,
    },
    /// Abort the `pick`-th submitted request (modulo the count).
    Abort { pick: usize },
    /// Move the clock forward.
    Advance { dt: f64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..3, 0usize..40, 1usize..40, 1u32..16).prop_map(
            |(family, shared, len, max_tokens)| Op::Submit { family, shared, len, max_tokens }
        ),
        1 => (0usize..64).prop_map(|pick| Op::Abort { pick }),
        4 => (0.0f64..0.2).prop_map(|dt| Op::Advance { dt }),
    ]
}

/// Tight on purpose: 23 usable blocks of 4 tokens for up to 3 requests of up to 55 tokens,
/// so allocation failures and preemptions happen often.
fn pressured_profile() -> EngineProfile {
    let mut profile = tiny_profile(4, 24);
    profile.max_num_seqs = 3;
    profile.max_num_batched_tokens = 16;
    profile.max_model_len = 60;
    profile.frontend_overhead = 0.005;
    profile.a_p = 0.001;
    profile
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn accounting_holds_and_every_request_finishes(ops in prop::collection::vec(op(), 1..80)) {
        let mut engine = EngineModel::new(pressured_profile());
        let mut now = 0.0;
        let mut submitted: Vec<(RequestId, u32)> = Vec::new();
        let mut aborted: HashSet<RequestId> = HashSet::new();
        let mut outputs: Vec<TokenOutput> = Vec::new();
        let mut unique = 1_000u32;
        for op in ops {
            match op {
                Op::Submit { family, shared, len, max_tokens } => {
                    let shared = shared.min(len);
                    let mut prompt: Vec<u32> =
                        (0..shared as u32).map(|i| family * 100 + i).collect();
                    prompt.extend((shared..len).map(|_| {
                        unique += 1;
                        unique
                    }));
                    let id = engine.submit(request(prompt, max_tokens), now)
                        .expect("within max_model_len");
                    submitted.push((id, max_tokens));
                }
                Op::Abort { pick } => {
                    if !submitted.is_empty() {
                        let (id, _) = submitted[pick % submitted.len()];
                        engine.abort(id, now);
                        aborted.insert(id);
                    }
                }
                Op::Advance { dt } => {
                    now += dt;
                    outputs.extend(engine.advance(now));
                }
            }
            prop_assert!(engine.check_invariants().is_ok(), "{:?}", engine.check_invariants());
            prop_assert!(engine.num_running() <= 3);
            let usage = engine.kv_usage();
            prop_assert!((0.0..=1.0).contains(&usage));
        }
        // Drain, step by step, bounded.
        for _ in 0..100_000 {
            let Some(at) = engine.next_wakeup() else { break };
            outputs.extend(engine.advance(at));
            prop_assert!(engine.check_invariants().is_ok(), "{:?}", engine.check_invariants());
        }
        prop_assert_eq!(engine.next_wakeup(), None);
        prop_assert_eq!((engine.num_running(), engine.num_waiting()), (0, 0));
        prop_assert_eq!(engine.kv_usage(), 0.0);
        prop_assert!(outputs.windows(2).all(|w| w[0].at <= w[1].at), "time order");

        let mut per_request: HashMap<RequestId, Vec<&TokenOutput>> = HashMap::new();
        for output in &outputs {
            per_request.entry(output.id).or_default().push(output);
        }
        let mut finished = 0u64;
        for (id, max_tokens) in &submitted {
            let mine = per_request.get(id).map(Vec::as_slice).unwrap_or(&[]);
            prop_assert!(mine.iter().enumerate().all(|(i, o)| o.index as usize == i));
            let complete = mine.len() == *max_tokens as usize
                && mine.last().and_then(|o| o.finish) == Some(FinishReason::Length);
            if complete {
                finished += 1;
            } else {
                // Only an abort may cut a request short, and it then has no final token.
                prop_assert!(aborted.contains(id), "request {} unfinished", id);
                prop_assert!(mine.iter().all(|o| o.finish.is_none()));
            }
        }
        let m = engine.metrics();
        prop_assert_eq!(m.request_success.length, finished);
        prop_assert_eq!(m.request_success.length + m.request_success.abort, submitted.len() as u64);
        prop_assert_eq!(m.generation_tokens, outputs.len() as u64);
        prop_assert!(m.prefix_cache_hits <= m.prefix_cache_queries);
    }
}
