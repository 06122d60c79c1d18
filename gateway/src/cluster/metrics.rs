//! `prefixgate_cluster_*`: what cluster sharing did, registered only with `[cluster] url` set.
//!
//! | metric | type | labels, meaning |
//! |---|---|---|
//! | `prefixgate_cluster_connected` | gauge | 1 while both links to the server (publish, read) are up |
//! | `prefixgate_cluster_published_total` | counter | `event`: messages written to the stream |
//! | `prefixgate_cluster_dropped_total` | counter | `reason`: `queue_full`, `disconnected`, `publish_failed`, `encode` |
//! | `prefixgate_cluster_received_total` | counter | `phase`: `catch_up` (history read at (re)connect) or `live` |
//! | `prefixgate_cluster_applied_total` | counter | `event`: peer messages applied |
//! | `prefixgate_cluster_ignored_total` | counter | `reason`: `own`, `other_hashing`, `unknown_request`, `unknown_pod` |
//! | `prefixgate_cluster_errors_total` | counter | `error`: `connect`, `read`, `decode`, `version` |
//! | `prefixgate_cluster_peers` | gauge | peers heard from within `peer_timeout_ms` |
//! | `prefixgate_cluster_peer_requests` | gauge | peers' requests in flight held in this gateway's view |
//! | `prefixgate_cluster_peers_expired_total` | counter | peers forgotten after `peer_timeout_ms` of silence |
//! | `prefixgate_cluster_lag_seconds` | histogram | live messages: receipt time − the server's time at `XADD` (one host: exact; across hosts it includes their clock skew) |

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    exponential_buckets,
};

/// The cluster families, cheap to clone (shared handles).
#[derive(Debug, Clone)]
pub struct ClusterMetrics {
    pub connected: IntGauge,
    pub published: IntCounterVec,
    pub dropped: IntCounterVec,
    pub received: IntCounterVec,
    pub applied: IntCounterVec,
    pub ignored: IntCounterVec,
    pub errors: IntCounterVec,
    pub peers: IntGauge,
    pub peer_requests: IntGauge,
    pub peers_expired: IntCounter,
    pub lag: Histogram,
}

impl ClusterMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let counter = |name: &str, help: &str, label: &str| {
            let counter = IntCounterVec::new(Opts::new(name, help), &[label])?;
            registry.register(Box::new(counter.clone()))?;
            Ok::<_, prometheus::Error>(counter)
        };
        let gauge = |name: &str, help: &str| {
            let gauge = IntGauge::new(name, help)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok::<_, prometheus::Error>(gauge)
        };
        let lag = Histogram::with_opts(
            HistogramOpts::new(
                "prefixgate_cluster_lag_seconds",
                "From a peer's XADD (the server's clock) to this gateway applying it",
            )
            // 100 µs doubling to about 3.3 s.
            .buckets(exponential_buckets(1e-4, 2.0, 16)?),
        )?;
        registry.register(Box::new(lag.clone()))?;
        let peers_expired = IntCounter::new(
            "prefixgate_cluster_peers_expired_total",
            "Peers forgotten, with their requests in flight, after peer_timeout_ms without a message",
        )?;
        registry.register(Box::new(peers_expired.clone()))?;
        Ok(ClusterMetrics {
            connected: gauge(
                "prefixgate_cluster_connected",
                "1 while both links to the cluster server (publish and read) are up",
            )?,
            published: counter(
                "prefixgate_cluster_published_total",
                "Messages this gateway wrote to the cluster stream",
                "event",
            )?,
            dropped: counter(
                "prefixgate_cluster_dropped_total",
                "Messages this gateway did not publish",
                "reason",
            )?,
            received: counter(
                "prefixgate_cluster_received_total",
                "Stream entries read (catch_up: history read at (re)connect)",
                "phase",
            )?,
            applied: counter(
                "prefixgate_cluster_applied_total",
                "Peer messages applied to this gateway's index and load view",
                "event",
            )?,
            ignored: counter(
                "prefixgate_cluster_ignored_total",
                "Messages that changed nothing, or less than they name",
                "reason",
            )?,
            errors: counter(
                "prefixgate_cluster_errors_total",
                "Cluster link and message errors",
                "error",
            )?,
            peers: gauge(
                "prefixgate_cluster_peers",
                "Peers heard from within peer_timeout_ms",
            )?,
            peer_requests: gauge(
                "prefixgate_cluster_peer_requests",
                "Peers' requests in flight held in this gateway's load view",
            )?,
            peers_expired,
            lag,
        })
    }
}
