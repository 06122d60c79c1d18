//! The operations result file, in exactly the schema of `shared/seeds/operations-phases.json`.
//!
//! Key for key and type for type, as `schema.rs` is for the matrix: counts are integers,
//! times and rates floats, `status_counts` keyed by the HTTP status as a string. A phase's
//! `config` echoes the phase as the seed does (only the keys the phase uses). Quantiles with no
//! successful stream to measure are `null`. The few keys the seed lacks are optional and left
//! out when absent, and every struct denies unknown fields, so the seed itself deserialising
//! here (a test) proves nothing in it is unmodelled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cluster_events::{DrainRecord, ReplicaSplit, ScaleUpRecord};
use super::schema::Quantiles;

/// A whole operations run: the seed's top-level block plus its phases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationsResult {
    pub model: String,
    /// What served the requests (and the time scale, in local mode).
    pub runtime_version: String,
    /// The gateway.
    pub aibrix_version: String,
    pub gpu: String,
    pub tp: u32,
    pub max_model_len: u64,
    pub slo: SloSeconds,
    pub quantile_method: String,
    pub notes: Vec<String>,
    pub phases: Vec<OperationsPhaseResult>,
    /// `false` for a run that stopped early (ours only; the seed has no such key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
}

/// The SLO a request must meet to be `good`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSeconds {
    pub ttft_seconds: f64,
    pub tpot_seconds: f64,
    pub e2e_seconds: f64,
}

/// One measured operations phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationsPhaseResult {
    pub phase: String,
    pub config: OperationsConfig,
    /// Seconds from the phase's start to its last stream end.
    pub elapsed: f64,
    /// Requests sent (arrivals not dropped).
    pub requests: usize,
    pub success: usize,
    pub errors: usize,
    /// Arrivals dropped by the client's in-flight cap (never sent).
    pub dropped_arrivals: usize,
    pub good: usize,
    pub output_tokens_per_second: f64,
    pub ttft: Quantiles,
    pub tpot: Quantiles,
    pub e2e: Quantiles,
    /// The phase's start and end in seconds since the run's first phase started.
    pub started_relative_seconds: f64,
    pub finished_relative_seconds: f64,
    pub tenants: BTreeMap<String, TenantResult>,
    /// The replica drained during the phase (ours; phases with `drain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainRecord>,
    /// The replicas added during the phase (ours; phases with `scale_up`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScaleUpRecord>,
    /// Requests per replica over time (ours; phases with a cluster event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_split: Option<ReplicaSplit>,
}

/// One tenant of a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantResult {
    pub requests: usize,
    pub success: usize,
    pub good: usize,
    /// HTTP status → requests (`"no_response"` for requests that got none).
    pub status_counts: BTreeMap<String, usize>,
    /// `[min, max]` of `usage.prompt_tokens` over successful requests (`[0, 0]` if none).
    pub input_tokens_range: [u32; 2],
    pub ttft_p95_seconds: Option<f64>,
    pub tpot_p95_seconds: Option<f64>,
}

/// A phase's settings as the seed records them: the keys the phase uses, nothing else.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationsConfig {
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inflight_cap: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages: Option<Vec<StageConfig>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_prefix: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<BTreeMap<String, TenantConfig>>,
    /// Ours: `"poisson"` when arrivals were not constant-spaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<String>,
    /// Ours, local mode: replicas the phase ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
    /// Ours, local mode: the gateway's per-tenant in-flight caps during the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_tenant_max_in_flight: Option<BTreeMap<String, usize>>,
}

/// One arrival stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    pub duration: f64,
    pub rps: f64,
}

/// One tenant's request shape.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub repeat: u32,
    pub output: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/operations-phases.json");

    #[test]
    fn the_seed_deserialises_with_nothing_unmodelled_and_round_trips() {
        let seed: OperationsResult = serde_json::from_str(SEED).unwrap();
        assert_eq!(seed.phases.len(), 13);
        let protected = &seed.phases[7];
        assert_eq!(protected.tenants["B"].status_counts["429"], 95);
        assert_eq!(protected.config.tenants.as_ref().unwrap()["B"].output, 512);
        assert_eq!(seed.phases[0].dropped_arrivals, 105);
        let text = serde_json::to_string(&seed).unwrap();
        let again: OperationsResult = serde_json::from_str(&text).unwrap();
        assert_eq!(seed, again);
        let raw: serde_json::Value = serde_json::from_str(SEED).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            super::super::schema_check::key_paths(&raw),
            super::super::schema_check::key_paths(&ours)
        );
    }
}
