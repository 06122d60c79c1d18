//! End-to-end routing: requests through a real gateway to real upstreams on loopback, for
//! each policy, with the routing headers, byte-for-byte forwarding, the models list, and the
//! `aibrix_prefix_cache_*` counters as seen on `/metrics`.

use prefixgate_tests::{
    Client, MOCK_MODEL, MODEL, assert_ends_with_done, chat_body, chat_body_for,
    gateway_with_one_upstream, gateway_with_two_upstreams, mock_gateway_config, sample_value,
    shutdown_once_released, wait_outstanding_zero, wait_until,
};

#[tokio::test]
async fn every_policy_routes_streaming_and_plain_requests() {
    let (a, b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let strategies = [
        "random",
        "least-request",
        "prefix-cache",
        "prefix-load",
        "session-affinity",
    ];
    for strategy in strategies {
        for stream in [false, true] {
            let answer = client
                .chat(
                    &gateway,
                    &[("routing-strategy", strategy)],
                    chat_body("hello there", stream),
                )
                .await;
            assert_eq!(
                answer.status,
                200,
                "{strategy} stream={stream}: {}",
                answer.text()
            );
            assert_eq!(answer.header("routing-strategy"), Some(strategy));
            let pod = answer.header("target-pod").unwrap();
            let expected_ip = if pod == "a" { a.addr } else { b.addr };
            assert_eq!(
                answer.header("target-pod-ip"),
                Some(expected_ip.to_string().as_str())
            );
            assert!(answer.header("request-id").is_some());
            assert!(answer.header("x-prefixgate-outstanding").is_some());
            if stream {
                assert_ends_with_done(&answer);
                assert_eq!(answer.header("content-type"), Some("text/event-stream"));
            } else {
                assert_eq!(answer.json()["choices"][0]["message"]["content"], "hi");
            }
        }
    }
    assert_eq!(a.requests() + b.requests(), 10);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn bodies_are_forwarded_byte_for_byte_with_the_request_id() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    // Odd spacing, key order and escapes that a re-serialisation would change.
    let body = format!(
        "{{ \"stream\":false,  \"model\" : \"{MODEL}\", \"messages\":[{{\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"q\\\"\"}}], \"x\": 1.50 }}"
    );
    let answer = client
        .chat(&gateway, &[("x-request-id", "req-42")], body.clone())
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("request-id"), Some("req-42"));
    assert_eq!(
        a.seen.bodies.lock().unwrap().last().unwrap(),
        body.as_bytes()
    );
    assert_eq!(a.seen.request_ids.lock().unwrap().last().unwrap(), "req-42");

    // Without one, the gateway makes an id and sends the same one upstream.
    let answer = client
        .post(
            &gateway,
            "/v1/completions",
            &[],
            format!("{{\"model\":\"{MODEL}\",\"prompt\":\"p\"}}"),
        )
        .await;
    assert_eq!(answer.status, 200);
    let id = answer.header("request-id").unwrap().to_owned();
    assert_eq!(id.len(), 36);
    assert_eq!(a.seen.request_ids.lock().unwrap().last().unwrap(), &id);
    gateway.shutdown().await;
}

#[tokio::test]
async fn embeddings_models_health_and_ready() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let answer = client
        .post(
            &gateway,
            "/v1/embeddings",
            &[("routing-strategy", "prefix-cache")],
            format!("{{\"model\":\"{MODEL}\",\"input\":\"x\"}}"),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("routing-strategy"), Some("least-request"));

    let models = client.get(&gateway, "/v1/models").await;
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], MODEL);
    assert_eq!(
        models.json()["data"].as_array().unwrap().len(),
        1,
        "a union, not a list per replica"
    );
    let health = client.get(&gateway, "/health").await;
    assert_eq!(health.status, 200);
    let ready = client.get(&gateway, "/ready").await;
    assert_eq!(ready.status, 200);
    gateway.shutdown().await;
}

