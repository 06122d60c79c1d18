//! `prefix-cache`: AIBrix v0.7.0's prefix-cache policy (`routeOriginal`), exactly.
//!
//! With the ready pods and their outstanding counts (read **once** per decision):
//! 1. **Imbalance gate**: when max − min of the counts is strictly greater than
//!    `imbalance_abs_count`, only the pods at the minimum are matched, and the decision
//!    carries `imbalance` (`aibrix_prefix_cache_load_imbalance_total`).
//! 2. **Match** the request's blocks against the index among those candidates. A pod that
//!    holds the first block is matched, even at 0 % (one block of more than 100), as in
//!    AIBrix (`hash.go` keeps it in the map with 0; `routeOriginal` tests
//!    `len(matchedPods) > 0`).
//! 3. If any pod matched: mean and **sample** standard deviation (n − 1) of the counts of
//!    **all** ready pods; shuffle the matched pods, then stable-sort them by match % descending
//!    and count ascending (so remaining ties are uniformly random); the first whose count is
//!    `≤ mean + k·σ` wins (`prefix_match`).
//! 4. Otherwise a uniformly random pod among those with the minimum count:
//!    `prefix_match_skipped` when pods matched but all failed the filter, else
//!    `least_request_fallback`.
//!
//! The chosen pod's match % (0 when it did not match) goes in the decision; the router then
//! counts the request and adds its blocks for the chosen pod.
//!
//! With cluster sharing on, the counts are every gateway's ([`PodLoad::shared_outstanding`]),
//! as AIBrix's gateway replicas add the counts they sync through Redis to their own
//! (`syncRunningRequestsGlobally`); a lone gateway's are its own.
//!
//! [`PodLoad::shared_outstanding`]: crate::load::PodLoad::shared_outstanding
//!
//! Deliberate difference: AIBrix re-reads the counts in the gate, the σ filter and the
//! fallback, so under concurrency the three can disagree; we take one snapshot, so the three
//! steps judge the same loads. With two pods the σ filter can never reject (k ≥ 1 > 1/√2):
//! only the gate protects a busy pod. That is AIBrix's behaviour and is kept on purpose.

use rand::RngCore;
use rand::seq::SliceRandom;

use super::least_request::least_loaded_of;
use super::{Choice, PerPod, Policy, PolicyInput};
use crate::decision::Selection;
use crate::index::{PodMatch, match_percent};

/// `prefix-cache` with its two settings (AIBrix's environment names).
#[derive(Debug, Clone, Copy)]
pub struct PrefixCache {
    /// `AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT`: the gate fires when
    /// max − min of the counts is strictly greater than this.
    imbalance_abs_count: u64,
    /// `AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`: the integer k in mean + k·σ.
    stddev_factor: u64,
}

impl PrefixCache {
    /// The policy with AIBrix's gate threshold and σ factor (validated by the caller: k ≥ 1).
    pub fn new(imbalance_abs_count: u64, stddev_factor: u64) -> Self {
        PrefixCache {
            imbalance_abs_count,
            stddev_factor,
        }
    }
}

impl Policy for PrefixCache {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        let counts: PerPod<u64> = input
            .pods
            .iter()
            .map(|pod| pod.load.shared_outstanding())
            .collect();
        let gate = imbalance_gate(&counts, self.imbalance_abs_count);
        let imbalance = gate.is_some();
        let candidates: PerPod<usize> = gate.unwrap_or_else(|| (0..counts.len()).collect());
        let mut held: PerPod<PodMatch> = candidates
            .iter()
            .map(|&i| PodMatch::new(input.pods[i].name))
            .collect();
        input
            .index
            .match_pods_noting(input.model, input.hashes, &mut held, &mut input.found);
        // A pod holding the first block is matched whatever its percentage: AIBrix keeps
        // one at 0 % (one block of more than 100) in `matchedPods`, so the request goes by
        // the σ filter (`prefix_match`), not to the least-request fallback.
        let blocks = input.hashes.len();
        let matched: PerPod<(usize, u8)> = candidates
            .into_iter()
            .zip(&held)
            .filter(|(_, pod)| pod.held() > 0)
            .map(|(i, pod)| (i, match_percent(pod.held(), blocks)))
            .collect();
        let percent_of = |pod: usize| {
            matched
                .iter()
                .find(|&&(i, _)| i == pod)
                .map_or(0, |&(_, pct)| pct)
        };
        let k = self.stddev_factor as f64;
        if let Some(pod) = pick_matched(&counts, &matched, k, input.rng) {
            return Choice {
                pod,
                selection: Some(Selection::PrefixMatch),
                match_percent: Some(percent_of(pod)),
                imbalance,
                shared_prefix: None,
            };
        }
        let pod = least_loaded_of(&counts, input.rng);
        let selection = if matched.is_empty() {
            Selection::LeastRequestFallback
        } else {
            Selection::PrefixMatchSkipped
        };
        Choice {
            pod,
            selection: Some(selection),
            match_percent: Some(percent_of(pod)),
            imbalance,
            shared_prefix: None,
        }
    }
}

/// The pods at the minimum count when max − min is strictly greater than `threshold`;
/// `None` when the load is balanced enough (or there are no pods).
pub(crate) fn imbalance_gate(counts: &[u64], threshold: u64) -> Option<PerPod<usize>> {
    let min = *counts.iter().min()?;
    let max = *counts.iter().max()?;
    if max - min <= threshold {
        return None;
    }
    Some((0..counts.len()).filter(|&i| counts[i] == min).collect())
}

/// `mean + k·σ` of `counts`, with the sample standard deviation (n − 1; 0 for one pod).
pub(crate) fn load_limit(counts: &[u64], k: f64) -> f64 {
    let n = counts.len() as f64;
    if counts.is_empty() {
        return 0.0;
    }
    let mean = counts.iter().map(|&c| c as f64).sum::<f64>() / n;
    let sd = if counts.len() > 1 {
        let squares: f64 = counts.iter().map(|&c| (c as f64 - mean).powi(2)).sum();
        (squares / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    mean + k * sd
}

/// AIBrix's `getTargetPodFromMatchedPods`: among `matched` (pod index, match %), shuffled
/// then stably sorted by match % descending and count ascending, the first whose count is
/// within `mean + k·σ` of all `counts`. `None` when no pod matched or all fail the filter.
pub(crate) fn pick_matched(
    counts: &[u64],
    matched: &[(usize, u8)],
    k: f64,
    rng: &mut dyn RngCore,
) -> Option<usize> {
    if matched.is_empty() {
        return None;
    }
    let limit = load_limit(counts, k);
    let mut order: PerPod<(usize, u8)> = matched.iter().copied().collect();
    order.shuffle(rng);
    order.sort_by(|&(a, pct_a), &(b, pct_b)| pct_b.cmp(&pct_a).then(counts[a].cmp(&counts[b])));
    order
        .into_iter()
        .map(|(pod, _)| pod)
        .find(|&pod| counts[pod] as f64 <= limit)
}

#[cfg(test)]
mod tests;
