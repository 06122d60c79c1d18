//! The load the fleet has been offered lately, for the overload rule ([`super::slo`]): the
//! blocks each request brings to prefill at its best pod (its fewest uncached blocks), summed
//! with exponential decay over [`OFFERED_WINDOW_MS`] (a rate in blocks per millisecond), and
//! the fleet's outstanding requests averaged over the same window.
//!
//! The overload rule compares the blocks with what the pods prefill at their learned rates,
//! and the outstanding requests now with their mean: a backlog the fleet is offered less
//! prefill than it does, or whose queue for batch slots is shrinking (a burst, the cold start
//! of a phase, one prompt too long for the SLO anywhere), drains by itself, and a pod given up
//! for it would stay backed up past it; a backlog offered faster than the fleet prefills, or
//! whose slot queue does not shrink, only grows.

use std::sync::{Mutex, PoisonError};

use crate::Millis;

/// How long an offered block (and an outstanding request) counts (the decay's time constant). Long enough that a burst's
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
    /// The fleet's outstanding requests, averaged over the window in time.
    pub outstanding_mean: f64,
    /// The fleet's outstanding requests at this decision (counted once, by the caller).
    pub outstanding: u64,
}

/// The decaying sum and mean (see the module docs). One lock per decision, held for a few arithmetic
/// operations.
#[derive(Debug, Default)]
pub struct OfferedLoad {
    state: Mutex<Decaying>,
}

#[derive(Debug, Default)]
struct Decaying {
    /// When `offered` was last brought up to date.
    at: Millis,
    /// What was offered, as of `at`.
    offered: Offered,
}

impl OfferedLoad {
    /// Adds a request that brings `blocks` to prefill at `now`, routed while the fleet had
    /// `outstanding` requests, and returns what was offered with it. A `now` earlier than the last one (another gateway thread's clock read racing
    /// this one) counts as the same instant.
    pub fn offer(&self, now: Millis, blocks: u64, outstanding: u64) -> Offered {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_sub(state.at) as f64;
        let kept = (-elapsed / OFFERED_WINDOW_MS).exp();
        let last = state.offered;
        state.offered = Offered {
            blocks_per_ms: last.blocks_per_ms * kept + blocks as f64 / OFFERED_WINDOW_MS,
            outstanding_mean: last.outstanding_mean * kept + outstanding as f64 * (1.0 - kept),
            outstanding,
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
        let mut rate = Offered::default();
        for i in 0..1_000 {
            rate = offered.offer(i * 100, 50, 0);
        }
        assert!((rate.blocks_per_ms - 0.5).abs() < 0.02, "{rate:?}");
        // One window later with one request bringing nothing to prefill, e⁻¹ of the blocks
        // is left.
        let later = offered.offer(99_900 + 10_000, 0, 0);
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
            rate = offered.offer(5_000, 300, 0);
        }
        assert!((rate.blocks_per_ms - 0.6).abs() < 1e-9, "{rate:?}");
        // A clock read that lags the last one does not decay it backwards.
        assert!((offered.offer(4_000, 0, 0).blocks_per_ms - 0.6).abs() < 1e-9);
    }

    #[test]
    fn the_outstanding_mean_trails_a_growing_queue_and_leads_a_draining_one() {
        let offered = OfferedLoad::default();
        // One request more outstanding every 500 ms: the mean lags the count.
        let mut last = Offered::default();
        for i in 0..40 {
            last = offered.offer(i * 500, 0, 10 + i);
        }
        assert!(last.outstanding_mean < 49.0, "{last:?}");
        // Then the queue drains by one every 500 ms: the count falls below the mean.
        for i in 0..10 {
            last = offered.offer(20_000 + i * 500, 0, 49 - 4 * i);
        }
        assert!(last.outstanding_mean > 13.0, "{last:?}");
    }
}
