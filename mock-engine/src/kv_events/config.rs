//! `--kv-events-config '{json}'`, as vLLM takes it (`vllm/config/kv_events.py`), parsed and
//! checked before anything starts.
//!
//! Fields and defaults are vLLM's: `enable_kv_cache_events` (false), `publisher` ("zmq" when
//! enabled, else "null"), `endpoint` (`tcp://*:5557`), `replay_endpoint` (none),
//! `buffer_steps` (10 000), `hwm` (100 000), `max_queue_size` (100 000), `topic` (""). An
//! unknown field, a wrong type or a value the mock cannot serve is a start-up error naming
//! the field. Only `tcp://HOST:PORT` endpoints are served (the pure-Rust ZeroMQ here has no
//! ipc or inproc transport).
//!
//! Bind or connect follows vLLM's `ZmqEventPublisher`: the PUB socket binds when the endpoint
//! names a wildcard host (`*`, `0.0.0.0`, `::`), and connects otherwise, so it can push to a
//! central subscriber that binds. One addition: a port of 0 also binds (there is nothing to
//! connect to), which lets tests take a free port on loopback. The replay socket always
//! binds. `*` is bound as `0.0.0.0`, as libzmq reads it.
//!
//! Which wire form the events take ([`EventFormat`]) is not a vLLM field (vLLM's form
//! follows its version), so it is not read from the JSON: the binary's `--kv-events-format`
//! sets it with [`KvEventsConfig::with_format`].

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use thiserror::Error;

use router_core::kv_sync::wire::EventFormat;

/// Which publisher vLLM would build.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PublisherKind {
    Zmq,
    Null,
}

/// The checked configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    pub publisher: PublisherKind,
    /// The PUB socket's endpoint as given.
    pub endpoint: String,
    /// The replay ROUTER socket's endpoint, if replay is served.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay (the newest ones).
    pub buffer_steps: usize,
    /// Accepted and checked for compatibility; the ZeroMQ library here keeps a fixed
    /// per-subscriber queue and drops for a slow subscriber, as a PUB socket at its HWM does.
    pub hwm: usize,
    /// Batches waiting for the publisher task; beyond it the oldest is dropped and counted.
    pub max_queue_size: usize,
    /// The first frame of every message.
    pub topic: String,
    /// How events are encoded (positional by default; not part of vLLM's JSON).
    pub format: EventFormat,
}

/// vLLM's default PUB endpoint.
pub const DEFAULT_ENDPOINT: &str = "tcp://*:5557";

impl Default for KvEventsConfig {
    /// Events off (vLLM's default).
    fn default() -> Self {
        KvEventsConfig {
            enable_kv_cache_events: false,
            publisher: PublisherKind::Null,
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            format: EventFormat::Positional,
        }
    }
}

/// Why `--kv-events-config` was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvEventsConfigError {
    /// Not JSON, not an object, an unknown field or a wrong type (serde names it).
    #[error("--kv-events-config: {0}")]
    Json(String),
    #[error("--kv-events-config: `{field}` = `{value}`: {reason}")]
    Endpoint {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("--kv-events-config: `{field}` must be at least 1")]
    Zero { field: &'static str },
}

/// How a socket meets its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Listen at this `tcp://IP:PORT` (a `*` host already turned into `0.0.0.0`).
    Bind(String),
    /// Dial this `tcp://HOST:PORT`, retrying until it answers.
    Connect(String),
}

