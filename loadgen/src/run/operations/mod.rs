//! The operations runner (`loadgen operations`): each phase's open- or closed-loop load over
//! HTTP against a gateway, every request a streamed chat completion with the phase's
//! `routing-strategy` and the tenant header, measured into the operations seed's schema.
//!
//! The request path (client, SSE timing, record) is the matrix's
//! ([`stream_request_with_headers`]); when requests go out is [`drive`]'s;
//! which stack a phase runs on and the whole run are [`stacks`]'s.

pub mod drive;
pub mod events;
pub mod stacks;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use drive::{Driven, closed_loop, open_loop};
use events::run_events;

use crate::measure::{
    OperationsConfig, OperationsOutcome, OperationsPhaseResult, RequestRecord, StageConfig,
    TenantConfig, TenantRecord, drain_record, is_good, replica_split, scale_up_record,
    summarize_operations,
};
use crate::run::live::LiveTarget;
use crate::run::live::progress::PhaseProgress;
use crate::run::live::request::{HttpClient, PhaseClock, chat_body, stream_request_with_headers};
use crate::run::local::LocalStack;
use crate::workload::{AdmissionSpec, ArrivalProcess, Load, OperationsPhase};

/// Buckets of a phase's per-replica split over time (`replica_split`).
const SPLIT_BUCKETS: usize = 12;

/// What the local stack of a phase was, for its `config` (`None` against a real gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackShape {
    pub replicas: usize,
    pub admission: AdmissionSpec,
}

/// The phase's `config` block: the keys the phase uses, as the seed records them.
pub fn operations_config(phase: &OperationsPhase, stack: Option<&StackShape>) -> OperationsConfig {
    let def = &phase.def;
    let caps = stack.map(|s| {
        s.admission
            .tenants
            .iter()
            .map(|(name, t)| (name.clone(), t.max_in_flight))
            .collect()
    });
    OperationsConfig {
        phase: def.name.clone(),
        repeat: def.repeat,
        output: def.output,
        route: def.route.clone(),
        inflight_cap: def.inflight_cap,
        stages: def.stages.as_ref().map(|stages| {
            stages
                .iter()
                .map(|s| StageConfig {
                    duration: s.duration,
                    rps: s.rps,
                })
                .collect()
        }),
        concurrency: def.concurrency,
        duration: def.duration,
        shared_prefix: def.shared_prefix.then_some(true),
        tenants: (!def.tenants.is_empty()).then(|| {
            phase
                .tenants
                .iter()
                .map(|t| {
                    let shape = TenantConfig {
                        repeat: t.repeat,
                        output: t.output,
                    };
                    (t.name.clone(), shape)
                })
                .collect()
        }),
        arrival: (def.arrival == ArrivalProcess::Poisson).then(|| "poisson".to_owned()),
        replicas: stack.map(|s| s.replicas),
        gateway_tenant_max_in_flight: caps
            .filter(|c: &std::collections::BTreeMap<_, _>| !c.is_empty()),
    }
}

/// Runs operations phases against one target.
#[derive(Debug)]
pub struct OperationsRunner {
    client: HttpClient,
    tenant_header: String,
    progress: Arc<PhaseProgress>,
}

impl OperationsRunner {
    pub fn new(client: HttpClient, tenant_header: String) -> Self {
        OperationsRunner {
            client,
            tenant_header,
            progress: Arc::default(),
        }
    }

    /// Live counts of the phase in progress.
    pub fn progress(&self) -> Arc<PhaseProgress> {
        Arc::clone(&self.progress)
    }

