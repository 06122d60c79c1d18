//! `give_up_late_seconds` (module `give_up`): under overload a slow, late pod takes what the
//! others cannot serve in time, and only then; and a busy slow pod takes no copy it cannot
//! prefill in time.

use super::*;
use crate::load::{Completed, EngineStats};

const BLOCKS: u64 = 100;

/// Teaches `load` an idle prefill rate of `rate` ms a block (a cold request sent while it
/// was idle answered at that rate), then a latest answer after `latest_ms`.
fn teach(load: &PodLoad, rate: u64, latest_ms: u64) {
    load.speed().answered(rate * BLOCKS, BLOCKS, true);
    load.speed().answered(latest_ms, 10, false);
}

/// A finished request that waited behind others: `ttft_ms` for `BLOCKS` cold blocks.
fn queued(ttft_ms: u64) -> Completed {
    Completed {
        blocks: BLOCKS,
        prefill_blocks: BLOCKS,
        ttft: ttft_ms,
        decode: 0,
        usage: None,
        sent_to_idle: false,
        behind_copy: false,
    }
}

/// Two busy pods scraped with `waiting` requests queued each, with idle prefill rates of
/// `rates` ms a block and latest answers after `latest_ms`. The request is a new family,
/// and the cost model sends it to pod 0, which has one request fewer.
fn fleet(rates: [u64; 2], latest_ms: [u64; 2], waiting: [u32; 2]) -> (Cluster, Vec<u64>) {
    let c = Cluster::new(&[busy(4), busy(5)], BLOCKS);
    for (pod, load) in c.loads.iter().enumerate() {
        load.set_engine_stats(EngineStats {
            running: 4,
            waiting: waiting[pod],
            kv_usage: 0.5,
        });
        teach(load, rates[pod], latest_ms[pod]);
    }
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
fn a_fast_pod_that_cannot_answer_in_time_hands_the_request_to_the_given_up_pod() {
    // Pod 0's engine has no queue, but under load it prefills at 30 ms a block: this
    // request's 100 blocks are expected after 3 s, past the 2 s SLO.
    let (mut c, prompt) = fleet([6, 12], [2500, 6000], [0, 1]);
    c.loads[0].speed().observe(&queued(3000));
    assert_eq!(c.choose(&prompt, 1).pod, 1);
    // At 15 ms a block it is expected in 1.5 s: it keeps the request.
    let (c15, _) = fleet([6, 12], [2500, 6000], [0, 1]);
    c15.loads[0].speed().observe(&queued(1500));
    assert_eq!(c15.choose(&prompt, 1).pod, 0);
    // Without the overload rule's SLO only a full fleet gives up a pod.
    c.weights.ttft_slo_seconds = 0.0;
    assert_eq!(c.choose(&prompt, 1).pod, 0);
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

#[test]
fn equal_pods_that_queue_are_not_slow() {
    // Both prefill at 6 ms a block when idle; pod 1's requests then waited in a queue, so
    // its rate under load reads ten times slower. That is a busy pod, not a slow one.
    let (c, prompt) = fleet([6, 6], [2500, 6000], [1, 1]);
    for _ in 0..4 {
        c.loads[1].speed().observe(&queued(6000));
        c.loads[1].speed().answered(6000, BLOCKS, false);
    }
    assert_eq!(c.choose(&prompt, 1).pod, 0);
}

/// Pod 0 holds the whole prompt with `holders` of its requests outstanding, `pending` of
/// them not yet answered; pod 1, with `outstanding` requests, prefills at 25 ms a block when
/// idle (a copy of the 100 blocks: 2.5 s, past the 2 s SLO), pod 0 at 6, under load too.
/// The cost model prefers the copy on pod 1.
fn copy_fleet(holders: u64, pending: u64, outstanding: u64) -> (Cluster, Vec<u64>) {
    let prompt = request(2, BLOCKS);
    let holder = PodState {
        pending,
        ..busy_with(holders, prompt[99])
    };
    let c = Cluster::new(&[holder, busy(outstanding)], BLOCKS);
    c.hold(0, &prompt);
    teach(&c.loads[0], 6, 600);
    c.loads[0].speed().observe(&queued(600));
    teach(&c.loads[1], 25, 2500);
    (c, prompt)
}

#[test]
fn a_busy_slow_pod_takes_no_copy_it_cannot_prefill_in_time() {
    // The holder answers in time (nothing pending there, its own prefill a hit).
    let (mut c, prompt) = copy_fleet(7, 0, 1);
    assert_eq!(c.choose(&prompt, 1).pod, 0, "the holder keeps it");
    c.weights.give_up_late_seconds = 0.0;
    assert_eq!(c.choose(&prompt, 1).pod, 1, "off: the copy");
}

#[test]
fn a_slow_pod_still_gets_a_copy_when_idle_or_hot_or_nothing_else_is_in_time() {
    let (c, prompt) = copy_fleet(7, 0, 0);
    assert_eq!(c.choose(&prompt, 1).pod, 1, "idle: it misses once");
    let (c, prompt) = copy_fleet(8, 0, 1);
    assert_eq!(c.choose(&prompt, 1).pod, 1, "hot: later requests repay it");
    // 700 blocks pending on the holder at 6 ms: 4.2 s. Late everywhere, the copy keeps the
    // family off a pod without room.
    let (c, prompt) = copy_fleet(7, 7, 1);
    assert_eq!(c.choose(&prompt, 1).pod, 1, "the holder is late too");
}

#[test]
fn a_rule_that_disagrees_with_an_earlier_one_leaves_its_choice_standing() {
    // The overload rule left pods 0 and 2; the give-up rule allows only pod 1: nothing
    // changes, so the request never goes to a pod picked at random among infinite costs
    // (the earlier give-up rule did that beside the overload rule: the trace at 4 replicas
    // fell from 1334 to 1034, and to 1320 once mended).
    let mut costs = [1.0, f64::INFINITY, 3.0];
    keep_only(&mut costs, &[false, true, false]);
    assert_eq!(costs, [1.0, f64::INFINITY, 3.0]);
    keep_only(&mut costs, &[false, true, true]);
    assert_eq!(costs, [f64::INFINITY, f64::INFINITY, 3.0]);
}
