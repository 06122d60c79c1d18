//! The load the fleet has been offered lately, for the overload rule ([`super::slo`]): the
//! blocks each request brings to prefill at its best pod (its fewest uncached blocks), and
//! the requests themselves, each summed with exponential decay over [`OFFERED_WINDOW_MS`],
//! rates per millisecond.
//!
//! The overload rule compares them with what the pods can do at their learned rates: the
//! blocks with what they prefill, the requests with how many their batch slots finish. A
//! backlog the fleet is offered less than it can serve (a burst, the cold start of a phase,
//! one prompt too long for the SLO anywhere) drains by itself, and a pod given up for it would
//! stay backed up past it; a backlog offered faster than the fleet prefills, or than its
//! slots turn over, only grows.

use std::sync::{Mutex, PoisonError};

use crate::Millis;

/// How long an offered block counts (the decay's time constant). Long enough that a burst's
/// requests spread over it (the gamma-4 bursts of config/workloads/bursts.toml), short enough
/// that a phase overloaded from its first request is seen as one within its first minute: at
/// 30 s the 3k-token overload case gained 19 of its 154 (211 against 192), at 15 s 66, at
/// 10 s 98, at 6 s 91 (docs/POLICY-EVALUATION.md, "The overload rule, gated by the offered
/// prefill").
pub const OFFERED_WINDOW_MS: f64 = 10_000.0;

/// What the fleet has been offered lately, per millisecond (see the module docs).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Offered {
    /// Blocks to prefill (each request's fewest uncached blocks).
    pub blocks_per_ms: f64,
    /// Requests, each of which holds a batch slot until it ends.
    pub requests_per_ms: f64,
}

/// The decaying sums (see the module docs). One lock per decision, held for a few arithmetic
/// operations.
#[derive(Debug, Default)]
pub struct OfferedLoad {
    state: Mutex<Decaying>,
}

#[derive(Debug, Default)]
struct Decaying {
    /// When `offered` was last brought up to date.
    at: Millis,
    /// The rates at `at`.
    offered: Offered,
}

impl OfferedLoad {
    /// Adds a request that brings `blocks` to prefill at `now`, and returns the rates offered
    /// with it. A `now` earlier than the last one (another gateway thread's clock read racing
    /// this one) counts as the same instant.
    pub fn offer(&self, now: Millis, blocks: u64) -> Offered {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_sub(state.at) as f64;
        let kept = (-elapsed / OFFERED_WINDOW_MS).exp();
        let last = state.offered;
        state.offered = Offered {
            blocks_per_ms: last.blocks_per_ms * kept + blocks as f64 / OFFERED_WINDOW_MS,
            requests_per_ms: last.requests_per_ms * kept + 1.0 / OFFERED_WINDOW_MS,
        };
        state.at = state.at.max(now);
        state.offered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_stream_settles_at_its_rate_and_a_pause_lets_it_decay() {
        let offered = OfferedLoad::default();
        // 50 blocks every 100 ms: 0.5 blocks per ms, reached within a few windows.
        // One request every 100 ms: 0.01 requests per ms.
        let mut rate = Offered::default();
        for i in 0..1_000 {
            rate = offered.offer(i * 100, 50);
        }
        assert!((rate.blocks_per_ms - 0.5).abs() < 0.02, "{rate:?}");
        assert!((rate.requests_per_ms - 0.01).abs() < 0.0004, "{rate:?}");
        // One window later with one request bringing nothing to prefill, e⁻¹ of the blocks
        // is left.
        let later = offered.offer(99_900 + 10_000, 0);
        let decayed = rate.blocks_per_ms / std::f64::consts::E;
        assert!((later.blocks_per_ms - decayed).abs() < 1e-9, "{later:?}");
    }

    #[test]
    fn a_burst_counts_once_over_the_window() {
        let offered = OfferedLoad::default();
        // 20 requests of 300 blocks at once: 6 000 blocks over 10 s, 0.6 per ms, whatever
        // rate they arrived at.
        let mut rate = Offered::default();
        for _ in 0..20 {
            rate = offered.offer(5_000, 300);
        }
        assert!((rate.blocks_per_ms - 0.6).abs() < 1e-9, "{rate:?}");
        assert!((rate.requests_per_ms - 0.002).abs() < 1e-12, "{rate:?}");
        // A clock read that lags the last one does not decay it backwards.
        assert!((offered.offer(4_000, 0).blocks_per_ms - 0.6).abs() < 1e-9);
    }
}
