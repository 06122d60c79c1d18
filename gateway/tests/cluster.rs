//! Cluster sharing end to end: gateways on port 0 sharing routing state through a real
//! `redis-server` on a free loopback port, in front of two mock replicas.
//!
//! - A family's first request goes through gateway A; its second, through gateway B, goes
//!   to the replica A chose, with no KV event anywhere (sync is off): B learned it from A's
//!   decision. Over six families, chance alone would pass 1 time in 64.
//! - A gateway that starts late catches up from the stream's recent history.
//! - A's requests in flight count in B's view while they last, and disappear from it when
//!   they end; a gateway that dies mid-request (its decisions in the stream, then silence) is
//!   forgotten with its requests after the peer timeout.
//! - With the server killed, every request is still served and the gateways say they are
//!   disconnected; a restarted server restores sharing.
//!
//! These tests need `redis-server` (support/redis.rs): they are `#[ignore]`d so that
//! `cargo test --workspace` passes without it, and `.ci/run` installs Redis and runs them,
//! checking each one ran and passed. Every wait polls its condition under a deadline.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use bytes::Bytes;
use gateway::{GatewayConfig, GatewayHandle};
use http_body_util::{BodyExt, Full};
use mock_engine::server::{ReplicaHandle, spawn_replica};
use router_core::cluster::{Decided, PeerEvent, PeerMessage, WIRE_VERSION, encode, hashing_digest};

mod support;

use support::kv_events::{backend, fast_replica};
use support::redis::RedisServer;
use support::{
    HttpClient, MOCK_MODEL, http_client, loopback_config, metrics, sample, wait_for_metrics,
    with_quick_retries,
};

async fn two_replicas() -> Vec<ReplicaHandle> {
    vec![
        spawn_replica(fast_replica("r0")).await.unwrap(),
        spawn_replica(fast_replica("r1")).await.unwrap(),
    ]
}

/// A gateway named `id` in front of `replicas`, sharing through `url` with quick heartbeats
/// (and a peer timeout that a loaded CI machine's scheduling delays do not reach).
fn shared(replicas: &[ReplicaHandle], url: &str, id: &str) -> GatewayConfig {
    let mut config = with_quick_retries(loopback_config());
    config.backends = replicas.iter().map(backend).collect();
    config.cluster.url = Some(url.to_owned());
    config.cluster.gateway_id = Some(id.to_owned());
    config.cluster.heartbeat_ms = 100;
    config.cluster.peer_timeout_ms = 2_000;
    config
}

