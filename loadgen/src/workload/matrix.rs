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

use super::popularity::Popularity;
pub use super::scenario::{Priming, ScenarioSpec, WorkloadShape};
use super::traffic::Traffic;

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

/// One round: a seed and the direction routes run in.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoundSpec {
    pub number: u32,
    pub seed: u64,
    #[serde(default)]
    pub reverse_routes: bool,
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
    /// The `[workload]` shape with the scenario's `count`, `rps`, `families`, `output` (a
    /// distribution's mean) and `tail_tokens` (a distribution's bounds) applied: what the
    /// phase's config records.
    pub shape: WorkloadShape,
    pub traffic: Traffic,
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
    /// `--count`: replaces every scenario's count (a conversation scenario's sessions).
    count_override: Option<usize>,
    /// `--rps`: replaces every scenario's rate.
    rps_override: Option<f64>,
    /// Each scenario's shape and traffic, resolved by `validate`.
    resolved: BTreeMap<String, (WorkloadShape, Traffic)>,
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
        let mut matrix = Matrix {
            file,
            routes,
            count_override: None,
            rps_override: None,
            resolved: BTreeMap::new(),
        };
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

    /// Sends `count` requests in each phase, whatever the file says (reduced runs and tests);
    /// a conversation scenario gets `count` sessions.
    pub fn with_count(mut self, count: usize) -> Result<Matrix, MatrixError> {
        self.count_override = Some(count);
        self.validate()?;
        Ok(self)
    }

    /// Sends each phase's requests at `rps` per second instead of the file's rates (the
    /// replica sweeps scale it with the replica count); a conversation scenario starts
    /// `rps` sessions per second.
    pub fn with_rps(mut self, rps: f64) -> Result<Matrix, MatrixError> {
        self.rps_override = Some(rps);
        self.validate()?;
        Ok(self)
    }

    /// The shared request shape (`[workload]`, with `--count` and `--rps` applied).
    pub fn shape(&self) -> WorkloadShape {
        let mut shape = self.file.workload.clone();
        shape.count = self.count_override.unwrap_or(shape.count);
        shape.rps = self.rps_override.unwrap_or(shape.rps);
        shape
    }

    /// Every phase in run order.
    pub fn phases(&self) -> Vec<PhaseSpec> {
        let mut phases = Vec::new();
        for round in &self.file.round {
            for scenario in &self.file.scenarios {
                // validate() guarantees the table exists and resolved it.
                let (Some(spec), Some((shape, traffic))) = (
                    self.file.scenario.get(scenario),
                    self.resolved.get(scenario),
                ) else {
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
                        hot_fraction: traffic.popularity.hot_fraction(),
                        shape: shape.clone(),
                        traffic: traffic.clone(),
                    });
                }
            }
        }
        phases
    }

    /// Checks everything and resolves each scenario's shape and traffic.
    fn validate(&mut self) -> Result<(), MatrixError> {
        let w = self.shape();
        check_shape(&w, "workload").map_err(MatrixError::Invalid)?;
        let bad = |m: String| Err(MatrixError::Invalid(m));
        if w.max_setup_attempts == 0 {
            return bad("workload.max_setup_attempts must be at least 1".into());
        }
        if self.file.round.is_empty() {
            return bad("at least one [[round]] is required".into());
        }
        if self.file.scenarios.is_empty() || self.routes.is_empty() {
            return bad("scenarios and routes must not be empty".into());
        }
        let mut resolved = BTreeMap::new();
        for name in &self.file.scenarios {
            let Some(spec) = self.file.scenario.get(name) else {
                return bad(format!("scenario {name:?} has no [scenario.{name}] table"));
            };
            let mut shape = w.clone();
            if self.count_override.is_none()
                && let Some(count) = spec.count
            {
                shape.count = count;
            }
            if self.rps_override.is_none()
                && let Some(rps) = spec.rps
            {
                shape.rps = rps;
            }
            shape.families = spec.families.unwrap_or(shape.families);
            check_shape(&shape, &format!("scenario.{name}")).map_err(MatrixError::Invalid)?;
            let mut traffic = Traffic::resolve(name, spec, &shape).map_err(MatrixError::Invalid)?;
            if let (Some(c), Some(count)) = (traffic.conversations.as_mut(), self.count_override) {
                c.sessions = count;
            }
            // What the phase's config records: a distribution's mean and bounds.
            shape.output = u32::try_from(traffic.output.mean().round() as usize)
                .unwrap_or(u32::MAX)
                .max(1);
            shape.tail_tokens = [traffic.tail.min(), traffic.tail.max()];
            if spec.priming == Priming::Hot {
                if traffic.popularity == Popularity::Uniform {
                    return bad(format!(
                        "scenario.{name}: hot priming needs hot_fraction > 0 or a popularity other than uniform"
                    ));
                }
                if shape.priming_candidates < shape.families {
                    return bad(format!(
                        "workload.priming_candidates ({}) must be at least the families of scenario.{name} ({})",
                        shape.priming_candidates, shape.families
                    ));
                }
            }
            resolved.insert(name.clone(), (shape, traffic));
        }
        self.resolved = resolved;
        Ok(())
    }
}

