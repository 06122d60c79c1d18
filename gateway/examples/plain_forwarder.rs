//! The fair ceiling for a proxy on this machine: a minimal hyper HTTP/1 forwarder with no
//! routing, no parsing, no metrics and no guards, measured beside prefixgate.
//!
//! Every request body is read whole (as prefixgate must, to route by the prompt) and sent to
//! one upstream through hyper-util's pooled client (TCP_NODELAY both sides, like
//! prefixgate); the upstream's response streams back unchanged. Whatever prefixgate costs beyond this forwarder is prefixgate's own work;
//! what both cost beyond a direct connection is the second hop's socket work. It prints
//! `forwarder http://ADDR` once listening. Run with:
//!
//! ```sh
//! cargo run --release -p gateway --example plain_forwarder -- LISTEN_ADDR UPSTREAM_ADDR
//! ```
//!
//! Given several upstreams it is the round-robin splitter in front of several gateways
//! (docs/CLUSTER.md, "Live"): each request goes to the next upstream in turn, as a Service
//! would spread requests (per request, not per connection, so a client's keep-alive pool does
//! not pin it to one gateway).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use http::uri::{Authority, Scheme, Uri};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Upstream = Client<HttpConnector, Full<Bytes>>;
type Answer = Response<BoxBody<Bytes, hyper::Error>>;

async fn forward(
    client: Upstream,
    upstream: Authority,
    request: Request<Incoming>,
) -> Result<Answer, std::convert::Infallible> {
    let (mut parts, body) = request.into_parts();
    let mut uri = parts.uri.into_parts();
    uri.scheme = Some(Scheme::HTTP);
    uri.authority = Some(upstream);
    parts.uri = match Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    parts.headers.remove(http::header::HOST);
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    match client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(_) => Ok(status(StatusCode::BAD_GATEWAY)),
    }
}

fn status(code: StatusCode) -> Answer {
    let mut response = Response::new(
        http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = code;
    response
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: plain_forwarder LISTEN_ADDR UPSTREAM_ADDR [UPSTREAM_ADDR...]";
    let listen: SocketAddr = args
        .next()
        .context(usage)?
        .parse()
        .context("LISTEN_ADDR must be HOST:PORT")?;
    let upstreams: Vec<Authority> = args
        .map(|arg| arg.parse().context("UPSTREAM_ADDR must be HOST:PORT"))
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(!upstreams.is_empty(), usage);
    let upstreams: Arc<[Authority]> = upstreams.into();
    let turn = Arc::new(AtomicUsize::new(0));
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("forwarder http://{}", listener.local_addr()?);
    loop {
        let (tcp, _) = listener.accept().await.context("accept failed")?;
        tcp.set_nodelay(true)?;
        let client = client.clone();
        let (upstreams, turn) = (Arc::clone(&upstreams), Arc::clone(&turn));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let next = turn.fetch_add(1, Ordering::Relaxed) % upstreams.len();
                forward(client.clone(), upstreams[next].clone(), request)
            });
            // A client that goes away mid-request is not this forwarder's concern.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}
