//! Trace replay over HTTP (`loadgen replay --local` and `--gateway`): a route's planned
//! requests sent at their times through the target's gateways with that route's
//! `routing-strategy` header, the replicas' counters read before and after and their gauges
//! scraped during, summarized as the simulated replay is.

use std::sync::Arc;

use router_core::Strategy;
use tokio::sync::watch;

use super::progress::PhaseProgress;
use super::request::HttpClient;
use super::runner::LiveError;
use super::scrape::{engine_counters, scrape_peaks};
use super::send::{Sent, send_planned};
use super::target::LiveTarget;
use crate::measure::{ReplayRun, ReplicaObservation, Slo, summarize_run};
use crate::run::assignment::Assigner;
use crate::workload::PlannedRequest;
use crate::workload::seeding::rng_for;

/// Replays `plan` once with `route` against `target`.
pub async fn replay_route_live(
    client: &HttpClient,
    target: &LiveTarget,
    plan: &[PlannedRequest],
    route: Strategy,
    slo: &Slo,
    with_records: bool,
    progress: &Arc<PhaseProgress>,
) -> Result<ReplayRun, LiveError> {
    let before = engine_counters(client, &target.replicas)
        .await
        .map_err(LiveError::Scrape)?;
    let (stop, stopped) = watch::channel(false);
    let scraper = tokio::spawn(scrape_peaks(
        client.clone(),
        target.replicas.clone(),
        target.time_scale,
        stopped,
    ));
    progress.start(route.as_str(), plan.len());
    let draw = rng_for(0, &["replay gateway assignment", route.as_str()]);
    let mut assigner = Assigner::new(target.gateways.len(), target.assignment, draw);
    let Sent { records, .. } = send_planned(
        client,
        target,
        &mut assigner,
        plan.to_vec(),
        Some(route.as_str()),
        progress,
    )
    .await;
    let _ = stop.send(true);
    let peaks = scraper.await.unwrap_or_default();
    let after = engine_counters(client, &target.replicas)
        .await
        .map_err(LiveError::Scrape)?;
    let names = target.replicas.iter().map(|r| r.name.as_str());
    let replicas = ReplicaObservation::per_replica(names, &before, &after, &peaks);
    Ok(summarize_run(
        route.as_str(),
        &records,
        &replicas,
        slo,
        with_records,
    ))
}

#[cfg(test)]
mod tests {
    use mock_engine::model::EngineProfile;
    use router_core::RouterConfig;

    use super::*;
    use crate::run::assignment::GatewayAssignment;
    use crate::run::live::request::http_client;
    use crate::run::local::{LocalOptions, LocalStack};
    use crate::workload::{Trace, TraceSlice};

    /// A real stack on loopback (two never-busy `fast` replicas behind two gateways, time
    /// scale 100): every request of a small trace is served and counted once, and the
    /// repeated prompt hits the cache wherever prefix-cache sent it. Invariants only, never
    /// timings.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trace_replays_through_two_local_gateways() {
        let text = r#"{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}
{"timestamp": 50, "input_length": 700, "output_length": 3, "hash_ids": [0, 5]}
{"timestamp": 3000, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}
"#;
        let plan = TraceSlice::default()
            .plan(&Trace::parse(text, "t.jsonl").unwrap())
            .unwrap();
        let stack = LocalStack::start(LocalOptions {
            names: vec!["a".into(), "b".into()],
            profiles: vec![EngineProfile::builtin("fast").unwrap()],
            time_scale: 100.0,
            model: "m".into(),
            admission: Default::default(),
            routing: RouterConfig::default(),
            gateways: 2,
            assignment: GatewayAssignment::RoundRobin,
        })
        .await
        .unwrap();
        assert_eq!(stack.target().gateways.len(), 2);
        let progress = Arc::default();
        let run = replay_route_live(
            &http_client(),
            stack.target(),
            &plan,
            Strategy::PrefixCache,
            &Slo::default(),
            true,
            &progress,
        )
        .await
        .unwrap();
        stack.shutdown().await;
        assert_eq!((run.requests, run.errors), (3, 0));
        let routed: usize = run.replicas.values().map(|r| r.requests).sum();
        let completed: f64 = run.replicas.values().map(|r| r.engine_completed).sum();
        assert_eq!((routed, completed), (3, 3.0));
        let records = run.records.unwrap();
        let outputs: Vec<_> = records.iter().map(|r| r.output_tokens).collect();
        assert_eq!(outputs, vec![Some(4), Some(3), Some(4)]);
        // The chat template adds tokens before the text, so block boundaries shift; the
        // third request went through the first gateway again, which placed the first, and
        // finds at least the first's full blocks cached.
        let first = records[0].prompt_tokens.unwrap();
        assert_eq!(records[2].prompt_tokens, Some(first));
        assert!(
            records[2].cached_tokens.unwrap() >= first - 16,
            "{records:?}"
        );
    }
}
