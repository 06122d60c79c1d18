//! The `[kv_sync]` table, AIBrix's `AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED`, and where a
//! replica's event sockets are.
//!
//! vLLM publishes on `tcp://*:5557` and serves replay on `tcp://*:5558` when started with
//! `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
//! "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'`; the gateway dials those
//! ports on each replica's host (AIBrix's layout). Embedded mock engines carry their own
//! endpoints instead ([`EventEndpoints`] on the replica).

use std::time::Duration;

use serde::Deserialize;

use crate::config::{ConfigFileError, invalid};

/// AIBrix's switch for KV-event sync.
pub const ENV_ENABLED: &str = "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED";

/// KV-event sync settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvSyncConfig {
    /// Subscribe to every replica's KV-cache events and tokenize prompts with the engine.
    pub enabled: bool,
    /// The engines' PUB port (vLLM `endpoint`).
    pub port: u16,
    /// The engines' replay ROUTER port (vLLM `replay_endpoint`); 0 when they serve none.
    pub replay_port: u16,
    /// How long a request waits for the engine's `/tokenize` before routing on its text.
    pub tokenize_timeout_ms: u64,
    /// How long a connect, or the wait for one replay message, may take.
    pub socket_timeout_ms: u64,
    /// First reconnect delay; doubles per failure up to `max_backoff_ms` (AIBrix: 1 s, 30 s).
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// With no event for this long the subscription is renewed (reconnect, then replay from
    /// the next sequence number): a ZeroMQ SUB does not notice a publisher that restarted.
    pub idle_resubscribe_ms: u64,
}

impl Default for KvSyncConfig {
    fn default() -> Self {
        KvSyncConfig {
            enabled: false,
            port: 5557,
            replay_port: 5558,
            tokenize_timeout_ms: 1_000,
            socket_timeout_ms: 5_000,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 30_000,
            idle_resubscribe_ms: 10_000,
        }
    }
}

/// Where one replica publishes its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventEndpoints {
    /// `tcp://HOST:PORT` of the PUB socket.
    pub events: String,
    /// `tcp://HOST:PORT` of the replay ROUTER socket, if any.
    pub replay: Option<String>,
}

impl KvSyncConfig {
    /// Applies `AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED` when set: `true`/`false` (any
    /// case) or `1`/`0`; anything else is an error naming the variable.
    pub fn apply_env(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigFileError> {
        if let Some(value) = lookup(ENV_ENABLED) {
            self.enabled = match value.trim().to_ascii_lowercase().as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(invalid(ENV_ENABLED, value, "expected true or false")),
            };
        }
        Ok(())
    }

    /// Checks the table; `block_size` is the router's, which must hold whole token ids.
    pub fn validate(&self, block_size: usize) -> Result<(), ConfigFileError> {
        if !self.enabled {
            return Ok(());
        }
        if self.port == 0 {
            return Err(invalid(
                "kv_sync.port",
                "0".to_owned(),
                "must be a port (1-65535)",
            ));
        }
        for (key, value) in [
            ("kv_sync.tokenize_timeout_ms", self.tokenize_timeout_ms),
            ("kv_sync.socket_timeout_ms", self.socket_timeout_ms),
            ("kv_sync.initial_backoff_ms", self.initial_backoff_ms),
            ("kv_sync.idle_resubscribe_ms", self.idle_resubscribe_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, value.to_string(), "must be at least 1"));
            }
        }
        if self.max_backoff_ms < self.initial_backoff_ms {
            return Err(invalid(
                "kv_sync.max_backoff_ms",
                self.max_backoff_ms.to_string(),
                "must be at least kv_sync.initial_backoff_ms",
            ));
        }
        if block_size % 4 != 0 {
            return Err(invalid(
                "routing.block_size",
                block_size.to_string(),
                "with kv_sync on, blocks hash 4-byte token ids: use a multiple of 4 × the engine's block size (128 for vLLM's 16-token blocks with 2 per router block)",
            ));
        }
        Ok(())
    }

    /// The endpoints of a replica at `authority` (`host:port`) under this table's ports.
    pub fn endpoints_for(&self, authority: &str) -> EventEndpoints {
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        };
        EventEndpoints {
            events: format!("tcp://{host}:{}", self.port),
            replay: (self.replay_port != 0).then(|| format!("tcp://{host}:{}", self.replay_port)),
        }
    }

    pub fn tokenize_timeout(&self) -> Duration {
        Duration::from_millis(self.tokenize_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_switches_it_on_and_bad_values_name_the_variable() {
        let mut config = KvSyncConfig::default();
        config
            .apply_env(|k| (k == ENV_ENABLED).then(|| "TRUE".to_owned()))
            .unwrap();
        assert!(config.enabled);
        config
            .apply_env(|k| (k == ENV_ENABLED).then(|| "0".to_owned()))
            .unwrap();
        assert!(!config.enabled);
        let error = config
            .apply_env(|k| (k == ENV_ENABLED).then(|| "yes please".to_owned()))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(ENV_ENABLED) && error.contains("yes please"),
            "{error}"
        );
    }

    #[test]
    fn validation_names_the_key() {
        let on = KvSyncConfig {
            enabled: true,
            ..KvSyncConfig::default()
        };
        on.validate(128).unwrap();
        let error = on.validate(130).unwrap_err().to_string();
        assert!(error.contains("routing.block_size"), "{error}");
        let error = KvSyncConfig {
            port: 0,
            ..on.clone()
        }
        .validate(128)
        .unwrap_err()
        .to_string();
        assert!(error.contains("kv_sync.port"), "{error}");
        let error = KvSyncConfig {
            max_backoff_ms: 10,
            ..on.clone()
        }
        .validate(128)
        .unwrap_err()
        .to_string();
        assert!(error.contains("kv_sync.max_backoff_ms"), "{error}");
        // Off, nothing is checked: the table's values do not matter.
        KvSyncConfig {
            port: 0,
            ..KvSyncConfig::default()
        }
        .validate(3)
        .unwrap();
    }

    #[test]
    fn endpoints_use_the_replica_host() {
        let config = KvSyncConfig::default();
        assert_eq!(
            config.endpoints_for("10.0.0.7:8000"),
            EventEndpoints {
                events: "tcp://10.0.0.7:5557".to_owned(),
                replay: Some("tcp://10.0.0.7:5558".to_owned()),
            }
        );
        let no_replay = KvSyncConfig {
            replay_port: 0,
            ..config
        };
        assert_eq!(
            no_replay.endpoints_for("[::1]:80").events,
            "tcp://[::1]:5557"
        );
        assert_eq!(no_replay.endpoints_for("[::1]:80").replay, None);
    }
}
