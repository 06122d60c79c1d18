//! The runtime admin API on the metrics listener, end to end: list, add (models read from
//! the replica), drain (no new request, the one in flight finishes, then it leaves), remove,
//! the bearer token, and bad input answered with a clear OpenAI-shaped 4xx that changes
//! nothing. Replicas are mock engines on port 0.

#![expect(
    clippy::unwrap_used,
    reason = "the shared support helpers run only in tests: a panic is a failed assertion"
)]

mod support;

use bytes::Bytes;
use gateway::GatewayHandle;
use gateway::config::BackendConfig;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica};
use serde_json::{Value, json};
use support::{DEADLINE, HttpClient, http_client, loopback_config, metrics, wait_until};

const MODEL: &str = "m";

/// A mock engine whose steps take `step` engine seconds (0 for the `fast` profile).
async fn engine(name: &str, step: f64) -> ReplicaHandle {
    let mut profile = EngineProfile::builtin("fast").expect("builtin fast profile");
    profile.t0 = profile.t0.max(step);
    spawn_replica(ReplicaConfig {
        name: name.to_owned(),
        listen: "127.0.0.1:0".parse().expect("an address"),
        model: MODEL.to_owned(),
        profile,
        time_scale: 1.0,
        failures: FailurePlan::default(),
    })
    .await
    .expect("a mock engine")
}

async fn gateway_over(replicas: &[&ReplicaHandle], token: Option<&str>) -> GatewayHandle {
    let mut config = loopback_config();
    config.backends = replicas
        .iter()
        .map(|r| BackendConfig {
            name: r.name().to_owned(),
            url: r.url(),
            model: None,
            kv_events: None,
            kv_replay: None,
        })
        .collect();
    config.upstream.max_retries = 1;
    config.admin.token = token.map(str::to_owned);
    gateway::start(config).await.expect("gateway starts")
}

/// One admin call: its status and JSON body.
async fn call(
    client: &HttpClient,
    gateway: &GatewayHandle,
    method: Method,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", gateway.metrics_addr()))
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request");
    let response = tokio::time::timeout(DEADLINE, client.request(request))
        .await
        .expect("the admin API answers")
        .expect("a response");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)));
    (status, value)
}

async fn list(client: &HttpClient, gateway: &GatewayHandle) -> Vec<(String, String)> {
    let (status, body) = call(client, gateway, Method::GET, "/admin/replicas", "", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().expect(k).to_owned();
            (field("name"), field("state"))
        })
        .collect()
}

