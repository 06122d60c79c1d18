//! End to end: shortened, time-scaled drain and scale-up phases on a local stack (mock-engine
//! replicas and a prefixgate gateway on 127.0.0.1:0, engine time 20× wall time), through the
//! runner `loadgen operations --local` uses. A drain of either kind loses no request, the
//! drained replica serves nothing sent after its signal, and the gateway's outstanding counts
//! return to zero; a replica added mid-phase takes requests.
//!
//! Counts and orders only, never timings: each 64-token answer takes about 4 s of engine time
//! under the L20 profile, so every phase has several rounds before and after its event.

use std::time::Duration;

use loadgen::measure::OperationsPhaseResult;
use loadgen::run::live::request::http_client;
use loadgen::run::{LocalOptions, LocalStack, OperationsRunner};
use loadgen::workload::{AdmissionSpec, Operations};
use mock_engine::model::EngineProfile;

/// A 40-second closed loop of 4 senders with `event` (a TOML inline-table key).
fn phase_file(name: &str, replicas: usize, event: &str) -> String {
    format!(
        r#"
[[phase]]
name = "{name}"
replicas = {replicas}
concurrency = 4
duration = 40
repeat = 4
output = 64
route = "least-request"
{event}
"#
    )
}

/// Runs the single phase of `file` on a fresh stack of `replicas`; the result, after
/// checking that the gateway's outstanding counts went back to zero.
async fn run(file: &str, replicas: usize) -> OperationsPhaseResult {
    let ops = Operations::from_toml_str(file, "events").expect("a valid file");
    let phase = ops.select(&[]).expect("phases").remove(0);
    let names = (0..replicas)
        .map(|i| format!("L20-{}", char::from(b'A' + i as u8)))
        .collect();
    let stack = LocalStack::start(LocalOptions {
        names,
        profiles: vec![EngineProfile::builtin("l20-qwen27b-fp8").expect("L20 profile")],
        time_scale: 20.0,
        model: "m".into(),
        admission: AdmissionSpec::default(),
        routing: router_core::RouterConfig::default(),
        gateways: 1,
        assignment: Default::default(),
    })
    .await
    .expect("the stack starts");
    let runner = OperationsRunner::new(http_client(), ops.tenant_header.clone());
    let result = tokio::time::timeout(
        Duration::from_secs(120),
        runner.run_phase(
            &phase,
            stack.target(),
            tokio::time::Instant::now(),
            None,
            Some(&stack),
        ),
    )
    .await
    .expect("the phase ends")
    .expect("its events happen");
    // Released when each response body ends; the last may end a moment after its record.
    let released = async {
        while stack.gateway_outstanding() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), released)
        .await
        .expect("outstanding counts back to zero");
    stack.shutdown().await;
    result
}

fn assert_nothing_lost(result: &OperationsPhaseResult) {
    assert!(result.requests > 8, "{}: too few rounds", result.phase);
    assert_eq!(result.errors, 0, "{}: failed requests", result.phase);
    assert_eq!(result.success, result.requests);
    let statuses = &result.tenants["A"].status_counts;
    assert_eq!(statuses.keys().collect::<Vec<_>>(), ["200"], "{statuses:?}");
}

async fn drain_of(kind: &str) {
    let file = phase_file(
        &format!("drain-{kind}"),
        2,
        &format!(r#"drain = {{ at = 15, kind = "{kind}" }}"#),
    );
    let result = run(&file, 2).await;
    assert_nothing_lost(&result);
    let drain = result.drain.as_ref().expect("the drain is recorded");
    assert_eq!(
        (drain.replica.as_str(), drain.kind.as_str()),
        ("L20-B", kind)
    );
    assert!(
        drain.signalled_s >= 15.0 && drain.exited_s >= drain.signalled_s,
        "{drain:?}"
    );
    assert!(drain.requests_before > 0, "{drain:?}");
    assert_eq!(
        drain.requests_after, 0,
        "served after its signal: {drain:?}"
    );
    assert_eq!(drain.cut, 0, "{drain:?}");
    let split = result.replica_split.as_ref().expect("a split over time");
    let on_b: usize = split.requests["L20-B"].iter().sum();
    assert_eq!(on_b, drain.requests_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_drain_loses_no_request() {
    drain_of("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_drain_loses_no_request() {
    drain_of("graceful").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_added_mid_phase_takes_requests() {
    let file = phase_file("scale-up", 1, "scale_up = { at = 10, add = 1 }");
    let result = run(&file, 1).await;
    assert_nothing_lost(&result);
    let scale = result.scale_up.as_ref().expect("the scale-up is recorded");
    let added = &scale.added[0];
    assert_eq!(added.name, "L20-B");
    assert!(added.requests > 0, "{added:?}");
    assert!(added.first_request_s.is_some(), "{added:?}");
}
