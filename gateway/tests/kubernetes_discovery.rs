//! Kubernetes pod discovery end to end: a fake API server on `127.0.0.1:0` serves a pod list
//! and watch streams the test writes event by event, a gateway discovers its replicas from
//! it, and small upstreams on `127.0.0.1:0` stand in for the pods (pod IP 127.0.0.1, the port
//! label their port). Requests through the gateway must reach only routable pods.
//!
//! Every wait polls its condition with a bounded deadline; nothing sleeps and hopes.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use gateway::config::{DiscoveryKind, GatewayConfig};
use gateway::{GatewayHandle, start};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

mod support;

use support::{HttpClient, http_client, loopback_config};

/// Bound on every wait; generous for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(20);
const MODEL: &str = "m";

type Chunks = mpsc::UnboundedSender<Result<Bytes, Infallible>>;

/// A body streamed from whatever the test sends on the returned sender; it ends when the
/// sender is dropped.
fn channel_body() -> (Chunks, Body) {
    let (sender, receiver) = mpsc::unbounded_channel::<Result<Bytes, Infallible>>();
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    (sender, Body::from_stream(stream))
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// One watch request the fake API server received: its query and its event stream.
struct WatchCall {
    query: String,
    events: Chunks,
}

impl WatchCall {
    fn send(&self, event: &str, object: Value) {
        let line = format!("{}\n", json!({"type": event, "object": object}));
        self.events.send(Ok(Bytes::from(line))).unwrap();
    }

    fn send_raw(&self, line: &str) {
        self.events
            .send(Ok(Bytes::from(format!("{line}\n"))))
            .unwrap();
    }
}

#[derive(Default)]
struct FakeApiState {
    list: Mutex<Value>,
    list_queries: Mutex<Vec<String>>,
    gone_next_watch: AtomicBool,
    watches: Mutex<Option<mpsc::UnboundedSender<WatchCall>>>,
}

/// A Kubernetes API server that knows one namespace's pods.
struct FakeApi {
    addr: SocketAddr,
    state: Arc<FakeApiState>,
    watches: mpsc::UnboundedReceiver<WatchCall>,
}

impl FakeApi {
    async fn start(pods: Vec<Value>, resource_version: &str) -> FakeApi {
        let state = Arc::new(FakeApiState::default());
        let (sender, watches) = mpsc::unbounded_channel();
        *state.watches.lock().unwrap() = Some(sender);
        let api = FakeApi {
            addr: serve(
                Router::new()
                    .route("/api/v1/namespaces/llm/pods", get(pods_handler))
                    .with_state(Arc::clone(&state)),
            )
            .await,
            state,
            watches,
        };
        api.set_list(pods, resource_version);
        api
    }

    fn set_list(&self, pods: Vec<Value>, resource_version: &str) {
        *self.state.list.lock().unwrap() = json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": resource_version},
            "items": pods,
        });
    }

    fn lists(&self) -> usize {
        self.state.list_queries.lock().unwrap().len()
    }

    /// The next watch connection the gateway opens.
    async fn next_watch(&mut self) -> WatchCall {
        tokio::time::timeout(DEADLINE, self.watches.recv())
            .await
            .expect("a watch request in time")
            .expect("the fake API server is running")
    }
}

async fn pods_handler(
    State(state): State<Arc<FakeApiState>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = query.unwrap_or_default();
    if !query.split('&').any(|param| param == "watch=true") {
        state.list_queries.lock().unwrap().push(query);
        let list = state.list.lock().unwrap().clone();
        return axum::Json(list).into_response();
    }
    if state.gone_next_watch.swap(false, Ordering::SeqCst) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "too old resource version", "reason": "Expired",
            "code": 410});
        return (StatusCode::GONE, axum::Json(status)).into_response();
    }
    let (events, body) = channel_body();
    if let Some(watches) = state.watches.lock().unwrap().as_ref() {
        let _ = watches.send(WatchCall { query, events });
    }
    body.into_response()
}

