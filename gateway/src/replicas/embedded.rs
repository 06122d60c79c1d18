//! Embedded replicas: `--mock-engines N` starts N mock-engine replicas in-process on
//! loopback (`mock-0`, `mock-1`, …), for a first run on a machine with no GPU.
//!
//! Each is a real HTTP server (mock-engine's `spawn_replica` on `127.0.0.1:0`), so the
//! gateway talks to it exactly as to a vLLM pod: same proxy, health checks and metric
//! scrape. The replicas live as long as the gateway and stop after it has drained.

use std::net::SocketAddr;
use std::sync::Arc;

use mock_engine::kv_events::KvEventsConfig;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle, spawn_replica_with_events};

use crate::config::EmbeddedConfig;
use crate::replicas::kv_events::EventEndpoints;
use crate::replicas::{Origin, Replica};

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

/// The mock engines' events with KV-event sync on: PUB and replay bound on free loopback
/// ports, which each replica then reports for the gateway to dial.
const LOOPBACK_EVENTS: &str = r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","replay_endpoint":"tcp://127.0.0.1:0"}"#;

/// Starts the configured mock engines (publishing KV-cache events when `kv_events`); the
/// replicas to route to and their handles.
pub async fn spawn(
    config: &EmbeddedConfig,
    kv_events: bool,
) -> Result<(Vec<Arc<Replica>>, EmbeddedReplicas), String> {
    let mut running = EmbeddedReplicas::default();
    if config.mock_engines == 0 {
        return Ok((Vec::new(), running));
    }
    let profile = EngineProfile::load(&config.engine_profile)
        .map_err(|e| format!("engine_profile {:?}: {e}", config.engine_profile))?;
    let events = if kv_events {
        KvEventsConfig::parse(LOOPBACK_EVENTS).map_err(|e| format!("KV events: {e}"))?
    } else {
        KvEventsConfig::default()
    };
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
        match spawn_replica_with_events(replica_config, events.clone()).await {
            Ok(handle) => {
                let mut replica = Replica::new(
                    handle.name(),
                    handle.addr().to_string(),
                    vec![config.served_model.clone()],
                )
                .with_origin(Origin::Embedded);
                if let Some(endpoint) = handle.kv_events_endpoint() {
                    tracing::info!(
                        replica = %handle.name(),
                        url = %handle.url(),
                        events = %endpoint,
                        replay = ?handle.kv_events_replay_endpoint(),
                        "embedded replica publishes KV events"
                    );
                    replica = replica.with_kv_events(EventEndpoints {
                        events: endpoint.to_owned(),
                        replay: handle.kv_events_replay_endpoint().map(str::to_owned),
                    });
                }
                replicas.push(Arc::new(replica));
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
