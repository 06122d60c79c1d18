//! Shared helpers for prefixgate's end-to-end tests: real servers on `127.0.0.1:0`.
//!
//! - [`FakeUpstream`]: a small OpenAI-shaped replica whose behaviour each request picks with
//!   the `x-fake` header (forwarded by the gateway like any client header): stream slowly,
//!   answer a status, hang, or drop the connection mid-stream. It records what it received
//!   (bodies, request ids, headers) and counts requests in flight, so tests can see a
//!   cancelled upstream request.
//! - [`gateway_config`] / [`start_gateway`]: a gateway on port 0 in front of given replicas
//!   ([`gateway_with_one_upstream`] / [`gateway_with_two_upstreams`] make those replicas too);
//!   [`mock_gateway_config`]: one with embedded mock-engine replicas.
//! - [`Client`]: a plain HTTP/1 client for requests, streams and `/metrics` scrapes, with
//!   [`Client::chat`] / [`Client::chat_stream`] for the chat path most tests use.
//! - [`sse_events`] / [`assert_ends_with_done`]: what a streamed answer holds and how it ends.
//! - [`raw_answer`] / [`openai_error`]: a request written as raw bytes and the gateway's
//!   answer read until it closes; the OpenAI error in it.
//! - [`envoy`]: a stand-in for Envoy's ext_proc filter (the message order of each processing
//!   mode and what Envoy does with each answer), for the ext_proc listener's tests.
//! - [`wait_until`]: waits on a condition with a bounded deadline (never sleep-and-hope);
//!   [`shutdown_once_released`] ends a test whose responses must have released their pods.
//!
//! `x-fake` values: `sse:N:MS` (N token events MS apart, then `[DONE]`; the default is
//! `sse:3:0` for streams), `json` (one JSON body, the default without `"stream":true`),
//! `status:CODE`, `hang` (never answers), `drop:N:MS` (N events, then a broken connection),
//! `stall:N` (N events, then silence). `x-fake-delay: MS` holds any of them back MS ms
//! before the response head (a request waiting in an engine's queue).

pub mod envoy;
pub mod vllm_fixtures;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use gateway::config::{BackendConfig, GatewayConfig};
use gateway::{GatewayHandle, start};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The model every fake upstream serves.
pub const MODEL: &str = "fake-model";

/// The model the embedded mock engines serve.
pub const MOCK_MODEL: &str = "mock-model";

/// The gateway's chat path, where most end-to-end requests go.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// What a fake upstream saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    pub in_flight: AtomicUsize,
    pub bodies: Mutex<Vec<Bytes>>,
    pub request_ids: Mutex<Vec<String>>,
    /// Every request's headers, in arrival order.
    pub headers: Mutex<Vec<HeaderMap>>,
    pub healthy: AtomicBool,
}

/// Decrements `in_flight` when the upstream's work for a request is dropped (finished or
/// cancelled because the gateway went away).
struct InFlight(Arc<Seen>);

