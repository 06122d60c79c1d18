//! Routing counter deltas (`routing_counter_deltas`): how the gateway's
//! `aibrix_prefix_cache_*` counters moved during a phase.
//!
//! The simulator has no gateway, so it tallies the decisions of the measured requests exactly
//! as the gateway's metrics module counts them: one `routing_decisions_total` (by match
//! bucket) and one `routing_selection_total` (by selection) per decision that consulted the
//! prefix index, plus one `load_imbalance_total` when the imbalance gate fired. Policies that
//! do not use the index (and the single-pod short-circuit) move nothing, which is why the
//! seed's `random` and `least-request` phases show `[]`.

use std::collections::BTreeMap;

use router_core::Decision;

use super::schema::CounterDelta;

pub const DECISIONS: &str = "aibrix_prefix_cache_routing_decisions_total";
pub const SELECTION: &str = "aibrix_prefix_cache_routing_selection_total";
pub const IMBALANCE: &str = "aibrix_prefix_cache_load_imbalance_total";

/// Counter increments accumulated from decisions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoutingTally {
    counts: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl RoutingTally {
    /// Counts one decision.
    pub fn record(&mut self, decision: &Decision) {
        let (Some(selection), Some(bucket)) = (decision.selection, decision.bucket()) else {
            return;
        };
        self.add(DECISIONS, &[("match_percent_bucket", bucket.as_str())]);
        self.add(SELECTION, &[("selection", selection.as_str())]);
        if decision.imbalance {
            self.add(IMBALANCE, &[]);
        }
    }

    fn add(&mut self, name: &str, labels: &[(&str, &str)]) {
        let mut map: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        // KV-event sync is never on in the simulator.
        map.insert("using_kv_sync".into(), "false".into());
        *self.counts.entry((name.to_owned(), map)).or_insert(0.0) += 1.0;
    }

    /// Every series that moved, sorted by name then labels (the seed's order).
    pub fn deltas(&self) -> Vec<CounterDelta> {
        self.counts
            .iter()
            .filter(|(_, delta)| **delta != 0.0)
            .map(|((name, labels), delta)| CounterDelta {
                name: name.clone(),
                labels: labels.clone(),
                delta: *delta,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use router_core::{Selection, Strategy};

    use super::*;

    fn decision(selection: Option<Selection>, pct: Option<u8>, imbalance: bool) -> Decision {
        Decision {
            pod: 0,
            pod_name: "a".into(),
            strategy: Strategy::PrefixCache,
            selection,
            match_percent: pct,
            imbalance,
            outstanding_at_selection: 0,
            prefix_hashes: Vec::new(),
        }
    }

    #[test]
    fn tallies_like_the_seed_r1_hot90_prefix_cache() {
        let mut tally = RoutingTally::default();
        for _ in 0..95 {
            tally.record(&decision(Some(Selection::PrefixMatch), Some(93), false));
        }
        tally.record(&decision(
            Some(Selection::LeastRequestFallback),
            Some(0),
            true,
        ));
        // A random-policy decision moves nothing.
        tally.record(&decision(None, None, false));
        let got = serde_json::to_value(tally.deltas()).unwrap();
        let want = serde_json::json!([
            {"name": IMBALANCE, "labels": {"using_kv_sync": "false"}, "delta": 1.0},
            {"name": DECISIONS, "labels": {"match_percent_bucket": "0", "using_kv_sync": "false"}, "delta": 1.0},
            {"name": DECISIONS, "labels": {"match_percent_bucket": "76-100", "using_kv_sync": "false"}, "delta": 95.0},
            {"name": SELECTION, "labels": {"selection": "least_request_fallback", "using_kv_sync": "false"}, "delta": 1.0},
            {"name": SELECTION, "labels": {"selection": "prefix_match", "using_kv_sync": "false"}, "delta": 95.0},
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn no_prefix_decisions_means_an_empty_list() {
        let mut tally = RoutingTally::default();
        tally.record(&decision(None, None, false));
        assert!(tally.deltas().is_empty());
    }
}
