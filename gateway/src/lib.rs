//! prefixgate's gateway: the serving path from an OpenAI request to a vLLM replica.
//!
//! The folders follow a request's trip and what runs beside it (docs/GATEWAY.md, "Code map"):
//! - [`edge`]: the network edge: the accept loop (HTTP/1.1 and HTTP/2, TLS when configured),
//!   starting and stopping a gateway ([`start`]), stop signals;
//! - [`request`]: the request path, one module per step: [`admit`] (API keys, in-flight caps)
//!   → parse the body just enough to route → charge the tenant's token rate → pick a replica
//!   through router-core → proxy the bytes upstream with bounded retries → stream the answer
//!   back in a body that releases the pod's outstanding guard, the admission permit and the
//!   token charge; plus the headers and OpenAI-shaped errors the client sees;
//! - [`replicas`]: the replica set (static, embedded, Kubernetes) and its health and engine
//!   scrape;
//! - [`kv_sync`]: engines' KV-cache events into the prefix index;
//! - [`cluster`]: the gateways of a fleet sharing their decisions through Redis;
//! - [`ext_proc`]: the same request path as Envoy's external processor (AIBrix
//!   gateway-plugins, Gateway API Inference Extension endpoint picker);
//! - [`admit`]: admission (API keys, in-flight caps, tenant token rates);
//! - [`config`]: the settings and how they are read.
//!
//! Only [`config`] (every settings table, and the command line) and what starts and stops a
//! gateway are public; the parts are the crate's own.
//!
//! Leaves beside them: [`state`] (what the handlers share), [`upstream`] (the pooled client
//! to the replicas), [`clock`] (the index's time base), [`metrics`] (what happened),
//! [`telemetry`] (OpenTelemetry traces; public so the binary can install its layer).

pub(crate) mod admit;
pub(crate) mod clock;
pub(crate) mod cluster;
pub mod config;
pub(crate) mod edge;
pub(crate) mod ext_proc;
pub(crate) mod kv_sync;
pub(crate) mod metrics;
pub(crate) mod replicas;
pub(crate) mod request;
pub(crate) mod state;
pub mod telemetry;
pub(crate) mod upstream;

pub use admit::Admission;
pub use config::GatewayConfig;
/// The connection wrappers under hyper, public for their benchmark (gateway/benches/edge_io.rs).
pub use edge::half_close::{Exchanges, HalfCloseIo};
pub use edge::half_close::{
    PROBE as HALF_CLOSE_PROBE, PROBE_INTERVAL as HALF_CLOSE_PROBE_INTERVAL,
};
pub use edge::head_guard::{HeadGuard, HeadVerdicts};
pub use edge::server::{GatewayHandle, StartError, start};
pub use edge::shutdown::StopSignals;
/// The body KV sync sends to an engine's `/tokenize`, public for the real-vLLM suite, which
/// checks that its ids are the ones vLLM's KV events carry (tests/tests/real_vllm/).
pub use kv_sync::engine_tokens::tokenize_body;
