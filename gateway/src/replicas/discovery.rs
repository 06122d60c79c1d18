//! The `[discovery]` table: where the replica set comes from, static (flags, `[[backends]]`,
//! embedded mocks) or Kubernetes pods (SPEC §3.4), and the Kubernetes settings with their
//! checks (namespace and label syntax, the API server URL, positive timings).
//!
//! Its combination with the other replica sources is checked by
//! [`crate::config::GatewayConfig::validate`]; the watch itself is [`super::kubernetes`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::error::{ConfigFileError, invalid};

/// Where replicas come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryKind {
    /// `[[backends]]`, `--backend` and `--mock-engines`: a fixed set.
    #[default]
    Static,
    /// Pods in a namespace, selected by the model label, followed by a watch.
    Kubernetes,
}

impl std::str::FromStr for DiscoveryKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "static" => Ok(DiscoveryKind::Static),
            "kubernetes" => Ok(DiscoveryKind::Kubernetes),
            other => Err(format!("{other:?}: expected static or kubernetes")),
        }
    }
}

/// Replica discovery (`[discovery]`); the Kubernetes keys matter only with
/// `kind = "kubernetes"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Where replicas come from: `static` (`[[backends]]`, `--backend`, `--mock-engines`) or
    /// `kubernetes` (pods labelled with the model, watched).
    pub kind: DiscoveryKind,
    /// The namespace watched; default: the gateway pod's own, else `default`.
    pub namespace: Option<String>,
    /// Models whose pods are routed to (label values); empty: every pod with the label.
    pub models: Vec<String>,
    /// The API server's URL; default: in-cluster (`KUBERNETES_SERVICE_HOST`, HTTPS with the
    /// service account). `http://127.0.0.1:8001` for `kubectl proxy` (no token sent).
    pub api_server: Option<String>,
    /// The label naming a pod's model.
    pub model_label: String,
    /// The label giving a pod's serving port.
    pub port_label: String,
    /// The port of a pod without the port label.
    pub default_port: u16,
    /// The API server ends each watch after this long; it is resumed at once. At most 294
    /// (the client library refuses watches of 295 s or more).
    pub watch_timeout_secs: u64,
    /// First retry delay after a failed list or watch; doubles up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    /// Longest retry delay after failed lists or watches.
    pub backoff_max_ms: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            kind: DiscoveryKind::Static,
            namespace: None,
            models: Vec::new(),
            api_server: None,
            model_label: "model.aibrix.ai/name".to_owned(),
            port_label: "model.aibrix.ai/port".to_owned(),
            default_port: 8000,
            watch_timeout_secs: 290,
            backoff_initial_ms: 250,
            backoff_max_ms: 30_000,
        }
    }
}

impl DiscoveryConfig {
    /// Checks the `[discovery]` table on its own (its combination with the static replicas
    /// is checked by [`GatewayConfig::validate`]).
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        if let Some(namespace) = &self.namespace
            && !is_dns_label(namespace)
        {
            return Err(invalid(
                "discovery.namespace",
                namespace.clone(),
                "not a namespace name (lowercase letters, digits and '-', at most 63)",
            ));
        }
        for (i, model) in self.models.iter().enumerate() {
            if !is_label_value(model) {
                return Err(invalid(
                    &format!("discovery.models[{i}]"),
                    model.clone(),
                    "not a Kubernetes label value (letters, digits, '-', '_', '.', at most 63)",
                ));
            }
        }
        for (key, value) in [
            ("discovery.model_label", &self.model_label),
            ("discovery.port_label", &self.port_label),
        ] {
            if !is_label_key(value) {
                return Err(invalid(key, value.clone(), "not a Kubernetes label key"));
            }
        }
        if let Some(url) = &self.api_server {
            crate::replicas::kubernetes::client::validate_url(url)
                .map_err(|reason| invalid("discovery.api_server", url.clone(), &reason))?;
        }
        for (key, value) in [
            ("discovery.default_port", u64::from(self.default_port)),
            ("discovery.watch_timeout_secs", self.watch_timeout_secs),
            ("discovery.backoff_initial_ms", self.backoff_initial_ms),
        ] {
            if value == 0 {
                return Err(invalid(key, value.to_string(), "must be at least 1"));
            }
        }
        if self.watch_timeout_secs > MAX_WATCH_TIMEOUT_SECS {
            return Err(invalid(
                "discovery.watch_timeout_secs",
                self.watch_timeout_secs.to_string(),
                &format!("must be at most {MAX_WATCH_TIMEOUT_SECS} (kube refuses longer watches)"),
            ));
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return Err(invalid(
                "discovery.backoff_max_ms",
                self.backoff_max_ms.to_string(),
                "must be at least backoff_initial_ms",
            ));
        }
        Ok(())
    }
}

