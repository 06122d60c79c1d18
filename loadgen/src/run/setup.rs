//! What priming produced, shared by the simulated and live runners: the prefix each family
//! uses, the owners the router learned, the hot-phase setup, and the phase's `config` block
//! built from them.

use std::collections::BTreeMap;

use crate::measure::PhaseConfig;
use crate::workload::{PhaseSpec, choose_hot_families, family_owners, initial_owners};

/// What priming produced, for the phase's config and `initial_prefix_owners`.
#[derive(Debug, Default)]
pub struct Setup {
    /// Family → prefix text.
    pub prefixes: Vec<String>,
    pub initial_prefix_owners: BTreeMap<String, Vec<String>>,
    pub hot: Option<HotSetup>,
}

/// A hot phase's setup: the balanced choice and the attempt (1-based) that found it.
#[derive(Debug)]
pub struct HotSetup {
    pub attempt: u32,
    pub family_map: Vec<usize>,
    pub candidates: usize,
    pub initial_owners: BTreeMap<String, Vec<usize>>,
    pub hot_replica: String,
}

/// A hot phase's setup once priming attempt `attempt` (0-based) sent candidate `c`'s prefix
/// `prefixes[c]` to replica `owners[c]`; `None` when no balanced choice of `families` exists
/// among those owners. Shared by the live and simulated runners, which differ only in how
/// they send the priming requests.
pub fn hot_setup(
    prefixes: &[String],
    owners: &[String],
    replicas: &[String],
    families: usize,
    attempt: u32,
) -> Option<Setup> {
    let choice = choose_hot_families(owners, replicas, families)?;
    Some(Setup {
        prefixes: choice
            .family_map
            .iter()
            .map(|&c| prefixes[c].clone())
            .collect(),
        initial_prefix_owners: family_owners(&choice.family_map, owners),
        hot: Some(HotSetup {
            attempt: attempt + 1,
            candidates: prefixes.len(),
            initial_owners: initial_owners(owners, replicas),
            family_map: choice.family_map,
            hot_replica: choice.hot_replica,
        }),
    })
}

/// The phase's `config` block in the seed's schema.
pub fn phase_config(phase: &PhaseSpec, hot: Option<&HotSetup>) -> PhaseConfig {
    PhaseConfig {
        repeat: phase.shape.repeat,
        output: phase.shape.output,
        count: phase.planned_count(),
        rps: phase.shape.rps,
        seed: phase.seed,
        phase: phase.name.clone(),
        route: phase.route.as_str().to_owned(),
        scenario: phase.scenario.clone(),
        hot_fraction: phase.hot_fraction,
        setup_attempt: hot.map(|h| h.attempt),
        family_map: hot.map(|h| {
            h.family_map
                .iter()
                .enumerate()
                .map(|(f, &c)| (f.to_string(), c))
                .collect()
        }),
        priming_candidates: hot.map(|h| h.candidates),
        initial_owners: hot.map(|h| h.initial_owners.clone()),
        hot_initial_replica: hot.map(|h| h.hot_replica.clone()),
        traffic: phase.traffic.describe(),
    }
}
