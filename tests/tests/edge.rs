//! The HTTP edge as a client and a replica see it, through real sockets: which headers cross
//! the gateway (RFC 9110 §7.6.1's hop-by-hop rule, `x-forwarded-for`, the gateway's own
//! routing headers) and how a client that half-closes its side is answered.

use std::time::Duration;

use prefixgate_tests::{Client, chat_body, gateway_with_one_upstream, shutdown_once_released};
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
