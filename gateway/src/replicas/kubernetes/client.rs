//! The connection to the Kubernetes API server: a [`kube::Client`] (hyper, rustls with the
//! ring provider) configured from the gateway's settings rather than from a kubeconfig.
//!
//! In a pod the server is `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, its
//! certificate is checked against the service account's `ca.crt`, and requests carry the
//! service account's bearer token. An explicit `https://` URL uses the same CA and token; a
//! plain `http://` URL gets neither: that is the `kubectl proxy` case, where the proxy
//! authenticates.
//!
//! The token is added by [`ServiceAccountToken`], which reads the file for every request
//! (every list and every watch connection), because projected service-account tokens are
//! rotated by the kubelet and an old one stops working. kube's own token-file support would
//! re-read it only once a minute; reading a small file once per watch (every few minutes)
//! costs nothing and makes a rotation take effect on the next request.
//!
//! The service-account directory and the environment are parameters, not kube's fixed
//! in-cluster paths, so the tests can point them at a temporary directory.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderValue, Request, header};
use kube::client::{Body, ClientBuilder};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};

/// Where a pod's service account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Connecting to the API server takes at most this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the API server is and how requests to it authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServer {
    /// `http(s)://host:port`.
    pub url: String,
    /// The service account's CA (PEM) and token files; `None` for plain HTTP.
    pub service_account: Option<ServiceAccount>,
}

/// The files an `https://` API server is trusted and authenticated with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccount {
    pub ca: PathBuf,
    pub token: PathBuf,
}

impl ApiServer {
    /// The server named by `url` (`http://` or `https://host:port`), or, without one, the
    /// in-cluster server from `env` (`KUBERNETES_SERVICE_HOST`/`_PORT`). HTTPS uses the CA
    /// and token in `service_account_dir`; plain HTTP uses neither.
    pub fn locate(
        url: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
        service_account_dir: &Path,
    ) -> Result<Self, String> {
        let url = match url {
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
                match host.parse::<IpAddr>() {
                    Ok(IpAddr::V6(ip)) => format!("https://[{ip}]:{port}"),
                    _ => format!("https://{host}:{port}"),
                }
            }
        };
        let service_account = url.starts_with("https://").then(|| ServiceAccount {
            ca: service_account_dir.join("ca.crt"),
            token: service_account_dir.join("token"),
        });
        Ok(ApiServer {
            url,
            service_account,
        })
    }

    /// A client for this server whose reads (a watch's) may stay quiet for `read_timeout`;
    /// requests go to `namespace` unless they name another. Errors name the file or value
    /// that is wrong.
    pub fn client(&self, namespace: &str, read_timeout: Duration) -> Result<kube::Client, String> {
        let uri: http::Uri = self
            .url
            .parse()
            .map_err(|e| format!("API server URL {:?}: {e}", self.url))?;
        let mut config = kube::Config::new(uri);
        config.default_namespace = namespace.to_owned();
        config.connect_timeout = Some(CONNECT_TIMEOUT);
        config.read_timeout = Some(read_timeout);
        // kube builds a rustls config even for plain HTTP; with no roots given it would load
        // the system's, which a minimal image may not have. No roots: nothing to trust.
        config.root_cert = Some(match &self.service_account {
            Some(account) => read_ca(&account.ca)?,
            None => Vec::new(),
        });
        use_ring_provider();
        let builder = ClientBuilder::try_from(config)
            .map_err(|e| format!("Kubernetes client for {}: {e}", self.url))?;
        Ok(match &self.service_account {
            Some(account) => builder
                .with_layer(&ServiceAccountToken::layer(account.token.clone()))
                .build(),
            None => builder.build(),
        })
    }
}

/// kube-client builds its rustls config with `ClientConfig::builder()`, which uses the
/// process-wide default provider and panics when none is installed and more than one is
/// compiled in. Only ring is compiled in (workspace `Cargo.toml`), but installing it
/// explicitly keeps that true if a dependency ever adds aws-lc-rs. The gateway's own TLS
/// (listener, KV sync) names its provider and does not depend on this.
fn use_ring_provider() {
    if CryptoProvider::get_default().is_none() {
        // Err only if another thread installed one in between: then that one is used.
        let _ = ring::default_provider().install_default();
    }
}

/// The certificates (DER) in the PEM file `path`; at least one.
fn read_ca(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("cannot read the API server CA {}: {e}", path.display()))?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .map(|certificate| {
            certificate
                .map(|c| c.to_vec())
                .map_err(|e| format!("API server CA {}: bad PEM: {e}", path.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if certificates.is_empty() {
        return Err(format!(
            "API server CA {}: no certificate in the file",
            path.display()
        ));
    }
    Ok(certificates)
}

/// Why the service account token could not be sent.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the service account token {path}: {reason}")]
pub struct TokenError {
    path: String,
    reason: String,
}

/// Adds `Authorization: Bearer TOKEN` to each request, the token read from its file then.
#[derive(Debug, Clone)]
pub struct ServiceAccountToken {
    path: PathBuf,
}

impl ServiceAccountToken {
    /// The tower layer that authenticates every request with the token in `path`.
    pub fn layer(path: PathBuf) -> tower::filter::FilterLayer<Self> {
        tower::filter::FilterLayer::new(ServiceAccountToken { path })
    }

    fn read(&self) -> Result<HeaderValue, TokenError> {
        let error = |reason: String| TokenError {
            path: self.path.display().to_string(),
            reason,
        };
        let token = std::fs::read_to_string(&self.path).map_err(|e| error(e.to_string()))?;
        let token = token.trim();
        if token.is_empty() {
            return Err(error("the file is empty".to_owned()));
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| error("not a valid header value".to_owned()))?;
        value.set_sensitive(true);
        Ok(value)
    }
}

impl tower::filter::Predicate<Request<Body>> for ServiceAccountToken {
    type Request = Request<Body>;

    fn check(&mut self, mut request: Request<Body>) -> Result<Request<Body>, tower::BoxError> {
        let value = self.read()?;
        request.headers_mut().insert(header::AUTHORIZATION, value);
        Ok(request)
    }
}

/// `http(s)://host:port` of an `http(s)://host[:port]` URL without path or query.
fn parse_url(url: &str) -> Result<String, String> {
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
    let scheme = if https { "https" } else { "http" };
    Ok(format!("{scheme}://{}:{port}", authority.host()))
}

/// Checks an `[discovery] api_server` value without reading any file.
pub fn validate_url(url: &str) -> Result<(), String> {
    parse_url(url).map(|_| ())
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
