//! `give_up_late_seconds`: under overload, a slow replica is given up on purpose.
//!
//! When the fleet cannot serve every request in time, balancing work spreads the queue over
//! every replica and all of them answer late. On unequal replicas that is the cold phase's
//! loss: a replica whose prefill is twice as slow cannot prefill a new family within a 2 s
//! TTFT even idle, and the cost model, counting blocks, keeps moving families onto the fast
//! replica as the slow one falls behind, until both are late (docs/POLICY-EVALUATION.md,
//! "Unequal replicas: giving up the slow replica"). `prefix-cache` wins that phase by
//! leaving the slow replica's families there; this rule does it deliberately:
//!
//! - when every pod is **full** (its engine's latest scrape showed requests waiting),
//! - and the pod whose latest answer came latest took longer than `give_up_late_seconds` to
//!   its first token ([`ReplicaSpeed::latest_ttft_ms`](crate::load::ReplicaSpeed::latest_ttft_ms)),
//! - and that pod is **slow** (its learned prefill rate at least [`SLOW_PREFILL_RATIO`] times
//!   the fastest pod's),
//!
//! the request goes to that pod (the cost model breaks ties), where it is late anyway, and
//! the other pods keep what they can serve in time. It is undone as it should be: a pod that
//! drains its queue takes requests again at once, and a slow pod that answers
//! in time again is no longer given up. Both conditions matter: giving up the most
//! backed-up pod of equal replicas costs two L20s 75 requests, and giving up a slow pod
//! merely because every pod is full locks it in on the hot phases.

use super::PolicyInput;
use crate::load::Candidate;

/// A pod whose learned prefill rate is at least this many times the fastest pod's is slow
/// (the simulated slow replica's is 2, the faster one's 0.5).
pub const SLOW_PREFILL_RATIO: f64 = 1.5;

/// Sets to infinity the cost of every pod but the slow one given up, when the rule holds
/// (see the module docs); `late_millis` is `give_up_late_seconds` in milliseconds.
pub fn send_to_given_up(input: &PolicyInput<'_>, late_millis: f64, costs: &mut [f64]) {
    if !input.pods.iter().all(full) {
        return;
    }
    let latest = |pod: &Candidate<'_>| pod.load.speed().latest_ttft_ms().unwrap_or(0.0);
    let latest_of_all = input.pods.iter().map(latest).fold(0.0, f64::max);
    if latest_of_all <= late_millis {
        return;
    }
    let rate = |pod: &Candidate<'_>| pod.load.speed().early_prefill_ms_per_block();
    let fastest = input
        .pods
        .iter()
        .filter_map(rate)
        .fold(f64::INFINITY, f64::min);
    let slow = |pod: &Candidate<'_>| rate(pod).is_some_and(|r| r >= SLOW_PREFILL_RATIO * fastest);
    if !input
        .pods
        .iter()
        .any(|pod| latest(pod) >= latest_of_all && slow(pod))
    {
        return;
    }
    for (cost, pod) in costs.iter_mut().zip(input.pods) {
        if latest(pod) < latest_of_all {
            *cost = f64::INFINITY;
        }
    }
}

/// The pod's engine has requests waiting, by its latest scrape: whatever is sent there queues
/// (unknown without a scrape).
fn full(pod: &Candidate<'_>) -> bool {
    pod.load
        .engine_stats()
        .is_some_and(|stats| stats.waiting > 0)
}
