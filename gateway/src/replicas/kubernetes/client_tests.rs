use super::*;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_rustls::rustls;

#[test]
fn urls_are_http_or_https_without_path() {
    assert_eq!(
        parse_url("http://127.0.0.1:8001").unwrap(),
        "http://127.0.0.1:8001"
    );
    assert_eq!(
        parse_url("https://kubernetes.default.svc/").unwrap(),
        "https://kubernetes.default.svc:443"
    );
    assert_eq!(
        parse_url("https://[fd00::1]:6443").unwrap(),
        "https://[fd00::1]:6443"
    );
    assert!(parse_url("ftp://x").unwrap_err().contains("http://"));
    assert!(parse_url("http://x/api").unwrap_err().contains("path"));
    assert!(parse_url("not a url").unwrap_err().contains("not a URL"));
}

#[test]
fn in_cluster_needs_the_service_host_and_the_ca() {
    let dir = Path::new("/nonexistent-prefixgate-sa");
    let error = ApiServer::locate(None, |_| None, dir).unwrap_err();
    assert!(error.contains("KUBERNETES_SERVICE_HOST"), "{error}");
    let env = |key: &str| match key {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
        "KUBERNETES_SERVICE_PORT" => Some("https".to_owned()),
        _ => None,
    };
    let error = ApiServer::locate(None, env, dir).unwrap_err();
    assert!(error.contains("KUBERNETES_SERVICE_PORT"), "{error}");
    let env = |key: &str| match key {
        "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_owned()),
        _ => None,
    };
    let server = ApiServer::locate(None, env, dir).unwrap();
    assert_eq!(server.url, "https://[fd00::1]:443");
    assert_eq!(
        server.service_account,
        Some(ServiceAccount {
            ca: dir.join("ca.crt"),
            token: dir.join("token"),
        })
    );
    let error = server
        .client("default", Duration::from_secs(1))
        .map(drop)
        .unwrap_err();
    assert!(error.contains("ca.crt"), "{error}");
}

#[test]
fn a_ca_file_without_certificates_is_refused() {
    let dir = std::env::temp_dir().join(format!("prefixgate-sa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.crt"), "not a certificate\n").unwrap();
    let server = ApiServer::locate(Some("https://10.0.0.1:6443"), |_| None, &dir).unwrap();
    let error = server
        .client("default", Duration::from_secs(1))
        .map(drop)
        .unwrap_err();
    assert!(error.contains("no certificate"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plain_http_sends_no_token() {
    let server =
        ApiServer::locate(Some("http://127.0.0.1:8001"), |_| None, Path::new("/x")).unwrap();
    assert_eq!(server.url, "http://127.0.0.1:8001");
    assert!(server.service_account.is_none());
}

#[test]
fn the_token_is_read_on_each_use_and_an_empty_one_is_an_error() {
    let dir = std::env::temp_dir().join(format!("prefixgate-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = ServiceAccountToken {
        path: dir.join("token"),
    };
    let error = token.read().unwrap_err().to_string();
    assert!(error.contains("token"), "{error}");
    std::fs::write(&token.path, "  \n").unwrap();
    assert!(token.read().unwrap_err().to_string().contains("empty"));
    std::fs::write(&token.path, "abc\n").unwrap();
    assert_eq!(token.read().unwrap(), "Bearer abc");
    std::fs::write(&token.path, "rotated").unwrap();
    assert_eq!(token.read().unwrap(), "Bearer rotated");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A TLS API server on loopback (the test certificates in `testdata/`) answering `{}`
/// and recording each request's `authorization` header.
async fn tls_api_server() -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    use hyper::service::service_fn;
    use rustls_pki_types::PrivateKeyDer;
    let certs =
        vec![CertificateDer::from_pem_slice(include_bytes!("testdata/server.crt")).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(include_bytes!("testdata/server.key")).unwrap();
    let provider = Arc::new(ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen, received) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        // Bounded: the test makes at most four connections.
        for _ in 0..4 {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let Ok(tls) = acceptor.accept(tcp).await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let auth = request
                        .headers()
                        .get(header::AUTHORIZATION)
                        .map(|v| v.to_str().unwrap_or("").to_owned())
                        .unwrap_or_default();
                    let _ = seen.send(auth);
                    async {
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(Bytes::from_static(b"{}")),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, received)
}

fn service_account(name: &str, ca: &[u8], token: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefixgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca.crt"), ca).unwrap();
    std::fs::write(dir.join("token"), token).unwrap();
    dir
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::from(Vec::new())).unwrap()
}

#[tokio::test]
async fn in_cluster_https_checks_the_ca_and_sends_the_current_token() {
    let (port, mut seen) = tls_api_server().await;
    let dir = service_account("sa-tls", include_bytes!("testdata/ca.crt"), "token-1\n");
    let env = |key: &str| match key {
        "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_owned()),
        "KUBERNETES_SERVICE_PORT" => Some(port.to_string()),
        _ => None,
    };
    let server = ApiServer::locate(None, env, &dir).unwrap();
    assert_eq!(server.url, format!("https://127.0.0.1:{port}"));
    // kube's rustls config comes from the process-wide provider: building the client
    // installs ring, and the handshake below would panic if the choice were ambiguous.
    let client = server.client("llm", Duration::from_secs(10)).unwrap();
    assert!(CryptoProvider::get_default().is_some());
    let response = client
        .send(get("/api/v1/namespaces/llm/pods"))
        .await
        .unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    assert_eq!(seen.recv().await.unwrap(), "Bearer token-1");

    // The kubelet rotates the token: the next request carries the new one.
    std::fs::write(dir.join("token"), "token-2").unwrap();
    client
        .send(get("/api/v1/namespaces/llm/pods"))
        .await
        .unwrap();
    assert_eq!(seen.recv().await.unwrap(), "Bearer token-2");

    // An unreadable token fails the request with the file named, and sends nothing.
    std::fs::remove_file(dir.join("token")).unwrap();
    let error = client.send(get("/")).await.unwrap_err().to_string();
    assert!(error.contains("service account token"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();

    // A server whose certificate the CA did not sign is refused.
    let other = service_account("sa-other", include_bytes!("testdata/other-ca.crt"), "t");
    let url = format!("https://127.0.0.1:{port}");
    let server = ApiServer::locate(Some(&url), |_| None, &other).unwrap();
    let client = server.client("llm", Duration::from_secs(10)).unwrap();
    assert!(client.send(get("/")).await.is_err());
    std::fs::remove_dir_all(&other).unwrap();
    assert!(seen.try_recv().is_err(), "no request got through");
}
