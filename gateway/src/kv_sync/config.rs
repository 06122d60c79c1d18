//! The `[kv_sync]` table (AIBrix's `AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED` sets its
//! `enabled`), and where a replica's event sockets are.
//!
//! vLLM publishes on `tcp://*:5557` and serves replay on `tcp://*:5558` when started with
//! `--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
//! "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'`; the gateway dials those
//! ports on each replica's host (AIBrix's layout). Embedded mock engines carry their own
//! endpoints instead ([`EventEndpoints`] on the replica).
//!
//! A vLLM server with `--data-parallel-size N` runs N engine cores, and rank `r` publishes
//! on the configured port + `r` and serves replay on the replay port + `r` (vLLM's
//! `ZmqEventPublisher` offsets both endpoints by the rank). `data_parallel_size` tells the
//! gateway to follow all N streams; the two port ranges must not overlap (vLLM's defaults,
//! 5557 and 5558, do as soon as N > 1), which [`KvSyncConfig::validate`] refuses.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigFileError, invalid};
use crate::replicas::kv_events::EventEndpoints;

/// The most data-parallel ranks followed per replica (router-core's rank bitmask width).
pub const MAX_DATA_PARALLEL_SIZE: u32 = router_core::kv_sync::MAX_DP_RANKS;

/// KV-event sync settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
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
    /// Longest reconnect delay.
    pub max_backoff_ms: u64,
    /// With no event for this long the subscription is renewed (reconnect, then replay from
    /// the next sequence number): a ZeroMQ SUB does not notice a publisher that restarted.
    pub idle_resubscribe_ms: u64,
    /// vLLM's `--data-parallel-size` on every replica: rank `r` publishes on `port + r` and
    /// replays on `replay_port + r`, and each rank is subscribed on its own (1..=64).
    pub data_parallel_size: u32,
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
            data_parallel_size: 1,
        }
    }
}

impl KvSyncConfig {
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
        self.validate_ranks()?;
        if block_size % 4 != 0 {
            return Err(invalid(
                "routing.block_size",
                block_size.to_string(),
                "with kv_sync on, blocks hash 4-byte token ids: use a multiple of 4 × the engine's block size (128 for vLLM's 16-token blocks with 2 per router block)",
            ));
        }
        Ok(())
    }

    /// `data_parallel_size` in range, and every rank's events and replay ports real and
    /// apart.
    fn validate_ranks(&self) -> Result<(), ConfigFileError> {
        let ranks = self.data_parallel_size;
        if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&ranks) {
            return Err(invalid(
                "kv_sync.data_parallel_size",
                ranks.to_string(),
                "must be 1-64 (vLLM's --data-parallel-size of every replica)",
            ));
        }
        let last = |base: u16| u32::from(base) + ranks - 1;
        for (key, base) in [
            ("kv_sync.port", self.port),
            ("kv_sync.replay_port", self.replay_port),
        ] {
            if base != 0 && last(base) > u32::from(u16::MAX) {
                return Err(invalid(
                    key,
                    base.to_string(),
                    &format!(
                        "with kv_sync.data_parallel_size = {ranks} its ranks would use ports {base}-{}, past 65535",
                        last(base)
                    ),
                ));
            }
        }
        if self.replay_port == 0 {
            return Ok(());
        }
        let (events, replay) = (u32::from(self.port), u32::from(self.replay_port));
        let from = events.max(replay);
        let to = last(self.port).min(last(self.replay_port));
        if from <= to {
            let collide = if from == to {
                format!("port {from} is")
            } else {
                format!("ports {from}-{to} are")
            };
            // The replay range fits below the events range only if it ends before it.
            let below = i64::from(events) - i64::from(ranks);
            let or_below = if below >= 1 {
                format!(" (or at most {below})")
            } else {
                String::new()
            };
            return Err(invalid(
                "kv_sync.replay_port",
                self.replay_port.to_string(),
                &format!(
                    "with kv_sync.data_parallel_size = {ranks}, events use ports {events}-{} and replay ports {replay}-{}: {collide} both. Set kv_sync.replay_port to at least {}{or_below} and start vLLM with the same replay_endpoint port",
                    last(self.port),
                    last(self.replay_port),
                    last(self.port) + 1,
                ),
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
    fn data_parallel_ranks_out_of_range_are_refused() {
        let on = |ranks| KvSyncConfig {
            enabled: true,
            replay_port: 0,
            data_parallel_size: ranks,
            ..KvSyncConfig::default()
        };
        for ranks in [0, 65] {
            let error = on(ranks).validate(128).unwrap_err().to_string();
            assert!(
                error.contains("kv_sync.data_parallel_size") && error.contains("1-64"),
                "{error}"
            );
        }
        on(1).validate(128).unwrap();
        on(64).validate(128).unwrap();
        let error = KvSyncConfig {
            port: 65_535,
            ..on(2)
        }
        .validate(128)
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("kv_sync.port") && error.contains("65535-65536"),
            "{error}"
        );
    }

    #[test]
    fn overlapping_events_and_replay_ranges_are_refused_naming_the_ports() {
        let ranks = |data_parallel_size, port, replay_port| KvSyncConfig {
            enabled: true,
            port,
            replay_port,
            data_parallel_size,
            ..KvSyncConfig::default()
        };
        // vLLM's defaults collide as soon as there are two ranks: rank 1 publishes on 5558.
        let error = ranks(2, 5557, 5558).validate(128).unwrap_err().to_string();
        assert!(
            error.contains("kv_sync.replay_port")
                && error.contains("events use ports 5557-5558")
                && error.contains("replay ports 5558-5559")
                && error.contains("port 5558 is both")
                && error.contains("at least 5559"),
            "{error}"
        );
        let error = ranks(8, 5557, 5550).validate(128).unwrap_err().to_string();
        assert!(
            error.contains("port 5557 is both") && error.contains("at most 5549"),
            "{error}"
        );
        let error = ranks(4, 5557, 5556).validate(128).unwrap_err().to_string();
        assert!(error.contains("ports 5557-5559 are both"), "{error}");
        ranks(2, 5557, 5559).validate(128).unwrap();
        ranks(7, 5557, 5550).validate(128).unwrap();
        ranks(4, 5557, 0).validate(128).unwrap();
        // One rank is today's layout: the defaults stand.
        ranks(1, 5557, 5558).validate(128).unwrap();
    }

    #[test]
    fn a_ranks_endpoints_are_rank_zeros_ports_plus_the_rank() {
        let zero = KvSyncConfig::default().endpoints_for("10.0.0.7:8000");
        assert_eq!(zero.for_rank(0), Some(zero.clone()));
        assert_eq!(
            zero.for_rank(3),
            Some(EventEndpoints {
                events: "tcp://10.0.0.7:5560".to_owned(),
                replay: Some("tcp://10.0.0.7:5561".to_owned()),
            })
        );
        let no_replay = EventEndpoints {
            events: "tcp://[::1]:65534".to_owned(),
            replay: None,
        };
        assert_eq!(
            no_replay.for_rank(1).map(|e| e.events),
            Some("tcp://[::1]:65535".to_owned())
        );
        assert_eq!(no_replay.for_rank(2), None, "past 65535");
        let portless = EventEndpoints {
            events: "ipc:///tmp/kv".to_owned(),
            replay: None,
        };
        assert_eq!(portless.for_rank(1), None);
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
