//! The chart's Envoy ext_proc mode (`extProc`, docs/ENVOY.md), for `helm_chart.rs`: the
//! gateway listens for ext_proc where its container port and Service say, in the dialect the
//! values name, with the certificate the pod mounts; and the objects that send traffic to it
//! point at that Service port: Envoy Gateway's EnvoyExtensionPolicy, HTTPRoute and
//! EnvoyPatchPolicy (AIBrix's way), or an InferencePool whose endpoint picker it is and whose
//! selector and port are the engines' (the Inference Extension's way).

use gateway::config::Dialect;
use serde_json::Value;

use super::deployed::Gateway;
use super::render::{NAMESPACE, Rendered, list, named, text};
use super::{ENGINES, GATEWAY};

/// The Service port that reaches the ext_proc listener, checked against the pod's.
fn service_port(rendered: &Rendered, gateway: &Gateway) -> u64 {
    let listen = gateway
        .config
        .ext_proc
        .listen
        .expect("extProc.enabled renders [ext_proc] listen");
    assert!(listen.ip().is_unspecified());
    let ports = list(gateway.container, "/ports");
    let container_port = named(ports, "name", "ext-proc")["containerPort"]
        .as_u64()
        .unwrap();
    assert_eq!(u64::from(listen.port()), container_port);
    let service = rendered.object("Service", GATEWAY);
    let port = named(list(service, "/spec/ports"), "name", "ext-proc");
    assert_eq!(text(port, "/targetPort"), "ext-proc");
    port["port"].as_u64().unwrap()
}

/// The ext_proc listener's certificate and key are Secret `secret`'s, mounted in the pod.
fn assert_tls_from(gateway: &Gateway, secret: &str) {
    let ext_proc = &gateway.config.ext_proc;
    for (file, key) in [
        (&ext_proc.tls_cert_file, "tls.crt"),
        (&ext_proc.tls_key_file, "tls.key"),
    ] {
        let file = file.as_deref().expect("ext_proc TLS files in the config");
        assert_eq!(file.file_name().unwrap(), key);
        assert_eq!(
            text(gateway.volume_holding(file), "/secret/secretName"),
            secret
        );
    }
}

/// `ci/ext-proc-aibrix-values.yaml`: AIBrix's Envoy Gateway objects around the aibrix dialect.
pub fn assert_aibrix_mode(rendered: &Rendered, gateway: &Gateway) {
    assert_eq!(gateway.config.ext_proc.dialect, Dialect::Aibrix);
    assert!(gateway.config.ext_proc.tls_cert_file.is_none(), "h2c");
    let port = service_port(rendered, gateway);
    let service = rendered.object("Service", GATEWAY);
    let ext_proc_port = named(list(service, "/spec/ports"), "name", "ext-proc");
    assert_eq!(text(ext_proc_port, "/appProtocol"), "kubernetes.io/h2c");
    let route_name = format!("{GATEWAY}-ext-proc");
    let route = rendered.object("HTTPRoute", &route_name);
    assert_eq!(text(route, "/spec/parentRefs/0/name"), "aibrix-eg");
    assert_eq!(text(route, "/spec/parentRefs/0/namespace"), "aibrix-system");
    // A request ext_proc did not route falls through to the gateway's HTTP port.
    let fallback = &list(route, "/spec/rules/0/backendRefs")[0];
    assert_eq!(text(fallback, "/name"), GATEWAY);
    let http = named(list(service, "/spec/ports"), "name", "http");
    assert_eq!(fallback["port"], http["port"]);

    let policy = rendered.object("EnvoyExtensionPolicy", &route_name);
    assert_eq!(text(policy, "/spec/targetRefs/0/kind"), "HTTPRoute");
    assert_eq!(text(policy, "/spec/targetRefs/0/name"), route_name);
    let processor = &list(policy, "/spec/extProc")[0];
    assert_eq!(text(processor, "/backendRefs/0/name"), GATEWAY);
    assert_eq!(processor["backendRefs"][0]["port"].as_u64(), Some(port));
    assert_eq!(text(processor, "/processingMode/request/body"), "Buffered");
    assert_eq!(text(processor, "/processingMode/response/body"), "Streamed");

    let patch = rendered.object("EnvoyPatchPolicy", &format!("{GATEWAY}-original-dst"));
    assert_eq!(text(patch, "/metadata/namespace"), "aibrix-system");
    assert_eq!(text(patch, "/spec/targetRef/name"), "aibrix-eg");
    let patches = list(patch, "/spec/jsonPatches");
    let route_patch = &patches[0]["operation"]["value"];
    assert_eq!(text(&patches[0], "/name"), "aibrix-system/aibrix-eg/http");
    assert_eq!(
        text(route_patch, "/match/headers/0/name"),
        "routing-strategy"
    );
    // The route keeps the ext_proc filter this release's policy installs.
    let filter = format!(
        "envoy.filters.http.ext_proc/envoyextensionpolicy/{NAMESPACE}/{route_name}/extproc/0"
    );
    assert!(
        route_patch["typed_per_filter_config"]
            .get(&filter)
            .is_some(),
        "{route_patch}"
    );
    let cluster = &patches[1]["operation"]["value"];
    assert_eq!(text(cluster, "/name"), text(route_patch, "/route/cluster"));
    assert_eq!(text(cluster, "/type"), "ORIGINAL_DST");
    assert_eq!(
        text(cluster, "/original_dst_lb_config/http_header_name"),
        "target-pod"
    );
}

