//! Every Kubernetes object prefixgate ships, checked against the Kubernetes API's own schemas
//! (`kube_validate.rs`, `--strict`, Kubernetes 1.21, 1.25 and 1.37): the objects each Helm
//! `ci/` case renders, the renders of the chart's other tests, and every plain manifest under
//! `deploy/kubernetes/`. A misspelt field, a field at the wrong level or a number where the
//! API wants a string fails here instead of at `kubectl apply`.
//!
//! The tests need two releases of `kubernetes-validate`, named by `PREFIXGATE_KUBE_VALIDATE`
//! (1.37.0) and `PREFIXGATE_KUBE_VALIDATE_FLOOR` (1.24.0), and Helm (`PREFIXGATE_HELM`) for
//! the chart, so they are `#[ignore]`d like the other Helm tests; `.ci/run` installs them
//! into venvs and runs them. Asked to run, a missing tool is a failure, never a skip. The
//! checks of the skip list and of the chart's `kubeVersion` need no tool and always run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::crd;
use super::kube_validate::{Object, SCHEMAS, SKIPPED, check, kubernetes_validate, objects_in};
use super::render::CHART;
use super::render::{Rendered, ci_cases, render, scratch};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");

/// Renders the chart's other tests use beyond the `ci/` cases (their `--set` values); the
/// optional branches of the templates are reached by `ci/options-values.yaml`.
const OTHER_RENDERS: &[&[&str]] = &[
    &[
        "--set",
        "vllm.enabled=true,tls.enabled=true,tls.secretName=x,ports.metrics=9100",
        "--set-json",
        r#"extraArgs=["--set","upstream.max_retries=5","--mock-engines",10000000]"#,
    ],
    &["--set", "vllm.enabled=true,kvSync.enabled=true"],
    &[
        "--set",
        "vllm.enabled=true,vllm.mock=true,kvSync.enabled=true,kvSync.replayPort=0",
    ],
    &["--set", super::KV_SYNC_THREE_RANKS_NO_REPLAY],
    &["--set", super::kv_sync::SIXTY_FOUR_RANKS],
];

/// The objects of a render, in manifest order, as the manifest names them.
fn rendered_objects(rendered: &Rendered) -> Vec<Object> {
    let text = |o: &Value, pointer: &str| {
        o.pointer(pointer)
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    rendered
        .objects
        .iter()
        .map(|o| Object {
            api_version: text(o, "/apiVersion").unwrap(),
            kind: text(o, "/kind").unwrap(),
            name: text(o, "/metadata/name").unwrap(),
        })
        .collect()
}

/// Renders the chart with `values` and validates what Helm printed; the failures, and the
/// rendered objects.
async fn check_render(label: &str, values: &[&str]) -> (Vec<String>, Vec<Object>) {
    let rendered = render(values).await;
    let objects = rendered_objects(&rendered);
    let file = scratch("schema.yaml");
    std::fs::write(&file, &rendered.manifest).unwrap();
    let mut failures = check(label, &file, &objects).await;
    let (custom, checked) = crd::check_custom(label, &file).await;
    failures.extend(custom);
    std::fs::remove_file(&file).unwrap();
    let custom_objects = objects.iter().filter(|o| crd::is_custom(o)).count();
    if checked != custom_objects {
        failures.push(format!(
            "{label}: {checked} of {custom_objects} custom objects checked"
        ));
    }
    (failures, objects)
}

/// Every `.yaml`/`.yml` file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    // Bounded: the folders under deploy/ are few and shallow.
    for _ in 0..1000 {
        let Some(folder) = folders.pop() else { break };
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }
    assert!(folders.is_empty(), "more than 1000 folders under {dir:?}");
    files.sort();
    files
}

/// The kinds `objects` hold that [`SKIPPED`] lists; a skip entry outside it is stale.
fn stale_skips(objects: &[Object]) -> Vec<String> {
    SKIPPED
        .iter()
        .filter(|(api, kind, _)| {
            !objects
                .iter()
                .any(|o| o.api_version == *api && o.kind == *kind)
        })
        .map(|(api, kind, reason)| format!("{api} {kind} ({reason})"))
        .collect()
}

