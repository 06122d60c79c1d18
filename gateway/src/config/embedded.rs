//! `[embedded]`: simulated replicas started in-process, and the time scale they and the
//! router run at (`replica_time_scale`, which follows `embedded.time_scale` by default).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigFileError, GatewayConfig, invalid};

/// Simulated replicas started in-process.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// How many mock-engine replicas to start (`mock-0`, `mock-1`, …); 0 for none.
    pub mock_engines: usize,
    /// A builtin engine profile name or a profile `.toml` path.
    pub engine_profile: String,
    /// Engine time runs this many times faster than wall time.
    pub time_scale: f64,
    /// The model name the replicas serve.
    pub served_model: String,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        EmbeddedConfig {
            mock_engines: 0,
            engine_profile: "l20-qwen27b-fp8".to_owned(),
            time_scale: 1.0,
            served_model: "mock-model".to_owned(),
        }
    }
}

impl EmbeddedConfig {
    /// Checks the table; `linked` says whether this build has the mock engines (the
    /// `mock-engines` cargo feature).
    pub(super) fn validate(&self, linked: bool) -> Result<(), ConfigFileError> {
        if self.mock_engines > 0 && !linked {
            return Err(invalid(
                "embedded.mock_engines",
                self.mock_engines.to_string(),
                "this prefixgate was built without the `mock-engines` cargo feature; build it \
                 with that feature (on by default: cargo build -p gateway) to start simulated \
                 replicas, or give real ones",
            ));
        }
        positive_scale("embedded.time_scale", self.time_scale)
    }
}

impl GatewayConfig {
    /// The replicas' time per wall time, as the router's clock runs
    /// ([`replica_time_scale`](Self::replica_time_scale), else the embedded engines').
    pub fn router_time_scale(&self) -> f64 {
        if self.replica_time_scale == 1.0 && self.embedded.mock_engines > 0 {
            self.embedded.time_scale
        } else {
            self.replica_time_scale
        }
    }

    /// `replica_time_scale` is a scale (finite, > 0) and agrees with the embedded engines'.
    pub(super) fn check_replica_time_scale(&self) -> Result<(), ConfigFileError> {
        let scale = self.replica_time_scale;
        positive_scale("replica_time_scale", scale)?;
        if self.embedded.mock_engines > 0 && scale != 1.0 && scale != self.embedded.time_scale {
            return Err(invalid(
                "replica_time_scale",
                scale.to_string(),
                "differs from embedded.time_scale, the scale the embedded mock engines run at; \
                 set one of them (the router reads the embedded engines' time by default)",
            ));
        }
        Ok(())
    }
}

/// A time scale: engine time per wall time, finite and > 0.
fn positive_scale(key: &str, scale: f64) -> Result<(), ConfigFileError> {
    if scale.is_finite() && scale > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, scale.to_string(), "must be > 0"))
    }
}
