//! The API listener's protocols end to end, on real sockets on 127.0.0.1 port 0: HTTP/1.1
//! and prior-knowledge HTTP/2 (h2c) on one cleartext port; TLS with ALPN `h2` and
//! `http/1.1` (certificates made at test time with rcgen, trusted by the test's rustls
//! client); a plain-HTTP client on the TLS port; and what HTTP/2 changes for the lifetime of
//! a response: a stream reset by the client releases its pod, a drain lets a stream finish
//! (GOAWAY), and the grace deadline cuts one and releases its upstream request.
//!
//! Replicas are an embedded mock engine, or a small gated replica of this file whose stream
//! waits for the test to open its gate, so no test depends on how fast anything runs. Every
//! wait polls its condition under a bounded deadline.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gateway::config::BackendConfig;
use gateway::{GatewayConfig, GatewayHandle};
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

mod support;

use support::{DEADLINE, MOCK_MODEL, embedded_config, serve_replica, wait_released, wait_until};

const GATED_MODEL: &str = "gated-model";

fn chat(model: &str, stream: bool) -> Bytes {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": 8,
        "stream": stream,
    });
    Bytes::from(body.to_string())
}

fn post(gateway: &GatewayHandle, body: Bytes) -> Request<Full<Bytes>> {
    Request::post(format!("{}/v1/chat/completions", gateway.url()))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap()
}

/// Sends a chat request for `model` on an HTTP/2 connection; its response, body unread.
async fn h2_chat(
    h2: &mut http2::SendRequest<Full<Bytes>>,
    gateway: &GatewayHandle,
    model: &str,
    stream: bool,
) -> Response<Incoming> {
    let request = post(gateway, chat(model, stream));
    within("an HTTP/2 response", h2.send_request(request))
        .await
        .unwrap()
}

/// Sends a non-streamed chat request for [`MOCK_MODEL`] on an HTTP/1.1 connection.
async fn h1_chat(
    h1: &mut http1::SendRequest<Full<Bytes>>,
    gateway: &GatewayHandle,
) -> Response<Incoming> {
    let request = post(gateway, chat(MOCK_MODEL, false));
    within("an HTTP/1.1 response", h1.send_request(request))
        .await
        .unwrap()
}

async fn within<F: std::future::Future>(what: &str, future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {DEADLINE:?}"))
}

/// An HTTP/2 client connection over `io` (prior knowledge, or after ALPN chose h2).
async fn h2_client<I>(io: I) -> http2::SendRequest<Full<Bytes>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// An HTTP/1.1 client connection over `io`.
async fn h1_client<I>(io: I) -> http1::SendRequest<Full<Bytes>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io)).await.unwrap();
    tokio::spawn(connection);
    sender
}

/// Every data frame of a body, in order, until its end.
async fn frames(body: Incoming) -> Vec<Bytes> {
    let mut body = body;
    let mut frames = Vec::new();
    while let Some(frame) = within("the next body frame", body.frame()).await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push(data);
        }
    }
    frames
}

/// The next data frame of a body.
async fn next_data(body: &mut Incoming) -> Bytes {
    loop {
        let frame = within("a body frame", body.frame()).await.unwrap().unwrap();
        if let Ok(data) = frame.into_data() {
            return data;
        }
    }
}