impl KvEventsConfig {
    /// Parses vLLM's JSON form.
    pub fn parse(json: &str) -> Result<KvEventsConfig, KvEventsConfigError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| KvEventsConfigError::Json(e.to_string()))?;
        let Value::Object(fields) = value else {
            return Err(KvEventsConfigError::Json(
                "expected a JSON object like {\"enable_kv_cache_events\":true}".into(),
            ));
        };
        let mut config = KvEventsConfig::default();
        let mut publisher = None;
        for (name, value) in fields {
            match name.as_str() {
                "enable_kv_cache_events" => config.enable_kv_cache_events = field(&name, value)?,
                "publisher" => publisher = field(&name, value)?,
                "endpoint" => config.endpoint = field(&name, value)?,
                "replay_endpoint" => config.replay_endpoint = field(&name, value)?,
                "buffer_steps" => config.buffer_steps = field(&name, value)?,
                "hwm" => config.hwm = field(&name, value)?,
                "max_queue_size" => config.max_queue_size = field(&name, value)?,
                "topic" => config.topic = field(&name, value)?,
                _ => {
                    return Err(KvEventsConfigError::Json(format!(
                        "unknown field `{name}`, expected one of {FIELDS}"
                    )));
                }
            }
        }
        config.publisher = publisher.unwrap_or(if config.enable_kv_cache_events {
            PublisherKind::Zmq
        } else {
            PublisherKind::Null
        });
        config.pub_attach()?;
        config.replay_attach()?;
        if config.max_queue_size == 0 {
            return Err(KvEventsConfigError::Zero {
                field: "max_queue_size",
            });
        }
        Ok(config)
    }

    /// This configuration with its events encoded in `format`.
    pub fn with_format(mut self, format: EventFormat) -> KvEventsConfig {
        self.format = format;
        self
    }

    /// The configuration of replica `index` of several in one process: both ports move up
    /// by `index` (vLLM's rule for data-parallel ranks), except a port of 0. An error names
    /// the endpoint whose port would pass 65535.
    pub fn for_replica(&self, index: u16) -> Result<KvEventsConfig, KvEventsConfigError> {
        let mut config = self.clone();
        config.endpoint = offset_port("endpoint", &self.endpoint, index)?;
        if let Some(replay) = &self.replay_endpoint {
            config.replay_endpoint = Some(offset_port("replay_endpoint", replay, index)?);
        }
        Ok(config)
    }

    /// Whether events are recorded and published over ZMQ (enabled, publisher "zmq").
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher == PublisherKind::Zmq
    }

    /// How the PUB socket attaches.
    pub fn pub_attach(&self) -> Result<Attach, KvEventsConfigError> {
        let (host, port) = split_tcp("endpoint", &self.endpoint)?;
        let wildcard = matches!(host, "*" | "0.0.0.0" | "::" | "[::]");
        Ok(if wildcard || port == 0 {
            Attach::Bind(bind_endpoint(host, port))
        } else {
            Attach::Connect(self.endpoint.clone())
        })
    }

    /// Where the replay ROUTER socket binds, if replay is on.
    pub fn replay_attach(&self) -> Result<Option<String>, KvEventsConfigError> {
        let Some(endpoint) = &self.replay_endpoint else {
            return Ok(None);
        };
        let (host, port) = split_tcp("replay_endpoint", endpoint)?;
        Ok(Some(bind_endpoint(host, port)))
    }
}

/// The fields vLLM's `KVEventsConfig` has, for the unknown-field message.
const FIELDS: &str = "enable_kv_cache_events, publisher, endpoint, replay_endpoint, \
                      buffer_steps, hwm, max_queue_size, topic";

/// One field's value, or an error naming the field and what it should be.
fn field<T: DeserializeOwned>(name: &str, value: Value) -> Result<T, KvEventsConfigError> {
    serde_json::from_value(value).map_err(|e| KvEventsConfigError::Json(format!("`{name}`: {e}")))
}

fn offset_port(
    field: &'static str,
    endpoint: &str,
    index: u16,
) -> Result<String, KvEventsConfigError> {
    let (host, port) = split_tcp(field, endpoint)?;
    if port == 0 || index == 0 {
        return Ok(endpoint.to_owned());
    }
    let port = port
        .checked_add(index)
        .ok_or_else(|| KvEventsConfigError::Endpoint {
            field,
            value: endpoint.to_owned(),
            reason: "the port plus the replica's index passes 65535",
        })?;
    Ok(format!("tcp://{host}:{port}"))
}

fn bind_endpoint(host: &str, port: u16) -> String {
    let host = if host == "*" { "0.0.0.0" } else { host };
    format!("tcp://{host}:{port}")
}

