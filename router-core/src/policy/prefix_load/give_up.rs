//! `give_up_late_seconds`: under overload, a slow replica is given up on purpose.
//!
//! When the fleet cannot serve every request in time, balancing work spreads the queue over
//! every replica and all of them answer late. On unequal replicas that is the cold phase's
//! loss: a replica whose prefill is twice as slow cannot prefill a new family within a 2 s
//! TTFT even idle, and the cost model, counting blocks, keeps moving families onto the fast
//! replicas as the slow one falls behind, until every replica is late
//! (docs/POLICY-EVALUATION.md, "Unequal replicas: giving up the slow replica").
//! `prefix-cache` wins that phase by leaving the slow replica's families where they landed;
//! this rule does it deliberately. A pod is **given up** when
//!
//! - it is **slow**: its idle prefill rate
//!   ([`ReplicaSpeed::idle_prefill_ms_per_block`](crate::load::ReplicaSpeed::idle_prefill_ms_per_block),
//!   what it does with nothing else to do) is at least [`SLOW_PREFILL_RATIO`] times the
//!   fastest pod's, and
//! - it is **late**: its latest answer took longer than `give_up_late_seconds` to its first
//!   token ([`ReplicaSpeed::latest_ttft_ms`](crate::load::ReplicaSpeed::latest_ttft_ms)).
//!
//! A request goes to the given-up pods (the cost model chooses among them), where it is
//! late anyway, when some pod is given up and some is not, and no pod that is not given up
//! has room for it:
//!
//! - every such pod is expected to answer it after the TTFT SLO (`ttft_slo_seconds`: busy,
//!   and its wait for a slot and for the prefill queued there, then the request's own
//!   prefill, at its learned rates, are past the SLO; `expected.rs`), or
//! - every pod is **full** (its engine's latest scrape showed requests waiting).
//!
//! So the fast pods keep what they can serve in time, and what they cannot goes where it
//! takes no room from a request that could still be in time. It is undone as it should be: a
//! fast pod with room takes requests again at once, and a slow pod that answers in time
//! again is no longer given up.
//!
//! When no pod is given up, a busy slow pod takes no **copy** it cannot prefill within the
//! TTFT SLO even idle (its idle rate × the blocks the copy prefills there) while another pod
//! can answer the request in time (idle, or expected within the SLO), unless the prefix is
//! hot ([`HOT_IN_FLIGHT`](super::config::HOT_IN_FLIGHT) of its requests in flight on its
//! holders): such a copy misses, and the request queued behind it there misses with it
//! ([`copy_targets`]). An idle slow pod may take one (it misses once, then serves the
//! family's later requests), and so may a busy one when no other pod is in time (then the
//! fast pods would take a family they have no room for).
//!
//! Each condition was measured (docs/POLICY-EVALUATION.md, "Unequal replicas: one give-up
//! rule"): giving up the most backed-up of equal replicas costs two L20s 75 requests; a slow
//! pod given up merely because every pod is full locks in on the hot phases; the rate
//! learned under load instead of the idle one reads equal replicas as unequal in sustained
//! overload (the trace at 4 replicas 1334 → 1122); and waiting for every pod to be full
//! before giving up, rather than for the fast pods to be late, leaves the 4-replica fleet's
//! cold cells 10–17 requests below `prefix-cache`. The copy filter closes the last cell (3
//! replicas at 1.5 rps, r3 cold-uniform, two copies onto the slow pod); applied while a pod
//! is given up as well, it keeps the overflow off the slow pods and costs the 4-replica
//! fleet 96 requests; applied while no other pod is in time either, it pushes families onto
//! fast pods without room (another draw of the 3-replica fleet's r3 cold cell, 62 → 49).

use super::expected::expected;
use super::{PolicyInput, uncached_blocks};
use crate::load::Candidate;
use crate::policy::PerPod;

/// A pod whose idle prefill rate is at least this many times the fastest pod's is slow (the
/// simulated slow replica's is 2, the faster one's 0.5).
pub const SLOW_PREFILL_RATIO: f64 = 1.5;

