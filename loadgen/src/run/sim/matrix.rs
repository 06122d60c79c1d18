//! The simulated runner (`loadgen simulate`): the matrix's workload through router-core's
//! policies against mock-engine models on a virtual clock. Deterministic for a seed.
//!
//! Per phase: a fresh cluster (fresh engines and router: the phases' prefixes never overlap,
//! so carrying caches over would change nothing but memory), priming exactly as the live
//! path does it (SPEC §5.1), engine counters read before and after the measured requests,
//! gauges scraped every 250 ms of virtual time, and the routing counters tallied from the
//! measured decisions as the gateway's metrics would count them. Phases are laid end to end
//! on one virtual timeline (`started_at` is virtual seconds since the run began).
//!
//! With [`SimOptions::kv_sync`] the router's index is also fed by the engines' KV-cache
//! events (`super::kv_sync`); what sync applied comes back per phase in [`PhaseRun`] and
//! in total in the result's `runtime` line (the seed's schema has no field for it).

use super::cluster::{Arrival, Served, SimCluster, SimError, Target};
use super::converse::converse;
use super::kv_sync::KvSyncStats;
use super::options::SimOptions;
use super::priming::SimPrimer;
use crate::measure::{
    MatrixResult, Peaks, PhaseOutcome, PhaseResult, ReplicaObservation, RoutingTally, summarize,
};
use crate::run::priming::{complete_now, prime};
use crate::run::setup::{Setup, phase_config};
use crate::workload::seeding::rng_for;
use crate::workload::{Matrix, PhaseSpec, PlannedRequest, Priming};

/// Virtual seconds between two phases (the live harness's pause; keeps timelines readable).
const PHASE_GAP: f64 = 10.0;

/// One simulated phase: its result, its measured requests as served (in arrival order) and,
/// with KV-event sync, what sync applied over the phase (priming included).
#[derive(Debug)]
pub struct PhaseRun {
    pub result: PhaseResult,
    pub served: Vec<Served>,
    pub kv_sync: Option<KvSyncStats>,
}

/// A run that stopped early: the phases done so far (`complete: false`) and why.
#[derive(Debug)]
pub struct PartialRun {
    pub partial: MatrixResult,
    pub error: SimError,
}

/// Simulates every phase of `matrix` in order, calling `progress` after each with its result
/// and its measured requests as served (the trace, see [`super::trace_lines`]). On failure the
/// phases already done come back with the error, so a caller can still write them.
pub fn simulate_matrix(
    matrix: &Matrix,
    options: &SimOptions,
    progress: &mut dyn FnMut(&PhaseResult, &[Served]),
) -> Result<MatrixResult, Box<PartialRun>> {
    simulate_matrix_runs(matrix, options, &mut |run| {
        progress(&run.result, &run.served)
    })
}

/// [`simulate_matrix`], handing `progress` each phase's whole [`PhaseRun`] (with what
/// KV-event sync applied).
pub fn simulate_matrix_runs(
    matrix: &Matrix,
    options: &SimOptions,
    progress: &mut dyn FnMut(&PhaseRun),
) -> Result<MatrixResult, Box<PartialRun>> {
    let phases = matrix.phases();
    let mut results = Vec::with_capacity(phases.len());
    let mut synced = options.kv_sync.then(KvSyncStats::default);
    let mut clock = 0.0;
    let mut failure = None;
    if options.replicas == 0 || options.replicas > 256 {
        failure = Some(SimError::Config(format!(
            "--replicas must be 1..=256, got {}",
            options.replicas
        )));
    }
    for phase in &phases {
        if failure.is_some() {
            break;
        }
        match simulate_phase_run(phase, options, clock) {
            Ok(run) => {
                clock = run.result.finished_at + PHASE_GAP;
                progress(&run);
                if let (Some(total), Some(stats)) = (synced.as_mut(), &run.kv_sync) {
                    total.absorb(stats);
                }
                results.push(run.result);
            }
            Err(e) => failure = Some(e),
        }
    }
    let sync_note = synced.map_or(String::new(), |s| {
        format!(", KV-event sync: {}", s.summary())
    });
    let gateway_note = if options.gateways > 1 {
        format!(
            ", {} gateways ({})",
            options.gateways,
            options.gateway_assignment.as_str()
        )
    } else {
        String::new()
    };
    let result = MatrixResult {
        model: options.model.clone(),
        runtime: format!(
            "prefixgate loadgen {} simulate (mock-engine profile {}{gateway_note}{sync_note})",
            env!("CARGO_PKG_VERSION"),
            options.profile_names()
        ),
        runtime_image_digests: Vec::new(),
        aibrix: "router-core (AIBrix v0.7.0 prefix-cache semantics)".into(),
        replicas: options.replicas,
        gpu_per_replica: format!("simulated {}", options.profile_names()),
        measured_phases: results.len(),
        planned_phases: phases.len(),
        complete: failure.is_none() && results.len() == phases.len(),
        phases: results,
    };
    match failure {
        None => Ok(result),
        Some(error) => Err(Box::new(PartialRun {
            partial: result,
            error,
        })),
    }
}

