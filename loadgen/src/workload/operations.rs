//! The operations file (`config/operations.toml`, SPEC §5.4) and its validation into phases a
//! runner can send without further checks.
//!
//! A phase is open loop (`stages` of `{duration, rps}` arrivals, with an optional client-side
//! `inflight_cap` that drops arrivals over it) or closed loop (`concurrency` senders for a
//! `duration`), sent as one tenant (`A`) or a round-robin mix of `tenants`, each with its own
//! prompt size (`repeat`) and output. `replicas` and `admission` describe the local stack the
//! phase needs (`loadgen operations --local`), and `drain` / `scale_up` the cluster events it
//! scripts there ([`super::cluster_events`]); `cluster_only` marks phases whose point is a
//! cluster event this loadgen cannot cause: they are skipped unless named with `--phases`. What is sent when lives in [`super::arrivals`]. No I/O beyond
//! [`Operations::load`] reading its file.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use router_core::Strategy;
use serde::Deserialize;

use super::admission::AdmissionSpec;
use super::cluster_events::{DrainDef, ScaleUpDef, validate_events};

/// The operations file shipped in `config/operations.toml`, embedded so the binary runs
/// anywhere.
pub const OPERATIONS: &str = include_str!("../../../config/operations.toml");

/// Most arrivals (or closed-loop requests) one phase may plan: a typo such as `rps = 1600`
/// is refused instead of spawning millions of tasks.
pub const MAX_PHASE_REQUESTS: usize = 100_000;

/// The tenant a phase without `tenants` sends as (the seed reports such phases as tenant `A`).
pub const DEFAULT_TENANT: &str = "A";

/// The file as written (unknown keys are errors).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationsFile {
    /// Seeds prompt text and Poisson arrivals.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// The request header that names the tenant (the gateway's `admission.tenant_header`).
    #[serde(default = "default_tenant_header")]
    pub tenant_header: String,
    pub phase: Vec<PhaseDef>,
}

fn default_seed() -> u64 {
    104
}

fn default_tenant_header() -> String {
    "x-tenant".to_owned()
}

/// One arrival stage: `rps` requests per second for `duration` seconds (engine time).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    pub duration: f64,
    pub rps: f64,
}

/// How arrivals are spaced inside a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArrivalProcess {
    /// `1/rps` apart, `round(duration × rps)` per stage (the seed's counts: 12 + 384 + 18).
    #[default]
    Constant,
    /// Exponential gaps of mean `1/rps`, seeded by (file seed, phase name).
    Poisson,
}

/// One tenant's request shape.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantDef {
    pub repeat: Option<u32>,
    pub output: Option<u32>,
}

/// One `[[phase]]` table as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseDef {
    pub name: String,
    /// Prompt size: `16 × repeat` words plus a 30–40-word tail (with the chat template, the
    /// seed's 512–522 prompt tokens at 30).
    pub repeat: Option<u32>,
    /// `max_tokens` (with `ignore_eos`).
    pub output: Option<u32>,
    /// The `routing-strategy` header; without it the gateway's default decides.
    pub route: Option<String>,
    /// Open loop: arrivals while the client has this many requests in flight are dropped.
    pub inflight_cap: Option<usize>,
    pub stages: Option<Vec<Stage>>,
    #[serde(default)]
    pub arrival: ArrivalProcess,
    /// Closed loop: this many senders, each sending its next request when one ends.
    pub concurrency: Option<usize>,
    /// Closed loop: seconds during which new requests start.
    pub duration: Option<f64>,
    /// All requests of a tenant share their `16 × repeat`-token prefix.
    #[serde(default)]
    pub shared_prefix: bool,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantDef>,
    /// Local mode: replicas for this phase (default: `--replicas`).
    pub replicas: Option<usize>,
    /// Local mode: the gateway's admission settings for this phase ([`AdmissionSpec`]).
    pub admission: Option<AdmissionSpec>,
    /// Local mode: a replica drained during the phase (`super::cluster_events`).
    pub drain: Option<DrainDef>,
    /// Local mode: replicas added during the phase (an autoscaler's decision, scripted).
    pub scale_up: Option<ScaleUpDef>,
    /// Why the phase needs a real cluster; such phases run only when named by `--phases`.
    pub cluster_only: Option<String>,
    /// Free text for the reader of the file.
    pub note: Option<String>,
}