/// A prompt of 300 distinct words: a dozen full 128-byte blocks.
fn family(tag: &str) -> String {
    (0..300)
        .map(|i| format!("{tag}w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sends a completion of `prompt` (plus a per-request tail) through `gateway` with
/// `prefix-load`, and returns the replica that served it.
async fn route(client: &HttpClient, gateway: &GatewayHandle, prompt: &str, tail: &str) -> String {
    let body = serde_json::json!({
        "model": MOCK_MODEL,
        "prompt": format!("{prompt} {tail}"),
        "max_tokens": 2,
    });
    let request = http::Request::post(format!("{}/v1/completions", gateway.url()))
        .header("content-type", "application/json")
        .header("routing-strategy", "prefix-load")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let pod = response.headers()["target-pod"]
        .to_str()
        .unwrap()
        .to_owned();
    response.into_body().collect().await.unwrap();
    pod
}

/// Waits until `gateway` has applied `decided` peer decisions and holds no peer request in
/// flight (their releases applied, or dropped by a heartbeat that no longer lists them).
async fn settled(client: &HttpClient, gateway: &GatewayHandle, decided: f64) {
    let key = "prefixgate_cluster_applied_total{event=\"decided\"}";
    wait_for_metrics(
        client,
        gateway,
        &format!("{decided} decisions, none in flight"),
        |m| sample(m, key) >= decided && sample(m, "prefixgate_cluster_peer_requests") == 0.0,
    )
    .await;
}

async fn connected(client: &HttpClient, gateway: &GatewayHandle, up: bool) {
    let want = if up { 1.0 } else { 0.0 };
    wait_for_metrics(client, gateway, &format!("connected = {want}"), |m| {
        sample(m, "prefixgate_cluster_connected") == want
    })
    .await;
}

/// Gateways `gw-a` and `gw-b` over `replicas`, sharing through `url`, both connected.
async fn two_gateways(
    client: &HttpClient,
    replicas: &[ReplicaHandle],
    url: &str,
) -> [GatewayHandle; 2] {
    let a = gateway::start(shared(replicas, url, "gw-a")).await.unwrap();
    let b = gateway::start(shared(replicas, url, "gw-b")).await.unwrap();
    connected(client, &a, true).await;
    connected(client, &b, true).await;
    [a, b]
}

const FAMILIES: usize = 6;

/// Routes each family's first request through `first` and its second through `second`
/// (after `second` has applied the first's decision and release); returns the pairs.
async fn families_across(
    client: &HttpClient,
    first: &GatewayHandle,
    second: &GatewayHandle,
    tag: &str,
    decided_before: f64,
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for i in 0..FAMILIES {
        let prompt = family(&format!("{tag}{i}"));
        let chosen = route(client, first, &prompt, "first").await;
        settled(client, second, decided_before + i as f64 + 1.0).await;
        pairs.push((chosen, route(client, second, &prompt, "second").await));
    }
    pairs
}

#[tokio::test]
#[ignore = "needs redis-server; .ci/run installs it and runs this"]
async fn cluster_a_familys_second_request_follows_the_first_across_gateways() {
    let redis = RedisServer::start().await;
    let replicas = two_replicas().await;
    let client = http_client();
    let [a, b] = two_gateways(&client, &replicas, &redis.url()).await;
    let pairs = families_across(&client, &a, &b, "fam", 0.0).await;
    for (first, second) in &pairs {
        assert_eq!(
            second, first,
            "the second gateway follows the first: {pairs:?}"
        );
    }
    // Both replicas were used: the families were placed by load, then followed.
    let text = metrics(&client, &b).await;
    assert_eq!(
        sample(&text, "prefixgate_cluster_applied_total{event=\"decided\"}"),
        FAMILIES as f64,
        "{text}"
    );
    assert!(
        sample(&text, "prefixgate_cluster_ignored_total{reason=\"own\"}") >= FAMILIES as f64,
        "B reads its own messages back and skips them: {text}"
    );
    assert_eq!(sample(&text, "prefixgate_cluster_peers"), 1.0, "{text}");

    // A third gateway that starts now learns the families from the stream's history.
    let late = gateway::start(shared(&replicas, &redis.url(), "gw-late"))
        .await
        .unwrap();
    wait_for_metrics(&client, &late, "the history read", |m| {
        sample(m, "prefixgate_cluster_received_total{phase=\"catch_up\"}") >= 4.0 * FAMILIES as f64
    })
    .await;
    for (i, (first, _)) in pairs.iter().enumerate() {
        let prompt = family(&format!("fam{i}"));
        assert_eq!(&route(&client, &late, &prompt, "third").await, first);
    }
    for gateway in [a, b, late] {
        assert!(gateway.shutdown().await);
    }
}

#[tokio::test]
#[ignore = "needs redis-server; .ci/run installs it and runs this"]
async fn cluster_peers_requests_count_until_released_or_their_gateway_goes_silent() {
    let redis = RedisServer::start().await;
    let replicas = two_replicas().await;
    let client = http_client();
    let [a, b] = two_gateways(&client, &replicas, &redis.url()).await;
    // Three requests through A to replicas that hang (they never answer until the client
    // leaves): in flight in A, and in B's view, for as long as the clients wait.
    let mut open = Vec::new();
    for i in 0..3 {
        let body = serde_json::json!({
            "model": MOCK_MODEL, "prompt": family(&format!("long{i}")), "max_tokens": 8,
        });
        let request = http::Request::post(format!("{}/v1/completions", a.url()))
            .header("content-type", "application/json")
            .header("x-mock-fail", "hang")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        open.push(tokio::spawn(client.request(request)));
    }
    let in_view =
        |count: f64| move |m: &str| sample(m, "prefixgate_cluster_peer_requests") == count;
    wait_for_metrics(&client, &b, "A's three requests in B's view", in_view(3.0)).await;
    assert_eq!(b.total_outstanding(), 0, "B's own counts stay its own");
    // One client leaves: B's view follows.
    open.pop().unwrap().abort();
    wait_for_metrics(&client, &b, "two left in B's view", in_view(2.0)).await;
    // The others leave: nothing of A's is left in B's view.
    for request in open {
        request.abort();
    }
    wait_for_metrics(&client, &b, "A's requests released", in_view(0.0)).await;
    // A gateway that dies mid-request: two decisions, then silence (no release, no
    // heartbeat). B counts them, then forgets them after the peer timeout.
    let routing = shared(&replicas, &redis.url(), "x").routing;
    let ghost = |event| PeerMessage {
        v: WIRE_VERSION,
        gateway: "ghost".to_owned(),
        hashing: hashing_digest(&routing, false),
        event,
    };
    let mut connection = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for id in [1, 2] {
        let decided =
            PeerEvent::Decided(Decided::new(id, MOCK_MODEL, "r0", &[], Default::default()));
        let () = redis::cmd("XADD")
            .arg("prefixgate:default:routing")
            .arg("*")
            .arg("m")
            .arg(encode(&ghost(decided)).unwrap())
            .query_async(&mut connection)
            .await
            .unwrap();
    }
    let dead = "the dead gateway's requests in B's view";
    wait_for_metrics(&client, &b, dead, |m| {
        sample(m, "prefixgate_cluster_peer_requests") == 2.0
            && sample(m, "prefixgate_cluster_peers") == 2.0
    })
    .await;
    wait_for_metrics(&client, &b, "the dead gateway forgotten", |m| {
        sample(m, "prefixgate_cluster_peer_requests") == 0.0
            && sample(m, "prefixgate_cluster_peers") == 1.0
            && sample(m, "prefixgate_cluster_peers_expired_total") == 1.0
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
#[ignore = "needs redis-server; .ci/run installs it and runs this"]
async fn cluster_server_loss_loses_no_request_and_a_restart_restores_sharing() {
    let mut redis = RedisServer::start().await;
    let replicas = two_replicas().await;
    let client = http_client();
    let [a, b] = two_gateways(&client, &replicas, &redis.url()).await;
    redis.stop().await;
    // Every request is still served, on each gateway's own view.
    for i in 0..8 {
        let gateway = if i % 2 == 0 { &a } else { &b };
        route(&client, gateway, &family(&format!("down{i}")), "x").await;
    }
    connected(&client, &a, false).await;
    connected(&client, &b, false).await;
    let text = metrics(&client, &a).await;
    assert!(
        sample(
            &text,
            "prefixgate_cluster_dropped_total{reason=\"disconnected\"}"
        ) + sample(
            &text,
            "prefixgate_cluster_dropped_total{reason=\"publish_failed\"}"
        ) >= 1.0,
        "{text}"
    );
    // A fresh server on the same port: both reconnect and share again.
    redis.restart().await;
    connected(&client, &a, true).await;
    connected(&client, &b, true).await;
    let before = sample(
        &metrics(&client, &b).await,
        "prefixgate_cluster_applied_total{event=\"decided\"}",
    );
    let pairs = families_across(&client, &a, &b, "back", before).await;
    for (first, second) in &pairs {
        assert_eq!(second, first, "sharing restored: {pairs:?}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_server_never_stops_a_gateway_from_serving() {
    // No server at all (a port nothing listens on): the gateway starts, serves, and says
    // it is not connected. Runs everywhere: it needs no Redis.
    let replicas = two_replicas().await;
    let client = http_client();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gateway = gateway::start(shared(
        &replicas,
        &format!("redis://127.0.0.1:{port}"),
        "alone",
    ))
    .await
    .unwrap();
    for i in 0..4 {
        route(&client, &gateway, &family(&format!("alone{i}")), "x").await;
    }
    wait_for_metrics(&client, &gateway, "connect errors counted", |m| {
        sample(m, "prefixgate_cluster_errors_total{error=\"connect\"}") >= 1.0
            && sample(m, "prefixgate_cluster_connected") == 0.0
    })
    .await;
    assert!(gateway.shutdown().await);
}
