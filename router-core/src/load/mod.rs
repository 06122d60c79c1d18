//! The load view: per-pod outstanding request counts tracked by the caller, plus engine
//! statistics scraped from the replica when available.
//!
//! Outstanding counts are incremented by the router as part of a decision (not after it, as
//! AIBrix v0.7.0 does in its issue #2422 race) and decremented exactly once when the
//! [`InFlight`] returned with the decision ends or is dropped. The gateway keeps it in the
//! response body and the simulator beside its engine request, so stream end, upstream
//! failure and client disconnect all release it; both drive its lifecycle (decided → first
//! byte → end) the same way ([`in_flight`]).
//!
//! Besides the count, each pod carries two work signals that `prefix-load` reads, in blocks
//! of the router's block size (the prompt's full blocks, as hashed):
//! - **active blocks**: the prompt blocks of its outstanding requests (released with the
//!   count), a measure of the decode work and KV memory already placed there;
//! - **pending prefill blocks**: the blocks each outstanding request was expected to prefill
//!   (those not already held there, per the prefix index), released by
//!   [`InFlight::first_byte`] when the first response byte arrives, or with the
//!   count if it never does. This is Dynamo's "prefill blocks after overlap" as a live sum.
//!
//! Only prefix-aware strategies hash the prompt, so requests routed by `random` or
//! `least-request` add no blocks (they still count as outstanding).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use crate::Millis;
use crate::families::RecentFamilies;

mod decoding;
mod evidence;
mod in_flight;
mod slots;
mod speed;

pub use decoding::PROGRESS_EVERY;
pub use evidence::{CacheEvidence, CacheTrust, Verdict};
pub use in_flight::InFlight;
pub use slots::BatchSlots;
pub use speed::{Completed, MIN_PREFILL_BLOCKS, ReplicaSpeed, Usage};

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
/// policies. The counts, work sums, engine statistics and speed estimates are atomics, read
/// without a lock. Two things are not: the per-prefix counts
/// ([`prefix_counts`](Self::prefix_counts)) and the recent families are each behind a mutex
/// held for one map operation. `prefix-load` takes the first once per pod for a request that
/// shares a prefix (twice with cluster peers, whose counts sit in their own `PodLoad`), and
/// the second once per pod only when no pod holds any of the prompt and its family term is
/// on; `prefix-cache`, `least-request` and `random` take neither. docs/PERFORMANCE.md
/// measures the decisions.
#[derive(Debug, Default)]
pub struct PodLoad {
    outstanding: AtomicU64,
    /// `u32::MAX` means "no scrape yet".
    running: AtomicU32,
    waiting: AtomicU32,
    /// `f64` bits of the KV usage.
    kv_usage_bits: AtomicU64,
    /// Prompt blocks of the outstanding requests.
    active_blocks: AtomicU64,
    /// Blocks still to prefill for the outstanding requests that have not begun answering.
    pending_prefill_blocks: AtomicU64,
    /// Outstanding requests that have not begun answering (in the engine's frontend, in
    /// line, or prefilling): with the scrape, whether a queue there waits for a slot.
    unanswered: AtomicU64,
    /// Outstanding requests by the prefix they share with earlier requests
    /// ([`RequestWork::shared_prefix`]): how much of this pod's load one prefix makes, and
    /// whether a copy of it is still being prefilled here.
    prefixes: Mutex<HashMap<u64, PrefixCounts>>,
    /// The prompt families routed here lately: the load this pod is committed to.
    families: RecentFamilies,
    /// How fast this replica has been, learned from the requests it finished.
    speed: ReplicaSpeed,
    /// Its batch slots: how many requests its engine runs at once (from the scrape) and how
    /// long each holds one (from the requests it finished).
    slots: BatchSlots,
    /// How far the prefix index's view of this replica held, learned from the engine's
    /// `cached_tokens` in the responses of the requests it finished.
    evidence: CacheEvidence,
    /// The streams of its requests past their first byte, each with its expected end.
    decoding: decoding::Decoding,
    /// The requests other gateways of the cluster have in flight here, held by
    /// [`crate::cluster::PeerTable`]; made on the first one (a lone gateway never has any).
    peers: OnceLock<Arc<PodLoad>>,
}

/// One shared prefix's requests on one pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCounts {
    /// Outstanding requests sharing the prefix.
    pub outstanding: u32,
    /// Of those, copies: requests that brought the prefix here and have not yet answered
    /// their first byte, so the prefix is not usable here yet.
    pub copying: u32,
}

