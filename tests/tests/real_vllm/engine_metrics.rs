//! The load view reads vLLM's own gauges, under the names and labels this vLLM exports; a
//! gauge an engine does not export is reported, never read as zero.

use std::time::Duration;

use prefixgate_tests::Client;

use super::fleet::{Fleet, MODEL};
use super::gateway::Gateway;
use super::prompts;
use super::stream::Stream;
use super::tap::Tap;

/// The gauges the load view reads, as this vLLM names and labels them.
const GAUGES: [&str; 3] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn the_load_view_reads_vllms_running_waiting_and_kv_gauges() {
    let fleet = Fleet::from_env();
    let replica = fleet.a();
    let client = Client::new();
    let exposition = client
        .call("GET", &format!("{}/metrics", replica.url), &[], "")
        .await;
    for gauge in GAUGES {
        let line = format!("{gauge}{{engine=\"0\",model_name=\"{MODEL}\"}} ");
        assert!(
            exposition.text().lines().any(|l| l.starts_with(&line)),
            "this vLLM exports {line}…"
        );
    }

    let gateway = Gateway::start(&fleet, "engine-metrics", &[replica], "").await;
    // The tiny model runs a whole stream in about a second here, and vLLM's gauges and the
    // gateway's scrape (every 100 ms) sample it: a scrape that misses every step of it is
    // possible on a loaded machine (seen once in CI), so up to three streams are tried,
    // and the engine must be seen running one of them.
    let mut running = None;
    for _ in 0..3 {
        let body = prompts::chat(&prompts::family("gauges"), "Go on.", prompts::LONG, true);
        let mut stream = Stream::new(
            gateway
                .post_streaming(&client, "/v1/chat/completions", &[], &body)
                .await,
        );
        assert!(stream.read_events(2).await);
        running = poll_engine(
            &gateway,
            &client,
            &replica.name,
            Duration::from_secs(5),
            |e| e["running"] == 1,
        )
        .await;
        stream.finish().await;
        if running.is_some() {
            break;
        }
    }
    let engine = running.expect("the engine seen running one of three streams");
    assert_eq!(engine["waiting"], 0, "{engine}");
    assert!(
        engine["kv_usage"].as_f64().is_some_and(|u| u > 0.0),
        "a running request holds blocks: {engine}"
    );
    assert_eq!(engine["missing"], serde_json::json!([]), "{engine}");
    wait_for_engine(&gateway, &client, &replica.name, |e| e["running"] == 0).await;
    assert!(
        !gateway
            .metrics(&client)
            .await
            .contains("prefixgate_engine_metric_missing{")
    );
}

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn a_renamed_engine_gauge_is_reported_not_read_as_zero() {
    let fleet = Fleet::from_env();
    // A vLLM that exports its KV gauge under another name.
    let tap = Tap::renaming(
        fleet.a(),
        "vllm:kv_cache_usage_perc",
        "vllm:kv_cache_usage_ratio",
    )
    .await;
    let backend = tap.backend(fleet.a());
    let gateway = Gateway::start(&fleet, "renamed-gauge", &[&backend], "").await;
    let client = Client::new();
    let series = format!(
        "prefixgate_engine_metric_missing{{metric=\"vllm:kv_cache_usage_perc\",pod=\"{}\"}} 1",
        backend.name
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !gateway.metrics(&client).await.contains(&series) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {series} within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let engine = wait_for_engine(&gateway, &client, &backend.name, |e| e.is_object()).await;
    assert_eq!(
        engine["kv_usage"],
        serde_json::Value::Null,
        "not a zero the engine never said: {engine}"
    );
    assert_eq!(
        engine["missing"],
        serde_json::json!(["vllm:kv_cache_usage_perc"])
    );
    // The counts are still read.
    assert_eq!(engine["running"], 0);
    let log = std::fs::read_to_string(&gateway.log).unwrap();
    assert!(
        log.contains("lacks gauges the load view reads")
            && log.contains("vllm:kv_cache_usage_perc"),
        "the log names the missing gauge: {log}"
    );
}

/// The replica's `engine` in the admin API once `ready` holds of it (bounded: 20 s).
async fn wait_for_engine(
    gateway: &Gateway,
    client: &Client,
    name: &str,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    match poll_engine(gateway, client, name, Duration::from_secs(20), ready).await {
        Some(engine) => engine,
        None => panic!(
            "{name}'s engine view stayed {}",
            gateway.replica(client, name).await["engine"]
        ),
    }
}

/// The replica's `engine` in the admin API once `ready` holds of it, read every 50 ms for
/// at most `within`; `None` if it never did.
async fn poll_engine(
    gateway: &Gateway,
    client: &Client,
    name: &str,
    within: Duration,
    ready: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let engine = gateway.replica(client, name).await["engine"].clone();
        if ready(&engine) {
            return Some(engine);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
