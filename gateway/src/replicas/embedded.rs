//! Embedded replicas: `--mock-engines N` starts N mock-engine replicas in-process on
//! loopback (`mock-0`, `mock-1`, …), for a first run on a machine with no GPU.
//!
//! Each is a real HTTP server (mock-engine's `spawn_replica` on `127.0.0.1:0`), so the
//! gateway talks to it exactly as to a vLLM pod: same proxy, health checks and metric
//! scrape. The replicas live as long as the gateway and stop after it has drained.

use std::net::SocketAddr;
use std::sync::Arc;

use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica};

use crate::config::EmbeddedConfig;
use crate::replicas::Replica;

/// Running embedded replicas; shut down with the gateway.
#[derive(Debug, Default)]
pub struct EmbeddedReplicas {
    handles: Vec<ReplicaHandle>,
}

impl EmbeddedReplicas {
    /// Stops every replica.
    pub async fn shutdown(self) {
        for handle in self.handles {
            handle.shutdown().await;
        }
    }
}

/// Starts the configured mock engines; the replicas to route to and their handles.
pub async fn spawn(
    config: &EmbeddedConfig,
) -> Result<(Vec<Arc<Replica>>, EmbeddedReplicas), String> {
    let mut running = EmbeddedReplicas::default();
    if config.mock_engines == 0 {
        return Ok((Vec::new(), running));
    }
    let profile = EngineProfile::load(&config.engine_profile)
        .map_err(|e| format!("engine_profile {:?}: {e}", config.engine_profile))?;
    let mut replicas = Vec::with_capacity(config.mock_engines);
    for i in 0..config.mock_engines {
        let replica_config = ReplicaConfig {
            name: format!("mock-{i}"),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            model: config.served_model.clone(),
            profile: profile.clone(),
            time_scale: config.time_scale,
            failures: FailurePlan::default(),
        };
        match spawn_replica(replica_config).await {
            Ok(handle) => {
                replicas.push(Arc::new(Replica::new(
                    handle.name(),
                    handle.addr().to_string(),
                    vec![config.served_model.clone()],
                )));
                running.handles.push(handle);
            }
            Err(error) => {
                // Do not leave the replicas already started running behind the error.
                running.shutdown().await;
                return Err(error.to_string());
            }
        }
    }
    Ok((replicas, running))
}
