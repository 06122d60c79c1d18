//! When a pod is expected to give a request its first token: the wait before its own prefill
//! begins, then that prefill at the pod's own learned rate
//! ([`ReplicaSpeed::prefill_ms_per_block`](crate::load::ReplicaSpeed::prefill_ms_per_block)).
//! The time-based rules read it: the SLO's (`slo.rs`) and the slow-replica rule's
//! (`give_up.rs`).
//!
//! The wait is the wait for a batch slot, when the pod's outstanding requests fill the batch
//! its engine runs: the ends of its decoding streams, then the mean turnover
//! ([`PodLoad::slot_wait_ms`](crate::load::PodLoad::slot_wait_ms)), then the
//! prefill queued on the pod (its pending blocks at its rate). One after the other: the
//! requests in line for a slot are most of that queue, and they prefill only once they have a
//! slot. That is the upper end (the last of them may be done when this request's slot comes);
//! the longer of the two, the lower end, served fewer requests in time on the 3k-token
//! overload case and the 4-replica unequal fleet (docs/POLICY-EVALUATION.md, "Slot waits in
//! the expectation"). Without the slot wait a pod whose engine runs `max_num_seqs` requests
//! looked in time as long as its prefill queue was short, and twice the seed's rate or
//! 256-token answers kept both replicas late together ("Overload: issue 15's cases").

use crate::Millis;
use crate::load::Candidate;

/// A pod's expectation for one request, in milliseconds.
pub struct Expected {
    /// The wait before the request's own prefill: for a batch slot, then for the prefill
    /// already queued on the pod (its pending blocks at its rate).
    pub queued_ms: f64,
    /// The request's first token: the wait, then its own blocks.
    pub first_token_ms: f64,
}

