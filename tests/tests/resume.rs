//! Resume end to end: two `mock-engine` processes (the binary, started by each test) behind
//! an in-process gateway; the replica serving a stream is killed with SIGKILL after some
//! tokens (or hangs, `stall-after`, until the idle limit), and the client's stream either carries on on the other replica (one id, every
//! token, one usage block counting the whole answer, one `[DONE]`) or, when resume is off,
//! used up or not allowed for the request, ends with a clean SSE error. Load accounting
//! returns to zero on every path, a client leaving during a resume included.
//!
//! The binary is the workspace's `mock-engine` build next to this test's own executable:
//! `cargo test --workspace` builds it (mock-engine's own tests need it); alone, run
//! `cargo build -p mock-engine` first.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gateway::GatewayHandle;
use gateway::config::{BackendConfig, GatewayConfig};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use prefixgate_tests::{Client, MOCK_MODEL, gateway_config, sample_value, sse_events, wait_until};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Tokens each test's answer asks for: long enough (a few seconds) to kill its replica
/// midway.
const MAX_TOKENS: u64 = 200;

/// One `mock-engine` process serving one replica.
struct Engine {
    backend: BackendConfig,
    child: tokio::process::Child,
}

impl Engine {
    /// Starts the binary on a free port and reads the `NAME URL` line it prints (bounded).
    async fn start(name: &str) -> Engine {
        Self::start_with(name, &[]).await
    }

