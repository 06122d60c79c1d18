//! What the engines' own reports say about the prefix index: how far its beliefs about one
//! replica's cache can be trusted, learned from every response that carries
//! `usage.prompt_tokens_details.cached_tokens` (docs/ROUTING.md, "Learning from responses").
//!
//! A response from replica R for a prompt of `n` full router blocks, `k` of which the index
//! said R held when the request was routed (the decision's match), reports `c` cached of
//! `P` prompt tokens. That is a statement about R's cache **when the request was scheduled**:
//! R then held the prompt's first `c` tokens and not the next ones. It says nothing new about
//! R's cache **now**: R has just computed the whole prompt and keeps it until it evicts it,
//! which is what the index already records (it added every block for R at the decision). So
//! no block of the index is added or removed. What the report measures is the index's error
//! on R: blocks it believed R held that R had lost (evicted, a restart, prefix caching off),
//! and blocks R held that the index did not credit to it (warm-up traffic sent straight to
//! the engine, another gateway without cluster sharing, the index's own capacity). Those
//! rates are what this module learns, per replica, for `prefix-load` to discount what the
//! index says about that replica's other prompts ([`CacheTrust`]).
//!
//! The rule, per response (`h = ⌊n·c/P⌋`, the report in router blocks; `s = max(1, ⌈n/32⌉)`
//! blocks of slack, because vLLM never reports the prompt's last engine block and router
//! blocks (bytes) and engine tokens do not divide exactly):
//! - `h + s < k`: **missed**: `k − h` of the believed blocks were not there;
//! - `h > k + s`: **surprised**: `h − k` blocks were there that the index did not credit;
//! - otherwise **confirmed**.
//!
//! Over a replica's recent responses (each weighted by its blocks, older ones decaying by
//! `1/32` per response), `held = 1 − missed / believed` is the share of believed blocks that
//! were really there and `unheld = surprised / not believed` the share of the others that
//! were. Until a replica has taught anything they are 1 and 0: the index as it is.
//!
//! Responses that teach nothing: no usage (a stream without `stream_options.include_usage`);
//! a usage without `cached_tokens` from a replica that has never reported them (vLLM without
//! `--enable-prompt-tokens-details`; once a replica has reported them, their absence means
//! 0, as vLLM leaves `prompt_tokens_details` null when nothing hit); `cached_tokens` above
//! `prompt_tokens` (counted, ignored); a request routed while a copy of its prefix was still
//! prefilling on that replica (it may have caught only part of the copy, which is no error of
//! the index); and requests routed by `random` or `least-request`, which hash nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::speed::{Completed, Usage};

/// The weight of one response in the replica's running sums: older responses decay by this
/// much per response, so the rates follow about the last 32 responses.
const DECAY: f64 = 1.0 / 32.0;

/// What one response said about the index's belief (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The replica held what the index believed, within the slack.
    Confirmed,
    /// It held less: the index believed blocks it had lost.
    Missed,
    /// It held more than the index credited to it.
    Surprised,
    /// The response had usage but no `cached_tokens`, from a replica never seen reporting
    /// them: nothing learned.
    Unreported,
    /// `cached_tokens` above `prompt_tokens`: ignored.
    Invalid,
}

impl Verdict {
    /// Every verdict, in metric order.
    pub const ALL: [Verdict; 5] = [
        Verdict::Confirmed,
        Verdict::Missed,
        Verdict::Surprised,
        Verdict::Unreported,
        Verdict::Invalid,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Confirmed => "confirmed",
            Verdict::Missed => "missed",
            Verdict::Surprised => "surprised",
            Verdict::Unreported => "unreported",
            Verdict::Invalid => "invalid",
        }
    }
}

/// How far the index's view of one replica can be trusted (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheTrust {
    /// The share of the blocks the index believes the replica holds that it really holds.
    pub held: f64,
    /// The share of the blocks the index does not credit to the replica that it holds.
    pub unheld: f64,
}

impl Default for CacheTrust {
    /// The index as it is.
    fn default() -> Self {
        CacheTrust {
            held: 1.0,
            unheld: 0.0,
        }
    }
}

