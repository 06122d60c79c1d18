//! When a matrix phase's requests (or conversations) arrive: evenly spaced (the seed), Poisson,
//! or gamma-distributed gaps with a given burstiness.
//!
//! Every process offers exactly the asked mean rate: `n` arrivals start at 0 and the last is
//! at `(n − 1)/rps`, as with constant spacing. Random gaps are drawn i.i.d. and then scaled so
//! that they sum to that span (vLLM's `bench serve` rescales its gamma schedule the same way),
//! so two processes at one rate load the replicas equally over the phase and differ only in
//! how bunched the arrivals are. The burstiness is the gaps' coefficient of variation (CV,
//! standard deviation / mean): 0 for constant spacing, 1 for Poisson, above 1 for bursts
//! (gamma shape `1/CV²`, as vLLM's `--burstiness` is the shape). Seeded by the caller's
//! generator; pure.

use rand::Rng;
use rand_distr::{Distribution, Gamma};
use serde::Deserialize;

/// The process that spaces a phase's arrivals (`arrival` in the matrix file).
///
/// In TOML: `arrival = "constant"`, `arrival = "poisson"` or `arrival = { gamma = { cv = 3.0 } }`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum InterArrival {
    /// `1/rps` apart: the seed's schedule, and the default.
    #[default]
    Constant,
    /// Exponential gaps (CV 1).
    Poisson,
    /// Gamma gaps with coefficient of variation `cv` (shape `1/cv²`): bursts above 1.
    Gamma { cv: f64 },
}

/// Largest accepted CV: shape 1/400; beyond it nearly every arrival lands in one burst.
pub const MAX_CV: f64 = 20.0;

impl InterArrival {
    /// Checks the parameters; the message names the key (`arrival.gamma.cv`).
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            InterArrival::Gamma { cv } if !(cv.is_finite() && cv > 0.0 && cv <= MAX_CV) => Err(
                format!("arrival.gamma.cv must be in (0, {MAX_CV}], got {cv}"),
            ),
            _ => Ok(()),
        }
    }

    /// The name recorded in a phase's config (`constant`, `poisson`, `gamma-cv3`).
    pub fn label(&self) -> String {
        match self {
            InterArrival::Constant => "constant".into(),
            InterArrival::Poisson => "poisson".into(),
            InterArrival::Gamma { cv } => format!("gamma-cv{cv}"),
        }
    }

    /// Send times of `n` arrivals at mean rate `rps` (seconds after the phase starts), in
    /// order: the first at 0, the last at `(n − 1)/rps`. Constant spacing draws nothing from
    /// `rng`; the others draw `n − 1` gaps. `rps` must be positive and finite and the process
    /// valid (the matrix checks both when it loads).
    pub fn times(&self, n: usize, rps: f64, rng: &mut impl Rng) -> Vec<f64> {
        if n == 0 {
            return Vec::new();
        }
        let spacing = 1.0 / rps;
        let gaps: Vec<f64> = match *self {
            // The seed's exact arithmetic (index × spacing), so its schedules stay bit for bit.
            InterArrival::Constant => return (0..n).map(|i| i as f64 * spacing).collect(),
            InterArrival::Poisson => (1..n).map(|_| unit_exponential(rng)).collect(),
            InterArrival::Gamma { cv } => {
                let shape = 1.0 / (cv * cv);
                match Gamma::new(shape, 1.0 / shape) {
                    Ok(gamma) => (1..n).map(|_| gamma.sample(rng)).collect(),
                    // Unreachable after validate(); constant spacing is the safe reading.
                    Err(_) => vec![1.0; n - 1],
                }
            }
        };
        spread_over(&gaps, (n - 1) as f64 * spacing)
    }
}

/// A unit-mean exponential gap. `1 − u` lies in (0, 1], so the logarithm is finite.
pub(crate) fn unit_exponential(rng: &mut impl Rng) -> f64 {
    let u: f64 = rng.random_range(0.0..1.0);
    -(1.0 - u).ln()
}