/// Checks a streamed chat answer: several frames, events up to `data: [DONE]`.
fn assert_streamed(frames: &[Bytes]) {
    let text: String = frames
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert!(
        frames.len() > 1,
        "one frame: the stream was buffered: {text}"
    );
    assert!(
        !String::from_utf8_lossy(&frames[0]).contains("[DONE]"),
        "{text}"
    );
    assert!(text.contains("\"choices\""), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
}

async fn assert_ok(response: Response<Incoming>, version: Version) -> serde_json::Value {
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), version);
    assert!(response.headers().contains_key("target-pod"));
    let bytes = within("the body", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_and_http1_share_the_cleartext_port() {
    let gateway = gateway::start(embedded_config(1)).await.unwrap();
    assert!(gateway.url().starts_with("http://"));

    let mut h2 = h2_client(TcpStream::connect(gateway.addr()).await.unwrap()).await;
    let response = h2_chat(&mut h2, &gateway, MOCK_MODEL, false).await;
    let answer = assert_ok(response, Version::HTTP_2).await;
    assert_eq!(answer["object"], "chat.completion");

    let response = h2_chat(&mut h2, &gateway, MOCK_MODEL, true).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    assert_streamed(&frames(response.into_body()).await);

    let mut h1 = h1_client(TcpStream::connect(gateway.addr()).await.unwrap()).await;
    let response = h1_chat(&mut h1, &gateway).await;
    assert_ok(response, Version::HTTP_11).await;

    wait_released(&gateway).await;
    gateway.shutdown().await;
}

/// A self-signed certificate for `localhost`, written as PEM files in a directory of its
/// own, and a rustls client configuration that trusts it.
struct TestCertificate {
    dir: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    roots: Arc<RootCertStore>,
}

impl TestCertificate {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let dir =
            std::env::temp_dir().join(format!("prefixgate-listener-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from(cert.der().to_vec()))
            .unwrap();
        TestCertificate {
            dir,
            cert_file,
            key_file,
            roots: Arc::new(roots),
        }
    }

    fn config(&self) -> GatewayConfig {
        let mut config = embedded_config(1);
        config.tls.cert_file = Some(self.cert_file.clone());
        config.tls.key_file = Some(self.key_file.clone());
        config
    }

    /// A TLS connection to `addr` offering only `alpn`; checks the server agreed to it.
    async fn connect(
        &self,
        addr: SocketAddr,
        alpn: &[u8],
    ) -> tokio_rustls::client::TlsStream<TcpStream> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(Arc::clone(&self.roots))
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let tls = within("TLS handshake", connector.connect(name, tcp))
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        tls
    }
}

impl Drop for TestCertificate {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_h2_and_http1_by_alpn_and_metrics_stay_plain() {
    let certificate = TestCertificate::new("alpn");
    let gateway = gateway::start(certificate.config()).await.unwrap();
    assert!(gateway.url().starts_with("https://"), "{}", gateway.url());

    let tls = certificate.connect(gateway.addr(), b"h2").await;
    let mut h2 = h2_client(tls).await;
    let response = h2_chat(&mut h2, &gateway, MOCK_MODEL, false).await;
    assert_ok(response, Version::HTTP_2).await;
    let response = h2_chat(&mut h2, &gateway, MOCK_MODEL, true).await;
    assert_eq!(response.status(), 200);
    assert_streamed(&frames(response.into_body()).await);

    let tls = certificate.connect(gateway.addr(), b"http/1.1").await;
    let mut h1 = h1_client(tls).await;
    let response = h1_chat(&mut h1, &gateway).await;
    assert_ok(response, Version::HTTP_11).await;

    // The metrics listener is plain HTTP whatever the API listener does.
    let mut plain = h1_client(TcpStream::connect(gateway.metrics_addr()).await.unwrap()).await;
    let scrape = Request::get(format!("http://{}/metrics", gateway.metrics_addr()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = within("metrics", plain.send_request(scrape)).await.unwrap();
    assert_eq!(response.status(), 200);

    wait_released(&gateway).await;
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_http_client_on_the_tls_port_does_not_stop_the_next_tls_client() {
    let certificate = TestCertificate::new("plain");
    let gateway = gateway::start(certificate.config()).await.unwrap();

    // Plain HTTP to the TLS port: the handshake fails and that connection is closed.
    let mut plain = TcpStream::connect(gateway.addr()).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = within(
        "the plain connection to close",
        plain.read_to_end(&mut answer),
    )
    .await;
    assert!(
        !answer.starts_with(b"HTTP/"),
        "TLS port answered plain HTTP: {answer:?}"
    );
    // A client that leaves in the middle of its handshake.
    let mut half = TcpStream::connect(gateway.addr()).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x00, 0x40, 0x01])
        .await
        .unwrap();
    drop(half);
    // And one that says nothing and stays: it must not hold up the others.
    let _silent = TcpStream::connect(gateway.addr()).await.unwrap();

    let tls = certificate.connect(gateway.addr(), b"h2").await;
    let mut h2 = h2_client(tls).await;
    let response = h2_chat(&mut h2, &gateway, MOCK_MODEL, false).await;
    assert_ok(response, Version::HTTP_2).await;
    gateway.shutdown().await;
}

/// A replica serving [`GATED_MODEL`] whose streams send one event, then wait for the gate
/// to open before `[DONE]`; it counts the streams it is still serving, so a test sees when
/// the gateway dropped its upstream request.
struct GatedReplica {
    backend: BackendConfig,
    gate: watch::Sender<bool>,
    streaming: Arc<AtomicUsize>,
}

/// Counts a stream while the replica's response body lives.
struct Streaming(Arc<AtomicUsize>);

impl Drop for Streaming {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl GatedReplica {
    async fn start() -> Self {
        let (gate, opened) = watch::channel(false);
        let streaming = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&streaming);
        let chat = move |headers: http::HeaderMap, version: Version, body: Bytes| {
            let opened = opened.clone();
            let counter = Arc::clone(&counter);
            async move {
                let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
                if request["stream"] != true {
                    // What arrived, so a test can check the upstream hop of an h2 request.
                    let text = |name: &str| headers.get(name).map(|v| v.to_str().unwrap());
                    let answer = serde_json::json!({
                        "object": "chat.completion",
                        "choices": [],
                        "version": format!("{version:?}"),
                        "host": text("host"),
                        "te": text("te"),
                    });
                    return axum::response::Response::new(axum::body::Body::from(
                        answer.to_string(),
                    ));
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let state = (0, opened, Streaming(counter));
                let events =
                    futures_util::stream::unfold(state, |(step, mut opened, guard)| async move {
                        let event: &'static str = match step {
                            0 => "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                            1 => {
                                // A closed gate sender counts as open: the test is over.
                                let _ = opened.wait_for(|open| *open).await;
                                "data: [DONE]\n\n"
                            }
                            _ => return None,
                        };
                        Some((
                            Ok::<_, std::convert::Infallible>(Bytes::from_static(event.as_bytes())),
                            (step + 1, opened, guard),
                        ))
                    });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(events))
                    .unwrap()
            }
        };
        let endpoints =
            axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
        GatedReplica {
            backend: serve_replica("gated", GATED_MODEL, endpoints).await,
            gate,
            streaming,
        }
    }

    fn config(&self) -> GatewayConfig {
        let mut config = embedded_config(0);
        config.backends.push(self.backend.clone());
        config
    }

    fn streaming(&self) -> usize {
        self.streaming.load(Ordering::SeqCst)
    }
}

/// Opens an h2c stream through the gateway to the gated replica and reads its first event.
async fn gated_stream(
    gateway: &GatewayHandle,
    h2: &mut http2::SendRequest<Full<Bytes>>,
) -> Incoming {
    let response = h2_chat(h2, gateway, GATED_MODEL, true).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), Version::HTTP_2);
    let mut body = response.into_body();
    let first = next_data(&mut body).await;
    assert!(String::from_utf8_lossy(&first).contains("\"content\""));
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_stream_reset_mid_stream_releases_the_pod_and_the_upstream_request() {
    let replica = GatedReplica::start().await;
    let gateway = gateway::start(replica.config()).await.unwrap();
    let mut h2 = h2_client(TcpStream::connect(gateway.addr()).await.unwrap()).await;

    let body = gated_stream(&gateway, &mut h2).await;
    assert_eq!(gateway.total_outstanding(), 1);
    assert_eq!(replica.streaming(), 1);
    // Dropping an unfinished body resets the stream (RST_STREAM); the connection stays.
    drop(body);
    wait_until("the pod released", || gateway.total_outstanding() == 0).await;
    wait_until("the upstream request cancelled", || {
        replica.streaming() == 0
    })
    .await;

    // The same connection still serves. The upstream hop is HTTP/1.1 with the replica's
    // authority as `host`, and the client's `te` (allowed in h2 as `trailers`) is not forwarded.
    let mut request = post(&gateway, chat(GATED_MODEL, false));
    request
        .headers_mut()
        .insert("te", http::HeaderValue::from_static("trailers"));
    let response = within("an answer on the same connection", h2.send_request(request))
        .await
        .unwrap();
    let seen = assert_ok(response, Version::HTTP_2).await;
    assert_eq!(seen["version"], "HTTP/1.1");
    let authority = replica.backend.url.trim_start_matches("http://");
    assert_eq!(seen["host"], authority);
    assert_eq!(seen["te"], serde_json::Value::Null);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_drain_lets_the_stream_in_flight_finish() {
    let replica = GatedReplica::start().await;
    let gateway = gateway::start(replica.config()).await.unwrap();
    let addr = gateway.addr();
    let mut h2 = h2_client(TcpStream::connect(addr).await.unwrap()).await;
    let body = gated_stream(&gateway, &mut h2).await;

    let shutdown = tokio::spawn(gateway.shutdown_within(DEADLINE));
    // Stopped accepting: the drain has begun while the stream is still open.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(replica.streaming(), 1);
    replica.gate.send_replace(true);
    let rest = frames(body).await;
    let text: String = rest
        .iter()
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        within("the drain", shutdown).await.unwrap(),
        "drained in time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grace_deadline_cuts_an_h2_stream_and_releases_its_upstream_request() {
    let replica = GatedReplica::start().await;
    let gateway = gateway::start(replica.config()).await.unwrap();
    let mut h2 = h2_client(TcpStream::connect(gateway.addr()).await.unwrap()).await;
    let body = gated_stream(&gateway, &mut h2).await;

    // The gate never opens: the stream cannot finish, so the drain must be cut.
    let drained = within(
        "the cut",
        gateway.shutdown_within(Duration::from_millis(50)),
    )
    .await;
    assert!(!drained, "an unfinishable stream was drained");
    wait_until("the upstream request dropped", || replica.streaming() == 0).await;
    // The client's stream ends with the shutdown's error event, as after a replica failure.
    let rest = within("the client's stream to end", body.collect())
        .await
        .expect("the cut stream ends cleanly")
        .to_bytes();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("\"code\":\"gateway_shutting_down\""),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_key_file_stops_the_start_naming_the_file() {
    let certificate = TestCertificate::new("missing-key");
    let mut config = certificate.config();
    let missing = certificate.dir.join("absent.key");
    config.tls.key_file = Some(missing);
    let error = gateway::start(config).await.unwrap_err().to_string();
    assert!(
        error.starts_with("cannot read TLS key file") && error.contains("absent.key"),
        "{error}"
    );
}
