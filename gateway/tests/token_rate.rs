//! Per-tenant token rates end to end: a gateway with one embedded mock engine on port 0, a
//! token bucket of 10 000 tokens refilled at 1 token/s per tenant (so refill during the
//! test is negligible next to the numbers checked). Tenant B spends tokens, has its charge
//! settled to the reply's `usage`, and is then refused with 429 and `Retry-After` while
//! tenant A, with its own bucket, passes; a request larger than the burst is a 400 that
//! makes no bucket; and nothing stays counted once the responses end. A request that no
//! replica took (each answered 503, one retry) is charged once and refunded in full.
//!
//! Every wait polls its condition with a bounded deadline; nothing sleeps and hopes.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gateway::{GatewayConfig, GatewayHandle};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

const MODEL: &str = "mock-model";
const BURST: u64 = 10_000;
/// Bound on every wait in this test; generous for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(30);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn config() -> GatewayConfig {
    let mut config = GatewayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        ..GatewayConfig::default()
    };
    config.embedded.mock_engines = 1;
    config.embedded.engine_profile = "fast".to_owned();
    config.embedded.time_scale = 10.0;
    config.embedded.served_model = MODEL.to_owned();
    config.engine_scrape.enabled = false;
    config.admission.tenant_tokens_per_second = 1;
    config.admission.tenant_token_burst = BURST;
    config
}

async fn post(
    client: &HttpClient,
    gateway: &GatewayHandle,
    tenant: &str,
    body: String,
) -> http::Response<Incoming> {
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("{}/v1/completions", gateway.url()))
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    tokio::time::timeout(DEADLINE, client.request(request))
        .await
        .expect("the gateway answers")
        .unwrap()
}

async fn json(response: http::Response<Incoming>) -> serde_json::Value {
    let bytes = tokio::time::timeout(DEADLINE, response.into_body().collect())
        .await
        .expect("the body ends")
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn completion(prompt: &str, max_tokens: u64, stream: bool) -> String {
    serde_json::json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

/// Waits (bounded) until no response is outstanding: tokens settle when the body is released.
async fn wait_released(gateway: &GatewayHandle) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while gateway.total_outstanding() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "outstanding counts never returned to zero"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn metrics(client: &HttpClient, gateway: &GatewayHandle) -> String {
    let request = http::Request::builder()
        .uri(format!("http://{}/metrics", gateway.metrics_addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_token_rate_gets_429_while_another_passes() {
    let gateway = gateway::start(config()).await.unwrap();
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());

    // B: 400 words of 16 bytes (6 799 bytes, estimated at 1 700 prompt tokens) + 8 completion
    // tokens. The mock counts one token per word, so usage says about 408 in all.
    let long_prompt = vec!["abcdefghijklmnop"; 400].join(" ");
    let estimate = 1_700 + 8;
    let response = post(&client, &gateway, "B", completion(&long_prompt, 8, false)).await;
    assert_eq!(response.status(), 200);
    let body = json(response).await;
    let used = body["usage"]["prompt_tokens"].as_u64().unwrap()
        + body["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(
        used < estimate - 1_000,
        "usage {used} vs estimate {estimate}"
    );
    wait_released(&gateway).await;
    let level = gateway.admission().token_level("B").unwrap();
    // Settled to usage: without the refund the level would be about BURST - estimate.
    assert!(
        level >= (BURST - used) as f64 && level <= BURST as f64,
        "level {level} after using {used}"
    );

    // B again: 9 901 tokens estimated, more than B has left; the wait is the shortfall at
    // 1 token/s.
    let big = completion("hi", 9_900, true);
    let refused = post(&client, &gateway, "B", big.clone()).await;
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let shortfall = 9_901 - (BURST - used);
    assert!(
        (1..=shortfall).contains(&retry_after),
        "Retry-After {retry_after}, shortfall {shortfall}"
    );
    let error = json(refused).await;
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"B\"") && message.contains("1 tokens/s"),
        "{message}"
    );

    // A has its own full bucket: the same request passes. The client leaves after the
    // headers; the stream is cut, and with no usage seen the estimate stays charged.
    let passed = post(&client, &gateway, "A", big).await;
    assert_eq!(passed.status(), 200);
    drop(passed);
    wait_released(&gateway).await;
    let level = gateway.admission().token_level("A").unwrap();
    assert!(level < 5_000.0, "A was charged its estimate: {level}");

    // C asks for more than any burst: a 400 naming max_tokens, and no bucket for C.
    let response = post(&client, &gateway, "C", completion("hi", 20_000, false)).await;
    assert_eq!(response.status(), 400);
    let error = json(response).await;
    assert_eq!(error["error"]["param"], "max_tokens");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token burst 10000"),
        "{error}"
    );
    assert_eq!(
        gateway.admission().tracked_token_buckets(),
        2,
        "A and B only"
    );

    let text = metrics(&client, &gateway).await;
    for reason in ["token_rate", "token_burst"] {
        let line = format!("prefixgate_admission_rejections_total{{reason=\"{reason}\"}} 1");
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
    assert_eq!(gateway.total_outstanding(), 0);
    assert_eq!(gateway.admission().tracked_tenants(), 0);
    gateway.shutdown().await;
}

/// A replica that is healthy but refuses every completion with 503 (as vLLM does while
/// overloaded), counting the completions it refused.
async fn refusing_replica(name: &str, refused: Arc<AtomicUsize>) -> gateway::config::BackendConfig {
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"object": "list", "data": [{"id": MODEL}]}))
            }),
        )
        .route(
            "/v1/completions",
            axum::routing::post(move || {
                let refused = Arc::clone(&refused);
                async move {
                    refused.fetch_add(1, Ordering::SeqCst);
                    (http::StatusCode::SERVICE_UNAVAILABLE, "overloaded")
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    gateway::config::BackendConfig {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        model: Some(MODEL.to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_replica_took_gets_its_tokens_back_once_whatever_the_retries() {
    let mut config = config();
    config.embedded.mock_engines = 0;
    let refused = Arc::new(AtomicUsize::new(0));
    for name in ["busy-1", "busy-2"] {
        config
            .backends
            .push(refusing_replica(name, Arc::clone(&refused)).await);
    }
    config.upstream.max_retries = 1;
    let gateway = gateway::start(config).await.unwrap();
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());

    // 9 001 of the 10 000 tokens: a second charge, or no refund, would leave under 1 000.
    let body = completion("hi", 9_000, false);
    for round in 1..=3 {
        let response = post(&client, &gateway, "B", body.clone()).await;
        assert_eq!(
            response.status(),
            503,
            "the last replica's answer passes through"
        );
        drop(response);
        assert_eq!(
            refused.load(Ordering::SeqCst),
            2 * round,
            "both replicas tried"
        );
        wait_released(&gateway).await;
        let level = gateway.admission().token_level("B");
        assert!(
            level.is_some_and(|l| l >= (BURST - 1) as f64),
            "refunded in full: {level:?}"
        );
    }
    gateway.shutdown().await;
}
