//! The `[cluster]` table: where the gateways of one fleet share their routing state.
//!
//! ```toml
//! [cluster]
//! url = "redis://redis.prefixgate:6379"   # PREFIXGATE_CLUSTER_URL, --cluster-url
//! name = "default"                        # PREFIXGATE_CLUSTER_NAME
//! # gateway_id = "gw-a"                   # PREFIXGATE_CLUSTER_GATEWAY_ID; default host-xxxxxx
//! ```
//!
//! Without a `url` nothing is shared and nothing changes: one gateway needs no server.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigFileError, invalid};

/// Cluster sharing settings.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The Redis server (`redis://[user:password@]host:port[/db]`); none: no sharing.
    pub url: Option<String>,
    /// The fleet: gateways share state with those of the same name only, so two fleets can
    /// use one server (the stream key is `prefixgate:{name}:routing`).
    pub name: String,
    /// This gateway's id among its peers; default the host name (a pod's name) and a random
    /// suffix, so a restarted gateway is a new peer.
    pub gateway_id: Option<String>,
    /// How often this gateway says it is alive (and lists its requests in flight).
    pub heartbeat_ms: u64,
    /// A peer not heard from for this long is forgotten with its requests in flight.
    pub peer_timeout_ms: u64,
    /// How much history the stream keeps, and how far back a starting gateway reads it.
    pub history_secs: u64,
    /// Messages waiting to be published at most; past it new ones are dropped and counted.
    pub queue_capacity: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            url: None,
            name: "default".to_owned(),
            gateway_id: None,
            heartbeat_ms: 1_000,
            peer_timeout_ms: 5_000,
            history_secs: 60,
            queue_capacity: 8_192,
        }
    }
}

impl ClusterConfig {
    /// Whether a server is configured.
    pub fn enabled(&self) -> bool {
        self.url.is_some()
    }

    /// Checks the table (only when a URL is set).
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        let Some(url) = &self.url else {
            return Ok(());
        };
        if url.starts_with("nats://") {
            return Err(invalid(
                "cluster.url",
                redacted(url),
                "prefixgate shares routing state through Redis (docs/CLUSTER.md says why); give redis://host:port",
            ));
        }
        if !url.starts_with("redis://") {
            return Err(invalid(
                "cluster.url",
                redacted(url),
                "expected redis://[user:password@]host:port[/db]",
            ));
        }
        if let Err(error) = redis::Client::open(url.as_str()) {
            return Err(invalid("cluster.url", redacted(url), &error.to_string()));
        }
        name_check("cluster.name", &self.name, 64)?;
        if let Some(id) = &self.gateway_id {
            name_check("cluster.gateway_id", id, 128)?;
        }
        for (key, value) in [
            ("cluster.heartbeat_ms", self.heartbeat_ms),
            ("cluster.history_secs", self.history_secs),
            ("cluster.queue_capacity", self.queue_capacity as u64),
        ] {
            if value == 0 {
                return Err(invalid(key, value.to_string(), "must be at least 1"));
            }
        }
        if self.peer_timeout_ms < 2 * self.heartbeat_ms {
            return Err(invalid(
                "cluster.peer_timeout_ms",
                self.peer_timeout_ms.to_string(),
                "must be at least twice cluster.heartbeat_ms, or a peer expires between two heartbeats",
            ));
        }
        Ok(())
    }

    /// The Redis stream the fleet shares.
    pub fn stream_key(&self) -> String {
        format!("prefixgate:{}:routing", self.name)
    }

    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }

    pub fn history(&self) -> Duration {
        Duration::from_secs(self.history_secs)
    }
}

/// Letters, digits, `.`, `_` and `-`, 1 to `max` of them: safe in a key and a label.
fn name_check(key: &str, value: &str, max: usize) -> Result<(), ConfigFileError> {
    let valid = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(invalid(
            key,
            value.to_owned(),
            &format!("expected 1-{max} letters, digits, '.', '_' or '-'"),
        ))
    }
}

/// The URL without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The default gateway id: the host name (in Kubernetes, the pod's name) and six random
/// hex digits.
pub fn default_gateway_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| {
            name.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                .take(100)
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "prefixgate".to_owned());
    format!("{host}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_url(url: &str) -> ClusterConfig {
        ClusterConfig {
            url: Some(url.to_owned()),
            ..ClusterConfig::default()
        }
    }

    #[test]
    fn no_url_is_off_and_valid() {
        let config = ClusterConfig::default();
        assert!(!config.enabled());
        config.validate().unwrap();
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases = [
            (with_url("nats://127.0.0.1:4222"), "cluster.url"),
            (with_url("http://127.0.0.1:6379"), "cluster.url"),
            (
                ClusterConfig {
                    name: "a b".to_owned(),
                    ..with_url("redis://127.0.0.1:6379")
                },
                "cluster.name",
            ),
            (
                ClusterConfig {
                    gateway_id: Some(String::new()),
                    ..with_url("redis://127.0.0.1:6379")
                },
                "cluster.gateway_id",
            ),
            (
                ClusterConfig {
                    peer_timeout_ms: 1_999,
                    heartbeat_ms: 1_000,
                    ..with_url("redis://127.0.0.1:6379")
                },
                "cluster.peer_timeout_ms",
            ),
            (
                ClusterConfig {
                    queue_capacity: 0,
                    ..with_url("redis://127.0.0.1:6379")
                },
                "cluster.queue_capacity",
            ),
        ];
        for (config, key) in cases {
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(key), "{error}");
        }
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redacted("redis://user:secret@redis:6379/0"),
            "redis://***@redis:6379/0"
        );
        assert_eq!(redacted("redis://redis:6379"), "redis://redis:6379");
    }

    #[test]
    fn the_default_id_is_the_host_and_a_suffix() {
        let (a, b) = (default_gateway_id(), default_gateway_id());
        assert_ne!(a, b);
        name_check("cluster.gateway_id", &a, 128).unwrap();
    }
}
