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
//! events (`super::sim_kv_sync`); what sync applied comes back per phase in [`PhaseRun`] and
//! in total in the result's `runtime` line (the seed's schema has no field for it).

use std::collections::BTreeMap;

use mock_engine::model::EngineProfile;
use rand::rngs::StdRng;
use router_core::{Router, RouterConfig};

use super::setup::{PRIMING_MAX_TOKENS, Setup, hot_setup, phase_config};
use super::sim_cluster::{Arrival, Served, SimCluster, SimError, Target};
use super::sim_kv_sync::KvSyncStats;
use crate::measure::{
    MatrixResult, Peaks, PhaseOutcome, PhaseResult, ReplicaObservation, RoutingTally, Slo,
    summarize,
};
use crate::workload::seeding::rng_for;
use crate::workload::{Matrix, PhaseSpec, Priming, candidate_count, plan_requests};

/// Virtual seconds between two phases (the live harness's pause; keeps timelines readable).
const PHASE_GAP: f64 = 10.0;

/// How to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub replicas: usize,
    pub profile: EngineProfile,
    /// Unequal replicas: when not empty, replica `i` runs `replica_profiles[i % len]`
    /// instead of `profile` (which still names the run when it is the same list's first).
    pub replica_profiles: Vec<EngineProfile>,
    /// Replica names are this prefix plus A, B, C, … (`L20-` gives the seed's `L20-A`, `L20-B`).
    pub replica_prefix: String,
    /// The served model name (routing keys the prefix index by it).
    pub model: String,
    pub router: RouterConfig,
    pub slo: Slo,
    /// Forces warm priming's routed request of family `f` onto replica `warm_owners[f]`
    /// (index into [`SimOptions::replica_names`]) by raising every other replica's
    /// outstanding count while it is routed ([`Target::RoutedOnto`]), so a load-aware route
    /// picks it. `None` (the default)
    /// leaves the owner to the route, as in the seed (a coin toss per family for
    /// `prefix-cache`). Lets a test reproduce both of the seed's warm-uniform outcomes.
    pub warm_owners: Option<Vec<usize>>,
    /// Records warm priming's direct requests in the router's prefix index too, as if the
    /// engines reported their cached blocks (KV-event sync). Off by default, as in the seed,
    /// where the gateway learns only the one owner per family that its routed priming
    /// request went to. An evaluation knob: it shows what the router's partial view of a
    /// warm cluster costs a cache-aware route.
    ///
    /// It approximates [`SimOptions::kv_sync`] and is kept to compare with it: it adds each
    /// priming prompt's text blocks the moment the prompt is sent, never forgets them (an
    /// engine eviction leaves them listed) and shows the index nothing else the engines
    /// cache. Ignored when `kv_sync` is on, where the engines' events show the priming.
    pub kv_synced_priming: bool,
    /// KV-event sync, as the gateway's `[kv_sync]`: every engine's KV-cache events (blocks
    /// stored, evicted, cleared) are applied to the router's index right after the engine
    /// step that produced them, and routed prompts are hashed on the engine's token ids
    /// (4-byte big-endian) instead of their text. The router's own index update on routing
    /// stays, as in the gateway. Needs the router's `block_size` to be a multiple of 4 × the
    /// engine's block size (the default 128 bytes is 2 blocks of 16 tokens). Off by default;
    /// off, nothing differs from a simulator without it.
    pub kv_sync: bool,
    /// Forces the first measured request of family `f` onto replica `first_owners[f]` in
    /// phases without priming (see [`Target::RoutedOnto`]); later requests are routed freely.
    /// For `prefix-cache` this fixes which replica each family lives on in `cold-uniform`,
    /// the draw that decides that cell (docs/FIDELITY.md). `None` (the default) leaves it to
    /// the route.
    pub first_owners: Option<Vec<usize>>,
    /// Which of the router's random draws a phase uses (tie-breaks, `random`'s picks): 0, the
    /// default, is the one every published figure used; another number replays the same
    /// arrivals with other coin flips, which tells a route's luck from its rule.
    pub routing_draw: u64,
}

impl SimOptions {
    /// The seed's setup: two L20-like replicas named `L20-A`, `L20-B`.
    pub fn seed_like(profile: EngineProfile) -> Self {
        SimOptions {
            replicas: 2,
            profile,
            replica_profiles: Vec::new(),
            replica_prefix: "L20-".into(),
            model: "Qwen3.8-27B-FP8".into(),
            router: RouterConfig::default(),
            slo: Slo::default(),
            warm_owners: None,
            kv_synced_priming: false,
            kv_sync: false,
            first_owners: None,
            routing_draw: 0,
        }
    }

    /// The engine profile's name, or the replicas' names in turn (`a, b`) when unequal.
    pub fn profile_names(&self) -> String {
        if self.replica_profiles.is_empty() {
            return self.profile.name.clone();
        }
        let names: Vec<&str> = self
            .replica_profiles
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        names.join(", ")
    }

    /// A fresh cluster of these replicas, engines and router, routing with `rng`.
    pub fn cluster(&self, rng: StdRng) -> Result<SimCluster, SimError> {
        let router = Router::new(self.router.clone())
            .map_err(|e| SimError::Config(format!("router configuration: {e}")))?;
        let profiles = if self.replica_profiles.is_empty() {
            std::slice::from_ref(&self.profile)
        } else {
            &self.replica_profiles
        };
        let cluster = SimCluster::new(self.replica_names(), profiles, router, rng, &self.model);
        if self.kv_sync {
            cluster.with_kv_sync()
        } else {
            Ok(cluster)
        }
    }

