//! End to end: a tiny operations file run in local mode (mock-engine replicas and a prefixgate
//! gateway on 127.0.0.1:0, engine time 50× wall time), through the same library calls as
//! `loadgen operations --local`, then held to the operations seed's schema.
//!
//! Only counts that the engine's pacing decides are asserted, never timings: a 1000-token
//! answer takes at least 1000 engine steps (38 s of engine time under the L20 profile), while
//! each phase's arrivals span under 2 s of engine time, so the first admitted requests are
//! still streaming when every later arrival comes.

use std::time::Duration;

use loadgen::measure::schema_check::check_against_seed;
use loadgen::run::live::request::http_client;
use loadgen::run::{LocalStacks, OperationsRunner, OperationsTarget, run_operations};
use loadgen::workload::Operations;
use mock_engine::model::EngineProfile;

const SEED: &str = include_str!("../testdata/operations-phases.json");

/// Three phases named as the seed's, shrunk: a wave of 10 arrivals over 0.9 s capped at 2 in
/// flight; 8 alternating tenant arrivals over 1.75 s with the gateway holding tenant B to 1 in
/// flight; a 1-second closed loop of 2 on one shared prefix.
const TINY: &str = r#"
seed = 7

[[phase]]
name = "fixed2-wave"
replicas = 2
repeat = 2
output = 1000
route = "least-request"
inflight_cap = 2
stages = [{ duration = 0.5, rps = 10 }, { duration = 0.5, rps = 10 }]

[[phase]]
name = "tenants-protected"
replicas = 2
repeat = 2
route = "least-request"
stages = [{ duration = 2, rps = 4 }]
inflight_cap = 48
tenants.A = { repeat = 2, output = 4 }
tenants.B = { repeat = 6, output = 1000 }

[phase.admission]
tenants.B = { max_in_flight = 1 }

[[phase]]
name = "cache-online-prefix-a"
replicas = 2
concurrency = 2
duration = 1
repeat = 20
output = 4
shared_prefix = true
route = "prefix-cache"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_operations_file_runs_locally_in_the_seed_schema() {
    let ops = Operations::from_toml_str(TINY, "tiny").unwrap();
    let phases = ops.select(&[]).unwrap();
    let profile = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin L20 profile");
    let stacks = LocalStacks::new(
        "L20-".into(),
        2,
        vec![profile],
        50.0,
        "m".into(),
        router_core::RouterConfig::default(),
    );
    let runner = OperationsRunner::new(http_client(), ops.tenant_header.clone());
    let mut seen = Vec::new();
    let mut progress = |done, p: &loadgen::measure::OperationsPhaseResult| {
        seen.push((done, p.phase.clone()));
    };
    let run = run_operations(
        &runner,
        &ops,
        &phases,
        OperationsTarget::Local(Box::new(stacks)),
        vec!["tiny".into()],
        &mut progress,
        std::future::pending(),
    );
    // A bound on the whole run (wall time), far above what it needs, so a bug cannot hang CI.
    let (result, stopped) = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the run ends");
    assert_eq!(stopped, None);
    assert_eq!(result.complete, Some(true));
    assert_eq!(seen.len(), 3);

    let wave = &result.phases[0];
    assert_eq!(wave.phase, "fixed2-wave");
    assert_eq!((wave.requests, wave.dropped_arrivals), (2, 8), "{wave:?}");
    assert_eq!((wave.success, wave.errors), (2, 0), "{wave:?}");
    let a = &wave.tenants["A"];
    assert_eq!(a.status_counts["200"], 2);
    assert!((64..=74).contains(&a.input_tokens_range[0]), "{a:?}");
    assert_eq!(wave.config.replicas, Some(2));

    let tenants = &result.phases[1];
    assert_eq!(tenants.dropped_arrivals, 0);
    assert_eq!(tenants.requests, 8);
    let (a, b) = (&tenants.tenants["A"], &tenants.tenants["B"]);
    assert_eq!((a.requests, a.success), (4, 4), "{a:?}");
    assert_eq!(a.status_counts.get("200"), Some(&4), "{a:?}");
    // B's first request holds its only place while the other three arrive: 429s.
    assert_eq!(b.requests, 4);
    assert_eq!(b.status_counts.get("200"), Some(&1), "{b:?}");
    assert_eq!(b.status_counts.get("429"), Some(&3), "{b:?}");
    assert_eq!((b.success, tenants.errors), (1, 3));
    assert!((128..=138).contains(&b.input_tokens_range[0]), "{b:?}");
    let caps = tenants.config.gateway_tenant_max_in_flight.as_ref();
    assert_eq!(caps.map(|c| c["B"]), Some(1));

    let cache = &result.phases[2];
    assert!(cache.requests >= 2, "{cache:?}");
    assert_eq!((cache.success, cache.dropped_arrivals), (cache.requests, 0));
    assert_eq!(cache.config.concurrency, Some(2));
    assert!(cache.finished_relative_seconds >= cache.started_relative_seconds);
    assert!(cache.started_relative_seconds >= tenants.finished_relative_seconds);

    let seed: serde_json::Value = serde_json::from_str(SEED).unwrap();
    let ours = serde_json::to_value(&result).unwrap();
    assert_eq!(check_against_seed(&seed, &ours), Vec::<String>::new());
}
