//! A trivial OpenAI-shaped upstream for overhead measurements: it answers every inference
//! request with the same small body, so what is measured behind it is the proxy, not an
//! engine model.
//!
//! - `POST /v1/*`: the body is read whole; when it contains `"stream":true` the answer is a
//!   short SSE stream (`SSE_EVENTS` chunk events then `data: [DONE]`), sent as separate body
//!   frames, else one fixed chat-completion JSON of about 300 bytes.
//! - `GET /v1/models`: one model, `mock-model`, so a gateway's health round learns it.
//! - `GET /health`, anything else: `200 {}`.
//!
//! It prints `upstream http://ADDR` once listening and serves until killed. Run with:
//!
//! ```sh
//! cargo run --release -p gateway --example fixed_upstream -- [ADDR]   # default 127.0.0.1:0
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context;
use bytes::Bytes;
use futures_util::stream;
use http::{Method, Request, Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Chunk events in a streamed answer (a short completion).
const SSE_EVENTS: usize = 8;

const CHAT_JSON: &str = concat!(
    r#"{"id":"chatcmpl-fixed","object":"chat.completion","created":0,"model":"mock-model","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"#,
    r#""finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"#,
    r#""total_tokens":9}}"#
);

const SSE_EVENT: &str = concat!(
    r#"data: {"id":"chatcmpl-fixed","object":"chat.completion.chunk","created":0,"#,
    r#""model":"mock-model","choices":[{"index":0,"delta":{"content":"tok"}}]}"#,
    "\n\n"
);

const MODELS_JSON: &str =
    r#"{"object":"list","data":[{"id":"mock-model","object":"model","owned_by":"fixed"}]}"#;

type Answer = Response<BoxBody<Bytes, Infallible>>;

fn json(body: &'static str) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn sse() -> Answer {
    let frames = (0..SSE_EVENTS)
        .map(|_| SSE_EVENT)
        .chain(std::iter::once("data: [DONE]\n\n"))
        .map(|text| Ok::<_, Infallible>(Frame::data(Bytes::from_static(text.as_bytes()))));
    let mut response = Response::new(StreamBody::new(stream::iter(frames)).boxed());
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    response
}

async fn answer(request: Request<Incoming>) -> Result<Answer, Infallible> {
    let post = request.method() == Method::POST && request.uri().path().starts_with("/v1/");
    let models = request.uri().path() == "/v1/models";
    if !post {
        return Ok(json(if models { MODELS_JSON } else { "{}" }));
    }
    // A body that fails to arrive is answered like an empty one: this server measures, it
    // does not validate.
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let streamed = body
        .windows(b"\"stream\":true".len())
        .any(|w| w == b"\"stream\":true");
    Ok(if streamed { sse() } else { json(CHAT_JSON) })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".to_owned())
        .parse()
        .context("ADDR must be HOST:PORT")?;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    println!("upstream http://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await.context("accept failed")?;
        tcp.set_nodelay(true)?;
        tokio::spawn(async move {
            let service = hyper::service::service_fn(answer);
            // A client that goes away mid-request is not this server's concern.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
