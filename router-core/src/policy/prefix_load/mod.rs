//! `prefix-load`: prefixgate's default policy, a cost model over cache and load.
//!
//! For each ready pod it estimates, in prompt blocks of work, what this request would cost
//! there, and picks the cheapest, taking costs within `spread_fraction` of it as equal (then
//! the fewest requests in flight, then a draw: [`spread`]):
//!
//! ```text
//! cost(pod) = w · uncached(pod)                     this request's prefill there
//!           + active(pod)                           work already placed there
//!           + pending_weight · pending(pod)         prefills queued ahead of it there
//!           + waiting_weight · waiting(pod) · mean  the engine's slot queue, when scraped
//!           + family_weight · blocks · share(pod)   for a new family only: the families
//!                                                   this pod is committed to
//!           + copy_weight · prefill_weight · uncached(pod) / (1 + n)
//!                                                   for a copy only (a pod below the best
//!                                                   match): n = the prefix's requests in
//!                                                   flight on its best holders
//! w = idle_prefill_weight on a pod with nothing outstanding, prefill_weight otherwise
//! ```
//!
//! - `uncached` = the request's full blocks minus those the pod holds as a leading run, per
//!   the prefix index (`match% × blocks`, as `prefix-cache` matches) or, when longer, its
//!   recall of placements the index forgot ([`crate::index::Recall`]), corrected by what
//!   the pod's responses taught about the index's view of it (`learn_weight`; the
//!   engines' `cached_tokens`, [`crate::load::CacheTrust`]).
//! - `active` = prompt blocks of the pod's outstanding requests ([`PodLoad::active_blocks`]):
//!   Dynamo's "active decode blocks", which scales with request size, unlike a count.
//! - `pending` = blocks the pod's outstanding requests have yet to prefill
//!   ([`PodLoad::pending_prefill_blocks`], released at the first response byte).
//! - `waiting` = the engine's `vllm:num_requests_waiting` when scraped (absent otherwise),
//!   each queued request priced at the pod's mean active blocks per outstanding request, and
//!   only while the gateway sees no prefill pending there: then the queue is slot-bound (a
//!   new request waits for a whole request to finish), whereas a queue of pending prefills
//!   is already priced by `pending`.
//! - `w`: a prefill on a busy pod shares its steps and delays what is queued there, so it is
//!   priced above the work it displaces (`prefill_weight`); on an idle pod it delays no one
//!   and runs at full speed, so it costs little more than its own blocks
//!   (`idle_prefill_weight`). That is what copies a hot prefix to an idle pod *early*, while
//!   the copy is fast enough to meet a TTFT SLO, instead of once its owner saturates and the
//!   copy must share a busy engine. The idle price applies only to a prefix that is new or
//!   in use (a pod holding it has one of its requests outstanding): a prefix nobody is
//!   requesting right now gains nothing from a second home.
//! - `share`: for a prompt no pod holds any block of (a new family), the pod's share of the
//!   prompt families routed lately to any pod ([`RecentFamilies`](crate::families)). Each
//!   family a pod serves will keep sending its requests there, so that is the load the pod
//!   is committed to, which its outstanding requests only sample (a family between two
//!   requests has none outstanding). As a share it is bounded by `family_weight` prompts,
//!   and it is scaled by the fraction of those families that have recurred, so one-off
//!   prompts (which would only even out arrivals, at a cost on unequal pods) steer nothing.
//! - The copy price (off unless `copy_weight` > 0): a copy's prefill is paid once and shared
//!   by the prefix's later requests, and the requests in flight on its holders measure how
//!   many there will be (Little's law), so a hot prefix is copied nearly at cost and a family
//!   with few requests left is not. It needs an index that sees every holder (KV-event
//!   sync): on a blind index a real hit elsewhere looks like a copy and is priced as one.
//! - A session ([`crate::policy::session_affinity`]): the pod the request's session names
//!   served its earlier turns, which this one resends, so `uncached` there is at most
//!   `(1 − session_held_share) × blocks` whatever the index says. Weighed against load like
//!   any cache: a session stays while its pod has room and moves when it does not.
//! - A copy in progress is not a hit: the index records a prefix for a pod as soon as a
//!   request is routed there, but until that request's first byte the pod is still
//!   prefilling it, and a request sent after it would wait for the copy and slow it down.
//!   So while a pod is copying the request's prefix ([`PrefixCounts::copying`]), the
//!   request's whole prompt counts as uncached there.
//!
//! **The SLO** (`ttft_slo_seconds`, [`slo`]): each pod's expected first token for the request
//! is its wait for a batch slot (the ends of its decoding streams, each at its own pace,
//! then the mean turnover), then the prefill pending there and the request's own, at its
//! learned rate. While some busy pod is expected past the SLO and some pod in time, the late
//! ones are passed over (**in time**). When every pod is busy and late and the prefill
//! offered lately ([`offered`]) outruns what the pods prefill at their learned rates, the
//! request goes to the most backed-up of the pods where it adds the least prefill, and the
//! others keep answering within the SLO (**overload**). The cost model chooses among the
//! pods left. While every pod is late but the fleet prefills faster than it is offered (a
//! backlog that drains by itself), or the only late pod is idle, nothing is passed over.
//!
//! The prefix of a request is named by the hash of the deepest block it shares with its best
//! holder; [`PodLoad`] counts each pod's outstanding requests and copies per prefix.
//!
//! Every load signal is read through the shared view (`PodLoad::shared_*`,
//! [`crate::cluster`]): with cluster sharing on, the other gateways' requests in flight count
//! as this gateway's own do; a lone gateway's are its own.
//!
//! So a cached pod with spare room wins (its prefill term is small), a hot prefix's owner
//! loses to an idle pod once it carries more than `idle_prefill_weight` requests' work, and
//! to a busy pod once its extra work outweighs `prefill_weight` prefills of the prefix (then
//! both hold it and load decides between them), and a cold family stays with its first pod
//! while loads are within `prefill_weight` prompts of each other.
//!
//! **Slow replicas** (`give_up_late_seconds`, [`give_up`]): a pod whose prefill, measured
//! while it was idle, is well above the fastest pod's is slow, and given up while its latest
//! answer is later than the setting. While a pod is given up and no other pod has room for
//! the request (each is expected past the TTFT SLO, or every engine has a queue), the
//! request goes to the given-up pods, where it is late anyway, and the fast pods keep what
//! they can serve in time. Otherwise a busy slow pod takes no copy it cannot prefill within
//! the SLO while another pod can answer in time.
//!
//! Each rule only narrows what the rules before it left (the SLO's, then slow replicas);
//! where a rule would leave no pod, it is skipped.
//!
//! With no full block (an empty or short prompt) nothing can be cached: the choice is by
//! outstanding count, as `least-request`.
//!
//! Decision records: `selection` is `prefix_match` when the chosen pod has the best match
//! among the pods and matched something, `least_request_fallback` when no pod matched, and
//! `cost_model` when load made it pick a pod with a smaller match than the best (a hot
//! prefix spilling to a second pod); `imbalance` is set on exactly those `cost_model`
//! decisions, so `aibrix_prefix_cache_load_imbalance_total` counts load overriding the cache.