/// A phase's traffic: open or closed loop.
#[derive(Debug, Clone, PartialEq)]
pub enum Load {
    Open {
        stages: Vec<Stage>,
        arrival: ArrivalProcess,
        /// 0: no cap.
        inflight_cap: usize,
    },
    Closed {
        concurrency: usize,
        duration: f64,
    },
}

impl Load {
    /// The phase's length in engine seconds: the stages' sum (open loop) or the duration
    /// during which requests start (closed loop).
    pub fn span(&self) -> f64 {
        match self {
            Load::Open { stages, .. } => stages.iter().map(|s| s.duration).sum(),
            Load::Closed { duration, .. } => *duration,
        }
    }
}

/// One tenant of a phase, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantShape {
    pub name: String,
    pub repeat: u32,
    pub output: u32,
}

/// A validated phase.
#[derive(Debug, Clone, PartialEq)]
pub struct OperationsPhase {
    /// The table as written (echoed into the result's `config`).
    pub def: PhaseDef,
    pub seed: u64,
    pub route: Option<Strategy>,
    pub load: Load,
    /// Requests go to tenants round-robin in this (name) order.
    pub tenants: Vec<TenantShape>,
}

/// An operations file that cannot be used; the message names the file, phase or field.
#[derive(Debug, thiserror::Error)]
pub enum OperationsError {
    #[error("cannot read operations file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("operations file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("operations: {0}")]
    Invalid(String),
}

/// A validated operations file.
#[derive(Debug, Clone)]
pub struct Operations {
    pub tenant_header: String,
    pub phases: Vec<OperationsPhase>,
}

impl Operations {
    /// Reads and validates an operations file.
    pub fn load(path: &Path) -> Result<Operations, OperationsError> {
        let text = std::fs::read_to_string(path).map_err(|source| OperationsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// The built-in `config/operations.toml`.
    pub fn builtin() -> Result<Operations, OperationsError> {
        Self::from_toml_str(OPERATIONS, "config/operations.toml (built in)")
    }

    /// Parses and validates operations text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Operations, OperationsError> {
        let file: OperationsFile = toml::from_str(text).map_err(|e| OperationsError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })?;
        if http::HeaderName::from_str(&file.tenant_header).is_err() {
            return Err(OperationsError::Invalid(format!(
                "tenant_header {:?} is not a valid header name",
                file.tenant_header
            )));
        }
        if file.phase.is_empty() {
            return Err(OperationsError::Invalid(
                "at least one [[phase]] is required".into(),
            ));
        }
        let mut phases: Vec<OperationsPhase> = Vec::with_capacity(file.phase.len());
        for def in &file.phase {
            if phases.iter().any(|p| p.def.name == def.name) {
                return Err(OperationsError::Invalid(format!(
                    "phase {:?} is defined twice",
                    def.name
                )));
            }
            let phase = validate(def, file.seed, &file.tenant_header)
                .map_err(|m| OperationsError::Invalid(format!("phase {:?}: {m}", def.name)))?;
            phases.push(phase);
        }
        Ok(Operations {
            tenant_header: file.tenant_header,
            phases,
        })
    }

    /// The phases to run: the named ones in file order (every name must exist), or without
    /// names every phase that is not `cluster_only`.
    pub fn select(&self, names: &[String]) -> Result<Vec<OperationsPhase>, OperationsError> {
        if names.is_empty() {
            return Ok(self
                .phases
                .iter()
                .filter(|p| p.def.cluster_only.is_none())
                .cloned()
                .collect());
        }
        if let Some(unknown) = names
            .iter()
            .find(|n| !self.phases.iter().any(|p| &p.def.name == *n))
        {
            let known: Vec<&str> = self.phases.iter().map(|p| p.def.name.as_str()).collect();
            return Err(OperationsError::Invalid(format!(
                "--phases: no phase {unknown:?} (phases: {})",
                known.join(", ")
            )));
        }
        Ok(self
            .phases
            .iter()
            .filter(|p| names.contains(&p.def.name))
            .cloned()
            .collect())
    }
}

