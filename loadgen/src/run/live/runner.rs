//! The live runner (`loadgen matrix`): the matrix's workload over HTTP against a gateway, with
//! the replicas' `/metrics` scraped for engine deltas and peaks and the gateway's `/metrics`
//! read before and after each phase for the routing counters.
//!
//! Per phase: priming as SPEC §5.1, one request at a time (warm: straight to each replica's
//! own endpoint, then through the gateway; hot: candidates through the gateway). Then the
//! measured requests, each in its own task and sent at its scheduled time, so a slow stream
//! never delays the next send. Times are engine seconds (wall × time scale) on a phase clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::converse::send_conversations;
use super::progress::PhaseProgress;
use super::request::{HttpClient, PhaseClock, chat_body, stream_request};
use super::scrape::{engine_counters, gateway_scrapes, scrape_peaks, summed_routing_deltas};
use super::send::{Sent, send_planned};
use super::target::LiveTarget;
use crate::measure::{
    MatrixResult, PhaseOutcome, PhaseResult, ReplicaObservation, RequestRecord, summarize,
};
use crate::run::assignment::Assigner;
use crate::run::priming::{PRIMING_MAX_TOKENS, PrimingCluster, PrimingError, PrimingRoute, prime};
use crate::run::setup::phase_config;
use crate::workload::seeding::rng_for;
use crate::workload::{Matrix, PhaseSpec};

/// The free-text top-level fields of a live result.
#[derive(Debug, Clone)]
pub struct RunDescription {
    /// `runtime`: what served the requests (and the time scale, in local mode).
    pub runtime: String,
    /// `aibrix`: the gateway.
    pub gateway: String,
    pub gpu_per_replica: String,
}

/// A live phase that could not be run.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("priming failed: {0}")]
    Priming(String),
    #[error("cannot read replica metrics: {0}")]
    Scrape(String),
    #[error("no balanced family choice after {0} setup attempts")]
    NoBalancedSetup(u32),
}

/// Runs phases against one target.
#[derive(Debug)]
pub struct LiveRunner {
    client: HttpClient,
    target: LiveTarget,
    progress: Arc<PhaseProgress>,
}

impl LiveRunner {
    pub fn new(client: HttpClient, target: LiveTarget) -> Self {
        LiveRunner {
            client,
            target,
            progress: Arc::default(),
        }
    }

    /// Live counts of the phase in progress.
    pub fn progress(&self) -> Arc<PhaseProgress> {
        Arc::clone(&self.progress)
    }

    fn names(&self) -> Vec<String> {
        self.target
            .replicas
            .iter()
            .map(|r| r.name.clone())
            .collect()
    }

    /// The chat URL of gateway `g`.
    fn gateway_chat(&self, g: usize) -> Result<String, LiveError> {
        let gateway = self
            .target
            .gateways
            .get(g)
            .ok_or_else(|| LiveError::Priming(format!("gateway {g} is not in the target")))?;
        Ok(format!("{}/v1/chat/completions", gateway.url))
    }

    /// A fresh spread of requests over the gateways, seeded so two runs spread alike.
    pub fn assigner(&self) -> Assigner {
        let draw = rng_for(0, &["live gateway assignment"]);
        Assigner::new(self.target.gateways.len(), self.target.assignment, draw)
    }

