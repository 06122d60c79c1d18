//! A replica's batch slots, as far as the gateway can learn them: how many requests its
//! engine runs at once and how long a request holds a slot. A request routed to a pod whose
//! batch is full is not even scheduled until enough of the running requests finish; that slot
//! wait is what misses the TTFT SLO when an engine's `max_num_seqs` (8 on the simulated L20),
//! not its prefill, is the bottleneck (twice the seed's rate, 256-token answers: issue 15's
//! overload cases, docs/POLICY-EVALUATION.md, "Overload: issue 15's cases"). Nothing here is
//! engine configuration; both numbers come from what vLLM exposes:
//!
//! - **capacity**: the most requests the engine's scrape showed running
//!   (`vllm:num_requests_running`) while others waited (`vllm:num_requests_waiting` > 0) and
//!   every running one had answered its first byte (the gateway's own count of unanswered
//!   requests, [`super::PodLoad::unanswered`]). A queue beside a batch that only decodes says
//!   the batch is as large as the engine lets it be. A queue beside a request still
//!   prefilling does not: the step's token budget holds it back (a long prompt, a cold start),
//!   and taking that batch for the capacity made every pod of the trace look late
//!   (docs/POLICY-EVALUATION.md, "Slot waits in the expectation"). The largest is kept.
//! - **residence**: how long a finished request held its slot, its own prefill (at most its
//!   TTFT) then its decode (first byte → end), as a running mean over the last ~16 requests.
//!   A mean, not the low quantile [`super::ReplicaSpeed`] keeps: slots free at the rate of the
//!   typical request under the load there is now, and a batch of slow ones frees them slower.
//!
//! With both, the `n`-th request in line for a slot on a pod with `c` slots waits for `n`
//! completions: the `n`-th of its decoding streams' expected ends where the gateway knows
//! them ([`super::decoding`]: each stream's own pace and the tokens it has left), and beyond
//! those one every `residence / c` on average. The mean alone was blind to where the batch
//! stands: a batch that started together ends together, and one of long answers just begun
//! frees nothing for a long time (docs/POLICY-EVALUATION.md, "Issue 28, v3: a stream clock
//! and the in-time rule").

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::EngineStats;
use crate::Millis;

/// The weight of one finished request in the running mean of the residence.
const WEIGHT: f64 = 1.0 / 16.0;

/// One replica's batch slots (see the module docs). Lock-free: an update that races another
/// may be lost, which only delays the estimate by one observation.
#[derive(Debug, Default)]
pub struct BatchSlots {
    /// The largest batch seen running beside a queue; 0 = never seen.
    capacity: AtomicU32,
    /// `f64` bits of the mean milliseconds a request holds its slot; 0 = not learned.
    residence_ms: AtomicU64,
}

impl BatchSlots {
    /// Learns from one engine scrape, taken while `unanswered` of the requests routed to the
    /// pod had not sent their first byte. A queue (`waiting` > 0) with every running request
    /// answered (at most `waiting` unanswered, so none of them runs) is a batch held at its
    /// size by the slots (or the KV cache), not by a prefill taking the step's token budget.
    pub fn observe_scrape(&self, stats: EngineStats, unanswered: u64) {
        if stats.waiting > 0 && unanswered <= u64::from(stats.waiting) {
            self.capacity.fetch_max(stats.running, Ordering::Relaxed);
        }
    }

    /// Learns from one finished request that prefilled for `prefill` (its own prefill, at
    /// most its TTFT) and decoded for `decode` (first byte → end).
    pub fn observe_request(&self, prefill: f64, decode: Millis) {
        let sample = prefill.max(0.0) + decode as f64;
        if !(sample.is_finite() && sample > 0.0) {
            return;
        }
        let old = f64::from_bits(self.residence_ms.load(Ordering::Relaxed));
        let next = if old > 0.0 {
            old + WEIGHT * (sample - old)
        } else {
            sample
        };
        self.residence_ms.store(next.to_bits(), Ordering::Relaxed);
    }

    /// The largest batch seen running while requests waited, once seen.
    pub fn capacity(&self) -> Option<u32> {
        let capacity = self.capacity.load(Ordering::Relaxed);
        (capacity > 0).then_some(capacity)
    }

    /// The mean milliseconds a request holds its slot here, once learned.
    pub fn residence_ms(&self) -> Option<f64> {
        let residence = f64::from_bits(self.residence_ms.load(Ordering::Relaxed));
        (residence > 0.0).then_some(residence)
    }