impl CacheTrust {
    /// The blocks a replica is expected to hold of a `blocks`-block prompt of which the
    /// index says it holds `believed`, with `weight` (0 to 1) of the correction applied:
    /// `believed − weight·believed·(1 − held) + weight·(blocks − believed)·unheld`, rounded.
    pub fn expected_held(&self, blocks: u64, believed: u64, weight: f64) -> u64 {
        let believed = believed.min(blocks) as f64;
        let lost = believed * (1.0 - self.held);
        let found = (blocks as f64 - believed) * self.unheld;
        let expected = believed + weight * (found - lost);
        (expected.round().max(0.0) as u64).min(blocks)
    }
}

/// The running sums, in blocks, decayed per response.
#[derive(Debug, Default)]
struct Sums {
    believed: f64,
    missed: f64,
    unbelieved: f64,
    surprised: f64,
}

/// One replica's evidence (see the module docs). Updates take a short lock; reads are
/// lock-free (the rates are published as `f64` bits), since `prefix-load` reads them for
/// every pod of every decision.
#[derive(Debug)]
pub struct CacheEvidence {
    sums: Mutex<Sums>,
    /// `f64` bits of [`CacheTrust::held`].
    held: AtomicU64,
    /// `f64` bits of [`CacheTrust::unheld`].
    unheld: AtomicU64,
    /// Whether the replica has ever reported `cached_tokens` (then their absence means 0).
    reports_cached: AtomicBool,
}

impl Default for CacheEvidence {
    fn default() -> Self {
        let trust = CacheTrust::default();
        CacheEvidence {
            sums: Mutex::new(Sums::default()),
            held: AtomicU64::new(trust.held.to_bits()),
            unheld: AtomicU64::new(trust.unheld.to_bits()),
            reports_cached: AtomicBool::new(false),
        }
    }
}

impl CacheEvidence {
    /// What the replica's reports have taught so far.
    pub fn trust(&self) -> CacheTrust {
        CacheTrust {
            held: f64::from_bits(self.held.load(Ordering::Relaxed)),
            unheld: f64::from_bits(self.unheld.load(Ordering::Relaxed)),
        }
    }

    /// `usage` with its `cached_tokens` as vLLM means them: the report, or 0 when there is
    /// none but this replica has reported them before (vLLM leaves `prompt_tokens_details`
    /// null when nothing hit); left absent when unknown.
    pub fn normalize(&self, mut usage: Usage) -> Usage {
        if usage.cached_tokens.is_some() {
            self.reports_cached.store(true, Ordering::Relaxed);
        } else if self.reports_cached.load(Ordering::Relaxed) {
            usage.cached_tokens = Some(0);
        }
        usage
    }

    /// Learns from one finished request whose usage was [normalized](Self::normalize);
    /// `None` when it teaches nothing at all (no usage, no blocks, or routed behind a copy in
    /// progress: see the module docs).
    pub fn observe(&self, done: &Completed) -> Option<Verdict> {
        let usage = done.usage?;
        if done.blocks == 0 || done.behind_copy || usage.prompt_tokens == 0 {
            return None;
        }
        let Some(cached) = usage.cached_tokens else {
            return Some(Verdict::Unreported);
        };
        if cached > usage.prompt_tokens {
            return Some(Verdict::Invalid);
        }
        let n = done.blocks;
        let believed = n - done.prefill_blocks.min(n);
        let reported =
            (u128::from(n) * u128::from(cached) / u128::from(usage.prompt_tokens)) as u64;
        let slack = n.div_ceil(32).max(1);
        let (verdict, missed, surprised) = if reported + slack < believed {
            (Verdict::Missed, believed - reported, 0)
        } else if reported > believed + slack {
            (Verdict::Surprised, 0, reported - believed)
        } else {
            (Verdict::Confirmed, 0, 0)
        };
        let mut sums = self.sums.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = 1.0 - DECAY;
        sums.believed = sums.believed * keep + believed as f64;
        sums.missed = sums.missed * keep + missed as f64;
        sums.unbelieved = sums.unbelieved * keep + (n - believed) as f64;
        sums.surprised = sums.surprised * keep + surprised as f64;
        let held = if sums.believed > 0.0 {
            1.0 - sums.missed / sums.believed
        } else {
            1.0
        };
        let unheld = if sums.unbelieved > 0.0 {
            sums.surprised / sums.unbelieved
        } else {
            0.0
        };
        self.held
            .store(held.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
        self.unheld
            .store(unheld.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
        Some(verdict)
    }
}

#[cfg(test)]
#[path = "evidence_tests.rs"]
mod tests;
