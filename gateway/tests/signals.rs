//! The `prefixgate` binary on SIGTERM: it stops accepting, lets the in-flight stream finish,
//! and exits 0. Runs the real binary with one embedded mock engine on port 0.

#![cfg(unix)]
#![expect(
    clippy::unwrap_used,
    reason = "the shared support helpers run only in tests: a panic is a failed assertion"
)]

mod support;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;

use support::binary;

/// Bound on every wait in this test; generous for a loaded CI machine.
const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn sigterm_drains_the_stream_in_flight_and_exits_zero() {
    let running = binary::start(
        &[
            "--mock-engines",
            "1",
            // The L20 profile at 2× takes about 30 ms per token, so the stream below is still
            // running when the signal arrives.
            "--set",
            "embedded.engine_profile=l20-qwen27b-fp8",
            "--set",
            "embedded.time_scale=2",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        false,
    )
    .await;
    let (mut child, addr) = (running.child, running.api);

    // A raw HTTP/1 request, so the test sees exactly what the server sends.
    let mut stream = TcpStream::connect(&addr).await.unwrap();
    let body = r#"{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":32}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut first = [0u8; 12];
    stream.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());

    let mut rest = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut rest))
        .await
        .expect("the stream did not end")
        .unwrap();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("data: [DONE]"),
        "the in-flight stream finished: {text}"
    );
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .expect("prefixgate did not exit")
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
