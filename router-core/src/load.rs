//! The load view: per-pod outstanding request counts tracked by the caller, plus engine
//! statistics scraped from the replica when available.
//!
//! Outstanding counts are incremented by the router as part of a decision (not after it, as
//! AIBrix v0.7.0 does in its issue #2422 race) and decremented exactly once when the
//! [`OutstandingGuard`] returned with the decision is dropped. The gateway keeps that guard in
//! the response body, so stream end, upstream failure and client disconnect all release it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Engine statistics scraped from a replica's `/metrics` (`vllm:num_requests_running`,
/// `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStats {
    pub running: u32,
    pub waiting: u32,
    /// KV-cache usage in [0, 1].
    pub kv_usage: f64,
}

/// One pod's live load. Shared (`Arc`) between the replica set, in-flight guards and
/// policies; every field is atomic so readers never lock.
#[derive(Debug, Default)]
pub struct PodLoad {
    outstanding: AtomicU64,
    /// `u32::MAX` means "no scrape yet".
    running: AtomicU32,
    waiting: AtomicU32,
    /// `f64` bits of the KV usage.
    kv_usage_bits: AtomicU64,
}

const NO_STATS: u32 = u32::MAX;

impl PodLoad {
    /// A pod with no requests outstanding and no engine statistics yet.
    pub fn new() -> Arc<Self> {
        Arc::new(PodLoad {
            outstanding: AtomicU64::new(0),
            running: AtomicU32::new(NO_STATS),
            waiting: AtomicU32::new(NO_STATS),
            kv_usage_bits: AtomicU64::new(0),
        })
    }

    /// A pod with a given outstanding count (route replay and tests, where the count comes
    /// from the trace rather than from live requests).
    pub fn with_outstanding(count: u64) -> Arc<Self> {
        let load = Self::new();
        load.outstanding.store(count, Ordering::Relaxed);
        load
    }

    /// Requests routed to this pod whose responses have not finished.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Counts one more request and returns the guard that will count it out. The guard
    /// carries the count seen just before this request.
    pub fn acquire(self: &Arc<Self>) -> OutstandingGuard {
        let before = self.outstanding.fetch_add(1, Ordering::AcqRel);
        OutstandingGuard {
            load: Arc::clone(self),
            at_selection: before,
        }
    }

    /// Records a fresh engine scrape.
    pub fn set_engine_stats(&self, stats: EngineStats) {
        self.running.store(stats.running, Ordering::Relaxed);
        self.waiting.store(stats.waiting, Ordering::Relaxed);
        self.kv_usage_bits
            .store(stats.kv_usage.to_bits(), Ordering::Relaxed);
    }

    /// Forgets the engine statistics (the scrape failed or went stale).
    pub fn clear_engine_stats(&self) {
        self.running.store(NO_STATS, Ordering::Relaxed);
        self.waiting.store(NO_STATS, Ordering::Relaxed);
    }

    /// The last engine scrape, if any.
    pub fn engine_stats(&self) -> Option<EngineStats> {
        let running = self.running.load(Ordering::Relaxed);
        let waiting = self.waiting.load(Ordering::Relaxed);
        if running == NO_STATS || waiting == NO_STATS {
            return None;
        }
        Some(EngineStats {
            running,
            waiting,
            kv_usage: f64::from_bits(self.kv_usage_bits.load(Ordering::Relaxed)),
        })
    }
}

/// Holds one outstanding request against a pod; dropping it releases the count exactly once.
#[derive(Debug)]
#[must_use = "dropping the guard immediately releases the outstanding count"]
pub struct OutstandingGuard {
    load: Arc<PodLoad>,
    at_selection: u64,
}

impl OutstandingGuard {
    /// The pod's outstanding count just before this request was counted.
    pub fn at_selection(&self) -> u64 {
        self.at_selection
    }
}

impl Drop for OutstandingGuard {
    fn drop(&mut self) {
        self.load.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A ready pod as a policy sees it: its name and its live load.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub load: &'a Arc<PodLoad>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_counts_in_and_out_exactly_once() {
        let load = PodLoad::new();
        let a = load.acquire();
        let b = load.acquire();
        assert_eq!((a.at_selection(), b.at_selection()), (0, 1));
        assert_eq!(load.outstanding(), 2);
        drop(a);
        assert_eq!(load.outstanding(), 1);
        drop(b);
        assert_eq!(load.outstanding(), 0);
    }

    #[test]
    fn engine_stats_absent_until_scraped() {
        let load = PodLoad::new();
        assert_eq!(load.engine_stats(), None);
        let stats = EngineStats {
            running: 3,
            waiting: 1,
            kv_usage: 0.25,
        };
        load.set_engine_stats(stats);
        assert_eq!(load.engine_stats(), Some(stats));
        load.clear_engine_stats();
        assert_eq!(load.engine_stats(), None);
    }
}
