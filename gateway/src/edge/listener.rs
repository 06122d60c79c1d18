//! The accept loop: HTTP/1.1 and HTTP/2 connections with TCP_NODELAY, optionally behind TLS,
//! each served in its own task, with a graceful drain that the gateway can cut short.
//!
//! Protocols: in cleartext, hyper-util's `auto` builder reads the first bytes and serves
//! HTTP/1.1 or prior-knowledge HTTP/2 (h2c) on the same port. Behind TLS the protocol is the
//! one ALPN chose (`h2` or `http/1.1`; a client offering neither is sniffed as in cleartext).
//! The TLS handshake runs inside the connection's task under [`HANDSHAKE_TIMEOUT`], so a
//! client that stalls or speaks plain HTTP to the TLS port costs one task, never the loop.
//!
//! axum's own `serve` detaches connection tasks, so a drain could not be cut at its deadline;
//! here the connections live in a [`JoinSet`] owned by the accept task. On stop the loop
//! stops accepting, asks every connection to finish its in-flight responses and close
//! (HTTP/2: GOAWAY), and waits for them; aborting the task (at the end of the grace period)
//! drops the set, which aborts every connection, drops their response bodies and so
//! releases their outstanding guards. HTTP/2 runs each stream in a task of its own; when its
//! connection is dropped, h2 closes every stream and hyper's stream task then ends and drops
//! its response body (`gateway/tests/listener_protocols.rs` checks that the upstream request
//! is released).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::edge::half_close::{Exchanges, HalfCloseIo};
use crate::edge::head_guard::{HeadGuard, HeadVerdicts};
use crate::edge::head_limits;
use crate::request::parse::linger;

/// A client that sends no complete request head for this long is disconnected. For HTTP/2
/// (which has no per-head timer) it bounds the wait for the connection's first request.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A TLS handshake that has not finished in this long is abandoned.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// An idle HTTP/2 connection is pinged this often, and closed when a ping goes unanswered
/// for as long: a client that vanished without closing is noticed.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener`, over TLS when `tls` is given, until `stop` turns true,
/// then drains.
pub fn spawn(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        let for_connections = stop.clone();
        // An error means the handle is gone: stop too.
        let stopping = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        // Streamed tokens are small writes; Nagle would hold them back.
                        if let Err(error) = tcp.set_nodelay(true) {
                            tracing::debug!(%error, "cannot set TCP_NODELAY");
                        }
                        connections.spawn(serve_connection(
                            tcp,
                            peer,
                            router.clone(),
                            tls.clone(),
                            for_connections.clone(),
                        ));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                },
                () = &mut stopping => break,
            }
            // Reap finished connections so the set does not grow with the connection count.
            while connections.try_join_next().is_some() {}
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    })
}

/// Which protocols a connection may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocols {
    /// Sniffed from the first bytes: HTTP/1.1 or the HTTP/2 connection preface.
    Either,
    Http1,
    Http2,
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    router: Router,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let stopping = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopping);
    let Some(acceptor) = tls else {
        return serve_http(tcp, peer, Protocols::Either, router, stopping).await;
    };
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
    let stream = tokio::select! {
        result = handshake => match result {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(%error, "TLS handshake failed");
                return;
            }
            Err(_elapsed) => {
                let timeout_secs = HANDSHAKE_TIMEOUT.as_secs();
                tracing::debug!(timeout_secs, "TLS handshake timed out");
                return;
            }
        },
        // Nothing is in flight yet: a stopping gateway just closes the socket.
        () = &mut stopping => return,
    };
    let protocols = match stream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Protocols::Http2,
        Some(b"http/1.1") => Protocols::Http1,
        _ => Protocols::Either,
    };
    serve_http(stream, peer, protocols, router, stopping).await;
}

