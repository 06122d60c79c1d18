//! The ext_proc listener (`ext_proc.listen`) driven as Envoy drives it: gateways with two
//! embedded mock engines, and the stand-in Envoy filter of `prefixgate_tests::envoy`, which
//! sends each processing mode's messages in Envoy's order, applies the answers as Envoy
//! does, forwards the request to the replica Envoy's ORIGINAL_DST cluster would, and takes
//! the replica's answer back through the filter. Covered: both dialects and every body mode
//! (buffered, streamed with and without a mode override, full duplex with and without
//! trailers, none), the subset hint, the refusals' shapes, admission, the same decisions as
//! the HTTP listener, the `aibrix_prefix_cache_*` counters, gRPC health, and outstanding
//! counts back at zero after normal ends, clients that leave, an Envoy that goes away and a
//! shutdown's cut.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use gateway::config::{Dialect, GatewayConfig};
use gateway::{GatewayHandle, start};
use prefixgate_tests::envoy::{Envoy, FilterConfig, Request};
use prefixgate_tests::{
    CHAT_PATH, Client, MOCK_MODEL, chat_body_for, mock_gateway_config, sample_value, wait_until,
};

/// A prompt long enough to fill several 128-byte prefix blocks, one per family.
fn prompt(family: &str, tail: usize) -> String {
    format!(
        "{} question {tail}",
        format!("{family} shared context. ").repeat(30)
    )
}

fn chat(family: &str, tail: usize, stream: bool) -> String {
    chat_body_for(MOCK_MODEL, &prompt(family, tail), stream)
}

fn config(dialect: Dialect) -> GatewayConfig {
    let mut config = mock_gateway_config(2);
    config.ext_proc.listen = Some("127.0.0.1:0".parse().unwrap());
    config.ext_proc.dialect = dialect;
    config
}

async fn started(config: GatewayConfig, filter: FilterConfig) -> (GatewayHandle, Envoy) {
    let gateway = start(config).await.unwrap();
    let addr = gateway.ext_proc_addr().unwrap().to_string();
    let envoy = Envoy::connect(&addr, filter).await;
    (gateway, envoy)
}

/// The replica named `name`'s `ip:port`.
fn authority(gateway: &GatewayHandle, name: &str) -> String {
    gateway
        .replicas()
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, authority, _)| authority)
        .unwrap()
}

/// The name of the replica at `ip:port`.
fn name_at(gateway: &GatewayHandle, at: &str) -> String {
    gateway
        .replicas()
        .into_iter()
        .find(|(_, authority, _)| authority == at)
        .map(|(name, _, _)| name)
        .unwrap()
}