/// `tcp://HOST:PORT` → (HOST, PORT); HOST may be `[v6]`.
fn split_tcp<'a>(
    field: &'static str,
    endpoint: &'a str,
) -> Result<(&'a str, u16), KvEventsConfigError> {
    let error = |reason| KvEventsConfigError::Endpoint {
        field,
        value: endpoint.to_owned(),
        reason,
    };
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        return Err(error(
            "only tcp://HOST:PORT endpoints are served (no ipc:// or inproc://)",
        ));
    };
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| error("expected tcp://HOST:PORT"))?;
    if host.is_empty() {
        return Err(error("the host is empty (use * for every interface)"));
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| error("the port is not a number within 0..=65535"))?;
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_documented_example_parses_with_its_defaults() {
        let config = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557",
                "replay_endpoint":"tcp://*:5558","topic":"kv@10.0.0.1@m"}"#,
        )
        .unwrap();
        assert!(config.publishes());
        assert_eq!(config.buffer_steps, 10_000);
        assert_eq!(config.topic, "kv@10.0.0.1@m");
        assert_eq!(
            config.pub_attach(),
            Ok(Attach::Bind("tcp://0.0.0.0:5557".into()))
        );
        assert_eq!(
            config.replay_attach(),
            Ok(Some("tcp://0.0.0.0:5558".into()))
        );
    }

    #[test]
    fn the_publisher_defaults_from_enable_and_null_publishes_nothing() {
        let on = KvEventsConfig::parse(r#"{"enable_kv_cache_events":true}"#).unwrap();
        assert_eq!(on.publisher, PublisherKind::Zmq);
        assert_eq!(on.endpoint, DEFAULT_ENDPOINT);
        let off = KvEventsConfig::parse("{}").unwrap();
        assert!(!off.publishes());
        assert_eq!(off, KvEventsConfig::default());
        let null =
            KvEventsConfig::parse(r#"{"enable_kv_cache_events":true,"publisher":"null"}"#).unwrap();
        assert!(!null.publishes());
    }

    #[test]
    fn a_named_host_connects_and_port_zero_binds() {
        let remote = KvEventsConfig::parse(r#"{"endpoint":"tcp://indexer:5557"}"#).unwrap();
        assert_eq!(
            remote.pub_attach(),
            Ok(Attach::Connect("tcp://indexer:5557".into()))
        );
        let local = KvEventsConfig::parse(r#"{"endpoint":"tcp://127.0.0.1:0"}"#).unwrap();
        assert_eq!(
            local.pub_attach(),
            Ok(Attach::Bind("tcp://127.0.0.1:0".into()))
        );
    }

    #[test]
    fn replicas_offset_both_ports_but_not_port_zero() {
        let config = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://127.0.0.1:6557"}"#,
        )
        .unwrap();
        let second = config.for_replica(2).unwrap();
        assert_eq!(second.endpoint, "tcp://*:5559");
        assert_eq!(
            second.replay_endpoint.as_deref(),
            Some("tcp://127.0.0.1:6559")
        );
        assert_eq!(config.for_replica(0).unwrap(), config);
        let zero = KvEventsConfig::parse(r#"{"endpoint":"tcp://127.0.0.1:0"}"#).unwrap();
        assert_eq!(zero.for_replica(3).unwrap().endpoint, "tcp://127.0.0.1:0");
        let high = KvEventsConfig::parse(r#"{"endpoint":"tcp://*:65535"}"#).unwrap();
        assert!(
            high.for_replica(1)
                .unwrap_err()
                .to_string()
                .contains("65535")
        );
    }

    #[test]
    fn the_format_is_positional_unless_chosen_and_kept_per_replica() {
        let config = KvEventsConfig::parse(r#"{"enable_kv_cache_events":true}"#).unwrap();
        assert_eq!(config.format, EventFormat::Positional);
        let map = config.with_format(EventFormat::Map);
        assert_eq!(map.format, EventFormat::Map);
        assert_eq!(map.for_replica(1).unwrap().format, EventFormat::Map);
        // Not a vLLM field, so not accepted in vLLM's JSON.
        let error = KvEventsConfig::parse(r#"{"format":"map"}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `format`"),
            "{error}"
        );
    }

    #[test]
    fn wrong_input_names_the_field() {
        let err = |json: &str| KvEventsConfig::parse(json).unwrap_err().to_string();
        assert!(err("not json").contains("--kv-events-config"));
        let unknown = err(r#"{"enable_kv_cache_event":true}"#);
        assert!(
            unknown.contains("unknown field `enable_kv_cache_event`"),
            "{unknown}"
        );
        let kafka = err(r#"{"publisher":"kafka"}"#);
        assert!(
            kafka.contains("`publisher`") && kafka.contains("kafka"),
            "{kafka}"
        );
        let steps = err(r#"{"buffer_steps":-1}"#);
        assert!(
            steps.contains("`buffer_steps`") && steps.contains("-1"),
            "{steps}"
        );
        assert!(err(r#"{"hwm":"lots"}"#).contains("`hwm`"));
        assert!(err(r#"{"topic":5}"#).contains("`topic`"));
        assert!(err(r#"{"enable_kv_cache_events":"yes"}"#).contains("`enable_kv_cache_events`"));
        let ipc = err(r#"{"endpoint":"ipc:///tmp/kv"}"#);
        assert!(
            ipc.contains("`endpoint`") && ipc.contains("tcp://"),
            "{ipc}"
        );
        let port = err(r#"{"replay_endpoint":"tcp://*:99999"}"#);
        assert!(
            port.contains("`replay_endpoint`") && port.contains("port"),
            "{port}"
        );
        assert!(err(r#"{"endpoint":"tcp://:5"}"#).contains("host"));
        assert!(err(r#"{"max_queue_size":0}"#).contains("max_queue_size"));
        assert!(err("[]").contains("--kv-events-config"));
    }
}
