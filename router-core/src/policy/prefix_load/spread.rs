//! Ties and herding: which of the cheapest pods takes the request.
//!
//! The cost model's figures are estimates: the work of the requests in flight depends on
//! output lengths nobody knows yet, and with cluster sharing the other gateways' requests
//! arrive a message late. Two pods whose costs differ by less than that error are equally
//! good as far as the model can tell, and always taking the cheaper one sends a burst (or
//! several gateways reading the same stale figures) to one pod. So every pod whose cost is
//! within `spread_fraction` of the cheapest's counts as best, and among them the request
//! goes to the one with the fewest requests in flight (every gateway's, the count nothing
//! estimates), then to one of those uniformly at random, which several gateways draw
//! independently of each other.
//!
//! At `spread_fraction = 0` only exact ties count, and the choice among them is uniform, as
//! before the rule existed.

use rand::Rng;

use crate::load::Candidate;

/// The pod to choose given each pod's `costs` (see the module docs).
pub fn near_best(
    costs: &[f64],
    pods: &[Candidate<'_>],
    spread_fraction: f64,
    rng: &mut dyn rand::RngCore,
) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    if spread_fraction == 0.0 || !min.is_finite() {
        return uniform_among(costs.len(), |i| costs[i] == min, rng);
    }
    let within = min + spread_fraction * min;
    let near = |i: usize| costs[i] <= within;
    let fewest = (0..costs.len())
        .filter(|&i| near(i))
        .map(|i| pods[i].load.shared_outstanding())
        .min()
        .unwrap_or(0);
    uniform_among(
        costs.len(),
        |i| near(i) && pods[i].load.shared_outstanding() == fewest,
        rng,
    )
}

/// A uniformly random index below `n` that `keep` keeps (0 when it keeps none). The random
/// number is drawn only when more than one is kept.
fn uniform_among(n: usize, keep: impl Fn(usize) -> bool, rng: &mut dyn rand::RngCore) -> usize {
    let mut kept = (0..n).filter(|&i| keep(i));
    let pick = match kept.clone().count() {
        0 | 1 => 0,
        count => rng.random_range(0..count),
    };
    kept.nth(pick).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::load::PodLoad;

    fn pods<'a>(names: &'a [&'a str], loads: &'a [Arc<PodLoad>]) -> Vec<Candidate<'a>> {
        names
            .iter()
            .zip(loads)
            .map(|(&name, load)| Candidate {
                name,
                address: name,
                load,
            })
            .collect()
    }

    #[test]
    fn without_spread_only_exact_ties_share_and_uniformly() {
        let loads = [PodLoad::new(), PodLoad::new(), PodLoad::new()];
        let pods = pods(&["a", "b", "c"], &loads);
        let mut rng = StdRng::seed_from_u64(3);
        let mut seen = [0u32; 3];
        for _ in 0..300 {
            seen[near_best(&[10.0, 10.0, 10.1], &pods, 0.0, &mut rng)] += 1;
        }
        assert_eq!(seen[2], 0, "{seen:?}");
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
    }

    #[test]
    fn within_the_spread_the_fewest_in_flight_win_then_a_draw() {
        let loads = [
            PodLoad::with_outstanding(3),
            PodLoad::with_outstanding(1),
            PodLoad::with_outstanding(1),
            PodLoad::with_outstanding(0),
        ];
        let pods = pods(&["a", "b", "c", "d"], &loads);
        let mut rng = StdRng::seed_from_u64(4);
        let mut seen = [0u32; 4];
        // a is cheapest; b and c are within 5 % of it; d, idle, is not.
        let costs = [100.0, 104.0, 105.0, 106.0];
        for _ in 0..300 {
            seen[near_best(&costs, &pods, 0.05, &mut rng)] += 1;
        }
        assert_eq!((seen[0], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[1] > 100 && seen[2] > 100, "{seen:?}");
    }

    #[test]
    fn infinite_costs_are_never_near_a_finite_one() {
        let loads = [PodLoad::new(), PodLoad::new()];
        let pods = pods(&["a", "b"], &loads);
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..50 {
            assert_eq!(near_best(&[f64::INFINITY, 0.0], &pods, 1.0, &mut rng), 1);
        }
    }
}
