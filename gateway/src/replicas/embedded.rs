//! Embedded replicas: `--mock-engines N` starts N mock-engine replicas in-process on
//! loopback (`mock-0`, `mock-1`, …), for a first run on a machine with no GPU.
//!
//! (Waits for mock-engine's server; until it lands, asking for embedded replicas is an error.)

use std::sync::Arc;

use crate::config::EmbeddedConfig;
use crate::replicas::Replica;

/// Running embedded replicas; shut down with the gateway.
#[derive(Debug, Default)]
pub struct EmbeddedReplicas {}

impl EmbeddedReplicas {
    /// Stops every replica.
    pub async fn shutdown(self) {}
}

/// Starts the configured mock engines; the replicas to route to and their handles.
pub async fn spawn(
    config: &EmbeddedConfig,
) -> Result<(Vec<Arc<Replica>>, EmbeddedReplicas), String> {
    if config.mock_engines == 0 {
        return Ok((Vec::new(), EmbeddedReplicas::default()));
    }
    Err(
        "--mock-engines needs mock-engine's server, which is not available in this build"
            .to_owned(),
    )
}