#[tokio::test]
async fn least_request_spreads_concurrent_streams() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    // Two slow streams held open at once must land on different pods.
    let stall = [("x-fake", "stall:1")];
    let first = client
        .chat_stream(&gateway, &stall, chat_body("one", true))
        .await;
    let second = client
        .chat_stream(&gateway, &stall, chat_body("two", true))
        .await;
    let pods = [&first, &second].map(|r| r.headers()["target-pod"].to_str().unwrap().to_owned());
    assert_ne!(pods[0], pods[1]);
    assert_eq!(second.headers()["x-prefixgate-outstanding"], "0");
    assert_eq!(gateway.total_outstanding(), 2);
    drop((first, second));
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn prefix_cache_sticks_to_the_owner_and_moves_aibrix_counters() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let before = client.metrics(&gateway).await;
    let family = "shared system prompt ".repeat(40);
    let prefix = [("routing-strategy", "prefix-cache")];

    let first = client
        .chat(&gateway, &prefix, chat_body(&family, false))
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-prefixgate-match-percent"), Some("0"));
    let owner = first.header("target-pod").unwrap().to_owned();
    for _ in 0..3 {
        let again = client
            .chat(&gateway, &prefix, chat_body(&family, false))
            .await;
        assert_eq!(
            again.header("target-pod"),
            Some(owner.as_str()),
            "same prompt, same pod"
        );
        assert_eq!(again.header("x-prefixgate-match-percent"), Some("100"));
    }
    // least-request decisions do not move the AIBrix counters.
    client
        .chat(
            &gateway,
            &[("routing-strategy", "least-request")],
            chat_body(&family, false),
        )
        .await;

    let after = client.metrics(&gateway).await;
    let delta = |name: &str| sample_value(&after, name) - sample_value(&before, name);
    let labels = |extra: &str| format!("{{{extra}model=\"{MODEL}\",using_kv_sync=\"false\"}}");
    assert_eq!(
        delta(&format!(
            "aibrix_prefix_cache_routing_decisions_total{}",
            labels("match_percent_bucket=\"0\",")
        )),
        1.0,
        "{after}"
    );
    assert_eq!(
        delta(&format!(
            "aibrix_prefix_cache_routing_decisions_total{}",
            labels("match_percent_bucket=\"76-100\",")
        )),
        3.0
    );
    assert_eq!(
        delta(&format!(
            "aibrix_prefix_cache_routing_selection_total{{model=\"{MODEL}\",selection=\"least_request_fallback\",using_kv_sync=\"false\"}}"
        )),
        1.0
    );
    assert_eq!(
        delta(&format!(
            "aibrix_prefix_cache_routing_selection_total{{model=\"{MODEL}\",selection=\"prefix_match\",using_kv_sync=\"false\"}}"
        )),
        3.0
    );
    assert_eq!(
        delta(&format!(
            "aibrix_prefix_cache_routing_latency_seconds_count{}",
            labels("")
        )),
        4.0
    );
    assert!(
        after.contains("aibrix_prefix_cache_indexer_status{indexer_type=\"local\",model=\"\"} 1")
    );
    assert_eq!(
        delta(&format!(
            "prefixgate_requests_total{{code=\"200\",model=\"{MODEL}\",pod=\"{owner}\"}}"
        )) as usize
            + delta(&format!(
                "prefixgate_requests_total{{code=\"200\",model=\"{MODEL}\",pod=\"{}\"}}",
                if owner == "a" { "b" } else { "a" }
            )) as usize,
        5
    );
    assert!(after.contains("prefixgate_upstream_ttft_seconds_bucket"));
    assert!(after.contains("prefixgate_outstanding_requests{pod=\"a\"} 0"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn prefix_cache_spreads_different_families_by_load() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    // Two families held open at once: the second finds the first's owner busier and no
    // match of its own, so least-request fallback sends it to the other pod.
    let mut held = Vec::new();
    for family in ["alpha ", "beta "] {
        let response = client
            .chat_stream(
                &gateway,
                &[("routing-strategy", "prefix-cache"), ("x-fake", "stall:1")],
                chat_body(&family.repeat(60), true),
            )
            .await;
        held.push(response);
    }
    let pods: Vec<&str> = held
        .iter()
        .map(|r| r.headers()["target-pod"].to_str().unwrap())
        .collect();
    assert_ne!(pods[0], pods[1], "a new family goes to the idle pod");
    drop(held);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn mock_engines_serve_streams_through_every_policy() {
    let gateway = gateway::start(mock_gateway_config(2)).await.unwrap();
    let client = Client::new();
    let models = client.get(&gateway, "/v1/models").await;
    assert_eq!(models.json()["data"][0]["id"], MOCK_MODEL);
    let family = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let mut owners = Vec::new();
    for strategy in [
        "random",
        "least-request",
        "prefix-cache",
        "prefix-cache",
        "prefix-load",
    ] {
        let answer = client
            .chat(
                &gateway,
                &[("routing-strategy", strategy)],
                chat_body_for(MOCK_MODEL, &family, true),
            )
            .await;
        assert_eq!(answer.status, 200, "{strategy}: {}", answer.text());
        let pod = answer.header("target-pod").unwrap().to_owned();
        assert!(pod == "mock-0" || pod == "mock-1", "{pod}");
        assert_ends_with_done(&answer);
        if strategy == "prefix-cache" {
            owners.push(pod);
        }
    }
    assert_eq!(
        owners[0], owners[1],
        "the second prefix-cache request follows the first"
    );
    let whole = client
        .chat(&gateway, &[], chat_body_for(MOCK_MODEL, "hi", false))
        .await;
    assert_eq!(whole.status, 200);
    assert_eq!(whole.json()["object"], "chat.completion");
    wait_outstanding_zero(&gateway).await;
    // The engine scrape fills the load view from each replica's vllm:* gauges.
    wait_until("engine stats from every replica", || {
        gateway
            .engine_stats()
            .iter()
            .all(|(_, stats)| stats.is_some())
    })
    .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_single_ready_replica_moves_no_prefix_cache_counter() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let prompt = "long enough to fill several blocks ".repeat(20);
    for _ in 0..2 {
        let answer = client
            .chat(
                &gateway,
                &[("routing-strategy", "prefix-cache")],
                chat_body(&prompt, false),
            )
            .await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("target-pod"), Some("a"));
        assert_eq!(
            answer.header("x-prefixgate-match-percent"),
            None,
            "no index consulted"
        );
    }
    let metrics = client.metrics(&gateway).await;
    assert!(
        !metrics.contains("aibrix_prefix_cache_routing_decisions_total{"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("aibrix_prefix_cache_routing_latency_seconds_count{"),
        "{metrics}"
    );
    assert_eq!(
        sample_value(
            &metrics,
            &format!("prefixgate_requests_total{{code=\"200\",model=\"{MODEL}\",pod=\"a\"}}")
        ),
        2.0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn completions_take_batched_and_token_id_prompts_routed_by_their_values() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let prefix = [("routing-strategy", "prefix-cache")];
    let ids: Vec<String> = (1000..1400).map(|id: u32| id.to_string()).collect();
    let tokens = format!(r#"{{"model":"{MODEL}","prompt":[{}]}}"#, ids.join(","));
    let first = client
        .post(&gateway, "/v1/completions", &prefix, tokens.clone())
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-prefixgate-match-percent"), Some("0"));
    let owner = first.header("target-pod").unwrap().to_owned();
    // The same ids again, as a batch's first prompt: routed by their values to the owner.
    let batch = format!(
        r#"{{"model":"{MODEL}","prompt":[[{}],[7]]}}"#,
        ids.join(",")
    );
    let again = client
        .post(&gateway, "/v1/completions", &prefix, batch)
        .await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("target-pod"), Some(owner.as_str()));
    assert_eq!(again.header("x-prefixgate-match-percent"), Some("100"));
    let texts = format!(
        r#"{{"model":"{MODEL}","prompt":["{}","other"]}}"#,
        "a shared prompt ".repeat(40)
    );
    let answer = client
        .post(&gateway, "/v1/completions", &prefix, texts)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    shutdown_once_released(gateway).await;
}

/// The pod a chat request with `headers` went to (its `target-pod-ip`), after checking that
/// the answer's `x-session-id` names that pod.
async fn session_routed(
    client: &Client,
    gateway: &gateway::GatewayHandle,
    headers: &[(&str, &str)],
) -> String {
    use router_core::policy::session_affinity::session_id;
    let answer = client
        .chat(gateway, headers, chat_body("a session's turn", false))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let at = answer.header("target-pod-ip").unwrap().to_owned();
    let id = answer.header("x-session-id").expect("x-session-id is set");
    assert_eq!(session_id::decode(id.as_bytes()), Some(at.clone()));
    at
}

#[tokio::test]
async fn session_affinity_keeps_a_key_on_its_pod_until_the_pod_is_drained() {
    use router_core::policy::session_affinity::session_id;
    let (a, b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let strategy = ("routing-strategy", "session-affinity");
    let keyed = [
        strategy,
        ("x-aibrix-session-key", "user-1234/conversation-9"),
    ];
    let home = session_routed(&client, &gateway, &keyed).await;
    for _ in 0..5 {
        assert_eq!(session_routed(&client, &gateway, &keyed).await, home);
    }
    // The gateway's own x-session-id round-trips: sent back, it names the pod it named.
    let (a_at, b_at) = (a.addr.to_string(), b.addr.to_string());
    let away = if home == a_at { &b_at } else { &a_at };
    let id = session_id::encode(away);
    let named = [strategy, ("x-session-id", id.as_str())];
    assert_eq!(session_routed(&client, &gateway, &named).await, *away);
    // Drained, the key's pod takes nothing more: the key moves, and an x-session-id naming
    // the drained pod is ignored (a new one is issued for where it went).
    let name = if home == a_at { "a" } else { "b" };
    let url = format!(
        "http://{}/admin/replicas/{name}/drain",
        gateway.metrics_addr()
    );
    let drained = client.call("POST", &url, &[], "").await;
    assert!(drained.status.is_success(), "{}", drained.text());
    assert_eq!(session_routed(&client, &gateway, &keyed).await, *away);
    let stale_id = session_id::encode(&home);
    let stale = [strategy, ("x-session-id", stale_id.as_str())];
    assert_eq!(session_routed(&client, &gateway, &stale).await, *away);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn prefix_load_issues_x_session_id_and_prefix_cache_does_not() {
    let (_a, _b, gateway) = gateway_with_two_upstreams().await;
    let client = Client::new();
    let at = session_routed(&client, &gateway, &[("routing-strategy", "prefix-load")]).await;
    assert!(!at.is_empty());
    let answer = client
        .chat(
            &gateway,
            &[("routing-strategy", "prefix-cache")],
            chat_body("hello", false),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-session-id"),
        None,
        "AIBrix's prefix-cache sets none"
    );
    shutdown_once_released(gateway).await;
}