use super::least_request::least_loaded_of;
use super::{Choice, PerPod, Policy, PolicyInput};
use crate::decision::Selection;
use crate::families::FamilyCount;
use crate::index::{PodMatch, match_percent};
use crate::load::{PodLoad, PrefixCounts};

pub mod config;
mod expected;
mod give_up;
mod offered;
pub mod slo;
mod spread;

pub use config::PrefixLoadConfig;

/// `prefix-load` with its weights.
#[derive(Debug, Default)]
pub struct PrefixLoad {
    weights: PrefixLoadConfig,
    /// The prefill offered lately, read by the overload rule (recorded only while it is on).
    offered: offered::OfferedLoad,
}

impl PrefixLoad {
    /// The policy with `weights` (validated by the caller, see [`PrefixLoadConfig::validate`]).
    pub fn new(weights: PrefixLoadConfig) -> Self {
        PrefixLoad {
            weights,
            offered: offered::OfferedLoad::default(),
        }
    }

    /// The window over which a pod's prompt families are counted, when the family term is on
    /// (`None` when it is off: then nothing needs recording).
    pub fn family_window(&self) -> Option<crate::Millis> {
        (self.weights.family_weight > 0.0).then(|| self.weights.family_window_millis())
    }
}

impl Policy for PrefixLoad {
    fn choose(&self, input: &mut PolicyInput<'_>) -> Choice {
        let blocks = input.hashes.len() as u64;
        let mut held: PerPod<PodMatch> = input.pods.iter().map(|p| PodMatch::new(p.name)).collect();
        input
            .index
            .match_pods_noting(input.model, input.hashes, &mut held, &mut input.found);
        if let Some(recall) = input.recall {
            recall.extend(input.model, input.hashes, &mut held);
        }
        let percents: PerPod<u8> = held
            .iter()
            .map(|pod| match_percent(pod.held(), input.hashes.len()))
            .collect();
        if blocks == 0 {
            return by_outstanding(input);
        }
        let best = percents.iter().copied().max().unwrap_or(0);
        // The prefix is named by the deepest block it shares with its best holder.
        let held = blocks - uncached_blocks(blocks, best);
        let shared_prefix = held
            .checked_sub(1)
            .and_then(|last| input.hashes.get(last as usize).copied());
        let session_pod = (self.weights.session_held_share > 0.0)
            .then(|| input.session.pod(input.pods))
            .flatten();
        let (mut costs, uncached, in_flight) =
            self.costs(input, &percents, best, shared_prefix, session_pod);
        // A copy the slow-replica copy filter may hold back: of a held prefix that is not hot
        // (a hot prefix's later requests repay a late first copy).
        let cold_copy = best > 0 && in_flight < config::HOT_IN_FLIGHT;
        if let Some(slo) = self.weights.ttft_slo_millis() {
            let least = uncached.iter().copied().min().unwrap_or(0);
            let outstanding = input.pods.iter().map(|p| p.load.shared_outstanding()).sum();
            let offered = self.offered.offer(input.now, least, outstanding);
            if let Some(kept) = slo::slo_candidates(input.pods, &uncached, slo, offered, input.now)
            {
                keep_only(&mut costs, &kept);
            }
        }
        if let Some(late) = self.weights.give_up_late_millis() {
            let slo = self.weights.ttft_slo_millis();
            let rates = give_up::IdleRates::of(input.pods);
            if let Some(given_up) = give_up::given_up_pods(input, &rates, &uncached, late, slo) {
                keep_only(&mut costs, &given_up);
            } else if let Some(slo) = slo
                && cold_copy
            {
                let targets = give_up::copy_targets(input, &rates, &percents, best, slo);
                keep_only(&mut costs, &targets);
            }
        }
        let pod = spread::near_best(&costs, input.pods, self.weights.spread_fraction, input.rng);
        let chosen = percents[pod];
        let selection = if best == 0 {
            Selection::LeastRequestFallback
        } else if chosen == best {
            Selection::PrefixMatch
        } else {
            Selection::CostModel
        };
        Choice {
            pod,
            selection: Some(selection),
            match_percent: Some(chosen),
            imbalance: selection == Selection::CostModel,
            shared_prefix,
        }
    }
}

