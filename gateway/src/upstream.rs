//! The upstream HTTP client: hyper-util's pooled HTTP/1 client with TCP_NODELAY and a
//! connect timeout. One client is shared by the request path ([`crate::request::proxy`]),
//! the health probes, the engine scrape and KV sync's `/tokenize` calls, so all of them reuse
//! one connection pool.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The pooled upstream HTTP/1 client.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// A client with TCP_NODELAY, the connect timeout and the pool's idle timeout.
pub fn upstream_client(connect_timeout: Duration, pool_idle: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(pool_idle)
        .build(connector)
}
