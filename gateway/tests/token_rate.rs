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

use bytes::Bytes;
use gateway::{GatewayConfig, GatewayHandle};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

mod support;

use support::{
    DEADLINE, HttpClient, MOCK_MODEL, embedded_config, http_client, metrics, serve_replica,
    wait_released,
};

const BURST: u64 = 10_000;

/// One embedded mock engine; every tenant's bucket holds [`BURST`] tokens, refilled at 1/s.
fn config() -> GatewayConfig {
    let mut config = embedded_config(1);
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
        "model": MOCK_MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_token_rate_gets_429_while_another_passes() {
    let gateway = gateway::start(config()).await.unwrap();
    let client = http_client();

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
    let endpoints = axum::Router::new().route(
        "/v1/completions",
        axum::routing::post(move || {
            let refused = Arc::clone(&refused);
            async move {
                refused.fetch_add(1, Ordering::SeqCst);
                (http::StatusCode::SERVICE_UNAVAILABLE, "overloaded")
            }
        }),
    );
    serve_replica(name, MOCK_MODEL, endpoints).await
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
    let client = http_client();

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
        // No bucket means a full one: the gateway's periodic sweep forgets a bucket once it
        // is full and no response holds it, which a full refund can make it at any moment.
        // Without the refund the bucket would be held at under 1 000 tokens, never dropped.
        let level = gateway.admission().token_level("B");
        assert!(
            level.is_none_or(|l| l >= (BURST - 1) as f64),
            "refunded in full: {level:?}"
        );
    }
    gateway.shutdown().await;
}