impl PrefixLoad {
    /// Each pod's cost for a request whose best match is `best` % (`percents` per pod), and
    /// whose prefix, if any block of it is held, is named `shared_prefix`, and whose session,
    /// if it names one, is on pod `session_pod`; with the blocks the request would prefill
    /// there and the prefix's requests in flight on its best holders.
    fn costs(
        &self,
        input: &PolicyInput<'_>,
        percents: &[u8],
        best: u8,
        shared_prefix: Option<u64>,
        session_pod: Option<usize>,
    ) -> (PerPod<f64>, PerPod<u64>, u64) {
        let weights = &self.weights;
        let blocks = input.hashes.len() as u64;
        // Requests of this prefix outstanding on each pod, and copies of it still prefilling.
        let counts: PerPod<PrefixCounts> = input
            .pods
            .iter()
            .map(|pod| {
                shared_prefix
                    .map_or_else(PrefixCounts::default, |p| pod.load.shared_prefix_counts(p))
            })
            .collect();
        // An idle pod's cheap prefill is worth spending on a prefix that is new or in use;
        // one whose holders serve none of its requests right now gains nothing from a
        // second home.
        let in_use = shared_prefix.is_none()
            || percents
                .iter()
                .zip(&counts)
                .any(|(&pct, c)| pct == best && c.outstanding > 0);
        // The prefix's requests in flight on its best holders: its rate, for the copy price
        // and the slow-replica copy filter.
        let in_flight: u64 = percents
            .iter()
            .zip(&counts)
            .filter(|(pct, _)| **pct == best)
            .map(|(_, c)| u64::from(c.outstanding))
            .sum();
        // A new family brings its later requests to wherever it goes first.
        let committed = if best == 0 && weights.family_weight > 0.0 {
            family_shares(input, weights.family_window_millis())
        } else {
            PerPod::from_elem(0.0, input.pods.len())
        };
        // The session's pod served its earlier turns, which this one resends.
        let session_uncached = blocks - (weights.session_held_share * blocks as f64) as u64;
        let mut prefills = PerPod::with_capacity(input.pods.len());
        let costs = input
            .pods
            .iter()
            .zip(percents)
            .zip(&counts)
            .zip(&committed)
            .enumerate()
            .map(|(i, (((pod, &pct), c), &share))| {
                // A copy still prefilling there is not a cache hit yet: this request would
                // wait for it and slow it down, as if it prefilled the prompt itself.
                let uncached = if c.copying > 0 {
                    blocks
                } else if session_pod == Some(i) {
                    learned_uncached(pod.load, blocks, pct, weights.learn_weight)
                        .min(session_uncached)
                } else {
                    learned_uncached(pod.load, blocks, pct, weights.learn_weight)
                };
                prefills.push(uncached);
                let copy = if pct < best {
                    copy_price(weights, uncached, in_flight)
                } else {
                    0.0
                };
                pod_cost(pod.load, uncached, weights, in_use)
                    + copy
                    + weights.family_weight * blocks as f64 * share
            })
            .collect();
        (costs, prefills, in_flight)
    }
}

