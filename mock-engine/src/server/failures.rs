//! Failure injection: what a replica does wrong on purpose, and the grammar that asks for it.
//!
//! A [`FailureSpec`] is parsed from the `x-mock-fail` request header or the `--fail` flag:
//! directives separated by `;`, each `name` or `name=value`, whitespace ignored:
//!
//! | directive | effect |
//! |---|---|
//! | `status=CODE` | answer with HTTP `CODE` (400..=599) and a vLLM-shaped error body |
//! | `abort-after=N` | drop the connection after `N` generated tokens (no `[DONE]`) |
//! | `stall-after=N` | after `N` generated tokens send nothing more, the connection open (a hung engine) |
//! | `hang` | never send a byte; the request waits until the client leaves |
//! | `slow-start=SECONDS` | wait this long (engine seconds) before admitting the request |
//! | `none` | no failure (lets a header switch off a flag-wide plan for one request) |
//!
//! Durations are engine seconds, scaled by `--time-scale` like every other duration. A
//! [`FailurePlan`] applies a spec to a fraction of requests and can hold `/health` at 503 for
//! a while after start. This module decides *what* fails; the request handlers act on it.

use std::fmt;

use rand::Rng;
use thiserror::Error;

/// The name of the per-request failure header.
pub const FAIL_HEADER: &str = "x-mock-fail";

/// One request's injected failure. `Default` is "no failure".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureSpec {
    /// Answer with this status and a vLLM-shaped error body instead of generating.
    pub status: Option<u16>,
    /// Drop the connection after this many generated tokens.
    pub abort_after: Option<u32>,
    /// Go silent after this many generated tokens, the connection left open.
    pub stall_after: Option<u32>,
    /// Never answer.
    pub hang: bool,
    /// Engine seconds to wait before the request is admitted.
    pub slow_start: Option<f64>,
}

/// Why a failure spec could not be parsed; the message names the offending directive.
#[derive(Debug, Error, PartialEq)]
pub enum FailureSpecError {
    #[error(
        "unknown failure directive `{0}` (expected status=CODE, abort-after=N, stall-after=N, hang, slow-start=SECONDS or none)"
    )]
    UnknownDirective(String),
    #[error("failure directive `{0}` needs a value")]
    MissingValue(String),
    #[error("failure directive `{0}` takes no value")]
    UnexpectedValue(String),
    #[error("invalid value `{value}` for `{directive}`: {reason}")]
    InvalidValue {
        directive: String,
        value: String,
        reason: &'static str,
    },
    #[error("failure directive `{0}` given twice")]
    Duplicate(String),
}

impl FailureSpec {
    /// True when this spec changes nothing.
    pub fn is_none(&self) -> bool {
        *self == FailureSpec::default()
    }

    /// Parses the `;`-separated grammar in the module documentation.
    pub fn parse(text: &str) -> Result<FailureSpec, FailureSpecError> {
        let mut spec = FailureSpec::default();
        for raw in text.split(';') {
            let directive = raw.trim();
            if directive.is_empty() {
                continue;
            }
            let (name, value) = match directive.split_once('=') {
                Some((name, value)) => (name.trim(), Some(value.trim())),
                None => (directive, None),
            };
            match name {
                "none" => no_value(name, value)?,
                "hang" => {
                    no_value(name, value)?;
                    if spec.hang {
                        return Err(FailureSpecError::Duplicate(name.to_owned()));
                    }
                    spec.hang = true;
                }
                "status" => {
                    let code = parse_value::<u16>(name, value, "expected an HTTP status")?;
                    if !(400..=599).contains(&code) {
                        return Err(invalid(name, value, "status must be within 400..=599"));
                    }
                    set_once(&mut spec.status, name, code)?;
                }
                "abort-after" => {
                    let n = parse_value::<u32>(name, value, "expected a token count")?;
                    set_once(&mut spec.abort_after, name, n)?;
                }
                "stall-after" => {
                    let n = parse_value::<u32>(name, value, "expected a token count")?;
                    set_once(&mut spec.stall_after, name, n)?;
                }
                "slow-start" => {
                    let secs = parse_value::<f64>(name, value, "expected seconds")?;
                    if !(secs.is_finite() && secs >= 0.0) {
                        return Err(invalid(name, value, "seconds must be finite and >= 0"));
                    }
                    set_once(&mut spec.slow_start, name, secs)?;
                }
                _ => return Err(FailureSpecError::UnknownDirective(name.to_owned())),
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for FailureSpec {
    /// Writes the spec back in the header grammar (`none` when empty).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(code) = self.status {
            parts.push(format!("status={code}"));
        }
        if let Some(n) = self.abort_after {
            parts.push(format!("abort-after={n}"));
        }
        if let Some(n) = self.stall_after {
            parts.push(format!("stall-after={n}"));
        }
        if self.hang {
            parts.push("hang".to_owned());
        }
        if let Some(secs) = self.slow_start {
            parts.push(format!("slow-start={secs}"));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(";"))
        }
    }
}

fn no_value(name: &str, value: Option<&str>) -> Result<(), FailureSpecError> {
    match value {
        Some(_) => Err(FailureSpecError::UnexpectedValue(name.to_owned())),
        None => Ok(()),
    }
}

fn parse_value<T: std::str::FromStr>(
    name: &str,
    value: Option<&str>,
    reason: &'static str,
) -> Result<T, FailureSpecError> {
    let value = value.ok_or_else(|| FailureSpecError::MissingValue(name.to_owned()))?;
    value
        .parse()
        .map_err(|_| invalid(name, Some(value), reason))
}

fn invalid(name: &str, value: Option<&str>, reason: &'static str) -> FailureSpecError {
    FailureSpecError::InvalidValue {
        directive: name.to_owned(),
        value: value.unwrap_or_default().to_owned(),
        reason,
    }
}

fn set_once<T>(slot: &mut Option<T>, name: &str, value: T) -> Result<(), FailureSpecError> {
    if slot.is_some() {
        return Err(FailureSpecError::Duplicate(name.to_owned()));
    }
    *slot = Some(value);
    Ok(())
}

/// A replica's standing failure plan. `Default` fails nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct FailurePlan {
    /// What a failing request does.
    pub spec: FailureSpec,
    /// Fraction of requests (0..=1) that get `spec`; requests with an `x-mock-fail` header
    /// use the header instead.
    pub rate: f64,
    /// Engine seconds after start during which `/health` answers 503.
    pub health_fail_for: Option<f64>,
}

