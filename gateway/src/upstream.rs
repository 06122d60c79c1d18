//! The upstream HTTP client: hyper-util's pooled HTTP/1 client with TCP_NODELAY and a
//! connect timeout. One client is shared by the request path ([`crate::request::proxy`]),
//! the health probes, the engine scrape and KV sync's `/tokenize` calls, so all of them reuse
//! one connection pool. [`describe`] spells out a hyper-util error with its causes, for the
//! proxy's and Kubernetes discovery's logs.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The pooled upstream HTTP/1 client.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// The error and its causes in one line (hyper-util's top-level message is generic, e.g.
/// `client error (Connect)`; the cause says `Connection refused`). A cause whose message the
/// line already holds (wrappers that print their source) is not repeated.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// A client with TCP_NODELAY, the connect timeout and the pool's idle timeout.
pub fn upstream_client(connect_timeout: Duration, pool_idle: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle)
        .build(connector)
}
