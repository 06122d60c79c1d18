//! What a phase sends and when: per-family request counts, a seeded family order, constant
//! arrival spacing and per-request tail lengths.
//!
//! Family order and tail lengths are seeded by (round seed, scenario), not by route, so every
//! route of a round sees the same traffic shape; only the prefix text is fresh per phase.

use rand::Rng;
use rand::seq::SliceRandom;

use super::matrix::PhaseSpec;
use super::seeding::rng_for;

/// One measured request of a phase, before its prompt is known (priming decides which prefix
/// each family uses; [`PhaseSpec::planned_requests`] then makes the [`super::PlannedRequest`]s).
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseSlot {
    /// Position in the phase (0-based).
    pub index: usize,
    pub family: usize,
    /// Scheduled send time, in seconds after the phase starts.
    pub at: f64,
    /// Words in the tail (nonce included).
    pub tail_tokens: usize,
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

/// The measured requests of a phase, in send order.
pub fn plan_requests(phase: &PhaseSpec) -> Vec<PhaseSlot> {
    let shape = &phase.shape;
    let counts = family_counts(shape.count, shape.families, phase.hot_fraction);
    let mut families: Vec<usize> = counts
        .iter()
        .enumerate()
        .flat_map(|(family, &n)| std::iter::repeat_n(family, n))
        .collect();
    families.shuffle(&mut rng_for(phase.seed, &[&phase.scenario, "family-order"]));
    let mut lengths = rng_for(phase.seed, &[&phase.scenario, "tail-length"]);
    let [lo, hi] = shape.tail_tokens;
    let spacing = 1.0 / shape.rps;
    families
        .into_iter()
        .enumerate()
        .map(|(index, family)| PhaseSlot {
            index,
            family,
            at: index as f64 * spacing,
            tail_tokens: lengths.random_range(lo..=hi),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::matrix::Matrix;

    #[test]
    fn family_counts_match_the_seed() {
        assert_eq!(family_counts(96, 8, 0.0), vec![12; 8]);
        assert_eq!(family_counts(96, 8, 0.5), vec![48, 7, 7, 7, 7, 7, 7, 6]);
        assert_eq!(family_counts(96, 8, 0.9), vec![86, 2, 2, 2, 1, 1, 1, 1]);
        assert_eq!(family_counts(10, 1, 0.9), vec![10]);
        assert_eq!(family_counts(5, 8, 0.0).iter().sum::<usize>(), 5);
    }

    #[test]
    fn plan_is_seeded_constant_spaced_and_shared_across_routes() {
        let phases = Matrix::builtin().unwrap().phases();
        let random = plan_requests(&phases[6]); // r1-hot50-random
        let least = plan_requests(&phases[7]); // r1-hot50-least-request
        assert_eq!(random, least);
        assert_eq!(random.len(), 96);
        assert_eq!(random.iter().filter(|r| r.family == 0).count(), 48);
        for (i, r) in random.iter().enumerate() {
            assert_eq!(r.index, i);
            assert!((r.at - i as f64 / 1.6).abs() < 1e-9);
            assert!((333..=353).contains(&r.tail_tokens));
        }
        // Shuffled, not blocked: the hot family is spread over the phase.
        assert!(random[..48].iter().any(|r| r.family != 0));
        // A different round seed gives a different order.
        let r2 = plan_requests(&phases[20]); // r2-hot50-random
        assert_ne!(
            random.iter().map(|r| r.family).collect::<Vec<_>>(),
            r2.iter().map(|r| r.family).collect::<Vec<_>>()
        );
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

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
    }
}
