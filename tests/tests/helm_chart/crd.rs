//! The custom resources prefixgate ships (its Envoy ext_proc objects: Gateway API HTTPRoute,
//! Envoy Gateway's EnvoyExtensionPolicy and EnvoyPatchPolicy, the Inference Extension's
//! InferencePool), checked against their CRDs' fields, for `helm_chart/schema.rs`: the
//! Kubernetes API schemas `kubernetes-validate` bundles do not know them.
//!
//! `crd_schemas.json` holds, per `apiVersion kind`, a JSON Schema of the fields prefixgate
//! uses, written from each CRD (types, enums, patterns, bounds; no other field allowed). The
//! check runs the `jsonschema` and PyYAML packages of the venv `kubernetes-validate` lives in
//! (its dependencies; `.ci/run` installs it) on a manifest file, and reads one line per
//! custom object: `CHECKED KIND/NAME`, `REFUSED KIND/NAME: PATH: MESSAGE` (every violation),
//! or `UNKNOWN APIVERSION KIND` for a custom kind without a schema here (a failure: a kind
//! added to the chart needs its schema).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The schemas, by `apiVersion kind`.
pub const SCHEMAS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/helm_chart/crd_schemas.json"
);

/// The API groups whose kinds are checked here (every other object is the Kubernetes API's).
pub const GROUPS: [&str; 3] = [
    "gateway.networking.k8s.io",
    "gateway.envoyproxy.io",
    "inference.networking.k8s.io",
];

/// Whether `object` is one of the custom resources checked here.
pub fn is_custom(object: &super::kube_validate::Object) -> bool {
    let group = object.api_version.split('/').next().unwrap_or_default();
    GROUPS.contains(&group)
}

/// One run at most this long (well under a second).
const DEADLINE: Duration = Duration::from_secs(120);

const SCRIPT: &str = r#"
import json, sys, yaml, jsonschema
schemas = json.load(open(sys.argv[1]))
groups = sys.argv[3].split(",")
for doc in yaml.safe_load_all(open(sys.argv[2])):
    if not isinstance(doc, dict) or doc.get("apiVersion", "").split("/")[0] not in groups:
        continue
    key = doc["apiVersion"] + " " + doc["kind"]
    name = doc["kind"] + "/" + str(doc.get("metadata", {}).get("name"))
    if key not in schemas:
        print("UNKNOWN " + key)
        continue
    errors = sorted(jsonschema.Draft7Validator(schemas[key]).iter_errors(doc), key=str)
    for error in errors:
        path = "/".join(str(p) for p in error.absolute_path)
        print("REFUSED " + name + ": " + path + ": " + error.message.replace("\n", " "))
    if not errors:
        print("CHECKED " + name)
"#;

/// The Python of the venv holding `kubernetes-validate` (named by `PREFIXGATE_KUBE_VALIDATE`).
fn python() -> PathBuf {
    let validator = std::env::var("PREFIXGATE_KUBE_VALIDATE")
        .expect("PREFIXGATE_KUBE_VALIDATE names kubernetes-validate (.ci/run sets it)");
    Path::new(&validator).with_file_name("python")
}

/// The custom objects of `file` checked against their schemas: the failures (each naming
/// `label` and the object) and how many objects passed.
pub async fn check_custom(label: &str, file: &Path) -> (Vec<String>, usize) {
    let run = tokio::process::Command::new(python())
        .args(["-c", SCRIPT, SCHEMAS])
        .arg(file)
        .arg(GROUPS.join(","))
        .output();
    let output = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("the CRD schema check did not finish")
        .expect("the venv's python does not run");
    assert!(
        output.status.success(),
        "{label}: the CRD schema check failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut failures = Vec::new();
    let mut passed = 0;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if line.starts_with("CHECKED ") {
            passed += 1;
        } else if !line.trim().is_empty() {
            failures.push(format!("{label}: {line}"));
        }
    }
    (failures, passed)
}
