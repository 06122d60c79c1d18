//! A whole operations run: phases in order against a gateway, or in local mode against the
//! stack each phase asks for ([`LocalStacks`]: mock replicas and a gateway with the phase's
//! replica count and `[admission]` table, reused while consecutive phases ask for the same),
//! gathered into one [`OperationsResult`] with the seed's top-level block. A run that stops
//! early (a stack that cannot start, an interrupt) keeps the phases done, `complete: false`.

use std::future::Future;

use mock_engine::model::EngineProfile;
use router_core::RouterConfig;
use tokio::time::Instant;

use super::{OperationsRunner, StackShape};
use crate::measure::{OperationsPhaseResult, OperationsResult, Slo, SloSeconds};
use crate::run::assignment::GatewayAssignment;
use crate::run::live::LiveTarget;
use crate::run::local::{LocalOptions, LocalStack};
use crate::run::sim::SimOptions;
use crate::workload::{Operations, OperationsPhase};

/// The seed's `quantile_method`, which ours follows.
pub const QUANTILE_METHOD: &str =
    "linear interpolation of successful complete streams; excludes rejected and failed requests";

/// The top-level description of an operations result: what served the requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackDescription {
    pub model: String,
    pub runtime_version: String,
    pub aibrix_version: String,
    pub gpu: String,
    /// 0 when unknown (a real gateway).
    pub max_model_len: u64,
}

/// Local mode: starts, reuses and stops the stack each phase asks for.
#[derive(Debug)]
pub struct LocalStacks {
    names_prefix: String,
    default_replicas: usize,
    /// Replica `i` runs `profiles[i % len]` ([`LocalOptions::profiles`]); not empty.
    profiles: Vec<EngineProfile>,
    time_scale: f64,
    model: String,
    routing: RouterConfig,
    current: Option<(StackShape, LocalStack)>,
}

impl LocalStacks {
    /// Nothing starts until [`LocalStacks::for_phase`].
    pub fn new(
        names_prefix: String,
        default_replicas: usize,
        profiles: Vec<EngineProfile>,
        time_scale: f64,
        model: String,
        routing: RouterConfig,
    ) -> Self {
        LocalStacks {
            names_prefix,
            default_replicas,
            profiles,
            time_scale,
            model,
            routing,
            current: None,
        }
    }

    /// The stack `phase` wants: replicas and admission from the phase (or the defaults),
    /// the tenant header from the file.
    pub fn shape_for(&self, phase: &OperationsPhase, tenant_header: &str) -> StackShape {
        let mut admission = phase.def.admission.clone().unwrap_or_default();
        admission.tenant_header = Some(tenant_header.to_owned());
        StackShape {
            replicas: phase.def.replicas.unwrap_or(self.default_replicas),
            admission,
        }
    }

    /// The running stack for `shape`: the current one if it has that shape, else a fresh one
    /// (the old one is stopped first).
    pub async fn for_shape(&mut self, shape: &StackShape) -> Result<&LocalStack, String> {
        if self.current.as_ref().is_some_and(|(s, _)| s != shape) {
            if let Some((_, old)) = self.current.take() {
                old.shutdown().await;
            }
        }
        if self.current.is_none() {
            // Named as the matrix names them (`L20-A`, `L20-B`, …).
            let Some(first) = self.profiles.first() else {
                return Err("no engine profile given for the local replicas".to_owned());
            };
            let mut naming = SimOptions::seed_like(first.clone());
            naming.replicas = shape.replicas;
            naming.replica_prefix.clone_from(&self.names_prefix);
            let names = naming.replica_names();
            let stack = LocalStack::start(LocalOptions {
                names,
                profiles: self.profiles.clone(),
                time_scale: self.time_scale,
                model: self.model.clone(),
                admission: shape.admission.clone(),
                routing: self.routing.clone(),
                gateways: 1,
                assignment: GatewayAssignment::RoundRobin,
            })
            .await?;
            self.current = Some((shape.clone(), stack));
        }
        match &self.current {
            Some((_, stack)) => Ok(stack),
            None => Err("no local stack".to_owned()),
        }
    }

    /// What local phases run on, for the result's top-level fields.
    pub fn describe(&self) -> StackDescription {
        let profiles: Vec<&str> = self.profiles.iter().map(|p| p.name.as_str()).collect();
        let profiles = profiles.join(", ");
        StackDescription {
            model: self.model.clone(),
            runtime_version: format!(
                "prefixgate loadgen {} local: mock-engine {} at time scale {} (times in engine seconds)",
                env!("CARGO_PKG_VERSION"),
                profiles,
                self.time_scale
            ),
            aibrix_version: "prefixgate gateway (router-core; per-tenant admission from the phase)"
                .to_owned(),
            gpu: format!("simulated {profiles}"),
            // The longest prompt every replica takes.
            max_model_len: self
                .profiles
                .iter()
                .map(|p| p.max_model_len as u64)
                .min()
                .unwrap_or(0),
        }
    }

    /// Stops the running stack, so the next phase gets a fresh one.
    pub async fn retire(&mut self) {
        if let Some((_, stack)) = self.current.take() {
            stack.shutdown().await;
        }
    }

