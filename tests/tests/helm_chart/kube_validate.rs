//! Validates Kubernetes objects against the API's own schemas, for `helm_chart/schema.rs`:
//! runs `kubernetes-validate --strict` (PyPI; each release bundles the OpenAPI schemas of
//! a range of Kubernetes versions and refuses unknown fields under `--strict`) on a manifest
//! file against [`SCHEMAS`]: the chart's `kubeVersion` floor (1.21, from release 1.24.0) and
//! the oldest and newest of release 1.37.0 (1.25, 1.37). It reads the tool's report and pairs
//! each line with the object it is about, so a failure names the object and the message.
//!
//! The tool's report, one stdout line per object of the file, in file order (empty
//! documents skipped):
//! `INFO FILE passed for resource KIND/NAME against version V`,
//! `ERROR FILE did not validate for resource KIND/NAME against version V: PATH: MESSAGE`
//! (the first violation only), `WARN FILE Couldn't find schema for kind KIND with api version
//! API for kubernetes version V`. A missing schema is only a warning with exit status 0, so
//! every such line is checked here against [`SKIPPED`]: a kind the schemas cannot know is
//! listed with its reason, anything else (a misspelt kind or apiVersion) is a failure.

use std::path::Path;
use std::time::Duration;

/// One pinned release of `kubernetes-validate` and the Kubernetes versions checked with it.
#[derive(Debug)]
pub struct Schemas {
    /// The variable naming its binary (`.ci/run` installs each release into a venv).
    pub env: &'static str,
    /// The release `.ci/run` pins: it decides which schemas are bundled.
    pub release: &'static str,
    pub kubernetes: &'static [&'static str],
}

/// Everything is validated against each of these. Release 1.37.0 bundles 1.25 to 1.37 (its
/// oldest and newest are checked); 1.24.0 bundles 1.10 to 1.24 and so reaches the floor of
/// the chart's `kubeVersion` (a test keeps the two equal).
pub const SCHEMAS: [Schemas; 2] = [
    Schemas {
        env: "PREFIXGATE_KUBE_VALIDATE_FLOOR",
        release: "1.24.0",
        kubernetes: &["1.21.0"],
    },
    Schemas {
        env: "PREFIXGATE_KUBE_VALIDATE",
        release: "1.37.0",
        kubernetes: &["1.25.0", "1.37.0"],
    },
];
/// Objects the bundled schemas cannot know, skipped by apiVersion and kind, with the reason.
pub const SKIPPED: &[(&str, &str, &str)] = &[
    (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        "a Prometheus Operator CRD, not part of the Kubernetes API the schemas describe",
    ),
    (
        "keda.sh/v1alpha1",
        "ScaledObject",
        "a KEDA CRD, not part of the Kubernetes API the schemas describe",
    ),
    (
        "gateway.networking.k8s.io/v1",
        "HTTPRoute",
        "a Gateway API CRD: checked against its CRD's fields (helm_chart/crd.rs)",
    ),
    (
        "gateway.envoyproxy.io/v1alpha1",
        "EnvoyExtensionPolicy",
        "an Envoy Gateway CRD: checked against its CRD's fields (helm_chart/crd.rs)",
    ),
    (
        "gateway.envoyproxy.io/v1alpha1",
        "EnvoyPatchPolicy",
        "an Envoy Gateway CRD: checked against its CRD's fields (helm_chart/crd.rs)",
    ),
    (
        "inference.networking.k8s.io/v1",
        "InferencePool",
        "an Inference Extension CRD: checked against its CRD's fields (helm_chart/crd.rs)",
    ),
];

/// API versions newer than the oldest Kubernetes checked: an object of one is validated from
/// its first version on, and below it the schemas' "no schema" is the expected answer.
pub const SINCE: &[(&str, &str, &str)] = &[("autoscaling/v2", "HorizontalPodAutoscaler", "1.23.0")];

/// `a` before `b`, for `MAJOR.MINOR.PATCH` versions.
fn version_before(a: &str, b: &str) -> bool {
    let parts = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a) < parts(b)
}
/// One validator run at most this long (they take well under a second).
const DEADLINE: Duration = Duration::from_secs(120);

/// An object of a manifest, as the file says it.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

impl Object {
    /// How the tool names it: `deployment/pg-prefixgate`.
    fn resource(&self) -> String {
        format!("{}/{}", self.kind.to_lowercase(), self.name)
    }

    /// Whether Kubernetes `version` predates this object's API version ([`SINCE`]).
    fn predates(&self, version: &str) -> bool {
        SINCE.iter().any(|(api, kind, since)| {
            *api == self.api_version && *kind == self.kind && version_before(version, since)
        })
    }