    /// Replica names in index order.
    pub fn replica_names(&self) -> Vec<String> {
        (0..self.replicas)
            .map(|i| {
                let letter = char::from(b'A' + (i % 26) as u8);
                if i < 26 {
                    format!("{}{letter}", self.replica_prefix)
                } else {
                    format!("{}{letter}{}", self.replica_prefix, i / 26)
                }
            })
            .collect()
    }
}

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
/// and its measured requests as served (the trace, see [`super::sim_trace`]). On failure the
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
    let result = MatrixResult {
        model: options.model.clone(),
        runtime: format!(
            "prefixgate loadgen {} simulate (mock-engine profile {}{sync_note})",
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
    let setup = prime(&mut cluster, phase, options)?;

    let before = cluster.counters();
    let t0 = cluster.now();
    let first_owners = match (&options.first_owners, phase.priming) {
        (Some(owners), Priming::None) => Some(owners.as_slice()),
        _ => None,
    };
    let mut placed = vec![false; phase.shape.families];
    let mut arrivals = Vec::new();
    for r in plan_requests(phase) {
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
        arrivals.push(Arrival {
            index: r.index,
            family: r.family,
            at: t0 + r.at,
            text: phase.measured_prompt(&setup.prefixes[r.family], &r),
            max_tokens: phase.shape.output,
            target,
        });
    }
    let mut peaks = vec![Peaks::default(); options.replicas];
    let served = cluster.drive(arrivals, Some(&mut peaks))?;
    let after = cluster.counters();

    let mut tally = RoutingTally::default();
    for s in &served {
        if let Some(d) = &s.decision {
            tally.record(d);
        }
    }
    let replicas = cluster
        .names()
        .iter()
        .enumerate()
        .map(|(i, name)| ReplicaObservation {
            name: name.clone(),
            before: before[i],
            after: after[i],
            peaks: peaks[i],
        })
        .collect();
    let outcome = PhaseOutcome {
        config: phase_config(phase, setup.hot.as_ref()),
        clock_origin: clock_origin - t0,
        families: phase.shape.families,
        records: served.iter().map(|s| s.record.clone()).collect(),
        replicas,
        initial_prefix_owners: setup.initial_prefix_owners,
        routing_counter_deltas: Some(tally.deltas()),
        dropped: 0,
    };
    Ok(PhaseRun {
        result: summarize(&outcome, &options.slo),
        served,
        kv_sync: cluster.kv_sync_stats().cloned(),
    })
}

/// Sends one priming request and runs it to completion; it must succeed.
fn prime_one(cluster: &mut SimCluster, text: String, target: Target) -> Result<Served, SimError> {
    let served = cluster.run_one(text, PRIMING_MAX_TOKENS, target)?;
    if served.record.succeeded() {
        Ok(served)
    } else {
        Err(SimError::Priming(served.record.status))
    }
}

/// Primes the caches as SPEC §5.1 says, one request at a time, each run to completion.
/// `options.warm_owners` forces the routed warm priming split, and
/// `options.kv_synced_priming` shows the direct priming to the router's index (unless
/// `options.kv_sync` does it with the engines' events).
fn prime(
    cluster: &mut SimCluster,
    phase: &PhaseSpec,
    options: &SimOptions,
) -> Result<Setup, SimError> {
    let warm_owners = options.warm_owners.as_deref();
    let families = phase.shape.families;
    match phase.priming {
        Priming::None => Ok(Setup {
            prefixes: (0..families).map(|f| phase.prefix(0, f)).collect(),
            ..Setup::default()
        }),
        Priming::Warm => {
            let prefixes: Vec<String> = (0..families).map(|f| phase.prefix(0, f)).collect();
            for (f, prefix) in prefixes.iter().enumerate() {
                for engine in 0..cluster.names().len() {
                    let text = phase.priming_prompt(prefix, &format!("warm-direct-{engine}"), f);
                    if options.kv_synced_priming && !options.kv_sync {
                        cluster.index_as_cached(engine, &text)?;
                    }
                    prime_one(cluster, text, Target::Direct(engine))?;
                }
            }
            let mut owners = BTreeMap::new();
            for (f, prefix) in prefixes.iter().enumerate() {
                let text = phase.priming_prompt(prefix, "warm-routed", f);
                let forced = match warm_owners.map(|o| o.get(f)) {
                    Some(Some(&r)) if r < cluster.names().len() => Some(r),
                    Some(_) => {
                        return Err(SimError::Config(format!(
                            "warm_owners names no replica for family {f}"
                        )));
                    }
                    None => None,
                };
                let target = forced.map_or(Target::Routed(phase.route), |r| {
                    Target::RoutedOnto(phase.route, r)
                });
                let served = prime_one(cluster, text, target)?;
                if let Some(pod) = served.record.target_pod {
                    owners.insert(f.to_string(), vec![pod]);
                }
            }
            Ok(Setup {
                prefixes,
                initial_prefix_owners: owners,
                hot: None,
            })
        }
        Priming::Hot => {
            let candidates = candidate_count(
                phase.shape.priming_candidates,
                cluster.names().len(),
                families,
            );
            for attempt in 0..phase.shape.max_setup_attempts {
                let prefixes: Vec<String> =
                    (0..candidates).map(|c| phase.prefix(attempt, c)).collect();
                let mut owners = Vec::with_capacity(candidates);
                for (c, prefix) in prefixes.iter().enumerate() {
                    let text = phase.priming_prompt(prefix, &format!("hot-{attempt}"), c);
                    let served = prime_one(cluster, text, Target::Routed(phase.route))?;
                    owners.push(served.record.target_pod.unwrap_or_default());
                }
                let names = cluster.names().to_vec();
                if let Some(setup) = hot_setup(&prefixes, &owners, &names, families, attempt) {
                    return Ok(setup);
                }
            }
            Err(SimError::NoBalancedSetup(phase.shape.max_setup_attempts))
        }
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