    /// Runs one phase: priming, measured requests, scrapes.
    pub async fn run_phase(&self, phase: &PhaseSpec) -> Result<PhaseResult, LiveError> {
        // Priming and the measured requests reach the gateways in one sequence, as in the
        // simulator.
        let mut assigner = self.assigner();
        let mut primer = LivePrimer {
            runner: self,
            assigner: &mut assigner,
            names_pods: None,
        };
        let setup = prime(&mut primer, phase).await?;
        let plan = phase.planned_requests(&setup.prefixes);

        let before = engine_counters(&self.client, &self.target.replicas)
            .await
            .map_err(LiveError::Scrape)?;
        let gateway_before = gateway_scrapes(&self.client, &self.target.gateways).await;
        let (stop, stopped) = watch::channel(false);
        let scraper = tokio::spawn(scrape_peaks(
            self.client.clone(),
            self.target.replicas.clone(),
            self.target.time_scale,
            stopped,
        ));

        let strategy = Some(phase.route.as_str());
        let (
            Sent {
                records,
                unix_origin,
            },
            dropped,
        ) = match phase.conversations(&setup.prefixes) {
            None => {
                self.progress.start(&phase.name, plan.len());
                let sent = send_planned(
                    &self.client,
                    &self.target,
                    &mut assigner,
                    plan,
                    strategy,
                    &self.progress,
                )
                .await;
                (sent, 0)
            }
            Some(source) => {
                self.progress.start(&phase.name, source.planned());
                let done = send_conversations(
                    &self.client,
                    &self.target,
                    &mut assigner,
                    source,
                    strategy,
                    &self.progress,
                )
                .await;
                (done.sent, done.abandoned)
            }
        };
        // Sends are scheduled tasks; a lag here would hide client-side queueing in the numbers.
        let lag = records
            .iter()
            .map(|r| r.dispatched - r.scheduled)
            .fold(0.0, f64::max);
        tracing::info!(
            phase = %phase.name,
            max_dispatch_lag_engine_s = lag,
            "measured requests done"
        );
        let _ = stop.send(true);
        let peaks = scraper.await.unwrap_or_default();
        let after = engine_counters(&self.client, &self.target.replicas)
            .await
            .map_err(LiveError::Scrape)?;
        let gateway_after = gateway_scrapes(&self.client, &self.target.gateways).await;

        let names = self.target.replicas.iter().map(|r| r.name.as_str());
        let replicas = ReplicaObservation::per_replica(names, &before, &after, &peaks);
        let routing_counter_deltas =
            summed_routing_deltas(gateway_before.as_deref(), gateway_after.as_deref());
        let outcome = PhaseOutcome {
            config: phase_config(phase, setup.hot.as_ref()),
            clock_origin: unix_origin,
            families: phase.shape.families,
            records,
            replicas,
            initial_prefix_owners: setup.initial_prefix_owners,
            routing_counter_deltas,
            dropped,
        };
        Ok(summarize(&outcome, &self.target.slo))
    }

    /// Runs every phase of `matrix` in order, stopping early when `interrupt` resolves or a
    /// phase fails; the phases done come back either way (`complete: false` when stopped),
    /// with the reason it stopped.
    pub async fn run_matrix(
        &self,
        matrix: &Matrix,
        describe: RunDescription,
        progress: &mut dyn FnMut(&PhaseResult),
        interrupt: impl Future<Output = ()>,
    ) -> (MatrixResult, Option<String>) {
        let phases = matrix.phases();
        let mut results = Vec::with_capacity(phases.len());
        let mut stopped = None;
        let mut interrupt = std::pin::pin!(interrupt);
        for phase in &phases {
            tokio::select! {
                outcome = self.run_phase(phase) => match outcome {
                    Ok(result) => {
                        progress(&result);
                        results.push(result);
                    }
                    Err(e) => {
                        stopped = Some(format!("{}: {e}", phase.name));
                        break;
                    }
                },
                () = &mut interrupt => {
                    stopped = Some(format!("interrupted during {}", phase.name));
                    break;
                }
            }
        }
        let result = MatrixResult {
            model: self.target.model.clone(),
            runtime: describe.runtime,
            runtime_image_digests: Vec::new(),
            aibrix: describe.gateway,
            replicas: self.target.replicas.len(),
            gpu_per_replica: describe.gpu_per_replica,
            measured_phases: results.len(),
            planned_phases: phases.len(),
            complete: stopped.is_none() && results.len() == phases.len(),
            phases: results,
        };
        (result, stopped)
    }

    /// Sends one priming request to `url` and waits for it; it must succeed.
    async fn prime_one(
        &self,
        url: &str,
        text: &str,
        strategy: Option<&str>,
    ) -> Result<RequestRecord, LiveError> {
        let clock = PhaseClock {
            origin: tokio::time::Instant::now(),
            scale: self.target.time_scale,
        };
        let body = chat_body(&self.target.model, text, PRIMING_MAX_TOKENS);
        let record = RequestRecord::sent(0, 0, 0.0, 0.0);
        let record = stream_request(
            &self.client,
            url,
            body,
            strategy,
            clock,
            record,
            self.target.request_limit,
        )
        .await;
        if !record.succeeded() {
            return Err(LiveError::Priming(format!(
                "{url}: status {:?}, error {:?}",
                record.status, record.error
            )));
        }
        Ok(record)
    }
}

/// The live stack as the one priming routine sees it: direct requests go to a replica's own
/// endpoint, routed ones through the gateway `assigner` picks, with the phase's route.
///
/// A gateway that names no replica (no `target-pod` header: the peer routers set none) is
/// answered from the engines' own counters: priming sends one request at a time, so the
/// replica whose `vllm:request_success_total` rose across a routed priming request ran it.
/// Counters are read around routed requests only until the gateway is seen to name replicas.
struct LivePrimer<'a> {
    runner: &'a LiveRunner,
    assigner: &'a mut Assigner,
    /// Whether the gateway sets `target-pod`; `None` until a routed priming request says.
    names_pods: Option<bool>,
}

