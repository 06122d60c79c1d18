//! What the gateway's end-to-end tests share: a gateway configuration on loopback port 0
//! (with or without embedded mock engines), hand-written replicas on port 0, a plain HTTP
//! client, bounded waits, and reading the gateway's `/metrics`. Each file in `gateway/tests/` is a crate of its own that declares
//! `mod support;`; what a test needs only for itself stays in its file.

// Each test crate uses a different subset of these helpers; the ones a crate leaves unused
// would otherwise warn in that crate alone.
#![allow(dead_code, reason = "each test crate uses a different subset")]

use std::time::Duration;

use bytes::Bytes;
use gateway::config::BackendConfig;
use gateway::{GatewayConfig, GatewayHandle};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub mod binary;
pub mod kv_events;
pub mod redis;

/// The model the embedded mock engines serve.
pub const MOCK_MODEL: &str = "mock-model";

/// Bound on every wait; generous for a loaded CI machine.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A plain HTTP/1 client (the gateway's API and metrics listeners both speak it).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A gateway with its API and metrics listeners on `127.0.0.1:0` and no engine scrape, so
/// load comes from the gateway's own outstanding counts; no replicas yet.
pub fn loopback_config() -> GatewayConfig {
    let mut config = GatewayConfig {
        listen: "127.0.0.1:0".parse().expect("a socket address"),
        metrics_listen: "127.0.0.1:0".parse().expect("a socket address"),
        ..GatewayConfig::default()
    };
    config.engine_scrape.enabled = false;
    config
}

/// [`loopback_config`] with `engines` embedded mock engines (`fast` profile, engine time
/// 10× wall time) serving [`MOCK_MODEL`].
pub fn embedded_config(engines: usize) -> GatewayConfig {
    let mut config = loopback_config();
    config.embedded.mock_engines = engines;
    config.embedded.engine_profile = "fast".to_owned();
    config.embedded.time_scale = 10.0;
    config.embedded.served_model = MOCK_MODEL.to_owned();
    config
}

/// Serves a hand-written replica named `name` on `127.0.0.1:0`: the test's `endpoints`, plus
/// the `/health` (always 200) and `/v1/models` (listing `model`) every replica answers.
/// Returns it as a backend for the gateway's configuration.
pub async fn serve_replica(name: &str, model: &str, endpoints: axum::Router) -> BackendConfig {
    let listed = serde_json::json!({"object": "list", "data": [{"id": model}]});
    let app = endpoints
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(move || async move { axum::Json(listed) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("a bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    BackendConfig {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        model: Some(model.to_owned()),
        kv_events: None,
        kv_replay: None,
    }
}

/// Polls `condition` every few milliseconds until it holds, bounded by [`DEADLINE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (bounded) until no response is outstanding on any replica: pods, and tenants'
/// tokens, are released when a response body is.
pub async fn wait_released(gateway: &GatewayHandle) {
    wait_until("outstanding counts back to zero", || {
        gateway.total_outstanding() == 0
    })
    .await;
}

/// Polls the gateway's metrics until `condition` holds on them, up to [`DEADLINE`].
pub async fn wait_for_metrics(
    client: &HttpClient,
    gateway: &GatewayHandle,
    what: &str,
    condition: impl Fn(&str) -> bool,
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let text = metrics(client, gateway).await;
        if condition(&text) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `config` with health checks and KV-event reconnects quick enough for a test.
pub fn with_quick_retries(mut config: GatewayConfig) -> GatewayConfig {
    config.health.interval_ms = 50;
    config.kv_sync.socket_timeout_ms = 500;
    config.kv_sync.initial_backoff_ms = 50;
    config.kv_sync.max_backoff_ms = 200;
    config
}

/// The gateway's `/metrics` text.
pub async fn metrics(client: &HttpClient, gateway: &GatewayHandle) -> String {
    let request = http::Request::get(format!("http://{}/metrics", gateway.metrics_addr()))
        .body(Full::new(Bytes::new()))
        .expect("a metrics request");
    let response = tokio::time::timeout(DEADLINE, client.request(request))
        .await
        .expect("the metrics listener answers")
        .expect("a metrics response");
    assert_eq!(response.status(), 200, "GET /metrics");
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the metrics body")
        .to_bytes();
    String::from_utf8(bytes.to_vec()).expect("UTF-8 metrics")
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (0 if absent).
pub fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name_and_labels)
                .and_then(|rest| rest.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}
