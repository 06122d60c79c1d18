//! One Kubernetes pod (k8s-openapi's `Pod`, as the watcher delivers it) turned into a
//! routable endpoint or the reason it is not one.
//!
//! Only the fields routing needs are read: `metadata.name`, `metadata.labels`,
//! `metadata.deletionTimestamp`, `status.podIP` and `status.conditions[type=Ready]`. A pod is
//! routable when it has an IP, its `Ready` condition is `True` and it is not terminating (no
//! `deletionTimestamp`), as SPEC §3.4 says. Its model is the value of the model label and its
//! port the value of the port label (default 8000); a port label that is not a port number
//! makes the pod [`PodState::Invalid`], which the table logs and skips.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use crate::replicas::discovery::DiscoveryConfig;

/// Where a routable pod is reached and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The pod's name: the replica name and the `target-pod` header.
    pub name: String,
    /// The value of the model label.
    pub model: String,
    /// `ip:port` (`[ip]:port` for IPv6).
    pub authority: String,
    /// The pod says it publishes KV-cache events (label [`KV_EVENTS_LABEL`] = `"true"`,
    /// as AIBrix requires before it subscribes).
    pub kv_events: bool,
}

/// AIBrix's opt-in label for KV-event sync.
pub const KV_EVENTS_LABEL: &str = "model.aibrix.ai/kv-events-enabled";

/// What a pod means for routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    Routable(Endpoint),
    /// Not (or no longer) to be sent new requests; the reason is for the log.
    NotRoutable(&'static str),
    /// The pod's labels are wrong; the message names the pod and the value.
    Invalid(String),
}

/// The label keys and default port discovery reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLabels {
    pub model_label: String,
    pub port_label: String,
    pub default_port: u16,
}

impl PodLabels {
    /// The labels a `[discovery]` table names.
    pub fn of(config: &DiscoveryConfig) -> Self {
        PodLabels {
            model_label: config.model_label.clone(),
            port_label: config.port_label.clone(),
            default_port: config.default_port,
        }
    }
}

/// The pod's name; empty when the API server sent none.
pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// Whether the pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

