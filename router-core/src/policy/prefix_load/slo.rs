//! `prefix-load`'s overload rule (`ttft_slo_seconds`): when no pod is expected to give a
//! request its first token within the TTFT SLO, the request goes where it harms no request
//! that could still make it, instead of where the cost model spreads the misses evenly.
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
//! - Every pod is late (overload): the request goes to the most backed-up (the most prefill
//!   pending, in time) of the pods where it adds the least prefill: its holders, or any pod
//!   for a new family; the cost model breaks ties among them. Every newcomer there misses
//!   already, so this one takes no room from a request that could still be in time, the
//!   other pods drain and answer theirs within the SLO, and no family is copied onto the
//!   pod given up (which would make the copy miss as well and leave the family on two
//!   late pods).
//!
//! This only ever narrows the cost model's candidates, and only when every pod is late; the
//! rule is off until every candidate has learned its prefill rate or its batch. Which pod is given up
//! follows the queues, so when the one given up drains below the SLO it competes again. The
//! evaluation of this rule against variants that also pass over late pods while another is
//! in time (they lose where a busy engine prefills slower than its learned rate) is in
//! docs/POLICY-EVALUATION.md, "A TTFT-SLO rule at each replica's own rate".

use super::expected::expected;
use crate::load::Candidate;
use crate::policy::PerPod;

/// Leaves only the [`overload_candidates`] in `costs` (the others cost infinity), when every
/// pod is late; otherwise leaves `costs` as they are.
pub fn keep_overload_candidates(
    costs: &mut [f64],
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
) {
    if let Some(allowed) = overload_candidates(pods, uncached, slo_ms) {
        for (cost, allowed) in costs.iter_mut().zip(allowed) {
            if !allowed {
                *cost = f64::INFINITY;
            }
        }
    }
}

/// Which of `pods` may take the request when every one of them is expected past `slo_ms`
/// (`uncached[i]`: the blocks the request would prefill on pod `i`); `None` when some pod
/// is expected in time, is idle, or has learned neither its prefill rate nor its batch (the
/// cost model chooses among all).
pub fn overload_candidates(
    pods: &[Candidate<'_>],
    uncached: &[u64],
    slo_ms: f64,
) -> Option<PerPod<bool>> {
    // The prefill queued on each pod, in milliseconds at its own rate.
    let mut waits = PerPod::with_capacity(pods.len());
    for (pod, &own) in pods.iter().zip(uncached) {
        let expected = expected(pod, own)?;
        let late = pod.load.shared_outstanding() > 0 && expected.first_token_ms > slo_ms;
        if !late {
            return None;
        }
        waits.push(expected.queued_ms);
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
