//! Static replicas: `--backend NAME=URL` flags and `[[backends]]` in the config file.
//!
//! Only plain `http://host:port` base URLs are accepted (vLLM serves plain HTTP inside a
//! cluster); a path, query or other scheme is an error naming the value, so a typo never
//! turns into requests sent somewhere unexpected.
//!
//! A backend may name its own KV-event endpoints (`kv_events`, `kv_replay`). Without them KV
//! sync dials `[kv_sync]`'s ports on the backend's host, which fits a pod per IP; replicas
//! sharing a host cannot share those ports (vLLM binds its PUB socket on `tcp://*:PORT`
//! only), so each names its own.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigFileError, invalid};
use crate::replicas::Replica;
use crate::replicas::kv_events::EventEndpoints;

/// One static replica.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The replica's name (the `target-pod` header).
    pub name: String,
    /// Base URL, `http://host:port`.
    pub url: String,
    /// The model it serves; read from its `/v1/models` when absent.
    #[serde(default)]
    pub model: Option<String>,
    /// Where it publishes vLLM's KV-cache events (`tcp://HOST:PORT`, vLLM's `endpoint` with
    /// `*` replaced by an address of the replica), for KV sync; absent: `[kv_sync]`'s
    /// `port` on the URL's host.
    #[serde(default)]
    pub kv_events: Option<String>,
    /// Where it serves KV-event replay (`tcp://HOST:PORT`, vLLM's `replay_endpoint`); only
    /// with `kv_events`, and absent when the engine serves none.
    #[serde(default)]
    pub kv_replay: Option<String>,
}

/// Parses one `--backend NAME=URL` flag value.
pub fn parse_backend_flag(value: &str) -> Result<BackendConfig, String> {
    let (name, url) = value
        .split_once('=')
        .ok_or_else(|| format!("--backend {value:?}: expected NAME=URL"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("--backend {value:?}: the name is empty"));
    }
    parse_base_url(url).map_err(|reason| format!("--backend {value:?}: {reason}"))?;
    Ok(BackendConfig {
        name: name.to_owned(),
        url: url.trim().to_owned(),
        model: None,
        kv_events: None,
        kv_replay: None,
    })
}

/// The `host:port` of a base URL `http://host:port` (a trailing `/` is allowed).
pub fn parse_base_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url.trim().parse().map_err(|e| format!("not a URL ({e})"))?;
    if uri.scheme_str() != Some("http") {
        return Err("only http:// URLs are supported".to_owned());
    }
    let authority = uri
        .authority()
        .ok_or_else(|| "the URL has no host".to_owned())?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("the URL must not have a path ({})", uri.path()));
    }
    if uri.query().is_some() {
        return Err("the URL must not have a query".to_owned());
    }
    let host = authority.host();
    let port = authority.port_u16().unwrap_or(80);
    Ok(format!("{host}:{port}"))
}

/// A KV-event endpoint as the gateway dials it: `tcp://HOST:PORT`, a real host (not `*`)
/// and a port.
pub fn parse_event_endpoint(endpoint: &str) -> Result<(), String> {
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return Err("must be tcp://HOST:PORT (ZeroMQ over TCP)".to_owned());
    };
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err("has no port (tcp://HOST:PORT)".to_owned());
    };
    if host.is_empty() || host == "*" {
        return Err(format!(
            "needs the replica's address, not {host:?}: `*` is what the engine binds, not where the gateway connects"
        ));
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok(()),
        _ => Err(format!("has no valid port ({port:?}; 1-65535)")),
    }
}

/// The endpoints a backend names for itself, if any (values already validated).
fn own_event_endpoints(backend: &BackendConfig) -> Option<EventEndpoints> {
    Some(EventEndpoints {
        events: backend.kv_events.clone()?,
        replay: backend.kv_replay.clone(),
    })
}

/// Checks every backend: a name, given once; a plain `http://host:port` URL; event endpoints
/// the gateway can dial, the replay only beside the events.
pub fn validate(backends: &[BackendConfig]) -> Result<(), ConfigFileError> {
    let mut names = std::collections::HashSet::new();
    for (i, backend) in backends.iter().enumerate() {
        if backend.name.is_empty() {
            return Err(invalid(
                &format!("backends[{i}].name"),
                String::new(),
                "is empty",
            ));
        }
        if !names.insert(backend.name.as_str()) {
            return Err(invalid(
                &format!("backends[{i}].name"),
                backend.name.clone(),
                "names a replica twice",
            ));
        }
        parse_base_url(&backend.url).map_err(|reason| {
            invalid(&format!("backends[{i}].url"), backend.url.clone(), &reason)
        })?;
        for (key, endpoint) in [
            ("kv_events", &backend.kv_events),
            ("kv_replay", &backend.kv_replay),
        ] {
            if let Some(endpoint) = endpoint {
                parse_event_endpoint(endpoint).map_err(|reason| {
                    invalid(&format!("backends[{i}].{key}"), endpoint.clone(), &reason)
                })?;
            }
        }
        if backend.kv_replay.is_some() && backend.kv_events.is_none() {
            return Err(invalid(
                &format!("backends[{i}].kv_replay"),
                backend.kv_replay.clone().unwrap_or_default(),
                &format!(
                    "needs backends[{i}].kv_events beside it (the replay serves the events' stream)"
                ),
            ));
        }
    }
    Ok(())
}

