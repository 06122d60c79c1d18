//! KV-event sync end to end: gateways with embedded mock engines (publishing vLLM's KV-cache
//! events on free loopback ports) or static mock engines, on port 0.
//!
//! - A prompt sent **directly** to one engine (not through the gateway) is learned from that
//!   engine's `BlockStored` events, so `prefix-cache` then routes it there with a 100 %
//!   match; without sync the same steps find no match (the test's claim can fail).
//! - A publisher that starts over (a restarted engine: its sequence goes back to 0) drops
//!   what the old one announced and keeps routing on what the new one announces.
//! - An engine whose events port is closed costs counted connect errors, nothing else.
//!
//! Every wait polls its condition under a bounded deadline; nothing sleeps and hopes.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::time::Duration;

use bytes::Bytes;
use gateway::config::BackendConfig;
use gateway::{GatewayConfig, GatewayHandle};
use http_body_util::{BodyExt, Full};
use mock_engine::server::{ReplicaHandle, spawn_replica};
use router_core::kv_sync::wire::{EventFormat, KvEvent};
use zeromq::{PubSocket, Socket};

mod support;

use support::kv_events::{backend, fast_replica, last_seq, payload, port, send_batch};

use support::{
    DEADLINE, HttpClient, MOCK_MODEL, embedded_config, http_client, loopback_config, metrics,
    sample, wait_for_metrics, with_quick_retries,
};

/// Tokens per block in the `fast` profile (vLLM's default 16).
const ENGINE_BLOCK: usize = 16;

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

