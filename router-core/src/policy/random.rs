//! `random`: uniform over the ready pods.

use rand::Rng;

use super::{Choice, Policy, PolicyInput};

#[derive(Debug, Default)]
pub struct Random;

impl Policy for Random {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        Choice::plain(input.rng.random_range(0..input.pods.len()))
    }
}