    /// Runs one phase against `target`. `run_origin` is when the run's first phase started
    /// (for `started_relative_seconds`); `stack` describes a local stack for the config, and
    /// `local` is that stack, on which the phase's cluster events (drain, scale-up) happen
    /// while the load runs. An event that cannot happen is the error.
    pub async fn run_phase(
        &self,
        phase: &OperationsPhase,
        target: &LiveTarget,
        run_origin: Instant,
        stack: Option<&StackShape>,
        local: Option<&LocalStack>,
    ) -> Result<OperationsPhaseResult, String> {
        // A short lead so the first send is not late by the time spent spawning.
        let origin = Instant::now() + Duration::from_millis(50);
        let clock = PhaseClock {
            origin,
            scale: target.time_scale,
        };
        let shared = Arc::new(phase.clone());
        let send = {
            let (client, header) = (self.client.clone(), self.tenant_header.clone());
            // The operations phases run against one gateway (the first).
            let gateway = target.gateways.first().map_or("", |g| g.url.as_str());
            let url = format!("{gateway}/v1/chat/completions");
            let (model, limit, slo) = (target.model.clone(), target.request_limit, target.slo);
            let progress = Arc::clone(&self.progress);
            let phase = Arc::clone(&shared);
            move |i: usize, at: f64| {
                let request = phase.request(i);
                let tenant = phase.tenant_of(&request).clone();
                let body = chat_body(&model, &phase.prompt(&request), tenant.output);
                let route = phase.route.map(|r| r.as_str());
                let (client, url, header) = (client.clone(), url.clone(), header.clone());
                let progress = Arc::clone(&progress);
                progress.sent.fetch_add(1, Ordering::Relaxed);
                async move {
                    let mut headers = vec![(header.as_str(), tenant.name.as_str())];
                    headers.extend(route.map(|r| ("routing-strategy", r)));
                    let record = RequestRecord::sent(i, request.tenant, at, at);
                    let record = stream_request_with_headers(
                        &client, &url, body, &headers, clock, record, limit,
                    )
                    .await;
                    progress.done.fetch_add(1, Ordering::Relaxed);
                    if is_good(&record, &slo) {
                        progress.good.fetch_add(1, Ordering::Relaxed);
                    }
                    record
                }
            }
        };
        let load = async {
            match &phase.load {
                Load::Open { inflight_cap, .. } => {
                    let arrivals = phase.arrivals();
                    self.progress.start(&phase.def.name, arrivals.len());
                    open_loop(&arrivals, *inflight_cap, clock, send).await
                }
                Load::Closed {
                    concurrency,
                    duration,
                } => {
                    self.progress.start(&phase.def.name, 0);
                    closed_loop(*concurrency, *duration, clock, send).await
                }
            }
        };
        let (drain, scale_up) = (phase.def.drain.as_ref(), phase.def.scale_up.as_ref());
        let events = async {
            match local {
                Some(stack) if drain.is_some() || scale_up.is_some() => {
                    let limit = target.request_limit;
                    let seen = run_events(drain, scale_up, stack, clock, &self.client, limit);
                    Some(seen.await)
                }
                _ => None,
            }
        };
        let (Driven { records, dropped }, seen) = tokio::join!(load, events);
        let seen = seen.transpose()?;
        let lag = records
            .iter()
            .map(|r| r.dispatched - r.scheduled)
            .fold(0.0, f64::max);
        tracing::info!(
            phase = %phase.def.name,
            max_dispatch_lag_engine_s = lag,
            "operations phase done"
        );
        let outcome = OperationsOutcome {
            config: operations_config(phase, stack),
            tenants: phase.tenants.iter().map(|t| t.name.clone()).collect(),
            records: records
                .into_iter()
                .map(|record| TenantRecord {
                    tenant: shared.request(record.index).tenant,
                    record,
                })
                .collect(),
            dropped,
            started_relative: origin.saturating_duration_since(run_origin).as_secs_f64()
                * target.time_scale,
        };
        let mut result = summarize_operations(&outcome, &target.slo);
        if let Some(seen) = seen {
            let records = || outcome.records.iter().map(|t| &t.record);
            result.drain = seen.drain.map(|observed| drain_record(observed, records()));
            if !seen.added.is_empty() {
                result.scale_up = Some(scale_up_record(&seen.added, records()));
            }
            result.replica_split = Some(replica_split(records(), phase.load.span(), SPLIT_BUCKETS));
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Operations;

    #[test]
    fn configs_echo_the_seed_keys_of_each_phase_kind() {
        let ops = Operations::builtin().unwrap();
        let seed: serde_json::Value =
            serde_json::from_str(include_str!("../../../testdata/operations-phases.json")).unwrap();
        for (phase, seed_phase) in ops.phases.iter().zip(seed["phases"].as_array().unwrap()) {
            let ours = serde_json::to_value(operations_config(phase, None)).unwrap();
            let mut keys: Vec<&String> = ours.as_object().unwrap().keys().collect();
            let mut seed_keys: Vec<&String> =
                seed_phase["config"].as_object().unwrap().keys().collect();
            keys.sort();
            seed_keys.sort();
            assert_eq!(keys, seed_keys, "{}", phase.def.name);
            let stages = |v: &serde_json::Value| -> Vec<(f64, f64)> {
                v["stages"].as_array().map_or(Vec::new(), |s| {
                    s.iter()
                        .map(|s| (s["duration"].as_f64().unwrap(), s["rps"].as_f64().unwrap()))
                        .collect()
                })
            };
            assert_eq!(
                stages(&ours),
                stages(&seed_phase["config"]),
                "{}",
                phase.def.name
            );
        }
    }
}