/// Reads of the engines' counters after a routed priming request that named no replica,
/// until one replica shows it (an engine may count a request a moment after its stream ends).
const OWNER_READS: usize = 20;
const OWNER_READ_GAP: Duration = Duration::from_millis(50);

impl LivePrimer<'_> {
    /// Sends one routed priming request; returns the replica that ran it.
    async fn prime_routed(&mut self, text: &str, route: &str) -> Result<Option<String>, LiveError> {
        let runner = self.runner;
        let replicas = &runner.target.replicas;
        let before = match self.names_pods {
            Some(true) => None,
            _ => Some(
                engine_counters(&runner.client, replicas)
                    .await
                    .map_err(LiveError::Scrape)?,
            ),
        };
        let url = runner.gateway_chat(self.assigner.next_gateway())?;
        let record = runner.prime_one(&url, text, Some(route)).await?;
        if record.target_pod.is_some() {
            self.names_pods = Some(true);
            return Ok(record.target_pod);
        }
        self.names_pods = Some(false);
        let Some(before) = before else {
            return Ok(None);
        };
        for _ in 0..OWNER_READS {
            let after = engine_counters(&runner.client, replicas)
                .await
                .map_err(LiveError::Scrape)?;
            let ran: Vec<usize> = (0..replicas.len())
                .filter(|&i| after[i].completed > before[i].completed)
                .collect();
            match ran.as_slice() {
                [] => tokio::time::sleep(OWNER_READ_GAP).await,
                [one] => return Ok(Some(replicas[*one].name.clone())),
                more => {
                    return Err(LiveError::Priming(format!(
                        "the gateway names no replica (no target-pod header) and {} replicas \
                         completed requests during one priming request; is other traffic \
                         reaching them?",
                        more.len()
                    )));
                }
            }
        }
        Err(LiveError::Priming(
            "the gateway names no replica (no target-pod header) and no replica's \
             vllm:request_success_total rose for a priming request"
                .into(),
        ))
    }
}

impl From<PrimingError> for LiveError {
    fn from(error: PrimingError) -> Self {
        match error {
            PrimingError::NoBalancedSetup(attempts) => LiveError::NoBalancedSetup(attempts),
        }
    }
}

impl PrimingCluster for LivePrimer<'_> {
    type Error = LiveError;

    fn replica_names(&self) -> Vec<String> {
        self.runner.names()
    }

    async fn prime_one(
        &mut self,
        text: String,
        route: PrimingRoute,
    ) -> Result<Option<String>, LiveError> {
        let runner = self.runner;
        match route {
            PrimingRoute::Direct(i) => {
                let replica = runner.target.replicas.get(i).ok_or_else(|| {
                    LiveError::Priming(format!("replica {i} is not in the target"))
                })?;
                let url = format!("{}/v1/chat/completions", replica.base);
                Ok(runner.prime_one(&url, &text, None).await?.target_pod)
            }
            PrimingRoute::WarmOwner { route, .. } | PrimingRoute::HotCandidate { route } => {
                self.prime_routed(&text, route.as_str()).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::measure::Slo;
    use crate::run::live::ReplicaEndpoint;

    fn unreachable() -> LiveTarget {
        // Port 1 on loopback: nothing listens there, so connections are refused at once.
        LiveTarget {
            gateways: LiveTarget::one_gateway(
                "http://127.0.0.1:1".into(),
                Some("http://127.0.0.1:1/metrics".into()),
            ),
            assignment: Default::default(),
            replicas: vec![ReplicaEndpoint::parse("L20-A=http://127.0.0.1:1").unwrap()],
            model: "m".into(),
            time_scale: 1.0,
            request_limit: Duration::from_secs(5),
            slo: Slo::default(),
        }
    }

    #[tokio::test]
    async fn an_unreachable_stack_stops_the_run_with_a_partial_result() {
        let runner = LiveRunner::new(super::super::request::http_client(), unreachable());
        let matrix = Matrix::builtin().unwrap().with_count(2).unwrap();
        let describe = RunDescription {
            runtime: "test".into(),
            gateway: "none".into(),
            gpu_per_replica: "none".into(),
        };
        let (result, stopped) = runner
            .run_matrix(&matrix, describe, &mut |_| {}, std::future::pending())
            .await;
        assert!(!result.complete);
        assert_eq!((result.measured_phases, result.planned_phases), (0, 24));
        let why = stopped.expect("the run stops");
        assert!(why.contains("r1-cold-uniform-random"), "{why}");
        assert!(why.contains("127.0.0.1:1"), "{why}");
    }
}
