//! `copy_in_time_seconds` (module `in_time`): a busy copy target expected late is passed over.

use super::*;
use crate::load::Completed;

const BLOCKS: u64 = 100;

/// Pod 0 holds family 1's whole prompt and serves `on_holder` of its requests (answered, so
/// its load is work, not pending prefill); pod 1 holds none of it and is busy with one small
/// request unless `target_idle`. The cost model copies the family to pod 1 once pod 0 carries
/// more than `prefill_weight` prompts of work.
fn cluster(on_holder: u64, target_idle: bool) -> (Cluster, Vec<u64>) {
    let prompt = request(1, BLOCKS);
    let last = prompt[BLOCKS as usize - 1];
    let target = if target_idle { busy(0) } else { busy(1) };
    let mut c = Cluster::new(&[busy_with(on_holder, last), target], BLOCKS);
    c.hold(0, &prompt);
    c.weights.copy_in_time_seconds = 2.0;
    (c, prompt)
}

/// [`cluster`] with the holder's prefill rate learned as 6 ms a block (the simulated L20's)
/// and the copy target's as `target_ms`.
fn with_rates(on_holder: u64, target_idle: bool, target_ms: u64) -> (Cluster, Vec<u64>) {
    let (c, prompt) = cluster(on_holder, target_idle);
    learn_rate(&c, 0, 6);
    learn_rate(&c, 1, target_ms);
    (c, prompt)
}

/// Teaches pod `pod` a prefill rate of `ms_per_block`, from one finished cold request.
fn learn_rate(c: &Cluster, pod: usize, ms_per_block: u64) {
    c.loads[pod].observe(&Completed {
        blocks: BLOCKS,
        prefill_blocks: BLOCKS,
        ttft: ms_per_block * BLOCKS,
        decode: 0,
        usage: None,
        sent_to_idle: false,
        behind_copy: false,
    });
}

#[test]
fn a_busy_pod_where_the_copy_would_be_late_is_passed_over() {
    // 30 ms a block: the copy's 100 blocks take 3 s there, past the 2 s target.
    let (mut c, prompt) = with_rates(7, false, 30);
    assert_eq!(c.choose(&prompt, 1).pod, 0, "the holder keeps the family");
    // Off, the cost model copies it: 7 prompts of work against 5 of prefill.
    c.weights.copy_in_time_seconds = 0.0;
    let choice = c.choose(&prompt, 1);
    assert_eq!(
        (choice.pod, choice.selection),
        (1, Some(Selection::CostModel))
    );
}

#[test]
fn a_copy_expected_in_time_is_made() {
    let (c, prompt) = with_rates(7, false, 15);
    assert_eq!(
        c.choose(&prompt, 1).pod,
        1,
        "1.5 s there: within the target"
    );
}

#[test]
fn an_idle_pod_and_a_hot_prefix_may_always_be_copied() {
    let (c, prompt) = with_rates(7, true, 30);
    assert_eq!(
        c.choose(&prompt, 1).pod,
        1,
        "idle: one late answer, then hits"
    );
    let (c, prompt) = with_rates(config::HOT_IN_FLIGHT, false, 30);
    assert_eq!(
        c.choose(&prompt, 1).pod,
        1,
        "hot: its later requests repay the copy"
    );
}

#[test]
fn nothing_is_passed_over_until_every_pod_has_a_rate() {
    let (c, prompt) = cluster(7, false);
    learn_rate(&c, 1, 30);
    assert_eq!(c.choose(&prompt, 1).pod, 1);
}
