//! A minimal client of the Kubernetes API server: one `GET` per connection, over TLS
//! (rustls, ring provider) in a cluster or plain HTTP to an explicit URL such as
//! `kubectl proxy`'s `http://127.0.0.1:8001`.
//!
//! In a pod the server is `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, its
//! certificate is checked against the service account's `ca.crt`, and requests carry the
//! service account's bearer token. The token file is read again for every request (every
//! list and every watch connection), because projected service-account tokens are rotated
//! by the kubelet and an old one stops working. A plain `http://` URL gets no token: that is
//! the `kubectl proxy` case, where the proxy authenticates.
//!
//! One connection per request keeps this small: a watch holds its connection for minutes
//! anyway, and a list happens only at start and after a watch expires.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// Where a pod's service account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Connecting, the TLS handshake and the response headers together take at most this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot connect to the API server {authority}: {reason}")]
    Connect { authority: String, reason: String },
    #[error("TLS handshake with the API server {authority} failed: {reason}")]
    Tls { authority: String, reason: String },
    #[error("cannot read the service account token {path}: {reason}")]
    Token { path: String, reason: String },
    #[error("HTTP exchange with the API server failed: {0}")]
    Http(String),
    #[error("no response from the API server {authority} within {} s", REQUEST_TIMEOUT.as_secs())]
    Timeout { authority: String },
}

/// How to reach the API server.
#[derive(Clone)]
pub struct ApiServer {
    /// `host:port`, for the TCP connection and the `Host` header.
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
    /// Read for every request; `None` sends no `Authorization` header.
    token_path: Option<PathBuf>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url())
            .field("token_path", &self.token_path)
            .finish()
    }
}

/// A response whose body is still arriving; dropping it closes the connection.
#[derive(Debug)]
pub struct ApiResponse {
    pub status: StatusCode,
    pub body: Incoming,
    connection: ConnectionTask,
}

/// The task driving one HTTP connection, ended when the response is dropped.
#[derive(Debug)]
struct ConnectionTask(JoinHandle<()>);

impl Drop for ConnectionTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ApiResponse {
    /// The whole body, refusing more than `limit` bytes.
    pub async fn collect(self, limit: usize) -> Result<Bytes, String> {
        let _connection = self.connection;
        http_body_util::Limited::new(self.body, limit)
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .map_err(|e| format!("cannot read the response body: {e}"))
    }
}

