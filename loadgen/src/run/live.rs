//! The live runner (`loadgen matrix`): the matrix's workload over HTTP against a gateway, with
//! the replicas' `/metrics` scraped for engine deltas and peaks and the gateway's `/metrics`
//! read before and after each phase for the routing counters.
//!
//! Per phase: priming as SPEC §5.1, one request at a time (warm: straight to each replica's
//! own endpoint, then through the gateway; hot: candidates through the gateway). Then the
//! measured requests, each in its own task and sent at its scheduled time, so a slow stream
//! never delays the next send. Times are engine seconds (wall × time scale) on a phase clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::live_request::{HttpClient, PhaseClock, chat_body, stream_request};
use super::live_scrape::{engine_counters, gateway_scrape, scrape_peaks};
use super::progress::PhaseProgress;
use super::prom_text::routing_deltas;
use super::setup::{PRIMING_MAX_TOKENS, Setup, hot_setup, phase_config};
use crate::measure::{
    MatrixResult, PhaseOutcome, PhaseResult, ReplicaObservation, RequestRecord, Slo, is_good,
    summarize,
};
use crate::workload::{Matrix, PhaseSpec, Priming, candidate_count, plan_requests};

/// One replica as the live runner sees it.
#[derive(Debug, Clone)]
pub struct ReplicaEndpoint {
    pub name: String,
    /// `http://host:port` (its `/metrics` and `/v1/chat/completions` hang off it).
    pub base: String,
}

impl ReplicaEndpoint {
    /// Parses `NAME=URL`; a URL ending in `/metrics` is taken as the metrics URL itself.
    pub fn parse(spec: &str) -> Result<ReplicaEndpoint, String> {
        let (name, url) = spec
            .split_once('=')
            .ok_or_else(|| format!("--replica {spec:?}: expected NAME=URL"))?;
        let url = url.trim().trim_end_matches('/');
        if name.trim().is_empty() || !url.starts_with("http://") {
            return Err(format!(
                "--replica {spec:?}: expected NAME=http://host:port"
            ));
        }
        Ok(ReplicaEndpoint {
            name: name.trim().to_owned(),
            base: url.trim_end_matches("/metrics").to_owned(),
        })
    }
}