/// A pod of model `m` on 127.0.0.1:`port`.
fn pod(name: &str, port: u16, ready: bool, resource_version: &str) -> Value {
    json!({
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "resourceVersion": resource_version,
            "labels": {"model.aibrix.ai/name": MODEL, "model.aibrix.ai/port": port.to_string()},
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        },
    })
}

/// An upstream standing in for one pod: answers JSON at once, and holds each streamed
/// response open until the test ends it through the sender it is handed.
struct Upstream {
    port: u16,
    streams: mpsc::UnboundedReceiver<Chunks>,
}

impl Upstream {
    async fn start() -> Upstream {
        let (sender, streams) = mpsc::unbounded_channel::<Chunks>();
        let router = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route(
                "/v1/chat/completions",
                post(
                    |State(streams): State<mpsc::UnboundedSender<Chunks>>, body: Bytes| async move {
                        if String::from_utf8_lossy(&body).contains("\"stream\":true") {
                            let (chunks, body) = channel_body();
                            let _ = streams.send(chunks);
                            ([("content-type", "text/event-stream")], body).into_response()
                        } else {
                            axum::Json(json!({"object": "chat.completion", "choices": []}))
                                .into_response()
                        }
                    },
                ),
            )
            .with_state(sender);
        Upstream {
            port: serve(router).await.port(),
            streams,
        }
    }
}

fn config(api: &FakeApi) -> GatewayConfig {
    let mut config = loopback_config();
    config.default_strategy = "least-request".to_owned();
    config.discovery.kind = DiscoveryKind::Kubernetes;
    config.discovery.namespace = Some("llm".to_owned());
    config.discovery.models = vec![MODEL.to_owned()];
    config.discovery.api_server = Some(format!("http://{}", api.addr));
    config.discovery.backoff_initial_ms = 5;
    config.discovery.backoff_max_ms = 50;
    config.health.interval_ms = 50;
    config.health.timeout_ms = 500;
    config
}

/// The names of the replicas in the gateway's snapshot.
fn replica_names(gateway: &GatewayHandle) -> Vec<String> {
    gateway
        .replicas()
        .into_iter()
        .map(|(name, _, _)| name)
        .collect()
}

async fn wait_for_replicas(gateway: &GatewayHandle, expected: &[&str]) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let names = replica_names(gateway);
        if names == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replicas {names:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn chat(gateway: &GatewayHandle, stream: bool) -> http::Request<Full<Bytes>> {
    let body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream});
    http::Request::post(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// Sends a non-streamed chat request; its status and `target-pod`.
async fn route_one(client: &HttpClient, gateway: &GatewayHandle) -> (u16, String) {
    let response = tokio::time::timeout(DEADLINE, client.request(chat(gateway, false)))
        .await
        .unwrap()
        .unwrap();
    let pod = response
        .headers()
        .get("target-pod")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let status = response.status().as_u16();
    response.into_body().collect().await.unwrap();
    (status, pod)
}

#[tokio::test]
async fn the_first_list_makes_only_routable_pods_replicas() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let mut bad_port = pod("bad-port", a.port, true, "3");
    bad_port["metadata"]["labels"]["model.aibrix.ai/port"] = "http".into();
    let mut no_ip = pod("no-ip", a.port, true, "4");
    no_ip["status"]["podIP"] = Value::Null;
    let api = FakeApi::start(
        vec![
            pod("pod-a", a.port, true, "1"),
            pod("pod-b", b.port, false, "2"),
            bad_port,
            no_ip,
        ],
        "10",
    )
    .await;
    let gateway = start(config(&api)).await.unwrap();
    // start() waited for the first list.
    assert_eq!(replica_names(&gateway), ["pod-a"]);
    let (_, authority, ready) = &gateway.replicas()[0];
    assert_eq!(authority, &format!("127.0.0.1:{}", a.port));
    assert!(ready);
    let query = api.state.list_queries.lock().unwrap()[0].clone();
    assert!(
        query
            .split('&')
            .any(|param| param == "labelSelector=model.aibrix.ai%2Fname%3Dm"),
        "{query}"
    );

    let client = http_client();
    for _ in 0..4 {
        assert_eq!(
            route_one(&client, &gateway).await,
            (200, "pod-a".to_owned())
        );
    }
    let models = client
        .get(format!("{}/v1/models", gateway.url()).parse().unwrap())
        .await
        .unwrap();
    let models = models.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&models).contains("\"m\""));
    gateway.shutdown().await;
}

