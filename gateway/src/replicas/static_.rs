//! Static replicas: `--backend NAME=URL` flags and `[[backends]]` in the config file.
//!
//! Only plain `http://host:port` base URLs are accepted (vLLM serves plain HTTP inside a
//! cluster); a path, query or other scheme is an error naming the value, so a typo never
//! turns into requests sent somewhere unexpected.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::replicas::Replica;

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

/// Replicas for the configured backends (URLs already validated).
pub fn replicas(backends: &[BackendConfig]) -> Result<Vec<Arc<Replica>>, String> {
    backends
        .iter()
        .map(|backend| {
            let authority = parse_base_url(&backend.url)
                .map_err(|reason| format!("backend {}: {reason}", backend.name))?;
            let models = backend.model.iter().cloned().collect();
            Ok(Arc::new(Replica::new(
                backend.name.clone(),
                authority,
                models,
            )))
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
    fn authority_defaults_the_port() {
        assert_eq!(parse_base_url("http://host").unwrap(), "host:80");
        assert_eq!(
            parse_base_url("http://127.0.0.1:9/").unwrap(),
            "127.0.0.1:9"
        );
    }
}
