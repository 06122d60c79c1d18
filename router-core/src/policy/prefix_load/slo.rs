//! `prefix-load`'s TTFT-SLO rules (`ttft_slo_seconds`): the cost model prices work in
//! blocks, and these pass over the pods where the request's first token would come too late,
//! while that helps a request that could still make it.
//!
//! A pod's expected first token for a request is `expected.rs`'s: its wait for a batch slot
//! (the ends of its decoding streams, then the mean turnover), then its learned prefill rate
//! ([`ReplicaSpeed::prefill_ms_per_block`](crate::load::ReplicaSpeed::prefill_ms_per_block))
//! times the prefill blocks pending there plus the request's own uncached blocks there. A
//! pod is **late** when that is past the SLO. An idle pod is judged by its own prefill of
//! the request alone (it has no queue).
//!
//! - **In time** ([`slo_candidates`]): some busy pod is late and some pod is in time. The
//!   late pods are passed over; the cost model chooses among the pods in time. Balancing
//!   blocks onto a pod whose batch is full, or whose queue is long, spends the request's SLO
//!   there while another pod could answer it in time. With the mean turnover as the slot
//!   wait this lost where a busy engine answered sooner than the mean said; with each
//!   stream's own clock it wins on 13 of the 15 held-out workloads (docs/POLICY-EVALUATION.md,
//!   "Issue 28, v3: a stream clock and the in-time rule"). A late idle pod on its own (every
//!   busy pod in time) passes nothing over: its slow cold prefill misses at most this
//!   request, and the family's next ones find the prefix there.
//! - Every pod busy and late, but the backlog drains by itself ([`outruns_the_fleet`]: the
//!   prefill offered lately, [`super::offered`], is less than the pods prefill together at
//!   their learned rates, and no queue for batch slots stands still or grows): a burst, the
//!   cold start of a phase or a prompt too long for the SLO anywhere. The rules do nothing: a
//!   pod given up for it would stay backed up after it, and its families with it (on the
//!   whole Mooncake trace at 8 replicas the ungated rule sank every long cold prompt onto one
//!   pod, whose requests came to wait ten minutes for a first token).
//! - **Overload**: every pod busy and late, and the backlog grows. The request goes to the
//!   most backed-up (the longest wait: for a slot, then the prefill pending) of the pods
//!   where it adds the least prefill: its holders, or any pod for a new family; the cost
//!   model breaks ties among them. Every newcomer there misses already, so this one takes no
//!   room from a request that could still be in time, the other pods drain and answer theirs
//!   within the SLO, and no family is copied onto the pod given up (which would make the
//!   copy miss as well and leave the family on two late pods).
//!
//! These only ever narrow the cost model's candidates, and are off until every candidate has
//! learned its prefill rate or its batch. Which pods are passed over follows the queues, so
//! a pod that drains below the SLO competes again. The evaluation of the overload rule
//! (variants, the gate, its window, the slot queue's arm) is in docs/POLICY-EVALUATION.md,
//! "A TTFT-SLO rule at each replica's own rate", "The overload rule", "The overload rule,
//! gated by the offered prefill" and "The merged overload rule".

use super::expected::{Expected, expected};
use super::offered::Offered;
use crate::Millis;
use crate::load::Candidate;
use crate::policy::PerPod;

/// Which of `pods` may take the request under the SLO `slo_ms` at `now` (`uncached[i]`: the
/// blocks it would prefill on pod `i`): the pods in time, while some busy pod is late; the
/// overload sinks, when every pod is busy and late and the fleet is in overload
/// ([`outruns_the_fleet`]); `None` when neither holds, or some pod has learned neither its
/// prefill rate nor its batch (the cost model chooses among all).
pub fn slo_candidates(
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
    offered: Offered,
    now: Millis,
) -> Option<PerPod<bool>> {
    let expectations = pods
        .iter()
        .zip(uncached)
        .map(|(pod, &own)| expected(pod, own, now))
        .collect::<Option<PerPod<Expected>>>()?;
    let late: PerPod<bool> = expectations
        .iter()
        .map(|e| e.first_token_ms > slo_ms)
        .collect();
    let busy = |i: usize| pods[i].load.shared_outstanding() > 0;
    if !late.contains(&false) {
        if (0..pods.len()).all(busy) {
            return overload_candidates(pods, uncached, &expectations, offered);
        }
        return None;
    }
    (0..pods.len())
        .any(|i| busy(i) && late[i])
        .then(|| late.iter().map(|&late| !late).collect())
}

/// The overload sinks among `pods`, every one busy and late (`expectations`): the most
/// backed-up of those where the request adds the least prefill; `None` when the backlog
/// drains by itself.
fn overload_candidates(
    pods: &[Candidate<'_>],
    uncached: &[u64],
    expectations: &[Expected],
    offered: Offered,
) -> Option<PerPod<bool>> {
    if !outruns_the_fleet(pods, offered) {
        return None;
    }
    let least = uncached.iter().copied().min()?;
    let adds_least = |i: usize| uncached[i] == least;
    let worst = (0..pods.len())
        .filter(|&i| adds_least(i))
        .map(|i| expectations[i].queued_ms)
        .fold(f64::NEG_INFINITY, f64::max);
    Some(
        (0..pods.len())
            .map(|i| adds_least(i) && expectations[i].queued_ms >= worst)
            .collect(),
    )
}

/// Whether the backlog of late pods grows rather than drains: the prefill `offered` lately is
/// at least what the pods prefill together at their learned rates (once every pod has one),
/// or every pod's batch slots are full and the fleet's outstanding requests are at least
/// their mean over the window (a queue for slots that is not shrinking: requests arrive as
/// fast as the slots turn over). A burst, a phase's cold start or one prompt too long for the
/// SLO anywhere fails both: offered slower than the pods prefill, or a slot queue already
/// draining.
fn outruns_the_fleet(pods: &[Candidate<'_>], offered: Offered) -> bool {
    let prefilled_per_ms: Option<f64> = pods
        .iter()
        .map(|pod| pod.load.speed().prefill_ms_per_block().map(|ms| 1.0 / ms))
        .sum();
    if prefilled_per_ms.is_some_and(|fleet| offered.blocks_per_ms >= fleet) {
        return true;
    }
    let slots_full = pods.iter().all(|pod| {
        pod.load
            .slots()
            .capacity()
            .is_some_and(|slots| pod.load.shared_outstanding() >= u64::from(slots))
    });
    slots_full && offered.outstanding as f64 >= offered.outstanding_mean
}