fn assert_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} objects refused or unchecked:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test]
#[ignore = "needs PREFIXGATE_HELM, PREFIXGATE_KUBE_VALIDATE(_FLOOR) (.ci/run sets them)"]
async fn kube_schema_accepts_every_object_the_chart_renders() {
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for (case, path) in ci_cases() {
        let label = format!("ci/{case}-values.yaml");
        let (found, objects) = check_render(&label, &["-f", path.to_str().unwrap()]).await;
        failures.extend(found);
        seen.extend(objects);
    }
    for values in OTHER_RENDERS {
        let (found, objects) = check_render(&format!("{values:?}"), values).await;
        failures.extend(found);
        seen.extend(objects);
    }
    assert_no_failures(&failures);
    let kinds: BTreeSet<&str> = seen.iter().map(|o| o.kind.as_str()).collect();
    println!("validated or skipped: {kinds:?}");
    for kind in ["Deployment", "StatefulSet", "Service", "ConfigMap", "Role"] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
    // Skipped kinds the templates hold must be rendered by some case (the plain manifests'
    // own, such as KEDA's ScaledObject, are checked by the plain-manifest test).
    let templates = objects_under(&Path::new(DEPLOY).join("helm/prefixgate/templates"));
    let stale: Vec<String> = stale_skips(&seen)
        .into_iter()
        .filter(|entry| {
            templates
                .iter()
                .any(|o| entry.contains(&format!("{} {}", o.api_version, o.kind)))
        })
        .collect();
    assert!(stale.is_empty(), "no render holds {stale:?}");
}

/// The objects of every manifest under `dir`, as the files write them.
fn objects_under(dir: &Path) -> Vec<Object> {
    yaml_files(dir)
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            objects_in(&text, &file.display().to_string())
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs PREFIXGATE_KUBE_VALIDATE and _FLOOR (.ci/run sets them)"]
async fn kube_schema_accepts_every_plain_manifest() {
    let files = yaml_files(&Path::new(DEPLOY).join("kubernetes"));
    assert!(files.len() >= 12, "{files:?}");
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for file in &files {
        let label = file.strip_prefix(DEPLOY).unwrap().display().to_string();
        let objects = objects_in(&std::fs::read_to_string(file).unwrap(), &label);
        assert!(!objects.is_empty(), "{label} holds no object");
        failures.extend(check(&label, file, &objects).await);
        let (custom, checked) = crd::check_custom(&label, file).await;
        failures.extend(custom);
        let custom_objects = objects.iter().filter(|o| crd::is_custom(o)).count();
        assert_eq!(checked, custom_objects, "{label}: custom objects checked");
        seen.extend(objects);
    }
    assert_no_failures(&failures);
    let stale = stale_skips(&seen);
    assert!(stale.is_empty(), "no plain manifest holds {stale:?}");
}

/// A Deployment that is valid but for one planted defect per copy; the valid one passes.
const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: NAME
spec:
  replicas: 2
  selector:
    matchLabels:
      app: x
  template:
    metadata:
      labels:
        app: x
    spec:
      containers:
        - name: c
          image: x:1
          ports:
            - containerPort: 8080
";

#[tokio::test]
#[ignore = "needs PREFIXGATE_KUBE_VALIDATE and _FLOOR (.ci/run sets them)"]
async fn kube_schema_refuses_wrong_types_unknown_fields_and_unknown_kinds() {
    for schemas in &SCHEMAS {
        let version = kubernetes_validate(schemas, &["--version"]).await;
        let version = String::from_utf8_lossy(&version.stdout);
        assert_eq!(
            version.trim(),
            schemas.release,
            "{}: .ci/run pins the release, and SCHEMAS names the schemas it bundles",
            schemas.env
        );
    }
    let valid = DEPLOYMENT.replace("NAME", "valid");
    let documents = [
        valid.clone(),
        valid
            .replace("valid", "two")
            .replace("replicas: 2", "replicas: \"two\""),
        valid
            .replace("valid", "portz")
            .replace("  ports:", "  portz:"),
        valid
            .replace("valid", "misspelt")
            .replace("kind: Deployment", "kind: Deploymnet"),
    ];
    let yaml = documents.join("---\n");
    let file = scratch("wrong.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let objects = objects_in(&yaml, "wrong.yaml");
    assert_eq!(objects.len(), 4, "{objects:?}");
    let failures = check("planted", &file, &objects).await;
    std::fs::remove_file(&file).unwrap();
    let expected = [
        "Deployment two is refused: spec.replicas: 'two' is not of type 'integer'",
        "Deployment portz is refused: spec.template.spec.containers.0: Additional properties \
         are not allowed ('portz' was unexpected)",
        "no schema for Deploymnet misspelt (apps/v1)",
    ];
    let versions = ["1.21.0", "1.25.0", "1.37.0"];
    for version in versions {
        for message in expected {
            let found = failures
                .iter()
                .filter(|f| f.contains(&format!("-k {version}:")) && f.contains(message))
                .count();
            assert_eq!(found, 1, "{version} {message}:\n{}", failures.join("\n"));
        }
    }
    assert_eq!(
        failures.len(),
        3 * versions.len(),
        "{}",
        failures.join("\n")
    );
    assert!(
        !failures.iter().any(|f| f.contains(" valid ")),
        "{failures:?}"
    );
}

#[test]
fn the_skip_list_names_kinds_the_chart_and_the_manifests_hold() {
    let mut seen = objects_under(&Path::new(DEPLOY).join("kubernetes"));
    seen.extend(objects_under(
        &Path::new(DEPLOY).join("helm/prefixgate/templates"),
    ));
    let stale = stale_skips(&seen);
    assert!(stale.is_empty(), "nothing under deploy/ is a {stale:?}");
    for (_, _, reason) in SKIPPED {
        assert!(reason.len() > 20, "say why: {reason}");
    }
}

#[test]
fn the_chart_kube_version_floor_is_the_oldest_schema_validated() {
    let chart = std::fs::read_to_string(Path::new(CHART).join("Chart.yaml")).unwrap();
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: "))
        .expect("a kubeVersion in Chart.yaml");
    let floor = floor
        .trim_matches('"')
        .strip_prefix(">=")
        .expect("a >= floor");
    let floor = floor.trim_end_matches("-0");
    let oldest = SCHEMAS.iter().flat_map(|s| s.kubernetes).min_by_key(|v| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next(), parts.next(), parts.next())
    });
    assert_eq!(Some(&floor), oldest, "Chart.yaml's kubeVersion and SCHEMAS");
}