/// With no full block nothing can be cached: the pod with the fewest outstanding requests,
/// as `least-request`.
fn by_outstanding(input: &mut PolicyInput<'_>) -> Choice {
    let counts: PerPod<u64> = input
        .pods
        .iter()
        .map(|p| p.load.shared_outstanding())
        .collect();
    let pod = least_loaded_of(&counts, input.rng);
    Choice {
        pod,
        selection: Some(Selection::LeastRequestFallback),
        match_percent: Some(0),
        imbalance: false,
        shared_prefix: None,
    }
}

/// Blocks of a `blocks`-block request that a pod matching `percent` % must prefill.
/// `percent` was floored from a whole number of blocks, so rounding the held blocks up
/// recovers that number exactly (pct = ⌊100·k/n⌋ ⇒ k = ⌈pct·n/100⌉ for n ≤ 100; beyond,
/// within one block).
pub fn uncached_blocks(blocks: u64, percent: u8) -> u64 {
    let held = (u64::from(percent.min(100)) * blocks).div_ceil(100);
    blocks - held.min(blocks)
}

/// Blocks of a `blocks`-block request that a pod matching `percent` % must prefill, the
/// index's belief corrected by what the pod's responses taught (`learn_weight` of it;
/// [`crate::load::CacheTrust`]). Without a lesson, or at weight 0, exactly
/// [`uncached_blocks`].
fn learned_uncached(load: &PodLoad, blocks: u64, percent: u8, learn_weight: f64) -> u64 {
    let uncached = uncached_blocks(blocks, percent);
    if learn_weight == 0.0 {
        return uncached;
    }
    let trust = load.cache_trust();
    if trust == crate::load::CacheTrust::default() {
        return uncached;
    }
    blocks - trust.expected_held(blocks, blocks - uncached, learn_weight)
}

