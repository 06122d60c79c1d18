//! `prefix-cache`: AIBrix v0.7.0's prefix-cache policy, exactly.
//!
//! (Placeholder: least-request until the router-core issue lands the real policy.)

use super::least_request::least_loaded;
use super::{Choice, Policy, PolicyInput};

#[derive(Debug, Default)]
pub struct PrefixCache;

impl Policy for PrefixCache {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        Choice::plain(least_loaded(input.pods, input.rng))
    }
}