/// Replicas for the configured backends (URLs already validated).
pub fn replicas(backends: &[BackendConfig]) -> Result<Vec<Arc<Replica>>, String> {
    backends
        .iter()
        .map(|backend| {
            let authority = parse_base_url(&backend.url)
                .map_err(|reason| format!("backend {}: {reason}", backend.name))?;
            let models = backend.model.iter().cloned().collect();
            let replica = Replica::new(backend.name.clone(), authority, models);
            Ok(Arc::new(match own_event_endpoints(backend) {
                Some(endpoints) => replica.with_kv_events(endpoints),
                None => replica,
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_name_and_url() {
        let backend = parse_backend_flag("L20-A=http://10.0.0.5:8000").unwrap();
        assert_eq!(backend.name, "L20-A");
        assert_eq!(backend.url, "http://10.0.0.5:8000");
        assert_eq!(backend.model, None);
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        assert!(
            parse_backend_flag("http://x:1")
                .unwrap_err()
                .contains("NAME=URL")
        );
        assert!(
            parse_backend_flag("=http://x:1")
                .unwrap_err()
                .contains("name is empty")
        );
        assert!(
            parse_backend_flag("a=https://x:1")
                .unwrap_err()
                .contains("http://")
        );
        assert!(
            parse_backend_flag("a=http://x:1/v1")
                .unwrap_err()
                .contains("path")
        );
        assert!(
            parse_backend_flag("a=not a url")
                .unwrap_err()
                .contains("not a URL")
        );
    }

    #[test]
    fn event_endpoints_need_a_host_and_a_port() {
        parse_event_endpoint("tcp://127.0.0.1:5557").unwrap();
        parse_event_endpoint("tcp://vllm-0.vllm:5557").unwrap();
        for (bad, reason) in [
            ("127.0.0.1:5557", "tcp://"),
            ("tcp://*:5557", "not \"*\""),
            ("tcp://127.0.0.1", "no port"),
            ("tcp://h:0", "valid port"),
            ("tcp://h:70000", "valid port"),
            ("tcp://:5557", "not \"\""),
        ] {
            let error = parse_event_endpoint(bad).unwrap_err();
            assert!(error.contains(reason), "{bad}: {error}");
        }
    }

    #[test]
    fn a_backend_carries_its_own_event_endpoints() {
        let mut backend = parse_backend_flag("a=http://127.0.0.1:8000").unwrap();
        assert_eq!(
            replicas(std::slice::from_ref(&backend)).unwrap()[0].kv_events(),
            None
        );
        backend.kv_events = Some("tcp://127.0.0.1:6001".to_owned());
        backend.kv_replay = Some("tcp://127.0.0.1:6002".to_owned());
        let replica = &replicas(&[backend]).unwrap()[0];
        assert_eq!(
            replica.kv_events(),
            Some(&EventEndpoints {
                events: "tcp://127.0.0.1:6001".to_owned(),
                replay: Some("tcp://127.0.0.1:6002".to_owned()),
            })
        );
    }

    #[test]
    fn authority_defaults_the_port() {
        assert_eq!(parse_base_url("http://host").unwrap(), "host:80");
        assert_eq!(
            parse_base_url("http://127.0.0.1:9/").unwrap(),
            "127.0.0.1:9"
        );
    }

    #[test]
    fn duplicate_backend_names_are_refused() {
        let text = "[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:2\"";
        let error = crate::config::GatewayConfig::from_toml_str(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("backends[1].name"), "{error}");
    }

    #[test]
    fn a_backends_event_endpoints_are_checked() {
        let backend = |extra: &str| {
            format!("[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"\n{extra}")
        };
        let ok =
            backend("kv_events = \"tcp://127.0.0.1:6001\"\nkv_replay = \"tcp://127.0.0.1:6002\"");
        crate::config::GatewayConfig::from_toml_str(&ok)
            .unwrap()
            .validate()
            .unwrap();
        for (extra, key, reason) in [
            (
                "kv_events = \"tcp://*:5557\"",
                "backends[0].kv_events",
                "replica's address",
            ),
            (
                "kv_events = \"127.0.0.1:5557\"",
                "backends[0].kv_events",
                "tcp://",
            ),
            (
                "kv_replay = \"tcp://127.0.0.1:6002\"",
                "backends[0].kv_replay",
                "kv_events beside it",
            ),
        ] {
            let error = crate::config::GatewayConfig::from_toml_str(&backend(extra))
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                error.contains(key) && error.contains(reason),
                "{extra}: {error}"
            );
        }
    }
}
