//! The `prefixgate` binary as an Envoy external processor, as the issue asks it: started
//! with `--mock-engines 2 --set ext_proc.listen=127.0.0.1:0`, it answers gRPC health
//! `SERVING`; a request stream driven by the stand-in Envoy filter goes to the replica the
//! HTTP listener picks for the same prompts (and the other way round: one router, one index);
//! and the outstanding counts (its `/metrics`) return to 0 after normal ends, a client that
//! leaves and a broken stream. The stand-in is the end-to-end tests' own
//! (`tests/src/envoy/`).

#![cfg(unix)]
#![expect(
    clippy::unwrap_used,
    reason = "the stand-in and this test's helpers run only in tests: a panic is a failed assertion"
)]

#[allow(
    dead_code,
    reason = "the stand-in serves the end-to-end tests too; this test uses part of it"
)]
#[path = "../../tests/src/envoy/mod.rs"]
mod envoy;
mod support;

use std::time::Duration;

use bytes::Bytes;
use envoy::{Envoy, FilterConfig, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::binary::{self, Running};

/// Bound on every wait in this test; generous for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

/// The binary in front of two embedded `fast` replicas, with its ext_proc listener in
/// `dialect`.
async fn run(dialect: &str) -> Running {
    let dialect = format!("ext_proc.dialect={dialect}");
    let args = [
        "--mock-engines",
        "2",
        "--set",
        "embedded.engine_profile=fast",
        "--set",
        "embedded.time_scale=10",
        "--set",
        "ext_proc.listen=127.0.0.1:0",
        "--set",
        &dialect,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    binary::start(&args, true).await
}

fn chat(family: &str, tail: usize) -> String {
    let prompt = format!(
        "{} question {tail}",
        format!("{family} shared context. ").repeat(30)
    );
    serde_json::json!({
        "model": "mock-model",
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "max_tokens": 8,
    })
    .to_string()
}

/// A chat completion through the HTTP listener; the replica that served it.
async fn via_http(running: &Running, body: String) -> String {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{}/v1/chat/completions", running.api))
        .header("content-type", "application/json")
        .header("routing-strategy", "prefix-cache")
        .body(Full::new(Bytes::from(body)))
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

/// The sum of `prefixgate_outstanding_requests` on the binary's `/metrics`.
async fn outstanding(running: &Running) -> f64 {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let uri = format!("http://{}/metrics", running.metrics);
    let response = client.get(uri.parse().unwrap()).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| l.starts_with("prefixgate_outstanding_requests{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn back_to_zero(running: &Running) {
    tokio::time::timeout(DEADLINE, async {
        while outstanding(running).await != 0.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("outstanding counts did not return to 0");
}

#[tokio::test]
async fn the_binary_serves_ext_proc_health_and_routes_as_its_http_listener_does() {
    for (dialect, filter) in [
        ("aibrix", FilterConfig::aibrix()),
        ("gie", FilterConfig::gie()),
    ] {
        let running = run(dialect).await;
        let envoy = Envoy::connect(
            running.ext_proc.as_deref().expect("its ext_proc listener"),
            filter.clone(),
        )
        .await;
        for service in [
            "",
            "envoy.service.ext_proc.v3.ExternalProcessor",
            "readiness",
        ] {
            assert_eq!(
                envoy.health(service).await.unwrap(),
                1,
                "{dialect}: {service:?}"
            );
        }
        for (family, http_first) in [("alpha", true), ("beta", false), ("gamma", true)] {
            let through_envoy = |body: String| {
                let envoy = &envoy;
                async move {
                    let request = Request::post("/v1/chat/completions", &body, 3)
                        .header("routing-strategy", "prefix-cache");
                    let reply = envoy.send(&request).await;
                    assert_eq!(reply.status, 200, "{dialect}: {}", reply.text());
                    reply.header("target-pod").unwrap().to_owned()
                }
            };
            let (first, second) = if http_first {
                let pod = via_http(&running, chat(family, 1)).await;
                (pod, through_envoy(chat(family, 2)).await)
            } else {
                let pod = through_envoy(chat(family, 1)).await;
                (pod, via_http(&running, chat(family, 2)).await)
            };
            assert_eq!(
                first, second,
                "{dialect}, family {family}: the same replica"
            );
        }
        back_to_zero(&running).await;
        // A client that leaves once its request is routed, and a connection that breaks.
        let request = Request::post("/v1/chat/completions", &chat("delta", 1), 1);
        let mut left = envoy.open().await;
        left.request(&request).await.unwrap();
        assert_eq!(outstanding(&running).await, 1.0);
        left.reset();
        back_to_zero(&running).await;
        let broken = Envoy::connect(
            running.ext_proc.as_deref().expect("its ext_proc listener"),
            filter,
        )
        .await;
        let mut stream = broken.open().await;
        stream.request(&request).await.unwrap();
        assert_eq!(outstanding(&running).await, 1.0);
        drop(stream);
        drop(broken);
        back_to_zero(&running).await;
    }
}
