//! Trace replay on the virtual clock (`loadgen replay --sim`): the same planned requests,
//! route after route, each on a fresh cluster (fresh engines, caches and routers), so every
//! route meets the same traffic from the same empty state.
//!
//! Engine counters are read before and after (so the cache hit ratio is the engines'), gauges
//! every 250 ms of virtual time. Deterministic: a route's routing draws are seeded by its
//! name.

use router_core::Strategy;

use super::cluster::{Arrival, SimError, Target};
use super::options::SimOptions;
use crate::measure::{Peaks, ReplayRun, ReplicaObservation, summarize_run};
use crate::workload::PlannedRequest;
use crate::workload::seeding::rng_for;

/// Seeds every replay's routing draws (with the route's name).
const REPLAY_SEED: u64 = 0x7265_706c_6179; // "replay"

/// Replays `plan` once per route on a fresh cluster, calling `progress` after each route.
/// `with_records` keeps every request in the run. On failure the routes already done come
/// back with the error.
pub fn simulate_replay(
    plan: &[PlannedRequest],
    routes: &[Strategy],
    options: &SimOptions,
    with_records: bool,
    progress: &mut dyn FnMut(&ReplayRun),
) -> Result<Vec<ReplayRun>, (Vec<ReplayRun>, SimError)> {
    let mut runs = Vec::with_capacity(routes.len());
    for &route in routes {
        match replay_route(plan, route, options, with_records) {
            Ok(run) => {
                progress(&run);
                runs.push(run);
            }
            Err(e) => return Err((runs, e)),
        }
    }
    Ok(runs)
}

/// One route's replay on a fresh cluster.
pub fn replay_route(
    plan: &[PlannedRequest],
    route: Strategy,
    options: &SimOptions,
    with_records: bool,
) -> Result<ReplayRun, SimError> {
    let mut cluster = options.cluster(rng_for(REPLAY_SEED, &[route.as_str(), "routing"]))?;
    let before = cluster.counters();
    let origin = cluster.now();
    let arrivals = plan
        .iter()
        .map(|r| Arrival {
            request: PlannedRequest {
                at: origin + r.at,
                ..r.clone()
            },
            target: Target::Routed(route),
        })
        .collect();
    let mut peaks = vec![Peaks::default(); cluster.names().len()];
    let served = cluster.drive(arrivals, Some(&mut peaks))?;
    let after = cluster.counters();
    let names = cluster.names().iter().map(String::as_str);
    let replicas = ReplicaObservation::per_replica(names, &before, &after, &peaks);
    let records: Vec<_> = served.into_iter().map(|s| s.record).collect();
    Ok(summarize_run(
        route.as_str(),
        &records,
        &replicas,
        &options.slo,
        with_records,
    ))
}

#[cfg(test)]
mod tests {
    use mock_engine::model::EngineProfile;

    use super::*;
    use crate::run::sim::SimCluster;
    use crate::workload::blocks::{BLOCK_TOKENS, BlockPrompt};
    use crate::workload::{Prompt, Trace, TraceSlice};

    fn h200() -> EngineProfile {
        EngineProfile::builtin("h200-qwen27b-fp8").expect("builtin profile")
    }

