//! The shared load view: a pod's local load plus what the other gateways of the cluster
//! have in flight there ([`PodLoad::peers`]).
//!
//! Policies read counts through these, so with cluster sharing on they see the requests of
//! every gateway, and without it (no peer ever counted) the numbers are the local ones,
//! exactly. The local readings ([`PodLoad::outstanding`] and the rest) stay local: they are
//! what this gateway's own guards hold, its metrics report and its tests count back to 0.

use crate::load::{PodLoad, PrefixCounts};

impl PodLoad {
    /// Outstanding requests here, this gateway's and its peers'.
    pub fn shared_outstanding(&self) -> u64 {
        self.outstanding() + self.peers().map_or(0, |peers| peers.outstanding())
    }

    /// Prompt blocks of every gateway's outstanding requests here.
    pub fn shared_active_blocks(&self) -> u64 {
        self.active_blocks() + self.peers().map_or(0, |peers| peers.active_blocks())
    }

    /// Blocks every gateway's outstanding requests here have yet to prefill.
    pub fn shared_pending_prefill_blocks(&self) -> u64 {
        self.pending_prefill_blocks()
            + self
                .peers()
                .map_or(0, |peers| peers.pending_prefill_blocks())
    }

    /// Every gateway's requests here sharing `prefix`, and copies of it in progress.
    pub fn shared_prefix_counts(&self, prefix: u64) -> PrefixCounts {
        let local = self.prefix_counts(prefix);
        match self.peers() {
            None => local,
            Some(peers) => {
                let remote = peers.prefix_counts(prefix);
                PrefixCounts {
                    outstanding: local.outstanding + remote.outstanding,
                    copying: local.copying + remote.copying,
                }
            }
        }
    }
}
