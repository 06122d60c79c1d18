//! The matrix definition (`config/matrix-24.toml`) and its expansion into phases.
//!
//! The file names rounds, scenarios and routes once; [`Matrix::phases`] expands them in the
//! seed's order (round → scenario → route, routes reversed in rounds that say so) with the
//! seed's names `r{round}-{scenario}-{route}`. Everything is validated here, so runners never
//! see a phase they cannot run. No I/O beyond [`Matrix::load`] reading the file.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use router_core::Strategy;
use serde::Deserialize;

/// The matrix file as written (unknown keys are errors).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixFile {
    /// Routes in round-1 order.
    pub routes: Vec<String>,
    /// Scenario names in run order; each must have a `[scenario.NAME]` table.
    pub scenarios: Vec<String>,
    pub workload: WorkloadShape,
    pub round: Vec<RoundSpec>,
    pub scenario: BTreeMap<String, ScenarioSpec>,
}

/// The request shape shared by every phase.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadShape {
    pub count: usize,
    pub rps: f64,
    pub output: u32,
    /// The seed harness's prompt-size knob; recorded in each phase's `config` for fidelity.
    pub repeat: u32,
    pub families: usize,
    pub prefix_tokens: usize,
    /// Inclusive range of per-request tail lengths (the nonce included).
    pub tail_tokens: [usize; 2],
    pub priming_candidates: usize,
    pub max_setup_attempts: u32,
}

/// One round: a seed and the direction routes run in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundSpec {
    pub number: u32,
    pub seed: u64,
    #[serde(default)]
    pub reverse_routes: bool,
}

/// How the caches are prepared before a phase is measured (SPEC §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priming {
    /// Nothing: every family starts cold.
    None,
    /// Every family primed directly on every replica, then one routed request per family.
    Warm,
    /// Candidate prefixes primed once each through the router; a balanced choice of families.
    Hot,
}

/// One scenario's traffic and priming.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    pub priming: Priming,
    /// Share of the requests that go to family 0 (0 = uniform over all families).
    pub hot_fraction: f64,
}

/// A phase ready to run: everything a runner and the measurement need.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSpec {
    pub name: String,
    pub round: u32,
    pub seed: u64,
    pub scenario: String,
    pub route: Strategy,
    pub priming: Priming,
    pub hot_fraction: f64,
    pub shape: WorkloadShape,
}

/// A matrix file that cannot be used; the message names the file or the field.
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("cannot read matrix file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("matrix file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("matrix: {0}")]
    Invalid(String),
}

/// A validated matrix definition.
#[derive(Debug, Clone)]
pub struct Matrix {
    file: MatrixFile,
    routes: Vec<Strategy>,
}

/// The matrix shipped in `config/matrix-24.toml`, embedded so the binary runs anywhere.
pub const MATRIX_24: &str = include_str!("../../../config/matrix-24.toml");

