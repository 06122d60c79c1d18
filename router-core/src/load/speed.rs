//! How fast a replica is, learned online from the requests it finished: the per-replica speed
//! estimates of the load view, kept beside the outstanding counts so every policy and every
//! runner (gateway, simulator) reads the same numbers.
//!
//! Two estimates, each from what a request's lifecycle ([`super::InFlight`]) observed:
//! - **prefill**: milliseconds to first byte per block the request had to prefill there
//!   (its uncached blocks: the engine's `cached_tokens` when the response reported them,
//!   else the router's prediction), from requests with at least [`MIN_PREFILL_BLOCKS`] to
//!   prefill, so that fixed per-request overhead does not dominate (a cache hit's ~20
//!   blocks take about one engine step, which read as ~13 ms per block on the simulated L20,
//!   several times a cold prompt's, and priced every copy past the TTFT SLO:
//!   docs/POLICY-EVALUATION.md, "A TTFT-SLO rule at each replica's own rate");
//! - **decode**: milliseconds per output token after the first (inter-token time), from
//!   requests with at least two.
//!
//! - **idle prefill**: the same, from requests sent to the replica while it had nothing
//!   outstanding, whose time to first token is their own prefill and nothing else. It tells a
//!   slow replica from a busy one: under sustained overload every request waits in a queue,
//!   the prefill estimate reads the queue, and equal replicas came to differ by up to 100×
//!   (the Mooncake trace at 4 replicas), whereas the idle estimate keeps what the replica did
//!   when it was free (docs/POLICY-EVALUATION.md, "Unequal replicas: one give-up rule").
//!
//! The idle estimate is also taught at such a request's **first byte**, from the blocks the
//! router expected it to prefill, as a stand-in until a finished request teaches the
//! corrected one: a replica's first request ends only after its whole answer (about 20 s on
//! the slow simulated L20), long after a cold phase has placed its families, whereas its
//! first token comes within seconds (docs/POLICY-EVALUATION.md, "Unequal replicas: giving
//! up the slow replica"). Every first byte also records the latest time to first token, how
//! backed up the replica is right now.
//!
//! Both are **low quantiles**, not means: waiting in a queue only ever makes a request
//! slower than the replica is, so an observation below the estimate pulls it down by half
//! the gap and one above pushes it up by 1/32 of it (an asymmetric average settles near the
//! 6th percentile of what it sees). A busy replica therefore still reads as fast as it is,
//! and a replica that really slows down (another model version, thermal limits) is followed
//! within a few dozen requests. Lock-free: each estimate is an `f64` in an atomic, and an
//! update that races another may be lost, which only delays the estimate by one request.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Millis;

/// Requests that had fewer blocks than this to prefill do not teach the prefill estimate: a
/// cache hit's tail (about 20 blocks on the seed's prompts) is mostly fixed per-request
/// overhead, which at 8 read as 13 ms per block on the simulated L20, twice its cold
/// prefill rate, and priced every copy past a 2 s TTFT (docs/POLICY-EVALUATION.md, "A
/// TTFT-SLO rule at each replica's own rate").
pub const MIN_PREFILL_BLOCKS: u64 = 64;

/// Step towards an observation below the estimate.
const DOWN: f64 = 0.5;
/// Step towards an observation above it.
const UP: f64 = 1.0 / 32.0;

/// What the engine reported it did for a request (`usage` in an OpenAI response), as far as
/// it is known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`: the prompt tokens the engine found in
    /// its prefix cache; `None` when the engine does not report them.
    pub cached_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: u64,
}

/// What a finished request took on its pod (from its lifecycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    /// The request's full prompt blocks.
    pub blocks: u64,
    /// The blocks the router expected the pod to prefill (not cached there).
    pub prefill_blocks: u64,
    /// Decided → first byte.
    pub ttft: Millis,
    /// First byte → last byte.
    pub decode: Millis,
    pub usage: Option<Usage>,
    /// It was sent while its pod had no request outstanding (of any gateway): its time to
    /// first token is its own prefill alone.
    pub sent_to_idle: bool,
    /// It was routed while a copy of its prefix was still prefilling on the pod, so the
    /// engine's report reflects the copy's progress, not the index's error
    /// ([`super::evidence`]).
    pub behind_copy: bool,
}

impl Completed {
    /// The blocks the pod really prefilled: the prompt's share the engine did not find
    /// cached, when it said (`cached_tokens`), else the router's expectation.
    pub fn uncached_blocks(&self) -> u64 {
        match self.usage {
            Some(Usage {
                prompt_tokens,
                cached_tokens: Some(cached),
                ..
            }) if prompt_tokens > 0 => {
                let uncached = prompt_tokens.saturating_sub(cached);
                // Rounded up: a request that prefilled anything prefilled at least a block.
                (u128::from(self.blocks) * u128::from(uncached)).div_ceil(u128::from(prompt_tokens))
                    as u64
            }
            _ => self.prefill_blocks,
        }
    }
}

