//! The replicas the gateway routes to, and how their set and health are kept current.
//!
//! A [`Replica`] is one upstream (a vLLM pod or a mock engine): its name, address, the models
//! it serves, its live load (router-core's [`PodLoad`]) and its health. The set is an
//! [`ArcSwap`] snapshot ([`Replicas`]): discovery swaps in a new `Arc<Vec<…>>`, the request path
//! only loads it, so nothing on the request path takes a lock. Sources and background work
//! each have their own module: [`discovery`] (the `[discovery]` settings), [`static_`] (flags
//! and config file), [`embedded`] (in-process mock engines, with the default `mock-engines`
//! cargo feature), [`kubernetes`] (pods watched
//! through the API server), [`health`] (active probes, ejection, re-admission, model
//! discovery), [`engine_scrape`] (vLLM gauges into the load view) and [`kv_events`] (where a
//! replica publishes KV-cache events), and [`admin`] (the runtime admin API: list, add,
//! drain, remove). Health checks and the scrape read the current snapshot on every tick, so
//! they cover whatever discovery or the admin API has put there.
//!
//! A replica is **routable** while it is ready (not ejected by health) and not draining. A
//! draining replica takes no new request; the requests already on it hold its `Arc` and run
//! to their end, wherever the set has moved since.

pub mod admin;
pub mod discovery;
#[cfg(feature = "mock-engines")]
pub mod embedded;
#[cfg(not(feature = "mock-engines"))]
pub mod no_embedded;
#[cfg(not(feature = "mock-engines"))]
pub use no_embedded as embedded;
pub mod engine_scrape;
pub mod health;
pub mod kubernetes;
pub mod kv_events;
pub mod static_;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use router_core::PodLoad;

use self::engine_scrape::MissingGauges;
use self::kv_events::EventEndpoints;
use crate::metrics::{Metrics, PodMetrics};

/// One upstream replica.
#[derive(Debug)]
pub struct Replica {
    name: String,
    /// `host:port`, used for the upstream URI and the `target-pod-ip` header.
    authority: String,
    /// Models served; from config, or filled in from the replica's `/v1/models`.
    models: ArcSwap<Vec<String>>,
    load: Arc<PodLoad>,
    ready: AtomicBool,
    consecutive_failures: AtomicU32,
    consecutive_successes: AtomicU32,
    /// Where it publishes KV-cache events, when it says so itself (embedded mock engines);
    /// otherwise KV-event sync derives them from `[kv_sync]`'s ports and the host.
    kv_events: Option<EventEndpoints>,
    /// Whether KV-event sync subscribes to it (all static and embedded replicas; Kubernetes
    /// pods only with AIBrix's `model.aibrix.ai/kv-events-enabled: "true"` label).
    publishes_kv_events: bool,
    /// Set when it is leaving (an admin drain): it takes no new request.
    draining: AtomicBool,
    /// The engine gauges its last readable `/metrics` lacked ([`MissingGauges`] bits).
    engine_missing: AtomicU8,
    /// Whether its last engine scrape failed (unreachable, an error status).
    engine_scrape_failing: AtomicBool,
    origin: Origin,
    /// Its metric series, made on its first request and dropped with it.
    metrics: OnceLock<Arc<PodMetrics>>,
}

/// Where a replica came from; decides what the admin API may do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `[[backends]]` or `--backend`.
    Static,
    /// `--mock-engines N`, in this process.
    #[cfg_attr(
        not(feature = "mock-engines"),
        expect(
            dead_code,
            reason = "only the mock-engines feature starts embedded replicas"
        )
    )]
    Embedded,
    /// A pod found by Kubernetes discovery (only the watch adds and removes it).
    Kubernetes,
    /// `POST /admin/replicas` (forgotten on restart).
    Admin,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Static => "static",
            Origin::Embedded => "embedded",
            Origin::Kubernetes => "kubernetes",
            Origin::Admin => "admin",
        }
    }
}

/// What a failure or success report did to a replica's readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    Unchanged,
    Ejected,
    Readmitted,
}

impl Replica {
    /// A replica that starts ready (it is ejected only after failures are observed).
    pub fn new(name: impl Into<String>, authority: impl Into<String>, models: Vec<String>) -> Self {
        Replica {
            name: name.into(),
            authority: authority.into(),
            models: ArcSwap::from_pointee(models),
            load: PodLoad::new(),
            ready: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            consecutive_successes: AtomicU32::new(0),
            kv_events: None,
            publishes_kv_events: true,
            draining: AtomicBool::new(false),
            engine_missing: AtomicU8::new(0),
            engine_scrape_failing: AtomicBool::new(false),
            origin: Origin::Static,
            metrics: OnceLock::new(),
        }
    }

    /// The same replica, from `origin`.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Stops new requests from reaching it; returns whether it was not draining before.
    pub fn start_draining(&self) -> bool {
        !self.draining.swap(true, Ordering::AcqRel)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// `draining`, `ready` or `ejected` (by health checks or refused connections).
    pub fn state(&self) -> &'static str {
        if self.is_draining() {
            "draining"
        } else if self.ready.load(Ordering::Acquire) {
            "ready"
        } else {
            "ejected"
        }
    }