    /// Stops the running stack, if any.
    pub async fn shutdown(mut self) {
        if let Some((_, stack)) = self.current.take() {
            stack.shutdown().await;
        }
    }
}

/// Where an operations run sends its phases.
#[derive(Debug)]
pub enum OperationsTarget {
    /// A running gateway (its replicas and admission are the operator's).
    Live(LiveTarget),
    /// Boxed: a stack set is large and there is one per run.
    Local(Box<LocalStacks>),
}

/// Runs `phases` of `ops` in order; `notes` go into the result. `progress` hears of each
/// phase done; the run stops early when `interrupt` resolves or a local stack cannot start.
pub async fn run_operations(
    runner: &OperationsRunner,
    ops: &Operations,
    phases: &[OperationsPhase],
    mut target: OperationsTarget,
    mut notes: Vec<String>,
    progress: &mut dyn FnMut(usize, &OperationsPhaseResult),
    interrupt: impl Future<Output = ()>,
) -> (OperationsResult, Option<String>) {
    let run_origin = Instant::now();
    let mut results: Vec<OperationsPhaseResult> = Vec::with_capacity(phases.len());
    let mut stopped = None;
    let mut interrupt = std::pin::pin!(interrupt);
    for phase in phases {
        let one = async {
            match &mut target {
                OperationsTarget::Live(live) => {
                    runner.run_phase(phase, live, run_origin, None, None).await
                }
                OperationsTarget::Local(stacks) => {
                    let shape = stacks.shape_for(phase, &ops.tenant_header);
                    let stack = stacks.for_shape(&shape).await?;
                    let result = runner
                        .run_phase(phase, stack.target(), run_origin, Some(&shape), Some(stack))
                        .await;
                    if phase.def.drain.is_some() || phase.def.scale_up.is_some() {
                        // Its replica set changed: the next phase starts on a fresh stack.
                        stacks.retire().await;
                    }
                    result
                }
            }
        };
        tokio::select! {
            outcome = one => match outcome {
                Ok(result) => {
                    progress(results.len() + 1, &result);
                    results.push(result);
                }
                Err::<_, String>(e) => {
                    stopped = Some(format!("{}: {e}", phase.def.name));
                    break;
                }
            },
            () = &mut interrupt => {
                stopped = Some(format!("interrupted during {}", phase.def.name));
                break;
            }
        }
    }
    let describe = match target {
        OperationsTarget::Local(stacks) => {
            let describe = stacks.describe();
            stacks.shutdown().await;
            describe
        }
        OperationsTarget::Live(live) => StackDescription {
            runtime_version: format!(
                "prefixgate loadgen {} live against {}",
                env!("CARGO_PKG_VERSION"),
                live.gateway_urls()
            ),
            aibrix_version: live.gateway_urls(),
            gpu: "unknown".to_owned(),
            max_model_len: 0,
            model: live.model,
        },
    };
    if let Some(why) = &stopped {
        notes.push(format!("run stopped early: {why}"));
    }
    let slo = Slo::default();
    let result = OperationsResult {
        model: describe.model,
        runtime_version: describe.runtime_version,
        aibrix_version: describe.aibrix_version,
        gpu: describe.gpu,
        tp: 1,
        max_model_len: describe.max_model_len,
        slo: SloSeconds {
            ttft_seconds: slo.ttft,
            tpot_seconds: slo.tpot,
            e2e_seconds: slo.e2e,
        },
        quantile_method: QUANTILE_METHOD.to_owned(),
        notes,
        complete: Some(stopped.is_none() && results.len() == phases.len()),
        phases: results,
    };
    (result, stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::operations::operations_config;

    #[test]
    fn local_stack_shapes_follow_the_phase_and_the_file_header() {
        let ops = Operations::builtin().unwrap();
        let stacks = LocalStacks::new(
            "L20-".into(),
            2,
            vec![EngineProfile::builtin("fast").expect("builtin fast profile")],
            1.0,
            "m".into(),
            RouterConfig::default(),
        );
        let fixed1 = stacks.shape_for(&ops.phases[0], "x-t");
        assert_eq!(fixed1.replicas, 1);
        assert_eq!(fixed1.admission.tenant_header.as_deref(), Some("x-t"));
        let baseline = stacks.shape_for(&ops.phases[6], "x-tenant");
        let protected = stacks.shape_for(&ops.phases[7], "x-tenant");
        assert_ne!(baseline, protected);
        let cache = stacks.shape_for(&ops.phases[8], "x-tenant");
        assert_eq!(cache, stacks.shape_for(&ops.phases[11], "x-tenant"));
        let config = operations_config(&ops.phases[7], Some(&protected));
        assert_eq!(config.replicas, Some(2));
        assert_eq!(config.gateway_tenant_max_in_flight.unwrap()["B"], 2);
        assert_eq!(
            operations_config(&ops.phases[6], Some(&baseline)).gateway_tenant_max_in_flight,
            None
        );
    }

    #[test]
    fn our_quantile_method_is_the_seeds() {
        let seed: serde_json::Value =
            serde_json::from_str(include_str!("../../../testdata/operations-phases.json")).unwrap();
        assert_eq!(seed["quantile_method"], QUANTILE_METHOD);
    }
}
