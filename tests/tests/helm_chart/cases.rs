//! What each `ci/*-values.yaml` case deploys beyond a valid gateway: TLS from its Secret,
//! the example engines as static backends or discovered, the optional values as given, the
//! ext_proc listener only where asked, the ServiceMonitors.

use gateway::config::DiscoveryKind;
use serde_json::Value;

use super::deployed::Gateway;
use super::ext_proc;
use super::kv_sync::assert_engines_match_kv_sync;
use super::render::{NAMESPACE, Rendered, args, list, named, text};
use super::{ENGINES, GATEWAY};

/// The API port speaks TLS with the chain and key of Secret `secret`, and the probes know.
pub fn assert_tls_from_secret(gateway: &Gateway, secret: &str) {
    let tls = &gateway.config.tls;
    for (file, key) in [(&tls.cert_file, "tls.crt"), (&tls.key_file, "tls.key")] {
        let file = file.as_deref().expect("TLS files in the resolved config");
        assert_eq!(file.file_name().unwrap(), key);
        assert_eq!(
            text(gateway.volume_holding(file), "/secret/secretName"),
            secret
        );
    }
    for probe in ["/readinessProbe", "/livenessProbe"] {
        let scheme = format!("{probe}/httpGet/scheme");
        assert_eq!(text(gateway.container, &scheme), "HTTPS", "{probe}");
    }
}

/// The example engines' container and its args.
pub fn engine(rendered: &Rendered) -> (&Value, Vec<&str>) {
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let container = &list(statefulset, "/spec/template/spec/containers")[0];
    (container, args(container))
}

/// With static discovery, the gateway lists each example engine pod by its stable DNS name
/// under the headless Service, with the engine's model and port.
pub fn assert_backends_are_the_engine_pods(rendered: &Rendered, gateway: &Gateway) {
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let service = text(statefulset, "/spec/serviceName");
    assert_eq!(
        rendered.object("Service", service)["spec"]["clusterIP"],
        "None"
    );
    let replicas = statefulset["spec"]["replicas"].as_u64().unwrap();
    let labels = &statefulset["spec"]["template"]["metadata"]["labels"];
    let port = text(labels, "/model.aibrix.ai~1port");
    let names: Vec<String> = (0..replicas).map(|i| format!("{ENGINES}-{i}")).collect();
    let backends = &gateway.config.backends;
    assert_eq!(backends.len(), names.len(), "{backends:?}");
    for (backend, name) in backends.iter().zip(&names) {
        assert_eq!(&backend.name, name);
        let url = format!("http://{name}.{service}.{NAMESPACE}.svc.cluster.local:{port}");
        assert_eq!(backend.url, url);
        assert_eq!(
            backend.model.as_deref(),
            labels["model.aibrix.ai/name"].as_str()
        );
    }
}

/// Pods are discovered through the API server: a token, RBAC in the watched namespace, and
/// example engines that carry the labels the gateway selects by.
fn assert_discovers_the_engine_pods(rendered: &Rendered, gateway: &Gateway) {
    let discovery = &gateway.config.discovery;
    assert_eq!(discovery.kind, DiscoveryKind::Kubernetes);
    assert_eq!(discovery.namespace.as_deref(), Some(NAMESPACE));
    assert!(gateway.config.backends.is_empty());
    assert_eq!(gateway.pod["automountServiceAccountToken"], true);
    let account = text(gateway.pod, "/serviceAccountName");
    let binding = rendered.object("RoleBinding", &format!("{GATEWAY}-pod-reader"));
    assert_eq!(text(binding, "/subjects/0/name"), account);
    let role = rendered.object("Role", text(binding, "/roleRef/name"));
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(role["rules"][0]["resources"], serde_json::json!(["pods"]));
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let labels = &statefulset["spec"]["template"]["metadata"]["labels"];
    let model = labels[&discovery.model_label].as_str().unwrap();
    assert!(discovery.models.is_empty() || discovery.models.iter().any(|m| m == model));
    let port = labels[&discovery.port_label].as_str().unwrap();
    let (container, _) = engine(rendered);
    assert_eq!(
        port,
        named(list(container, "/ports"), "name", "http")["containerPort"].to_string()
    );
}