    /// As `start`, with more flags (an injected failure).
    async fn start_with(name: &str, flags: &[&str]) -> Engine {
        let mut child = tokio::process::Command::new(mock_engine_binary())
            .args(flags)
            .args([
                "--listen",
                "127.0.0.1:0",
                "--name",
                name,
                "--model",
                MOCK_MODEL,
            ])
            // Engine time twice wall time: ~10 ms a token, a 200-token answer in ~2 s.
            .args(["--time-scale", "2"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start mock-engine");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("mock-engine printed its replica within 60 s")
            .expect("read stdout")
            .expect("a line");
        let (printed, url) = line.split_once(' ').expect("NAME URL");
        assert_eq!(printed, name);
        Engine {
            backend: BackendConfig {
                name: name.to_owned(),
                url: url.to_owned(),
                model: Some(MOCK_MODEL.to_owned()),
                kv_events: None,
                kv_replay: None,
            },
            child,
        }
    }

    /// SIGKILL: the process dies at once, its connections reset mid-stream.
    async fn kill(&mut self) {
        self.child.start_kill().expect("SIGKILL");
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

fn mock_engine_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    // target/<profile>/deps/resume-… → target/<profile>/mock-engine
    let binary = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("mock-engine"))
        .expect("a target directory");
    assert!(
        binary.exists(),
        "{} is missing: run `cargo build -p mock-engine` (cargo test --workspace builds it)",
        binary.display()
    );
    binary
}

/// Two engines `a` and `b` and a gateway in front of them, `[resume]` as `resume` says.
async fn fleet(resume: impl FnOnce(&mut GatewayConfig)) -> (Engine, Engine, GatewayHandle) {
    let a = Engine::start("a").await;
    let b = Engine::start("b").await;
    let mut config = gateway_config(vec![a.backend.clone(), b.backend.clone()]);
    config.resume.enabled = true;
    resume(&mut config);
    let gateway = gateway::start(config).await.expect("gateway starts");
    (a, b, gateway)
}

/// A streamed chat request of `MAX_TOKENS` tokens with a usage block, plus `extra` fields.
fn chat(extra: Value) -> String {
    let mut body = serde_json::json!({
        "model": MOCK_MODEL,
        "messages": [{"role": "user", "content": "tell me about the prefix cache"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    body.to_string()
}

/// A streamed completion of `MAX_TOKENS` tokens (no usage asked for), plus `extra` fields.
fn completion(extra: Value) -> String {
    let mut body = serde_json::json!({
        "model": MOCK_MODEL,
        "prompt": "once upon a time",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": true,
        "stream": true,
    });
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    body.to_string()
}

/// A stream being read by the test as a client reads it.
struct Reading {
    pod: String,
    body: Incoming,
    text: String,
}

impl Reading {
    async fn start(
        client: &Client,
        gateway: &GatewayHandle,
        path: &str,
        headers: &[(&str, &str)],
        body: String,
    ) -> Reading {
        let response = client.post_streaming(gateway, path, headers, body).await;
        assert_eq!(response.status(), 200);
        let pod = response.headers()["target-pod"]
            .to_str()
            .unwrap()
            .to_owned();
        Reading {
            pod,
            body: response.into_body(),
            text: String::new(),
        }
    }

    /// Reads until `count` events have arrived (bounded).
    async fn read_events(&mut self, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while sse_events(&self.text).len() < count {
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .expect("events within 30 s")
                .expect("the stream goes on")
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.text.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// Reads to the end (bounded); the whole stream.
    async fn finish(mut self) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while let Some(frame) = tokio::time::timeout_at(deadline, self.body.frame())
            .await
            .expect("the stream ends within 60 s")
        {
            if let Ok(data) = frame.expect("no broken stream").into_data() {
                self.text.push_str(&String::from_utf8_lossy(&data));
            }
        }
        self.text
    }
}

/// The JSON payloads of a stream's events (`[DONE]` left out).
fn payloads(text: &str) -> Vec<Value> {
    sse_events(text)
        .into_iter()
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("JSON events"))
        .collect()
}

/// Tokens of generated text in a stream: chat deltas with content (not the role chunk), or
/// completion texts.
fn token_chunks(payloads: &[Value]) -> usize {
    payloads
        .iter()
        .filter(|p| {
            let choice = &p["choices"][0];
            choice["text"].is_string()
                || (choice["delta"]["content"].is_string() && choice["delta"]["role"].is_null())
        })
        .count()
}

/// The engine with `name`.
fn named<'a>(name: &str, a: &'a mut Engine, b: &'a mut Engine) -> &'a mut Engine {
    if a.backend.name == name { a } else { b }
}

async fn resumes(client: &Client, gateway: &GatewayHandle, outcome: &str) -> f64 {
    let metrics = client.metrics(gateway).await;
    sample_value(
        &metrics,
        &format!("prefixgate_stream_resumes_total{{outcome=\"{outcome}\"}}"),
    )
}

async fn outstanding_zero(gateway: &GatewayHandle) {
    wait_until("outstanding back to zero", || {
        gateway.total_outstanding() == 0
    })
    .await;
}

/// The prompt tokens the mock counts for `body`'s messages (its template and tokenizer).
fn prompt_tokens(user: &str) -> u64 {
    let prompt = mock_engine::chat_template::render([("user", user)]);
    mock_engine::tokenizer::count(&prompt) as u64
}

/// Kills the replica of a stream of `path` after 20 events; the client's whole stream.
async fn killed_midway(
    path: &str,
    body: String,
    headers: &[(&str, &str)],
    configure: impl FnOnce(&mut GatewayConfig),
) -> (String, Client, GatewayHandle) {
    let (mut a, mut b, gateway) = fleet(configure).await;
    let client = Client::new();
    let mut reading = Reading::start(&client, &gateway, path, headers, body).await;
    reading.read_events(20).await;
    named(&reading.pod.clone(), &mut a, &mut b).kill().await;
    let text = reading.finish().await;
    outstanding_zero(&gateway).await;
    (text, client, gateway)
}

#[tokio::test]
async fn a_chat_stream_whose_replica_is_killed_completes_on_the_other() {
    let (text, client, gateway) =
        killed_midway("/v1/chat/completions", chat(Value::Null), &[], |_| {}).await;
    let events = payloads(&text);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(text.matches("data: [DONE]").count(), 1, "one [DONE]");
    assert!(
        events.iter().all(|e| e["error"].is_null()),
        "no error: {text}"
    );
    let ids: std::collections::BTreeSet<_> = events.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one id: {ids:?}");
    let created: std::collections::BTreeSet<_> =
        events.iter().map(|e| e["created"].to_string()).collect();
    assert_eq!(created.len(), 1, "one created: {created:?}");
    let roles = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"].is_string())
        .count();
    assert_eq!(roles, 1, "one role chunk");
    assert_eq!(token_chunks(&events), MAX_TOKENS as usize, "every token");
    let usages: Vec<_> = events.iter().filter(|e| e["usage"].is_object()).collect();
    assert_eq!(usages.len(), 1, "one usage block");
    let usage = &usages[0]["usage"];
    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "{usage}");
    // The continuation's prompt was the client's plus exactly the text it had been sent (the
    // mock tokenizes generated text back to its tokens): less that text, it is the
    // client's prompt again.
    let prompt = prompt_tokens("tell me about the prefix cache");
    assert_eq!(usage["prompt_tokens"], prompt, "{usage}");
    assert_eq!(usage["total_tokens"], prompt + MAX_TOKENS, "{usage}");
    let finish = events
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"].is_string())
        .count();
    assert_eq!(finish, 1, "one finish_reason");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_completion_stream_whose_replica_is_killed_completes_on_the_other() {
    let body = completion(serde_json::json!({"stream_options": {"include_usage": true}}));
    let (text, client, gateway) = killed_midway("/v1/completions", body, &[], |_| {}).await;
    let events = payloads(&text);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let ids: std::collections::BTreeSet<_> = events.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "one id: {ids:?}");
    assert_eq!(token_chunks(&events), MAX_TOKENS as usize);
    let usage = &events.iter().find(|e| e["usage"].is_object()).unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "{usage}");
    assert_eq!(usage["prompt_tokens"], 4, "the client's prompt: {usage}");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    gateway.shutdown().await;
}

/// A replica that hangs mid-stream (sends nothing more, its connection open) is left at the
/// idle limit and the stream carries on on the other replica, which joined after the stream
/// began so that the first attempt could only go to the hung one.
#[tokio::test]
async fn a_stream_whose_replica_hangs_is_resumed_at_the_idle_limit() {
    let hung = Engine::start_with("hung", &["--fail", "stall-after=20"]).await;
    let well = Engine::start("well").await;
    let mut config = gateway_config(vec![hung.backend.clone()]);
    config.resume.enabled = true;
    config.upstream.idle_timeout_ms = 1000;
    let gateway = gateway::start(config).await.expect("gateway starts");
    let client = Client::new();
    let mut reading = Reading::start(
        &client,
        &gateway,
        "/v1/chat/completions",
        &[],
        chat(Value::Null),
    )
    .await;
    assert_eq!(reading.pod, "hung");
    reading.read_events(5).await;
    let joined = client
        .call(
            "POST",
            &format!("http://{}/admin/replicas", gateway.metrics_addr()),
            &[("content-type", "application/json")],
            serde_json::json!({"name": "well", "url": well.backend.url, "model": MOCK_MODEL})
                .to_string(),
        )
        .await;
    assert_eq!(joined.status, 201, "{}", joined.text());
    wait_until("the other replica is ready", || {
        gateway
            .replicas()
            .iter()
            .any(|(name, _, ready)| name == "well" && *ready)
    })
    .await;
    let text = reading.finish().await;
    let events = payloads(&text);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(
        events.iter().all(|e| e["error"].is_null()),
        "no error: {text}"
    );
    assert_eq!(token_chunks(&events), MAX_TOKENS as usize, "every token");
    let usage = &events.iter().find(|e| e["usage"].is_object()).unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], MAX_TOKENS, "{usage}");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    outstanding_zero(&gateway).await;
    gateway.shutdown().await;
}

/// The gateway asks the engine for its running count (`continuous_usage_stats`) to size a
/// continuation; a client that asked for no usage sees none, before the break or after.
#[tokio::test]
async fn a_resumed_stream_shows_no_usage_the_client_did_not_ask_for() {
    let body = completion(Value::Null);
    let (text, client, gateway) = killed_midway("/v1/completions", body, &[], |_| {}).await;
    let events = payloads(&text);
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(token_chunks(&events), MAX_TOKENS as usize);
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "no usage: {text}"
    );
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    gateway.shutdown().await;
}

/// A client that asked for the running count gets it in every chunk, counting on across the
/// break as one answer's: 0 in the role chunk, then 1, 2, … `MAX_TOKENS`.
#[tokio::test]
async fn a_running_count_the_client_asked_for_counts_on_across_the_break() {
    let body = chat(serde_json::json!({
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    }));
    let (text, client, gateway) = killed_midway("/v1/chat/completions", body, &[], |_| {}).await;
    let events = payloads(&text);
    let counts: Vec<u64> = events
        .iter()
        .filter(|e| !e["choices"].as_array().is_some_and(Vec::is_empty))
        .map(|e| {
            e["usage"]["completion_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("a running count: {e}"))
        })
        .collect();
    let expected: Vec<u64> = (0..=MAX_TOKENS).collect();
    assert_eq!(counts, expected, "{text}");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    gateway.shutdown().await;
}

/// The stream ended with the gateway's SSE error event and `[DONE]`, cut short.
#[track_caller]
fn assert_clean_error(text: &str, message: &str) {
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = payloads(text);
    let last = events.last().expect("events");
    let error = last["error"]["message"].as_str().unwrap_or_default();
    assert!(
        error.contains(message),
        "an error event naming {message:?}: {last}"
    );
    assert!(token_chunks(&events) < MAX_TOKENS as usize, "cut short");
}

#[tokio::test]
async fn with_resume_off_a_killed_replica_ends_the_stream_with_an_sse_error() {
    let (text, client, gateway) =
        killed_midway("/v1/chat/completions", chat(Value::Null), &[], |config| {
            config.resume.enabled = false
        })
        .await;
    assert_clean_error(&text, "failed mid-response");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 0.0);
    // The header turns it off for one request when the setting is on, too.
    let (text, _, gateway) = killed_midway(
        "/v1/chat/completions",
        chat(Value::Null),
        &[("x-prefixgate-resume", "off")],
        |_| {},
    )
    .await;
    assert_clean_error(&text, "failed mid-response");
    gateway.shutdown().await;
}

#[tokio::test]
async fn requests_a_continuation_would_change_are_not_resumed() {
    for extra in [
        serde_json::json!({"logprobs": true, "top_logprobs": 1}),
        serde_json::json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
    ] {
        let (text, client, gateway) =
            killed_midway("/v1/chat/completions", chat(extra.clone()), &[], |_| {}).await;
        assert_clean_error(&text, "failed mid-response");
        assert_eq!(resumes(&client, &gateway, "resumed").await, 0.0, "{extra}");
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn a_stream_that_breaks_again_past_its_resume_budget_ends_with_an_sse_error() {
    let (mut a, mut b, gateway) = fleet(|config| config.resume.max_resumes = 1).await;
    let client = Client::new();
    let mut reading = Reading::start(
        &client,
        &gateway,
        "/v1/chat/completions",
        &[],
        chat(Value::Null),
    )
    .await;
    reading.read_events(20).await;
    let first = reading.pod.clone();
    named(&first, &mut a, &mut b).kill().await;
    // The continuation streams from the other replica; then that one dies too.
    reading.read_events(60).await;
    let other = if first == "a" { "b" } else { "a" };
    named(other, &mut a, &mut b).kill().await;
    let text = reading.finish().await;
    assert_clean_error(&text, "1 resumes are used up");
    assert_eq!(resumes(&client, &gateway, "resumed").await, 1.0);
    assert_eq!(resumes(&client, &gateway, "exhausted").await, 1.0);
    outstanding_zero(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_client_that_leaves_during_a_resume_leaves_nothing_outstanding() {
    let (mut a, mut b, gateway) = fleet(|_| {}).await;
    let client = Client::new();
    // Each attempt waits a second in the engine before its first token, so the client
    // leaves while the continuation waits on the other replica.
    let headers = [("x-mock-fail", "slow-start=2")];
    let mut reading = Reading::start(
        &client,
        &gateway,
        "/v1/chat/completions",
        &headers,
        chat(Value::Null),
    )
    .await;
    reading.read_events(20).await;
    let first = reading.pod.clone();
    named(&first, &mut a, &mut b).kill().await;
    let other = if first == "a" { "b" } else { "a" };
    wait_until("the continuation holds the other replica", || {
        gateway
            .outstanding()
            .iter()
            .any(|(pod, n)| pod == other && *n == 1)
    })
    .await;
    drop(reading);
    outstanding_zero(&gateway).await;
    gateway.shutdown().await;
}