/// kube-runtime refuses a watch `timeoutSeconds` of 295 or more (kubernetes/kubernetes#6513).
const MAX_WATCH_TIMEOUT_SECS: u64 = 294;

/// A DNS-1123 label (namespace names).
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A non-empty label value (the empty value selects nothing useful).
fn is_label_value(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && alnum(s.chars().next())
        && alnum(s.chars().last())
}

/// `[prefix/]name`, name a label value, prefix a DNS subdomain.
fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    is_label_value(name)
        && prefix.is_none_or(|p| (1..=253).contains(&p.len()) && p.split('.').all(is_dns_label))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;

    #[test]
    fn discovery_parses_and_bad_values_are_named() {
        let text = "[discovery]\nkind = \"kubernetes\"\nnamespace = \"llm\"\nmodels = [\"qwen3-8b\"]\napi_server = \"http://127.0.0.1:8001\"";
        let config = GatewayConfig::from_toml_str(text).unwrap();
        config.validate().unwrap();
        assert_eq!(config.discovery.kind, DiscoveryKind::Kubernetes);
        assert_eq!(config.discovery.port_label, "model.aibrix.ai/port");
        assert_eq!(config.discovery.default_port, 8000);

        let error = GatewayConfig::from_toml_str("[discovery]\nkind = \"consul\"").unwrap_err();
        assert!(error.to_string().contains("consul"), "{error}");
        let error = GatewayConfig::from_toml_str("[discovery]\nnamepsace = \"x\"").unwrap_err();
        assert!(error.to_string().contains("namepsace"), "{error}");

        for (text, key) in [
            ("namespace = \"Bad_NS\"", "discovery.namespace"),
            ("models = [\"a b\"]", "discovery.models[0]"),
            ("models = [\"\"]", "discovery.models[0]"),
            ("port_label = \"a=b\"", "discovery.port_label"),
            ("model_label = \"\"", "discovery.model_label"),
            ("api_server = \"ftp://x\"", "discovery.api_server"),
            ("api_server = \"http://x:1/api\"", "discovery.api_server"),
            ("default_port = 0", "discovery.default_port"),
            ("watch_timeout_secs = 295", "discovery.watch_timeout_secs"),
            (
                "backoff_initial_ms = 10\nbackoff_max_ms = 5",
                "discovery.backoff_max_ms",
            ),
        ] {
            let config = GatewayConfig::from_toml_str(&format!("[discovery]\n{text}")).unwrap();
            let error = config.validate().unwrap_err().to_string();
            assert!(error.contains(key), "{text}: {error}");
        }
    }

    #[test]
    fn kubernetes_discovery_does_not_mix_with_static_replicas() {
        let text = "[discovery]\nkind = \"kubernetes\"\n[[backends]]\nname = \"a\"\nurl = \"http://127.0.0.1:1\"";
        let error = GatewayConfig::from_toml_str(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            error.to_string().contains("discovery.kind") && error.to_string().contains("backends"),
            "{error}"
        );
        let text = "[discovery]\nkind = \"kubernetes\"\n[embedded]\nmock_engines = 1";
        let error = GatewayConfig::from_toml_str(text)
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("mock_engines"), "{error}");
    }

    #[test]
    fn label_syntax() {
        assert!(is_label_key("model.aibrix.ai/name"));
        assert!(is_label_key("app"));
        assert!(!is_label_key("/name"));
        assert!(!is_label_key("Model.AIBrix/name"));
        assert!(is_label_value("Qwen3-8B_fp8.v1"));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("Default"));
    }
}
