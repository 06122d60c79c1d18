//! Which family each request of a phase belongs to: how popular the families are (the
//! seed's hot/uniform split, or Zipf), and whether families appear and retire during the
//! phase.
//!
//! With every family live for the whole phase (the default), the counts are exact: each
//! family gets its share of the requests, rounded by largest remainder, and the runner
//! shuffles the resulting list with the phase's seeded order (as the seed does). With a
//! family lifetime below the whole phase, family `f` is live over an equal window of the
//! phase, the windows staggered evenly from the first request to the last, and each request
//! draws among the families live at its position, weighted by the popularity law over their
//! ranks, **newest first**: the family that appeared last is the hottest, as a new document
//! or system prompt is in production. Pure; seeded by the caller's generator.

use rand::Rng;
use serde::Deserialize;

/// How requests spread over the families (`popularity` in a matrix scenario).
///
/// In TOML: `popularity = "uniform"`, `popularity = { hot = 0.5 }` (the seed's
/// `hot_fraction`: family 0 gets that share, the others split the rest evenly) or
/// `popularity = { zipf = 1.1 }` (the family of rank `r`, from 0, gets a share proportional
/// to `1/(r + 1)^s`).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Popularity {
    Uniform,
    Hot(f64),
    Zipf(f64),
}

/// Largest accepted Zipf exponent; at 8 the top family already takes over 99 %.
pub const MAX_ZIPF: f64 = 8.0;

impl Popularity {
    /// The seed's form: `hot_fraction` 0 is uniform.
    pub fn from_hot_fraction(hot_fraction: f64) -> Popularity {
        if hot_fraction > 0.0 {
            Popularity::Hot(hot_fraction)
        } else {
            Popularity::Uniform
        }
    }

    /// Checks the parameter; the message names the key under `scenario` (`popularity.zipf`).
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Popularity::Uniform => Ok(()),
            Popularity::Hot(f) if (0.0..1.0).contains(&f) => Ok(()),
            Popularity::Hot(f) => Err(format!("popularity.hot must be in [0, 1), got {f}")),
            Popularity::Zipf(s) if s.is_finite() && (0.0..=MAX_ZIPF).contains(&s) => Ok(()),
            Popularity::Zipf(s) => Err(format!(
                "popularity.zipf must be in [0, {MAX_ZIPF}], got {s}"
            )),
        }
    }

    /// The seed's `hot_fraction` for a phase's config: the hot share, or 0.
    pub fn hot_fraction(&self) -> f64 {
        match *self {
            Popularity::Hot(f) => f,
            _ => 0.0,
        }
    }

    /// Requests per family for `count` requests over `families` (family 0 the most
    /// popular), summing to `count`. Hot and uniform are the seed's counts exactly.
    pub fn counts(&self, count: usize, families: usize) -> Vec<usize> {
        match *self {
            Popularity::Uniform => family_counts(count, families, 0.0),
            Popularity::Hot(f) => family_counts(count, families, f),
            Popularity::Zipf(_) => apportion(count, &self.weights(families)),
        }
    }

    /// Relative weights of ranks `0..n` (unnormalised).
    pub fn weights(&self, n: usize) -> Vec<f64> {
        match *self {
            Popularity::Uniform => vec![1.0; n],
            Popularity::Hot(f) if n > 1 && f > 0.0 => {
                let rest = (1.0 - f) / (n - 1) as f64;
                std::iter::once(f)
                    .chain(std::iter::repeat_n(rest, n - 1))
                    .collect()
            }
            Popularity::Hot(_) => vec![1.0; n],
            Popularity::Zipf(s) => (0..n).map(|r| 1.0 / ((r + 1) as f64).powf(s)).collect(),
        }
    }
}

/// How many requests each family gets: uniform when `hot_fraction` is 0, otherwise family 0
/// gets `round(count × hot_fraction)` and the rest is split evenly over the other families,
/// the remainder going to the lowest-numbered ones (96 at 0.5 → 48, 7,7,7,7,7,7,6).
pub fn family_counts(count: usize, families: usize, hot_fraction: f64) -> Vec<usize> {
    if families == 0 {
        return Vec::new();
    }
    if hot_fraction <= 0.0 || families == 1 {
        return split_evenly(count, families);
    }
    // count ≤ 2^53 in any sane run, so the f64 round trip is exact.
    let hot = ((count as f64 * hot_fraction).round() as usize).min(count);
    let mut counts = vec![hot];
    counts.extend(split_evenly(count - hot, families - 1));
    counts
}

fn split_evenly(count: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|i| count / parts + usize::from(i < count % parts))
        .collect()
}

/// Integer shares of `count` proportional to `weights`, by largest remainder (ties to the
/// lower index), summing to `count` exactly.
fn apportion(count: usize, weights: &[f64]) -> Vec<usize> {
    let total: f64 = weights.iter().sum();
    if weights.is_empty() || total <= 0.0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| count as f64 * w / total).collect();
    // Each floor is at most `count`, so the cast back is exact.
    let mut shares: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let given: usize = shares.iter().sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take(count.saturating_sub(given)) {
        shares[i] += 1;
    }
    shares
}