async fn call(
    client: &HttpClient,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: String,
) -> Answer {
    let mut request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// A gateway in front of static `backends`, subscribed to KV events on `events_port` of
/// each (no replay socket: the tests' publishers have none).
fn static_engines_config(backends: Vec<BackendConfig>, events_port: u16) -> GatewayConfig {
    let mut config = with_quick_retries(loopback_config());
    config.backends = backends;
    config.kv_sync.enabled = true;
    config.kv_sync.port = events_port;
    config.kv_sync.replay_port = 0;
    config
}

/// A gateway with two embedded mock engines, KV-event sync on or off.
fn two_engines(kv_sync: bool) -> GatewayConfig {
    let mut config = with_quick_retries(embedded_config(2));
    config.kv_sync.enabled = kv_sync;
    config
}

/// A prompt of `words` distinct words (the mock tokenizes one id per word).
fn prompt(tag: &str, words: usize) -> String {
    (0..words)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn completion(prompt: &str) -> String {
    serde_json::json!({"model": MOCK_MODEL, "prompt": prompt, "max_tokens": 1}).to_string()
}

/// Sends `prompt` straight to the replica at `authority`, bypassing the gateway.
async fn prime_directly(client: &HttpClient, authority: &str, prompt: &str) {
    let answer = call(
        client,
        "POST",
        &format!("http://{authority}/v1/completions"),
        &[],
        completion(prompt),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
}

async fn through_gateway(client: &HttpClient, gateway: &GatewayHandle, prompt: &str) -> Answer {
    let answer = call(
        client,
        "POST",
        &format!("{}/v1/completions", gateway.url()),
        &[("routing-strategy", "prefix-cache")],
        completion(prompt),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answer
}

fn decisions(text: &str, bucket: &str, kv_sync: bool) -> f64 {
    sample(
        text,
        &format!(
            "aibrix_prefix_cache_routing_decisions_total{{match_percent_bucket=\"{bucket}\",model=\"{MOCK_MODEL}\",using_kv_sync=\"{kv_sync}\"}}"
        ),
    )
}

/// Primes a different long prompt directly on each engine, then routes both through the
/// gateway with `prefix-cache`. Returns the (pod primed, pod chosen, match %) per prompt.
async fn prime_and_route(
    client: &HttpClient,
    gateway: &GatewayHandle,
    kv_sync: bool,
) -> Vec<(String, String, String)> {
    let replicas = gateway.replicas();
    assert_eq!(replicas.len(), 2);
    let mut routed = Vec::new();
    for (i, (name, authority, _)) in replicas.iter().enumerate() {
        let text = prompt(&format!("p{i}w"), 200);
        prime_directly(client, authority, &text).await;
        if kv_sync {
            let processed = format!(
                "aibrix_kvcache_zmq_events_processed_total{{event_type=\"BlockStored\",pod_key=\"{name}\"}}"
            );
            wait_for_metrics(client, gateway, "the engine's BlockStored applied", |m| {
                sample(m, &processed) >= 1.0
            })
            .await;
        }
        let answer = through_gateway(client, gateway, &text).await;
        routed.push((
            name.clone(),
            answer.header("target-pod").to_owned(),
            answer.header("x-prefixgate-match-percent").to_owned(),
        ));
    }
    routed
}

#[tokio::test]
async fn a_prompt_cached_directly_on_an_engine_is_routed_to_it() {
    let client = http_client();
    let gateway = gateway::start(two_engines(true)).await.unwrap();
    for (primed, chosen, percent) in prime_and_route(&client, &gateway, true).await {
        assert_eq!(
            chosen, primed,
            "routed to the engine that cached the prompt"
        );
        assert_eq!(percent, "100");
    }
    let text = metrics(&client, &gateway).await;
    assert_eq!(decisions(&text, "76-100", true), 2.0, "{text}");
    assert_eq!(
        sample(
            &text,
            "aibrix_prefix_cache_indexer_status{indexer_type=\"sync\",model=\"\"}"
        ),
        1.0
    );
    for (name, _, _) in gateway.replicas() {
        let key = format!("pod_key=\"{name}\"");
        assert!(
            sample(
                &text,
                &format!("aibrix_kvcache_zmq_replay_success_total{{{key}}}")
            ) >= 1.0,
            "a replay from 0 at start: {text}"
        );
        assert_eq!(
            sample(
                &text,
                &format!("aibrix_kvcache_zmq_missed_events_total{{{key}}}")
            ),
            0.0
        );
    }
    assert!(!text.contains("tokenize_failed"), "{text}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn subscriptions_renewed_after_idling_replay_and_keep_routing() {
    let client = http_client();
    let mut config = two_engines(true);
    // Renew every 50 ms of silence: many sessions, each replaying from the next seq.
    config.kv_sync.idle_resubscribe_ms = 50;
    let gateway = gateway::start(config).await.unwrap();
    let renewed = |m: &str| {
        ["mock-0", "mock-1"].iter().all(|pod| {
            sample(
                m,
                &format!("aibrix_kvcache_zmq_connections_total{{pod_key=\"{pod}\"}}"),
            ) >= 3.0
        })
    };
    wait_for_metrics(&client, &gateway, "renewed subscriptions", renewed).await;
    for (primed, chosen, percent) in prime_and_route(&client, &gateway, true).await {
        assert_eq!((chosen, percent.as_str()), (primed, "100"));
    }
    let text = metrics(&client, &gateway).await;
    for pod in ["mock-0", "mock-1"] {
        let key = format!("pod_key=\"{pod}\"");
        assert_eq!(
            sample(
                &text,
                &format!("aibrix_kvcache_zmq_missed_events_total{{{key}}}")
            ),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("aibrix_kvcache_zmq_replay_failures_total{{{key}}}")
            ),
            0.0,
            "{text}"
        );
        assert!(!text.contains("sequence_reset"), "{text}");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn without_sync_the_same_prompts_find_no_match() {
    let client = http_client();
    let gateway = gateway::start(two_engines(false)).await.unwrap();
    for (_, _, percent) in prime_and_route(&client, &gateway, false).await {
        assert_eq!(percent, "0", "the index never saw the engines' own caches");
    }
    let text = metrics(&client, &gateway).await;
    assert_eq!(decisions(&text, "0", false), 2.0, "{text}");
    assert_eq!(decisions(&text, "76-100", false), 0.0, "{text}");
    assert!(!text.contains("aibrix_kvcache_zmq"), "{text}");
    gateway.shutdown().await;
}

/// Two static mock engines without events of their own, for the tests that publish events
/// by hand or publish none.
async fn static_engines() -> (ReplicaHandle, ReplicaHandle, Vec<BackendConfig>) {
    let mut handles = Vec::new();
    for name in ["a", "b"] {
        handles.push(spawn_replica(fast_replica(name)).await.unwrap());
    }
    let backends = handles.iter().map(backend).collect();
    let b = handles.pop().unwrap();
    let a = handles.pop().unwrap();
    (a, b, backends)
}

/// The engine's ids for a completion prompt (the same `/tokenize` the gateway calls).
async fn engine_ids(client: &HttpClient, engine: &ReplicaHandle, prompt: &str) -> Vec<u32> {
    let body = serde_json::json!({"model": MOCK_MODEL, "prompt": prompt}).to_string();
    let answer = call(
        client,
        "POST",
        &format!("{}/tokenize", engine.url()),
        &[],
        body,
    )
    .await;
    let json: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    serde_json::from_value(json["tokens"].clone()).unwrap()
}

/// A `BlockStored` for the full blocks of `ids`, engine hashes `base + i`.
fn stored(ids: &[u32], base: u64) -> KvEvent {
    let blocks = ids.len() / ENGINE_BLOCK;
    KvEvent::BlockStored {
        block_hashes: (0..blocks as u64).map(|i| base + i).collect(),
        parent: None,
        token_ids: ids[..blocks * ENGINE_BLOCK].to_vec(),
        block_size: ENGINE_BLOCK,
    }
}

async fn publish(socket: &mut PubSocket, seq: u64, events: &[KvEvent]) {
    let payload = payload(EventFormat::Positional, events.to_vec(), Vec::new(), 0);
    send_batch(socket, seq, payload).await;
}

#[tokio::test]
async fn a_restarted_publisher_drops_the_old_blocks_and_routing_goes_on() {
    let client = http_client();
    let mut publisher = PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let (a, b, backends) = static_engines().await;
    let config = static_engines_config(backends, port(&endpoint.to_string()));
    let gateway = gateway::start(config).await.unwrap();

    // Empty batches until both subscriptions are live (a PUB drops what it sends before a
    // subscription reaches it); the seq keeps rising, as a real publisher's does.
    let mut seq = 0u64;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        publish(&mut publisher, seq, &[]).await;
        let text = metrics(&client, &gateway).await;
        if last_seq(&text, "a").is_some() && last_seq(&text, "b").is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no subscription:\n{text}"
        );
        seq += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = prompt("old", 100);
    let new = prompt("new", 100);
    let old_ids = engine_ids(&client, &a, &old).await;
    let new_ids = engine_ids(&client, &a, &new).await;
    seq += 1;
    publish(&mut publisher, seq, &[stored(&old_ids, 1_000)]).await;
    let stored_seq = seq as f64;
    wait_for_metrics(&client, &gateway, "the old engine's blocks", |m| {
        last_seq(m, "a") == Some(stored_seq) && last_seq(m, "b") == Some(stored_seq)
    })
    .await;

    // The engine restarts: its numbering starts over, its cache is empty.
    publish(&mut publisher, 0, &[stored(&new_ids, 5_000)]).await;
    wait_for_metrics(&client, &gateway, "the sequence reset", |m| {
        ["a", "b"].iter().all(|pod| {
            sample(
                m,
                &format!("aibrix_kvcache_zmq_errors_total{{error_type=\"sequence_reset\",pod_key=\"{pod}\"}}"),
            ) == 1.0
                && last_seq(m, pod) == Some(0.0)
        })
    })
    .await;
    let answer = through_gateway(&client, &gateway, &new).await;
    assert_eq!(answer.header("x-prefixgate-match-percent"), "100");
    let answer = through_gateway(&client, &gateway, &old).await;
    assert_eq!(
        answer.header("x-prefixgate-match-percent"),
        "0",
        "the old engine's blocks were dropped"
    );
    gateway.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_closed_events_port_costs_counted_errors_and_nothing_else() {
    let client = http_client();
    // A port nothing listens on: bound, read, released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (a, b, backends) = static_engines().await;
    let mut config = static_engines_config(backends, closed);
    config.kv_sync.socket_timeout_ms = 100;
    let gateway = gateway::start(config).await.unwrap();
    wait_for_metrics(&client, &gateway, "connect errors on both pods", |m| {
        ["a", "b"].iter().all(|pod| {
            sample(
                m,
                &format!("aibrix_kvcache_zmq_reconnect_attempts_total{{pod_key=\"{pod}\"}}"),
            ) >= 2.0
        })
    })
    .await;
    let text = prompt("closed", 100);
    for _ in 0..3 {
        through_gateway(&client, &gateway, &text).await;
    }
    let text = metrics(&client, &gateway).await;
    // The gateway's own routing still fills the index: the second and third requests match.
    assert_eq!(decisions(&text, "76-100", true), 2.0, "{text}");
    assert!(!text.contains("tokenize_failed"), "{text}");
    assert_eq!(
        sample(&text, "aibrix_kvcache_zmq_connections_total{pod_key=\"a\"}"),
        0.0
    );
    gateway.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
