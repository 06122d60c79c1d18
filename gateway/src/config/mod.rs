//! The gateway's settings: one schema, the TOML file's, with its defaults and validation.
//!
//! One [`GatewayConfig`] describes a whole gateway; each part owns the struct of its table
//! (admission, discovery, KV sync, TLS, the router's `[routing]`), and every table is
//! `deny_unknown_fields`, so a typo is an error naming the key. These structs are the only
//! definition of a setting: [`settings`] lists every setting from their schema (type,
//! default, doc comment) for `--help` and docs/GATEWAY.md, and [`layers`] applies the file,
//! the environment, the everyday flags and `--set` over them generically ([`cli`] is the
//! command line). Adding a setting is one field and its doc comment. Durations are integers
//! with their unit in the key name, so a file never needs a duration syntax.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use router_core::{RouterConfig, Strategy};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod cli;
mod embedded;
pub mod error;
pub mod layers;
pub mod settings;

pub use embedded::EmbeddedConfig;
pub use error::ConfigFileError;
pub(crate) use error::invalid;

use crate::admit::Admission;
pub use crate::admit::{AdmissionConfig, TenantConfig};
pub use crate::cluster::ClusterConfig;
pub use crate::edge::tls::TlsConfig;
pub use crate::ext_proc::{Dialect, ExtProcConfig};
pub use crate::kv_sync::config::KvSyncConfig;
pub use crate::replicas::admin::AdminConfig;
pub use crate::replicas::discovery::{DiscoveryConfig, DiscoveryKind};
pub use crate::replicas::static_::BackendConfig;
pub use crate::request::resume::config::ResumeConfig;
pub use crate::telemetry::TracingConfig;

/// Everything a gateway needs to start.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Address of the OpenAI API listener.
    pub listen: SocketAddr,
    /// Address of the `/metrics` listener (kept apart from client traffic; never TLS).
    pub metrics_listen: SocketAddr,
    /// TLS on the OpenAI API listener (both files, or neither for plain HTTP).
    pub tls: TlsConfig,
    /// Strategy for requests without a `routing-strategy` header.
    pub default_strategy: String,
    /// Request bodies longer than this are refused with 413.
    pub max_body_bytes: usize,
    /// On SIGTERM/SIGINT, in-flight responses get this long to finish.
    pub shutdown_grace_secs: u64,
    /// Log filter: a level (`info`, `debug`, …) or `tracing` directives
    /// (`gateway=debug,info`); unset: `RUST_LOG`, else `info` (less kube's per-request
    /// ERROR lines, which Kubernetes discovery's own warnings cover). Log lines carry the
    /// request's span (`inference{request_id=…}`) only when the gateway's debug events are
    /// logged: at `info` the request spans are for traces alone.
    pub log_level: Option<String>,
    pub upstream: UpstreamConfig,
    pub health: HealthConfig,
    pub engine_scrape: ScrapeConfig,
    pub embedded: EmbeddedConfig,
    pub admission: AdmissionConfig,
    /// Static replicas.
    pub backends: Vec<BackendConfig>,
    /// Where the replica set comes from: the static list, or Kubernetes pods.
    pub discovery: DiscoveryConfig,
    /// Prefix index and policy settings (router-core's `RouterConfig`).
    pub routing: RouterConfig,
    /// KV-event sync: the engines' cache events feed the prefix index.
    pub kv_sync: KvSyncConfig,
    /// The runtime admin API on the metrics listener (`replicas::admin`).
    pub admin: AdminConfig,
    /// Cluster sharing: the gateways of a fleet share routing state through Redis.
    pub cluster: ClusterConfig,
    /// Envoy external processing: the gateway as Envoy's ext_proc server (AIBrix
    /// gateway-plugins or an Inference Extension endpoint picker).
    pub ext_proc: ExtProcConfig,
    /// Resume: a stream whose replica fails mid-answer is carried on on another replica.
    pub resume: ResumeConfig,
    /// OpenTelemetry traces over OTLP.
    pub tracing: TracingConfig,
    /// How many times faster than wall time the replicas' time runs, as the router reads it:
    /// 1 for real engines; N for simulated replicas run with `--time-scale N` (mock-engine,
    /// `loadgen matrix --local`), so that the router's times (time to first token, the TTFT
    /// SLO, the slow-replica rules, family windows, the index's block ages) are replica
    /// seconds. Left at 1 with embedded mock engines, it is `embedded.time_scale`.
    pub replica_time_scale: f64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            tls: TlsConfig::default(),
            default_strategy: Strategy::PrefixLoad.as_str().to_owned(),
            max_body_bytes: 8 * 1024 * 1024,
            shutdown_grace_secs: 30,
            log_level: None,
            upstream: UpstreamConfig::default(),
            health: HealthConfig::default(),
            engine_scrape: ScrapeConfig::default(),
            embedded: EmbeddedConfig::default(),
            admission: AdmissionConfig::default(),
            backends: Vec::new(),
            discovery: DiscoveryConfig::default(),
            routing: RouterConfig::default(),
            kv_sync: KvSyncConfig::default(),
            admin: AdminConfig::default(),
            cluster: ClusterConfig::default(),
            ext_proc: ExtProcConfig::default(),
            resume: ResumeConfig::default(),
            tracing: TracingConfig::default(),
            replica_time_scale: 1.0,
        }
    }
}

