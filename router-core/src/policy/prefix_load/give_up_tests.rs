//! `give_up_late_seconds` (module `give_up`): under overload a slow, late pod takes what the
//! others cannot serve in time, and only then.

use super::*;
use crate::load::EngineStats;

const BLOCKS: u64 = 100;

/// Two busy pods scraped with `waiting` requests queued each, that learned prefill rates of
/// `rates` ms a block and whose latest answers took `latest_ms`. The request is a new family,
/// and the cost model sends it to pod 0, which has one request fewer.
fn fleet(rates: [u64; 2], latest_ms: [u64; 2], waiting: [u32; 2]) -> (Cluster, Vec<u64>) {
    let mut c = Cluster::new(&[busy(4), busy(5)], BLOCKS);
    for (pod, load) in c.loads.iter().enumerate() {
        load.set_engine_stats(EngineStats {
            running: 4,
            waiting: waiting[pod],
            kv_usage: 0.5,
        });
        // A cold request's first byte teaches the rate, the latest answer how late it is.
        load.speed().answered(rates[pod] * BLOCKS, BLOCKS);
        load.speed().answered(latest_ms[pod], 10);
    }
    c.weights.give_up_late_seconds = 4.0;
    (c, request(1, BLOCKS))
}

#[test]
fn a_full_fleet_gives_up_its_slow_late_pod() {
    let (mut c, prompt) = fleet([6, 12], [2500, 6000], [1, 1]);
    assert_eq!(
        c.choose(&prompt, 1).pod,
        1,
        "the slow pod, 6 s behind, takes it"
    );
    c.weights.give_up_late_seconds = 0.0;
    assert_eq!(c.choose(&prompt, 1).pod, 0, "off: the cost model's choice");
}

#[test]
fn nothing_is_given_up_while_a_pod_has_room_or_none_is_late_enough() {
    let (c, prompt) = fleet([6, 12], [2500, 6000], [0, 1]);
    assert_eq!(c.choose(&prompt, 1).pod, 0, "pod 0 has no queue");
    let (c, prompt) = fleet([6, 12], [1000, 3500], [1, 1]);
    assert_eq!(
        c.choose(&prompt, 1).pod,
        0,
        "3.5 s: not late enough to give up"
    );
}

#[test]
fn only_a_slow_pod_is_given_up() {
    // The latest pod is the fast one: it is backed up, not slow.
    let (c, prompt) = fleet([12, 6], [2500, 6000], [1, 1]);
    assert_eq!(c.choose(&prompt, 1).pod, 0);
    // Equal pods: the latest is merely the more backed-up one.
    let (c, prompt) = fleet([12, 12], [2500, 6000], [1, 1]);
    assert_eq!(c.choose(&prompt, 1).pod, 0);
}
