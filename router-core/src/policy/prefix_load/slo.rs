//! `prefix-load`'s overload rule (`ttft_slo_seconds`): when no pod is expected to give a
//! request its first token within the TTFT SLO and the fleet is offered prefill faster than
//! it can do it, the request goes where it harms no request that could still make it,
//! instead of where the cost model spreads the misses evenly.
//!
//! A pod's expected first token for a request is `expected.rs`'s: its wait for a batch slot,
//! then its learned prefill rate
//! ([`ReplicaSpeed::prefill_ms_per_block`](crate::load::ReplicaSpeed::prefill_ms_per_block))
//! times the prefill blocks pending there plus the request's own uncached blocks there. A
//! pod is **late** when that is past the SLO and it has requests outstanding; an idle pod is
//! never late (a slow cold prefill there misses only this request, and the family's next
//! requests find the prefix there).
//!
//! - Some pod is not late: the rule does nothing, the cost model chooses.
//! - Every pod is late, but the backlog drains by itself ([`outruns_the_fleet`]: the prefill
//!   offered lately, [`super::offered`], is less than the pods prefill together at their
//!   learned rates, and no queue for batch slots stands still or grows): a burst, the cold
//!   start of a phase or a prompt too long for the SLO anywhere. The rule does nothing: a pod
//!   given up for it would stay backed up after it, and its families with it (on the whole
//!   Mooncake trace at 8 replicas the ungated rule sank every long cold prompt onto one pod,
//!   whose requests came to wait ten minutes for a first token).
//! - Every pod is late and the backlog grows (overload): the request goes
//!   to the most backed-up (the longest wait: for a slot, then the prefill pending) of the pods where it adds the
//!   least prefill: its holders, or any pod for a new family; the cost model breaks ties
//!   among them. Every newcomer there misses already, so this one takes no room from a
//!   request that could still be in time, the other pods drain and answer theirs within the
//!   SLO, and no family is copied onto the pod given up (which would make the copy miss as
//!   well and leave the family on two late pods).
//!
//! This only ever narrows the cost model's candidates, and only in overload; the rule is off
//! until every candidate has learned its prefill rate or its batch. Which pod is given up
//! follows the queues, so when the one given up drains below the SLO it competes again, and
//! when the backlog starts to drain every pod competes again. The evaluation (variants that
//! pass over late pods while another is in time, the rule without the gate, the gate's
//! window, the slot queue's arm) is in docs/POLICY-EVALUATION.md, "A TTFT-SLO rule at each
//! replica's own rate", "The overload rule", "The overload rule, gated by the offered
//! prefill" and "The merged overload rule".

use super::expected::expected;
use super::offered::Offered;
use crate::load::Candidate;
use crate::policy::PerPod;

/// Which of `pods` may take the request when every one of them is expected past `slo_ms`
/// (`uncached[i]`: the blocks the request would prefill on pod `i`) and the fleet is in
/// overload ([`outruns_the_fleet`]); `None` when some pod is expected in time, is idle, or
/// has learned neither its prefill rate nor its batch, or the backlog drains by itself (the
/// cost model chooses among all).
pub fn overload_candidates(
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
    offered: Offered,
) -> Option<PerPod<bool>> {
    // The wait on each pod before the request's own prefill, in milliseconds.
    let mut waits = PerPod::with_capacity(pods.len());
    for (pod, &own) in pods.iter().zip(uncached) {
        let expected = expected(pod, own)?;
        let late = pod.load.shared_outstanding() > 0 && expected.first_token_ms > slo_ms;
        if !late {
            return None;
        }
        waits.push(expected.queued_ms);
    }
    if !outruns_the_fleet(pods, offered) {
        return None;
    }
    let least = uncached.iter().copied().min()?;
    let adds_least = |i: usize| uncached[i] == least;
    let worst = (0..pods.len())
        .filter(|&i| adds_least(i))
        .map(|i| waits[i])
        .fold(f64::NEG_INFINITY, f64::max);
    Some(
        (0..pods.len())
            .map(|i| adds_least(i) && waits[i] >= worst)
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