/// `ci/ext-proc-gie-values.yaml`: an InferencePool of the engines with the gateway (over
/// its self-signed TLS) as the endpoint picker, and a route to the pool.
pub fn assert_gie_mode(rendered: &Rendered, gateway: &Gateway) {
    assert_eq!(gateway.config.ext_proc.dialect, Dialect::Gie);
    let port = service_port(rendered, gateway);
    assert_eq!(port, 9002);
    let secret = format!("{GATEWAY}-ext-proc-tls");
    let tls = rendered.object("Secret", &secret);
    assert_eq!(text(tls, "/type"), "kubernetes.io/tls");
    assert_tls_from(gateway, &secret);
    let service = rendered.object("Service", GATEWAY);
    let ext_proc_port = named(list(service, "/spec/ports"), "name", "ext-proc");
    assert!(ext_proc_port.get("appProtocol").is_none(), "TLS, not h2c");

    let pool = rendered.object("InferencePool", GATEWAY);
    assert_eq!(text(pool, "/spec/endpointPickerRef/name"), GATEWAY);
    assert_eq!(
        pool["spec"]["endpointPickerRef"]["port"]["number"].as_u64(),
        Some(port)
    );
    let engines = rendered.object("StatefulSet", ENGINES);
    let pod_labels = &engines["spec"]["template"]["metadata"]["labels"];
    let selector = pool["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (label, value) in selector {
        assert_eq!(
            &pod_labels[label], value,
            "the pool selects the engines by {label}"
        );
    }
    let engine = &list(engines, "/spec/template/spec/containers")[0];
    let serving = named(list(engine, "/ports"), "name", "http")["containerPort"].clone();
    assert_eq!(pool["spec"]["targetPorts"][0]["number"], serving);
    // The gateway routes the same pods: discovered by the label the pool selects on.
    let model_label = &gateway.config.discovery.model_label;
    assert!(selector.contains_key(model_label), "{selector:?}");

    let route = rendered.object("HTTPRoute", GATEWAY);
    assert_eq!(text(route, "/spec/parentRefs/0/name"), "inference-gateway");
    let backend: &Value = &list(route, "/spec/rules/0/backendRefs")[0];
    assert_eq!(text(backend, "/kind"), "InferencePool");
    assert_eq!(text(backend, "/name"), GATEWAY);
}