/// How the gateway talks to replicas.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// Time from sending a request to the replica's response headers; then 504.
    pub first_byte_timeout_ms: u64,
    /// Longest silence between two body chunks once the body began.
    pub idle_timeout_ms: u64,
    /// Longest wait after the response headers for the body's first byte: a streamed
    /// answer's first token, after queueing and prefill in the engine (a whole answer's
    /// body, after its generation); then the stream ends with an error event (SSE) or is cut.
    pub first_token_timeout_ms: u64,
    /// Further replicas tried when one fails before any response byte.
    pub max_retries: u32,
    /// Idle pooled connections are closed after this long.
    pub pool_idle_timeout_secs: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout_ms: 2_000,
            first_byte_timeout_ms: 120_000,
            idle_timeout_ms: 120_000,
            first_token_timeout_ms: 300_000,
            max_retries: 2,
            pool_idle_timeout_secs: 90,
        }
    }
}

/// Active health checks of each replica's `/health`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Period of the active probe of each replica's `/health`.
    pub interval_ms: u64,
    /// A probe without an answer within this long counts as failed.
    pub timeout_ms: u64,
    /// Consecutive failed probes (or refused connections) before a replica is ejected.
    pub eject_after_failures: u32,
    /// Consecutive good probes before an ejected replica is re-admitted.
    pub readmit_after_successes: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_ms: 1_000,
            timeout_ms: 1_000,
            eject_after_failures: 3,
            readmit_after_successes: 1,
        }
    }
}

/// Scraping each replica's `/metrics` into the load view.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// Scrape each replica's `/metrics` (running and waiting requests, KV-cache usage) into
    /// the load view.
    pub enabled: bool,
    /// Scrape period.
    pub interval_ms: u64,
    /// A scrape without an answer within this long clears that replica's engine stats.
    pub timeout_ms: u64,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            enabled: true,
            interval_ms: 250,
            timeout_ms: 1_000,
        }
    }
}

