//! The per-request cost of the wrappers between hyper and a connection's stream: the
//! half-close wrapper (`HalfCloseIo`), the head guard (`HeadGuard`), and both as the listener
//! stacks them, each against the bare stream in the same run. Results and the command go in
//! `docs/PERFORMANCE.md`.
//!
//! One iteration is one keep-alive HTTP/1.1 exchange on an in-memory duplex: the client
//! writes a chat-sized request (a 1 KiB JSON body, the usual headers), hyper's server parses
//! it, the service reads the body and answers `ok`, and the client reads the whole response.
//! The service does what the listener's does for each wrapper: counts the request among the
//! connection's exchanges and wraps its bodies (half-close), asks whether it stands in for a
//! refused head (head guard). One single-threaded runtime, so the figure is CPU, not waiting.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use gateway::{Exchanges, HalfCloseIo, HeadGuard, HeadVerdicts};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

/// Which wrappers sit between hyper and the stream.
#[derive(Debug, Clone, Copy)]
enum Stack {
    Bare,
    HalfClose,
    HeadGuard,
    Both,
}

fn request() -> Vec<u8> {
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}],"max_tokens":8}}"#,
        "word ".repeat(200)
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway:8080\r\nuser-agent: OpenAI/Python 1.54.0\r\n\
         accept: application/json\r\ncontent-type: application/json\r\n\
         authorization: Bearer sk-0123456789abcdef\r\nx-request-id: 0f8fad5b-d9cb-469f-a165-70867728950e\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves one connection on `io` with `stack` until the client goes.
async fn serve(io: DuplexStream, stack: Stack) {
    let exchanges = Arc::new(Exchanges::default());
    let verdicts = Arc::new(HeadVerdicts::default());
    let half_close = matches!(stack, Stack::HalfClose | Stack::Both);
    let guarded = matches!(stack, Stack::HeadGuard | Stack::Both);
    let service = {
        let exchanges = Arc::clone(&exchanges);
        let verdicts = Arc::clone(&verdicts);
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let exchange = half_close.then(|| exchanges.dispatch(&request)).flatten();
            if guarded {
                let number = exchange.as_ref().map_or(1, |e| e.number());
                assert!(verdicts.refusal(number).is_none());
            }
            async move {
                let body = match &exchange {
                    Some(exchange) => exchange.request_body(request.into_body()).collect().await,
                    None => request.into_body().collect().await,
                };
                std::hint::black_box(body.expect("a whole body").to_bytes());
                let answer = Full::new(Bytes::from_static(b"ok"));
                let response = match exchange {
                    Some(exchange) => http::Response::new(exchange.response_body(answer).boxed()),
                    None => http::Response::new(answer.boxed()),
                };
                Ok::<_, Infallible>(response)
            }
        })
    };
    let io: Box<dyn Io> = match stack {
        Stack::Bare => Box::new(io),
        Stack::HalfClose => Box::new(HalfCloseIo::new(io, exchanges)),
        Stack::HeadGuard => Box::new(HeadGuard::new(io, verdicts, true)),
        Stack::Both => Box::new(HalfCloseIo::new(
            HeadGuard::new(io, verdicts, true),
            exchanges,
        )),
    };
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), service)
        .await;
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

fn exchanges(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let request = request();
    let mut group = c.benchmark_group("edge_io_exchange");
    for stack in [Stack::Bare, Stack::HalfClose, Stack::HeadGuard, Stack::Both] {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        rt.spawn(serve(server, stack));
        // The response's length, from a first exchange (hyper's date header keeps it fixed).
        let first = rt.block_on(async {
            client
                .write_all(&request)
                .await
                .expect("the request written");
            let mut first = Vec::new();
            let mut buf = [0u8; 4096];
            while !first.ends_with(b"\r\n\r\nok") {
                let n = client.read(&mut buf).await.expect("the response read");
                assert!(n > 0, "{stack:?}: the server closed");
                first.extend_from_slice(&buf[..n]);
            }
            first
        });
        assert!(first.starts_with(b"HTTP/1.1 200 OK"), "{stack:?}");
        let mut answer = vec![0u8; first.len()];
        group.bench_function(format!("{stack:?}"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    client
                        .write_all(&request)
                        .await
                        .expect("the request written");
                    client
                        .read_exact(&mut answer)
                        .await
                        .expect("the response read");
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, exchanges);
criterion_main!(benches);
