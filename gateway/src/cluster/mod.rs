//! Cluster sharing: the gateways of one fleet share their routing decisions through Redis,
//! so each routes on every gateway's requests in flight, not only its own.
//!
//! router-core's [`cluster`](router_core::cluster) is the pure part (the message, and how a
//! peer's message changes the index and the load view); this folder is the I/O around it:
//! [`config`] (the `[cluster]` table), [`stream`] (the Redis stream and its four commands),
//! [`publish`] (the request path's fire-and-forget handle and the task that writes),
//! [`subscribe`] (the task that reads and applies, and peer expiry), [`link`] (connection
//! state, log lines and backoff), [`metrics`] (`prefixgate_cluster_*`).
//!
//! The data path never waits on the cluster: publishing is a `try_send` on a bounded queue,
//! and applying happens on the read task. With the server unreachable, each gateway routes
//! on its own view (peers' load expires after `peer_timeout_ms`), says so in `/metrics`
//! (`prefixgate_cluster_connected` 0, drops counted) and its log, and picks up again when
//! the server returns. docs/CLUSTER.md says why Redis, and what an operator sees.

pub mod config;
mod link;
pub mod metrics;
mod publish;
mod stream;
mod subscribe;

use std::sync::{Arc, Mutex};

use prometheus::Registry;
use router_core::Router;
use router_core::cluster::{PeerTable, hashing_digest};
use tokio::task::JoinHandle;

pub use config::ClusterConfig;
pub use publish::{ClusterPublisher, SharedTicket};

use self::link::LinkStatus;
use self::metrics::ClusterMetrics;
use self::stream::Stream;
use self::subscribe::Applier;
use crate::clock::Clock;
use crate::replicas::Replicas;

/// Why sharing could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid cluster.url: {0}")]
    Url(String),
    #[error("cannot register cluster metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What sharing needs from the gateway (narrow handles, not the app state).
#[derive(Debug, Clone)]
pub struct ClusterHandles {
    pub router: Arc<Router>,
    pub replicas: Arc<Replicas>,
    pub clock: Clock,
    /// Whether prompts are hashed on the engine's tokens (KV-event sync), which changes
    /// every hash: gateways that differ here cannot share blocks.
    pub engine_tokens: bool,
}

/// Running sharing: the request path's publisher, and the background tasks.
#[derive(Debug)]
pub struct Cluster {
    pub publisher: ClusterPublisher,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Starts sharing as configured (the caller checked `config.enabled()`): nothing here waits
/// for the server, which the tasks connect to (and reconnect to) in the background.
pub fn spawn(
    config: &ClusterConfig,
    handles: ClusterHandles,
    registry: &Registry,
) -> Result<Cluster, ClusterError> {
    let url = config.url.clone().unwrap_or_default();
    let server = config::redacted(&url);
    let stream = Stream::new(&url, config.stream_key(), config.history())
        .map_err(|error| ClusterError::Url(format!("{server}: {error}")))?;
    let metrics = ClusterMetrics::register(registry)?;
    let gateway_id = config
        .gateway_id
        .clone()
        .unwrap_or_else(config::default_gateway_id);
    let hashing = hashing_digest(handles.router.config(), handles.engine_tokens);
    let status = LinkStatus::new(&server);
    let (publisher, publish_task) = publish::spawn(
        stream.clone(),
        gateway_id.clone(),
        hashing,
        config.queue_capacity,
        config.heartbeat(),
        metrics.clone(),
        status.clone(),
    );
    let applier = Applier {
        table: Arc::new(Mutex::new(PeerTable::new(
            &gateway_id,
            hashing,
            config.peer_timeout_ms,
        ))),
        router: handles.router,
        replicas: handles.replicas,
        clock: handles.clock,
        metrics,
    };
    let [read_task, expiry_task] = subscribe::spawn(stream, applier, status, config.heartbeat());
    tracing::info!(
        %server,
        gateway = %gateway_id,
        stream = %config.stream_key(),
        "cluster sharing on"
    );
    Ok(Cluster {
        publisher,
        tasks: vec![publish_task, read_task, expiry_task],
    })
}