/// A streamed chat completion through the gateway; its `target-pod` and the body to read.
async fn stream_through(
    client: &HttpClient,
    gateway: &GatewayHandle,
    tokens: u32,
) -> (String, hyper::body::Incoming) {
    let body = json!({
        "model": MODEL, "stream": true, "max_tokens": tokens, "ignore_eos": true,
        "messages": [{"role": "user", "content": "hello"}],
    });
    let request = Request::post(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .header("routing-strategy", "least-request")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a request");
    let response = tokio::time::timeout(DEADLINE, client.request(request))
        .await
        .expect("the gateway answers")
        .expect("a response");
    assert_eq!(response.status(), StatusCode::OK);
    let pod = response.headers()["target-pod"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    (pod, response.into_body())
}

async fn read_all(body: hyper::body::Incoming) -> String {
    let bytes = tokio::time::timeout(DEADLINE, body.collect())
        .await
        .expect("the stream ends")
        .expect("a body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str, needle: &str) {
    assert_eq!(status, want, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    let message = error["message"].as_str().expect("a message");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert!(error["type"].is_string(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_add_drain_and_remove_change_routing_models_and_metrics() {
    // Both stream 150 tokens at 20 ms a step: b's request stays in flight while it drains,
    // and a's holds its count while the second request is routed.
    let a = engine("a", 0.02).await;
    let b = engine("b", 0.02).await;
    let gateway = gateway_over(&[&a], None).await;
    let client = http_client();
    assert_eq!(
        list(&client, &gateway).await,
        [("a".into(), "ready".into())]
    );

    let added = format!(r#"{{"name":"b","url":"{}"}}"#, b.url());
    let (status, body) = call(
        &client,
        &gateway,
        Method::POST,
        "/admin/replicas",
        &added,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["models"],
        json!([MODEL]),
        "models read from /v1/models"
    );
    assert_eq!(
        (body["origin"].as_str(), body["state"].as_str()),
        (Some("admin"), Some("ready"))
    );
    let text = metrics(&client, &gateway).await;
    assert!(
        text.contains(r#"prefixgate_replica_ready{pod="b"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"prefixgate_model_ready_replicas{model="m"} 2"#),
        "{text}"
    );

    // least-request spreads two concurrent streams over both; keep b's open.
    let (first, first_body) = stream_through(&client, &gateway, 150).await;
    let (second, second_body) = stream_through(&client, &gateway, 150).await;
    let mut pods = [first.clone(), second.clone()];
    pods.sort();
    assert_eq!(pods, ["a".to_owned(), "b".to_owned()]);
    let (on_b, on_a) = if first == "b" {
        (first_body, second_body)
    } else {
        (second_body, first_body)
    };
    let a_done = tokio::spawn(read_all(on_a));

    let (status, body) = call(
        &client,
        &gateway,
        Method::POST,
        "/admin/replicas/b/drain",
        "",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (body["state"].as_str(), body["outstanding"].as_u64()),
        (Some("draining"), Some(1))
    );
    // Draining: every new request goes to a, while b's stream keeps flowing.
    for _ in 0..3 {
        let (pod, body) = stream_through(&client, &gateway, 1).await;
        assert_eq!(pod, "a");
        read_all(body).await;
    }
    let rest = read_all(on_b).await;
    assert!(
        rest.contains("data: [DONE]"),
        "the draining replica's stream was cut"
    );
    assert!(!rest.contains("\"error\""), "{rest}");
    wait_until("the drained replica leaves the set", || {
        gateway.replicas().iter().all(|(name, _, _)| name != "b")
    })
    .await;
    assert_eq!(
        list(&client, &gateway).await,
        [("a".into(), "ready".into())]
    );
    let text = metrics(&client, &gateway).await;
    // Its gauges leave /metrics (its counters keep their history, as Prometheus expects).
    for gauge in [
        "prefixgate_outstanding_requests",
        "prefixgate_replica_ready",
    ] {
        let series = format!(r#"{gauge}{{pod="b"}}"#);
        assert!(!text.contains(&series), "{series} stayed:\n{text}");
    }
    let on_a = a_done.await.expect("joined");
    assert!(on_a.contains("data: [DONE]"), "{on_a}");

    // Removal: at once, and /v1/models follows the set.
    let (status, body) = call(
        &client,
        &gateway,
        Method::DELETE,
        "/admin/replicas/a",
        "",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "removed");
    assert!(list(&client, &gateway).await.is_empty());
    let models = models_listed(&client, &gateway).await;
    assert_eq!(models, json!([]), "no replica, no model");
    assert_eq!(gateway.total_outstanding(), 0);
    gateway.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

async fn models_listed(client: &HttpClient, gateway: &GatewayHandle) -> Value {
    let request = Request::get(format!("{}/v1/models", gateway.url()))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("a response");
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    Value::Array(
        body["data"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|m| m["id"].clone())
            .collect(),
    )
}

#[tokio::test]
async fn an_idle_replica_drains_at_once() {
    let a = engine("a", 0.0).await;
    let b = engine("b", 0.0).await;
    let gateway = gateway_over(&[&a, &b], None).await;
    let client = http_client();
    let (status, body) = call(
        &client,
        &gateway,
        Method::POST,
        "/admin/replicas/b/drain",
        "",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "removed");
    assert_eq!(
        list(&client, &gateway).await,
        [("a".into(), "ready".into())]
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_a_clear_4xx_and_changes_nothing() {
    let a = engine("a", 0.0).await;
    let gateway = gateway_over(&[&a], None).await;
    let client = http_client();
    let before = list(&client, &gateway).await;
    let post = |body: String| {
        let (client, gateway) = (&client, &gateway);
        async move {
            call(
                client,
                gateway,
                Method::POST,
                "/admin/replicas",
                &body,
                None,
            )
            .await
        }
    };
    let (s, b) = post(format!(r#"{{"name":"a","url":"{}"}}"#, a.url())).await;
    assert_error(
        s,
        &b,
        StatusCode::CONFLICT,
        "replica_exists",
        "`a` is already",
    );
    let (s, b) = post(r#"{"name":"c","url":"ftp://10.0.0.1:21"}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "only http://",
    );
    assert_eq!(b["error"]["param"], "url");
    let (s, b) = post(r#"{"name":"c","url":"http://10.0.0.1:8000/v1"}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "must not have a path",
    );
    let (s, b) = post(r#"{"name":"c","url":"not a url"}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "not a URL",
    );
    let (s, b) = post(r#"{"name":" ","url":"http://10.0.0.1:8000"}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "not empty",
    );
    assert_eq!(b["error"]["param"], "name");
    let (s, b) = post(r#"{"name":"c","url":"http://10.0.0.1:8000""#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "expected {\"name\"",
    );
    let (s, b) = post(r#"{"name":"c","url":"http://10.0.0.1:8000","weight":2}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "unknown field `weight`",
    );
    let (s, b) = post(r#"{"url":"http://10.0.0.1:8000"}"#.into()).await;
    assert_error(
        s,
        &b,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "missing field `name`",
    );
    for (method, path) in [
        (Method::POST, "/admin/replicas/ghost/drain"),
        (Method::DELETE, "/admin/replicas/ghost"),
        (Method::GET, "/admin/replicas/ghost"),
    ] {
        let (s, b) = call(&client, &gateway, method, path, "", None).await;
        assert_error(s, &b, StatusCode::NOT_FOUND, "replica_not_found", "`ghost`");
    }
    assert_eq!(list(&client, &gateway).await, before, "nothing changed");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_configured_token_guards_every_admin_call_and_the_api_port_has_none() {
    let a = engine("a", 0.0).await;
    let gateway = gateway_over(&[&a], Some("s3cret")).await;
    let client = http_client();
    for token in [None, Some("wrong"), Some("s3cret-longer")] {
        for (method, path) in [
            (Method::GET, "/admin/replicas"),
            (Method::POST, "/admin/replicas"),
            (Method::POST, "/admin/replicas/a/drain"),
            (Method::DELETE, "/admin/replicas/a"),
        ] {
            let (s, b) = call(&client, &gateway, method, path, "{}", token).await;
            assert_error(
                s,
                &b,
                StatusCode::UNAUTHORIZED,
                "invalid_admin_token",
                "Bearer",
            );
        }
    }
    let (status, body) = call(
        &client,
        &gateway,
        Method::GET,
        "/admin/replicas",
        "",
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(1));
    // The API listener does not serve the admin API at all.
    let request = Request::get(format!("{}/admin/replicas", gateway.url()))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("a response");
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    gateway.shutdown().await;
}