impl InFlight {
    fn new(seen: &Arc<Seen>) -> Self {
        seen.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(seen))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A fake OpenAI replica on `127.0.0.1:0`.
#[derive(Debug)]
pub struct FakeUpstream {
    pub name: String,
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    task: JoinHandle<()>,
}

impl FakeUpstream {
    pub async fn start(name: &str) -> FakeUpstream {
        let seen = Arc::new(Seen::default());
        seen.healthy.store(true, Ordering::SeqCst);
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/completions", post(complete))
            .route("/v1/embeddings", post(complete))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .with_state(Arc::clone(&seen));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeUpstream {
            name: name.to_owned(),
            addr,
            seen,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn backend(&self) -> BackendConfig {
        BackendConfig {
            name: self.name.clone(),
            url: self.url(),
            model: None,
            kv_events: None,
            kv_replay: None,
        }
    }

    pub fn requests(&self) -> usize {
        self.seen.requests.load(Ordering::SeqCst)
    }

    pub fn in_flight(&self) -> usize {
        self.seen.in_flight.load(Ordering::SeqCst)
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.seen.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Stops serving (its port then refuses connections).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn models() -> Response {
    axum::Json(serde_json::json!({"object":"list","data":[{"id": MODEL, "object":"model"}]}))
        .into_response()
}

async fn health(State(seen): State<Arc<Seen>>) -> StatusCode {
    if seen.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn token_event(i: usize) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" t{i}\"}},\"finish_reason\":null}}]}}\n\n"
    ))
}

/// An SSE body of `n` token events `gap` apart; then `[DONE]`, a broken connection, or
/// silence.
fn sse(guard: InFlight, n: usize, gap: Duration, end: &'static str) -> Response {
    let events = futures_util::stream::iter(0..n).then(move |i| async move {
        if i > 0 && !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        Ok::<Bytes, std::io::Error>(token_event(i))
    });
    let tail = futures_util::stream::once(async move {
        let _held = guard;
        // Lets the last event be written before a failure cuts the connection.
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        match end {
            "done" => Ok(Bytes::from_static(b"data: [DONE]\n\n")),
            "drop" => Err(std::io::Error::other("fake upstream dropped the stream")),
            _ => std::future::pending().await,
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(events.chain(tail)))
        .unwrap()
}

fn parse_n_ms(rest: &str) -> (usize, Duration) {
    let mut parts = rest.split(':');
    let n = parts.next().and_then(|p| p.parse().ok()).unwrap_or(3);
    let ms = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (n, Duration::from_millis(ms))
}

async fn complete(State(seen): State<Arc<Seen>>, headers: HeaderMap, request: Request) -> Response {
    seen.requests.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight::new(&seen);
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let stream = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream").and_then(|s| s.as_bool()))
        .unwrap_or(false);
    seen.bodies.lock().unwrap().push(body);
    seen.headers.lock().unwrap().push(headers.clone());
    if let Some(id) = headers.get("x-request-id").and_then(|v| v.to_str().ok()) {
        seen.request_ids.lock().unwrap().push(id.to_owned());
    }
    if let Some(ms) = headers
        .get("x-fake-delay")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mode = headers
        .get("x-fake")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(if stream { "sse" } else { "json" })
        .to_owned();
    let (kind, rest) = mode.split_once(':').unwrap_or((mode.as_str(), ""));
    match kind {
        "sse" => {
            let (n, gap) = parse_n_ms(rest);
            sse(guard, n, gap, "done")
        }
        "drop" => {
            let (n, gap) = parse_n_ms(rest);
            sse(guard, n, gap, "drop")
        }
        "stall" => {
            let (n, _) = parse_n_ms(rest);
            sse(guard, n, Duration::ZERO, "stall")
        }
        "status" => {
            let code = rest.parse().unwrap_or(500);
            (StatusCode::from_u16(code).unwrap(), "{\"error\":\"fake\"}").into_response()
        }
        "hang" => {
            let _held = guard;
            std::future::pending::<Infallible>().await;
            unreachable!()
        }
        _ => axum::Json(serde_json::json!({
            "id": "c", "object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        }))
        .into_response(),
    }
}

/// A gateway configuration on port 0 for `backends`, with short timeouts for tests and no
/// engine scrape (the fake has no `/metrics`).
pub fn gateway_config(backends: Vec<BackendConfig>) -> GatewayConfig {
    let mut config = GatewayConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        backends,
        ..GatewayConfig::default()
    };
    config.engine_scrape.enabled = false;
    config.health.interval_ms = 50;
    config.health.timeout_ms = 500;
    config.upstream.connect_timeout_ms = 1_000;
    config.upstream.first_byte_timeout_ms = 2_000;
    config.upstream.idle_timeout_ms = 2_000;
    config.shutdown_grace_secs = 5;
    config
}

/// A gateway configuration on port 0 with `n` embedded mock-engine replicas (`fast`
/// profile, engine time 10× wall time) serving [`MOCK_MODEL`].
pub fn mock_gateway_config(n: usize) -> GatewayConfig {
    let mut config = gateway_config(Vec::new());
    config.embedded.mock_engines = n;
    config.embedded.engine_profile = "fast".to_owned();
    config.embedded.time_scale = 10.0;
    config.embedded.served_model = MOCK_MODEL.to_owned();
    config.engine_scrape.enabled = true;
    config.engine_scrape.interval_ms = 50;
    config
}

/// Starts a gateway in front of `upstreams`.
pub async fn start_gateway(upstreams: &[&FakeUpstream]) -> GatewayHandle {
    start(gateway_config(
        upstreams.iter().map(|u| u.backend()).collect(),
    ))
    .await
    .unwrap()
}

/// A fake upstream named `a` and a gateway in front of it alone.
pub async fn gateway_with_one_upstream() -> (FakeUpstream, GatewayHandle) {
    let a = FakeUpstream::start("a").await;
    let gateway = start_gateway(&[&a]).await;
    (a, gateway)
}

/// Fake upstreams named `a` and `b` and a gateway in front of both.
pub async fn gateway_with_two_upstreams() -> (FakeUpstream, FakeUpstream, GatewayHandle) {
    let a = FakeUpstream::start("a").await;
    let b = FakeUpstream::start("b").await;
    let gateway = start_gateway(&[&a, &b]).await;
    (a, b, gateway)
}

/// Waits until `condition` holds, checking every few milliseconds, for at most 10 s.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if condition() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until every replica behind `gateway` has no outstanding request.
pub async fn wait_outstanding_zero(gateway: &GatewayHandle) {
    wait_until("outstanding counts back to zero", || {
        gateway.total_outstanding() == 0
    })
    .await;
}

/// Waits until every replica behind `gateway` has no outstanding request, then shuts it
/// down: how a test ends once it has checked that its responses released their pods.
pub async fn shutdown_once_released(gateway: GatewayHandle) {
    wait_outstanding_zero(&gateway).await;
    gateway.shutdown().await;
}

/// A chat request body for the fake upstreams' model.
pub fn chat_body(prompt: &str, stream: bool) -> String {
    chat_body_for(MODEL, prompt, stream)
}

/// A chat request body for `model`.
pub fn chat_body_for(model: &str, prompt: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
        "max_tokens": 8,
    })
    .to_string()
}

/// A complete response: status, headers and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Reads a response to its end.
    pub async fn read(response: http::Response<hyper::body::Incoming>) -> Answer {
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A plain HTTP/1 client.
#[derive(Debug, Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    pub fn new() -> Client {
        Client {
            inner: hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build(HttpConnector::new()),
        }
    }

    /// Sends a request and returns the response with its body still streaming.
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> http::Response<hyper::body::Incoming> {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body.into())).unwrap();
        self.inner.request(request).await.unwrap()
    }

    /// Sends a request and reads the whole response.
    pub async fn call(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        Answer::read(self.send(method, url, headers, body).await).await
    }

    /// POSTs a JSON body to the gateway's `path` and returns as soon as the head arrives,
    /// its body still streaming.
    pub async fn post_streaming(
        &self,
        gateway: &GatewayHandle,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> http::Response<hyper::body::Incoming> {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send("POST", &format!("{}{path}", gateway.url()), &all, body)
            .await
    }

    /// POSTs a JSON body to the gateway's `path` and reads the whole response.
    pub async fn post(
        &self,
        gateway: &GatewayHandle,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        Answer::read(self.post_streaming(gateway, path, headers, body).await).await
    }

    /// POSTs a JSON body to the gateway's `/v1/chat/completions`.
    pub async fn chat(
        &self,
        gateway: &GatewayHandle,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        self.post(gateway, CHAT_PATH, headers, body).await
    }

    /// POSTs a JSON body to the gateway's `/v1/chat/completions` and returns as soon as the
    /// head arrives, its body still streaming: for tests that hold a stream open, read it
    /// frame by frame, or leave in the middle.
    pub async fn chat_stream(
        &self,
        gateway: &GatewayHandle,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> http::Response<hyper::body::Incoming> {
        self.post_streaming(gateway, CHAT_PATH, headers, body).await
    }

    /// GETs the gateway's `path` (on the API listener).
    pub async fn get(&self, gateway: &GatewayHandle, path: &str) -> Answer {
        let url = format!("{}{path}", gateway.url());
        self.call("GET", &url, &[], Bytes::new()).await
    }

    /// The gateway's `/metrics` text.
    pub async fn metrics(&self, gateway: &GatewayHandle) -> String {
        let url = format!("http://{}/metrics", gateway.metrics_addr());
        let answer = self.call("GET", &url, &[], Bytes::new()).await;
        assert_eq!(answer.status, StatusCode::OK);
        answer.text().to_owned()
    }
}

/// The value of one sample line `name{labels}` in a Prometheus text exposition (0 if absent).
pub fn sample_value(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(name_and_labels)
                .and_then(|rest| rest.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// The events of a whole SSE body, in order, each without its blank-line separator
/// (`data: [DONE]` included as is).
pub fn sse_events(text: &str) -> Vec<&str> {
    text.split("\n\n").filter(|e| !e.is_empty()).collect()
}

/// Asserts that a streamed answer ended normally: its last event is `data: [DONE]`.
#[track_caller]
pub fn assert_ends_with_done(answer: &Answer) {
    let text = answer.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

/// A raw HTTP/1.1 chat completion the fake upstream holds without answering (`x-fake: hang`):
/// a request waiting in the engine's queue, with no response headers yet.
pub fn hanging_chat_request() -> String {
    let body = chat_body("hi", false);
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         x-fake: hang\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Writes `request` whole and reads the gateway's answer until it closes: head and body.
pub async fn raw_answer(gateway: &gateway::GatewayHandle, request: &[u8]) -> (String, String) {
    let mut tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    tcp.write_all(request).await.unwrap();
    read_answer(tcp).await
}

/// Reads the gateway's answer on `tcp` until it closes (no reset): head and body.
pub async fn read_answer(mut tcp: TcpStream) -> (String, String) {
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the gateway closes once it has answered")
        .expect("closed without a reset");
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect(&answer);
    (head.to_owned(), body.to_owned())
}

/// The OpenAI error in a raw answer, checked to be one: JSON, `content-type:
/// application/json`, `{"error":{"message","type","param","code"}}`.
pub fn openai_error(head: &str, body: &str) -> serde_json::Value {
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\ncontent-type: application/json"),
        "{head}"
    );
    let json: serde_json::Value = serde_json::from_str(body).expect(body);
    let error = &json["error"];
    for field in ["message", "type", "code"] {
        assert!(error[field].is_string(), "{field}: {body}");
    }
    assert!(error.get("param").is_some(), "{body}");
    error.clone()
}
