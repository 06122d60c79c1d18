//! `least-request`: the minimum outstanding count, uniform among ties.

use rand::Rng;
use rand::RngCore;

use super::{Choice, Policy, PolicyInput};
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
    let counts: Vec<u64> = pods.iter().map(|pod| pod.load.outstanding()).collect();
    let min = counts.iter().copied().min().unwrap_or(0);
    let minima: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] == min).collect();
    minima[rng.random_range(0..minima.len())]
}
