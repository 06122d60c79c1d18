//! The HTTP edge as a client and a replica see it, through real sockets: which headers cross
//! the gateway (RFC 9110 §7.6.1's hop-by-hop rule, `x-forwarded-for`, the gateway's own
//! routing headers), how a client that half-closes its side is answered and one that left
//! is released.

use std::time::Duration;

use gateway::{HALF_CLOSE_PROBE as PROBE, HALF_CLOSE_PROBE_INTERVAL as PROBE_INTERVAL};
use prefixgate_tests::{
    Client, chat_body, gateway_with_one_upstream, hanging_chat_request, openai_error, raw_answer,
    shutdown_once_released, wait_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn connection_named_headers_and_a_client_s_target_pod_stay_behind() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let client = Client::new();
    let answer = client
        .chat(
            &gateway,
            &[
                ("connection", "x-secret"),
                ("x-secret", "s"),
                ("target-pod", "b"),
                ("target-pod-ip", "10.0.0.9:8000"),
                ("x-forwarded-for", "203.0.113.1"),
                ("x-kept", "k"),
            ],
            chat_body("hi", false),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("target-pod"), Some("a"), "the gateway's own");
    let seen = a.seen.headers.lock().unwrap().clone();
    let headers = &seen[0];
    for gone in ["x-secret", "target-pod", "target-pod-ip"] {
        assert!(headers.get(gone).is_none(), "{gone} forwarded: {headers:?}");
    }
    assert_eq!(headers["x-kept"], "k");
    assert_eq!(headers["x-forwarded-for"], "203.0.113.1, 127.0.0.1");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_client_that_writes_its_whole_oversized_body_still_reads_the_413() {
    let a = prefixgate_tests::FakeUpstream::start("a").await;
    let mut config = prefixgate_tests::gateway_config(vec![a.backend()]);
    config.max_body_bytes = 1024;
    let gateway = gateway::start(config).await.unwrap();
    // Far more than the sockets buffer: the write completes only if the gateway reads it.
    let body = vec![b'x'; 8 * 1024 * 1024];
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body)
        .await
        .expect("the gateway reads the body it refused");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the gateway closes once it has answered")
        .expect("closed without a reset");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body_too_large"), "{answer}");
    shutdown_once_released(gateway).await;
}

/// Sends a chat request over a raw socket with `extra` header lines, shuts the write side
/// (`nc -N`) and reads until the gateway closes.
async fn half_closed_chat(gateway: &gateway::GatewayHandle, stream: bool, extra: &str) -> String {
    let body = chat_body("hi", stream);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         {extra}content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .expect("the gateway closes once it has answered")
        .unwrap();
    String::from_utf8(answer).unwrap()
}

/// The leading probes' count and the response after them.
fn after_probes(answer: &str) -> (usize, &str) {
    let probe = std::str::from_utf8(PROBE).unwrap();
    let response = answer.trim_start_matches(probe);
    ((answer.len() - response.len()) / probe.len(), response)
}

/// A replica that answers a few probe intervals after the request: the gateway has read the
/// end of the client's input long before.
fn late_answer() -> String {
    format!("x-fake-delay: {}\r\n", (PROBE_INTERVAL * 3).as_millis())
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_response() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let answer = half_closed_chat(&gateway, false, &late_answer()).await;
    let (probes, response) = after_probes(&answer);
    assert!(probes >= 1, "{answer}");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(response.contains("\"chat.completion\""), "{answer}");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_whole_stream() {
    let (_a, gateway) = gateway_with_one_upstream().await;
    let extra = format!("{}x-fake: sse:3:50\r\n", late_answer());
    let answer = half_closed_chat(&gateway, true, &extra).await;
    let (probes, response) = after_probes(&answer);
    assert!(probes >= 1, "{answer}");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        !response.contains("100 Continue"),
        "never inside the response: {answer}"
    );
    assert!(response.contains(" t2"), "{answer}");
    assert!(response.contains("data: [DONE]"), "{answer}");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_client_that_closes_while_its_request_waits_in_the_engine_releases_it() {
    // The request waits upstream (never answered); the client closes its socket. The probe
    // draws the closed socket's reset, so the gateway drops the exchange: the replica's
    // request is cancelled and the counts and admission slot come back.
    let a = prefixgate_tests::FakeUpstream::start("a").await;
    let mut config = prefixgate_tests::gateway_config(vec![a.backend()]);
    config.admission.max_in_flight = 8;
    // Longer than the test may take: only the client's leaving ends the wait.
    config.upstream.first_byte_timeout_ms = 600_000;
    let gateway = gateway::start(config).await.unwrap();
    let mut tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    tcp.write_all(hanging_chat_request().as_bytes())
        .await
        .unwrap();
    wait_until("the request waits upstream", || a.in_flight() == 1).await;
    assert_eq!(gateway.total_outstanding(), 1);
    assert_eq!(gateway.admission().in_flight(), 1);
    drop(tcp);
    wait_until("the upstream request is cancelled", || a.in_flight() == 0).await;
    wait_until("the admission slot is back", || {
        gateway.admission().in_flight() == 0
    })
    .await;
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn too_many_or_too_large_headers_get_an_openai_431() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let body = chat_body("hi", false);
    let many: String = (0..200).map(|i| format!("x-h{i}: v\r\n")).collect();
    let large = format!("x-large: {}\r\n", "a".repeat(64 * 1024));
    for (what, extra) in [("200 headers", many), ("one 64 KiB header", large)] {
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
             connection: close\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (head, body) = raw_answer(&gateway, request.as_bytes()).await;
        assert!(head.starts_with("HTTP/1.1 431 "), "{what}: {head}");
        let error = openai_error(&head, &body);
        assert_eq!(error["code"], "headers_too_large", "{what}: {body}");
        assert_eq!(error["type"], "invalid_request_error", "{what}: {body}");
    }
    assert_eq!(a.requests(), 0, "nothing forwarded");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_malformed_chunked_body_gets_an_openai_400() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n\
        content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n";
    let (head, body) = raw_answer(&gateway, request).await;
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    let error = openai_error(&head, &body);
    assert_eq!(error["code"], "invalid_body", "{body}");
    assert!(
        error["message"].as_str().unwrap().contains("chunk size"),
        "{body}"
    );
    assert_eq!(a.requests(), 0, "nothing forwarded");
    shutdown_once_released(gateway).await;
}
