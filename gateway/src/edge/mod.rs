//! The network edge: sockets in, a running gateway out.
//!
//! - [`listener`]: the accept loop (HTTP/1.1 and HTTP/2 on one port, TLS when configured),
//!   connection limits and graceful drain;
//! - [`half_close`]: an HTTP/1.1 client that half-closes after its request is answered,
//!   one that left is released (a probe tells them apart);
//! - [`head_guard`]: HTTP/1.1 request heads judged before hyper reads them, so a malformed
//!   one is answered in OpenAI JSON ([`chunks`] finds where a chunked body ends);
//! - [`head_limits`]: what makes a head well-formed and within the gateway's limits;
//! - [`tls`]: the `[tls]` settings and the certificate and key loaded into an acceptor;
//! - [`server`]: [`server::start`] turns a configuration into listeners plus background
//!   tasks, and [`server::GatewayHandle`] stops them;
//! - [`shutdown`]: the stop signals the binary waits for.

pub mod chunks;
pub mod half_close;
pub mod head_guard;
pub mod head_limits;
pub mod listener;
pub mod server;
pub mod shutdown;
pub mod tls;
