//! A [`Decision`] records what a policy chose and why, so that callers can set response
//! headers and move the `aibrix_prefix_cache_*` counters without router-core knowing
//! Prometheus.

use std::fmt;

use crate::strategy::Strategy;

/// Why the prefix-cache family of policies picked its pod. The label values are AIBrix's
/// (`aibrix_prefix_cache_routing_selection_total{selection=…}`); `prefix-load` adds its own,
/// documented on the variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selection {
    /// The best-matching pod that passed the load filter.
    PrefixMatch,
    /// Pods matched, but every one failed the mean + k·σ filter; least-request fallback.
    PrefixMatchSkipped,
    /// No pod matched any block; least-request fallback.
    LeastRequestFallback,
    /// `prefix-load` only: the pod with the lowest estimated cost, chosen by the cost model.
    CostModel,
}

impl Selection {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Selection::PrefixMatch => "prefix_match",
            Selection::PrefixMatchSkipped => "prefix_match_skipped",
            Selection::LeastRequestFallback => "least_request_fallback",
            Selection::CostModel => "cost_model",
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// AIBrix's match-percent buckets for `aibrix_prefix_cache_routing_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchBucket {
    Zero,
    UpTo25,
    UpTo50,
    UpTo75,
    UpTo100,
}

impl MatchBucket {
    /// The bucket of a match percentage: 0 → `"0"`, 1–25, 26–50, 51–75, 76–100.
    pub fn of(match_percent: u8) -> Self {
        match match_percent {
            0 => MatchBucket::Zero,
            1..=25 => MatchBucket::UpTo25,
            26..=50 => MatchBucket::UpTo50,
            51..=75 => MatchBucket::UpTo75,
            _ => MatchBucket::UpTo100,
        }
    }

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            MatchBucket::Zero => "0",
            MatchBucket::UpTo25 => "1-25",
            MatchBucket::UpTo50 => "26-50",
            MatchBucket::UpTo75 => "51-75",
            MatchBucket::UpTo100 => "76-100",
        }
    }
}

/// What happened when a request was routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Index of the chosen pod in the candidate slice passed to the router.
    pub pod: usize,
    /// Name of the chosen pod (the `target-pod` header).
    pub pod_name: String,
    /// The strategy that decided.
    pub strategy: Strategy,
    /// Why the pod was chosen. `None` for policies that do not use the prefix index and for
    /// the single-pod short-circuit, where AIBrix records no prefix metric either.
    pub selection: Option<Selection>,
    /// The chosen pod's match percentage (0 when it matched nothing). `None` when the policy
    /// did not consult the index.
    pub match_percent: Option<u8>,
    /// `true` when the imbalance gate fired (`aibrix_prefix_cache_load_imbalance_total`).
    pub imbalance: bool,
    /// The chosen pod's outstanding count at selection, before this request.
    pub outstanding_at_selection: u64,
    /// The request's block hashes, when the policy computed them.
    pub prefix_hashes: Vec<u64>,
}

impl Decision {
    /// The match bucket label, when the decision moves the prefix-cache counters.
    pub fn bucket(&self) -> Option<MatchBucket> {
        self.selection
            .map(|_| MatchBucket::of(self.match_percent.unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_boundaries_match_aibrix() {
        let cases = [
            (0, "0"),
            (1, "1-25"),
            (25, "1-25"),
            (26, "26-50"),
            (50, "26-50"),
            (51, "51-75"),
            (75, "51-75"),
            (76, "76-100"),
            (99, "76-100"),
            (100, "76-100"),
        ];
        for (pct, label) in cases {
            assert_eq!(MatchBucket::of(pct).as_str(), label, "match {pct}%");
        }
    }
}
