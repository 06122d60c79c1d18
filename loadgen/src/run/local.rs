//! Local mode (`loadgen matrix --local`): mock-engine replicas and a prefixgate gateway started
//! in this process on loopback (port 0), for the live runner to run against.
//!
//! Replicas are named like the simulator's (`L20-A`, `L20-B`, …) so local, simulated and seed
//! results line up. Engine time runs `time_scale` times faster than wall time; the live
//! runner reports engine time.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use gateway::config::BackendConfig;
use gateway::config::{AdmissionConfig, TenantConfig};
use gateway::{GatewayConfig, GatewayHandle};
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica};
use router_core::RouterConfig;

use super::assignment::GatewayAssignment;
use super::live::{GatewayEndpoint, LiveTarget, ReplicaEndpoint};
use crate::measure::Slo;
use crate::workload::AdmissionSpec;

/// A running local stack.
#[derive(Debug)]
pub struct LocalStack {
    /// Behind a lock so a phase's cluster events can take one out (a drain) or add one (a
    /// scale-up) while the stack is shared; never held across an await.
    replicas: Mutex<Vec<ReplicaHandle>>,
    /// At least one (`LocalOptions::gateways`).
    gateways: Vec<GatewayHandle>,
    target: LiveTarget,
    /// What a replica added later runs.
    options: LocalOptions,
    /// Every replica name this stack has run, in start order (drained ones included), so an
    /// added replica never reuses one.
    ever: Mutex<Vec<String>>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub names: Vec<String>,
    /// Replica `i` runs `profiles[i % profiles.len()]`: one profile for all, or unequal
    /// replicas, as in the simulator (`SimOptions::replica_profiles`). Must not be empty.
    pub profiles: Vec<EngineProfile>,
    pub time_scale: f64,
    pub model: String,
    /// The gateway's admission settings (tenant caps for the operations phases).
    pub admission: AdmissionSpec,
    /// The gateway's routing settings (`loadgen` reads them from the environment variables
    /// prefixgate reads).
    pub routing: RouterConfig,
    /// Gateway instances in front of the replicas (each its own index and load view), and
    /// how the load generator spreads requests over them, as a Service would.
    pub gateways: usize,
    pub assignment: GatewayAssignment,
}

impl LocalStack {
    /// Starts the replicas, then the gateways in front of them.
    pub async fn start(options: LocalOptions) -> Result<LocalStack, String> {
        if !(1..=16).contains(&options.gateways) {
            return Err(format!(
                "--gateways must be 1..=16 locally, got {}",
                options.gateways
            ));
        }
        if !(options.time_scale.is_finite() && options.time_scale > 0.0) {
            return Err(format!(
                "--time-scale must be > 0, got {}",
                options.time_scale
            ));
        }
        if options.profiles.is_empty() {
            return Err("no engine profile given for the local replicas".to_owned());
        }
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut replicas = Vec::new();
        for (i, name) in options.names.iter().enumerate() {
            match spawn_one(&options, name, i).await {
                Ok(handle) => replicas.push(handle),
                Err(e) => {
                    for r in replicas {
                        r.shutdown().await;
                    }
                    return Err(e);
                }
            }
        }
        let config = GatewayConfig {
            listen: loopback,
            metrics_listen: loopback,
            backends: replicas
                .iter()
                .map(|r| BackendConfig {
                    name: r.name().to_owned(),
                    url: r.url(),
                    model: Some(options.model.clone()),
                    kv_events: None,
                    kv_replay: None,
                })
                .collect(),
            admission: gateway_admission(&options.admission),
            routing: options.routing.clone(),
            // The router reads engine time, as the simulator's router does.
            replica_time_scale: options.time_scale,
            ..GatewayConfig::default()
        };
        let mut gateways = Vec::with_capacity(options.gateways);
        for g in 0..options.gateways {
            match gateway::start(config.clone()).await {
                Ok(handle) => gateways.push(handle),
                Err(e) => {
                    for handle in gateways {
                        handle.shutdown().await;
                    }
                    for r in replicas {
                        r.shutdown().await;
                    }
                    return Err(format!("starting gateway {g}: {e}"));
                }
            }
        }
        let target = LiveTarget {
            gateways: gateways
                .iter()
                .map(|g| GatewayEndpoint {
                    url: g.url(),
                    metrics: Some(format!("http://{}/metrics", g.metrics_addr())),
                })
                .collect(),
            assignment: options.assignment,
            replicas: replicas
                .iter()
                .map(|r| ReplicaEndpoint {
                    name: r.name().to_owned(),
                    base: r.url(),
                })
                .collect(),
            model: options.model.clone(),
            time_scale: options.time_scale,
            // A cold request can take minutes of engine time under queueing.
            request_limit: Duration::from_secs_f64((600.0 / options.time_scale).max(10.0)),
            slo: Slo::default(),
        };
        Ok(LocalStack {
            replicas: Mutex::new(replicas),
            gateways,
            target,
            ever: Mutex::new(options.names.clone()),
            options,
        })
    }

