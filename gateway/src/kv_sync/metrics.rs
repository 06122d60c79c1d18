//! AIBrix's `aibrix_kvcache_zmq_*` metrics (`pkg/cache/kvcache/metrics.go`), labelled
//! `pod_key` (the replica name here; AIBrix uses `namespace/name`), registered only when
//! KV-event sync is on.
//!
//! Kept: connections, disconnections, reconnect attempts, events received and processed by
//! `event_type`, missed events (sequence gaps replay could not fill), replay requests,
//! successes and failures, errors by `error_type`, connection status and the last sequence
//! id. Processing duration is a histogram of one batch's apply time.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The subscriber counters, cheap to clone (prometheus vectors are shared handles).
#[derive(Debug, Clone)]
pub struct KvSyncMetrics {
    pub connections: IntCounterVec,
    pub disconnections: IntCounterVec,
    pub reconnect_attempts: IntCounterVec,
    pub events_received: IntCounterVec,
    pub events_processed: IntCounterVec,
    pub processing_duration: HistogramVec,
    pub missed_events: IntCounterVec,
    pub replay_requests: IntCounterVec,
    pub replay_success: IntCounterVec,
    pub replay_failures: IntCounterVec,
    pub errors: IntCounterVec,
    pub connection_status: IntGaugeVec,
    pub last_sequence_id: IntGaugeVec,
}

fn counter(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    let counter = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(counter.clone()))?;
    Ok(counter)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGaugeVec, prometheus::Error> {
    let gauge = IntGaugeVec::new(Opts::new(name, help), &["pod_key"])?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

impl KvSyncMetrics {
    /// Registers the families in `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let pod = &["pod_key"][..];
        let processing_duration = HistogramVec::new(
            HistogramOpts::new(
                "aibrix_kvcache_zmq_event_processing_duration_seconds",
                "Time to apply one KV-event batch to the prefix index",
            )
            .buckets(prometheus::exponential_buckets(1e-5, 2.0, 15)?),
            pod,
        )?;
        registry.register(Box::new(processing_duration.clone()))?;
        Ok(KvSyncMetrics {
            connections: counter(
                registry,
                "aibrix_kvcache_zmq_connections_total",
                "KV-event subscriptions established",
                pod,
            )?,
            disconnections: counter(
                registry,
                "aibrix_kvcache_zmq_disconnections_total",
                "KV-event subscriptions ended (error, idle renewal or the replica leaving)",
                pod,
            )?,
            reconnect_attempts: counter(
                registry,
                "aibrix_kvcache_zmq_reconnect_attempts_total",
                "KV-event subscription attempts after the first",
                pod,
            )?,
            events_received: counter(
                registry,
                "aibrix_kvcache_zmq_events_received_total",
                "KV events received, by type",
                &["pod_key", "event_type"],
            )?,
            events_processed: counter(
                registry,
                "aibrix_kvcache_zmq_events_processed_total",
                "KV events applied to the prefix index, by type",
                &["pod_key", "event_type"],
            )?,
            processing_duration,
            missed_events: counter(
                registry,
                "aibrix_kvcache_zmq_missed_events_total",
                "KV-event batches lost to sequence gaps that replay did not fill",
                pod,
            )?,
            replay_requests: counter(
                registry,
                "aibrix_kvcache_zmq_replay_requests_total",
                "Replay requests sent",
                pod,
            )?,
            replay_success: counter(
                registry,
                "aibrix_kvcache_zmq_replay_success_total",
                "Replays that reached the end marker",
                pod,
            )?,
            replay_failures: counter(
                registry,
                "aibrix_kvcache_zmq_replay_failures_total",
                "Replays that failed or timed out",
                pod,
            )?,
            errors: counter(
                registry,
                "aibrix_kvcache_zmq_errors_total",
                "KV-event errors, by type",
                &["pod_key", "error_type"],
            )?,
            connection_status: gauge(
                registry,
                "aibrix_kvcache_zmq_connection_status",
                "1 while the KV-event subscription is up",
            )?,
            last_sequence_id: gauge(
                registry,
                "aibrix_kvcache_zmq_last_sequence_id",
                "Sequence number of the last KV-event batch applied",
            )?,
        })
    }

    /// Counts an error of `kind` for `pod`.
    pub fn error(&self, pod: &str, kind: &str) {
        self.errors.with_label_values(&[pod, kind]).inc();
    }
}
