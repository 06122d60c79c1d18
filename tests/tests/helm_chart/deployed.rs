//! The gateway as the chart deploys it: its pod and container, and the configuration
//! `prefixgate` builds in it from the rendered ConfigMap, args and environment, with the
//! Services that reach it.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Parser;
use gateway::GatewayConfig;
use gateway::config::cli::Cli;
use serde_json::Value;

use super::GATEWAY;
use super::render::{Rendered, args, list, named, scratch, text};

/// The gateway's pod as deployed, and the configuration `prefixgate` builds in it.
pub struct Gateway<'a> {
    pub pod: &'a Value,
    pub container: &'a Value,
    pub config: GatewayConfig,
}

impl Gateway<'_> {
    /// The volume mounted at `path`'s folder.
    pub fn volume_holding(&self, path: &Path) -> &Value {
        let folder = path.parent().unwrap().to_str().unwrap();
        let mount = named(list(self.container, "/volumeMounts"), "mountPath", folder);
        named(list(self.pod, "/volumes"), "name", text(mount, "/name"))
    }
}

/// What the image's entrypoint runs: `prefixgate --config $PREFIXGATE_CONFIG ARGS…`, with the
/// container's environment (the AIBrix variables), resolved and validated by the gateway's
/// own command line; the file is the ConfigMap key mounted at that path.
pub fn gateway(rendered: &Rendered) -> Gateway<'_> {
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