async fn released(gateway: &GatewayHandle) {
    wait_until("outstanding counts and admission back to zero", || {
        gateway.total_outstanding() == 0 && gateway.admission().in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn aibrix_buffered_request_streamed_response_is_routed_by_target_pod_and_released() {
    let (gateway, envoy) = started(config(Dialect::Aibrix), FilterConfig::aibrix()).await;
    let request = Request::post(CHAT_PATH, &chat("alpha", 1, true), 3)
        .header("routing-strategy", "prefix-cache");
    let reply = envoy.send(&request).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(!reply.local);
    let upstream = reply.upstream.clone().unwrap();
    let forwarded = reply.forwarded.as_ref().unwrap();
    assert_eq!(forwarded.headers["target-pod"], upstream.as_str());
    assert_eq!(forwarded.headers["routing-strategy"], "prefix-cache");
    assert_eq!(forwarded.headers["x-request-id"], "envoy-request-id-1");
    assert_eq!(forwarded.headers["x-went-into-req-headers"], "true");
    assert!(forwarded.cleared_route, "the route is chosen again");
    assert_eq!(&forwarded.body[..], chat("alpha", 1, true).as_bytes());
    // AIBrix's response headers: the pod's name, its address, the strategy, the id.
    let pod = name_at(&gateway, &upstream);
    assert_eq!(reply.header("target-pod"), Some(pod.as_str()));
    assert_eq!(reply.header("target-pod-ip"), Some(upstream.as_str()));
    assert_eq!(reply.header("routing-strategy"), Some("prefix-cache"));
    assert_eq!(reply.header("request-id"), Some("envoy-request-id-1"));
    assert_eq!(reply.header("x-prefixgate-outstanding"), Some("0"));
    assert_eq!(reply.header("x-went-into-req-headers"), Some("true"));
    assert!(
        reply.text().trim_end().ends_with("data: [DONE]"),
        "{}",
        reply.text()
    );
    released(&gateway).await;
    let metrics = Client::new().metrics(&gateway).await;
    let labels = format!("{{code=\"200\",model=\"{MOCK_MODEL}\",pod=\"{pod}\"}}");
    assert_eq!(
        sample_value(&metrics, &format!("prefixgate_requests_total{labels}")),
        1.0
    );
    let decisions = format!(
        "aibrix_prefix_cache_routing_decisions_total{{match_percent_bucket=\"0\",model=\"{MOCK_MODEL}\",using_kv_sync=\"false\"}}"
    );
    assert_eq!(sample_value(&metrics, &decisions), 1.0, "{metrics}");
    gateway.shutdown().await;
}

#[tokio::test]
async fn gie_full_duplex_sends_the_endpoint_in_the_header_and_the_metadata() {
    let (gateway, envoy) = started(config(Dialect::Gie), FilterConfig::gie()).await;
    for (stream, trailers) in [(true, false), (false, false), (true, true)] {
        let body = chat("beta", 2, stream);
        let mut request = Request::post(CHAT_PATH, &body, 4);
        if trailers {
            request.trailers = Some(http::HeaderMap::new());
        }
        let reply = envoy.send(&request).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let upstream = reply.upstream.clone().unwrap();
        let forwarded = reply.forwarded.as_ref().unwrap();
        assert_eq!(
            forwarded.headers["x-gateway-destination-endpoint"],
            upstream.as_str()
        );
        assert_eq!(
            reply.metadata("envoy.lb", "x-gateway-destination-endpoint"),
            Some(upstream.clone()),
            "the header and the metadata name the same endpoint"
        );
        // The body Envoy sends on is the one the server streamed back: the client's.
        assert_eq!(&forwarded.body[..], body.as_bytes());
        assert_eq!(forwarded.headers["content-length"], body.len().to_string());
        assert!(forwarded.headers.get("target-pod").is_none());
        assert_eq!(reply.header("x-went-into-resp-headers"), Some("true"));
        assert_eq!(reply.header("target-pod-ip"), Some(upstream.as_str()));
        let text = reply.text();
        if stream {
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        } else {
            let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(answer["object"], "chat.completion");
        }
        released(&gateway).await;
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_streamed_request_body_is_routed_after_a_mode_override_and_refused_without_one() {
    let filter = FilterConfig {
        request_body: BodySendMode::Streamed,
        allow_mode_override: true,
        ..FilterConfig::aibrix()
    };
    let (gateway, envoy) = started(config(Dialect::Aibrix), filter.clone()).await;
    let body = chat("gamma", 3, true);
    let reply = envoy.send(&Request::post(CHAT_PATH, &body, 5)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.forwarded.as_ref().unwrap().headers["target-pod"],
        reply.upstream.clone().unwrap().as_str()
    );
    released(&gateway).await;

    // The override ignored (allow_mode_override off): the body arrives in pieces, which
    // cannot be routed, and the answer says what to change.
    let envoy = envoy.with_config(FilterConfig {
        allow_mode_override: false,
        ..filter.clone()
    });
    let reply = envoy.send(&Request::post(CHAT_PATH, &body, 5)).await;
    assert_eq!(reply.status, 500);
    assert!(reply.local);
    assert!(
        reply.text().contains("allow_mode_override"),
        "{}",
        reply.text()
    );
    // An Envoy that says nothing of its modes is taken to follow the dialect's (buffered).
    let envoy = envoy.with_config(FilterConfig {
        send_protocol_config: false,
        request_body: BodySendMode::Buffered,
        ..filter
    });
    let reply = envoy.send(&Request::post(CHAT_PATH, &body, 5)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    released(&gateway).await;
    gateway.shutdown().await;
}

/// The subset hint Envoy passes for a request: these endpoints only.
fn subset(endpoints: &[&str]) -> Metadata {
    let values = endpoints
        .iter()
        .map(|e| Value {
            kind: Some(Kind::StringValue((*e).to_owned())),
        })
        .collect();
    let hint = Struct {
        fields: [(
            "x-gateway-destination-endpoint-subset".to_owned(),
            Value {
                kind: Some(Kind::ListValue(ListValue { values })),
            },
        )]
        .into(),
    };
    Metadata {
        filter_metadata: [("envoy.lb.subset_hint".to_owned(), hint)].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_subset_hint_limits_the_pick_and_an_empty_one_is_a_503() {
    // The embedded engines listen on one IP, which the protocol matches on: the hint names
    // the loopback address (both replicas) or another one (none).
    let (gateway, envoy) = started(config(Dialect::Gie), FilterConfig::gie()).await;
    let mine = authority(&gateway, "mock-1");
    let mut request = Request::post(CHAT_PATH, &chat("delta", 4, false), 1);
    request.metadata = Some(subset(&[&mine]));
    let reply = envoy.send(&request).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    for (endpoints, what) in [(vec![], "empty"), (vec!["10.255.0.9:8000"], "elsewhere")] {
        request.metadata = Some(subset(&endpoints));
        let reply = envoy.send(&request).await;
        assert_eq!(reply.status, 503, "{what}: {}", reply.text());
        assert!(
            reply
                .text()
                .starts_with("inference error: ServiceUnavailable - "),
            "{what}: {}",
            reply.text()
        );
    }
    released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn refusals_and_the_gateway_s_own_answers_take_each_dialect_s_shape() {
    for (dialect, filter) in [
        (Dialect::Aibrix, FilterConfig::aibrix()),
        (Dialect::Gie, FilterConfig::gie()),
    ] {
        let (gateway, envoy) = started(config(dialect), filter).await;
        let unknown = chat_body_for("no-such-model", "hi", false);
        let reply = envoy.send(&Request::post(CHAT_PATH, &unknown, 1)).await;
        assert!(reply.local, "{dialect:?}");
        match dialect {
            Dialect::Aibrix => {
                assert_eq!(reply.status, 400, "{}", reply.text());
                assert_eq!(
                    reply.header("x-error-no-model-backends"),
                    Some("no-such-model")
                );
                assert_eq!(reply.header("content-type"), Some("application/json"));
                let error: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
                assert_eq!(error["error"]["code"], "model_not_found");
            }
            Dialect::Gie => {
                assert_eq!(reply.status, 404, "{}", reply.text());
                assert_eq!(
                    reply.text(),
                    "inference error: NotFound - model \"no-such-model\" does not exist"
                );
            }
        }
        let reply = envoy.send(&Request::post(CHAT_PATH, "{not json", 1)).await;
        assert_eq!(reply.status, 400, "{dialect:?}: {}", reply.text());
        let reply = envoy
            .send(
                &Request::post(CHAT_PATH, &chat("eps", 1, false), 1)
                    .header("routing-strategy", "fastest"),
            )
            .await;
        assert_eq!(reply.status, 400, "{dialect:?}: {}", reply.text());
        // Answered by the gateway itself, as on its HTTP listener.
        let models = Request {
            method: "GET".into(),
            path: "/v1/models".into(),
            ..Default::default()
        };
        let reply = envoy.send(&models).await;
        assert_eq!(reply.status, 200);
        let list: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(list["data"][0]["id"], MOCK_MODEL);
        let nowhere = Request {
            path: "/v2/nothing".into(),
            ..models
        };
        assert_eq!(envoy.send(&nowhere).await.status, 404);
        released(&gateway).await;
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn admission_caps_hold_for_ext_proc_streams_until_their_response_ends() {
    let mut limited = config(Dialect::Gie);
    limited.admission.max_in_flight = 1;
    limited.admission.retry_after_secs = 7;
    let (gateway, envoy) = started(limited, FilterConfig::gie()).await;
    let body = chat("zeta", 1, true);
    let mut first = envoy.open().await;
    first
        .request(&Request::post(CHAT_PATH, &body, 2))
        .await
        .unwrap();
    assert_eq!(gateway.admission().in_flight(), 1);
    let reply = envoy.send(&Request::post(CHAT_PATH, &body, 2)).await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.header("retry-after"), Some("7"));
    assert!(
        reply
            .text()
            .starts_with("inference error: ResourceExhausted - ")
    );
    first.reset();
    released(&gateway).await;
    let reply = envoy.send(&Request::post(CHAT_PATH, &body, 2)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn ext_proc_and_http_requests_share_one_router_index_and_load_view() {
    let (gateway, envoy) = started(config(Dialect::Aibrix), FilterConfig::aibrix()).await;
    let http = Client::new();
    for (family, http_first) in [("eta", true), ("theta", false), ("iota", true)] {
        let (first, second) = (chat(family, 1, false), chat(family, 2, false));
        let strategy = [("routing-strategy", "prefix-cache")];
        let via_http = |body: String| {
            let http = &http;
            let gateway = &gateway;
            async move {
                let answer = http.chat(gateway, &strategy, body).await;
                assert_eq!(answer.status, 200);
                answer.header("target-pod").unwrap().to_owned()
            }
        };
        let via_envoy = |body: String| {
            let envoy = &envoy;
            async move {
                let request =
                    Request::post(CHAT_PATH, &body, 2).header("routing-strategy", "prefix-cache");
                let reply = envoy.send(&request).await;
                assert_eq!(reply.status, 200, "{}", reply.text());
                reply.header("target-pod").unwrap().to_owned()
            }
        };
        let (a, b) = if http_first {
            (via_http(first).await, via_envoy(second).await)
        } else {
            (via_envoy(first).await, via_http(second).await)
        };
        assert_eq!(
            a, b,
            "family {family}: the second front end follows the first's placement"
        );
    }
    released(&gateway).await;
    // A stream held through ext_proc counts for the HTTP listener's least-request picks.
    let mut held = envoy.open().await;
    let forward = held
        .request(&Request::post(CHAT_PATH, &chat("kappa", 1, true), 1))
        .await
        .unwrap();
    let busy = name_at(&gateway, forward.headers["target-pod"].to_str().unwrap());
    let answer = http
        .chat(
            &gateway,
            &[("routing-strategy", "least-request")],
            chat("lambda", 1, false),
        )
        .await;
    assert_ne!(answer.header("target-pod"), Some(busy.as_str()));
    held.reset();
    released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn outstanding_returns_to_zero_after_clients_leave_and_envoy_goes_away() {
    let (gateway, envoy) = started(config(Dialect::Aibrix), FilterConfig::aibrix()).await;
    let request = Request::post(CHAT_PATH, &chat("mu", 1, true), 1);
    // Routed, then the client leaves before the response.
    let mut stream = envoy.open().await;
    stream.request(&request).await.unwrap();
    assert_eq!(gateway.total_outstanding(), 1);
    stream.reset();
    released(&gateway).await;
    // After the response headers, and after part of the body.
    for chunks in [0, 1] {
        let mut stream = envoy.open().await;
        stream.request(&request).await.unwrap();
        stream
            .response_headers(200, text_event_stream(), false)
            .await
            .unwrap();
        for _ in 0..chunks {
            stream
                .response_chunk("data: {}\n\n".into(), false)
                .await
                .unwrap();
        }
        assert_eq!(
            gateway.total_outstanding(),
            1,
            "held until the response ends"
        );
        stream.reset();
        released(&gateway).await;
    }
    // Envoy half-closes the stream before any response (its upstream failed to connect).
    let mut stream = envoy.open().await;
    stream.request(&request).await.unwrap();
    stream.finish().await.unwrap();
    released(&gateway).await;
    // Envoy itself goes away with streams open: its connection drops.
    let gone = Envoy::connect(
        &gateway.ext_proc_addr().unwrap().to_string(),
        FilterConfig::aibrix(),
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut stream = gone.open().await;
        stream.request(&request).await.unwrap();
        open.push(stream);
    }
    assert_eq!(gateway.total_outstanding(), 3);
    drop(open);
    drop(gone);
    released(&gateway).await;
    gateway.shutdown().await;
}

fn text_event_stream() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "text/event-stream".parse().unwrap());
    headers
}

#[tokio::test]
async fn without_the_response_body_a_request_counts_until_envoy_ends_the_stream() {
    let filter = FilterConfig {
        response_body: BodySendMode::None,
        ..FilterConfig::aibrix()
    };
    let (gateway, envoy) = started(config(Dialect::Aibrix), filter).await;
    let mut stream = envoy.open().await;
    stream
        .request(&Request::post(CHAT_PATH, &chat("nu", 1, false), 1))
        .await
        .unwrap();
    stream
        .response_headers(200, http::HeaderMap::new(), false)
        .await
        .unwrap();
    assert_eq!(gateway.total_outstanding(), 1);
    stream.finish().await.unwrap();
    released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_stream_open_at_the_shutdown_s_cut_ends_with_unavailable_and_releases() {
    let (gateway, envoy) = started(config(Dialect::Gie), FilterConfig::gie()).await;
    let mut stream = envoy.open().await;
    stream
        .request(&Request::post(CHAT_PATH, &chat("xi", 1, true), 1))
        .await
        .unwrap();
    let stats = tokio::spawn(async move { stream.ended_by_server().await });
    assert!(!gateway.shutdown_within(Duration::from_millis(200)).await);
    let ended = tokio::time::timeout(Duration::from_secs(30), stats)
        .await
        .unwrap()
        .unwrap();
    let status = ended.expect_err("the stream was cut");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
}

#[tokio::test]
async fn grpc_health_is_serving_with_ready_replicas() {
    let (gateway, envoy) = started(config(Dialect::Gie), FilterConfig::gie()).await;
    for service in [
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    ] {
        assert_eq!(
            envoy.health(service).await.unwrap(),
            1,
            "{service:?} SERVING"
        );
    }
    let unknown = envoy.health("something-else").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    gateway.shutdown().await;
}

#[tokio::test]
async fn response_trailers_end_a_full_duplex_response() {
    let (gateway, envoy) = started(config(Dialect::Gie), FilterConfig::gie()).await;
    let mut stream = envoy.open().await;
    stream
        .request(&Request::post(CHAT_PATH, &chat("omicron", 1, true), 2))
        .await
        .unwrap();
    stream
        .response_headers(200, text_event_stream(), false)
        .await
        .unwrap();
    let echoed = stream
        .response_chunk("data: {}\n\n".into(), false)
        .await
        .unwrap();
    assert_eq!(&echoed[..], b"data: {}\n\n", "sent back unchanged");
    assert_eq!(gateway.total_outstanding(), 1);
    // An HTTP/2 upstream's trailers: the body ended without end_of_stream.
    stream
        .response_trailers(&http::HeaderMap::new())
        .await
        .unwrap();
    released(&gateway).await;
    stream.finish().await.unwrap();
    gateway.shutdown().await;
}

#[tokio::test]
async fn sessions_travel_through_ext_proc_headers_in_and_x_session_id_out() {
    use router_core::policy::session_affinity::session_id;
    let (gateway, envoy) = started(config(Dialect::Aibrix), FilterConfig::aibrix()).await;
    let send = |session: (&'static str, String)| {
        let request = Request::post(CHAT_PATH, &chat("sess", 1, false), 3)
            .header("routing-strategy", "session-affinity")
            .header(session.0, &session.1);
        let envoy = &envoy;
        async move {
            let reply = envoy.send(&request).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            let upstream = reply.upstream.clone().unwrap();
            let id = reply.header("x-session-id").unwrap().to_owned();
            assert_eq!(session_id::decode(id.as_bytes()), Some(upstream.clone()));
            upstream
        }
    };
    let key = ("x-aibrix-session-key", "caller-session-7".to_owned());
    let first = send(key.clone()).await;
    for _ in 0..3 {
        assert_eq!(send(key.clone()).await, first, "the key keeps its pod");
    }
    let other = gateway
        .replicas()
        .into_iter()
        .map(|(_, at, _)| at)
        .find(|at| *at != first)
        .unwrap();
    let named = ("x-session-id", session_id::encode(&other));
    assert_eq!(send(named).await, other, "the session id names its pod");
    released(&gateway).await;
    gateway.shutdown().await;
}
