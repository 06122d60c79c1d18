//! When a pod is expected to give a request its first token, at the pod's own learned prefill
//! rate ([`ReplicaSpeed::prefill_ms_per_block`](crate::load::ReplicaSpeed::prefill_ms_per_block)):
//! the prefill queued there, then the request's own. Both time-based rules read it, the
//! overload rule (`slo.rs`) and the copy filter (`in_time.rs`).

use crate::load::Candidate;

/// A pod's expectation for one request, in milliseconds.
pub struct Expected {
    /// The prefill already queued on the pod (its pending blocks at its rate).
    pub queued_ms: f64,
    /// The request's first token: the queued prefill, then its own blocks.
    pub first_token_ms: f64,
}

/// The expectation on `pod` for a request that prefills `own_blocks` there; `None` before the
/// pod has learned its prefill rate.
pub fn expected(pod: &Candidate<'_>, own_blocks: u64) -> Option<Expected> {
    let rate = pod.load.speed().prefill_ms_per_block()?;
    let queued_ms = rate * pod.load.shared_pending_prefill_blocks() as f64;
    Some(Expected {
        queued_ms,
        first_token_ms: queued_ms + rate * own_blocks as f64,
    })
}