impl GatewayConfig {
    /// Reads and parses a TOML file (no environment or flags applied yet).
    pub fn from_file(path: &Path) -> Result<Self, ConfigFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|e| match e {
            ConfigFileError::Parse { message, .. } => ConfigFileError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigFileError> {
        toml::from_str(text).map_err(|e| ConfigFileError::Parse {
            path: "<text>".to_owned(),
            message: e.to_string(),
        })
    }

    /// The default strategy, parsed.
    pub fn default_strategy(&self) -> Result<Strategy, ConfigFileError> {
        self.default_strategy
            .parse()
            .map_err(
                |e: router_core::policy::UnknownStrategy| ConfigFileError::Invalid {
                    key: "default_strategy".to_owned(),
                    value: self.default_strategy.clone(),
                    reason: e.to_string(),
                },
            )
    }

    /// Checks what deserialisation cannot.
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        self.default_strategy()?;
        // router-core names its keys within `[routing]`.
        self.routing
            .validate()
            .map_err(|e| invalid(&format!("routing.{}", e.key), e.value, &e.reason))?;
        if let Some(filter) = &self.log_level {
            tracing_subscriber::EnvFilter::try_new(filter)
                .map_err(|e| invalid("log_level", filter.clone(), &e.to_string()))?;
        }
        self.tls.validate()?;
        self.kv_sync.validate(self.routing.block_size)?;
        self.cluster.validate()?;
        self.ext_proc.validate()?;
        self.resume.validate()?;
        let positive = [
            ("max_body_bytes", self.max_body_bytes as u64),
            (
                "upstream.connect_timeout_ms",
                self.upstream.connect_timeout_ms,
            ),
            (
                "upstream.first_byte_timeout_ms",
                self.upstream.first_byte_timeout_ms,
            ),
            ("upstream.idle_timeout_ms", self.upstream.idle_timeout_ms),
            (
                "upstream.first_token_timeout_ms",
                self.upstream.first_token_timeout_ms,
            ),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
            (
                "health.eject_after_failures",
                u64::from(self.health.eject_after_failures),
            ),
            (
                "health.readmit_after_successes",
                u64::from(self.health.readmit_after_successes),
            ),
            ("engine_scrape.interval_ms", self.engine_scrape.interval_ms),
            ("engine_scrape.timeout_ms", self.engine_scrape.timeout_ms),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(invalid(key, value.to_string(), "must be at least 1"));
            }
        }
        self.check_replica_time_scale()?;
        self.embedded.validate(cfg!(feature = "mock-engines"))?;
        self.discovery.validate()?;
        if self.discovery.kind == DiscoveryKind::Kubernetes {
            // One source of truth for the replica set: mixing fixed entries into a watched
            // set would make a pod and a static entry of the same name ambiguous.
            if !self.backends.is_empty() {
                return Err(invalid(
                    "discovery.kind",
                    "kubernetes".to_owned(),
                    "cannot be combined with static backends ([[backends]] or --backend); remove one",
                ));
            }
            if self.embedded.mock_engines > 0 {
                return Err(invalid(
                    "discovery.kind",
                    "kubernetes".to_owned(),
                    "cannot be combined with embedded replicas (embedded.mock_engines or --mock-engines)",
                ));
            }
        }
        Admission::new(self.admission.clone()).map_err(ConfigFileError::Admission)?;
        if self
            .admin
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(invalid(
                "admin.token",
                String::new(),
                "is empty; leave it out for an open admin API",
            ));
        }
        crate::replicas::static_::validate(&self.backends)
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.connect_timeout_ms)
    }
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.first_byte_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.idle_timeout_ms)
    }
    pub fn first_token_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.first_token_timeout_ms)
    }
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        let config = GatewayConfig::from_toml_str("").unwrap();
        assert_eq!(config, GatewayConfig::default());
        config.validate().unwrap();
    }

    #[test]
    fn the_example_file_is_the_defaults() {
        let text = include_str!("../../../config/gateway.example.toml");
        let config = GatewayConfig::from_toml_str(text).unwrap();
        config.validate().unwrap();
        assert_eq!(config, GatewayConfig::default());
        // Every commented-out example parses too, so the file never documents a wrong key.
        let is_example = |l: &&str| l.starts_with('[') || l.split_whitespace().nth(1) == Some("=");
        let uncommented: String = text
            .lines()
            .map(|line| line.strip_prefix("# ").filter(is_example).unwrap_or(line))
            .collect::<Vec<_>>()
            .join("\n");
        let config = GatewayConfig::from_toml_str(&uncommented).unwrap();
        assert_eq!(config.backends.len(), 2);
        assert!(config.tls.is_enabled());
        assert!(config.kv_sync.enabled);
        assert_eq!(
            config.kv_sync,
            crate::kv_sync::KvSyncConfig {
                enabled: true,
                ..Default::default()
            }
        );
        assert!(config.routing.hf_tokenizer_path.is_some());
        assert_eq!(
            config.cluster,
            crate::cluster::ClusterConfig {
                url: Some("redis://127.0.0.1:6379".to_owned()),
                gateway_id: Some("gw-a".to_owned()),
                ..Default::default()
            }
        );
        assert_eq!(
            config.ext_proc.listen,
            Some(SocketAddr::from(([0, 0, 0, 0], 50052)))
        );
        assert!(config.ext_proc.tls_key_file.is_some());
        assert_eq!(config.admission.tenants["B"].max_in_flight, 2);
        assert_eq!(config.admission.tenants["B"].tokens_per_second, Some(2000));
        assert_eq!(config.admission.tenants["B"].token_burst, Some(20000));
    }

    #[test]
    fn mock_engines_need_the_feature() {
        let embedded = EmbeddedConfig {
            mock_engines: 2,
            ..EmbeddedConfig::default()
        };
        embedded.validate(true).unwrap();
        let error = embedded.validate(false).unwrap_err().to_string();
        assert!(
            error.contains("embedded.mock_engines")
                && error.contains("`mock-engines` cargo feature"),
            "{error}"
        );
        // Without mock engines asked for, a build without them starts.
        EmbeddedConfig::default().validate(false).unwrap();
    }

    #[test]
    fn unknown_keys_are_named() {
        let error = GatewayConfig::from_toml_str("listen_addr = \"127.0.0.1:1\"").unwrap_err();
        assert!(error.to_string().contains("listen_addr"), "{error}");
        let error = GatewayConfig::from_toml_str("[upstream]\nretries = 3").unwrap_err();
        assert!(error.to_string().contains("retries"), "{error}");
        let error = GatewayConfig::from_toml_str("[routing]\nblocksize = 3").unwrap_err();
        assert!(error.to_string().contains("blocksize"), "{error}");
    }

    #[test]
    fn inconsistent_admission_settings_name_their_keys() {
        let config = GatewayConfig::from_toml_str("[admission]\ntenant_token_burst = 100").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert_eq!(
            error,
            "invalid admission settings: admission.tenant_token_burst = 100 needs \
             admission.tenant_tokens_per_second (0 means no token limit)"
        );
    }

    #[test]
    fn invalid_values_are_named() {
        let config = GatewayConfig::from_toml_str("default_strategy = \"fastest\"").unwrap();
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains("default_strategy") && error.contains("fastest"),
            "{error}"
        );

        let config = GatewayConfig::from_toml_str("[health]\ninterval_ms = 0").unwrap();
        assert!(
            config
                .validate()
                .unwrap_err()
                .to_string()
                .contains("health.interval_ms")
        );

        let text = "[[backends]]\nname = \"a\"\nurl = \"ftp://x\"";
        let error = GatewayConfig::from_toml_str(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("backends[0].url"), "{error}");

        let error = GatewayConfig::from_toml_str("listen = \"nowhere\"").unwrap_err();
        assert!(error.to_string().contains("listen"), "{error}");
    }

    #[test]
    fn token_rate_settings_parse_and_bad_ones_are_named() {
        let text = "[admission]\ntenant_tokens_per_second = 100\n[admission.tenants.B]\nmax_in_flight = 0\ntokens_per_second = 5\n";
        let config = GatewayConfig::from_toml_str(text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.admission.tenant_tokens_per_second, 100);
        assert_eq!(config.admission.tenants["B"].tokens_per_second, Some(5));
        for (text, key) in [
            (
                "[admission]\ntenant_tokens_per_second = -5",
                "tenant_tokens_per_second",
            ),
            ("[admission]\ntenant_token_rate = 5", "tenant_token_rate"),
            (
                "[admission.tenants.B]\nmax_in_flight = 1\ntokens_per_sec = 5",
                "tokens_per_sec",
            ),
        ] {
            let error = GatewayConfig::from_toml_str(text).unwrap_err();
            assert!(error.to_string().contains(key), "{text}: {error}");
        }
        let text = "[admission.tenants.B]\nmax_in_flight = 1\ntoken_burst = 50";
        let error = GatewayConfig::from_toml_str(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("admission.tenants.B.token_burst"),
            "{error}"
        );
    }

    #[test]
    fn backends_parse_with_optional_model() {
        let text = r#"
            [[backends]]
            name = "L20-A"
            url = "http://10.0.0.5:8000"
            model = "qwen"
            [[backends]]
            name = "L20-B"
            url = "http://10.0.0.6:8000"
        "#;
        let config = GatewayConfig::from_toml_str(text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.backends[0].model.as_deref(), Some("qwen"));
        assert_eq!(config.backends[1].model, None);
    }
}

#[cfg(test)]
mod cli_tests;

#[cfg(test)]
mod layers_tests;
