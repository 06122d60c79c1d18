//! Routing policies: one trait, one file per policy.
//!
//! Each policy holds its own settings, built once by [`Router::new`](crate::Router::new) from
//! the [`RouterConfig`](crate::RouterConfig); a policy never reads the whole configuration.
//!
//! A policy sees the ready pods with their loads (and, for prefix-aware policies, the
//! request's block hashes and the prefix index) and returns a [`Choice`]. Counting the request
//! against the chosen pod and recording its prefix in the index are done by the
//! [`Router`](crate::Router) after the choice, the same way for every policy.

use std::fmt;

use rand::RngCore;
use smallvec::SmallVec;

use crate::Millis;
use crate::decision::Selection;
use crate::index::{FoundBlocks, PrefixIndex, Recall};
use crate::load::Candidate;

mod least_request;
mod prefix_cache;
pub mod prefix_load;
mod random;
pub mod session_affinity;

pub use least_request::LeastRequest;
pub use prefix_cache::PrefixCache;
pub use prefix_load::PrefixLoad;
pub use random::Random;
pub use session_affinity::{Session, SessionAffinity};

/// The strategies these policies implement (defined in their own module so that the decision
/// record can name them without depending on the policies).
pub use crate::strategy::{Strategy, UnknownStrategy};

/// A decision's per-candidate scratch (loads, candidates, matches, costs): up to 16 pods
/// it stays on the stack, so a decision allocates nothing for it; more spill to the heap.
pub(crate) type PerPod<T> = SmallVec<[T; 16]>;

/// What a policy is given to decide with.
pub struct PolicyInput<'a> {
    pub model: &'a str,
    /// The ready pods; never empty and never a single pod (the router short-circuits those).
    pub pods: &'a [Candidate<'a>],
    /// The request's block hashes; empty for policies that do not use the index.
    pub hashes: &'a [u64],
    pub index: &'a PrefixIndex,
    /// Where the policy's match found the request's blocks
    /// ([`PrefixIndex::match_pods_noting`]), for the router's re-add of them after the
    /// choice; a policy that matches on the index fills it, others leave it empty.
    pub found: FoundBlocks,
    /// `prefix-load`'s longer memory of placements, when on (no other policy reads it).
    pub recall: Option<&'a Recall>,
    /// The session the request names, if any (read by `session-affinity` and `prefix-load`).
    pub session: Session<'a>,
    pub rng: &'a mut dyn RngCore,
    /// The caller's clock (see [`Millis`]), for signals that age.
    pub now: Millis,
}

impl fmt::Debug for PolicyInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyInput")
            .field("model", &self.model)
            .field("pods", &self.pods)
            .field("hashes", &self.hashes.len())
            .finish_non_exhaustive()
    }
}

/// A policy's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Index into [`PolicyInput::pods`].
    pub pod: usize,
    pub selection: Option<Selection>,
    pub match_percent: Option<u8>,
    pub imbalance: bool,
    /// The hash of the deepest block the request shares with the best-matching pod, when a
    /// prefix-aware policy found one (counted per pod, see `RequestWork::shared_prefix`).
    pub shared_prefix: Option<u64>,
}

impl Choice {
    /// A choice made without the prefix index.
    pub fn plain(pod: usize) -> Self {
        Choice {
            pod,
            selection: None,
            match_percent: None,
            imbalance: false,
            shared_prefix: None,
        }
    }
}

/// A routing policy.
pub trait Policy: Send + Sync + fmt::Debug {
    /// Picks one of `input.pods`. Called with at least two pods.
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice;
}