/// The estimated cost of sending a request that must prefill `uncached` blocks to `load`.
/// `idle_rule`: an idle pod's prefill may be priced at `idle_prefill_weight`.
pub fn pod_cost(load: &PodLoad, uncached: u64, weights: &PrefixLoadConfig, idle_rule: bool) -> f64 {
    let active = load.shared_active_blocks() as f64;
    // On a pod with nothing outstanding the prefill shares no step and delays no one already
    // there: it costs about its own time (and the wait of the next arrival behind it), so a
    // hot prefix is copied there early, while the copy is fast, rather than once its owner
    // saturates and every pod is busy.
    let prefill_weight = if idle_rule && load.shared_outstanding() == 0 {
        weights.idle_prefill_weight
    } else {
        weights.prefill_weight
    };
    let mut cost = prefill_weight * uncached as f64
        + active
        + weights.pending_weight * load.shared_pending_prefill_blocks() as f64;
    if let Some(stats) = load.engine_stats()
        && stats.waiting > 0
        && load.shared_pending_prefill_blocks() == 0
    {
        // With no prefill pending here the engine's queue is waiting for batch slots, and a
        // queued request delays this one by a whole request's residence, not a prefill.
        let mean = active / load.shared_outstanding().max(1) as f64;
        cost += weights.waiting_weight * f64::from(stats.waiting) * mean;
    }
    cost
}

/// Each pod's share of the prompt families lately routed to any of `input.pods`, scaled by
/// the fraction of them that have recurred (all 0 when none were routed): bounded by
/// `family_weight` prompts, and fading to nothing when the prompts turn out to be one-off
/// prompts rather than families, which would only even out arrivals.
fn family_shares(input: &PolicyInput<'_>, window: crate::Millis) -> PerPod<f64> {
    let counts: PerPod<FamilyCount> = input
        .pods
        .iter()
        .map(|pod| pod.load.families().count(input.now, window))
        .collect();
    let total: usize = counts.iter().map(|c| c.families).sum();
    let recurring: usize = counts.iter().map(|c| c.recurring).sum();
    if total == 0 {
        return PerPod::from_elem(0.0, counts.len());
    }
    let families_at_all = recurring as f64 / total as f64;
    counts
        .iter()
        .map(|c| families_at_all * c.families as f64 / total as f64)
        .collect()
}

/// What a copy of a prefix adds to its prefill's cost: `copy_weight / (1 + in_flight)` more
/// prefills, so a copy of a prefix with many requests in flight costs little more than its
/// blocks and one of a prefix with none costs up to `1 + copy_weight` times (0 when off).
fn copy_price(weights: &PrefixLoadConfig, uncached: u64, in_flight: u64) -> f64 {
    weights.prefill_weight * uncached as f64 * weights.copy_weight / (1.0 + in_flight as f64)
}

/// Leaves in `costs` only the pods `allowed` (the others cost infinity), unless that would
/// leave none with a finite cost: each of the rules above narrows what the rules before it
/// left, and where two disagree entirely the earlier one stands (a request whose every pod
/// costs infinity would go to a pod picked at random).
fn keep_only(costs: &mut [f64], allowed: &[bool]) {
    let kept = costs
        .iter()
        .zip(allowed)
        .any(|(cost, &allowed)| allowed && cost.is_finite());
    if kept {
        for (cost, &allowed) in costs.iter_mut().zip(allowed) {
            if !allowed {
                *cost = f64::INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod learn_tests;
#[cfg(test)]
mod session_tests;
#[cfg(test)]
mod slo_tests;
#[cfg(test)]
mod tests;