impl Matrix {
    /// Reads and validates a matrix file.
    pub fn load(path: &Path) -> Result<Matrix, MatrixError> {
        let text = std::fs::read_to_string(path).map_err(|source| MatrixError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses and validates matrix text; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Matrix, MatrixError> {
        let file: MatrixFile = toml::from_str(text).map_err(|e| MatrixError::Parse {
            path: origin.to_owned(),
            message: e.to_string(),
        })?;
        let routes = parse_routes(&file.routes)?;
        let matrix = Matrix { file, routes };
        matrix.validate()?;
        Ok(matrix)
    }

    /// The built-in 24-phase matrix.
    pub fn builtin() -> Result<Matrix, MatrixError> {
        Self::from_toml_str(MATRIX_24, "config/matrix-24.toml (built in)")
    }

    /// Replaces the routes (`--routes a,b,…`), keeping each round's direction.
    pub fn with_routes(mut self, routes: &[String]) -> Result<Matrix, MatrixError> {
        self.routes = parse_routes(routes)?;
        Ok(self)
    }

    /// Keeps only the first `count` requests of each phase (reduced runs and tests).
    pub fn with_count(mut self, count: usize) -> Result<Matrix, MatrixError> {
        self.file.workload.count = count;
        self.validate()?;
        Ok(self)
    }

    /// Sends each phase's requests at `rps` per second instead of the file's rate (the
    /// replica sweeps scale it with the replica count).
    pub fn with_rps(mut self, rps: f64) -> Result<Matrix, MatrixError> {
        self.file.workload.rps = rps;
        self.validate()?;
        Ok(self)
    }

    /// The shared request shape.
    pub fn shape(&self) -> &WorkloadShape {
        &self.file.workload
    }

    /// Every phase in run order.
    pub fn phases(&self) -> Vec<PhaseSpec> {
        let mut phases = Vec::new();
        for round in &self.file.round {
            for scenario in &self.file.scenarios {
                // validate() guarantees the table exists.
                let Some(spec) = self.file.scenario.get(scenario) else {
                    continue;
                };
                let mut routes = self.routes.clone();
                if round.reverse_routes {
                    routes.reverse();
                }
                for route in routes {
                    phases.push(PhaseSpec {
                        name: format!("r{}-{}-{}", round.number, scenario, route.as_str()),
                        round: round.number,
                        seed: round.seed,
                        scenario: scenario.clone(),
                        route,
                        priming: spec.priming,
                        hot_fraction: spec.hot_fraction,
                        shape: self.file.workload.clone(),
                    });
                }
            }
        }
        phases
    }

    fn validate(&self) -> Result<(), MatrixError> {
        let w = &self.file.workload;
        let bad = |m: String| Err(MatrixError::Invalid(m));
        if w.count == 0 {
            return bad("workload.count must be at least 1".into());
        }
        if !(w.rps.is_finite() && w.rps > 0.0) {
            return bad(format!("workload.rps must be > 0, got {}", w.rps));
        }
        if w.output == 0 {
            return bad("workload.output must be at least 1".into());
        }
        if w.families == 0 || w.families > 1024 {
            return bad(format!(
                "workload.families must be 1..=1024, got {}",
                w.families
            ));
        }
        if w.prefix_tokens == 0 || w.prefix_tokens > 1_000_000 {
            return bad(format!(
                "workload.prefix_tokens must be 1..=1000000, got {}",
                w.prefix_tokens
            ));
        }
        let [lo, hi] = w.tail_tokens;
        if lo == 0 || lo > hi || hi > 1_000_000 {
            return bad(format!(
                "workload.tail_tokens must be [min, max] with 1 <= min <= max, got [{lo}, {hi}]"
            ));
        }
        if w.max_setup_attempts == 0 {
            return bad("workload.max_setup_attempts must be at least 1".into());
        }
        if self.file.round.is_empty() {
            return bad("at least one [[round]] is required".into());
        }
        if self.file.scenarios.is_empty() || self.routes.is_empty() {
            return bad("scenarios and routes must not be empty".into());
        }
        for name in &self.file.scenarios {
            let Some(spec) = self.file.scenario.get(name) else {
                return bad(format!("scenario {name:?} has no [scenario.{name}] table"));
            };
            if !(0.0..1.0).contains(&spec.hot_fraction) {
                return bad(format!(
                    "scenario.{name}.hot_fraction must be in [0, 1), got {}",
                    spec.hot_fraction
                ));
            }
            if spec.priming == Priming::Hot {
                if spec.hot_fraction <= 0.0 {
                    return bad(format!(
                        "scenario.{name}: hot priming needs hot_fraction > 0"
                    ));
                }
                if w.priming_candidates < w.families {
                    return bad(format!(
                        "workload.priming_candidates ({}) must be at least workload.families ({})",
                        w.priming_candidates, w.families
                    ));
                }
            }
        }
        Ok(())
    }
}

fn parse_routes(routes: &[String]) -> Result<Vec<Strategy>, MatrixError> {
    if routes.is_empty() {
        return Err(MatrixError::Invalid("routes must not be empty".into()));
    }
    routes
        .iter()
        .map(|r| Strategy::from_str(r.trim()).map_err(|e| MatrixError::Invalid(e.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's phase names, in its order (shared/seeds/matrix-24-phase.json).
    const SEED_ORDER: [&str; 24] = [
        "r1-cold-uniform-random",
        "r1-cold-uniform-least-request",
        "r1-cold-uniform-prefix-cache",
        "r1-warm-uniform-random",
        "r1-warm-uniform-least-request",
        "r1-warm-uniform-prefix-cache",
        "r1-hot50-random",
        "r1-hot50-least-request",
        "r1-hot50-prefix-cache",
        "r1-hot90-random",
        "r1-hot90-least-request",
        "r1-hot90-prefix-cache",
        "r2-cold-uniform-prefix-cache",
        "r2-cold-uniform-least-request",
        "r2-cold-uniform-random",
        "r2-warm-uniform-prefix-cache",
        "r2-warm-uniform-least-request",
        "r2-warm-uniform-random",
        "r2-hot50-prefix-cache",
        "r2-hot50-least-request",
        "r2-hot50-random",
        "r2-hot90-prefix-cache",
        "r2-hot90-least-request",
        "r2-hot90-random",
    ];

    #[test]
    fn builtin_matrix_expands_to_the_seed_order() {
        let phases = Matrix::builtin().unwrap().phases();
        let names: Vec<&str> = phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, SEED_ORDER);
        let p = &phases[20];
        assert_eq!((p.round, p.seed, p.scenario.as_str()), (2, 103, "hot50"));
        assert_eq!((p.hot_fraction, p.priming), (0.5, Priming::Hot));
        assert_eq!(p.shape.count, 96);
        assert_eq!(p.shape.rps, 1.6);
        assert_eq!((p.shape.output, p.shape.repeat), (128, 300));
        assert_eq!(phases[0].seed, 102);
    }

    #[test]
    fn routes_can_be_replaced_keeping_round_direction() {
        let m = Matrix::builtin()
            .unwrap()
            .with_routes(&["least-request".into(), "random".into()])
            .unwrap();
        let names: Vec<String> = m.phases().into_iter().map(|p| p.name).collect();
        assert_eq!(names.len(), 16);
        assert_eq!(names[0], "r1-cold-uniform-least-request");
        assert_eq!(names[8], "r2-cold-uniform-random");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let text = MATRIX_24.replace("count = 96", "count = 96\nbogus = 1");
        let err = Matrix::from_toml_str(&text, "m.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bogus") && err.contains("m.toml"), "{err}");

        let matrix = Matrix::builtin().unwrap();
        assert_eq!(matrix.clone().with_rps(3.2).unwrap().shape().rps, 3.2);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = matrix.clone().with_rps(bad).unwrap_err().to_string();
            assert!(err.contains("workload.rps"), "{bad}: {err}");
        }
        let text = MATRIX_24.replace("rps = 1.6", "rps = 0.0");
        let err = Matrix::from_toml_str(&text, "m.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("workload.rps"), "{err}");

        let text = MATRIX_24.replace("\"hot50\", \"hot90\"]", "\"hot50\", \"hot99\"]");
        let err = Matrix::from_toml_str(&text, "m.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hot99"), "{err}");

        let err = Matrix::builtin()
            .unwrap()
            .with_routes(&["fastest".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("fastest"), "{err}");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Matrix::load(Path::new("/nonexistent/m.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/m.toml"), "{err}");
    }
}