/// A valid InferencePool, then one defect per copy (and one custom kind with no schema).
const POOL: &str = "apiVersion: inference.networking.k8s.io/v1
kind: InferencePool
metadata:
  name: NAME
spec:
  selector:
    matchLabels:
      model.aibrix.ai/name: m
  targetPorts:
    - number: 8000
  endpointPickerRef:
    name: prefixgate
    port:
      number: 9002
    failureMode: FailClose
";

#[tokio::test]
#[ignore = "needs PREFIXGATE_KUBE_VALIDATE (its venv's jsonschema; .ci/run sets it)"]
async fn crd_schemas_refuse_unknown_fields_bad_enums_and_ports_and_unknown_kinds() {
    let valid = POOL.replace("NAME", "valid");
    let documents = [
        valid.clone(),
        valid
            .replace("valid", "sometimes")
            .replace("FailClose", "Sometimes"),
        valid
            .replace("valid", "port-zero")
            .replace("number: 8000", "number: 0"),
        valid
            .replace("valid", "misplaced")
            .replace("  targetPorts:", "  targetPortz:"),
        "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: SecurityPolicy\nmetadata:\n  \
         name: x\nspec: {}\n"
            .to_owned(),
    ];
    let file = scratch("crd.yaml");
    std::fs::write(&file, documents.join("---\n")).unwrap();
    let (failures, passed) = crd::check_custom("planted", &file).await;
    std::fs::remove_file(&file).unwrap();
    assert_eq!(passed, 1, "{failures:?}");
    for expected in [
        "REFUSED InferencePool/sometimes: spec/endpointPickerRef/failureMode: 'Sometimes' is \
         not one of ['FailOpen', 'FailClose']",
        "REFUSED InferencePool/port-zero: spec/targetPorts/0/number: 0 is less than the \
         minimum of 1",
        "REFUSED InferencePool/misplaced: spec: Additional properties are not allowed \
         ('targetPortz' was unexpected)",
        "UNKNOWN gateway.envoyproxy.io/v1alpha1 SecurityPolicy",
    ] {
        assert!(
            failures.iter().any(|f| f.ends_with(expected)),
            "{expected:?} not among {failures:#?}"
        );
    }
}