    /// The same replica, left out of KV-event sync.
    pub fn without_kv_events(mut self) -> Self {
        self.publishes_kv_events = false;
        self
    }

    /// Whether KV-event sync subscribes to it.
    pub fn publishes_kv_events(&self) -> bool {
        self.publishes_kv_events
    }

    /// The same replica, publishing KV-cache events at `endpoints`.
    pub fn with_kv_events(mut self, endpoints: EventEndpoints) -> Self {
        self.kv_events = Some(endpoints);
        self
    }

    /// Its own KV-event endpoints, if it has them.
    pub fn kv_events(&self) -> Option<&EventEndpoints> {
        self.kv_events.as_ref()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// `http://host:port`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.authority)
    }

    /// Records which engine gauges its `/metrics` lacked; returns those of the scrape before.
    pub fn set_engine_missing(&self, missing: MissingGauges) -> MissingGauges {
        MissingGauges::from_bits(self.engine_missing.swap(missing.bits(), Ordering::AcqRel))
    }

    /// The engine gauges its last readable `/metrics` lacked.
    pub fn engine_missing(&self) -> MissingGauges {
        MissingGauges::from_bits(self.engine_missing.load(Ordering::Acquire))
    }

    /// Records whether its engine scrape failed; returns whether the one before had.
    pub fn set_engine_scrape_failing(&self, failing: bool) -> bool {
        self.engine_scrape_failing.swap(failing, Ordering::AcqRel)
    }

    pub fn load(&self) -> &Arc<PodLoad> {
        &self.load
    }

    /// Its series in `metrics`, resolved on first use and kept for its life, so its
    /// requests do no label lookup ([`PodMetrics`]).
    pub fn metrics(&self, metrics: &Metrics) -> Arc<PodMetrics> {
        let mine = self
            .metrics
            .get_or_init(|| Arc::new(metrics.pod(&self.name)));
        if mine.belongs_to(metrics) {
            Arc::clone(mine)
        } else {
            // Another gateway state's metrics (tests share replicas between states): correct
            // series, looked up afresh.
            Arc::new(metrics.pod(&self.name))
        }
    }

    /// Whether the replica takes new requests: not ejected and not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.is_draining()
    }

    /// The models the replica serves (empty until known).
    pub fn models(&self) -> Arc<Vec<String>> {
        self.models.load_full()
    }

    pub fn serves(&self, model: &str) -> bool {
        self.models.load().iter().any(|m| m == model)
    }

    /// Replaces the model list (from discovery).
    pub fn set_models(&self, models: Vec<String>) {
        self.models.store(Arc::new(models));
    }

    /// Counts a failed probe or refused connection; ejects after `threshold` in a row.
    pub fn report_failure(&self, threshold: u32) -> HealthChange {
        self.consecutive_successes.store(0, Ordering::Release);
        let failures = self.consecutive_failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= threshold && self.ready.swap(false, Ordering::AcqRel) {
            return HealthChange::Ejected;
        }
        HealthChange::Unchanged
    }

    /// Counts a good probe; re-admits an ejected replica after `threshold` in a row.
    pub fn report_success(&self, threshold: u32) -> HealthChange {
        self.consecutive_failures.store(0, Ordering::Release);
        let successes = self.consecutive_successes.fetch_add(1, Ordering::AcqRel) + 1;
        if successes >= threshold && !self.ready.swap(true, Ordering::AcqRel) {
            return HealthChange::Readmitted;
        }
        HealthChange::Unchanged
    }
}

/// The current replica set, swapped atomically by discovery.
#[derive(Debug)]
pub struct Replicas {
    current: ArcSwap<Vec<Arc<Replica>>>,
}

impl Replicas {
    pub fn new(replicas: Vec<Arc<Replica>>) -> Self {
        Replicas {
            current: ArcSwap::from_pointee(replicas),
        }
    }

    /// The set as of now; later swaps do not affect the returned snapshot.
    pub fn snapshot(&self) -> Arc<Vec<Arc<Replica>>> {
        self.current.load_full()
    }

    /// Replaces the whole set.
    pub fn replace(&self, replicas: Vec<Arc<Replica>>) {
        self.current.store(Arc::new(replicas));
    }

    /// The replica named `name`, if it is in the set.
    pub fn find(&self, name: &str) -> Option<Arc<Replica>> {
        self.current
            .load()
            .iter()
            .find(|r| r.name() == name)
            .map(Arc::clone)
    }

    /// Adds `replica` unless one of that name is in the set (then that one is the error).
    /// A compare-and-swap on the snapshot, so concurrent adds and removals never lose one
    /// another's change.
    pub fn add(&self, replica: Arc<Replica>) -> Result<(), Arc<Replica>> {
        let mut clash = None;
        self.current.rcu(|current| {
            clash = current.iter().find(|r| r.name() == replica.name()).cloned();
            let mut next = current.as_ref().clone();
            if clash.is_none() {
                next.push(Arc::clone(&replica));
            }
            next
        });
        clash.map_or(Ok(()), Err)
    }