    /// The live target that points at this stack.
    pub fn target(&self) -> &LiveTarget {
        &self.target
    }

    /// `http://IP:PORT` of the first gateway's metrics listener, where its admin API is
    /// (cluster events drive one gateway; the operations phases run with one).
    pub fn admin_base(&self) -> String {
        self.gateways
            .first()
            .map_or_else(String::new, |g| format!("http://{}", g.metrics_addr()))
    }

    /// The names of the replicas running now, in start order.
    pub fn replica_names(&self) -> Vec<String> {
        self.running().iter().map(|r| r.name().to_owned()).collect()
    }

    /// Requests the gateways count as in flight, over all their replicas (0 once every
    /// response has ended).
    pub fn gateway_outstanding(&self) -> u64 {
        self.gateways
            .iter()
            .map(GatewayHandle::total_outstanding)
            .sum()
    }

    /// Every replica name this stack has run, in start order.
    pub fn names_ever(&self) -> Vec<String> {
        self.ever
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Takes the replica named `name` out of the stack (to drain it); `None` if absent.
    pub fn take_replica(&self, name: &str) -> Option<ReplicaHandle> {
        let mut running = self.running();
        let at = running.iter().position(|r| r.name() == name)?;
        Some(running.remove(at))
    }

    /// Starts one more replica named `name` (the next profile in turn); its URL. The
    /// gateway does not know it yet: that is the caller's (the admin API's) business.
    pub async fn start_replica(&self, name: &str) -> Result<String, String> {
        let index = {
            let mut ever = self
                .ever
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            ever.push(name.to_owned());
            ever.len() - 1
        };
        let handle = spawn_one(&self.options, name, index).await?;
        let url = handle.url();
        self.running().push(handle);
        Ok(url)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<ReplicaHandle>> {
        self.replicas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the gateways, then the replicas.
    pub async fn shutdown(self) {
        for gateway in self.gateways {
            gateway.shutdown().await;
        }
        let replicas = self
            .replicas
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in replicas {
            r.shutdown().await;
        }
    }
}

/// Starts replica `name` on loopback port 0 with profile `index` (modulo the list).
async fn spawn_one(
    options: &LocalOptions,
    name: &str,
    index: usize,
) -> Result<ReplicaHandle, String> {
    let config = ReplicaConfig {
        name: name.to_owned(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        model: options.model.clone(),
        profile: options.profiles[index % options.profiles.len()].clone(),
        time_scale: options.time_scale,
        failures: FailurePlan::default(),
    };
    spawn_replica(config)
        .await
        .map_err(|e| format!("starting replica {name}: {e}"))
}

/// The gateway's `[admission]` table for a phase's settings: each key the phase sets,
/// the gateway's default for the others.
fn gateway_admission(spec: &AdmissionSpec) -> AdmissionConfig {
    let mut config = AdmissionConfig::default();
    let set = |field: &mut usize, value: Option<usize>| *field = value.unwrap_or(*field);
    set(&mut config.max_in_flight, spec.max_in_flight);
    set(&mut config.tenant_max_in_flight, spec.tenant_max_in_flight);
    let set = |field: &mut u64, value: Option<u64>| *field = value.unwrap_or(*field);
    set(&mut config.retry_after_secs, spec.retry_after_secs);
    set(
        &mut config.tenant_tokens_per_second,
        spec.tenant_tokens_per_second,
    );
    set(&mut config.tenant_token_burst, spec.tenant_token_burst);
    set(&mut config.default_max_tokens, spec.default_max_tokens);
    if let Some(header) = &spec.tenant_header {
        header.clone_into(&mut config.tenant_header);
    }
    config.tenants = spec
        .tenants
        .iter()
        .map(|(name, limit)| {
            let tenant = TenantConfig {
                max_in_flight: limit.max_in_flight,
                tokens_per_second: limit.tokens_per_second,
                token_burst: limit.token_burst,
            };
            (name.clone(), tenant)
        })
        .collect();
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::live::LiveRunner;
    use crate::run::live::request::http_client;
    use crate::workload::Matrix;

    fn fast() -> EngineProfile {
        EngineProfile::builtin("fast").expect("builtin fast profile")
    }

    /// `names` on `profiles` at `time_scale`, default admission and routing.
    fn options(names: &[&str], profiles: Vec<EngineProfile>, time_scale: f64) -> LocalOptions {
        LocalOptions {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            profiles,
            time_scale,
            model: "m".into(),
            admission: AdmissionSpec::default(),
            routing: RouterConfig::default(),
            gateways: 1,
            assignment: GatewayAssignment::RoundRobin,
        }
    }

    /// A real stack on loopback: mock replicas with the never-busy `fast` profile, time
    /// scale 100 so a phase's arrivals take a fraction of a second. Only invariants are
    /// checked, never timings.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn live_phases_against_a_local_stack_measure_every_request() {
        let stack = LocalStack::start(options(&["L20-A", "L20-B"], vec![fast()], 100.0))
            .await
            .unwrap();
        let runner = LiveRunner::new(http_client(), stack.target().clone());
        let phases = Matrix::builtin().unwrap().with_count(8).unwrap().phases();

        let warm = runner.run_phase(&phases[5]).await.unwrap(); // r1-warm-uniform-prefix-cache
        let hot = runner.run_phase(&phases[7]).await.unwrap(); // r1-hot50-least-request
        stack.shutdown().await;

        for p in [&warm, &hot] {
            let name = &p.phase;
            assert_eq!((p.requests, p.success, p.errors), (8, 8, 0), "{name}");
            assert_eq!(p.gateway_verified_requests, 8, "{name}");
            assert_eq!(p.replicas.values().map(|r| r.requests).sum::<usize>(), 8);
            for (replica, r) in &p.replicas {
                // Priming is excluded from the engine deltas.
                assert_eq!(r.engine_completed, r.requests as f64, "{name} {replica}");
            }
            assert!((5037..=5100).contains(&p.input_tokens_range[0]), "{name}");
            assert!(p.ttft.p50.is_some() && p.tpot.p50.is_some(), "{name}");
        }
        assert_eq!(warm.initial_prefix_owners.len(), 8);
        assert!(warm.cache_hit_ratio > 0.9, "{}", warm.cache_hit_ratio);
        let deltas = warm
            .routing_counter_deltas
            .as_ref()
            .expect("gateway scraped");
        let selections: f64 = deltas
            .iter()
            .filter(|d| d.name == crate::measure::counters::SELECTION)
            .map(|d| d.delta)
            .sum();
        assert_eq!(selections, 8.0);
        assert_eq!(hot.routing_counter_deltas, Some(Vec::new()));
        assert_eq!(hot.config.hot_initial_replica.as_deref(), Some("L20-B"));
        assert_eq!(hot.initial_prefix_owners["0"], vec!["L20-B".to_owned()]);
    }

    /// Unequal replicas: replica `i` runs profile `i` modulo the list, seen in the context
    /// length each replica's `/v1/models` reports.
    #[tokio::test]
    async fn replicas_run_the_profiles_in_turn() {
        let fast = fast();
        let mut short = fast.clone();
        short.max_model_len = fast.max_model_len / 2;
        let profiles = vec![fast.clone(), short.clone()];
        let stack = LocalStack::start(options(&["a", "b", "c"], profiles, 100.0))
            .await
            .unwrap();
        let client = http_client();
        let mut lengths = Vec::new();
        for replica in &stack.target().replicas {
            let url = format!("{}/v1/models", replica.base);
            let body = crate::run::live::request::get_text(&client, &url, Duration::from_secs(5))
                .await
                .unwrap();
            let models: serde_json::Value = serde_json::from_str(&body).unwrap();
            lengths.push(models["data"][0]["max_model_len"].as_u64().unwrap());
        }
        stack.shutdown().await;
        let (long, half) = (fast.max_model_len as u64, short.max_model_len as u64);
        assert_eq!(lengths, vec![long, half, long]);
    }

    #[tokio::test]
    async fn no_profile_is_refused_before_anything_starts() {
        let err = LocalStack::start(options(&["a"], Vec::new(), 1.0))
            .await
            .unwrap_err();
        assert!(err.contains("no engine profile"), "{err}");
    }

    #[tokio::test]
    async fn a_bad_time_scale_is_refused_before_anything_starts() {
        let err = LocalStack::start(options(&["a"], vec![fast()], 0.0))
            .await
            .unwrap_err();
        assert!(err.contains("--time-scale"), "{err}");
    }
}