async fn serve_http<I>(
    stream: I,
    peer: SocketAddr,
    protocols: Protocols,
    router: Router,
    mut stopping: std::pin::Pin<&mut impl Future<Output = ()>>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let exchanges = Arc::new(Exchanges::default());
    let verdicts = Arc::new(HeadVerdicts::default());
    let service = {
        let exchanges = Arc::clone(&exchanges);
        let verdicts = Arc::clone(&verdicts);
        hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            // The client's address, for `x-forwarded-for` (axum's extractor type).
            request.extensions_mut().insert(ConnectInfo(peer));
            let exchange = exchanges.dispatch(&request);
            // A refused head's stand-in: answered with the error, and the connection closes.
            let stand_in = exchange
                .as_ref()
                .and_then(|exchange| verdicts.refusal(exchange.number()));
            // The head guard judged HTTP/1 heads against the limits already.
            let unjudged = request.version() == http::Version::HTTP_2 || verdicts.unjudged();
            let refused = if unjudged {
                head_limits::check(request.headers()).err()
            } else {
                None
            };
            let router = router.clone();
            async move {
                if let Some(error) = stand_in {
                    let mut response = error.into_response();
                    response.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                    return Ok(response);
                }
                if let Some(error) = refused {
                    // Read and drop the body, so the client reads the 431 (as after a 413).
                    linger(Body::new(request.into_body()));
                    return Ok(error.into_response());
                }
                let Some(exchange) = exchange else {
                    return router.oneshot(request.map(Body::new)).await;
                };
                let request = request.map(|body| Body::new(exchange.request_body(body)));
                let response = router.oneshot(request).await?;
                Ok(response.map(|body| Body::new(exchange.response_body(body))))
            }
        })
    };
    // No hyper half_close: HalfCloseIo holds back the end of a client's input while its
    // HTTP/1.1 exchange is in flight and probes for a client that left, which hyper's
    // half_close would notice only at the first response byte (docs/GATEWAY.md, "What each
    // connection gets").
    // HTTP/1 heads are judged before hyper reads them (head_guard), HTTP/2 ones in the
    // service above.
    let guard = HeadGuard::new(stream, verdicts, protocols != Protocols::Http2);
    let io = TokioIo::new(HalfCloseIo::new(guard, Arc::clone(&exchanges)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper's default header slot count (100) is the gateway's limit, judged first by
        // the head guard in OpenAI JSON; unlike a larger count, it needs no allocation.
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE)
        .keep_alive_timeout(H2_KEEP_ALIVE);
    let builder = match protocols {
        Protocols::Either => builder,
        Protocols::Http1 => builder.http1_only(),
        Protocols::Http2 => builder.http2_only(),
    };
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    // Bounds the wait for a first request where hyper has no timer of its own: the bytes
    // that tell HTTP/1 from HTTP/2, and an HTTP/2 connection that never opens a stream.
    let first_request = tokio::time::sleep(HEADER_READ_TIMEOUT);
    tokio::pin!(first_request);
    let mut waiting_for_first = true;
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            () = &mut stopping, if !draining => {
                draining = true;
                // Finish the responses in flight, then close (HTTP/2: GOAWAY).
                connection.as_mut().graceful_shutdown();
            }
            () = &mut first_request, if waiting_for_first => {
                waiting_for_first = false;
                if !exchanges.any_dispatched() {
                    tracing::debug!("no request within the header read timeout; closing");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener on port 0 serving `GET /` with "ok".
    async fn listening(tls: Option<TlsAcceptor>) -> (std::net::SocketAddr, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (stop, stopped) = watch::channel(false);
        spawn(listener, router, tls, stopped);
        (addr, stop)
    }

    /// Reads until the server closes the connection; returns how long that took (virtual
    /// time: the clock is paused and jumps to each timer when nothing else can run).
    async fn closed_after(tcp: &mut TcpStream) -> Duration {
        let start = tokio::time::Instant::now();
        let mut buffer = [0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(600), async {
            while tcp.read(&mut buffer).await.unwrap_or(0) > 0 {}
        });
        read.await.expect("the server never closed the connection");
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_sends_nothing_is_closed_after_the_header_read_timeout() {
        let (addr, _stop) = listening(None).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(closed_after(&mut silent).await >= HEADER_READ_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn an_h2_connection_that_opens_no_stream_is_closed_after_the_header_read_timeout() {
        let (addr, _stop) = listening(None).await;
        let tcp = TcpStream::connect(addr).await.unwrap();
        // A real client: it answers the server's keep-alive pings, so only the first-request
        // timer can close this connection.
        let (_sender, connection) = hyper::client::conn::http2::handshake::<
            _,
            _,
            http_body_util::Empty<bytes::Bytes>,
        >(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
        let start = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(600), connection)
            .await
            .expect("the server never closed the connection")
            .ok();
        assert!(start.elapsed() >= HEADER_READ_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_sent_a_request_outlives_the_first_request_timer() {
        let (addr, _stop) = listening(None).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut answer = [0u8; 512];
        // Requests 20 s apart: each within hyper's idle limit, the last one after the
        // first-request timer (30 s) has fired.
        for round in 0..3 {
            if round > 0 {
                tokio::time::sleep(HEADER_READ_TIMEOUT * 2 / 3).await;
            }
            client
                .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .unwrap();
            let n = client.read(&mut answer).await.unwrap();
            assert!(
                answer[..n].starts_with(b"HTTP/1.1 200"),
                "round {round}: {:?}",
                &answer[..n]
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_tls_handshake_is_abandoned_after_the_handshake_timeout() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        let (addr, _stop) = listening(Some(TlsAcceptor::from(Arc::new(config)))).await;
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        // The first bytes of a ClientHello record, then nothing.
        stalled
            .write_all(&[0x16, 0x03, 0x01, 0x00, 0x40])
            .await
            .unwrap();
        let waited = closed_after(&mut stalled).await;
        assert!(
            (HANDSHAKE_TIMEOUT..HEADER_READ_TIMEOUT).contains(&waited),
            "{waited:?}"
        );
    }
}