/// The checks a shape must pass, its keys named under `table` (`workload`,
/// `scenario.NAME`).
fn check_shape(w: &WorkloadShape, table: &str) -> Result<(), String> {
    if w.count == 0 {
        return Err(format!("{table}.count must be at least 1"));
    }
    if !(w.rps.is_finite() && w.rps > 0.0) {
        return Err(format!("{table}.rps must be > 0, got {}", w.rps));
    }
    if w.output == 0 {
        return Err(format!("{table}.output must be at least 1"));
    }
    if w.families == 0 || w.families > 1024 {
        return Err(format!(
            "{table}.families must be 1..=1024, got {}",
            w.families
        ));
    }
    if w.prefix_tokens == 0 || w.prefix_tokens > 1_000_000 {
        return Err(format!(
            "{table}.prefix_tokens must be 1..=1000000, got {}",
            w.prefix_tokens
        ));
    }
    let [lo, hi] = w.tail_tokens;
    if lo == 0 || lo > hi || hi > 1_000_000 {
        return Err(format!(
            "{table}.tail_tokens must be [min, max] with 1 <= min <= max, got [{lo}, {hi}]"
        ));
    }
    Ok(())
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

    const OVERLOAD: &str = include_str!("../../../config/workloads/overload.toml");
    const OVERLOAD_3K: &str = include_str!("../../../config/workloads/overload-3k.toml");

    #[test]
    fn the_overload_workloads_are_issue_15s_cases() {
        // Twice the seed's rate, and 256-token answers at the seed's rate, on its prompts.
        let m = Matrix::from_toml_str(OVERLOAD, "overload").unwrap();
        for p in m.phases() {
            let (rps, output) = if p.scenario.starts_with("rate2x-") {
                (3.2, 128)
            } else {
                assert!(p.scenario.starts_with("out256-"), "{}", p.scenario);
                (1.6, 256)
            };
            assert_eq!((p.shape.rps, p.shape.output), (rps, output), "{}", p.name);
            assert_eq!(
                (p.shape.count, p.shape.prefix_tokens),
                (96, 4704),
                "{}",
                p.name
            );
        }
        assert_eq!(m.phases().len(), 3 * 8 * 4);
        // 3k-token prompts, 20 % of them the family's prefix, at the seed's rate.
        let m = Matrix::from_toml_str(OVERLOAD_3K, "overload-3k").unwrap();
        for p in m.phases() {
            for tail in p.shape.tail_tokens {
                let prompt = p.shape.prefix_tokens + 1 + tail;
                assert!((2900..=3100).contains(&prompt), "{}: {prompt}", p.name);
                assert_eq!(100 * p.shape.prefix_tokens / prompt, 20, "{}", p.name);
            }
            assert_eq!(p.shape.rps, 1.6, "{}", p.name);
        }
    }

    #[test]
    fn the_example_workloads_load_and_name_bad_scenario_keys() {
        for (name, text) in [
            (
                "conversations",
                include_str!("../../../config/workloads/conversations.toml"),
            ),
            (
                "bursts",
                include_str!("../../../config/workloads/bursts.toml"),
            ),
            ("zipf", include_str!("../../../config/workloads/zipf.toml")),
            (
                "lengths",
                include_str!("../../../config/workloads/lengths.toml"),
            ),
            (
                "cold-warm",
                include_str!("../../../config/workloads/cold-warm.toml"),
            ),
            ("overload", OVERLOAD),
            ("overload-3k", OVERLOAD_3K),
        ] {
            let m = Matrix::from_toml_str(text, name).unwrap();
            // Every file but the seed-shaped ones (constant arrivals, fixed answers, a range
            // of tails) asks for some traffic of its own.
            let shaped = m.phases().iter().any(|p| p.traffic.describe().is_some());
            let seed_shaped = ["cold-warm", "overload", "overload-3k"].contains(&name);
            assert_eq!(shaped, !seed_shaped, "{name}");
        }
        let seed = Matrix::builtin().unwrap();
        assert!(seed.phases().iter().all(|p| p.traffic.describe().is_none()));

        let bad = |from: &str, to: &str| {
            let text = MATRIX_24.replace(from, to);
            assert_ne!(text, MATRIX_24, "{from}");
            Matrix::from_toml_str(&text, "m.toml")
                .unwrap_err()
                .to_string()
        };
        let hot50 = "[scenario.hot50]\npriming = \"hot\"\n";
        let err = bad(hot50, &format!("{hot50}arival = \"poisson\"\n"));
        assert!(err.contains("arival"), "{err}");
        let err = bad(hot50, &format!("{hot50}popularity = {{ zipf = 1.0 }}\n"));
        assert!(
            err.contains("scenario.hot50.hot_fraction") && err.contains("popularity"),
            "{err}"
        );
        let err = bad(
            hot50,
            &format!("{hot50}arrival = {{ gamma = {{ cv = 0.0 }} }}\n"),
        );
        assert!(err.contains("scenario.hot50.arrival.gamma.cv"), "{err}");
        let err = bad(hot50, &format!("{hot50}rps = -1.0\n"));
        assert!(err.contains("scenario.hot50.rps"), "{err}");
        let err = bad(hot50, &format!("{hot50}family_lifetime = 0.01\n"));
        assert!(err.contains("scenario.hot50.family_lifetime"), "{err}");
        let err = bad(hot50, &format!("{hot50}output = [5, 1]\n"));
        assert!(err.contains("scenario.hot50.output"), "{err}");
        let err = bad(
            hot50,
            &format!("{hot50}conversations = {{ sessions = 2, turns = 2, wait = 1 }}\n"),
        );
        assert!(err.contains("wait"), "{err}");
        let warm = "[scenario.warm-uniform]\npriming = \"warm\"\nhot_fraction = 0.0";
        let err = bad(
            warm,
            "[scenario.warm-uniform]\npriming = \"hot\"\nhot_fraction = 0.0",
        );
        assert!(err.contains("hot priming"), "{err}");
    }

    #[test]
    fn scenario_values_replace_the_workload_and_overrides_replace_both() {
        let text = include_str!("../../../config/workloads/zipf.toml");
        let m = Matrix::from_toml_str(text, "zipf").unwrap();
        let p = &m.phases()[0];
        assert_eq!((p.shape.families, p.shape.count), (32, 192));
        let m = m.with_count(10).unwrap().with_rps(3.0).unwrap();
        let p = &m.phases()[0];
        assert_eq!(
            (p.shape.families, p.shape.count, p.shape.rps),
            (32, 10, 3.0)
        );
        let chat = Matrix::from_toml_str(
            include_str!("../../../config/workloads/conversations.toml"),
            "chat",
        )
        .unwrap()
        .with_count(3)
        .unwrap();
        let p = &chat.phases()[0];
        assert_eq!(p.traffic.conversations.as_ref().unwrap().sessions, 3);
        assert_eq!(p.planned_count(), 12);
        let long = chat
            .phases()
            .into_iter()
            .find(|p| p.scenario == "chat-long")
            .unwrap();
        // A distribution's mean is what the config records.
        assert_eq!(
            (long.shape.output, long.shape.tail_tokens),
            (200, [333, 353])
        );
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Matrix::load(Path::new("/nonexistent/m.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/m.toml"), "{err}");
    }
}
