//! `least-request`: the minimum outstanding count, uniform among ties. With cluster sharing
//! on, the count is every gateway's (`PodLoad::shared_outstanding`), as in AIBrix with Redis.

use rand::Rng;
use rand::RngCore;

use super::{Choice, PerPod, Policy, PolicyInput};
use crate::load::Candidate;

#[derive(Debug, Default)]
pub struct LeastRequest;

impl Policy for LeastRequest {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        Choice::plain(least_loaded(input.pods, input.rng))
    }
}

/// A uniformly random pod among those with the minimum outstanding count. Shared with the
/// prefix-cache fallback, which AIBrix defines the same way.
pub(crate) fn least_loaded(pods: &[Candidate<'_>], rng: &mut dyn RngCore) -> usize {
    let counts: PerPod<u64> = pods
        .iter()
        .map(|pod| pod.load.shared_outstanding())
        .collect();
    least_loaded_of(&counts, rng)
}

/// A uniformly random index among the minima of `counts` (0 when `counts` is empty; callers
/// never pass an empty slice).
pub(crate) fn least_loaded_of(counts: &[u64], rng: &mut dyn RngCore) -> usize {
    let Some(&min) = counts.iter().min() else {
        return 0;
    };
    let ties = counts.iter().filter(|&&count| count == min).count();
    let pick = rng.random_range(0..ties);
    counts
        .iter()
        .enumerate()
        .filter(|&(_, &count)| count == min)
        .nth(pick)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn picks_only_minima_and_every_one_of_them() {
        let mut rng = StdRng::seed_from_u64(1);
        let counts = [3, 1, 4, 1, 5];
        let mut seen = [0u32; 5];
        for _ in 0..200 {
            seen[least_loaded_of(&counts, &mut rng)] += 1;
        }
        assert_eq!((seen[0], seen[2], seen[4]), (0, 0, 0));
        assert!(seen[1] > 0 && seen[3] > 0, "{seen:?}");
        assert_eq!(least_loaded_of(&[], &mut rng), 0);
    }
}