fn positive(value: f64, what: &str) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(format!("{what} must be > 0 seconds, got {value}"))
    }
}

fn validate(def: &PhaseDef, seed: u64, tenant_header: &str) -> Result<OperationsPhase, String> {
    if def.name.trim().is_empty() {
        return Err("name must not be empty".into());
    }
    let route = def
        .route
        .as_deref()
        .map(|r| Strategy::from_str(r).map_err(|e| format!("route: {e}")))
        .transpose()?;
    let load = match (&def.stages, def.concurrency, def.duration) {
        (Some(stages), None, None) => {
            if stages.is_empty() {
                return Err("stages must not be empty".into());
            }
            let mut planned = 0.0;
            for (i, s) in stages.iter().enumerate() {
                positive(s.duration, &format!("stages[{i}].duration"))?;
                if !(s.rps.is_finite() && s.rps >= 0.0) {
                    return Err(format!("stages[{i}].rps must be >= 0, got {}", s.rps));
                }
                planned += s.duration * s.rps;
            }
            if planned > MAX_PHASE_REQUESTS as f64 {
                return Err(format!(
                    "stages plan {planned:.0} arrivals, more than {MAX_PHASE_REQUESTS}"
                ));
            }
            let inflight_cap = def.inflight_cap.unwrap_or(0);
            if inflight_cap > MAX_PHASE_REQUESTS {
                return Err(format!("inflight_cap must be <= {MAX_PHASE_REQUESTS}"));
            }
            Load::Open {
                stages: stages.clone(),
                arrival: def.arrival,
                inflight_cap,
            }
        }
        (None, Some(concurrency), Some(duration)) => {
            if !(1..=1024).contains(&concurrency) {
                return Err(format!("concurrency must be 1..=1024, got {concurrency}"));
            }
            if def.inflight_cap.is_some() || def.arrival != ArrivalProcess::Constant {
                return Err("inflight_cap and arrival apply to stages only".into());
            }
            Load::Closed {
                concurrency,
                duration: positive(duration, "duration")?,
            }
        }
        _ => {
            return Err(
                "give either stages (open loop) or concurrency and duration (closed loop)".into(),
            );
        }
    };
    let resolve = |name: &str, t: Option<&TenantDef>| -> Result<TenantShape, String> {
        let repeat = t.and_then(|t| t.repeat).or(def.repeat);
        let output = t.and_then(|t| t.output).or(def.output);
        match (repeat, output) {
            (Some(repeat @ 1..=4096), Some(output @ 1..=65536)) => Ok(TenantShape {
                name: name.to_owned(),
                repeat,
                output,
            }),
            (Some(_), Some(_)) => Err(format!(
                "tenant {name}: repeat must be 1..=4096 and output 1..=65536"
            )),
            _ => Err(format!(
                "tenant {name}: repeat and output must be given (on the tenant or the phase)"
            )),
        }
    };
    let tenants = if def.tenants.is_empty() {
        vec![resolve(DEFAULT_TENANT, None)?]
    } else {
        def.tenants
            .iter()
            .map(|(name, t)| {
                if name.is_empty() || name.len() > 128 || http::HeaderValue::from_str(name).is_err()
                {
                    return Err(format!("tenant name {name:?} cannot be sent as a header"));
                }
                resolve(name, Some(t))
            })
            .collect::<Result<_, _>>()?
    };
    if def.replicas.is_some_and(|n| !(1..=64).contains(&n)) {
        return Err("replicas must be 1..=64".into());
    }
    validate_events(def.drain.as_ref(), def.scale_up.as_ref(), load.span())?;
    if let Some(admission) = &def.admission
        && let Some(header) = &admission.tenant_header
        && header != tenant_header
    {
        return Err(format!(
            "admission.tenant_header {header:?} differs from the file's tenant_header {tenant_header:?}"
        ));
    }
    Ok(OperationsPhase {
        def: def.clone(),
        seed,
        route,
        load,
        tenants,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::cluster_events::DrainKind;

    fn parse(text: &str) -> Result<Operations, OperationsError> {
        Operations::from_toml_str(text, "test")
    }

    #[test]
    fn the_builtin_file_has_the_seed_phases_with_their_drains() {
        let ops = Operations::builtin().unwrap();
        let names: Vec<&str> = ops.phases.iter().map(|p| p.def.name.as_str()).collect();
        let seed: serde_json::Value =
            serde_json::from_str(include_str!("../../testdata/operations-phases.json")).unwrap();
        let seed_names: Vec<&str> = seed["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["phase"].as_str().unwrap())
            .collect();
        assert_eq!(names, seed_names);
        let default: Vec<String> = ops
            .select(&[])
            .unwrap()
            .into_iter()
            .map(|p| p.def.name)
            .collect();
        assert_eq!(
            default.len(),
            names.len(),
            "no phase is cluster-only any more"
        );
        let protected = &ops.phases[7];
        assert_eq!(protected.tenants.len(), 2);
        assert_eq!(
            (protected.tenants[1].repeat, protected.tenants[1].output),
            (90, 512)
        );
        let admission = protected.def.admission.as_ref().unwrap();
        assert_eq!(admission.tenants["B"].max_in_flight, 2);
        let drains: Vec<(DrainKind, f64)> = ops.phases[4..6]
            .iter()
            .map(|p| {
                let drain = p.def.drain.as_ref().expect("a drain phase drains");
                (drain.kind, drain.at)
            })
            .collect();
        assert_eq!(
            drains,
            [(DrainKind::Native, 60.0), (DrainKind::Graceful, 60.0)]
        );
    }

    #[test]
    fn the_scaling_file_scales_up_and_down() {
        let text = include_str!("../../../config/operations-scaling.toml");
        let ops = Operations::from_toml_str(text, "operations-scaling.toml").unwrap();
        let names: Vec<&str> = ops.phases.iter().map(|p| p.def.name.as_str()).collect();
        assert_eq!(names, ["scale-up", "scale-down"]);
        let scale = ops.phases[0].def.scale_up.as_ref().expect("scale-up adds");
        assert_eq!((scale.at, scale.add), (90.0, 1));
        let drain = ops.phases[1].def.drain.as_ref().expect("scale-down drains");
        assert_eq!(
            (drain.kind, drain.replica.as_deref()),
            (DrainKind::Graceful, None)
        );
    }

    #[test]
    fn a_drain_outside_the_phase_is_refused_naming_the_key() {
        let text = "[[phase]]\nname = \"d\"\nrepeat = 1\noutput = 1\nconcurrency = 1\nduration = 10\ndrain = { at = 10, kind = \"native\" }\n";
        let error = parse(text).unwrap_err().to_string();
        assert!(error.contains("drain.at") && error.contains('d'), "{error}");
    }

    #[test]
    fn bad_phases_are_refused_with_the_phase_and_field_named() {
        let cases = [
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\n",
                "either stages",
            ),
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nstages = [{duration = 0, rps = 1}]\n",
                "stages[0].duration",
            ),
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nstages = [{duration = 10, rps = 1e9}]\n",
                "arrivals",
            ),
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\nconcurrency = 2\nduration = 5\n",
                "tenant A: repeat and output",
            ),
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nconcurrency = 2\nduration = 5\nroute = \"nope\"\n",
                "route",
            ),
            (
                "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nconcurrency = 2\nduration = 5\nsurprise = 1\n",
                "surprise",
            ),
            (
                "tenant_header = \"x-t\"\n[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nconcurrency = 2\nduration = 5\n[phase.admission]\ntenant_header = \"x-other\"\n",
                "admission.tenant_header",
            ),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{expected:?} not in {err}");
        }
        let twice =
            "[[phase]]\nname = \"a\"\nrepeat = 1\noutput = 1\nconcurrency = 1\nduration = 1\n";
        let err = parse(&format!("{twice}{twice}")).unwrap_err().to_string();
        assert!(err.contains("defined twice"), "{err}");
        let ops = parse(twice).unwrap();
        let err = ops.select(&["b".into()]).unwrap_err().to_string();
        assert!(
            err.contains("no phase \"b\"") && err.contains("phases: a"),
            "{err}"
        );
    }
}