/// The pods given up, when the request should go to them (see the module docs): `rates` are
/// the pods' idle rates, `uncached[i]`
/// is the blocks it would prefill on pod `i`, `late_millis` is `give_up_late_seconds` and
/// `slo_millis` is `ttft_slo_seconds` (`None` when off), both in milliseconds. `None` when
/// the rule does not hold.
pub fn given_up_pods(
    input: &PolicyInput<'_>,
    rates: &IdleRates,
    uncached: &[u64],
    late_millis: f64,
    slo_millis: Option<f64>,
) -> Option<PerPod<bool>> {
    let given_up: PerPod<bool> = input
        .pods
        .iter()
        .zip(&rates.rates)
        .map(|(pod, rate)| {
            let latest = pod.load.speed().latest_ttft_ms().unwrap_or(0.0);
            rate.is_some_and(|rate| rates.slow(rate)) && latest > late_millis
        })
        .collect();
    if !given_up.contains(&true) || !given_up.contains(&false) {
        return None;
    }
    let no_room = |slo: f64| {
        input
            .pods
            .iter()
            .zip(uncached)
            .zip(&given_up)
            .filter(|(_, given_up)| !**given_up)
            .all(|((pod, &own), _)| {
                pod.load.shared_outstanding() > 0
                    && expected(pod, own, input.now).is_some_and(|e| e.first_token_ms > slo)
            })
    };
    (slo_millis.is_some_and(no_room) || input.pods.iter().all(full)).then_some(given_up)
}

/// The pod's engine has requests waiting, by its latest scrape: whatever is sent there queues
/// (unknown without a scrape).
fn full(pod: &Candidate<'_>) -> bool {
    pod.load
        .engine_stats()
        .is_some_and(|stats| stats.waiting > 0)
}

/// Which pods may take the request as a copy when no pod is given up: all but the busy slow
/// pods where the copy's own prefill, at their idle rate (`rates`), is past `slo_millis`,
/// while another pod is idle or expected to answer within `slo_millis` (see the module
/// docs). `percents` are the pods' matches, `best` the largest; the caller asks only for a
/// copy of a held prefix that is not hot.
pub fn copy_targets(
    input: &PolicyInput<'_>,
    rates: &IdleRates,
    percents: &[u8],
    best: u8,
    slo_millis: f64,
) -> PerPod<bool> {
    let blocks = input.hashes.len() as u64;
    let own = |pct: u8| uncached_blocks(blocks, pct);
    let allowed: PerPod<bool> = input
        .pods
        .iter()
        .zip(percents)
        .zip(&rates.rates)
        .map(|((pod, &pct), rate)| {
            let never_in_time =
                rate.is_some_and(|rate| rates.slow(rate) && rate * own(pct) as f64 > slo_millis);
            pct >= best || pod.load.shared_outstanding() == 0 || !never_in_time
        })
        .collect();
    // Nothing barred (the common case, and every case on equal replicas): no expectation to
    // compute.
    if !allowed.contains(&false) {
        return allowed;
    }
    let in_time_elsewhere =
        input
            .pods
            .iter()
            .zip(percents)
            .zip(&allowed)
            .any(|((pod, &pct), &allowed)| {
                allowed
                    && (pod.load.shared_outstanding() == 0
                        || expected(pod, own(pct), input.now)
                            .is_some_and(|e| e.first_token_ms <= slo_millis))
            });
    if in_time_elsewhere {
        allowed
    } else {
        PerPod::from_elem(true, input.pods.len())
    }
}

/// The pods' idle prefill rates, and which are slow: read once per decision, by both rules.
pub struct IdleRates {
    rates: PerPod<Option<f64>>,
    fastest: f64,
}

impl IdleRates {
    pub fn of(pods: &[Candidate<'_>]) -> Self {
        let rates: PerPod<Option<f64>> = pods
            .iter()
            .map(|pod| pod.load.speed().idle_prefill_ms_per_block())
            .collect();
        let fastest = rates
            .iter()
            .flatten()
            .copied()
            .fold(f64::INFINITY, f64::min);
        IdleRates { rates, fastest }
    }

    /// A pod prefilling at `rate` is slow.
    fn slow(&self, rate: f64) -> bool {
        rate >= SLOW_PREFILL_RATIO * self.fastest
    }
}
