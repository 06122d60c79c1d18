//! The prefill the fleet has been offered lately, for the overload rule ([`super::slo`]): the
//! blocks each request brings to prefill at its best pod (its fewest uncached blocks), summed
//! with exponential decay over [`OFFERED_WINDOW_MS`], a rate in blocks per millisecond.
//!
//! The overload rule compares it with what the pods can prefill at their learned rates: a
//! backlog the fleet is offered less than it can prefill (a burst, the cold start of a phase,
//! one prompt too long for the SLO anywhere) drains by itself, and a pod given up for it would
//! stay backed up past it; a backlog offered faster than the fleet prefills only grows.

use std::sync::{Mutex, PoisonError};

use crate::Millis;

/// How long an offered block counts (the decay's time constant). Long enough that a burst's
/// requests spread over it (the gamma-4 bursts of config/workloads/bursts.toml), short enough
/// that a phase overloaded from its first request is seen as one within its first minute: at
/// 30 s the 3k-token overload case gained 19 of its 154 (211 against 192), at 15 s 66, at
/// 10 s 98, at 6 s 91 (docs/POLICY-EVALUATION.md, "The overload rule, gated by the offered
/// prefill").
pub const OFFERED_WINDOW_MS: f64 = 10_000.0;

/// The decaying sum (see the module docs). One lock per decision, held for a few arithmetic
/// operations.
#[derive(Debug, Default)]
pub struct OfferedPrefill {
    state: Mutex<Decaying>,
}

#[derive(Debug, Default)]
struct Decaying {
    /// When `per_ms` was last brought up to date.
    at: Millis,
    /// Blocks per millisecond at `at`.
    per_ms: f64,
}

impl OfferedPrefill {
    /// Adds a request that brings `blocks` to prefill at `now`, and returns the rate offered
    /// with it, in blocks per millisecond. A `now` earlier than the last one (another
    /// gateway thread's clock read racing this one) counts as the same instant.
    pub fn offer(&self, now: Millis, blocks: u64) -> f64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_sub(state.at) as f64;
        state.per_ms =
            state.per_ms * (-elapsed / OFFERED_WINDOW_MS).exp() + blocks as f64 / OFFERED_WINDOW_MS;
        state.at = state.at.max(now);
        state.per_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_stream_settles_at_its_rate_and_a_pause_lets_it_decay() {
        let offered = OfferedPrefill::default();
        // 50 blocks every 100 ms: 0.5 blocks per ms, reached within a few windows.
        let mut rate = 0.0;
        for i in 0..1_000 {
            rate = offered.offer(i * 100, 50);
        }
        assert!((rate - 0.5).abs() < 0.02, "{rate}");
        // One window later with one small request, e⁻¹ of it is left.
        let later = offered.offer(99_900 + 10_000, 0);
        assert!((later - rate / std::f64::consts::E).abs() < 1e-9, "{later}");
    }

    #[test]
    fn a_burst_counts_once_over_the_window() {
        let offered = OfferedPrefill::default();
        // 20 requests of 300 blocks at once: 6 000 blocks over 10 s, 0.6 per ms, whatever
        // rate they arrived at.
        let mut rate = 0.0;
        for _ in 0..20 {
            rate = offered.offer(5_000, 300);
        }
        assert!((rate - 0.6).abs() < 1e-9, "{rate}");
        // A clock read that lags the last one does not decay it backwards.
        assert!((offered.offer(4_000, 0) - 0.6).abs() < 1e-9);
    }
}