/// Where the live runner sends traffic and reads metrics.
#[derive(Debug, Clone)]
pub struct LiveTarget {
    /// The gateway's base URL.
    pub gateway: String,
    /// The gateway's metrics URL (`None`: routing counter deltas are `null`).
    pub gateway_metrics: Option<String>,
    pub replicas: Vec<ReplicaEndpoint>,
    pub model: String,
    /// Engine time per wall second (1 for real engines).
    pub time_scale: f64,
    /// Wall-time bound on one request.
    pub request_limit: Duration,
    pub slo: Slo,
}

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

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
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

    fn gateway_chat(&self) -> String {
        format!("{}/v1/chat/completions", self.target.gateway)
    }

    /// Runs one phase: priming, measured requests, scrapes.
    pub async fn run_phase(&self, phase: &PhaseSpec) -> Result<PhaseResult, LiveError> {
        let setup = self.prime(phase).await?;
        let plan = plan_requests(phase);
        let bodies: Vec<_> = plan
            .iter()
            .map(|r| {
                let text = phase.measured_prompt(&setup.prefixes[r.family], r);
                chat_body(&self.target.model, &text, phase.shape.output)
            })
            .collect();

        let before = engine_counters(&self.client, &self.target.replicas)
            .await
            .map_err(LiveError::Scrape)?;
        let gateway_before =
            gateway_scrape(&self.client, self.target.gateway_metrics.as_deref()).await;
        let (stop, stopped) = watch::channel(false);
        let scraper = tokio::spawn(scrape_peaks(
            self.client.clone(),
            self.target.replicas.clone(),
            self.target.time_scale,
            stopped,
        ));

        // A short lead so the first send is not late by the time spent spawning.
        let lead = Duration::from_millis(50);
        let clock = PhaseClock {
            origin: tokio::time::Instant::now() + lead,
            scale: self.target.time_scale,
        };
        let unix_origin = unix_now() + lead.as_secs_f64();
        let url = self.gateway_chat();
        let strategy = phase.route.as_str();
        let mut tasks = JoinSet::new();
        self.progress.start(&phase.name, plan.len());
        for (request, body) in plan.iter().zip(bodies) {
            tokio::time::sleep_until(clock.instant(request.at)).await;
            let record = RequestRecord::sent(request.index, request.family, request.at, 0.0);
            let (client, url, limit) =
                (self.client.clone(), url.clone(), self.target.request_limit);
            let (progress, slo) = (Arc::clone(&self.progress), self.target.slo);
            progress.sent.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(async move {
                let record =
                    stream_request(&client, &url, body, Some(strategy), clock, record, limit).await;
                progress.done.fetch_add(1, Ordering::Relaxed);
                if is_good(&record, &slo) {
                    progress.good.fetch_add(1, Ordering::Relaxed);
                }
                record
            });
        }
        let mut records = Vec::with_capacity(plan.len());
        while let Some(done) = tasks.join_next().await {
            // A panicked task is a bug in this crate; its request counts as lost.
            if let Ok(record) = done {
                records.push(record);
            }
        }
        records.sort_by_key(|r| r.index);
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
        let gateway_after =
            gateway_scrape(&self.client, self.target.gateway_metrics.as_deref()).await;

        let replicas = self
            .target
            .replicas
            .iter()
            .enumerate()
            .map(|(i, r)| ReplicaObservation {
                name: r.name.clone(),
                before: before[i],
                after: after[i],
                peaks: peaks.get(i).copied().unwrap_or_default(),
            })
            .collect();
        let routing_counter_deltas = match (gateway_before, gateway_after) {
            (Some(b), Some(a)) => Some(routing_deltas(&b, &a)),
            _ => None,
        };
        let outcome = PhaseOutcome {
            config: phase_config(phase, setup.hot.as_ref()),
            clock_origin: unix_origin,
            families: phase.shape.families,
            records,
            replicas,
            initial_prefix_owners: setup.initial_prefix_owners,
            routing_counter_deltas,
            dropped: 0,
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

    /// Sends one priming request and waits for it; it must succeed.
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

    async fn prime(&self, phase: &PhaseSpec) -> Result<Setup, LiveError> {
        let families = phase.shape.families;
        let route = Some(phase.route.as_str());
        let gateway = self.gateway_chat();
        match phase.priming {
            Priming::None => Ok(Setup {
                prefixes: (0..families).map(|f| phase.prefix(0, f)).collect(),
                ..Setup::default()
            }),
            Priming::Warm => {
                let prefixes: Vec<String> = (0..families).map(|f| phase.prefix(0, f)).collect();
                for (f, prefix) in prefixes.iter().enumerate() {
                    for (i, replica) in self.target.replicas.iter().enumerate() {
                        let text = phase.priming_prompt(prefix, &format!("warm-direct-{i}"), f);
                        let url = format!("{}/v1/chat/completions", replica.base);
                        self.prime_one(&url, &text, None).await?;
                    }
                }
                let mut owners = BTreeMap::new();
                for (f, prefix) in prefixes.iter().enumerate() {
                    let text = phase.priming_prompt(prefix, "warm-routed", f);
                    let record = self.prime_one(&gateway, &text, route).await?;
                    if let Some(pod) = record.target_pod {
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
                    self.target.replicas.len(),
                    families,
                );
                let names = self.names();
                for attempt in 0..phase.shape.max_setup_attempts {
                    let prefixes: Vec<String> =
                        (0..candidates).map(|c| phase.prefix(attempt, c)).collect();
                    let mut owners = Vec::with_capacity(candidates);
                    for (c, prefix) in prefixes.iter().enumerate() {
                        let text = phase.priming_prompt(prefix, &format!("hot-{attempt}"), c);
                        let record = self.prime_one(&gateway, &text, route).await?;
                        owners.push(record.target_pod.unwrap_or_default());
                    }
                    if let Some(setup) = hot_setup(&prefixes, &owners, &names, families, attempt) {
                        return Ok(setup);
                    }
                }
                Err(LiveError::NoBalancedSetup(phase.shape.max_setup_attempts))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> LiveTarget {
        // Port 1 on loopback: nothing listens there, so connections are refused at once.
        LiveTarget {
            gateway: "http://127.0.0.1:1".into(),
            gateway_metrics: Some("http://127.0.0.1:1/metrics".into()),
            replicas: vec![ReplicaEndpoint::parse("L20-A=http://127.0.0.1:1").unwrap()],
            model: "m".into(),
            time_scale: 1.0,
            request_limit: Duration::from_secs(5),
            slo: Slo::default(),
        }
    }

    #[tokio::test]
    async fn an_unreachable_stack_stops_the_run_with_a_partial_result() {
        let runner = LiveRunner::new(super::super::live_request::http_client(), unreachable());
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

    #[test]
    fn replica_specs_parse_or_explain() {
        let r = ReplicaEndpoint::parse("L20-A=http://10.0.0.1:8000/metrics").unwrap();
        assert_eq!(
            (r.name.as_str(), r.base.as_str()),
            ("L20-A", "http://10.0.0.1:8000")
        );
        let r = ReplicaEndpoint::parse("b=http://h:1/").unwrap();
        assert_eq!(r.base, "http://h:1");
        for bad in ["nourl", "=http://h:1", "a=ftp://h"] {
            let err = ReplicaEndpoint::parse(bad).unwrap_err();
            assert!(err.contains("--replica"), "{err}");
        }
    }
}