impl Default for FailurePlan {
    fn default() -> Self {
        FailurePlan {
            spec: FailureSpec::default(),
            rate: 1.0,
            health_fail_for: None,
        }
    }
}

impl FailurePlan {
    /// The spec for one request without a header: `spec` with probability `rate`.
    pub fn draw(&self, rng: &mut impl Rng) -> FailureSpec {
        if self.spec.is_none() || self.rate <= 0.0 {
            return FailureSpec::default();
        }
        if self.rate >= 1.0 || rng.random_bool(self.rate) {
            self.spec.clone()
        } else {
            FailureSpec::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn parses_every_directive_and_combinations() {
        let spec =
            FailureSpec::parse(" status=503 ; abort-after=5;stall-after=7;hang; slow-start=2.5 ")
                .unwrap();
        assert_eq!(
            spec,
            FailureSpec {
                status: Some(503),
                abort_after: Some(5),
                stall_after: Some(7),
                hang: true,
                slow_start: Some(2.5),
            }
        );
        assert_eq!(
            spec.to_string(),
            "status=503;abort-after=5;stall-after=7;hang;slow-start=2.5"
        );
        assert!(FailureSpec::parse("none").unwrap().is_none());
        assert!(FailureSpec::parse("").unwrap().is_none());
    }

    #[test]
    fn rejects_bad_specs_naming_the_problem() {
        let cases = [
            ("explode", "unknown failure directive `explode`"),
            ("status", "`status` needs a value"),
            ("status=abc", "invalid value `abc` for `status`"),
            ("status=200", "within 400..=599"),
            ("hang=1", "`hang` takes no value"),
            ("slow-start=-1", "finite and >= 0"),
            ("slow-start=NaN", "finite and >= 0"),
            ("abort-after=-3", "invalid value `-3` for `abort-after`"),
            ("stall-after", "`stall-after` needs a value"),
            ("status=500;status=503", "`status` given twice"),
        ];
        for (text, needle) in cases {
            let err = FailureSpec::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn plan_draws_by_rate() {
        let mut rng = StdRng::seed_from_u64(7);
        let failing = FailureSpec::parse("status=500").unwrap();
        let never = FailurePlan {
            spec: failing.clone(),
            rate: 0.0,
            health_fail_for: None,
        };
        let always = FailurePlan {
            rate: 1.0,
            ..never.clone()
        };
        let half = FailurePlan {
            rate: 0.5,
            ..never.clone()
        };
        assert!(never.draw(&mut rng).is_none());
        assert_eq!(always.draw(&mut rng), failing);
        let hits = (0..1000).filter(|_| !half.draw(&mut rng).is_none()).count();
        assert!((350..650).contains(&hits), "{hits}");
        assert!(FailurePlan::default().draw(&mut rng).is_none());
    }
}