impl ApiServer {
    /// The server named by `url` (`http://` or `https://host:port`), or, without one, the
    /// in-cluster server from `env` (`KUBERNETES_SERVICE_HOST`/`_PORT`). HTTPS uses the CA
    /// and token in `service_account_dir`; plain HTTP uses neither.
    pub fn new(
        url: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
        service_account_dir: &Path,
    ) -> Result<Self, String> {
        let (https, authority, host) = match url {
            Some(url) => parse_url(url)?,
            None => {
                let host = env("KUBERNETES_SERVICE_HOST")
                    .filter(|h| !h.is_empty())
                    .ok_or(
                        "KUBERNETES_SERVICE_HOST is not set (not running in a pod?): give \
                     [discovery] api_server (or --set discovery.api_server=URL), e.g. http://127.0.0.1:8001 \
                     behind `kubectl proxy`",
                    )?;
                let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".to_owned());
                let port: u16 = port
                    .trim()
                    .parse()
                    .map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))?;
                let authority = match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
                    _ => format!("{host}:{port}"),
                };
                (true, authority, host)
            }
        };
        if !https {
            return Ok(ApiServer {
                authority,
                tls: None,
                token_path: None,
            });
        }
        let ca_path = service_account_dir.join("ca.crt");
        let connector = tls_connector(&ca_path)?;
        let server_name = ServerName::try_from(host.clone())
            .map_err(|e| format!("API server host {host:?} is not a TLS server name: {e}"))?;
        Ok(ApiServer {
            authority,
            tls: Some((connector, server_name)),
            token_path: Some(service_account_dir.join("token")),
        })
    }

    /// `http(s)://host:port`, for logs.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.authority)
    }

    /// `GET path_and_query`; the response once its headers arrived.
    pub async fn get(&self, path_and_query: &str) -> Result<ApiResponse, ApiError> {
        let token = match &self.token_path {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        let mut request = Request::get(path_and_query)
            .header(header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| ApiError::Http(format!("bad request path {path_and_query:?}: {e}")))?;
        let headers = request.headers_mut();
        headers.insert(
            header::HOST,
            HeaderValue::from_str(&self.authority)
                .map_err(|e| ApiError::Http(format!("bad host {:?}: {e}", self.authority)))?,
        );
        if let Some(token) = token {
            let value =
                HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| ApiError::Token {
                    path: self.token_path_display(),
                    reason: "not a valid header value".to_owned(),
                })?;
            headers.insert(header::AUTHORIZATION, value);
        }
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request))
            .await
            .map_err(|_| ApiError::Timeout {
                authority: self.authority.clone(),
            })?
    }

    async fn exchange(&self, request: Request<Empty<Bytes>>) -> Result<ApiResponse, ApiError> {
        let tcp = TcpStream::connect(&self.authority)
            .await
            .map_err(|e| ApiError::Connect {
                authority: self.authority.clone(),
                reason: e.to_string(),
            })?;
        // Watch events are small and should arrive as soon as they are sent.
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => send(tcp, request).await,
            Some((connector, name)) => {
                let tls =
                    connector
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|e| ApiError::Tls {
                            authority: self.authority.clone(),
                            reason: e.to_string(),
                        })?;
                send(tls, request).await
            }
        }
    }

    fn token_path_display(&self) -> String {
        self.token_path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

/// One request on a fresh HTTP/1.1 connection over `io`.
async fn send<S>(io: S, request: Request<Empty<Bytes>>) -> Result<ApiResponse, ApiError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| ApiError::Http(e.to_string()))?;
    let connection = ConnectionTask(tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "API server connection ended");
        }
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| ApiError::Http(e.to_string()))?;
    let status = response.status();
    Ok(ApiResponse {
        status,
        body: response.into_body(),
        connection,
    })
}

