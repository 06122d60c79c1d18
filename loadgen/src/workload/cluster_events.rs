//! Cluster events an operations phase scripts (local mode): a replica that leaves during the
//! load (a drain: a rollout, a node drain, an autoscaler's scale-down) and replicas that join
//! (an autoscaler's scale-up). What they are and when, checked; the local runner
//! (`run/operations/events.rs`) makes them happen.
//!
//! ```toml
//! drain = { at = 60, kind = "native" }              # the engine gets SIGTERM; the gateway
//!                                                   # learns from refused connections
//! drain = { at = 60, kind = "graceful", replica = "L20-B" }   # it leaves the gateway's set
//!                                                   # first (admin drain), then stops
//! drain = { at = 60, kind = "native", grace = 0 }   # the engine cuts its streams at once
//! scale_up = { at = 90, add = 1 }                   # a new replica joins the gateway's set
//! ```
//! Times are engine seconds from the phase's start.

use serde::Deserialize;

/// How the replica leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainKind {
    /// Kubernetes without a preStop hook: the engine gets SIGTERM (refuses connections,
    /// finishes or cuts its streams); the gateway learns only from refused connections and
    /// failed probes.
    Native,
    /// With a preStop hook, or a pod seen terminating by the watch: the replica leaves the
    /// gateway's set first (no new request; its requests finish), then the engine stops.
    Graceful,
}

impl DrainKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainKind::Native => "native",
            DrainKind::Graceful => "graceful",
        }
    }
}

/// A replica drained during the phase.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainDef {
    /// Engine seconds after the phase's start.
    pub at: f64,
    pub kind: DrainKind,
    /// The replica (default: the last one, a StatefulSet's highest ordinal, which is the pod
    /// a scale-down removes).
    #[serde(default)]
    pub replica: Option<String>,
    /// The engine's own deadline for its streams after SIGTERM, engine seconds (vLLM 0.18's
    /// `--shutdown-timeout`; 0 aborts them at once, its default). Without it they run to
    /// their end, as in vLLM 0.11, where only the pod's SIGKILL would cut them.
    #[serde(default)]
    pub grace: Option<f64>,
}

/// Replicas added during the phase (an autoscaler's decision, scripted).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleUpDef {
    /// Engine seconds after the phase's start.
    pub at: f64,
    /// How many replicas join (1..=16).
    pub add: usize,
}

/// Checks the events against the phase's length (`span`, engine seconds: the closed loop's
/// duration or the stages' sum); names the key that is wrong.
pub fn validate_events(
    drain: Option<&DrainDef>,
    scale_up: Option<&ScaleUpDef>,
    span: f64,
) -> Result<(), String> {
    let within = |key: &str, at: f64| {
        if at.is_finite() && (0.0..span).contains(&at) {
            Ok(())
        } else {
            Err(format!(
                "{key}.at must be within the phase's {span} s, got {at}"
            ))
        }
    };
    if let Some(drain) = drain {
        within("drain", drain.at)?;
        if let Some(grace) = drain.grace
            && !(grace.is_finite() && grace >= 0.0)
        {
            return Err(format!("drain.grace must be >= 0 seconds, got {grace}"));
        }
        if drain
            .replica
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            return Err("drain.replica must not be empty".into());
        }
    }
    if let Some(scale) = scale_up {
        within("scale_up", scale.at)?;
        if !(1..=16).contains(&scale.add) {
            return Err(format!("scale_up.add must be 1..=16, got {}", scale.add));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(at: f64) -> DrainDef {
        DrainDef {
            at,
            kind: DrainKind::Native,
            replica: None,
            grace: None,
        }
    }

    #[test]
    fn events_must_fall_inside_the_phase_and_be_sane() {
        assert!(validate_events(Some(&drain(60.0)), None, 180.0).is_ok());
        let late = validate_events(Some(&drain(180.0)), None, 180.0).unwrap_err();
        assert!(late.contains("drain.at") && late.contains("180"), "{late}");
        let mut negative = drain(1.0);
        negative.grace = Some(-1.0);
        assert!(
            validate_events(Some(&negative), None, 180.0)
                .unwrap_err()
                .contains("grace")
        );
        let mut unnamed = drain(1.0);
        unnamed.replica = Some(" ".into());
        assert!(validate_events(Some(&unnamed), None, 180.0).is_err());
        let many = ScaleUpDef { at: 10.0, add: 17 };
        assert!(
            validate_events(None, Some(&many), 180.0)
                .unwrap_err()
                .contains("add")
        );
        let nan = ScaleUpDef {
            at: f64::NAN,
            add: 1,
        };
        assert!(validate_events(None, Some(&nan), 180.0).is_err());
    }

    #[test]
    fn kinds_read_as_written_and_unknown_keys_are_refused() {
        let def: DrainDef = toml::from_str(
            r#"at = 5
kind = "graceful""#,
        )
        .unwrap();
        assert_eq!(def.kind, DrainKind::Graceful);
        assert!(toml::from_str::<DrainDef>("at = 5\nkind = \"sigkill\"").is_err());
        assert!(toml::from_str::<ScaleUpDef>("at = 5\nadd = 1\nmax = 3").is_err());
    }
}