/// Arrival times from 0 whose gaps are `gaps` scaled to sum to `span`. All-zero gaps (every
/// draw underflowed, possible only at extreme CVs) fall back to even spacing.
fn spread_over(gaps: &[f64], span: f64) -> Vec<f64> {
    let total: f64 = gaps.iter().sum();
    let n = gaps.len();
    let mut times = Vec::with_capacity(n + 1);
    times.push(0.0);
    let mut sum = 0.0;
    for (i, gap) in gaps.iter().enumerate() {
        sum += gap;
        times.push(if total > 0.0 {
            span * (sum / total)
        } else {
            span * (i + 1) as f64 / n as f64
        });
    }
    if let Some(last) = times.last_mut()
        && n > 0
    {
        // Exactly the span, whatever the rounding of the running sum.
        *last = span;
    }
    times
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::seeding::rng_for;

    fn cv_of_gaps(times: &[f64]) -> f64 {
        let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        var.sqrt() / mean
    }

    #[test]
    fn constant_is_the_seed_schedule_and_draws_nothing() {
        let mut rng = rng_for(1, &["a"]);
        let times = InterArrival::Constant.times(96, 1.6, &mut rng);
        for (i, t) in times.iter().enumerate() {
            assert_eq!(*t, i as f64 * (1.0 / 1.6));
        }
        let untouched: u64 = rng.random();
        assert_eq!(untouched, rng_for(1, &["a"]).random::<u64>());
    }

    #[test]
    fn random_processes_keep_the_span_and_show_their_burstiness() {
        for (process, lo, hi) in [
            (InterArrival::Poisson, 0.8, 1.2),
            (InterArrival::Gamma { cv: 0.5 }, 0.4, 0.6),
            (InterArrival::Gamma { cv: 3.0 }, 2.0, 4.0),
        ] {
            let times = process.times(4000, 2.0, &mut rng_for(7, &["x"]));
            assert_eq!(times.len(), 4000);
            assert_eq!(times[0], 0.0);
            assert_eq!(*times.last().unwrap(), 3999.0 / 2.0);
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
            let cv = cv_of_gaps(&times);
            assert!((lo..=hi).contains(&cv), "{process:?}: cv {cv}");
            // Seeded: the same generator gives the same schedule, another one another.
            assert_eq!(times, process.times(4000, 2.0, &mut rng_for(7, &["x"])));
            assert_ne!(times, process.times(4000, 2.0, &mut rng_for(8, &["x"])));
        }
    }

    #[test]
    fn parses_from_toml_and_rejects_bad_cvs() {
        #[derive(Deserialize)]
        struct Doc {
            arrival: InterArrival,
        }
        let parse = |s: &str| toml::from_str::<Doc>(s).map(|d| d.arrival);
        assert_eq!(
            parse("arrival = \"poisson\"").unwrap(),
            InterArrival::Poisson
        );
        assert_eq!(
            parse("arrival = { gamma = { cv = 2.5 } }").unwrap(),
            InterArrival::Gamma { cv: 2.5 }
        );
        let err = parse("arrival = { gamma = { cv = 2.5, k = 1 } }")
            .unwrap_err()
            .to_string();
        assert!(err.contains('k'), "{err}");
        assert!(parse("arrival = \"uniform\"").is_err());
        for cv in [0.0, -1.0, f64::NAN, 21.0] {
            let err = InterArrival::Gamma { cv }.validate().unwrap_err();
            assert!(err.contains("arrival.gamma.cv"), "{err}");
        }
        assert_eq!(InterArrival::Gamma { cv: 3.0 }.label(), "gamma-cv3");
    }

    #[test]
    fn tiny_counts_are_defined() {
        let mut rng = rng_for(1, &["t"]);
        assert!(InterArrival::Poisson.times(0, 1.0, &mut rng).is_empty());
        assert_eq!(InterArrival::Poisson.times(1, 1.0, &mut rng), vec![0.0]);
        assert_eq!(
            InterArrival::Gamma { cv: 4.0 }.times(2, 4.0, &mut rng),
            vec![0.0, 0.25]
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::workload::seeding::rng_for;

    fn process() -> impl Strategy<Value = InterArrival> {
        prop_oneof![
            Just(InterArrival::Constant),
            Just(InterArrival::Poisson),
            (0.05f64..MAX_CV).prop_map(|cv| InterArrival::Gamma { cv }),
        ]
    }

    proptest! {
        /// Any process, rate and count: `n` ordered, finite times from 0 to (n − 1)/rps,
        /// so the offered mean rate is exactly the asked one.
        #[test]
        fn schedules_are_ordered_and_exactly_spanned(
            p in process(), n in 0usize..500, rps in 0.01f64..100.0, seed in any::<u64>()
        ) {
            let times = p.times(n, rps, &mut rng_for(seed, &["p"]));
            prop_assert_eq!(times.len(), n);
            prop_assert!(times.iter().all(|t| t.is_finite() && *t >= 0.0));
            prop_assert!(times.windows(2).all(|w| w[0] <= w[1]));
            if n > 0 {
                prop_assert_eq!(times[0], 0.0);
                let span = (n - 1) as f64 / rps;
                prop_assert!((times[n - 1] - span).abs() <= 1e-9 * span.max(1.0));
            }
        }
    }
}
