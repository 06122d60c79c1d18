//! End to end on loopback (mock-engine replicas and a prefixgate gateway on 127.0.0.1:0,
//! engine time 50× wall time): a conversation scenario through the live runner, and a
//! "gateway" that names no replica (the peer routers set no `target-pod`), whose priming
//! owners and replica split come from the engines' counters.
//!
//! Only counts and cache figures are asserted, never timings.

use loadgen::report::table::replica_split;
use loadgen::run::live::request::http_client;
use loadgen::run::{LiveRunner, LiveTarget, LocalOptions, LocalStack};
use loadgen::workload::{AdmissionSpec, Matrix};
use mock_engine::model::EngineProfile;
use router_core::RouterConfig;

fn matrix(scenario: &str) -> Matrix {
    let text = format!(
        r#"
routes = ["prefix-cache"]
scenarios = ["s"]
[workload]
count = 4
rps = 4.0
output = 8
repeat = 300
families = 2
prefix_tokens = 320
tail_tokens = [20, 30]
priming_candidates = 16
max_setup_attempts = 8
[[round]]
number = 1
seed = 7
[scenario.s]
{scenario}
"#
    );
    Matrix::from_toml_str(&text, "test").expect("test matrix")
}

async fn stack() -> LocalStack {
    let profile = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin L20 profile");
    let options = LocalOptions {
        names: vec!["L20-A".into(), "L20-B".into()],
        profiles: vec![profile],
        time_scale: 50.0,
        model: "m".into(),
        admission: AdmissionSpec::default(),
        routing: RouterConfig::default(),
        gateways: 1,
        assignment: Default::default(),
    };
    LocalStack::start(options)
        .await
        .expect("local stack starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_run_live_and_each_turn_finds_its_history() {
    let stack = stack().await;
    let m = matrix(
        "priming = \"none\"\nconversations = { sessions = 2, turns = 3, think_s = 0.5, user_tokens = [10, 20] }",
    );
    let runner = LiveRunner::new(http_client(), stack.target().clone());
    let result = runner.run_phase(&m.phases()[0]).await.expect("phase runs");
    stack.shutdown().await;
    assert_eq!((result.planned, result.requests, result.dropped), (6, 6, 0));
    assert_eq!(result.success, 6);
    // prefix-cache keeps each session on its replica; every later turn's history (system
    // prompt, earlier messages, answers) is then served from the cache.
    let hit: f64 = result.replicas.values().map(|r| r.cache_hit_tokens).sum();
    let queried: f64 = result
        .replicas
        .values()
        .map(|r| r.cache_queries_tokens)
        .sum();
    assert!(hit / queried > 0.5, "hit ratio {}", hit / queried);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_target_pod_gets_owners_and_split_from_engine_counters() {
    let stack = stack().await;
    // Replica A's own endpoint stands in for a router that names no replica: every request
    // runs on A, and nothing says so but A's counters.
    let mut target = stack.target().clone();
    target.gateways = LiveTarget::one_gateway(target.replicas[0].base.clone(), None);
    let m = matrix("priming = \"warm\"");
    let runner = LiveRunner::new(http_client(), target);
    let result = runner.run_phase(&m.phases()[0]).await.expect("phase runs");
    stack.shutdown().await;
    assert_eq!((result.requests, result.success), (4, 4));
    let owners: Vec<&str> = result
        .initial_prefix_owners
        .values()
        .flat_map(|o| o.iter().map(String::as_str))
        .collect();
    assert_eq!(owners, ["L20-A", "L20-A"]);
    assert_eq!(result.gateway_verified_requests, 0);
    assert_eq!(replica_split(&result), "4/0 (engines)");
}