/// The expectation on `pod` for a request that prefills `own_blocks` there; `None` before the
/// pod has learned its prefill rate or its batch. The slot wait counts once the pod has
/// learned its batch (else it is left out: the prefill queue alone). A pod that has learned
/// its batch but not its prefill rate has answered only requests that prefilled too little
/// to teach it ([`MIN_PREFILL_BLOCKS`](crate::load::MIN_PREFILL_BLOCKS): cache hits), so its
/// prefill is counted as nothing and its slot wait alone can make it late: in the hot cells
/// of twice the seed's rate the hits' holder was full long before it learned a rate, and
/// the rule waited (docs/POLICY-EVALUATION.md, "Slot waits in the expectation").
pub fn expected(pod: &Candidate<'_>, own_blocks: u64, now: Millis) -> Option<Expected> {
    let slot_wait_ms = pod.load.slot_wait_ms(now);
    let rate = match (pod.load.speed().prefill_ms_per_block(), slot_wait_ms) {
        (Some(rate), _) => rate,
        (None, Some(_)) => 0.0,
        (None, None) => return None,
    };
    let prefill_queue_ms = rate * pod.load.shared_pending_prefill_blocks() as f64;
    let queued_ms = slot_wait_ms.unwrap_or(0.0) + prefill_queue_ms;
    Some(Expected {
        queued_ms,
        first_token_ms: queued_ms + rate * own_blocks as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Completed, EngineStats, PodLoad, Usage};

    /// A pod that has learned 5 ms per block and 8 000 ms per request in a slot (a 100-block
    /// prefill in 500 ms, 7 500 ms of decode), with `outstanding` requests of which none has
    /// prefill pending, and a scrape showing `running` beside `waiting`.
    fn pod(outstanding: u64, running: u32, waiting: u32) -> std::sync::Arc<PodLoad> {
        let load = PodLoad::with_outstanding(outstanding);
        load.observe(&Completed {
            blocks: 100,
            prefill_blocks: 100,
            ttft: 500,
            decode: 7_500,
            usage: Some(Usage {
                prompt_tokens: 1_600,
                cached_tokens: Some(0),
                completion_tokens: 128,
            }),
            sent_to_idle: false,
            behind_copy: false,
        });
        // Scraped with nothing unanswered here: `running` decoding beside `waiting`.
        load.set_engine_stats(EngineStats {
            running,
            waiting,
            kv_usage: 0.3,
        });
        load
    }

    fn first_token_ms(load: &std::sync::Arc<PodLoad>, own_blocks: u64) -> f64 {
        let pod = Candidate {
            name: "a",
            address: "a",
            load,
        };
        expected(&pod, own_blocks, 0).unwrap().first_token_ms
    }

    #[test]
    fn a_full_batch_makes_a_request_wait_for_a_slot() {
        // 11 outstanding on 8 slots with no prefill queued: three are in line, so a 20-block
        // request waits for the fourth completion (one every 8 000 / 8 ms), then prefills.
        let full = pod(11, 8, 3);
        assert_eq!(first_token_ms(&full, 20), 4.0 * 1_000.0 + 20.0 * 5.0);
        // The prefill-only expectation saw 100 ms: in time for a 2 s SLO.
        let slo_ms = 2_000.0;
        assert!(first_token_ms(&full, 20) > slo_ms);
    }

    #[test]
    fn a_full_batch_of_cache_hits_is_expected_late_before_any_prefill_rate() {
        // Hits only (20 blocks each, below MIN_PREFILL_BLOCKS): no prefill rate, but the
        // batch and its residence are learned, so the slot wait is expected.
        let load = PodLoad::with_outstanding(12);
        load.set_engine_stats(EngineStats {
            running: 8,
            waiting: 4,
            kv_usage: 0.3,
        });
        load.observe(&Completed {
            blocks: 300,
            prefill_blocks: 20,
            ttft: 300,
            decode: 8_000,
            usage: None,
            sent_to_idle: false,
            behind_copy: false,
        });
        assert_eq!(load.speed().prefill_ms_per_block(), None);
        // Four in line: the fifth completion, one every 1 s.
        assert_eq!(first_token_ms(&load, 20), 5_000.0);
        // Nothing learned at all: no expectation.
        let pod = PodLoad::with_outstanding(12);
        assert!(
            expected(
                &Candidate {
                    name: "b",
                    address: "b",
                    load: &pod
                },
                20,
                0
            )
            .is_none()
        );
    }

    #[test]
    fn a_full_batch_waits_for_its_streams_ends_where_they_are_known() {
        // 2 outstanding not yet answered, and 8 decoding streams at 10 ms a token: 10 on 8
        // slots, two in line, so this request waits for the third stream to end.
        let load = pod(2, 8, 2);
        let streams: Vec<_> = [27, 37, 52, 1_017, 1_017, 1_017, 1_017, 1_017]
            .into_iter()
            .map(|max_tokens| {
                let mut guard = load.acquire_work(crate::load::RequestWork {
                    max_tokens: Some(max_tokens),
                    ..Default::default()
                });
                guard.first_byte(0);
                assert!(guard.advance(17, || 160));
                guard
            })
            .collect();
        let pod = Candidate {
            name: "a",
            address: "a",
            load: &load,
        };
        // At 160 ms the streams end in 100, 200 and 350 ms: the third end, then 20 blocks.
        let first_token = expected(&pod, 20, 160).unwrap().first_token_ms;
        assert_eq!(first_token, 350.0 + 20.0 * 5.0);
        // Three mean turnovers (one every 1 s) would have said 3.1 s: late for a 2 s SLO.
        assert!(first_token < 2_000.0);
        // Once the streams end, slots are free: the request prefills at once.
        drop(streams);
        assert_eq!(
            expected(&pod, 20, 160).unwrap().first_token_ms,
            20.0 * 5.0,
            "a slot free"
        );
    }

    #[test]
    fn free_slots_leave_the_prefill_queue_alone() {
        // Six running, nobody waiting: a free slot, only the request's own prefill.
        assert_eq!(first_token_ms(&pod(6, 6, 0), 20), 100.0);
    }
}
