//! KV-event sync end to end against an engine in newer vLLMs' named-field (map) event form:
//! a mock engine started with the map format (`--kv-events-format map`), a static second
//! engine, and a gateway subscribed to the first engine's PUB and replay sockets, on
//! loopback port 0.
//!
//! A prompt sent **directly** to the engine is learned from its map-form `BlockStored`
//! events (counted as processed, none counted `unknown`), so `prefix-cache` then finds a
//! 100 % match for it. Before map events were decoded they were skipped as `unknown` and the
//! same request matched 0 %, so the test's claim can fail. The gateway dials one events
//! port on every backend's host, and both backends are on 127.0.0.1, so both pods subscribe
//! to the one publishing engine: the test shows the index is fed, not which pod is chosen
//! (the positional tests in `kv_sync.rs` show that).
//!
//! A `BlockStored` naming a LoRA adapter (`lora_name`) is indexed under the adapter's name,
//! so a request for the base model does not match it; the same tokens stored for the base
//! model do. A hand-driven publisher sends those events to both pods.
//!
//! Every wait polls its condition under a bounded deadline; nothing sleeps and hopes.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use mock_engine::kv_events::KvEventsConfig;
use mock_engine::server::{ReplicaHandle, spawn_replica, spawn_replica_with_events};
use router_core::kv_sync::wire::{END_OF_REPLAY, EventFormat, KvEvent, read_seq};
use zeromq::{DealerSocket, PubSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

mod support;

use support::kv_events::{
    backend, fast_replica, kv_sync_config, last_seq, payload, port, send_batch,
};

use support::{DEADLINE, HttpClient, MOCK_MODEL, http_client, metrics, sample, wait_for_metrics};

/// PUB and replay on free loopback ports, events as maps.
fn map_events() -> KvEventsConfig {
    KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}"#,
    )
    .unwrap()
    .with_format(EventFormat::Map)
}

async fn post(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
    body: String,
) -> http::Response<Bytes> {
    let mut request = http::Request::post(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    assert_eq!(parts.status, 200, "{body:?}");
    http::Response::from_parts(parts, body)
}

/// Every batch payload the engine's replay socket holds.
async fn replayed_payloads(replay: &str) -> Vec<Bytes> {
    let mut dealer = DealerSocket::new();
    tokio::time::timeout(DEADLINE, dealer.connect(replay))
        .await
        .unwrap()
        .unwrap();
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&0u64.to_be_bytes()));
    dealer.send(request).await.unwrap();
    let mut payloads = Vec::new();
    for _ in 0..10_000 {
        let reply = tokio::time::timeout(DEADLINE, dealer.recv())
            .await
            .unwrap()
            .unwrap()
            .into_vec();
        assert_eq!(reply.len(), 3, "[\"\", seq, payload]");
        if read_seq(&reply[1]) == Some(END_OF_REPLAY) {
            return payloads;
        }
        payloads.push(reply[2].clone());
    }
    panic!("no end of replay");
}

/// Whether the first event of a positional batch `[ts: float64, [event…], rank]` with fewer
/// than 16 events is a msgpack map (fixmap 0x80–0x8f) rather than an array (0x90–0x9f).
fn first_event_is_map(payload: &[u8]) -> Option<bool> {
    // 0x93 (3-element batch), 0xcb + 8 bytes (ts), then the events' fixarray header.
    let header = *payload.get(10)?;
    if payload.first() != Some(&0x93) || !(0x91..=0x9f).contains(&header) {
        return None;
    }
    payload.get(11).map(|b| (0x80..=0x8f).contains(b))
}

