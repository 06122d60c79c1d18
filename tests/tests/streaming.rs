//! End-to-end streaming: SSE flows through chunk by chunk, a client that goes away cancels
//! the upstream request, an upstream that fails or stalls mid-stream ends the stream with an
//! OpenAI error event and `[DONE]`, and shutdown lets in-flight streams finish. After each,
//! the outstanding counts return to zero.

use std::time::Duration;

use http_body_util::BodyExt;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, spawn_replica};
use prefixgate_tests::{
    Client, FakeUpstream, MOCK_MODEL, assert_ends_with_done, chat_body, chat_body_for,
    gateway_config, gateway_with_one_upstream, hanging_chat_request, mock_gateway_config,
    openai_error, read_answer, shutdown_once_released, sse_events, wait_outstanding_zero,
    wait_until,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn chunks_arrive_before_the_upstream_finishes() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    // One event, then the upstream keeps the stream open: a proxy that buffered the body
    // would never deliver the event.
    let response = client
        .chat_stream(&gateway, &[("x-fake", "stall:1")], chat_body("hi", true))
        .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: {"), "{first:?}");
    assert_eq!(a.in_flight(), 1, "the upstream is still streaming");
    assert_eq!(gateway.total_outstanding(), 1);
    drop(body);
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_multi_chunk_stream_arrives_whole() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let answer = client
        .chat(&gateway, &[("x-fake", "sse:20:2")], chat_body("hi", true))
        .await;
    assert_eq!(answer.status, 200);
    let events = sse_events(answer.text());
    assert_eq!(events.len(), 21, "20 tokens and [DONE]");
    assert!(events.iter().take(20).all(|e| e.starts_with("data: {")));
    assert_eq!(events[20], "data: [DONE]");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn client_disconnect_cancels_upstream_and_releases() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let response = client
        .chat_stream(
            &gateway,
            &[("x-fake", "sse:1000:20")],
            chat_body("hi", true),
        )
        .await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert_eq!(gateway.total_outstanding(), 1);
    drop(body);
    wait_outstanding_zero(&gateway).await;
    wait_until("the upstream request to be cancelled", || {
        a.in_flight() == 0
    })
    .await;
    assert_eq!(a.requests(), 1);
    gateway.shutdown().await;
}

#[tokio::test]
async fn upstream_failure_mid_stream_becomes_an_error_event_then_done() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let answer = client
        .chat(&gateway, &[("x-fake", "drop:2:50")], chat_body("hi", true))
        .await;
    assert_eq!(answer.status, 200, "the status was sent before the failure");
    let text = answer.text();
    let events = sse_events(text);
    assert_eq!(events.len(), 4, "{text}");
    let error: serde_json::Value =
        serde_json::from_str(events[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "upstream_stream_failed");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replica a")
    );
    assert_eq!(events[3], "data: [DONE]");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn an_upstream_silent_mid_stream_times_out_into_an_error_event() {
    let a = FakeUpstream::start("a").await;
    let mut config = gateway_config(vec![a.backend()]);
    config.upstream.idle_timeout_ms = 200;
    let gateway = gateway::start(config).await.unwrap();
    let client = Client::new();
    let answer = client
        .chat(&gateway, &[("x-fake", "stall:1")], chat_body("hi", true))
        .await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("sent nothing for 200 ms"),
        "{}",
        answer.text()
    );
    assert_ends_with_done(&answer);
    wait_outstanding_zero(&gateway).await;
    wait_until("the stalled upstream request to be cancelled", || {
        a.in_flight() == 0
    })
    .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_in_flight_streams_finish() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let url = gateway.url();
    let client = Client::new();
    let response = client
        .chat_stream(&gateway, &[("x-fake", "sse:5:50")], chat_body("hi", true))
        .await;
    let stopping = tokio::spawn(gateway.shutdown_within(Duration::from_secs(10)));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"), "the stream finished");
    assert_eq!(body.windows(6).filter(|w| w == b"data: ").count(), 6);
    assert!(stopping.await.unwrap(), "drained within the grace period");
    assert!(
        tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn a_stream_cut_by_shutdown_ends_with_an_error_event() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let response = client
        .chat_stream(&gateway, &[("x-fake", "stall:1")], chat_body("hi", true))
        .await;
    let mut body = response.into_body();
    body.frame().await.unwrap().unwrap();
    assert!(!gateway.shutdown_within(Duration::from_millis(100)).await);
    // As a replica failure mid-stream: one error event, `[DONE]`, then the end of the body;
    // the upstream request is cancelled.
    let rest = body.collect().await.expect("the cut stream ends cleanly");
    let rest = rest.to_bytes();
    let text = std::str::from_utf8(&rest).unwrap();
    let events = sse_events(text);
    assert_eq!(events.len(), 2, "{text}");
    let event = events[0].strip_prefix("data: ").expect(text);
    let error: serde_json::Value = serde_json::from_str(event).unwrap();
    assert_eq!(error["error"]["code"], "gateway_shutting_down", "{text}");
    assert_eq!(error["error"]["type"], "overloaded_error", "{text}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("replica a"), "{message}");
    assert_eq!(events[1], "data: [DONE]");
    wait_until("the upstream request to be cancelled", || {
        a.in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn a_request_cut_by_shutdown_before_its_replica_answers_gets_a_503() {
    let (a, gateway) = gateway_with_one_upstream().await;
    // Waiting in the engine's queue: no response headers yet.
    let mut tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    tcp.write_all(hanging_chat_request().as_bytes())
        .await
        .unwrap();
    wait_until("the replica to hold the request", || a.in_flight() == 1).await;
    assert!(!gateway.shutdown_within(Duration::from_millis(100)).await);
    let (head, body) = read_answer(tcp).await;
    let answer = format!("{head}\r\n\r\n{body}");
    assert!(head.starts_with("HTTP/1.1 503 "), "{answer}");
    let error = openai_error(&head, &body);
    assert_eq!(error["code"], "gateway_shutting_down", "{body}");
    assert_eq!(error["type"], "overloaded_error", "{body}");
    assert!(
        error["message"].as_str().unwrap().contains("replica a"),
        "{body}"
    );
    wait_until("the upstream request to be cancelled", || {
        a.in_flight() == 0
    })
    .await;
}

#[tokio::test]
async fn a_mock_engine_abort_mid_stream_ends_with_an_error_event() {
    let gateway = gateway::start(mock_gateway_config(1)).await.unwrap();
    let client = Client::new();
    let answer = client
        .chat(
            &gateway,
            &[("x-mock-fail", "abort-after=2")],
            chat_body_for(MOCK_MODEL, "hello there", true),
        )
        .await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("data: {\"error\":"),
        "{}",
        answer.text()
    );
    assert_ends_with_done(&answer);
    shutdown_once_released(gateway).await;
}

/// The interpreter for the OpenAI Python client tests: `PREFIXGATE_PYTHON`, else `python3`.
/// These tests are `#[ignore]`d so that `cargo test --workspace` passes on a machine without
/// the client; `.ci/run` creates a virtual environment, installs `openai` into it and runs
/// them with `--ignored`. Once asked to run, a missing client is a failure, never a skip.
async fn python_with_openai() -> String {
    let python = std::env::var("PREFIXGATE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let check = tokio::process::Command::new(&python)
        .args(["-c", "import openai; print(openai.__version__)"])
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {python} (set PREFIXGATE_PYTHON): {e}"));
    assert!(
        check.status.success(),
        "{python} cannot import openai (pip install openai, or set PREFIXGATE_PYTHON): {}",
        String::from_utf8_lossy(&check.stderr)
    );
    println!(
        "{python}: openai {}",
        String::from_utf8_lossy(&check.stdout).trim()
    );
    python
}

/// Runs a client script with `args`; its stdout, after asserting it succeeded.
async fn run_python(script: &str, args: &[&str]) -> String {
    let python = python_with_openai().await;
    let output = tokio::process::Command::new(python)
        .arg(script)
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The official OpenAI Python client streams a chat completion through the gateway.
#[tokio::test]
#[ignore = "needs Python with the openai package; .ci/run runs it"]
async fn openai_python_client_streams() {
    let gateway = gateway::start(mock_gateway_config(2)).await.unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/openai_stream.py");
    let base = format!("{}/v1", gateway.url());
    let stdout = run_python(script, &[&base, MOCK_MODEL]).await;
    assert!(stdout.contains("target-pod=mock-"), "{stdout}");
    shutdown_once_released(gateway).await;
}

/// The official OpenAI Python client streams a chat completion straight from a mock-engine
/// replica, as from a vLLM pod (issue 3).
#[tokio::test]
#[ignore = "needs Python with the openai package; .ci/run runs it"]
async fn openai_python_client_streams_from_a_mock_engine() {
    let replica = spawn_replica(ReplicaConfig {
        name: "direct".to_owned(),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        model: MOCK_MODEL.to_owned(),
        profile: EngineProfile::builtin("fast").unwrap(),
        time_scale: 10.0,
        failures: FailurePlan::default(),
    })
    .await
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/stream_direct.py");
    let base = format!("http://{}/v1", replica.addr());
    let stdout = run_python(script, &[&base, MOCK_MODEL]).await;
    assert!(stdout.contains("finish=length"), "{stdout}");
    assert!(stdout.contains("unknown model -> 404"), "{stdout}");
    replica.shutdown().await;
}
