//! Token counts drawn per request: a prompt tail, an answer (`max_tokens`), a user turn, or a
//! conversation's number of turns.
//!
//! Three forms, so the seed's shapes stay what they were and production's long tails can be
//! asked for beside them:
//! - a number, `128`: always that (the seed's output);
//! - `[lo, hi]`: uniform over the inclusive range (the seed's tails, `[333, 353]`), one draw
//!   per request exactly as the seed's schedule drew it;
//! - `{ dist = "lognormal", mean = M, cv = C, min = A, max = B }`: log-normal with mean `M`
//!   and coefficient of variation `C` (σ² = ln(1 + C²), μ = ln M − σ²/2), rounded and clamped
//!   to `[A, B]`. Clamping moves the mean a little (less the wider the bounds); the bounds keep
//!   a tail inside the model's context and a prompt at least one token long.
//!
//! Pure; the caller's seeded generator makes every draw.

use std::fmt;

use rand::Rng;
use rand_distr::{Distribution, LogNormal};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// Largest count any form may produce (a million tokens is past every model's context).
pub const MAX_TOKENS: usize = 1_000_000;

/// A distribution of token counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LengthDist {
    Fixed(usize),
    /// Uniform over `lo..=hi`.
    Range(usize, usize),
    LogNormal {
        mean: f64,
        cv: f64,
        min: usize,
        max: usize,
    },
}

impl LengthDist {
    /// Checks the bounds; the message starts with `key` (`tail_tokens`, `scenario.x.output`).
    pub fn validate(&self, key: &str) -> Result<(), String> {
        match *self {
            LengthDist::Fixed(n) if (1..=MAX_TOKENS).contains(&n) => Ok(()),
            LengthDist::Fixed(n) => Err(format!("{key} must be 1..={MAX_TOKENS}, got {n}")),
            LengthDist::Range(lo, hi) if lo >= 1 && lo <= hi && hi <= MAX_TOKENS => Ok(()),
            LengthDist::Range(lo, hi) => Err(format!(
                "{key} must be [min, max] with 1 <= min <= max <= {MAX_TOKENS}, got [{lo}, {hi}]"
            )),
            LengthDist::LogNormal { mean, cv, min, max } => {
                if !(min >= 1 && min <= max && max <= MAX_TOKENS) {
                    return Err(format!(
                        "{key}: min and max must satisfy 1 <= min <= max <= {MAX_TOKENS}, got {min} and {max}"
                    ));
                }
                if !(mean.is_finite() && mean >= min as f64 && mean <= max as f64) {
                    return Err(format!(
                        "{key}.mean must lie in [min, max] = [{min}, {max}], got {mean}"
                    ));
                }
                if !(cv.is_finite() && cv > 0.0 && cv <= 10.0) {
                    return Err(format!("{key}.cv must be in (0, 10], got {cv}"));
                }
                Ok(())
            }
        }
    }

    /// One draw. `Fixed` draws nothing from `rng`; `Range` draws exactly as the seed's
    /// schedule did (`random_range(lo..=hi)`), so the seed's tails stay bit for bit.
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        match *self {
            LengthDist::Fixed(n) => n,
            LengthDist::Range(lo, hi) => rng.random_range(lo..=hi),
            LengthDist::LogNormal { mean, cv, min, max } => match LogNormal::from_mean_cv(mean, cv)
            {
                // Clamped to [min, max] ⊂ [1, 10⁶] first, so the cast is exact.
                Ok(dist) => dist.sample(rng).round().clamp(min as f64, max as f64) as usize,
                // Unreachable after validate(); the mean is the safe reading.
                Err(_) => mean.round().clamp(min as f64, max as f64) as usize,
            },
        }
    }

    /// The smallest count a draw can give.
    pub fn min(&self) -> usize {
        match *self {
            LengthDist::Fixed(n) => n,
            LengthDist::Range(lo, _) => lo,
            LengthDist::LogNormal { min, .. } => min,
        }
    }

    /// The largest count a draw can give.
    pub fn max(&self) -> usize {
        match *self {
            LengthDist::Fixed(n) => n,
            LengthDist::Range(_, hi) => hi,
            LengthDist::LogNormal { max, .. } => max,
        }
    }

    /// The unclamped mean (the range's midpoint), for reports.
    pub fn mean(&self) -> f64 {
        match *self {
            LengthDist::Fixed(n) => n as f64,
            LengthDist::Range(lo, hi) => (lo + hi) as f64 / 2.0,
            LengthDist::LogNormal { mean, .. } => mean,
        }
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthDist::Fixed(n) => write!(f, "{n}"),
            LengthDist::Range(lo, hi) => write!(f, "[{lo}, {hi}]"),
            LengthDist::LogNormal { mean, cv, min, max } => {
                write!(f, "lognormal(mean {mean}, cv {cv}, {min}..={max})")
            }
        }
    }
}

/// The table form, with its keys checked.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DistTable {
    dist: DistName,
    mean: f64,
    cv: f64,
    min: usize,
    max: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum DistName {
    LogNormal,
}

impl<'de> Deserialize<'de> for LengthDist {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LengthVisitor)
    }
}

struct LengthVisitor;