/// A replica's learned speed (see the module docs). `None` until it has seen a request.
#[derive(Debug, Default)]
pub struct ReplicaSpeed {
    /// `f64` bits of milliseconds per prefilled block; 0 = not learned.
    prefill_ms_per_block: AtomicU64,
    /// `f64` bits of milliseconds per output token; 0 = not learned.
    decode_ms_per_token: AtomicU64,
    /// `f64` bits of milliseconds per prefilled block of requests sent while the replica
    /// was idle; 0 = not learned.
    idle_prefill_ms_per_block: AtomicU64,
    /// The same from first bytes, per block the router expected (no engine report yet); 0 =
    /// not learned.
    idle_answered_ms_per_block: AtomicU64,
    /// `f64` bits of the latest first byte's time to first token; 0 = none yet.
    latest_ttft_ms: AtomicU64,
}

impl ReplicaSpeed {
    /// Learns from one finished request.
    pub fn observe(&self, done: &Completed) {
        let uncached = done.uncached_blocks();
        if uncached >= MIN_PREFILL_BLOCKS && done.ttft > 0 {
            let rate = done.ttft as f64 / uncached as f64;
            nudge(&self.prefill_ms_per_block, rate);
            if done.sent_to_idle {
                nudge(&self.idle_prefill_ms_per_block, rate);
            }
        }
        if let Some(usage) = done.usage
            && usage.completion_tokens >= 2
        {
            let gaps = (usage.completion_tokens - 1) as f64;
            nudge(&self.decode_ms_per_token, done.decode as f64 / gaps);
        }
    }

    /// Learns from one request's first byte, `ttft` after it was decided, for a request the
    /// router expected to prefill `prefill_blocks` here, sent while the replica was idle or
    /// not (`sent_to_idle`).
    pub fn answered(&self, ttft: Millis, prefill_blocks: u64, sent_to_idle: bool) {
        // At least 1 ms, so that an answer always reads as known.
        self.latest_ttft_ms
            .store((ttft.max(1) as f64).to_bits(), Ordering::Relaxed);
        if sent_to_idle && prefill_blocks >= MIN_PREFILL_BLOCKS && ttft > 0 {
            nudge(
                &self.idle_answered_ms_per_block,
                ttft as f64 / prefill_blocks as f64,
            );
        }
    }

    /// Milliseconds to prefill one block here, once learned from finished requests (whose
    /// engine said what it really prefilled).
    pub fn prefill_ms_per_block(&self) -> Option<f64> {
        read(&self.prefill_ms_per_block)
    }

    /// Milliseconds to prefill one block here with nothing else to do (see the module docs):
    /// from finished requests sent while the replica was idle, else the stand-in their first
    /// bytes taught, known within seconds of the replica's first answer. Only the slow-replica
    /// rule reads it (`give_up_late_seconds`); the time rules judging a pod's queue
    /// (`ttft_slo_seconds`) read
    /// [`prefill_ms_per_block`](Self::prefill_ms_per_block), which follows the replica under
    /// load.
    pub fn idle_prefill_ms_per_block(&self) -> Option<f64> {
        read(&self.idle_prefill_ms_per_block).or_else(|| read(&self.idle_answered_ms_per_block))
    }

    /// The time to first token of the latest request that answered here, in milliseconds.
    pub fn latest_ttft_ms(&self) -> Option<f64> {
        read(&self.latest_ttft_ms)
    }

    /// Milliseconds per output token here, once learned.
    pub fn decode_ms_per_token(&self) -> Option<f64> {
        read(&self.decode_ms_per_token)
    }
}

fn read(cell: &AtomicU64) -> Option<f64> {
    let value = f64::from_bits(cell.load(Ordering::Relaxed));
    (value > 0.0).then_some(value)
}