impl PodState {
    /// What `pod` means for routing under `labels`.
    pub fn of(pod: &Pod, labels: &PodLabels) -> PodState {
        let name = name(pod);
        if name.is_empty() {
            return PodState::Invalid("a pod without metadata.name".to_owned());
        }
        let label = |key: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(key));
        let Some(model) = label(&labels.model_label) else {
            return PodState::Invalid(format!("pod {name} has no {} label", labels.model_label));
        };
        if model.is_empty() {
            return PodState::Invalid(format!(
                "pod {name} has an empty {} label",
                labels.model_label
            ));
        }
        let port = match label(&labels.port_label) {
            None => labels.default_port,
            Some(value) => match value.trim().parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => {
                    return PodState::Invalid(format!(
                        "pod {name}: label {}={value:?} is not a port number (1-65535)",
                        labels.port_label
                    ));
                }
            },
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return PodState::NotRoutable("terminating");
        }
        if !is_ready(pod) {
            return PodState::NotRoutable("not Ready");
        }
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        let Some(ip) = ip.filter(|ip| !ip.is_empty()) else {
            return PodState::NotRoutable("no pod IP yet");
        };
        let authority = match ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => format!("{ip}:{port}"),
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            Err(_) => {
                return PodState::Invalid(format!("pod {name}: status.podIP {ip:?} is not an IP"));
            }
        };
        PodState::Routable(Endpoint {
            name: name.to_owned(),
            model: model.clone(),
            authority,
            kv_events: label(KV_EVENTS_LABEL).is_some_and(|v| v.trim() == "true"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> PodLabels {
        PodLabels::of(&DiscoveryConfig::default())
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn ready_pod() -> serde_json::Value {
        serde_json::json!({
            "kind": "Pod",
            "metadata": {
                "name": "vllm-0",
                "namespace": "llm",
                "resourceVersion": "42",
                "labels": {"model.aibrix.ai/name": "qwen3-8b", "app": "vllm"}
            },
            "spec": {"containers": []},
            "status": {
                "phase": "Running",
                "podIP": "10.1.2.3",
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "Ready", "status": "True"}
                ]
            }
        })
    }

    #[test]
    fn a_ready_pod_with_an_ip_is_routable_on_the_default_port() {
        let state = PodState::of(&pod(ready_pod()), &labels());
        assert_eq!(
            state,
            PodState::Routable(Endpoint {
                name: "vllm-0".to_owned(),
                model: "qwen3-8b".to_owned(),
                authority: "10.1.2.3:8000".to_owned(),
                kv_events: false,
            })
        );
    }

    #[test]
    fn the_kv_events_label_opts_a_pod_into_kv_event_sync() {
        for (value, expected) in [("true", true), ("false", false), ("yes", false)] {
            let mut json = ready_pod();
            json["metadata"]["labels"][KV_EVENTS_LABEL] = value.into();
            let PodState::Routable(endpoint) = PodState::of(&pod(json), &labels()) else {
                panic!("not routable");
            };
            assert_eq!(endpoint.kv_events, expected, "{value}");
        }
    }

    #[test]
    fn the_port_label_sets_the_port_and_ipv6_is_bracketed() {
        let mut json = ready_pod();
        json["metadata"]["labels"]["model.aibrix.ai/port"] = "9001".into();
        json["status"]["podIP"] = "fd00::7".into();
        let PodState::Routable(endpoint) = PodState::of(&pod(json), &labels()) else {
            panic!("not routable");
        };
        assert_eq!(endpoint.authority, "[fd00::7]:9001");
    }

    #[test]
    fn a_bad_port_label_is_invalid_and_names_pod_and_value() {
        for bad in ["http", "0", "70000", ""] {
            let mut json = ready_pod();
            json["metadata"]["labels"]["model.aibrix.ai/port"] = bad.into();
            let PodState::Invalid(message) = PodState::of(&pod(json), &labels()) else {
                panic!("{bad:?} accepted");
            };
            assert!(
                message.contains("vllm-0") && message.contains(&format!("{bad:?}")),
                "{message}"
            );
        }
    }

    #[test]
    fn not_ready_terminating_or_without_ip_is_not_routable() {
        let mut json = ready_pod();
        json["status"]["conditions"][1]["status"] = "False".into();
        assert_eq!(
            PodState::of(&pod(json), &labels()),
            PodState::NotRoutable("not Ready")
        );

        let mut json = ready_pod();
        json["status"]["conditions"] = serde_json::json!([]);
        assert_eq!(
            PodState::of(&pod(json), &labels()),
            PodState::NotRoutable("not Ready")
        );

        let mut json = ready_pod();
        json["metadata"]["deletionTimestamp"] = "2026-11-29T19:00:00Z".into();
        assert_eq!(
            PodState::of(&pod(json), &labels()),
            PodState::NotRoutable("terminating")
        );

        let mut json = ready_pod();
        json["status"]
            .as_object_mut()
            .unwrap()
            .remove("podIP")
            .unwrap();
        assert_eq!(
            PodState::of(&pod(json), &labels()),
            PodState::NotRoutable("no pod IP yet")
        );
    }

    #[test]
    fn missing_model_label_or_garbage_ip_is_invalid() {
        let mut json = ready_pod();
        json["metadata"]["labels"] = serde_json::json!({});
        assert!(
            matches!(PodState::of(&pod(json), &labels()), PodState::Invalid(m) if m.contains("no model.aibrix.ai/name"))
        );
        let mut json = ready_pod();
        json["status"]["podIP"] = "not-an-ip".into();
        assert!(
            matches!(PodState::of(&pod(json), &labels()), PodState::Invalid(m) if m.contains("not-an-ip"))
        );
    }

    #[test]
    fn a_pod_with_missing_sections_still_parses() {
        let pod = pod(serde_json::json!({"metadata": {"name": "x"}}));
        assert!(!is_ready(&pod));
        assert!(matches!(
            PodState::of(&pod, &labels()),
            PodState::Invalid(_)
        ));
    }
}