    fn skip_reason(&self) -> Option<&'static str> {
        SKIPPED
            .iter()
            .find(|(api, kind, _)| *api == self.api_version && *kind == self.kind)
            .map(|(_, _, reason)| *reason)
    }
}

/// What the tool said of one object.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Passed { resource: String },
    Refused { resource: String, message: String },
    NoSchema { kind: String, api_version: String },
}

/// The tool's report on `file`, one verdict per line; a line of any other shape (a file it
/// could not read, a version it does not bundle) is returned as the error.
pub fn parse_report(stdout: &str, file: &str) -> Result<Vec<Verdict>, String> {
    let mut verdicts = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let verdict = if let Some(rest) = line.strip_prefix(&format!("INFO {file} ")) {
            rest.strip_prefix("passed for resource ")
                .and_then(|r| r.rsplit_once(" against version "))
                .map(|(resource, _)| Verdict::Passed {
                    resource: resource.to_owned(),
                })
        } else if let Some(rest) = line.strip_prefix(&format!("ERROR {file} ")) {
            rest.strip_prefix("did not validate for resource ")
                .and_then(|r| r.split_once(" against version "))
                .and_then(|(resource, r)| Some((resource, r.split_once(": ")?.1)))
                .map(|(resource, message)| Verdict::Refused {
                    resource: resource.to_owned(),
                    message: message.to_owned(),
                })
        } else if let Some(rest) = line.strip_prefix(&format!("WARN {file} ")) {
            rest.strip_prefix("Couldn't find schema for kind ")
                .and_then(|r| r.split_once(" with api version "))
                .and_then(|(kind, r)| Some((kind, r.split_once(" for kubernetes version ")?.0)))
                .map(|(kind, api_version)| Verdict::NoSchema {
                    kind: kind.to_owned(),
                    api_version: api_version.to_owned(),
                })
        } else {
            None
        };
        verdicts.push(verdict.ok_or_else(|| line.to_owned())?);
    }
    Ok(verdicts)
}

