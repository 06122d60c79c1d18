//! AIBrix's `aibrix_kvcache_zmq_*` metrics (`pkg/cache/kvcache/metrics.go`), labelled
//! `pod_key` (the replica name here; AIBrix uses `namespace/name`), registered only when
//! KV-event sync is on.
//!
//! Kept: connections, disconnections, reconnect attempts, events received and processed by
//! `event_type`, missed events (sequence gaps replay could not fill), replay requests,
//! successes and failures, errors by `error_type`, connection status and the last sequence
//! id. Processing duration is a histogram of one batch's apply time.
//!
//! Data-parallel engines (`kv_sync.data_parallel_size` > 1) publish one stream per rank. The
//! two per-stream gauges, connection status and last sequence id, cannot be summed over
//! ranks, so with more than one rank they carry a `dp_rank` label (`"0"`…); every counter
//! and the histogram stay per pod, summed over its ranks, so AIBrix's queries and
//! dashboards read them unchanged. With one rank the exposition is exactly AIBrix's.

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
    /// The gauges carry `dp_rank` (more than one data-parallel rank per replica).
    ranked: bool,
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

fn gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntGaugeVec, prometheus::Error> {
    let gauge = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(gauge.clone()))?;
    Ok(gauge)
}

impl KvSyncMetrics {
    /// Registers the families in `registry`, for single-engine replicas.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        KvSyncMetrics::register_ranked(registry, 1)
    }

    /// Registers the families in `registry` for replicas of `data_parallel_size` ranks: above
    /// one, the per-stream gauges are labelled `dp_rank` too.
    pub fn register_ranked(
        registry: &Registry,
        data_parallel_size: u32,
    ) -> Result<Self, prometheus::Error> {
        let pod = &["pod_key"][..];
        let ranked = data_parallel_size > 1;
        let stream: &[&str] = if ranked { &["pod_key", "dp_rank"] } else { pod };
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
                stream,
            )?,
            last_sequence_id: gauge(
                registry,
                "aibrix_kvcache_zmq_last_sequence_id",
                "Sequence number of the last KV-event batch applied",
                stream,
            )?,
            ranked,
        })
    }

    /// Sets rank `rank`'s subscription of `pod` up (1) or down (0).
    pub fn set_connection_status(&self, pod: &str, rank: u32, up: bool) {
        let rank = rank.to_string();
        self.connection_status
            .with_label_values(&self.stream_labels(pod, &rank))
            .set(i64::from(up));
    }

    /// Records `seq` as the last batch applied from rank `rank` of `pod`.
    pub fn set_last_sequence_id(&self, pod: &str, rank: u32, seq: u64) {
        let rank = rank.to_string();
        self.last_sequence_id
            .with_label_values(&self.stream_labels(pod, &rank))
            .set(i64::try_from(seq).unwrap_or(i64::MAX));
    }

    fn stream_labels<'a>(&self, pod: &'a str, rank: &'a str) -> Vec<&'a str> {
        if self.ranked {
            vec![pod, rank]
        } else {
            vec![pod]
        }
    }

    /// Counts an error of `kind` for `pod`.
    pub fn error(&self, pod: &str, kind: &str) {
        self.errors.with_label_values(&[pod, kind]).inc();
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, TextEncoder};

    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_stream_gauges_carry_a_rank_only_with_several_ranks() {
        let single = Registry::new();
        let metrics = KvSyncMetrics::register(&single).unwrap();
        metrics.set_connection_status("a", 0, true);
        metrics.set_last_sequence_id("a", 0, 41);
        metrics.connections.with_label_values(&["a"]).inc();
        let text = exposition(&single);
        assert!(
            text.contains("aibrix_kvcache_zmq_connection_status{pod_key=\"a\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("aibrix_kvcache_zmq_last_sequence_id{pod_key=\"a\"} 41"),
            "{text}"
        );
        assert!(!text.contains("dp_rank"), "{text}");

        let ranked = Registry::new();
        let metrics = KvSyncMetrics::register_ranked(&ranked, 2).unwrap();
        metrics.set_connection_status("a", 1, true);
        metrics.set_connection_status("a", 0, false);
        metrics.set_last_sequence_id("a", 1, 7);
        metrics.connections.with_label_values(&["a"]).inc_by(2);
        let text = exposition(&ranked);
        for line in [
            "aibrix_kvcache_zmq_connection_status{dp_rank=\"0\",pod_key=\"a\"} 0",
            "aibrix_kvcache_zmq_connection_status{dp_rank=\"1\",pod_key=\"a\"} 1",
            "aibrix_kvcache_zmq_last_sequence_id{dp_rank=\"1\",pod_key=\"a\"} 7",
            "aibrix_kvcache_zmq_connections_total{pod_key=\"a\"} 2",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
    }
}
