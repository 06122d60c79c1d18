//! Where the live runner sends traffic and reads metrics: the gateways (one, or several
//! behind what a Service would do), their metrics URLs and every replica's base URL
//! (`--replica NAME=URL`), with the limits of one live run.

use std::time::Duration;

use crate::measure::Slo;
use crate::run::assignment::GatewayAssignment;

/// One gateway as the live runner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayEndpoint {
    /// Its base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// Its metrics URL (`None`: routing counter deltas are `null`).
    pub metrics: Option<String>,
}

/// One replica as the live runner sees it.
#[derive(Debug, Clone)]
pub struct ReplicaEndpoint {
    pub name: String,
    /// `http://host:port` (its `/metrics` and `/v1/chat/completions` hang off it).
    pub base: String,
}

impl ReplicaEndpoint {
    /// Parses `NAME=URL`; a URL ending in `/metrics` is taken as the metrics URL itself.
    pub fn parse(spec: &str) -> Result<ReplicaEndpoint, String> {
        let (name, url) = spec
            .split_once('=')
            .ok_or_else(|| format!("--replica {spec:?}: expected NAME=URL"))?;
        let url = url.trim().trim_end_matches('/');
        if name.trim().is_empty() || !url.starts_with("http://") {
            return Err(format!(
                "--replica {spec:?}: expected NAME=http://host:port"
            ));
        }
        Ok(ReplicaEndpoint {
            name: name.trim().to_owned(),
            base: url.trim_end_matches("/metrics").to_owned(),
        })
    }
}

/// Where the live runner sends traffic and reads metrics.
#[derive(Debug, Clone)]
pub struct LiveTarget {
    /// The gateways, at least one; requests are spread over them as `assignment` says.
    pub gateways: Vec<GatewayEndpoint>,
    pub assignment: GatewayAssignment,
    pub replicas: Vec<ReplicaEndpoint>,
    pub model: String,
    /// Engine time per wall second (1 for real engines).
    pub time_scale: f64,
    /// Wall-time bound on one request.
    pub request_limit: Duration,
    pub slo: Slo,
}

impl LiveTarget {
    /// A target with one gateway.
    pub fn one_gateway(url: String, metrics: Option<String>) -> Vec<GatewayEndpoint> {
        vec![GatewayEndpoint { url, metrics }]
    }

    /// The gateways' URLs, comma-separated (for descriptions).
    pub fn gateway_urls(&self) -> String {
        let urls: Vec<&str> = self.gateways.iter().map(|g| g.url.as_str()).collect();
        urls.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_specs_parse_or_explain() {
        let r = ReplicaEndpoint::parse("L20-A=http://10.0.0.1:8000/metrics").unwrap();
        assert_eq!(
            (r.name.as_str(), r.base.as_str()),
            ("L20-A", "http://10.0.0.1:8000")
        );
        let r = ReplicaEndpoint::parse("b=http://h:1/").unwrap();
        assert_eq!(r.base, "http://h:1");
        for bad in ["nourl", "=http://h:1", "a=ftp://h"] {
            let err = ReplicaEndpoint::parse(bad).unwrap_err();
            assert!(err.contains("--replica"), "{err}");
        }
    }
}
