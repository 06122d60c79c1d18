//! End-to-end failures: every error of SPEC §3.1 with its status and OpenAI shape, retries on
//! refused replicas, timeouts, health ejection and re-admission; and outstanding counts back
//! to zero after a mix of all of them running at once.

use http_body_util::BodyExt;
use prefixgate_tests::{
    Answer, Client, FakeUpstream, MODEL, chat_body, chat_body_for, gateway_config,
    gateway_with_one_upstream, gateway_with_two_upstreams, sample_value, shutdown_once_released,
    wait_outstanding_zero, wait_until,
};

/// A loopback address nothing listens on (bound, then released).
async fn refused_backend(name: &str) -> gateway::config::BackendConfig {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    gateway::config::BackendConfig {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        model: Some(MODEL.to_owned()),
        kv_events: None,
        kv_replay: None,
    }
}

fn assert_openai_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{}", answer.text());
    let body = answer.json();
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(error["type"].as_str().is_some(), "{body}");
    assert!(error.get("param").is_some(), "{body}");
    assert!(answer.header("request-id").is_some());
}

#[tokio::test]
async fn client_errors_are_openai_shaped() {
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend()]);
    config.max_body_bytes = 1024;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();

    let answer = client.chat(&gateway, &[], "{not json").await;
    assert_openai_error(&answer, 400, "invalid_json");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");

    let answer = client.chat(&gateway, &[], r#"{"messages":[]}"#).await;
    assert_openai_error(&answer, 400, "missing_model");
    assert_eq!(answer.json()["error"]["param"], "model");

    // AIBrix's 400 for a chat body without messages, before the model is looked up.
    for body in [r#"{"model":"nope","messages":[]}"#, r#"{"model":"nope"}"#] {
        let answer = client.chat(&gateway, &[], body).await;
        assert_openai_error(&answer, 400, "no_messages");
        assert_eq!(answer.json()["error"]["param"], "messages");
        assert_eq!(
            answer.json()["error"]["message"],
            "no messages in the request body"
        );
    }

    let answer = client
        .chat(&gateway, &[], chat_body_for("nope", "hi", false))
        .await;
    assert_openai_error(&answer, 404, "model_not_found");

    let answer = client
        .chat(
            &gateway,
            &[("routing-strategy", "fastest")],
            chat_body("x", false),
        )
        .await;
    assert_openai_error(&answer, 400, "invalid_routing_strategy");

    let answer = client
        .chat(&gateway, &[], chat_body(&"x".repeat(2048), false))
        .await;
    assert_openai_error(&answer, 413, "body_too_large");

    let answer = client
        .post(
            &gateway,
            "/v1/completions",
            &[],
            format!(r#"{{"model":"{MODEL}","prompt":[1,"a"]}}"#),
        )
        .await;
    assert_eq!(answer.status, 400, "{}", answer.text());

    let answer = client.get(&gateway, "/v2/nothing").await;
    assert_openai_error(&answer, 404, "unknown_path");

    assert_eq!(a.requests(), 0, "no client error reached the replica");
    let metrics = client.metrics(&gateway).await;
    assert_eq!(
        sample_value(
            &metrics,
            r#"prefixgate_requests_total{code="404",model="nope",pod=""}"#
        ),
        1.0,
        "{metrics}"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_refused_replica_is_retried_on_another() {
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend(), refused_backend("dead").await]);
    config.health.interval_ms = 60_000; // only the request path notices the dead replica
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    // Hold a stream on `a` so least-request prefers the dead replica first.
    let held = client
        .chat_stream(&gateway, &[("x-fake", "stall:1")], chat_body("hold", true))
        .await;
    assert_eq!(held.headers()["target-pod"], "a");
    let before = client.metrics(&gateway).await;
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("target-pod"), Some("a"));
    let metrics = client.metrics(&gateway).await;
    let retries = r#"prefixgate_upstream_retries_total{pod="dead"}"#;
    assert_eq!(
        sample_value(&metrics, retries) - sample_value(&before, retries),
        1.0
    );
    drop(held);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_refused_replica_is_not_left_holding_the_prompt_in_the_index() {
    let (a, b) = (
        FakeUpstream::start("a").await,
        FakeUpstream::start("b").await,
    );
    let backends = vec![a.backend(), b.backend(), refused_backend("dead").await];
    let mut config = gateway_config(backends);
    config.health.interval_ms = 60_000; // only the request path notices the dead replica
    // The holds below may meet the dead replica first too: it must stay a candidate.
    config.health.eject_after_failures = 100;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    // Hold a stream on `a` and one on `b`, so the decision (no match yet: least-request
    // fallback) goes to the dead replica first; the retry then chooses between `a` and `b`
    // (two pods: a decision that records the prompt, not the single-pod short-circuit).
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            client
                .chat_stream(&gateway, &[("x-fake", "stall:1")], chat_body("hold", true))
                .await,
        );
    }
    let holders: Vec<_> = held.iter().map(|h| &h.headers()["target-pod"]).collect();
    assert!(holders.contains(&&"a".parse().unwrap()) && holders.contains(&&"b".parse().unwrap()));
    // (A hold may itself have met the dead replica first and been retried: count from here.)
    let before = client.metrics(&gateway).await;
    // Four full 128-byte blocks of prompt.
    let prompt = "the prompt both attempts route ".repeat(20);
    let answer = client
        .chat(
            &gateway,
            &[("routing-strategy", "prefix-cache")],
            chat_body(&prompt, false),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let chosen = answer.header("target-pod").unwrap().to_owned();
    assert_ne!(chosen, "dead");
    let url = format!("http://{}/admin/replicas", gateway.metrics_addr());
    let replicas = client.call("GET", &url, &[], "").await.json();
    let cached = |name: &str| {
        replicas
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["cached_blocks"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(cached("dead"), 0, "{replicas}");
    assert!(cached(&chosen) >= 4, "{replicas}");
    let metrics = client.metrics(&gateway).await;
    let retries = r#"prefixgate_upstream_retries_total{pod="dead"}"#;
    assert_eq!(
        sample_value(&metrics, retries) - sample_value(&before, retries),
        1.0,
        "the dead replica was tried first"
    );
    drop(held);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn all_replicas_refused_is_a_502_and_ejects_them() {
    let mut config = gateway_config(vec![refused_backend("x").await, refused_backend("y").await]);
    config.health.interval_ms = 60_000;
    config.health.eject_after_failures = 2;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    // The start-up probe counted one failure each; this request adds the second.
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_openai_error(&answer, 502, "upstream_unavailable");
    assert_eq!(answer.json()["error"]["type"], "api_error");
    // Each attempt's failure is listed, not only the last one's.
    let message = answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("2 attempt(s)"), "{message}");
    for pod in ["x: ", "y: "] {
        assert!(message.contains(pod), "{pod} missing: {message}");
    }
    // Both are now ejected: no ready replica.
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_openai_error(&answer, 503, "service_unavailable");
    let ready = client.get(&gateway, "/ready").await;
    assert_eq!(ready.status, 503);
    assert_eq!(gateway.total_outstanding(), 0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_dead_backend_with_no_known_model_is_a_503_and_not_ready() {
    // A static backend without `model`, down when the gateway starts: nothing says which
    // models it serves, so the model is not "not found" (404, which clients do not retry).
    let cold = gateway::config::BackendConfig {
        model: None,
        kv_events: None,
        kv_replay: None,
        ..refused_backend("cold").await
    };
    let mut config = gateway_config(vec![cold]);
    config.health.interval_ms = 60_000;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_openai_error(&answer, 503, "service_unavailable");
    let ready = client.get(&gateway, "/ready").await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_replica_503_passes_through_when_no_other_is_left() {
    let (a, b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let answer = client
        .chat(&gateway, &[("x-fake", "status:503")], chat_body("x", false))
        .await;
    assert_eq!(answer.status, 503);
    assert_eq!(a.requests() + b.requests(), 2, "both replicas were tried");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_silent_replica_is_a_504_and_is_cancelled() {
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend()]);
    config.upstream.first_byte_timeout_ms = 200;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    let answer = client
        .chat(&gateway, &[("x-fake", "hang")], chat_body("x", false))
        .await;
    assert_openai_error(&answer, 504, "upstream_timeout");
    assert_eq!(a.requests(), 1, "a timeout is not retried");
    // The replica that timed out is named and counted, as a routed answer's would be.
    assert_eq!(answer.header("target-pod"), Some("a"));
    let metrics = client.metrics(&gateway).await;
    assert_eq!(
        sample_value(
            &metrics,
            &format!(r#"prefixgate_requests_total{{code="504",model="{MODEL}",pod="a"}}"#)
        ),
        1.0,
        "{metrics}"
    );
    wait_outstanding_zero(&gateway).await;
    wait_until("the hung upstream request to be cancelled", || {
        a.in_flight() == 0
    })
    .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn unhealthy_replicas_are_ejected_and_readmitted() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    a.set_healthy(false);
    wait_until("ejection", || !gateway.replicas()[0].2).await;
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_openai_error(&answer, 503, "service_unavailable");
    a.set_healthy(true);
    wait_until("re-admission", || gateway.replicas()[0].2).await;
    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_eq!(answer.status, 200);
    let metrics = client.metrics(&gateway).await;
    assert_eq!(
        sample_value(&metrics, r#"prefixgate_replica_ejections_total{pod="a"}"#),
        1.0
    );
    assert_eq!(
        sample_value(
            &metrics,
            r#"prefixgate_replica_readmissions_total{pod="a"}"#
        ),
        1.0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn outstanding_returns_to_zero_after_a_mix_of_everything() {
    let a = FakeUpstream::start("a").await;
    let b = FakeUpstream::start("b").await;
    let mut config = gateway_config(vec![
        a.backend(),
        b.backend(),
        refused_backend("dead").await,
    ]);
    config.upstream.first_byte_timeout_ms = 300;
    config.upstream.idle_timeout_ms = 300;
    config.health.interval_ms = 60_000;
    let gateway = gateway::start(config).await.unwrap();
    let url = format!("{}/v1/chat/completions", gateway.url());
    let modes: [&'static str; 7] = [
        "sse:5:10",
        "json",
        "drop:2:20",
        "hang",
        "stall:1",
        "status:500",
        "sse:200:20",
    ];
    let mut tasks = Vec::new();
    for round in 0..4 {
        for (i, mode) in modes.into_iter().enumerate() {
            let client = Client::new();
            let url = url.clone();
            let strategy = ["random", "least-request", "prefix-cache"][(round + i) % 3];
            tasks.push(tokio::spawn(async move {
                let response = client
                    .send(
                        "POST",
                        &url,
                        &[
                            ("content-type", "application/json"),
                            ("x-fake", mode),
                            ("routing-strategy", strategy),
                        ],
                        chat_body(
                            &format!("family {i} "),
                            mode.starts_with("sse")
                                || mode.starts_with("drop")
                                || mode.starts_with("stall"),
                        ),
                    )
                    .await;
                let mut body = response.into_body();
                if mode == "sse:200:20" {
                    // A client that leaves after the first chunk.
                    let _ = body.frame().await;
                    return;
                }
                let _ = body.collect().await;
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    wait_outstanding_zero(&gateway).await;
    wait_until("every upstream request to end", || {
        a.in_flight() + b.in_flight() == 0
    })
    .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn start_refuses_a_gateway_without_replicas() {
    let error = gateway::start(gateway_config(Vec::new()))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("--backend"), "{error}");
}

#[tokio::test]
async fn start_names_an_address_in_use() {
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend()]);
    config.listen = taken.local_addr().unwrap();
    let error = gateway::start(config).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&taken.local_addr().unwrap().to_string()),
        "{error}"
    );
}

#[tokio::test]
async fn api_keys_and_tenant_caps_are_enforced_until_responses_end() {
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend()]);
    config.admission.api_keys = vec!["k-123".to_owned()];
    config.admission.tenant_max_in_flight = 1;
    config.admission.retry_after_secs = 7;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();

    let answer = client.chat(&gateway, &[], chat_body("x", false)).await;
    assert_openai_error(&answer, 401, "invalid_api_key");
    assert_eq!(answer.json()["error"]["type"], "authentication_error");
    let wrong = [("authorization", "Bearer k-12")];
    assert_eq!(
        client
            .chat(&gateway, &wrong, chat_body("x", false))
            .await
            .status,
        401
    );
    let models = client.get(&gateway, "/v1/models").await;
    assert_eq!(models.status, 401, "the models list needs a key too");

    let key = ("authorization", "Bearer k-123");
    let held = client
        .chat_stream(
            &gateway,
            &[key, ("x-tenant", "B"), ("x-fake", "stall:1")],
            chat_body("hold", true),
        )
        .await;
    assert_eq!(held.status(), 200);
    let answer = client
        .chat(&gateway, &[key, ("x-tenant", "B")], chat_body("x", false))
        .await;
    assert_openai_error(&answer, 429, "rate_limit_exceeded");
    assert_eq!(answer.header("retry-after"), Some("7"));
    assert_eq!(answer.json()["error"]["type"], "rate_limit_error");
    let other = client
        .chat(&gateway, &[key, ("x-tenant", "A")], chat_body("x", false))
        .await;
    assert_eq!(other.status, 200, "another tenant is not affected");
    assert_eq!(
        a.requests(),
        2,
        "the refused request never reached a replica"
    );

    // The held stream ends when its client leaves; tenant B is admitted again.
    drop(held);
    wait_outstanding_zero(&gateway).await;
    let again = client
        .chat(&gateway, &[key, ("x-tenant", "B")], chat_body("x", false))
        .await;
    assert_eq!(again.status, 200, "{}", again.text());
    let metrics = client.metrics(&gateway).await;
    assert_eq!(
        sample_value(
            &metrics,
            r#"prefixgate_admission_rejections_total{reason="tenant_in_flight"}"#
        ),
        1.0
    );
    assert_eq!(
        sample_value(
            &metrics,
            r#"prefixgate_admission_rejections_total{reason="unauthorized"}"#
        ),
        2.0
    );
    gateway.shutdown().await;
}