    /// The issue's proof of the prompt construction: two requests whose first `k` hash ids
    /// are equal share exactly their first 512·k tokens, and the engine model reports that
    /// many cached tokens when the second follows the first on the same replica.
    #[test]
    fn shared_hash_ids_are_shared_tokens_and_cached_tokens() {
        let options = SimOptions::seed_like(h200());
        for k in [1usize, 2, 5] {
            let first = BlockPrompt {
                ids: (0..6).collect(),
                tokens: 6 * BLOCK_TOKENS - 100,
            };
            let mut ids: Vec<u64> = (0..6).collect();
            for (i, id) in ids.iter_mut().enumerate().skip(k) {
                *id = 1000 + i as u64;
            }
            let second = BlockPrompt {
                ids,
                tokens: 6 * BLOCK_TOKENS - 7,
            };
            let a = mock_engine::tokenizer::encode(&first.text());
            let b = mock_engine::tokenizer::encode(&second.text());
            assert_eq!((a.len(), b.len()), (first.tokens, second.tokens));
            let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            assert_eq!(shared, k * BLOCK_TOKENS, "k = {k}");

            let mut cluster: SimCluster = options.cluster(rng_for(1, &["test"])).unwrap();
            cluster.run_one(first.text(), 1, Target::Direct(0)).unwrap();
            let served = cluster
                .run_one(second.text(), 1, Target::Direct(0))
                .unwrap();
            let usage = served.record.usage.expect("usage");
            // 512·k is a whole number of 16-token blocks and below the prompt's length − 1.
            assert_eq!(
                usage.cached_tokens,
                Some((k * BLOCK_TOKENS) as u32),
                "k = {k}"
            );
        }
    }

    /// When the second prompt is entirely the first's (same ids, same length), vLLM caps the
    /// hit at prompt − 1 rounded down to a block: the last token is always computed.
    #[test]
    fn a_repeated_prompt_hits_all_but_its_last_block() {
        let options = SimOptions::seed_like(h200());
        let prompt = BlockPrompt {
            ids: vec![4, 5],
            tokens: 2 * BLOCK_TOKENS,
        };
        let mut cluster = options.cluster(rng_for(1, &["test"])).unwrap();
        cluster
            .run_one(prompt.text(), 1, Target::Direct(1))
            .unwrap();
        let again = cluster
            .run_one(prompt.text(), 1, Target::Direct(1))
            .unwrap();
        let cached = again.record.usage.and_then(|u| u.cached_tokens);
        assert_eq!(cached, Some((2 * BLOCK_TOKENS - 16) as u32));
    }

    #[test]
    fn every_route_replays_the_same_requests_on_fresh_engines() {
        let text = r#"{"timestamp": 0, "input_length": 2000, "output_length": 4, "hash_ids": [0, 1, 2, 3]}
{"timestamp": 100, "input_length": 1500, "output_length": 3, "hash_ids": [0, 1, 9]}
{"timestamp": 200, "input_length": 600, "output_length": 2, "hash_ids": [0, 8]}
{"timestamp": 300, "input_length": 2000, "output_length": 4, "hash_ids": [0, 1, 2, 3]}
"#;
        let trace = Trace::parse(text, "t.jsonl").unwrap();
        let plan = TraceSlice::default().plan(&trace).unwrap();
        assert!(matches!(plan[0].prompt, Prompt::Blocks(_)));
        let mut options = SimOptions::seed_like(h200());
        options.replicas = 2;
        let routes = [Strategy::Random, Strategy::PrefixCache];
        let runs = simulate_replay(&plan, &routes, &options, true, &mut |_| {}).unwrap();
        assert_eq!(runs.len(), 2);
        for run in &runs {
            assert_eq!((run.requests, run.errors), (4, 0), "{}", run.route);
            let served: usize = run.replicas.values().map(|r| r.requests).sum();
            assert_eq!(served, 4);
            let completed: f64 = run.replicas.values().map(|r| r.engine_completed).sum();
            assert_eq!(completed, 4.0);
            let records = run.records.as_ref().unwrap();
            let outputs: Vec<_> = records.iter().map(|r| r.output_tokens).collect();
            assert_eq!(outputs, vec![Some(4), Some(3), Some(2), Some(4)]);
        }
        // prefix-cache keeps the whole family on one replica: the repeat hits 2000 − 16
        // rounded down to a block, the others their shared blocks.
        let cached: Vec<_> = runs[1]
            .records
            .as_ref()
            .unwrap()
            .iter()
            .map(|r| r.cached_tokens)
            .collect();
        assert_eq!(cached, vec![Some(0), Some(1024), Some(512), Some(1984)]);
    }
}
