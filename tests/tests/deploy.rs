//! The deployment artifacts in `deploy/` stay consistent with the gateway they deploy: the
//! Kubernetes ConfigMap's `gateway.toml` and the image's default config parse (every table
//! refuses unknown keys) and validate, the ConfigMap lists one backend per StatefulSet pod,
//! and the Deployment's grace period outlasts its preStop sleep plus the drain. The Helm
//! chart renders its file from templates and is checked with Helm (`deploy/helm/README.md`).
//! The YAML files are read as text (no YAML parser in the workspace), by the few fixed
//! lines these checks need.

use gateway::config::GatewayConfig;

const CONFIGMAP: &str = include_str!("../../deploy/kubernetes/gateway/configmap.yaml");
const DEPLOYMENT: &str = include_str!("../../deploy/kubernetes/gateway/deployment.yaml");
const VLLM: &str = include_str!("../../deploy/kubernetes/vllm/statefulset.yaml");
const MOCK_VLLM: &str = include_str!("../../deploy/kubernetes/mock-vllm/statefulset.yaml");
const IMAGE_CONFIG: &str = include_str!("../../deploy/docker/gateway.toml");

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
fn the_configmap_lists_each_statefulset_pod_by_its_stable_name() {
    let config = configmap_config();
    for statefulset in [VLLM, MOCK_VLLM] {
        let replicas = first_number(statefulset, "replicas:");
        assert_eq!(config.backends.len() as u64, replicas);
    }
    for (i, backend) in config.backends.iter().enumerate() {
        assert_eq!(backend.name, format!("vllm-{i}"), "target-pod = pod name");
        assert_eq!(backend.url, format!("http://vllm-{i}.vllm:8000"));
        assert_eq!(backend.model.as_deref(), Some("qwen3-8b"));
    }
    for statefulset in [VLLM, MOCK_VLLM] {
        assert!(statefulset.contains("model.aibrix.ai/name: qwen3-8b"));
        assert!(statefulset.contains("model.aibrix.ai/port: \"8000\""));
        assert!(statefulset.contains("serviceName: vllm"));
    }
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
