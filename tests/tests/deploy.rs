//! The deployment artifacts in `deploy/` stay consistent with the gateway they deploy: the
//! Kubernetes ConfigMap's `gateway.toml` and the image's default config parse (every table
//! refuses unknown keys) and validate, the ConfigMap discovers the StatefulSet's pods by the
//! labels they carry (with the RBAC and token that needs), and the Deployment's grace period
//! outlasts its preStop sleep plus the drain. The Helm
//! chart renders its file from templates and is checked with real Helm in `helm_chart.rs`.
//! The YAML files are read as text (no YAML parser in the workspace), by the few fixed
//! lines these checks need.

use gateway::config::{DiscoveryKind, GatewayConfig};

const CONFIGMAP: &str = include_str!("../../deploy/kubernetes/gateway/configmap.yaml");
const DEPLOYMENT: &str = include_str!("../../deploy/kubernetes/gateway/deployment.yaml");
const VLLM: &str = include_str!("../../deploy/kubernetes/vllm/statefulset.yaml");
const MOCK_VLLM: &str = include_str!("../../deploy/kubernetes/mock-vllm/statefulset.yaml");
const IMAGE_CONFIG: &str = include_str!("../../deploy/docker/gateway.toml");
const RBAC: &str = include_str!("../../deploy/kubernetes/gateway/rbac.yaml");
const SERVICE_ACCOUNT: &str = include_str!("../../deploy/kubernetes/gateway/serviceaccount.yaml");

/// The literal block under `gateway.toml: |`, without its indentation.
fn configmap_toml(yaml: &str) -> String {
    let mut lines = yaml.lines().skip_while(|l| l.trim() != "gateway.toml: |");
    let header = lines.next().expect("a `gateway.toml: |` key");
    let key_indent = header.len() - header.trim_start().len();
    let block: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = block
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .expect("a non-empty block");
    block
        .iter()
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The integer after the first `key:` at the start of a (trimmed) line.
fn first_number(yaml: &str, key: &str) -> u64 {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e}"))
}

fn configmap_config() -> GatewayConfig {
    let text = configmap_toml(CONFIGMAP);
    let config = GatewayConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    config.validate().unwrap();
    config
}

#[test]
fn the_configmap_is_a_valid_gateway_config_listening_on_every_interface() {
    let config = configmap_config();
    assert_eq!(config.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(config.metrics_listen.to_string(), "0.0.0.0:9090");
    // The stock AIBrix values the A/B comparison in docs/DEPLOY.md relies on.
    assert_eq!(config.routing.block_size, 128);
    assert_eq!(config.routing.imbalance_abs_count, 16);
    assert_eq!(config.routing.stddev_factor, 2);
}

#[test]
fn the_configmap_discovers_the_statefulset_pods_by_their_labels() {
    let config = configmap_config();
    let discovery = &config.discovery;
    assert_eq!(discovery.kind, DiscoveryKind::Kubernetes);
    assert!(config.backends.is_empty());
    assert_eq!(discovery.models, ["qwen3-8b"]);
    for statefulset in [VLLM, MOCK_VLLM] {
        let model = format!("{}: {}", discovery.model_label, discovery.models[0]);
        assert!(statefulset.contains(&model), "{model}");
        let port = format!("{}: \"{}\"", discovery.port_label, discovery.default_port);
        assert!(statefulset.contains(&port), "{port}");
    }
}

#[test]
fn the_gateway_may_watch_pods_and_has_a_token_to() {
    assert!(RBAC.contains("kind: Role\n") && RBAC.contains("kind: RoleBinding"));
    assert!(RBAC.contains("resources: [\"pods\"]"));
    assert!(RBAC.contains("verbs: [\"get\", \"list\", \"watch\"]"));
    assert!(
        RBAC.contains("name: prefixgate\n"),
        "bound to the gateway's ServiceAccount"
    );
    assert!(SERVICE_ACCOUNT.contains("automountServiceAccountToken: true"));
    assert!(DEPLOYMENT.contains("serviceAccountName: prefixgate"));
    assert!(DEPLOYMENT.contains("automountServiceAccountToken: true"));
}

#[test]
fn the_grace_period_outlasts_the_prestop_sleep_and_the_drain() {
    let config = configmap_config();
    let grace = first_number(DEPLOYMENT, "terminationGracePeriodSeconds:");
    let sleep: u64 = DEPLOYMENT
        .lines()
        .find_map(|l| l.trim().strip_prefix("command: [\"sleep\", \""))
        .and_then(|rest| rest.strip_suffix("\"]"))
        .expect("a preStop sleep")
        .parse()
        .unwrap();
    assert!(
        grace > sleep + config.shutdown_grace_secs,
        "terminationGracePeriodSeconds {grace} <= preStop {sleep} + shutdown_grace_secs {}",
        config.shutdown_grace_secs
    );
}

#[test]
fn the_image_config_only_moves_the_listeners() {
    let config = GatewayConfig::from_toml_str(IMAGE_CONFIG).unwrap();
    config.validate().unwrap();
    let expected = GatewayConfig {
        listen: "0.0.0.0:8080".parse().unwrap(),
        metrics_listen: "0.0.0.0:9090".parse().unwrap(),
        ..GatewayConfig::default()
    };
    assert_eq!(config, expected);
}

#[test]
fn the_block_reader_stops_at_the_block_end() {
    let yaml = "data:\n  gateway.toml: |\n    a = 1\n\n    [b]\n    c = 2\n  other: x\n";
    assert_eq!(configmap_toml(yaml), "a = 1\n\n[b]\nc = 2");
}
