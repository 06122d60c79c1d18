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
//! [`HOT_IN_FLIGHT`] of its requests in flight on its holders), whose later requests repay a
//! late first copy.

use super::config::HOT_IN_FLIGHT;
use super::expected::expected;
use super::{PolicyInput, uncached_blocks};

/// Sets to infinity the cost of every busy copy target whose first token is expected after
/// `slo_millis` (see the module docs). `percents` are the pods' matches, `best` the
/// largest, `shared_prefix` the prefix the request shares with its best holders.
pub fn pass_over_late_copies(
    input: &PolicyInput<'_>,
    percents: &[u8],
    best: u8,
    shared_prefix: Option<u64>,
    slo_millis: f64,
    costs: &mut [f64],
) {
    // A new family has no copy; without a held prefix there is nothing to copy.
    let Some(prefix) = shared_prefix.filter(|_| best > 0) else {
        return;
    };
    // Nothing is filtered until every pod has learned its rate.
    if input
        .pods
        .iter()
        .any(|pod| pod.load.speed().prefill_ms_per_block().is_none())
    {
        return;
    }
    let in_flight: u64 = input
        .pods
        .iter()
        .zip(percents)
        .filter(|(_, pct)| **pct == best)
        .map(|(pod, _)| u64::from(pod.load.shared_prefix_counts(prefix).outstanding))
        .sum();
    if in_flight >= HOT_IN_FLIGHT {
        return;
    }
    let blocks = input.hashes.len() as u64;
    for ((cost, pod), &pct) in costs.iter_mut().zip(input.pods).zip(percents) {
        if pct >= best || pod.load.shared_outstanding() == 0 {
            continue;
        }
        if expected(pod, uncached_blocks(blocks, pct))
            .is_some_and(|e| e.first_token_ms > slo_millis)
        {
            *cost = f64::INFINITY;
        }
    }
}

/// EXPERIMENT (PL_X): switches read from the environment.
pub fn exp(name: &str) -> bool {
    static X: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    X.get_or_init(|| std::env::var("PL_X").unwrap_or_default())
        .split(',')
        .any(|s| s == name)
}

/// EXPERIMENT: a copy onto a pod whose engine has a queue waits for a slot.
pub fn pass_over_queued(
    input: &PolicyInput<'_>,
    percents: &[u8],
    best: u8,
    shared_prefix: Option<u64>,
    costs: &mut [f64],
) {
    let slots: u64 = std::env::var("PL_SLOTS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let full = |pod: &crate::load::Candidate<'_>| pod.load.shared_outstanding() >= slots;
    let queued = |pod: &crate::load::Candidate<'_>| {
        pod.load.engine_stats().is_some_and(|s| s.waiting > 0) || (exp("full") && full(pod))
    };
    let late = |p: &crate::load::Candidate<'_>| p.load.speed().latest_ttft_ms().unwrap_or(0.0);
    let slo: f64 = std::env::var("PL_SLO_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000.0);
    let trigger = if exp("lateonly") {
        input.pods.iter().all(|p| late(p) > slo)
    } else if exp("sinklate") {
        let k: f64 = std::env::var("PL_SINK_K").ok().and_then(|v| v.parse().ok()).unwrap_or(1.0);
        let r: f64 = std::env::var("PL_SINK_R").ok().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let mut l: Vec<f64> = input.pods.iter().map(late).collect();
        l.sort_by(|a, b| b.total_cmp(a));
        let qf = |p: &crate::load::Candidate<'_>| if exp("qfull") { p.load.engine_stats().is_some_and(|s| s.waiting > 0) } else { full(p) };
        input.pods.iter().all(|p| qf(p)) && l[0] > k * slo && l[0] >= r * l.get(1).copied().unwrap_or(0.0)
    } else if exp("lateall") {
        input.pods.iter().all(|p| full(p) && late(p) > slo)
    } else {
        input.pods.iter().all(|p| full(p))
    };
    if exp("ttftsink") && trigger {
        let max = input.pods.iter().map(late).fold(f64::NEG_INFINITY, f64::max);
        let rate = |p: &crate::load::Candidate<'_>| p.load.speed().prefill_ms_per_block();
        let fastest = input.pods.iter().filter_map(rate).fold(f64::INFINITY, f64::min);
        let slow = |p: &crate::load::Candidate<'_>| rate(p).is_some_and(|r| r >= 1.5 * fastest);
        if exp("slowsink") && !input.pods.iter().any(|p| late(p) >= max && slow(p)) {
            return;
        }
        for (c, p) in costs.iter_mut().zip(input.pods) {
            if late(p) < max {
                *c = f64::INFINITY;
            }
        }
        return;
    }
    if exp("allsink") && input.pods.iter().all(|p| full(p)) {
        let max = input.pods.iter().map(|p| p.load.shared_outstanding()).max().unwrap_or(0);
        for (c, p) in costs.iter_mut().zip(input.pods) {
            if p.load.shared_outstanding() < max {
                *c = f64::INFINITY;
            }
        }
        return;
    }
    if best == 0 || shared_prefix.is_none() {
        if exp("newsink") && input.pods.iter().all(|p| queued(p)) {
            let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for c in costs.iter_mut() {
                if *c < max {
                    *c = f64::INFINITY;
                }
            }
            return;
        }
        if exp("qnew") && input.pods.iter().any(|p| !queued(p)) {
            for (cost, pod) in costs.iter_mut().zip(input.pods) {
                if queued(pod) {
                    *cost = f64::INFINITY;
                }
            }
        }
        return;
    }
    if !exp("qcopy") && !exp("hcopy") {
        return;
    }
    let prefix = shared_prefix.unwrap();
    let in_flight: u64 = input
        .pods
        .iter()
        .zip(percents)
        .filter(|(_, pct)| **pct == best)
        .map(|(pod, _)| u64::from(pod.load.shared_prefix_counts(prefix).outstanding))
        .sum();
    if !exp("nohot") && in_flight >= HOT_IN_FLIGHT {
        return;
    }
    for ((cost, pod), &pct) in costs.iter_mut().zip(input.pods).zip(percents) {
        let over = exp("hcopy") && pod.load.shared_outstanding() + in_flight + u64::from(exp("plus1")) > slots;
        if pct < best && pod.load.shared_outstanding() > 0 && (over || (exp("qcopy") && queued(pod))) {
            *cost = f64::INFINITY;
        }
    }
}