#[tokio::test]
async fn map_form_events_from_an_engine_feed_the_gateways_index() {
    let client = http_client();
    let a = spawn_replica_with_events(fast_replica("a"), map_events())
        .await
        .unwrap();
    let b = spawn_replica(fast_replica("b")).await.unwrap();
    let events = a.kv_events_endpoint().unwrap().to_owned();
    let replay = a.kv_events_replay_endpoint().unwrap().to_owned();
    let config = kv_sync_config(vec![backend(&a), backend(&b)], port(&events), port(&replay));
    let gateway = gateway::start(config).await.unwrap();
    wait_for_metrics(&client, &gateway, "both subscriptions replayed", |m| {
        ["a", "b"].iter().all(|pod| {
            sample(
                m,
                &format!("aibrix_kvcache_zmq_replay_success_total{{pod_key=\"{pod}\"}}"),
            ) >= 1.0
        })
    })
    .await;

    let prompt: Vec<String> = (0..200).map(|i| format!("map{i}")).collect();
    let body =
        serde_json::json!({"model": MOCK_MODEL, "prompt": prompt.join(" "), "max_tokens": 1})
            .to_string();
    post(
        &client,
        &format!("{}/v1/completions", a.url()),
        &[],
        body.clone(),
    )
    .await;
    wait_for_metrics(&client, &gateway, "the engine's map-form BlockStored applied", |m| {
        ["a", "b"].iter().all(|pod| {
            sample(
                m,
                &format!(
                    "aibrix_kvcache_zmq_events_processed_total{{event_type=\"BlockStored\",pod_key=\"{pod}\"}}"
                ),
            ) >= 1.0
        })
    })
    .await;

    // What the engine published really is the map form.
    let payloads = replayed_payloads(&replay).await;
    let forms: Vec<Option<bool>> = payloads.iter().map(|p| first_event_is_map(p)).collect();
    assert!(forms.contains(&Some(true)), "{forms:?}");
    assert!(!forms.contains(&Some(false)), "{forms:?}");

    let answer = post(
        &client,
        &format!("{}/v1/completions", gateway.url()),
        &[("routing-strategy", "prefix-cache")],
        body,
    )
    .await;
    let header = |name: &str| answer.headers()[name].to_str().unwrap().to_owned();
    assert_eq!(header("x-prefixgate-match-percent"), "100");

    let text = metrics(&client, &gateway).await;
    for pod in ["a", "b"] {
        let unknown = format!(
            "aibrix_kvcache_zmq_events_received_total{{event_type=\"unknown\",pod_key=\"{pod}\"}}"
        );
        assert_eq!(sample(&text, &unknown), 0.0, "{text}");
    }
    for error in [
        "unknown_event_type",
        "\"shape\"",
        "\"decode\"",
        "unknown_parent",
    ] {
        assert!(!text.contains(error), "{error}: {text}");
    }
    gateway.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Tokens per engine block in the `fast` profile (vLLM's default 16).
const ENGINE_BLOCK: usize = 16;

/// The engine's ids for a completion prompt (the `/tokenize` the gateway calls).
async fn engine_ids(client: &HttpClient, engine: &ReplicaHandle, prompt: &str) -> Vec<u32> {
    let body = serde_json::json!({"model": MOCK_MODEL, "prompt": prompt}).to_string();
    let answer = post(client, &format!("{}/tokenize", engine.url()), &[], body).await;
    let json: serde_json::Value = serde_json::from_slice(answer.body()).unwrap();
    serde_json::from_value(json["tokens"].clone()).unwrap()
}

/// A map-form batch with one `BlockStored` of the full blocks of `ids` (engine hashes
/// `base + i`), cached for `lora_name` when given.
fn stored_batch(ids: &[u32], base: u64, lora_name: Option<&str>) -> Bytes {
    let blocks = ids.len() / ENGINE_BLOCK;
    let event = KvEvent::BlockStored {
        block_hashes: (0..blocks as u64).map(|i| base + i).collect(),
        parent: None,
        token_ids: ids[..blocks * ENGINE_BLOCK].to_vec(),
        block_size: ENGINE_BLOCK,
    };
    payload(
        EventFormat::Map,
        vec![event],
        vec![lora_name.map(str::to_owned)],
        0,
    )
}

async fn publish(socket: &mut PubSocket, seq: u64, payload: Bytes) {
    send_batch(socket, seq, payload).await;
}

#[tokio::test]
async fn an_adapters_blocks_do_not_match_requests_for_the_base_model() {
    let client = http_client();
    let mut publisher = PubSocket::new();
    let endpoint = publisher.bind("tcp://127.0.0.1:0").await.unwrap();
    let a = spawn_replica(fast_replica("a")).await.unwrap();
    let b = spawn_replica(fast_replica("b")).await.unwrap();
    let config = kv_sync_config(
        vec![backend(&a), backend(&b)],
        port(&endpoint.to_string()),
        0,
    );
    let gateway = gateway::start(config).await.unwrap();

    // Empty batches until both subscriptions are live (a PUB drops what it sends before a
    // subscription reaches it); the seq keeps rising, as a real publisher's does.
    let mut seq = 0u64;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        publish(
            &mut publisher,
            seq,
            payload(EventFormat::Map, Vec::new(), Vec::new(), 0),
        )
        .await;
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
    // The same length of prompt twice: one cached for an adapter, one for the base model.
    let prompts: Vec<String> = ["adapter", "base"]
        .iter()
        .map(|tag| {
            (0..100)
                .map(|i| format!("{tag}{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    for (i, (prompt, lora_name)) in prompts.iter().zip([Some("sql-adapter"), None]).enumerate() {
        let ids = engine_ids(&client, &a, prompt).await;
        seq += 1;
        publish(
            &mut publisher,
            seq,
            stored_batch(&ids, 1_000 * (i as u64 + 1), lora_name),
        )
        .await;
    }
    let applied = seq as f64;
    wait_for_metrics(&client, &gateway, "both BlockStored applied", |m| {
        last_seq(m, "a") == Some(applied) && last_seq(m, "b") == Some(applied)
    })
    .await;
    let text = metrics(&client, &gateway).await;
    for pod in ["a", "b"] {
        let processed = format!(
            "aibrix_kvcache_zmq_events_processed_total{{event_type=\"BlockStored\",pod_key=\"{pod}\"}}"
        );
        assert_eq!(sample(&text, &processed), 2.0, "{text}");
    }
    // Routed only now, so the gateway's own routing has added neither prompt.
    for (prompt, expected) in prompts.iter().zip(["0", "100"]) {
        let body =
            serde_json::json!({"model": MOCK_MODEL, "prompt": prompt, "max_tokens": 1}).to_string();
        let answer = post(
            &client,
            &format!("{}/v1/completions", gateway.url()),
            &[("routing-strategy", "prefix-cache")],
            body,
        )
        .await;
        let percent = answer.headers()["x-prefixgate-match-percent"]
            .to_str()
            .unwrap();
        assert_eq!(percent, expected, "{prompt:.12}…");
    }
    gateway.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