/// When each family is live, as fractions of the phase's requests: `lifetime` 1 (the
/// default) keeps every family live throughout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FamilyLifetimes {
    pub families: usize,
    /// Share of the phase each family is live, in `[1/families, 1]`.
    pub lifetime: f64,
}

impl FamilyLifetimes {
    /// Checks `lifetime` against the family count (below `1/families` some request would
    /// find no family live); the message names `family_lifetime`.
    pub fn new(families: usize, lifetime: f64) -> Result<FamilyLifetimes, String> {
        let least = 1.0 / families.max(1) as f64;
        if !(lifetime.is_finite() && lifetime >= least && lifetime <= 1.0) {
            return Err(format!(
                "family_lifetime must be in [1/families, 1] = [{least}, 1], got {lifetime}"
            ));
        }
        Ok(FamilyLifetimes { families, lifetime })
    }

    /// Whether every family lives for the whole phase.
    pub fn whole_phase(&self) -> bool {
        self.lifetime >= 1.0 || self.families <= 1
    }

    /// The window `[start, end)` of family `f` in phase fractions; the windows are
    /// staggered evenly so the first opens at 0 and the last closes at 1.
    pub fn window(&self, f: usize) -> (f64, f64) {
        if self.whole_phase() {
            return (0.0, 1.0);
        }
        let step = (1.0 - self.lifetime) / (self.families - 1) as f64;
        let start = f as f64 * step;
        (start, start + self.lifetime)
    }

    /// Families live at phase fraction `x`, newest first (the order popularity ranks them).
    pub fn live_at(&self, x: f64) -> Vec<usize> {
        let mut live: Vec<usize> = (0..self.families)
            .filter(|&f| {
                let (start, end) = self.window(f);
                start <= x && (x < end || f + 1 == self.families)
            })
            .collect();
        if live.is_empty() {
            // Only at a boundary where two windows touch and rounding opened a hair's gap:
            // the family whose window opened last.
            let opened = (0..self.families).rfind(|&f| self.window(f).0 <= x);
            live.push(opened.unwrap_or(0));
        }
        live.reverse();
        live
    }
}

