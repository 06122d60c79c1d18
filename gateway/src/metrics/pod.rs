//! One replica's metric series, resolved once and kept with the replica ([`PodMetrics`]).
//!
//! A request moves up to eight series: the four AIBrix decision series of its model, its
//! `prefixgate_requests_total` series, the replica's TTFT and total-time histograms and one
//! cache-report counter. Found by label values, each costs a hash of the values, a read
//! lock on the family and a reference count taken and given back, on every request. Here
//! each is looked up once, the first time something is counted on it, and kept; later
//! requests to the replica use the handle directly. Resolving on first use rather than when
//! the replica joins keeps the exposition as it was: a series appears only once something
//! was counted on it (a series resolved in advance would show as a 0 from the start).
//!
//! The handles live with the [`crate::replicas::Replica`] and are dropped with it when it
//! leaves the set and its last request ends. Its counters and histograms stay in the
//! exposition, as they always have (a counter that vanished and came back would read as a
//! reset); only the per-pod gauges follow the set, rebuilt at each scrape.

use std::borrow::Borrow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus::{Counter, Histogram, IntCounter};
use router_core::Decision;
use router_core::load::Verdict;

use super::{Families, Metrics};

/// The series one replica's requests move, each resolved on first use (see the module docs).
#[derive(Debug)]
pub struct PodMetrics {
    families: Arc<Families>,
    pod: String,
    ttft: OnceLock<Histogram>,
    total: OnceLock<Histogram>,
    retries: OnceLock<IntCounter>,
    cache_reports: SeriesByKey<&'static str, IntCounter>,
    /// Per model requested through this replica (usually one).
    models: SeriesByKey<String, Arc<ModelSeries>>,
}

/// The series of one model's requests through one replica.
#[derive(Debug, Default)]
struct ModelSeries {
    /// `prefixgate_requests_total`, by status code.
    requests: SeriesByKey<u16, IntCounter>,
    /// The AIBrix decision series: by match-percent bucket, by selection, the imbalance
    /// counter and the routing latency.
    decisions: SeriesByKey<&'static str, Counter>,
    selections: SeriesByKey<&'static str, Counter>,
    imbalance: OnceLock<Counter>,
    latency: OnceLock<Histogram>,
}

/// Series of one family told apart by a small key (a status code, a verdict, a model),
/// each resolved once. Lookups scan a snapshot of the few known keys without a lock; a key
/// seen for the first time is added by swapping in a longer list.
#[derive(Debug)]
struct SeriesByKey<K, M> {
    known: ArcSwap<Vec<(K, M)>>,
}

impl<K, M> Default for SeriesByKey<K, M> {
    fn default() -> Self {
        SeriesByKey {
            known: ArcSwap::from_pointee(Vec::new()),
        }
    }
}

impl<K: Clone, M: Clone> SeriesByKey<K, M> {
    /// Applies `use_series` to the series of `key`, resolving it first if it is new.
    fn with<Q>(&self, key: &Q, resolve: impl FnOnce() -> M, use_series: impl FnOnce(&M))
    where
        K: Borrow<Q>,
        Q: PartialEq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some((_, series)) = self.known.load().iter().find(|(k, _)| k.borrow() == key) {
            use_series(series);
            return;
        }
        // Resolving twice (two requests racing on a new key) finds the same series in the
        // family both times; only one copy is kept.
        let series = resolve();
        self.known.rcu(|known| {
            let mut next = Vec::clone(known);
            if !next.iter().any(|(k, _)| k.borrow() == key) {
                next.push((key.to_owned(), series.clone()));
            }
            next
        });
        use_series(&series);
    }
}

impl Metrics {
    /// The series of the replica named `pod`, none resolved yet.
    pub fn pod(&self, pod: &str) -> PodMetrics {
        PodMetrics {
            families: Arc::clone(&self.families),
            pod: pod.to_owned(),
            ttft: OnceLock::new(),
            total: OnceLock::new(),
            retries: OnceLock::new(),
            cache_reports: SeriesByKey::default(),
            models: SeriesByKey::default(),
        }
    }
}

impl PodMetrics {
    /// The replica's name (its `pod` label).
    pub fn pod(&self) -> &str {
        &self.pod
    }

    /// Whether these are series of `metrics` (a replica shared by two gateways' states, as
    /// only tests do, keeps the first one's).
    pub fn belongs_to(&self, metrics: &Metrics) -> bool {
        Arc::ptr_eq(&self.families, &metrics.families)
    }

    /// Records a routing decision that chose this replica: as
    /// [`Metrics::record_decision`], without a label lookup once the series are known.
    pub fn record_decision(&self, model: &str, decision: &Decision, latency: Duration) {
        let Some((selection, bucket)) = super::aibrix_labels(decision) else {
            return;
        };
        let f = &*self.families;
        let kv = f.using_kv_sync;
        self.model(model, |series| {
            if decision.imbalance {
                series
                    .imbalance
                    .get_or_init(|| f.load_imbalance.with_label_values(&[model, kv]))
                    .inc();
            }
            series.decisions.with(
                &bucket,
                || f.decisions.with_label_values(&[model, bucket, kv]),
                Counter::inc,
            );
            series.selections.with(
                &selection,
                || f.selections.with_label_values(&[model, selection, kv]),
                Counter::inc,
            );
            series
                .latency
                .get_or_init(|| f.routing_latency.with_label_values(&[model, kv]))
                .observe(latency.as_secs_f64());
        });
    }

    /// Counts one request this replica answered with `code`.
    pub fn record_request(&self, model: &str, code: u16) {
        self.model(model, |series| {
            series.requests.with(
                &code,
                || self.families.requests_series(model, &self.pod, code),
                IntCounter::inc,
            );
        });
    }

    pub fn observe_ttft(&self, elapsed: Duration) {
        self.ttft
            .get_or_init(|| self.families.upstream_ttft.with_label_values(&[&self.pod]))
            .observe(elapsed.as_secs_f64());
    }

    pub fn observe_total(&self, elapsed: Duration) {
        self.total
            .get_or_init(|| self.families.upstream_total.with_label_values(&[&self.pod]))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a request retried elsewhere after this replica failed it before any byte.
    pub fn record_retry(&self) {
        self.retries
            .get_or_init(|| self.families.retries.with_label_values(&[&self.pod]))
            .inc();
    }

    /// Counts what one response's `cached_tokens` said about the prefix index's view of
    /// this replica.
    pub fn record_cache_report(&self, verdict: Verdict) {
        let label = verdict.as_str();
        self.cache_reports.with(
            &label,
            || {
                self.families
                    .cache_reports
                    .with_label_values(&[&self.pod, label])
            },
            IntCounter::inc,
        );
    }

    fn model(&self, model: &str, use_series: impl FnOnce(&ModelSeries)) {
        self.models.with(
            model,
            || Arc::new(ModelSeries::default()),
            |series| use_series(series),
        );
    }
}
