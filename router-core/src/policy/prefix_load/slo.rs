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
//! - Every pod is late, but the prefill offered lately ([`super::offered`]) is less than the
//!   pods prefill together at their learned rates (the sum of their blocks per millisecond):
//!   the backlog is a burst, the cold start of a phase or a prompt too long for the SLO
//!   anywhere, and it drains by itself. The rule does nothing: a pod given up for it would
//!   stay backed up after it, and its families with it (on the whole Mooncake trace at 8
//!   replicas the rule sank every long cold prompt onto one pod, whose requests came to
//!   wait ten minutes for a first token).
//! - Every pod is late and the prefill offered outruns the fleet (overload): the request goes
//!   to the most backed-up (the most prefill pending, in time) of the pods where it adds the
//!   least prefill: its holders, or any pod for a new family; the cost model breaks ties
//!   among them. Every newcomer there misses already, so this one takes no room from a
//!   request that could still be in time, the other pods drain and answer theirs within the
//!   SLO, and no family is copied onto the pod given up (which would make the copy miss as
//!   well and leave the family on two late pods).
//!
//! This only ever narrows the cost model's candidates, and only in overload; the rule is off
//! until every candidate has learned its prefill rate. Which pod is given up follows the
//! queues, so when the one given up drains below the SLO it competes again, and when the
//! offered prefill falls below what the fleet prefills every pod competes again. The
//! evaluation (variants that pass over late pods while another is in time, the rule without
//! the offered-prefill gate, the gate's window) is in docs/POLICY-EVALUATION.md, "A TTFT-SLO
//! rule at each replica's own rate", "The overload rule" and "The overload rule, gated by the
//! offered prefill".

use super::expected::expected;
use super::offered::Offered;
use crate::load::Candidate;
use crate::policy::PerPod;

/// Leaves only the [`overload_candidates`] in `costs` (the others cost infinity), in
/// overload; otherwise leaves `costs` as they are.
pub fn keep_overload_candidates(
    costs: &mut [f64],
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
    offered: Offered,
) {
    if let Some(allowed) = overload_candidates(pods, uncached, slo_ms, offered) {
        for (cost, allowed) in costs.iter_mut().zip(allowed) {
            if !allowed {
                *cost = f64::INFINITY;
            }
        }
    }
}

/// Which of `pods` may take the request when every one of them is expected past `slo_ms`
/// (`uncached[i]`: the blocks the request would prefill on pod `i`) and the load `offered`
/// lately is at least what the pods serve together: blocks to prefill at their learned
/// rates, or requests through their batch slots once every pod has learned its slots;
/// `None` when some pod is expected in time, is idle, or has not learned its prefill rate,
/// or the fleet serves faster than it is offered (the cost model chooses among all).
pub fn overload_candidates(
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
    offered: Offered,
) -> Option<PerPod<bool>> {
    // The prefill queued on each pod, in milliseconds at its own rate.
    let mut waits = PerPod::with_capacity(pods.len());
    // Blocks per millisecond the pods prefill together, at their learned rates.
    let mut prefilled_per_ms = 0.0;
    // Requests per millisecond their batch slots finish together, while every pod has
    // learned its slots (`None` once one has not).
    let mut finished_per_ms = Some(0.0);
    for (pod, &own) in pods.iter().zip(uncached) {
        let expected = expected(pod, own)?;
        let ms_per_block = pod.load.speed().prefill_ms_per_block()?;
        let late = pod.load.shared_outstanding() > 0 && expected.first_token_ms > slo_ms;
        if !late {
            return None;
        }
        waits.push(expected.queued_ms);
        prefilled_per_ms += 1.0 / ms_per_block;
        finished_per_ms = finished_per_ms
            .zip(pod.load.slots().finished_per_ms())
            .map(|(a, b)| a + b);
    }
    let outruns_prefill = offered.blocks_per_ms >= prefilled_per_ms;
    let outruns_slots = finished_per_ms.is_some_and(|done| offered.requests_per_ms >= done);
    if !outruns_prefill && !outruns_slots {
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