impl<'de> Visitor<'de> for LengthVisitor {
    type Value = LengthDist;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token count, [min, max], or { dist = \"lognormal\", mean, cv, min, max }")
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<LengthDist, E> {
        usize::try_from(n)
            .map(LengthDist::Fixed)
            .map_err(|_| E::custom(format!("{n} tokens is too many")))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<LengthDist, E> {
        u64::try_from(n)
            .map_err(|_| E::custom(format!("a token count cannot be negative, got {n}")))
            .and_then(|n| self.visit_u64(n))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LengthDist, A::Error> {
        let lo: usize = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(0, &self))?;
        let hi: usize = seq
            .next_element()?
            .ok_or_else(|| de::Error::invalid_length(1, &self))?;
        if seq.next_element::<usize>()?.is_some() {
            return Err(de::Error::invalid_length(3, &self));
        }
        Ok(LengthDist::Range(lo, hi))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<LengthDist, A::Error> {
        let table = DistTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
        match table.dist {
            DistName::LogNormal => Ok(LengthDist::LogNormal {
                mean: table.mean,
                cv: table.cv,
                min: table.min,
                max: table.max,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::seeding::rng_for;

    #[derive(Debug, Deserialize)]
    struct Doc {
        n: LengthDist,
    }

    fn parse(s: &str) -> Result<LengthDist, String> {
        toml::from_str::<Doc>(s)
            .map(|d| d.n)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_the_three_forms_and_names_bad_keys() {
        assert_eq!(parse("n = 128").unwrap(), LengthDist::Fixed(128));
        assert_eq!(
            parse("n = [333, 353]").unwrap(),
            LengthDist::Range(333, 353)
        );
        assert_eq!(
            parse("n = { dist = \"lognormal\", mean = 500.0, cv = 1.5, min = 16, max = 8000 }")
                .unwrap(),
            LengthDist::LogNormal {
                mean: 500.0,
                cv: 1.5,
                min: 16,
                max: 8000
            }
        );
        let err =
            parse("n = { dist = \"lognormal\", mean = 5.0, cv = 1.0, min = 1, max = 9, sd = 2 }")
                .unwrap_err();
        assert!(err.contains("sd"), "{err}");
        let err =
            parse("n = { dist = \"pareto\", mean = 5.0, cv = 1.0, min = 1, max = 9 }").unwrap_err();
        assert!(err.contains("pareto"), "{err}");
        assert!(parse("n = [1, 2, 3]").is_err());
        assert!(parse("n = -4").unwrap_err().contains("negative"));
        assert!(parse("n = \"many\"").is_err());
    }

    #[test]
    fn validation_names_the_key() {
        for (d, part) in [
            (LengthDist::Fixed(0), "out must be"),
            (LengthDist::Range(5, 4), "out must be [min, max]"),
            (
                LengthDist::LogNormal {
                    mean: 1.0,
                    cv: 1.0,
                    min: 2,
                    max: 9,
                },
                "out.mean",
            ),
            (
                LengthDist::LogNormal {
                    mean: 5.0,
                    cv: 0.0,
                    min: 2,
                    max: 9,
                },
                "out.cv",
            ),
        ] {
            let err = d.validate("out").unwrap_err();
            assert!(err.contains(part), "{d:?}: {err}");
        }
    }

    #[test]
    fn range_draws_as_the_seed_did_and_fixed_draws_nothing() {
        let mut a = rng_for(102, &["hot50", "tail-length"]);
        let mut b = rng_for(102, &["hot50", "tail-length"]);
        for _ in 0..100 {
            assert_eq!(
                LengthDist::Range(333, 353).sample(&mut a),
                b.random_range(333..=353)
            );
            assert_eq!(LengthDist::Fixed(128).sample(&mut a), 128);
        }
        assert_eq!(a.random::<u64>(), b.random::<u64>());
    }

    #[test]
    fn lognormal_has_its_mean_and_spread() {
        let d = LengthDist::LogNormal {
            mean: 1000.0,
            cv: 1.0,
            min: 1,
            max: 1_000_000,
        };
        let mut rng = rng_for(5, &["l"]);
        let draws: Vec<f64> = (0..20_000).map(|_| d.sample(&mut rng) as f64).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let sd =
            (draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64).sqrt();
        assert!((900.0..1100.0).contains(&mean), "{mean}");
        assert!((0.8..1.2).contains(&(sd / mean)), "{}", sd / mean);
        // A long tail: the median sits well below the mean.
        let mut sorted = draws.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted[10_000] < 0.8 * mean);
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::workload::seeding::rng_for;

    fn dist() -> impl Strategy<Value = LengthDist> {
        prop_oneof![
            (1usize..5000).prop_map(LengthDist::Fixed),
            (1usize..5000, 0usize..5000).prop_map(|(lo, w)| LengthDist::Range(lo, lo + w)),
            (1usize..5000, 0usize..50_000, 0.0f64..=1.0, 0.01f64..10.0).prop_map(
                |(min, w, at, cv)| LengthDist::LogNormal {
                    mean: min as f64 + at * w as f64,
                    cv,
                    min,
                    max: min + w,
                }
            ),
        ]
    }

    proptest! {
        /// A valid distribution's draws always lie in its bounds.
        #[test]
        fn draws_stay_in_bounds(d in dist(), seed in any::<u64>()) {
            prop_assert!(d.validate("x").is_ok());
            let mut rng = rng_for(seed, &["d"]);
            for _ in 0..50 {
                let n = d.sample(&mut rng);
                prop_assert!(n >= d.min() && n <= d.max(), "{} outside {}", n, d);
            }
        }
    }
}
