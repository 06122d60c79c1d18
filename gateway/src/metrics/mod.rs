//! The gateway's Prometheus metrics, in its own registry, served on the metrics listener.
//!
//! Two families. AIBrix's six `aibrix_prefix_cache_*` metrics keep AIBrix v0.7.0's exact
//! names, types, labels and buckets so existing dashboards work; they move only for
//! `prefix-cache` decisions (never for the single-pod short-circuit) and are driven from
//! router-core's `Decision`. prefixgate's own `prefixgate_*` metrics cover requests, per-pod
//! outstanding counts, upstream latency, retries and ejections. Per-pod gauges are refreshed
//! from the live load view when `/metrics` is scraped, so the request path never touches them.
//! The series a request moves are looked up once per replica and kept with it ([`pod`]:
//! [`PodMetrics`]), so the request path does no label lookup once a replica's series exist.
//!
//! [`Metrics`] is one `Arc` around its metric families, and each replica's [`PodMetrics`]
//! holds a clone: a response body holds its replica's until it ends, so a clone must cost one
//! reference count, not one per family.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use router_core::Decision;
use router_core::load::CacheTrust;

use crate::kv_sync::metrics::KvSyncMetrics;

mod pod;

pub use pod::PodMetrics;

/// Every metric the gateway exports (cheap to clone: one shared `Arc`).
#[derive(Debug, Clone)]
pub struct Metrics {
    families: Arc<Families>,
}

/// The registry and the metric families registered in it.
#[derive(Debug)]
struct Families {
    registry: Registry,
    /// AIBrix's `using_kv_sync` label: `"true"` when KV-event sync is on.
    using_kv_sync: &'static str,
    /// The `aibrix_kvcache_zmq_*` families, registered only with KV-event sync on.
    kv_sync: Option<KvSyncMetrics>,
    decisions: CounterVec,
    selections: CounterVec,
    routing_errors: CounterVec,
    load_imbalance: CounterVec,
    routing_latency: HistogramVec,
    requests: IntCounterVec,
    outstanding: IntGaugeVec,
    ready: IntGaugeVec,
    engine_missing: IntGaugeVec,
    model_in_flight: IntGaugeVec,
    model_ready: IntGaugeVec,
    model_queue: IntGaugeVec,
    upstream_ttft: HistogramVec,
    upstream_total: HistogramVec,
    retries: IntCounterVec,
    resumes: IntCounterVec,
    ejections: IntCounterVec,
    readmissions: IntCounterVec,
    admission_rejections: IntCounterVec,
    cache_reports: IntCounterVec,
    cache_trust: GaugeVec,
    /// One render at a time: each resets the per-pod and per-model gauges before refilling
    /// them, and a concurrent scrape must not read between the two.
    rendering: std::sync::Mutex<()>,
}

/// One replica's per-pod gauges as a scrape reads them (metrics know pods by name only, not
/// the replica set).
#[derive(Debug, Clone, Copy)]
pub struct PodGauges<'a> {
    pub pod: &'a str,
    pub outstanding: u64,
    pub ready: bool,
    /// The models it serves (the per-model gauges sum over them).
    pub models: &'a [String],
    /// `vllm:num_requests_waiting` from the last engine scrape, if any.
    pub engine_waiting: Option<u64>,
    /// What its engine's `cached_tokens` taught about the prefix index's view of it.
    pub cache_trust: CacheTrust,
    /// The engine gauges its last readable `/metrics` lacked (engine scrape).
    pub engine_missing: &'a [&'static str],
}

/// A metric could not be registered (a name clash: a programming error caught by tests).
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// Upstream latency buckets (seconds): 1 ms to 60 s, covering cache-hit TTFTs to long streams.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
];

impl Metrics {
    /// The metrics of a gateway without KV-event sync.
    pub fn new() -> Result<Self, MetricsError> {
        Metrics::with_kv_sync(false)
    }

    /// The metrics of a gateway with KV-event sync on or off: the `using_kv_sync` label, the
    /// indexer status, and the `aibrix_kvcache_zmq_*` families follow it.
    pub fn with_kv_sync(kv_sync: bool) -> Result<Self, MetricsError> {
        Metrics::with_kv_sync_ranks(kv_sync, 1)
    }

