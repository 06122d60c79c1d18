//! Golden tests: a synthetic timeline whose every metric is worked out by hand.

use super::*;
use crate::measure::record::{ErrorClass, Usage};

fn ok(
    index: usize,
    family: usize,
    (sent, first, last): (f64, f64, f64),
    tokens: (u32, u32),
    pod: &str,
    outstanding: u64,
) -> RequestRecord {
    RequestRecord {
        first_content: Some(first),
        last_token: Some(last),
        stream_end: Some(last + 0.005),
        usage: Some(Usage {
            prompt_tokens: tokens.0,
            completion_tokens: tokens.1,
            cached_tokens: None,
        }),
        status: Some(200),
        target_pod: Some(pod.into()),
        outstanding_at_selection: Some(outstanding),
        ..RequestRecord::sent(index, family, sent, sent)
    }
}

fn config() -> PhaseConfig {
    PhaseConfig {
        repeat: 300,
        output: 128,
        count: 5,
        rps: 1.6,
        seed: 102,
        phase: "r1-test-random".into(),
        route: "random".into(),
        scenario: "test".into(),
        hot_fraction: 0.0,
        setup_attempt: None,
        family_map: None,
        priming_candidates: None,
        initial_owners: None,
        hot_initial_replica: None,
        traffic: None,
    }
}

fn timeline() -> PhaseOutcome {
    let mut failed = RequestRecord::sent(3, 1, 1.875, 1.875);
    failed.status = Some(503);
    failed.error = Some(ErrorClass::Status);
    let counters = |completed, queries, hits, preemptions| EngineCounters {
        completed,
        queries,
        hits,
        preemptions,
    };
    PhaseOutcome {
        config: config(),
        clock_origin: 1000.0,
        families: 3,
        records: vec![
            // TTFT 0.3, TPOT 0.05: good.
            ok(0, 0, (0.0, 0.3, 0.3 + 127.0 * 0.05), (5040, 128), "A", 0),
            // TTFT 3.0: over the SLO.
            ok(
                1,
                1,
                (0.625, 3.625, 3.625 + 127.0 * 0.0625),
                (5050, 128),
                "B",
                2,
            ),
            // TTFT exactly 2.0 and TPOT 0.125: good (bounds are inclusive).
            ok(
                2,
                0,
                (1.25, 3.25, 3.25 + 127.0 * 0.125),
                (5037, 128),
                "A",
                5,
            ),
            failed,
            // One completion token: TPOT is 0, good.
            ok(4, 0, (2.5, 3.0, 3.0), (5041, 1), "A", 1),
        ],
        replicas: vec![
            ReplicaObservation {
                name: "A".into(),
                before: counters(10.0, 1000.0, 500.0, 0.0),
                after: counters(13.0, 16120.0, 14612.0, 1.0),
                peaks: Peaks {
                    waiting: 2.0,
                    running: 8.0,
                    kv_usage: 0.25,
                },
            },
            ReplicaObservation {
                name: "B".into(),
                before: EngineCounters::default(),
                after: counters(2.0, 10080.0, 0.0, 0.0),
                peaks: Peaks::default(),
            },
        ],
        initial_prefix_owners: BTreeMap::new(),
        routing_counter_deltas: Some(Vec::new()),
        dropped: 0,
    }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn per_request_definitions() {
    let t = timeline();
    let r = &t.records;
    assert!(close(r[0].ttft(), 0.3));
    assert!(close(r[0].tpot(), 0.05));
    assert!(close(r[1].e2e(), 3.0 + 127.0 * 0.0625));
    assert_eq!(r[4].tpot(), Some(0.0));
    assert_eq!(r[3].ttft(), None);
    let slo = Slo::default();
    let good: Vec<bool> = r.iter().map(|x| is_good(x, &slo)).collect();
    assert_eq!(good, [true, false, true, false, true]);
}

#[test]
fn phase_summary_matches_hand_computation() {
    let p = summarize(&timeline(), &Slo::default());
    assert_eq!((p.planned, p.requests, p.success, p.errors), (5, 5, 4, 1));
    assert_eq!((p.good, p.dropped, p.gateway_verified_requests), (3, 0, 4));
    // Successful TTFTs sorted: 0.3, 0.5, 2.0, 3.0.
    assert!(close(p.ttft.p50, 1.25));
    assert!(close(p.ttft.p95, 2.85));
    assert!(close(p.ttft.p99, 2.0 + 0.97));
    // TPOTs sorted: 0, 0.05, 0.0625, 0.125.
    assert!(close(p.tpot.p50, 0.05625));
    // Started at the first send, finished at the last stream end (r2: 19.125 + 0.005).
    assert!((p.started_at - 1000.0).abs() < 1e-9);
    assert!((p.finished_at - 1019.13).abs() < 1e-9);
    assert!((p.elapsed - 19.13).abs() < 1e-9);
    assert!((p.output_tokens_per_second - 385.0 / 19.13).abs() < 1e-9);
    assert_eq!(p.input_tokens_range, [5037, 5050]);

    let f0 = &p.families["0"];
    assert_eq!(f0.requests, 3);
    // Family 0 TTFTs sorted 0.3, 0.5, 2.0: rank 1.9 → 0.5 + 0.9 × 1.5.
    assert!(close(f0.ttft_p95, 1.85));
    assert_eq!(p.families["1"].requests, 2);
    assert!(close(p.families["1"].ttft_p95, 3.0));
    assert!(
        !p.families.contains_key("2"),
        "a family with no request is left out"
    );

    let a = &p.replicas["A"];
    assert_eq!(a.requests, 3);
    assert_eq!(a.family_counts, BTreeMap::from([("0".to_owned(), 3)]));
    assert_eq!((a.engine_completed, a.preemptions), (3.0, 1.0));
    assert_eq!(
        (a.cache_queries_tokens, a.cache_hit_tokens),
        (15120.0, 14112.0)
    );
    assert!((a.cache_hit_ratio - 14112.0 / 15120.0).abs() < 1e-12);
    assert_eq!(
        (a.waiting_peak, a.running_peak, a.kv_usage_peak),
        (2.0, 8.0, 0.25)
    );
    assert_eq!(a.gateway_outstanding_at_selection_peak, 5);
    let b = &p.replicas["B"];
    assert_eq!(
        (b.requests, b.gateway_outstanding_at_selection_peak),
        (1, 2)
    );
    assert_eq!(b.cache_hit_ratio, 0.0);
    assert!((p.cache_hit_ratio - 14112.0 / 25200.0).abs() < 1e-12);
    assert_eq!(p.routing_counter_deltas, Some(Vec::new()));
}

#[test]
fn a_phase_with_no_success_has_null_quantiles_and_no_rate() {
    let mut t = timeline();
    for r in &mut t.records {
        r.status = Some(502);
        r.error = Some(ErrorClass::Status);
    }
    let p = summarize(&t, &Slo::default());
    assert_eq!((p.success, p.good, p.errors), (0, 0, 5));
    assert_eq!(p.ttft.p50, None);
    assert_eq!(p.input_tokens_range, [0, 0]);
}