#[tokio::test]
async fn watch_events_add_and_remove_pods_and_a_dropped_watch_resumes() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let mut api = FakeApi::start(vec![pod("pod-a", a.port, true, "1")], "10").await;
    let gateway = start(config(&api)).await.unwrap();
    let client = http_client();
    assert_eq!(replica_names(&gateway), ["pod-a"]);

    let watch = api.next_watch().await;
    assert!(
        watch.query.contains("resourceVersion=10"),
        "{}",
        watch.query
    );
    assert!(
        watch.query.contains("allowWatchBookmarks=true"),
        "{}",
        watch.query
    );
    assert!(watch.query.contains("timeoutSeconds="), "{}", watch.query);

    watch.send("ADDED", pod("pod-b", b.port, true, "11"));
    wait_for_replicas(&gateway, &["pod-a", "pod-b"]).await;

    // Not Ready: no new requests.
    watch.send("MODIFIED", pod("pod-a", a.port, false, "12"));
    wait_for_replicas(&gateway, &["pod-b"]).await;
    for _ in 0..4 {
        assert_eq!(
            route_one(&client, &gateway).await,
            (200, "pod-b".to_owned())
        );
    }

    watch.send("MODIFIED", pod("pod-a", a.port, true, "13"));
    wait_for_replicas(&gateway, &["pod-a", "pod-b"]).await;
    watch.send("DELETED", pod("pod-b", b.port, true, "14"));
    wait_for_replicas(&gateway, &["pod-a"]).await;
    for _ in 0..4 {
        assert_eq!(
            route_one(&client, &gateway).await,
            (200, "pod-a".to_owned())
        );
    }

    // A malformed line and a pod with a bad port label are skipped; the stream goes on.
    watch.send_raw("{\"type\":\"ADDED\",\"object\":");
    watch.send_raw("garbage");
    let mut bad = pod("pod-bad", b.port, true, "15");
    bad["metadata"]["labels"]["model.aibrix.ai/port"] = "99999".into();
    watch.send("ADDED", bad);
    watch.send(
        "BOOKMARK",
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "20"}}),
    );
    watch.send("ADDED", pod("pod-b", b.port, true, "21"));
    wait_for_replicas(&gateway, &["pod-a", "pod-b"]).await;

    // The connection drops: the gateway watches again from the last version seen, without
    // listing again, and keeps its replicas meanwhile.
    drop(watch);
    let watch = api.next_watch().await;
    assert!(
        watch.query.contains("resourceVersion=21"),
        "{}",
        watch.query
    );
    assert_eq!(api.lists(), 1);
    assert_eq!(replica_names(&gateway), ["pod-a", "pod-b"]);
    watch.send("DELETED", pod("pod-a", a.port, true, "22"));
    wait_for_replicas(&gateway, &["pod-b"]).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn gone_relists_whether_as_an_error_event_or_a_status() {
    let (a, b) = (Upstream::start().await, Upstream::start().await);
    let mut api = FakeApi::start(
        vec![
            pod("pod-a", a.port, true, "1"),
            pod("pod-b", b.port, true, "2"),
        ],
        "10",
    )
    .await;
    let gateway = start(config(&api)).await.unwrap();
    assert_eq!(replica_names(&gateway), ["pod-a", "pod-b"]);

    // While the watch was behind, pod-a went away: only a relist can tell.
    let watch = api.next_watch().await;
    api.set_list(vec![pod("pod-b", b.port, true, "2")], "30");
    let gone = json!({"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired",
        "message": "too old resource version: 10 (25)"});
    watch.send("ERROR", gone);
    wait_for_replicas(&gateway, &["pod-b"]).await;
    assert_eq!(api.lists(), 2);
    let watch = api.next_watch().await;
    assert!(
        watch.query.contains("resourceVersion=30"),
        "{}",
        watch.query
    );

    // 410 as the watch response's status.
    api.set_list(
        vec![
            pod("pod-a", a.port, true, "31"),
            pod("pod-b", b.port, true, "2"),
        ],
        "40",
    );
    api.state.gone_next_watch.store(true, Ordering::SeqCst);
    drop(watch);
    let watch = api.next_watch().await;
    assert!(
        watch.query.contains("resourceVersion=40"),
        "{}",
        watch.query
    );
    assert_eq!(api.lists(), 3);
    assert_eq!(replica_names(&gateway), ["pod-a", "pod-b"]);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_terminating_pod_gets_no_new_requests_and_its_stream_finishes() {
    let (mut a, b) = (Upstream::start().await, Upstream::start().await);
    let mut api = FakeApi::start(vec![pod("pod-a", a.port, true, "1")], "10").await;
    let gateway = start(config(&api)).await.unwrap();
    let client = http_client();
    let watch = api.next_watch().await;

    // A stream in flight on pod-a.
    let response = tokio::time::timeout(DEADLINE, client.request(chat(&gateway, true)))
        .await
        .unwrap()
        .unwrap();
    let stream = tokio::time::timeout(DEADLINE, a.streams.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.headers()["target-pod"], "pod-a");
    stream
        .send(Ok(Bytes::from_static(b"data: {\"n\":1}\n\n")))
        .unwrap();
    let mut body = response.into_body();
    let first = tokio::time::timeout(DEADLINE, body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "data: {\"n\":1}\n\n");

    // pod-a is deleted (terminating), pod-b arrives.
    let mut terminating = pod("pod-a", a.port, true, "11");
    terminating["metadata"]["deletionTimestamp"] = "2026-11-29T19:00:00Z".into();
    watch.send("MODIFIED", terminating);
    watch.send("ADDED", pod("pod-b", b.port, true, "12"));
    wait_for_replicas(&gateway, &["pod-b"]).await;
    for _ in 0..6 {
        assert_eq!(
            route_one(&client, &gateway).await,
            (200, "pod-b".to_owned())
        );
    }

    // The stream on pod-a finishes normally (drain).
    stream
        .send(Ok(Bytes::from_static(
            b"data: {\"n\":2}\n\ndata: [DONE]\n\n",
        )))
        .unwrap();
    drop(stream);
    let rest = tokio::time::timeout(DEADLINE, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(rest, "data: {\"n\":2}\n\ndata: [DONE]\n\n");
    assert_eq!(gateway.total_outstanding(), 0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn health_checks_cover_discovered_pods() {
    // A Ready pod whose port has no server: the gateway's own probes eject it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let api = FakeApi::start(vec![pod("pod-dead", port, true, "1")], "10").await;
    let gateway = start(config(&api)).await.unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while gateway.replicas() != [("pod-dead".to_owned(), format!("127.0.0.1:{port}"), false)] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            gateway.replicas()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, _) = route_one(&http_client(), &gateway).await;
    assert_eq!(status, 503);
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_api_server_is_not_a_start_error_and_serves_503() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let mut config = loopback_config();
    config.discovery.kind = DiscoveryKind::Kubernetes;
    config.discovery.namespace = Some("llm".to_owned());
    config.discovery.api_server = Some(format!("http://{addr}"));
    let gateway = start(config).await.unwrap();
    assert!(gateway.replicas().is_empty());
    let ready = http_client()
        .get(format!("{}/ready", gateway.url()).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    gateway.shutdown().await;
}