    /// Removes `replica` (this very one, not a later replica of the same name); returns
    /// whether it was in the set.
    pub fn remove(&self, replica: &Arc<Replica>) -> bool {
        let mut found = false;
        self.current.rcu(|current| {
            found = current.iter().any(|r| Arc::ptr_eq(r, replica));
            current
                .iter()
                .filter(|r| !Arc::ptr_eq(r, replica))
                .cloned()
                .collect::<Vec<_>>()
        });
        found
    }

    /// The union of every replica's models, sorted, without duplicates.
    pub fn models(&self) -> Vec<String> {
        let mut models: Vec<String> = self
            .current
            .load()
            .iter()
            .flat_map(|r| r.models().as_ref().clone())
            .collect();
        models.sort();
        models.dedup();
        models
    }

    /// Whether any replica can serve a request: ready, with its models known (a replica
    /// whose `/v1/models` has not answered yet serves nothing).
    pub fn any_ready(&self) -> bool {
        self.current
            .load()
            .iter()
            .any(|r| r.is_ready() && !r.models.load().is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejects_after_threshold_and_readmits() {
        let replica = Replica::new("a", "127.0.0.1:1", vec!["m".into()]);
        assert!(replica.is_ready());
        assert_eq!(replica.report_failure(3), HealthChange::Unchanged);
        assert_eq!(replica.report_failure(3), HealthChange::Unchanged);
        assert_eq!(replica.report_failure(3), HealthChange::Ejected);
        assert!(!replica.is_ready());
        assert_eq!(
            replica.report_failure(3),
            HealthChange::Unchanged,
            "ejected once"
        );
        assert_eq!(replica.report_success(2), HealthChange::Unchanged);
        assert_eq!(replica.report_success(2), HealthChange::Readmitted);
        assert!(replica.is_ready());
    }

    #[test]
    fn a_success_resets_the_failure_run() {
        let replica = Replica::new("a", "127.0.0.1:1", vec![]);
        replica.report_failure(2);
        replica.report_success(1);
        assert_eq!(replica.report_failure(2), HealthChange::Unchanged);
        assert!(replica.is_ready());
    }

    #[test]
    fn a_draining_replica_is_not_ready_whatever_health_says() {
        let replica = Replica::new("a", "127.0.0.1:1", vec![]);
        assert_eq!(replica.state(), "ready");
        assert!(replica.start_draining());
        assert!(!replica.start_draining(), "already draining");
        assert!(!replica.is_ready());
        assert_eq!(replica.state(), "draining");
        replica.report_success(1);
        assert!(!replica.is_ready(), "a good probe does not undo a drain");
        let ejected = Replica::new("b", "127.0.0.1:2", vec![]);
        ejected.report_failure(1);
        assert_eq!(ejected.state(), "ejected");
    }

    #[test]
    fn adds_refuse_a_taken_name_and_removals_take_that_very_replica() {
        let a = Arc::new(Replica::new("a", "h:1", vec![]));
        let replicas = Replicas::new(vec![Arc::clone(&a)]);
        let twin = Arc::new(Replica::new("a", "h:9", vec![]));
        let clash = replicas.add(Arc::clone(&twin)).unwrap_err();
        assert!(Arc::ptr_eq(&clash, &a));
        let b = Arc::new(Replica::new("b", "h:2", vec![]));
        replicas.add(Arc::clone(&b)).unwrap();
        assert!(Arc::ptr_eq(&replicas.find("b").unwrap(), &b));
        assert!(!replicas.remove(&twin), "not in the set");
        assert!(replicas.remove(&a));
        let names: Vec<String> = replicas
            .snapshot()
            .iter()
            .map(|r| r.name().to_owned())
            .collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn a_replica_resolves_its_series_once_and_only_in_its_own_metrics() {
        let replica = Replica::new("a", "h:1", vec!["m".into()]);
        let metrics = Metrics::new().unwrap();
        let first = replica.metrics(&metrics);
        assert!(Arc::ptr_eq(&first, &replica.metrics(&metrics)), "kept");
        assert_eq!(first.pod(), "a");
        // Another state's metrics (tests share replicas): its own series, not the first's.
        let other = Metrics::new().unwrap();
        let theirs = replica.metrics(&other);
        assert!(theirs.belongs_to(&other) && !theirs.belongs_to(&metrics));
        theirs.record_retry();
        let retried = r#"prefixgate_upstream_retries_total{pod="a"} 1"#;
        assert!(other.render([]).contains(retried));
        assert!(!metrics.render([]).contains(retried));
    }

    #[test]
    fn models_are_the_sorted_union() {
        let a = Arc::new(Replica::new("a", "h:1", vec!["y".into(), "x".into()]));
        let b = Arc::new(Replica::new("b", "h:2", vec!["x".into()]));
        let replicas = Replicas::new(vec![a, b.clone()]);
        assert_eq!(replicas.models(), vec!["x".to_owned(), "y".to_owned()]);
        b.set_models(vec!["z".into()]);
        assert_eq!(replicas.models(), vec!["x", "y", "z"]);
    }
}