/// The family of each of `count` requests, in send order, for a phase whose families appear
/// and retire: request `i` sits at phase fraction `(i + 0.5)/count` and draws among the
/// families live there, weighted by `popularity` over their ranks (newest first). One draw
/// per request from `rng`.
pub fn churned_families(
    count: usize,
    popularity: Popularity,
    lifetimes: FamilyLifetimes,
    rng: &mut impl Rng,
) -> Vec<usize> {
    (0..count)
        .map(|i| {
            let live = lifetimes.live_at((i as f64 + 0.5) / count as f64);
            let weights = popularity.weights(live.len());
            let total: f64 = weights.iter().sum();
            let mut pick = rng.random_range(0.0..1.0) * total;
            for (family, weight) in live.iter().zip(&weights) {
                if pick < *weight {
                    return *family;
                }
                pick -= weight;
            }
            // Rounding left a sliver past the last weight: the last live family.
            live.last().copied().unwrap_or(0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::seeding::rng_for;

    #[test]
    fn family_counts_match_the_seed() {
        assert_eq!(family_counts(96, 8, 0.0), vec![12; 8]);
        assert_eq!(family_counts(96, 8, 0.5), vec![48, 7, 7, 7, 7, 7, 7, 6]);
        assert_eq!(family_counts(96, 8, 0.9), vec![86, 2, 2, 2, 1, 1, 1, 1]);
        assert_eq!(family_counts(10, 1, 0.9), vec![10]);
        assert_eq!(family_counts(5, 8, 0.0).iter().sum::<usize>(), 5);
    }

    #[test]
    fn hot_and_uniform_are_the_seed_counts() {
        assert_eq!(Popularity::Uniform.counts(96, 8), vec![12; 8]);
        assert_eq!(
            Popularity::from_hot_fraction(0.5).counts(96, 8),
            vec![48, 7, 7, 7, 7, 7, 7, 6]
        );
        assert_eq!(Popularity::from_hot_fraction(0.0), Popularity::Uniform);
        assert_eq!(Popularity::Hot(0.9).hot_fraction(), 0.9);
    }

    #[test]
    fn zipf_counts_follow_the_law() {
        // s = 1 over 8 families: shares 1/r / H_8 (H_8 = 2.718): 35.3, 17.7, 11.8, 8.8, …
        let counts = Popularity::Zipf(1.0).counts(96, 8);
        assert_eq!(counts, vec![35, 18, 12, 9, 7, 6, 5, 4]);
        assert_eq!(Popularity::Zipf(0.0).counts(96, 8), vec![12; 8]);
        let steep = Popularity::Zipf(2.0).counts(1000, 48);
        assert_eq!(steep.iter().sum::<usize>(), 1000);
        assert!(steep[0] > 600 && steep.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn parses_and_validates() {
        #[derive(Deserialize)]
        struct Doc {
            popularity: Popularity,
        }
        let parse = |s: &str| toml::from_str::<Doc>(s).map(|d| d.popularity);
        assert_eq!(
            parse("popularity = { zipf = 1.1 }").unwrap(),
            Popularity::Zipf(1.1)
        );
        assert_eq!(
            parse("popularity = { hot = 0.5 }").unwrap(),
            Popularity::Hot(0.5)
        );
        assert_eq!(
            parse("popularity = \"uniform\"").unwrap(),
            Popularity::Uniform
        );
        assert!(parse("popularity = { pareto = 1.0 }").is_err());
        assert!(
            Popularity::Zipf(-1.0)
                .validate()
                .unwrap_err()
                .contains("popularity.zipf")
        );
        assert!(
            Popularity::Hot(1.0)
                .validate()
                .unwrap_err()
                .contains("popularity.hot")
        );
    }

    #[test]
    fn lifetimes_stagger_and_cover_the_phase() {
        let l = FamilyLifetimes::new(4, 0.4).unwrap();
        assert_eq!(l.window(0), (0.0, 0.4));
        assert!((l.window(3).0 - 0.6).abs() < 1e-12 && (l.window(3).1 - 1.0).abs() < 1e-12);
        assert_eq!(l.live_at(0.1), vec![0]);
        assert_eq!(l.live_at(0.3), vec![1, 0]);
        assert_eq!(l.live_at(0.99), vec![3]);
        assert!(
            FamilyLifetimes::new(4, 0.2)
                .unwrap_err()
                .contains("family_lifetime")
        );
        assert!(FamilyLifetimes::new(4, 1.0).unwrap().whole_phase());
    }

    #[test]
    fn churned_requests_use_live_families_and_favour_the_newest() {
        let lifetimes = FamilyLifetimes::new(8, 0.25).unwrap();
        let families = churned_families(
            960,
            Popularity::Zipf(1.5),
            lifetimes,
            &mut rng_for(3, &["c"]),
        );
        assert_eq!(families.len(), 960);
        for (i, f) in families.iter().enumerate() {
            assert!(lifetimes.live_at((i as f64 + 0.5) / 960.0).contains(f));
        }
        // Every family appears, and early requests never see late families.
        for f in 0..8 {
            assert!(families.contains(&f), "family {f} never used");
        }
        assert!(families[..96].iter().all(|&f| f <= 2));
        assert_eq!(
            families,
            churned_families(
                960,
                Popularity::Zipf(1.5),
                lifetimes,
                &mut rng_for(3, &["c"])
            )
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::workload::seeding::rng_for;

    proptest! {
        /// Every request goes to some family, the hot family is never smaller than another,
        /// and the others differ by at most one.
        #[test]
        fn counts_sum_and_stay_even(count in 0usize..2000, families in 1usize..64, hot in 0.0f64..0.99) {
            let counts = family_counts(count, families, hot);
            prop_assert_eq!(counts.len(), families);
            prop_assert_eq!(counts.iter().sum::<usize>(), count);
            let rest = &counts[1..];
            if let (Some(lo), Some(hi)) = (rest.iter().min(), rest.iter().max()) {
                prop_assert!(hi - lo <= 1);
                if hot > 0.0 && hot >= 1.0 / families as f64 {
                    prop_assert!(counts[0] + 1 >= *hi);
                }
            }
        }

        /// Zipf counts sum to the count and never rise with rank.
        #[test]
        fn zipf_counts_sum_and_fall(count in 0usize..5000, families in 1usize..200, s in 0.0f64..MAX_ZIPF) {
            let counts = Popularity::Zipf(s).counts(count, families);
            prop_assert_eq!(counts.len(), families);
            prop_assert_eq!(counts.iter().sum::<usize>(), count);
            prop_assert!(counts.windows(2).all(|w| w[0] >= w[1]));
        }

        /// With any valid lifetime every request lands on a family live at its position.
        #[test]
        fn churn_stays_inside_windows(
            count in 1usize..400, families in 1usize..40, frac in 0.0f64..=1.0, seed in any::<u64>()
        ) {
            let lifetime = 1.0 / families as f64 + frac * (1.0 - 1.0 / families as f64);
            let lifetimes = FamilyLifetimes::new(families, lifetime).unwrap();
            let picked = churned_families(count, Popularity::Zipf(1.0), lifetimes, &mut rng_for(seed, &["p"]));
            for (i, f) in picked.iter().enumerate() {
                let x = (i as f64 + 0.5) / count as f64;
                prop_assert!(lifetimes.live_at(x).contains(f));
            }
        }
    }
}