/// Runs the validator release `schemas` names with `args`; its output.
pub async fn kubernetes_validate(schemas: &Schemas, args: &[&str]) -> std::process::Output {
    let (env, release) = (schemas.env, schemas.release);
    let tool = std::env::var(env).unwrap_or_else(|_| {
        panic!(
            "{env} is not set: name a kubernetes-validate {release} binary (`pip install \
             kubernetes-validate=={release}` puts one in a venv's bin/, as .ci/run does)"
        )
    });
    let run = tokio::process::Command::new(&tool)
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(DEADLINE, run)
        .await
        .unwrap_or_else(|_| panic!("{tool} {args:?} ran past {DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("cannot run {tool} ({env}): {e}"))
}

/// Validates `file`, whose objects are `objects` in file order, with `--strict` against
/// every version of [`SCHEMAS`]; the failures, each naming `label`, the object and the
/// reason (empty: every object is valid or skipped by [`SKIPPED`]).
pub async fn check(label: &str, file: &Path, objects: &[Object]) -> Vec<String> {
    let path = file.to_str().expect("a UTF-8 path");
    let mut failures = Vec::new();
    let versions = SCHEMAS
        .iter()
        .flat_map(|s| s.kubernetes.iter().map(move |v| (s, *v)));
    for (schemas, version) in versions {
        let output = kubernetes_validate(schemas, &["--strict", "-k", version, path]).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tool = format!("{label}: kubernetes-validate --strict -k {version}");
        let verdicts = match parse_report(&stdout, path) {
            Ok(verdicts) if verdicts.len() == objects.len() => verdicts,
            Ok(verdicts) => {
                failures.push(format!(
                    "{tool}: {} verdicts for {} objects {objects:?}:\n{stdout}{stderr}",
                    verdicts.len(),
                    objects.len()
                ));
                continue;
            }
            Err(line) => {
                failures.push(format!("{tool}: unexpected report `{line}`\n{stderr}"));
                continue;
            }
        };
        let mut refused = false;
        for (object, verdict) in objects.iter().zip(verdicts) {
            let (kind, name) = (&object.kind, &object.name);
            match verdict {
                Verdict::Passed { resource } if resource != object.resource() => {
                    failures.push(format!("{tool}: {kind} {name} reported as {resource}"))
                }
                Verdict::Passed { .. } => {
                    if object.skip_reason().is_some() {
                        failures.push(format!(
                            "{tool}: the schemas know {kind} ({}) now: drop it from SKIPPED",
                            object.api_version
                        ));
                    }
                }
                Verdict::Refused { resource, message } => {
                    refused = true;
                    let named = if resource == object.resource() {
                        format!("{kind} {name}")
                    } else {
                        format!("{kind} {name} (reported as {resource})")
                    };
                    failures.push(format!("{tool}: {named} is refused: {message}"));
                }
                Verdict::NoSchema {
                    kind: reported,
                    api_version,
                } => {
                    if reported != *kind || api_version != object.api_version {
                        failures.push(format!(
                            "{tool}: {kind} {name} reported as {api_version} {reported}"
                        ));
                    } else if object.skip_reason().is_none() && !object.predates(version) {
                        failures.push(format!(
                            "{tool}: no schema for {kind} {name} ({api_version}): a misspelt \
                             kind or apiVersion, or a kind to list in SKIPPED with its reason"
                        ));
                    }
                }
            }
        }
        if output.status.success() == refused {
            failures.push(format!(
                "{tool}: exit status {} with {} refusal:\n{stdout}{stderr}",
                output.status,
                if refused { "a" } else { "no" }
            ));
        }
    }
    failures
}

/// The objects of a YAML file as our manifests write them (block style): per document
/// (`---` lines apart), `apiVersion:` and `kind:` at the left margin and the `name:` of
/// `metadata:` two columns in. Documents without a `kind:` line (comments only) are skipped,
/// as the validator skips empty documents.
pub fn objects_in(yaml: &str, file: &str) -> Vec<Object> {
    let mut objects = Vec::new();
    let mut document: Vec<&str> = Vec::new();
    for line in yaml.lines().chain(["---"]) {
        if line.trim_end() != "---" {
            document.push(line);
            continue;
        }
        let value = |key: &str| {
            document.iter().find_map(|l| {
                let value = l.strip_prefix(key)?.strip_prefix(':')?.trim();
                Some(value.trim_matches(['"', '\'']).to_owned())
            })
        };
        if let Some(kind) = value("kind") {
            let name = document
                .iter()
                .skip_while(|l| l.trim_end() != "metadata:")
                .skip(1)
                .take_while(|l| l.starts_with(' ') || l.trim().is_empty())
                .find_map(|l| l.strip_prefix("  name:"))
                .map(|n| n.trim().trim_matches(['"', '\'']).to_owned());
            let (Some(api_version), Some(name)) = (value("apiVersion"), name) else {
                panic!("{file}: a {kind} without an apiVersion or metadata.name as block lines");
            };
            objects.push(Object {
                api_version,
                kind,
                name,
            });
        }
        document.clear();
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::{Object, Verdict, objects_in, parse_report};

    #[test]
    fn the_report_is_read_line_by_line() {
        let report = "INFO f.yaml passed for resource service/s against version 1.25\n\
             ERROR f.yaml did not validate for resource deployment/d against version 1.25: \
             spec.replicas: 'two' is not of type 'integer', 'null'\n\
             WARN f.yaml Couldn't find schema for kind ServiceMonitor with api version \
             monitoring.coreos.com/v1 for kubernetes version 1.25\n";
        let verdicts = parse_report(report, "f.yaml").unwrap();
        assert_eq!(
            verdicts,
            [
                Verdict::Passed {
                    resource: "service/s".into()
                },
                Verdict::Refused {
                    resource: "deployment/d".into(),
                    message: "spec.replicas: 'two' is not of type 'integer', 'null'".into()
                },
                Verdict::NoSchema {
                    kind: "ServiceMonitor".into(),
                    api_version: "monitoring.coreos.com/v1".into()
                },
            ]
        );
        let fatal = "FATAL kubernetes-validate 1.37.0 does not support kubernetes version 1.38";
        assert_eq!(parse_report(fatal, "f.yaml"), Err(fatal.to_owned()));
        let other_file = "INFO g.yaml passed for resource service/s against version 1.25";
        assert!(parse_report(other_file, "f.yaml").is_err());
    }

    #[test]
    fn objects_are_read_per_document() {
        let yaml = "# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  \
                    labels:\n    name: not-this\n  name: \"svc\"\nspec:\n  name: nor-this\n\
                    ---\n---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: sts\n";
        let object = |api: &str, kind: &str, name: &str| Object {
            api_version: api.into(),
            kind: kind.into(),
            name: name.into(),
        };
        assert_eq!(
            objects_in(yaml, "f.yaml"),
            [
                object("v1", "Service", "svc"),
                object("apps/v1", "StatefulSet", "sts")
            ]
        );
    }
}
