//! Local mode (`loadgen matrix --local`): mock-engine replicas and a prefixgate gateway started
//! in this process on loopback (port 0), for the live runner to run against.
//!
//! Replicas are named like the simulator's (`L20-A`, `L20-B`, …) so local, simulated and seed
//! results line up. Engine time runs `time_scale` times faster than wall time; the live
//! runner reports engine time.

use std::net::SocketAddr;
use std::time::Duration;

use gateway::config::BackendConfig;
use gateway::{GatewayConfig, GatewayHandle};
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica};

use super::live::{LiveTarget, ReplicaEndpoint};
use crate::measure::Slo;

/// A running local stack.
#[derive(Debug)]
pub struct LocalStack {
    replicas: Vec<ReplicaHandle>,
    gateway: GatewayHandle,
    target: LiveTarget,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub names: Vec<String>,
    pub profile: EngineProfile,
    pub time_scale: f64,
    pub model: String,
}

impl LocalStack {
    /// Starts the replicas, then a gateway in front of them.
    pub async fn start(options: LocalOptions) -> Result<LocalStack, String> {
        if !(options.time_scale.is_finite() && options.time_scale > 0.0) {
            return Err(format!(
                "--time-scale must be > 0, got {}",
                options.time_scale
            ));
        }
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut replicas = Vec::new();
        for name in &options.names {
            let config = ReplicaConfig {
                name: name.clone(),
                listen: loopback,
                model: options.model.clone(),
                profile: options.profile.clone(),
                time_scale: options.time_scale,
                failures: FailurePlan::default(),
            };
            match spawn_replica(config).await {
                Ok(handle) => replicas.push(handle),
                Err(e) => {
                    for r in replicas {
                        r.shutdown().await;
                    }
                    return Err(format!("starting replica {name}: {e}"));
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
                })
                .collect(),
            ..GatewayConfig::default()
        };
        let gateway = match gateway::start(config).await {
            Ok(g) => g,
            Err(e) => {
                for r in replicas {
                    r.shutdown().await;
                }
                return Err(format!("starting the gateway: {e}"));
            }
        };
        let target = LiveTarget {
            gateway: gateway.url(),
            gateway_metrics: Some(format!("http://{}/metrics", gateway.metrics_addr())),
            replicas: replicas
                .iter()
                .map(|r| ReplicaEndpoint {
                    name: r.name().to_owned(),
                    base: r.url(),
                })
                .collect(),
            model: options.model,
            time_scale: options.time_scale,
            // A cold request can take minutes of engine time under queueing.
            request_limit: Duration::from_secs_f64((600.0 / options.time_scale).max(10.0)),
            slo: Slo::default(),
        };
        Ok(LocalStack {
            replicas,
            gateway,
            target,
        })
    }

    /// The live target that points at this stack.
    pub fn target(&self) -> &LiveTarget {
        &self.target
    }

    /// Stops the gateway, then the replicas.
    pub async fn shutdown(self) {
        self.gateway.shutdown().await;
        for r in self.replicas {
            r.shutdown().await;
        }
    }
}
