//! Request heads hyper cannot take, answered by the gateway in OpenAI JSON over a raw socket:
//! an unparseable request line or header line, invalid or conflicting `content-length` /
//! `transfer-encoding`, a target too long (414), too many header fields (431), each with
//! `connection: close` and a clean close; and well-formed requests (pipelined, chunked,
//! HTTP/2 with prior knowledge) untouched by the head guard that answers them.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prefixgate_tests::{
    MODEL, chat_body, gateway_with_one_upstream, openai_error, raw_answer, shutdown_once_released,
};
use tokio::net::TcpStream;

/// A chat request with `head_lines` (each ending in CRLF) and `body` as given.
fn chat_with(head_lines: &str, body: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n{head_lines}\r\n{body}"
    )
}

/// Checks a raw answer is the OpenAI error `code` with `status`, closing the connection.
fn assert_refused(what: &str, head: &str, body: &str, status: u16, code: &str) {
    assert!(
        head.starts_with(&format!("HTTP/1.1 {status} ")),
        "{what}: {head}\r\n\r\n{body}"
    );
    assert!(
        head.to_ascii_lowercase().contains("\r\nconnection: close"),
        "{what}: {head}"
    );
    let error = openai_error(head, body);
    assert_eq!(error["code"], code, "{what}: {body}");
    assert_eq!(error["type"], "invalid_request_error", "{what}: {body}");
}

#[tokio::test]
async fn each_malformed_head_gets_an_openai_error_and_a_clean_close() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let body = chat_body("hi", false);
    let len = body.len();
    let long_target = format!("/v1/models?q={}", "a".repeat(70_000));
    let fields = |n: usize| -> String { (0..n).map(|i| format!("x-h{i}: v\r\n")).collect() };
    let cases = [
        (
            "an unparseable request line",
            "GET /v1/models HTTX/1.1\r\nhost: gw\r\n\r\n".to_owned(),
            400,
            "invalid_request_head",
        ),
        (
            "an unparseable header line",
            chat_with(
                &format!("no colon here\r\ncontent-length: {len}\r\n"),
                &body,
            ),
            400,
            "invalid_request_head",
        ),
        (
            "two different content-lengths",
            chat_with(
                &format!("content-length: {len}\r\ncontent-length: 3\r\n"),
                &body,
            ),
            400,
            "invalid_request_head",
        ),
        (
            "an invalid content-length",
            chat_with("content-length: 12abc\r\n", &body),
            400,
            "invalid_request_head",
        ),
        (
            "a transfer-encoding not ending in chunked",
            chat_with("transfer-encoding: chunked, gzip\r\n", &body),
            400,
            "invalid_request_head",
        ),
        (
            "both content-length and transfer-encoding",
            chat_with(
                &format!(
                    "content-length: {}\r\ntransfer-encoding: chunked\r\n",
                    len + 10
                ),
                &format!("{len:x}\r\n{body}\r\n0\r\n\r\n"),
            ),
            400,
            "invalid_request_head",
        ),
        (
            "a 70 000-byte target",
            format!("GET {long_target} HTTP/1.1\r\nhost: gw\r\n\r\n"),
            414,
            "uri_too_long",
        ),
        (
            "401 header fields",
            chat_with(&format!("{}content-length: {len}\r\n", fields(400)), &body),
            431,
            "headers_too_large",
        ),
        (
            "101 header fields",
            chat_with(&format!("{}content-length: {len}\r\n", fields(100)), &body),
            431,
            "headers_too_large",
        ),
    ];
    for (what, request, status, code) in cases {
        let (head, body) = raw_answer(&gateway, request.as_bytes()).await;
        assert_refused(what, &head, &body, status, code);
    }
    assert_eq!(a.requests(), 0, "nothing forwarded");
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn a_malformed_head_after_pipelined_requests_is_answered_after_them() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let body = chat_body("hi", false);
    let mut pipelined = chat_with(&format!("content-length: {}\r\n", body.len()), &body);
    pipelined += &chat_with(
        "transfer-encoding: chunked\r\n",
        &format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len()),
    );
    pipelined += "GET /v1/models HTTP/1.1\r\nhost: gw\r\nbad header\r\n\r\n";
    pipelined += "GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n";
    let (head, rest) = raw_answer(&gateway, pipelined.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let answers: Vec<&str> = rest.split("HTTP/1.1 ").collect();
    assert_eq!(answers.len(), 3, "two more answers: {rest}");
    assert!(
        answers[1].starts_with("200 "),
        "the chunked chat: {}",
        answers[1]
    );
    let (last_head, last_body) = answers[2].split_once("\r\n\r\n").unwrap();
    assert_refused(
        "a bad header line after two requests",
        &format!("HTTP/1.1 {last_head}"),
        last_body,
        400,
        "invalid_request_head",
    );
    assert_eq!(
        a.requests(),
        2,
        "the two chats, nothing after the refused head"
    );
    shutdown_once_released(gateway).await;
}

#[tokio::test]
async fn well_formed_requests_pass_untouched_pipelined_chunked_and_over_h2c() {
    let (a, gateway) = gateway_with_one_upstream().await;
    let body = chat_body("hi", false);
    // A chunked body cut into uneven chunks, with an extension and a trailer.
    let (one, two) = body.split_at(7);
    let chunked = format!(
        "{:x};ext=1\r\n{one}\r\n{:X}\r\n{two}\r\n0\r\nx-trailer: t\r\n\r\n",
        one.len(),
        two.len()
    );
    let mut pipelined = chat_with(&format!("content-length: {}\r\n", body.len()), &body);
    pipelined += &chat_with("transfer-encoding: chunked\r\n", &chunked);
    // 100 fields: at the limit, not over it.
    let fields: String = (0..98).map(|i| format!("x-h{i}: v\r\n")).collect();
    pipelined +=
        &format!("GET /v1/models HTTP/1.1\r\nhost: gw\r\n{fields}connection: close\r\n\r\n");
    let (head, rest) = raw_answer(&gateway, pipelined.as_bytes()).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let statuses: Vec<&str> = rest.split("HTTP/1.1 ").skip(1).map(|a| &a[..3]).collect();
    assert_eq!(statuses, ["200", "200"], "{rest}");
    assert!(rest.contains(MODEL), "the model list: {rest}");
    let seen = a.seen.bodies.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "both chats forwarded");
    for forwarded in &seen {
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(forwarded).unwrap(),
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        );
    }

    // HTTP/2 with prior knowledge on the same port.
    let tcp = TcpStream::connect(gateway.addr()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://{}/v1/chat/completions", gateway.addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!answer.is_empty());
    assert_eq!(a.requests(), 3);
    shutdown_once_released(gateway).await;
}