/// The work a request brings to a pod, in prompt blocks (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestWork {
    /// The request's full prompt blocks.
    pub blocks: u64,
    /// Of those, the blocks the pod is expected to prefill (not already cached there).
    pub prefill_blocks: u64,
    /// The hash of the deepest block this request shares with earlier ones (its longest
    /// match on any pod), naming the prefix it belongs to; `None` for a prompt no pod holds
    /// any of.
    pub shared_prefix: Option<u64>,
    /// The request copies that prefix here: the pod did not hold it, so it is usable here
    /// only once this request has prefilled it (its first byte).
    pub copies_prefix: bool,
    /// The most tokens it may answer (the request's `max_tokens`), when it says: how long
    /// its stream will hold a batch slot ([`decoding`]).
    pub max_tokens: Option<u64>,
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
            active_blocks: AtomicU64::new(0),
            pending_prefill_blocks: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            prefixes: Mutex::new(HashMap::new()),
            families: RecentFamilies::default(),
            speed: ReplicaSpeed::default(),
            slots: BatchSlots::default(),
            evidence: CacheEvidence::default(),
            decoding: decoding::Decoding::default(),
            peers: OnceLock::new(),
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

    /// Counts one more request and returns its [`InFlight`], which will count it out. It
    /// carries the count seen just before this request.
    pub fn acquire(self: &Arc<Self>) -> InFlight {
        self.acquire_work(RequestWork::default())
    }

    /// [`acquire`](Self::acquire), also adding the request's work to the pod's active and
    /// pending-prefill blocks; the [`InFlight`] takes them out again.
    pub fn acquire_work(self: &Arc<Self>, work: RequestWork) -> InFlight {
        let before = self.outstanding.fetch_add(1, Ordering::AcqRel);
        self.active_blocks.fetch_add(work.blocks, Ordering::AcqRel);
        self.pending_prefill_blocks
            .fetch_add(work.prefill_blocks, Ordering::AcqRel);
        self.unanswered.fetch_add(1, Ordering::AcqRel);
        let mut behind_copy = false;
        if let Some(prefix) = work.shared_prefix {
            let mut prefixes = self.prefixes();
            let counts = prefixes.entry(prefix).or_default();
            behind_copy = counts.copying > 0;
            counts.outstanding += 1;
            counts.copying += u32::from(work.copies_prefix);
        }
        let sent_to_idle = before == 0 && self.peers().is_none_or(|peers| peers.outstanding() == 0);
        InFlight::new(Arc::clone(self), before, work, behind_copy, sent_to_idle)
    }

    /// [`acquire_work`](Self::acquire_work) for a request decided at `now`: its lifecycle
    /// ([`InFlight::first_byte`], [`InFlight::end`]) measures from then.
    pub fn decide(self: &Arc<Self>, work: RequestWork, now: Millis) -> InFlight {
        self.acquire_work(work).decided_at(now)
    }

    /// This pod's requests sharing `prefix` (see [`RequestWork::shared_prefix`]).
    pub fn prefix_counts(&self, prefix: u64) -> PrefixCounts {
        self.prefixes().get(&prefix).copied().unwrap_or_default()
    }

    /// The counts stay consistent under a poisoned lock: every update is one map operation.
    fn prefixes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, PrefixCounts>> {
        self.prefixes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The prompt families routed here lately (recorded by the router for prefix-aware
    /// strategies).
    pub fn families(&self) -> &RecentFamilies {
        &self.families
    }

    /// How fast this replica has been (learned from finished requests; [`speed`]).
    pub fn speed(&self) -> &ReplicaSpeed {
        &self.speed
    }

    /// Its batch slots (learned from the engine scrape and finished requests; [`slots`]).
    pub fn slots(&self) -> &BatchSlots {
        &self.slots
    }

    /// How far the prefix index's view of this replica held lately (learned from the
    /// engine's `cached_tokens`; [`evidence`]).
    pub fn cache_trust(&self) -> CacheTrust {
        self.evidence.trust()
    }

    /// Learns from a request that finished here (its lifecycle's end): the replica's speed,
    /// how long it held its batch slot, and what its `cached_tokens` said about the index
    /// ([`Verdict`], if anything).
    pub fn observe(&self, done: &Completed) -> Option<Verdict> {
        let done = Completed {
            usage: done.usage.map(|usage| self.evidence.normalize(usage)),
            ..*done
        };
        self.speed.observe(&done);
        // Its TTFT also holds its wait for a slot and for the prefill ahead of it; its own
        // prefill at the learned rate is the part of it spent in a slot.
        let prefill = self.speed.prefill_ms_per_block().map_or(0.0, |rate| {
            (rate * done.uncached_blocks() as f64).min(done.ttft as f64)
        });
        self.slots.observe_request(prefill, done.decode);
        self.evidence.observe(&done)
    }

    /// Prompt blocks of the requests outstanding here.
    pub fn active_blocks(&self) -> u64 {
        self.active_blocks.load(Ordering::Acquire)
    }

    /// Blocks still to prefill for outstanding requests that have not sent a first byte.
    pub fn pending_prefill_blocks(&self) -> u64 {
        self.pending_prefill_blocks.load(Ordering::Acquire)
    }

    /// Outstanding requests here that have not sent a first byte.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Acquire)
    }

    /// The requests other gateways have in flight on this pod (cluster sharing), if any has
    /// told of one. Policies read it through the `shared_*` views ([`crate::cluster`]).
    pub fn peers(&self) -> Option<&Arc<PodLoad>> {
        self.peers.get()
    }

    /// [`peers`](Self::peers), made on first use: where a peer's request is counted.
    pub fn peers_or_init(&self) -> &Arc<PodLoad> {
        self.peers.get_or_init(PodLoad::new)
    }

    /// The expected wait for a batch slot of a request routed here now: every gateway's
    /// requests outstanding here, against the ends of every gateway's decoding streams
    /// ([`BatchSlots::wait_ms`]); `None` until the batch is learned.
    pub fn slot_wait_ms(&self, now: Millis) -> Option<f64> {
        let outstanding = self.shared_outstanding();
        if outstanding < u64::from(self.slots.capacity()?) {
            return Some(0.0);
        }
        let pace = self.speed.decode_ms_per_token();
        let mut ends = Vec::new();
        self.decoding.push_ends(now, pace, &mut ends);
        if let Some(peers) = self.peers() {
            peers.decoding.push_ends(now, pace, &mut ends);
        }
        self.slots.wait_ms(outstanding, &mut ends)
    }

    /// Records a fresh engine scrape (and learns the batch capacity from it).
    pub fn set_engine_stats(&self, stats: EngineStats) {
        let unanswered = self.unanswered() + self.peers().map_or(0, |peers| peers.unanswered());
        self.slots.observe_scrape(stats, unanswered);
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

/// A ready pod as a policy sees it: its name and its live load.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub name: &'a str,
    /// The pod's `ip:port` (the `target-pod-ip` header), which sessions name
    /// ([`crate::policy::session_affinity`]).
    pub address: &'a str,
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
    fn work_is_released_once_first_token_early_and_the_rest_on_drop() {
        let load = PodLoad::new();
        let work = RequestWork {
            blocks: 40,
            prefill_blocks: 30,
            shared_prefix: None,
            copies_prefix: false,
            max_tokens: None,
        };
        let mut a = load.acquire_work(work);
        let b = load.acquire_work(work);
        assert_eq!(
            (load.active_blocks(), load.pending_prefill_blocks()),
            (80, 60)
        );
        assert_eq!(load.unanswered(), 2);
        a.first_byte(0);
        a.first_byte(0);
        assert_eq!(
            (load.active_blocks(), load.pending_prefill_blocks()),
            (80, 30)
        );
        assert_eq!((load.outstanding(), load.unanswered()), (2, 1));
        drop(b);
        assert_eq!(
            (load.active_blocks(), load.pending_prefill_blocks()),
            (40, 0)
        );
        assert_eq!(load.unanswered(), 0);
        drop(a);
        assert_eq!(
            (
                load.outstanding(),
                load.active_blocks(),
                load.pending_prefill_blocks()
            ),
            (0, 0, 0)
        );
    }

    #[test]
    fn prefix_counts_follow_their_guards_and_copies_end_at_the_first_byte() {
        let load = PodLoad::new();
        let work = |copies_prefix| RequestWork {
            blocks: 10,
            prefill_blocks: 10,
            shared_prefix: Some(7),
            copies_prefix,
            max_tokens: None,
        };
        let mut copy = load.acquire_work(work(true));
        let hit = load.acquire_work(work(false));
        let other = load.acquire_work(RequestWork::default());
        let counts = |outstanding, copying| PrefixCounts {
            outstanding,
            copying,
        };
        assert_eq!(load.prefix_counts(7), counts(2, 1));
        assert_eq!(load.prefix_counts(8), counts(0, 0));
        copy.first_byte(0);
        copy.first_byte(0);
        assert_eq!(load.prefix_counts(7), counts(2, 0));
        drop(hit);
        drop(other);
        assert_eq!(load.prefix_counts(7), counts(1, 0));
        drop(copy);
        assert_eq!(load.prefix_counts(7), counts(0, 0));
        // A copy that fails before its first byte releases its mark when dropped.
        drop(load.acquire_work(work(true)));
        assert_eq!(load.prefix_counts(7), counts(0, 0));
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