/// Moves the estimate in `cell` towards `sample` (a low quantile, see the module docs).
fn nudge(cell: &AtomicU64, sample: f64) {
    if !(sample.is_finite() && sample > 0.0) {
        return;
    }
    let next = match read(cell) {
        None => sample,
        Some(old) if sample < old => old + DOWN * (sample - old),
        Some(old) => old + UP * (sample - old),
    };
    cell.store(next.to_bits(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(prefill_blocks: u64, ttft: Millis, decode: Millis, tokens: u64) -> Completed {
        Completed {
            blocks: prefill_blocks,
            prefill_blocks,
            ttft,
            decode,
            usage: Some(Usage {
                prompt_tokens: 100,
                cached_tokens: None,
                completion_tokens: tokens,
            }),
            sent_to_idle: true,
            behind_copy: false,
        }
    }

    #[test]
    fn nothing_is_known_until_a_request_teaches_it() {
        let speed = ReplicaSpeed::default();
        assert_eq!(speed.prefill_ms_per_block(), None);
        assert_eq!(speed.decode_ms_per_token(), None);
        // Too little prefill, a single token: nothing learned.
        speed.observe(&done(2, 500, 0, 1));
        assert_eq!(speed.prefill_ms_per_block(), None);
        assert_eq!(speed.decode_ms_per_token(), None);
        speed.observe(&done(100, 1000, 990, 100));
        assert_eq!(speed.prefill_ms_per_block(), Some(10.0));
        assert_eq!(speed.decode_ms_per_token(), Some(10.0));
    }

    #[test]
    fn a_cache_hit_does_not_teach_the_prefill_rate() {
        // A hit that prefilled 20 blocks answered after one 260 ms step: 13 ms per block,
        // which is the step's fixed cost, not the replica's prefill rate.
        let speed = ReplicaSpeed::default();
        speed.observe(&done(20, 260, 0, 1));
        speed.observe(&done(MIN_PREFILL_BLOCKS - 1, 400, 0, 1));
        assert_eq!(speed.prefill_ms_per_block(), None);
        speed.observe(&done(MIN_PREFILL_BLOCKS, 384, 0, 1));
        assert_eq!(speed.prefill_ms_per_block(), Some(6.0));
        // Nor does it pull a learned rate towards its overhead.
        speed.observe(&done(20, 260, 0, 1));
        assert_eq!(speed.prefill_ms_per_block(), Some(6.0));
    }

    #[test]
    fn queueing_barely_moves_the_estimate_and_a_faster_request_pulls_it_down() {
        let speed = ReplicaSpeed::default();
        speed.observe(&done(100, 1000, 990, 100));
        // Ten requests that waited in a queue (5x slower) move it by about a quarter of the
        // gap (1 − (31/32)^10 ≈ 0.27).
        for _ in 0..10 {
            speed.observe(&done(100, 5000, 4950, 100));
        }
        let queued = speed.prefill_ms_per_block().unwrap();
        assert!((20.0..22.0).contains(&queued), "{queued}");
        // One request that did not wait brings it most of the way back.
        speed.observe(&done(100, 1000, 990, 100));
        speed.observe(&done(100, 1000, 990, 100));
        assert!(speed.prefill_ms_per_block().unwrap() < 13.0);
    }

    #[test]
    fn a_slower_replica_reads_slower() {
        let (fast, slow) = (ReplicaSpeed::default(), ReplicaSpeed::default());
        for _ in 0..20 {
            fast.observe(&done(150, 1500, 6300, 128));
            slow.observe(&done(150, 3000, 9450, 128));
        }
        let ratio = slow.prefill_ms_per_block().unwrap() / fast.prefill_ms_per_block().unwrap();
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
        let ratio = slow.decode_ms_per_token().unwrap() / fast.decode_ms_per_token().unwrap();
        assert!((ratio - 1.5).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn a_first_byte_on_an_idle_replica_teaches_its_idle_rate_until_a_finished_request_does() {
        let speed = ReplicaSpeed::default();
        speed.answered(300, 20, true);
        assert_eq!(
            speed.idle_prefill_ms_per_block(),
            None,
            "a hit teaches no rate"
        );
        assert_eq!(speed.latest_ttft_ms(), Some(300.0));
        speed.answered(1200, 100, true);
        assert_eq!(speed.idle_prefill_ms_per_block(), Some(12.0));
        assert_eq!(speed.prefill_ms_per_block(), None, "only the stand-in");
        assert_eq!(speed.latest_ttft_ms(), Some(1200.0));
        // A finished request's rate, corrected by the engine's report, takes over.
        speed.observe(&done(100, 600, 0, 1));
        assert_eq!(speed.idle_prefill_ms_per_block(), Some(6.0));
        speed.answered(2000, 100, true);
        assert_eq!(speed.idle_prefill_ms_per_block(), Some(6.0));
        assert_eq!(speed.latest_ttft_ms(), Some(2000.0));
    }

    #[test]
    fn a_request_that_waited_teaches_the_idle_rate_nothing() {
        let speed = ReplicaSpeed::default();
        // Sent behind others: its 100 s to first token are mostly the queue.
        speed.answered(100_000, 100, false);
        let mut queued = done(100, 100_000, 0, 1);
        queued.sent_to_idle = false;
        speed.observe(&queued);
        assert_eq!(speed.idle_prefill_ms_per_block(), None);
        assert_eq!(
            speed.prefill_ms_per_block(),
            Some(1000.0),
            "the loaded rate reads it"
        );
        assert_eq!(speed.latest_ttft_ms(), Some(100_000.0));
        speed.observe(&done(100, 600, 0, 1));
        speed.observe(&queued);
        assert_eq!(speed.idle_prefill_ms_per_block(), Some(6.0));
    }

    #[test]
    fn cached_tokens_say_what_was_really_prefilled() {
        let mut hit = done(160, 300, 0, 1);
        hit.usage = Some(Usage {
            prompt_tokens: 5000,
            cached_tokens: Some(4704),
            completion_tokens: 1,
        });
        // The router expected 160 blocks; the engine had all but 296 of 5000 tokens.
        assert_eq!(hit.uncached_blocks(), 10);
        hit.usage = None;
        assert_eq!(hit.uncached_blocks(), 160);
    }
}