    /// [`Metrics::with_kv_sync`] for replicas of `data_parallel_size` vLLM ranks each: above
    /// one, the per-stream `aibrix_kvcache_zmq_*` gauges are labelled `dp_rank` too.
    pub fn with_kv_sync_ranks(
        kv_sync: bool,
        data_parallel_size: u32,
    ) -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let decisions = CounterVec::new(
            Opts::new(
                "aibrix_prefix_cache_routing_decisions_total",
                "Prefix-cache routing decisions by the chosen pod's match-percent bucket",
            ),
            &["model", "match_percent_bucket", "using_kv_sync"],
        )?;
        let selections = CounterVec::new(
            Opts::new(
                "aibrix_prefix_cache_routing_selection_total",
                "Prefix-cache routing decisions by selection kind",
            ),
            &["model", "selection", "using_kv_sync"],
        )?;
        let routing_errors = CounterVec::new(
            Opts::new(
                "aibrix_prefix_cache_routing_errors_total",
                "Prefix-cache routing errors by reason",
            ),
            &["model", "reason", "using_kv_sync"],
        )?;
        let load_imbalance = CounterVec::new(
            Opts::new(
                "aibrix_prefix_cache_load_imbalance_total",
                "Prefix-cache routes where max-min outstanding exceeded the imbalance count",
            ),
            &["model", "using_kv_sync"],
        )?;
        let routing_latency = HistogramVec::new(
            HistogramOpts::new(
                "aibrix_prefix_cache_routing_latency_seconds",
                "Prefix-cache routing latency",
            )
            .buckets(prometheus::exponential_buckets(1e-5, 2.0, 15)?),
            &["model", "using_kv_sync"],
        )?;
        let indexer_status = GaugeVec::new(
            Opts::new(
                "aibrix_prefix_cache_indexer_status",
                "Which prefix indexer is in use (1) or not (0)",
            ),
            &["model", "indexer_type"],
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "prefixgate_requests_total",
                "Requests answered, by model, pod and status code",
            ),
            &["model", "pod", "code"],
        )?;
        let outstanding = IntGaugeVec::new(
            Opts::new(
                "prefixgate_outstanding_requests",
                "Requests routed to a pod whose responses have not finished",
            ),
            &["pod"],
        )?;
        let ready = IntGaugeVec::new(
            Opts::new(
                "prefixgate_replica_ready",
                "Whether a replica takes new requests",
            ),
            &["pod"],
        )?;
        let engine_missing = IntGaugeVec::new(
            Opts::new(
                "prefixgate_engine_metric_missing",
                "1 for each vLLM gauge the load view reads that the replica's /metrics lacked at the last engine scrape (renamed or not exported by this vLLM version; never read as zero)",
            ),
            &["pod", "metric"],
        )?;
        // Per model, for autoscalers (HPA, KEDA): what the replicas of a model have in flight
        // through this gateway, how many take requests, and how many wait in their engines.
        let model_in_flight = IntGaugeVec::new(
            Opts::new(
                "prefixgate_model_in_flight_requests",
                "Requests in flight through this gateway on the replicas serving the model",
            ),
            &["model"],
        )?;
        let model_ready = IntGaugeVec::new(
            Opts::new(
                "prefixgate_model_ready_replicas",
                "Replicas serving the model that take new requests",
            ),
            &["model"],
        )?;
        let model_queue = IntGaugeVec::new(
            Opts::new(
                "prefixgate_model_queue_depth",
                "Requests waiting in the engines of the model's replicas (vllm:num_requests_waiting summed; engine scrape)",
            ),
            &["model"],
        )?;
        let upstream_ttft = HistogramVec::new(
            HistogramOpts::new(
                "prefixgate_upstream_ttft_seconds",
                "Time from sending a request upstream to the first response body chunk",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["pod"],
        )?;
        let upstream_total = HistogramVec::new(
            HistogramOpts::new(
                "prefixgate_upstream_total_seconds",
                "Time from sending a request upstream to the end of its response body",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["pod"],
        )?;
        let retries = IntCounterVec::new(
            Opts::new(
                "prefixgate_upstream_retries_total",
                "Requests retried on another replica after this pod failed before any byte",
            ),
            &["pod"],
        )?;
        let resumes = IntCounterVec::new(
            Opts::new(
                "prefixgate_stream_resumes_total",
                "Streams broken mid-answer that the gateway tried to carry on on another \
                 replica, by outcome (resumed, failed, deadline, exhausted, not_resumable)",
            ),
            &["outcome"],
        )?;
        let ejections = IntCounterVec::new(
            Opts::new(
                "prefixgate_replica_ejections_total",
                "Replicas ejected after consecutive failures",
            ),
            &["pod"],
        )?;
        let readmissions = IntCounterVec::new(
            Opts::new(
                "prefixgate_replica_readmissions_total",
                "Ejected replicas re-admitted",
            ),
            &["pod"],
        )?;
        let admission_rejections = IntCounterVec::new(
            Opts::new(
                "prefixgate_admission_rejections_total",
                "Requests refused by admission, by reason",
            ),
            &["reason"],
        )?;
        let cache_reports = IntCounterVec::new(
            Opts::new(
                "prefixgate_cache_reports_total",
                "Responses whose usage.prompt_tokens_details.cached_tokens was compared with \
                 what the prefix index believed the pod held, by verdict (confirmed, missed, \
                 surprised, unreported, invalid)",
            ),
            &["pod", "verdict"],
        )?;
        let cache_trust = GaugeVec::new(
            Opts::new(
                "prefixgate_cache_trust",
                "Learned from the engines' cached_tokens: the share of the blocks the prefix \
                 index credits to a pod that it held (share=held), and of the others that it \
                 held all the same (share=unheld)",
            ),
            &["pod", "share"],
        )?;
        registry.register(Box::new(cache_reports.clone()))?;
        registry.register(Box::new(cache_trust.clone()))?;
        registry.register(Box::new(admission_rejections.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(selections.clone()))?;
        registry.register(Box::new(routing_errors.clone()))?;
        registry.register(Box::new(load_imbalance.clone()))?;
        registry.register(Box::new(routing_latency.clone()))?;
        registry.register(Box::new(indexer_status.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(outstanding.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        registry.register(Box::new(engine_missing.clone()))?;
        registry.register(Box::new(model_in_flight.clone()))?;
        registry.register(Box::new(model_ready.clone()))?;
        registry.register(Box::new(model_queue.clone()))?;
        registry.register(Box::new(upstream_ttft.clone()))?;
        registry.register(Box::new(upstream_total.clone()))?;
        registry.register(Box::new(retries.clone()))?;
        registry.register(Box::new(resumes.clone()))?;
        registry.register(Box::new(ejections.clone()))?;
        registry.register(Box::new(readmissions.clone()))?;
        // AIBrix v0.7.0 sets this once at construction with an empty model label.
        indexer_status
            .with_label_values(&["", "local"])
            .set(if kv_sync { 0.0 } else { 1.0 });
        indexer_status
            .with_label_values(&["", "sync"])
            .set(if kv_sync { 1.0 } else { 0.0 });
        let kv_sync_metrics = if kv_sync {
            Some(KvSyncMetrics::register_ranked(
                &registry,
                data_parallel_size,
            )?)
        } else {
            None
        };
        let families = Families {
            using_kv_sync: if kv_sync { "true" } else { "false" },
            kv_sync: kv_sync_metrics,
            registry,
            decisions,
            selections,
            routing_errors,
            load_imbalance,
            routing_latency,
            requests,
            outstanding,
            ready,
            engine_missing,
            model_in_flight,
            model_ready,
            model_queue,
            upstream_ttft,
            upstream_total,
            retries,
            resumes,
            ejections,
            readmissions,
            admission_rejections,
            cache_reports,
            cache_trust,
            rendering: std::sync::Mutex::new(()),
        };
        Ok(Metrics {
            families: Arc::new(families),
        })
    }

    /// The registry, for parts that register their own families (cluster sharing).
    pub fn registry(&self) -> &Registry {
        &self.families.registry
    }

    /// The `aibrix_kvcache_zmq_*` families, when KV-event sync is on.
    pub fn kv_sync(&self) -> Option<&KvSyncMetrics> {
        self.families.kv_sync.as_ref()
    }

    /// Counts a prefix-cache routing error that did not stop the route (the engine's
    /// `/tokenize` failed and the text tokenizer was used instead); no latency is observed,
    /// the decision that follows observes it.
    pub fn count_routing_error(&self, model: &str, reason: &str) {
        self.families
            .routing_errors
            .with_label_values(&[model, reason, self.families.using_kv_sync])
            .inc();
    }

    /// Records a failed prefix-cache route (AIBrix observes latency on errors too).
    pub fn record_routing_error(&self, model: &str, reason: &str, latency: Duration) {
        self.families
            .routing_errors
            .with_label_values(&[model, reason, self.families.using_kv_sync])
            .inc();
        self.families
            .routing_latency
            .with_label_values(&[model, self.families.using_kv_sync])
            .observe(latency.as_secs_f64());
    }

    /// Counts one answered request (`pod` empty when none was chosen); a request a replica
    /// answered is counted through its [`PodMetrics`].
    pub fn record_request(&self, model: &str, pod: &str, code: u16) {
        self.families.requests_series(model, pod, code).inc();
    }

    /// Counts one resume of a broken stream by its outcome (`resumed`: a continuation
    /// streams; `failed`, `deadline`, `exhausted`, `not_resumable`: the stream ended with an
    /// error event instead).
    pub fn record_resume(&self, outcome: &str) {
        self.families.resumes.with_label_values(&[outcome]).inc();
    }

    pub fn record_ejection(&self, pod: &str) {
        self.families.ejections.with_label_values(&[pod]).inc();
    }

    /// Counts a request refused by admission (`unauthorized`, `global_in_flight`,
    /// `tenant_in_flight`, `token_rate` for a tenant's empty token bucket, `token_burst` for
    /// a request larger than its tenant's whole burst).
    pub fn record_admission_rejection(&self, reason: &str) {
        self.families
            .admission_rejections
            .with_label_values(&[reason])
            .inc();
    }

    pub fn record_readmission(&self, pod: &str) {
        self.families.readmissions.with_label_values(&[pod]).inc();
    }

    /// The text exposition, with the per-pod gauges refreshed from `pods` first.
    pub fn render<'a>(&self, pods: impl IntoIterator<Item = PodGauges<'a>>) -> String {
        let f = &self.families;
        let _one_at_a_time = f
            .rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Rebuilt from the set as it is now, so a replica or model that left (a drain, a
        // removal, a pod gone) leaves the exposition instead of freezing at its last value.
        for family in [
            &f.outstanding,
            &f.ready,
            &f.engine_missing,
            &f.model_in_flight,
            &f.model_ready,
            &f.model_queue,
        ] {
            family.reset();
        }
        f.cache_trust.reset();
        let mut per_model: BTreeMap<&str, (i64, i64, Option<i64>)> = BTreeMap::new();
        for pod in pods {
            let outstanding = i64::try_from(pod.outstanding).unwrap_or(i64::MAX);
            f.outstanding.with_label_values(&[pod.pod]).set(outstanding);
            f.ready
                .with_label_values(&[pod.pod])
                .set(i64::from(pod.ready));
            for metric in pod.engine_missing {
                f.engine_missing
                    .with_label_values(&[pod.pod, metric])
                    .set(1);
            }
            f.cache_trust
                .with_label_values(&[pod.pod, "held"])
                .set(pod.cache_trust.held);
            f.cache_trust
                .with_label_values(&[pod.pod, "unheld"])
                .set(pod.cache_trust.unheld);
            for model in pod.models {
                let entry = per_model.entry(model.as_str()).or_default();
                entry.0 = entry.0.saturating_add(outstanding);
                entry.1 += i64::from(pod.ready);
                if let Some(waiting) = pod.engine_waiting {
                    let waiting = i64::try_from(waiting).unwrap_or(i64::MAX);
                    entry.2 = Some(entry.2.unwrap_or(0).saturating_add(waiting));
                }
            }
        }
        for (model, (in_flight, ready, queue)) in per_model {
            f.model_in_flight.with_label_values(&[model]).set(in_flight);
            f.model_ready.with_label_values(&[model]).set(ready);
            if let Some(queue) = queue {
                f.model_queue.with_label_values(&[model]).set(queue);
            }
        }
        let mut buffer = Vec::new();
        if let Err(error) = TextEncoder::new().encode(&self.families.registry.gather(), &mut buffer)
        {
            tracing::warn!(%error, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }
}

impl Families {
    /// The `prefixgate_requests_total` series of `model`, `pod` and `code`.
    fn requests_series(&self, model: &str, pod: &str, code: u16) -> IntCounter {
        // Every status a response can carry is a valid `StatusCode`, whose text is static:
        // no string is built.
        match http::StatusCode::from_u16(code) {
            Ok(status) => self
                .requests
                .with_label_values(&[model, pod, status.as_str()]),
            Err(_) => self
                .requests
                .with_label_values(&[model, pod, &code.to_string()]),
        }
    }
}

/// The `selection` and `match_percent_bucket` labels of a decision that moves the AIBrix
/// counters: those of prefix-aware policies (`prefix-cache` and `prefix-load`) that consulted
/// the index (`selection` set), which excludes `random`, `least-request` and the single-pod
/// short-circuit; `None` for the others.
///
/// `prefix-load` moves them too so that its phases can be read with the same dashboards (it
/// adds the `cost_model` selection label); an A/B comparison reads the counters' deltas per
/// phase, one strategy at a time, as the load generator does.
fn aibrix_labels(decision: &Decision) -> Option<(&'static str, &'static str)> {
    if !decision.strategy.uses_prefix_index() {
        return None;
    }
    let (Some(selection), Some(bucket)) = (decision.selection, decision.bucket()) else {
        return None;
    };
    Some((selection.as_str(), bucket.as_str()))
}

#[cfg(test)]
mod tests;