/// Simulates one phase; `clock_origin` places it on the run's virtual timeline.
pub fn simulate_phase(
    phase: &PhaseSpec,
    options: &SimOptions,
    clock_origin: f64,
) -> Result<PhaseResult, SimError> {
    simulate_phase_traced(phase, options, clock_origin).map(|(result, _)| result)
}

/// [`simulate_phase`], also returning every measured request as served (its record, the
/// engine it ran on and the router's decision), in arrival order: the per-request trace
/// that explains a phase's figures. A phase builds its own cluster and router, so a phase
/// traced alone gives the same figures as inside its matrix.
pub fn simulate_phase_traced(
    phase: &PhaseSpec,
    options: &SimOptions,
    clock_origin: f64,
) -> Result<(PhaseResult, Vec<Served>), SimError> {
    simulate_phase_run(phase, options, clock_origin).map(|run| (run.result, run.served))
}

/// [`simulate_phase_traced`], with what KV-event sync applied over the phase.
pub fn simulate_phase_run(
    phase: &PhaseSpec,
    options: &SimOptions,
    clock_origin: f64,
) -> Result<PhaseRun, SimError> {
    let draw = options.routing_draw.to_string();
    let labels: &[&str] = match options.routing_draw {
        0 => &[&phase.name, "routing"],
        _ => &[&phase.name, "routing", &draw],
    };
    let mut cluster = options.cluster(rng_for(phase.seed, labels))?;
    let setup = prime_phase(&mut cluster, phase, options)?;

    let before = cluster.counters();
    let t0 = cluster.now();
    let first_owners = match (&options.first_owners, phase.priming) {
        (Some(owners), Priming::None) => Some(owners.as_slice()),
        _ => None,
    };
    let mut placed = vec![false; phase.shape.families];
    let mut arrivals = Vec::new();
    for r in phase.planned_requests(&setup.prefixes) {
        let forced = first_owners.map(|owners| owners.get(r.family).copied());
        let target = match forced {
            Some(Some(replica)) if !std::mem::replace(&mut placed[r.family], true) => {
                Target::RoutedOnto(phase.route, replica)
            }
            Some(None) => {
                return Err(SimError::Config(format!(
                    "first_owners names no replica for family {}",
                    r.family
                )));
            }
            _ => Target::Routed(phase.route),
        };
        let request = PlannedRequest { at: t0 + r.at, ..r };
        arrivals.push(Arrival { request, target });
    }
    let mut peaks = vec![Peaks::default(); options.replicas];
    let (served, dropped) = match phase.conversations(&setup.prefixes) {
        None => (cluster.drive(arrivals, Some(&mut peaks))?, 0),
        Some(source) => converse(&mut cluster, phase.route, source, t0, &mut peaks)?,
    };
    let after = cluster.counters();

    let mut tally = RoutingTally::default();
    for s in &served {
        if let Some(d) = &s.decision {
            tally.record(d);
        }
    }
    let names = cluster.names().iter().map(String::as_str);
    let replicas = ReplicaObservation::per_replica(names, &before, &after, &peaks);
    let outcome = PhaseOutcome {
        config: phase_config(phase, setup.hot.as_ref()),
        clock_origin: clock_origin - t0,
        families: phase.shape.families,
        records: served.iter().map(|s| s.record.clone()).collect(),
        replicas,
        initial_prefix_owners: setup.initial_prefix_owners,
        routing_counter_deltas: Some(tally.deltas()),
        dropped,
    };
    Ok(PhaseRun {
        result: summarize(&outcome, &options.slo),
        served,
        kv_sync: cluster.kv_sync_stats(),
    })
}

/// Primes a simulated phase with the one priming routine (`crate::run::priming`); the
/// simulated cluster never waits, so the routine completes in one poll.
fn prime_phase(
    cluster: &mut SimCluster,
    phase: &PhaseSpec,
    options: &SimOptions,
) -> Result<Setup, SimError> {
    let mut primer = SimPrimer { cluster, options };
    complete_now(prime(&mut primer, phase)).unwrap_or_else(|| {
        Err(SimError::Config(
            "priming waited on a simulated cluster, which never waits".into(),
        ))
    })
}

#[cfg(test)]
#[path = "matrix_tests.rs"]
mod tests;
