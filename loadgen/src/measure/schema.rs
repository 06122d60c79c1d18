//! The result file, in exactly the schema of `shared/seeds/matrix-24-phase.json`.
//!
//! Key for key and type for type: counts are integers, engine deltas and peaks are floats
//! (the seed's harness read them from Prometheus text), maps keyed by family are keyed by the
//! family number as a string. Optional keys are the ones the seed has only in some phases
//! (hot-phase setup fields). Quantiles with no successful stream to measure are `null`.
//! Every struct denies unknown fields, so the seed itself deserialising here (a test) proves
//! nothing in it is unmodelled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A whole run: the seed's top-level block plus its phases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixResult {
    pub model: String,
    pub runtime: String,
    pub runtime_image_digests: Vec<String>,
    pub aibrix: String,
    pub replicas: usize,
    pub gpu_per_replica: String,
    pub measured_phases: usize,
    pub planned_phases: usize,
    /// `false` for a run that stopped early (error or interrupt); the phases done are kept.
    pub complete: bool,
    pub phases: Vec<PhaseResult>,
}

/// One measured phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseResult {
    pub phase: String,
    pub scenario: String,
    pub route: String,
    pub config: PhaseConfig,
    /// Seconds (Unix time for live runs, virtual seconds since the run began when simulated)
    /// of the first send and of the last stream end.
    pub started_at: f64,
    pub finished_at: f64,
    pub elapsed: f64,
    pub planned: usize,
    pub requests: usize,
    pub success: usize,
    pub errors: usize,
    pub dropped: usize,
    pub good: usize,
    pub output_tokens_per_second: f64,
    pub ttft: Quantiles,
    pub tpot: Quantiles,
    pub e2e: Quantiles,
    pub families: BTreeMap<String, FamilyResult>,
    pub replicas: BTreeMap<String, ReplicaResult>,
    pub cache_hit_ratio: f64,
    pub input_tokens_range: [u32; 2],
    pub initial_prefix_owners: BTreeMap<String, Vec<String>>,
    /// `null` when the gateway's counters could not be read; otherwise every
    /// `aibrix_prefix_cache_*` series that moved, sorted by name then labels.
    pub routing_counter_deltas: Option<Vec<CounterDelta>>,
    pub gateway_verified_requests: usize,
}

/// The phase's settings as the seed records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseConfig {
    pub repeat: u32,
    pub output: u32,
    pub count: usize,
    pub rps: f64,
    pub seed: u64,
    pub phase: String,
    pub route: String,
    pub scenario: String,
    pub hot_fraction: f64,
    /// Hot phases: which setup attempt (1-based) found a balanced choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_attempt: Option<u32>,
    /// Hot phases: family → candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family_map: Option<BTreeMap<String, usize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priming_candidates: Option<usize>,
    /// Hot phases: replica → candidates it owns after priming.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_owners: Option<BTreeMap<String, Vec<usize>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot_initial_replica: Option<String>,
    /// Ours: the traffic shape where it is not the seed's (arrival process, popularity,
    /// length distributions, conversations; `Traffic::describe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<String>,
}

/// Linear-interpolation quantiles over successful complete streams (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
}

/// One family of a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyResult {
    pub requests: usize,
    pub ttft_p95: Option<f64>,
}

/// One replica of a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaResult {
    /// Requests whose `target-pod` named this replica.
    pub requests: usize,
    /// Delta of `vllm:request_success_total` (all finish reasons).
    pub engine_completed: f64,
    /// Delta of `vllm:prefix_cache_queries_total` (tokens).
    pub cache_queries_tokens: f64,
    /// Delta of `vllm:prefix_cache_hits_total` (tokens).
    pub cache_hit_tokens: f64,
    pub cache_hit_ratio: f64,
    pub waiting_peak: f64,
    pub running_peak: f64,
    /// Family → requests routed here (families with none are left out, as in the seed).
    pub family_counts: BTreeMap<String, usize>,
    pub kv_usage_peak: f64,
    /// Delta of `vllm:num_preemptions_total`.
    pub preemptions: f64,
    pub gateway_outstanding_at_selection_peak: u64,
}

/// How much one routing counter series moved during a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterDelta {
    pub name: String,
    /// The series' labels without `model` (as the seed records them).
    pub labels: BTreeMap<String, String>,
    pub delta: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/matrix-24-phase.json");

    #[test]
    fn the_seed_deserialises_with_nothing_unmodelled() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        assert_eq!(seed.phases.len(), 24);
        assert!(seed.complete);
        let hot90 = &seed.phases[22];
        assert_eq!(hot90.config.setup_attempt, Some(1));
        assert_eq!(hot90.config.hot_initial_replica.as_deref(), Some("L20-B"));
        assert_eq!(seed.phases[0].routing_counter_deltas, None);
        assert_eq!(seed.phases[3].routing_counter_deltas, Some(vec![]));
    }

    #[test]
    fn round_trip_keeps_every_value() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        let text = serde_json::to_string(&seed).unwrap();
        let again: MatrixResult = serde_json::from_str(&text).unwrap();
        assert_eq!(seed, again);
        let raw: serde_json::Value = serde_json::from_str(SEED).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Same keys everywhere (the seed's integer 0 hot_fraction becomes 0.0: same JSON type).
        assert_eq!(
            crate::measure::schema_check::key_paths(&raw),
            crate::measure::schema_check::key_paths(&ours)
        );
    }
}