fn read_token(path: &Path) -> Result<String, ApiError> {
    let token = std::fs::read_to_string(path).map_err(|e| ApiError::Token {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(ApiError::Token {
            path: path.display().to_string(),
            reason: "the file is empty".to_owned(),
        });
    }
    Ok(token.to_owned())
}

/// rustls with the ring provider, trusting only the certificates in `ca_path`.
fn tls_connector(ca_path: &Path) -> Result<TlsConnector, String> {
    let pem = std::fs::read(ca_path)
        .map_err(|e| format!("cannot read the API server CA {}: {e}", ca_path.display()))?;
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate = certificate
            .map_err(|e| format!("API server CA {}: bad PEM: {e}", ca_path.display()))?;
        roots
            .add(certificate)
            .map_err(|e| format!("API server CA {}: {e}", ca_path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "API server CA {}: no certificate in the file",
            ca_path.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// `(https, host:port, host)` of an `http(s)://host[:port]` URL without path or query.
fn parse_url(url: &str) -> Result<(bool, String, String), String> {
    let uri: http::Uri = url
        .trim()
        .parse()
        .map_err(|e| format!("API server URL {url:?}: not a URL ({e})"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("API server URL {url:?}: use http:// or https://")),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("API server URL {url:?}: no host"))?;
    if !(uri.path().is_empty() || uri.path() == "/") || uri.query().is_some() {
        return Err(format!(
            "API server URL {url:?}: must not have a path or query"
        ));
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let host = authority.host();
    let authority = format!("{host}:{port}");
    // The TLS name of an IPv6 literal has no brackets.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((https, authority, host))
}

/// Checks an `[discovery] api_server` value without reading any file.
pub fn validate_url(url: &str) -> Result<(), String> {
    parse_url(url).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https_without_path() {
        assert_eq!(
            parse_url("http://127.0.0.1:8001").unwrap(),
            (false, "127.0.0.1:8001".to_owned(), "127.0.0.1".to_owned())
        );
        assert_eq!(
            parse_url("https://kubernetes.default.svc/").unwrap(),
            (
                true,
                "kubernetes.default.svc:443".to_owned(),
                "kubernetes.default.svc".to_owned()
            )
        );
        assert_eq!(parse_url("https://[fd00::1]:6443").unwrap().2, "fd00::1");
        assert!(parse_url("ftp://x").unwrap_err().contains("http://"));
        assert!(parse_url("http://x/api").unwrap_err().contains("path"));
        assert!(parse_url("not a url").unwrap_err().contains("not a URL"));
    }

    #[test]
    fn in_cluster_needs_the_service_host() {
        let dir = Path::new("/nonexistent-prefixgate-sa");
        let error = ApiServer::new(None, |_| None, dir).unwrap_err();
        assert!(error.contains("KUBERNETES_SERVICE_HOST"), "{error}");
        let env = |key: &str| match key {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("https".to_owned()),
            _ => None,
        };
        let error = ApiServer::new(None, env, dir).unwrap_err();
        assert!(error.contains("KUBERNETES_SERVICE_PORT"), "{error}");
        let env = |key: &str| (key == "KUBERNETES_SERVICE_HOST").then(|| "10.96.0.1".to_owned());
        let error = ApiServer::new(None, env, dir).unwrap_err();
        assert!(error.contains("ca.crt"), "{error}");
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("prefixgate-sa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "not a certificate\n").unwrap();
        let error = ApiServer::new(Some("https://10.0.0.1:6443"), |_| None, &dir).unwrap_err();
        assert!(error.contains("no certificate"), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn plain_http_sends_no_token() {
        let api = ApiServer::new(Some("http://127.0.0.1:8001"), |_| None, Path::new("/x")).unwrap();
        assert!(api.token_path.is_none() && api.tls.is_none());
        assert_eq!(api.url(), "http://127.0.0.1:8001");
    }

    #[tokio::test]
    async fn a_token_is_read_per_request_and_an_empty_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("prefixgate-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "  \n").unwrap();
        assert!(
            matches!(read_token(&path), Err(ApiError::Token { reason, .. }) if reason.contains("empty"))
        );
        std::fs::write(&path, "abc\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "abc");
        std::fs::write(&path, "rotated").unwrap();
        assert_eq!(read_token(&path).unwrap(), "rotated");
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
        let provider = Arc::new(rustls::crypto::ring::default_provider());
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

    #[tokio::test]
    async fn in_cluster_https_checks_the_ca_and_sends_the_current_token() {
        let (port, mut seen) = tls_api_server().await;
        let dir = service_account("sa-tls", include_bytes!("testdata/ca.crt"), "token-1\n");
        let env = |key: &str| match key {
            "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some(port.to_string()),
            _ => None,
        };
        let api = ApiServer::new(None, env, &dir).unwrap();
        assert_eq!(api.url(), format!("https://127.0.0.1:{port}"));
        let response = api.get("/api/v1/namespaces/x/pods").await.unwrap();
        assert_eq!(response.status, StatusCode::OK);
        assert_eq!(response.collect(1024).await.unwrap(), "{}");
        assert_eq!(seen.recv().await.unwrap(), "Bearer token-1");

        // The kubelet rotates the token: the next request carries the new one.
        std::fs::write(dir.join("token"), "token-2").unwrap();
        api.get("/").await.unwrap();
        assert_eq!(seen.recv().await.unwrap(), "Bearer token-2");
        std::fs::remove_dir_all(&dir).unwrap();

        // A server whose certificate the CA did not sign is refused.
        let other = service_account("sa-other", include_bytes!("testdata/other-ca.crt"), "t");
        let api =
            ApiServer::new(Some(&format!("https://127.0.0.1:{port}")), |_| None, &other).unwrap();
        let error = api.get("/").await.unwrap_err();
        assert!(matches!(error, ApiError::Tls { .. }), "{error}");
        std::fs::remove_dir_all(&other).unwrap();
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_server() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let api =
            ApiServer::new(Some(&format!("http://{addr}")), |_| None, Path::new("/x")).unwrap();
        let error = api.get("/api/v1/pods").await.unwrap_err();
        assert!(matches!(error, ApiError::Connect { .. }), "{error}");
        assert!(error.to_string().contains(&addr.to_string()), "{error}");
    }
}
