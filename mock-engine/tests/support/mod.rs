//! Test support for the mock-engine server tests: start a replica on 127.0.0.1:0, speak
//! HTTP to it (a hyper client, or a raw socket where a test must control the connection),
//! split SSE bodies into events and read Prometheus samples.

#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub const MODEL: &str = "test-model";

/// Upper bound on any one test, so a bug shows up as a failure, not a stuck CI job.
pub const TEST_DEADLINE: Duration = Duration::from_secs(60);

/// Runs a test body under [`TEST_DEADLINE`].
pub async fn bounded<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(TEST_DEADLINE, body)
        .await
        .expect("test exceeded its deadline");
}

/// The `fast` profile: near-zero step time.
pub fn fast() -> EngineProfile {
    EngineProfile::builtin("fast").expect("builtin fast profile")
}

/// A profile whose steps take `step` engine seconds, so requests stay in flight.
pub fn slow(step: f64) -> EngineProfile {
    let mut profile = fast();
    profile.t0 = step;
    profile
}

pub fn config(profile: EngineProfile, failures: FailurePlan) -> ReplicaConfig {
    ReplicaConfig {
        name: "mock-0".into(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        model: MODEL.into(),
        profile,
        time_scale: 1.0,
        failures,
    }
}

pub async fn start(profile: EngineProfile) -> ReplicaHandle {
    start_with(config(profile, FailurePlan::default())).await
}

pub async fn start_with(config: ReplicaConfig) -> ReplicaHandle {
    spawn_replica(config).await.expect("replica starts")
}

/// A complete HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(
    handle: &ReplicaHandle,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("{}{path}", handle.url()))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    let response = client().request(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("whole body")
        .to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).expect("utf-8 body"),
    }
}

pub async fn post(handle: &ReplicaHandle, path: &str, body: &str) -> Answer {
    send(handle, Method::POST, path, &[], body).await
}

/// POSTs `body` to `/v1/chat/completions`.
pub async fn post_chat(handle: &ReplicaHandle, body: &str) -> Answer {
    post(handle, "/v1/chat/completions", body).await
}

/// POSTs `body` to `/v1/completions`.
pub async fn post_completion(handle: &ReplicaHandle, body: &str) -> Answer {
    post(handle, "/v1/completions", body).await
}

pub async fn get(handle: &ReplicaHandle, path: &str) -> Answer {
    send(handle, Method::GET, path, &[], "").await
}

/// The `data:` payloads of an SSE body, in order (`[DONE]` included as is).
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"))
                .to_owned()
        })
        .collect()
}

/// A request written on a fresh raw connection, for tests that must drop it or read it
/// byte by byte.
pub async fn raw_request(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body.as_bytes()).await.expect("write body");
    stream
}

/// Reads until `needle` has been seen (or the peer closes); returns what was read.
pub async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded by the test deadline; each read returns at least one byte or ends the loop.
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
        if String::from_utf8_lossy(&seen).contains(needle) {
            break;
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// Reads until the peer closes (or resets) the connection.
pub async fn read_to_close(stream: &mut TcpStream) -> String {
    read_until(stream, "\u{0}never-present\u{0}").await
}

/// The value of one Prometheus sample, by its exact series text.
pub fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse::<f64>().expect("sample value"))
        })
        .unwrap_or_else(|| panic!("no sample {series}\n{metrics}"))
}

/// `NAME{engine="0",model_name="test-model"}`.
pub fn series(name: &str) -> String {
    format!("{name}{{engine=\"0\",model_name=\"{MODEL}\"}}")
}

/// `vllm:request_success_total` for one finish reason.
pub fn success_series(reason: &str) -> String {
    format!(
        "vllm:request_success_total{{engine=\"0\",finished_reason=\"{reason}\",model_name=\"{MODEL}\"}}"
    )
}

pub async fn metrics(handle: &ReplicaHandle) -> String {
    let answer = get(handle, "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.body
}

/// Polls `/metrics` until `done` holds, at most 400 times, 25 ms apart: the engine runs in
/// its own task, so its counters settle a little after the HTTP answer.
pub async fn wait_for_metrics(handle: &ReplicaHandle, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    for _ in 0..400 {
        text = metrics(handle).await;
        if done(&text) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("metrics never reached the expected state:\n{text}");
}

/// A chat body.
pub fn chat_body(content: &str, max_tokens: u32, stream: bool, include_usage: bool) -> String {
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": if include_usage { serde_json::json!({"include_usage": true}) } else { Value::Null },
        "ignore_eos": true,
    })
    .to_string()
}

/// A completions body.
pub fn completion_body(prompt: &str, max_tokens: u32, stream: bool, include_usage: bool) -> String {
    serde_json::json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": if include_usage { serde_json::json!({"include_usage": true}) } else { Value::Null },
    })
    .to_string()
}

/// A prompt of `words` distinct words (≈ one token each).
pub fn prompt_of(words: usize, family: &str) -> String {
    (0..words)
        .map(|i| format!("{family}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}
