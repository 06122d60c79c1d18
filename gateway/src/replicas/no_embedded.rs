//! A build without the `mock-engines` feature has no embedded replicas; configuration
//! refuses `embedded.mock_engines` above 0 before start-up gets here.

use std::sync::Arc;

use crate::config::EmbeddedConfig;
use crate::replicas::Replica;

/// No replicas to stop.
#[derive(Debug, Default)]
pub struct EmbeddedReplicas;

impl EmbeddedReplicas {
    pub async fn shutdown(self) {}
}

/// No replicas; an error if some were asked for.
pub async fn spawn(
    config: &EmbeddedConfig,
    _kv_events: bool,
) -> Result<(Vec<Arc<Replica>>, EmbeddedReplicas), String> {
    if config.mock_engines > 0 {
        return Err("built without the `mock-engines` cargo feature".to_owned());
    }
    Ok((Vec::new(), EmbeddedReplicas))
}