    /// The expected wait for a slot of a request arriving with `outstanding` requests already
    /// on the pod (every gateway's), given `ends`: the expected ends of the pod's decoding
    /// streams, in milliseconds from now, in any order ([`super::decoding`]). The requests
    /// beyond the capacity are in line before it, so it waits for one completion more than
    /// they are: the `n`-th known end when that many are known, and beyond the known ends one
    /// completion every `residence / capacity` after the last. `Some(0.0)` with a slot free;
    /// `None` until the capacity is learned, and, where the known ends do not reach, the
    /// residence. The ends alone serve before the first request has finished here: in the
    /// warm cells of twice the seed's rate the batch fills within seconds and the first
    /// residence comes eight seconds in (docs/POLICY-EVALUATION.md, "Issue 28, v3: a
    /// stream clock and the in-time rule").
    pub fn wait_ms(&self, outstanding: u64, ends: &mut [f64]) -> Option<f64> {
        let capacity = u64::from(self.capacity()?);
        if outstanding < capacity {
            return Some(0.0);
        }
        let ahead = usize::try_from(outstanding - capacity).unwrap_or(usize::MAX);
        if ahead < ends.len() {
            let (_, nth, _) = ends.select_nth_unstable_by(ahead, f64::total_cmp);
            return Some(*nth);
        }
        let residence = self.residence_ms()?;
        let last = ends.iter().copied().fold(0.0, f64::max);
        let unknown = (ahead - ends.len() + 1) as f64;
        Some(last + unknown * residence / capacity as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(running: u32, waiting: u32) -> EngineStats {
        EngineStats {
            running,
            waiting,
            kv_usage: 0.5,
        }
    }

    #[test]
    fn capacity_is_the_largest_decoding_batch_seen_beside_a_queue() {
        let slots = BatchSlots::default();
        slots.observe_scrape(stats(6, 0), 0);
        assert_eq!(slots.capacity(), None, "no queue: the batch may grow");
        // Two running, one of them still prefilling: the token budget holds the queue.
        slots.observe_scrape(stats(2, 3), 4);
        assert_eq!(slots.capacity(), None);
        slots.observe_scrape(stats(2, 3), 3);
        assert_eq!(slots.capacity(), Some(2));
        slots.observe_scrape(stats(8, 1), 1);
        slots.observe_scrape(stats(5, 2), 2);
        assert_eq!(slots.capacity(), Some(8));
    }

    #[test]
    fn residence_is_a_running_mean_of_prefill_and_decode() {
        let slots = BatchSlots::default();
        assert_eq!(slots.residence_ms(), None);
        slots.observe_request(500.0, 7_500);
        assert_eq!(slots.residence_ms(), Some(8_000.0));
        slots.observe_request(0.0, 24_000);
        assert_eq!(slots.residence_ms(), Some(9_000.0));
    }

    #[test]
    fn a_request_behind_a_full_batch_waits_for_completions() {
        let slots = BatchSlots::default();
        slots.observe_scrape(stats(8, 2), 2);
        assert_eq!(slots.wait_ms(10, &mut []), None, "no residence yet");
        slots.observe_request(0.0, 8_000);
        // 10 outstanding on 8 slots: two in line, so this one waits for the third
        // completion, one every 1 s.
        assert_eq!(slots.wait_ms(10, &mut []), Some(3_000.0));
        assert_eq!(slots.wait_ms(8, &mut []), Some(1_000.0));
        assert_eq!(slots.wait_ms(7, &mut []), Some(0.0), "a slot free");
    }

    #[test]
    fn known_stream_ends_come_before_the_mean_turnover() {
        let slots = BatchSlots::default();
        slots.observe_scrape(stats(8, 2), 2);
        slots.observe_request(0.0, 8_000);
        // Two in line: the third end to come, whatever order the streams are listed in.
        assert_eq!(
            slots.wait_ms(10, &mut [900.0, 50.0, 300.0, 120.0]),
            Some(300.0)
        );
        // Two ends known, three needed: the third a mean turnover (1 s) after the last.
        assert_eq!(slots.wait_ms(10, &mut [400.0, 50.0]), Some(1_400.0));
    }

    #[test]
    fn known_ends_serve_before_any_request_has_finished() {
        let slots = BatchSlots::default();
        slots.observe_scrape(stats(8, 2), 2);
        assert_eq!(slots.residence_ms(), None);
        assert_eq!(slots.wait_ms(9, &mut [700.0, 200.0]), Some(700.0));
        assert_eq!(
            slots.wait_ms(10, &mut [700.0, 200.0]),
            None,
            "a third end unknown"
        );
    }
}
