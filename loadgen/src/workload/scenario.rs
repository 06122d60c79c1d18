//! The matrix file's request shape (`[workload]`) and scenario tables (`[scenario.NAME]`), as
//! written: what each key means and its default. [`super::matrix`] validates them and
//! [`super::traffic`] resolves a scenario's traffic from them.

use serde::Deserialize;

use super::conversation::ConversationSpec;
use super::inter_arrival::InterArrival;
use super::length::LengthDist;
use super::popularity::Popularity;

/// The request shape shared by every phase.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadShape {
    pub count: usize,
    pub rps: f64,
    pub output: u32,
    /// The seed harness's prompt-size knob; recorded in each phase's `config` for fidelity.
    pub repeat: u32,
    pub families: usize,
    pub prefix_tokens: usize,
    /// Inclusive range of per-request tail lengths (the nonce included).
    pub tail_tokens: [usize; 2],
    pub priming_candidates: usize,
    pub max_setup_attempts: u32,
}

/// How the caches are prepared before a phase is measured (SPEC §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priming {
    /// Nothing: every family starts cold.
    None,
    /// Every family primed directly on every replica, then one routed request per family.
    Warm,
    /// Candidate prefixes primed once each through the router; a balanced choice of families.
    Hot,
}

/// One scenario's traffic and priming. Every key but `priming` is optional; a missing one
/// keeps the seed's behaviour or the `[workload]` value (docs/LOADGEN.md, "Production-like
/// workloads", has the keys and their forms).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    pub priming: Priming,
    /// Share of the requests that go to family 0 (0 = uniform over all families).
    #[serde(default)]
    pub hot_fraction: f64,
    /// `"uniform"`, `{ hot = F }` or `{ zipf = S }` (instead of `hot_fraction`).
    #[serde(default)]
    pub popularity: Option<Popularity>,
    /// Share of the phase each family is live, staggered (default 1: all phase).
    #[serde(default)]
    pub family_lifetime: Option<f64>,
    /// `"constant"` (default), `"poisson"` or `{ gamma = { cv = C } }`.
    #[serde(default)]
    pub arrival: InterArrival,
    /// Replace `[workload]`'s values for this scenario.
    #[serde(default)]
    pub count: Option<usize>,
    #[serde(default)]
    pub rps: Option<f64>,
    #[serde(default)]
    pub families: Option<usize>,
    /// A count, `[min, max]` or a log-normal table ([`LengthDist`]).
    #[serde(default)]
    pub tail_tokens: Option<LengthDist>,
    #[serde(default)]
    pub output: Option<LengthDist>,
    /// Multi-turn sessions instead of single requests.
    #[serde(default)]
    pub conversations: Option<ConversationSpec>,
}
