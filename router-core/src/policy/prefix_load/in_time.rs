//! `copy_in_time_seconds`: a copy only where its first token is expected in time.
//!
//! A copy (a pod below the request's best match) prefills the prompt's shared prefix again.
//! On a slow replica that is busy the copy misses a TTFT target however cheap the cost model
//! finds it, and its prefill delays what is queued there, so the cost model's balancing by
//! blocks turns into two late replicas (docs/POLICY-EVALUATION.md, "Unequal replicas: the
//! cold cells, second pass"). This filter passes such a pod over; the cost model chooses
//! among the rest, which always include the best holders. It reads each pod's learned
//! prefill rate ([`crate::load::ReplicaSpeed`]) and acts only once every pod has one.
//!
//! Two copies are always allowed: onto an idle pod (it misses once and then serves the
//! prefix's later requests without delaying anyone), and of a hot prefix (at least
//! [`HOT_IN_FLIGHT`](super::config::HOT_IN_FLIGHT) of its requests in flight on its holders), whose later requests repay a
//! late first copy.

use super::expected::expected;
use super::{PolicyInput, uncached_blocks};
use crate::policy::PerPod;

/// Which pods may take the request: all but the busy copy targets whose first token is
/// expected after `slo_millis` (see the module docs). `percents` are the pods' matches,
/// `best` the largest; the caller asks only for a copy of a held prefix that is not hot.
pub fn in_time_targets(
    input: &PolicyInput<'_>,
    percents: &[u8],
    best: u8,
    slo_millis: f64,
) -> PerPod<bool> {
    // Nothing is filtered until every pod has learned its rate.
    if input
        .pods
        .iter()
        .any(|pod| pod.load.speed().prefill_ms_per_block().is_none())
    {
        return PerPod::from_elem(true, input.pods.len());
    }
    let blocks = input.hashes.len() as u64;
    input
        .pods
        .iter()
        .zip(percents)
        .map(|(pod, &pct)| {
            pct >= best
                || pod.load.shared_outstanding() == 0
                || expected(pod, uncached_blocks(blocks, pct))
                    .is_none_or(|e| e.first_token_ms <= slo_millis)
        })
        .collect()
}