/// `ci/options-values.yaml`: the optional values land where they say, and the labels,
/// annotations, nodeSelectors and Secret names it writes as YAML numbers and booleans are
/// rendered as the strings the API requires.
fn assert_options_render_as_given(rendered: &Rendered, gateway: &Gateway) {
    use serde_json::json;
    let deployment = rendered.object("Deployment", GATEWAY);
    let template = &deployment["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["tier"], "1");
    assert_eq!(template["metadata"]["labels"]["canary"], "false");
    assert_eq!(
        template["metadata"]["annotations"]["example.com/revision"],
        "3"
    );
    let pod = gateway.pod;
    assert_eq!(pod["nodeSelector"], json!({"example.com/gateway": "true"}));
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");
    assert!(
        pod["affinity"]["podAntiAffinity"].is_null(),
        "replaced by nodeAffinity"
    );
    let keys = named(
        list(gateway.container, "/env"),
        "name",
        "PREFIXGATE_API_KEYS",
    );
    assert_eq!(keys["valueFrom"]["secretKeyRef"]["name"], "2024");
    assert!(
        gateway.container["lifecycle"].is_null(),
        "preStopSleepSeconds: 0"
    );
    assert_eq!(gateway.container["image"], "prefixgate:2");
    let mount = named(
        list(gateway.container, "/volumeMounts"),
        "name",
        "tokenizer",
    );
    assert_eq!(mount["mountPath"], "/tokenizer");
    named(list(pod, "/volumes"), "name", "tokenizer");
    let account = rendered.object("ServiceAccount", GATEWAY);
    assert_eq!(
        account["metadata"]["annotations"]["example.com/managed"],
        "true"
    );
    let service = rendered.object("Service", GATEWAY);
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    let internal = "service.beta.kubernetes.io/aws-load-balancer-internal";
    assert_eq!(service["metadata"]["annotations"][internal], "true");
    let metrics = rendered.object("Service", &format!("{GATEWAY}-metrics"));
    assert_eq!(
        metrics["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    let pdb = rendered.object("PodDisruptionBudget", GATEWAY);
    assert_eq!(pdb["spec"]["minAvailable"], "50%");
    for name in [GATEWAY, ENGINES] {
        let monitor = rendered.object("ServiceMonitor", name);
        assert_eq!(monitor["metadata"]["labels"]["release"], "1", "{name}");
    }
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let engines = &statefulset["spec"]["template"]["spec"];
    let gpu = json!({"nvidia.com/gpu.present": "true"});
    assert_eq!(engines["nodeSelector"], gpu);
    let (container, args) = engine(rendered);
    assert_eq!(
        container["env"][0]["valueFrom"]["secretKeyRef"]["name"],
        "2026"
    );
    assert_eq!(container["image"], "vllm/vllm-openai:11");
    assert!(args.ends_with(&["--max-model-len", "8192"]), "{args:?}");
}

/// What each `ci/` case is for, beyond rendering a valid gateway.
pub fn check_case(case: &str, rendered: &Rendered, gateway: &Gateway) {
    let config = &gateway.config;
    let no_tls = || assert!(!config.tls.is_enabled(), "{case}: TLS");
    match case {
        "embedded" => {
            assert_eq!(config.embedded.mock_engines, 2);
            assert_eq!(config.default_strategy, "prefix-cache", "from extraArgs");
            assert!(rendered.find("PodDisruptionBudget", GATEWAY).is_none());
            no_tls();
        }
        "kubernetes" | "kv-sync" => {
            assert_discovers_the_engine_pods(rendered, gateway);
            assert_engines_match_kv_sync(rendered, gateway);
            assert_eq!(config.kv_sync.enabled, case == "kv-sync");
        }
        "kv-sync-dp" => {
            // Two ranks per engine pod, the replay range moved past the events range.
            assert_backends_are_the_engine_pods(rendered, gateway);
            let sync = &config.kv_sync;
            assert!(sync.enabled);
            assert_eq!(sync.data_parallel_size, 2);
            assert_eq!((sync.port, sync.replay_port), (5557, 5567));
            assert_engines_match_kv_sync(rendered, gateway);
            let (_, args) = engine(rendered);
            assert!(args.contains(&"--data-parallel-size=2"), "{args:?}");
            no_tls();
        }
        "mock" | "vllm" | "monitoring" => {
            assert_backends_are_the_engine_pods(rendered, gateway);
            assert_engines_match_kv_sync(rendered, gateway);
            let (container, args) = engine(rendered);
            let mock = container["name"] == "mock-engine";
            assert_eq!(mock, case != "vllm", "{args:?}");
            assert_eq!(args.contains(&"--enable-prefix-caching"), !mock, "{args:?}");
            no_tls();
        }
        "static" => {
            let names: Vec<&str> = config.backends.iter().map(|b| b.name.as_str()).collect();
            assert_eq!(names, ["vllm-a", "vllm-b"]);
            assert_eq!(config.admission.tenants["B"].token_burst, Some(12000));
            let env = list(gateway.container, "/env");
            let keys = named(env, "name", "PREFIXGATE_API_KEYS");
            assert_eq!(
                text(keys, "/valueFrom/secretKeyRef/name"),
                "prefixgate-api-keys"
            );
            let token = named(env, "name", "PREFIXGATE_ADMIN_TOKEN");
            assert_eq!(
                text(token, "/valueFrom/secretKeyRef/name"),
                "prefixgate-admin-token"
            );
            assert_eq!(text(token, "/valueFrom/secretKeyRef/key"), "token");
        }
        "cluster" => {
            // Three replicas sharing through the given Redis, under the release's name.
            assert_backends_are_the_engine_pods(rendered, gateway);
            let deployment = rendered.object("Deployment", GATEWAY);
            assert_eq!(deployment["spec"]["replicas"], 3);
            assert_eq!(
                config.cluster.url.as_deref(),
                Some("redis://redis.prefixgate.svc.cluster.local:6379")
            );
            assert_eq!(config.cluster.name, GATEWAY);
            assert_eq!(
                config.cluster.gateway_id, None,
                "each pod: its name + a suffix"
            );
            no_tls();
        }
        "tls" => {
            assert_tls_from_secret(gateway, "prefixgate-tls");
            assert_eq!(config.embedded.time_scale, 10.0, "from extraArgs");
        }
        "options" => {
            assert_tls_from_secret(gateway, "2025");
            assert_backends_are_the_engine_pods(rendered, gateway);
            assert_options_render_as_given(rendered, gateway);
        }
        "ext-proc-aibrix" => {
            assert_discovers_the_engine_pods(rendered, gateway);
            ext_proc::assert_aibrix_mode(rendered, gateway);
            no_tls();
        }
        "ext-proc-gie" => {
            assert_discovers_the_engine_pods(rendered, gateway);
            ext_proc::assert_gie_mode(rendered, gateway);
            no_tls();
        }
        other => panic!("ci/{other}-values.yaml is new: say in check_case what it shows"),
    }
    if !case.starts_with("ext-proc") {
        assert!(
            config.ext_proc.listen.is_none(),
            "{case}: no ext_proc listener"
        );
    }
    if case == "monitoring" {
        let monitor = rendered.object("ServiceMonitor", GATEWAY);
        let service = rendered.object("Service", &format!("{GATEWAY}-metrics"));
        let selector = &monitor["spec"]["selector"]["matchLabels"];
        for (label, value) in selector.as_object().unwrap() {
            assert_eq!(&service["metadata"]["labels"][label], value);
        }
        let port = text(monitor, "/spec/endpoints/0/port");
        named(list(service, "/spec/ports"), "name", port);
        rendered.object("ServiceMonitor", ENGINES);
    }
}
