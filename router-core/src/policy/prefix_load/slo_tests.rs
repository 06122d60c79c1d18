//! `prefix-load`'s SLO rules (`ttft_slo_seconds`, [`super::slo`]): which pods are late at
//! their own learned prefill rates and slot waits, that late pods are passed over while
//! another is in time, where a request goes when every pod is late, and that nothing changes
//! when the only late pod is idle or the fleet prefills faster than it is offered.

use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::index::PrefixIndex;
use crate::load::{Candidate, Completed, InFlight, RequestWork};
use crate::policy::PolicyInput;

const MODEL: &str = "m";
/// The request: 100 blocks, the SLO 2 s.
const BLOCKS: u64 = 100;
/// Blocks offered over the window before the request in an overloaded fleet: 1 block per ms
/// over 10 s, more than any fleet below prefills (3 pods at 10 ms a block: 0.3 per ms).
const OVERLOAD: u64 = 10_000;

/// A pod as the tests set it up.
#[derive(Debug, Clone, Copy)]
struct Pod {
    /// Its learned prefill rate, ms per block (`None`: not learned yet).
    rate: Option<f64>,
    /// Blocks still to prefill for one outstanding request there (0: no pending prefill).
    pending: u64,
    /// Requests outstanding that have answered (their prompt blocks stay active).
    answered: u64,
    /// It holds the request's whole prompt.
    holds: bool,
}

fn pod(rate: f64, pending: u64, holds: bool) -> Pod {
    Pod {
        rate: Some(rate),
        pending,
        answered: 0,
        holds,
    }
}

struct Fleet {
    names: Vec<String>,
    loads: Vec<Arc<PodLoad>>,
    _guards: Vec<InFlight>,
    index: PrefixIndex,
}

impl Fleet {
    fn new(pods: &[Pod], hashes: &[u64]) -> Self {
        let names: Vec<String> = (0..pods.len()).map(|i| format!("pod-{i}")).collect();
        let index = PrefixIndex::new(10_000, 60_000);
        let mut loads = Vec::new();
        let mut guards = Vec::new();
        for (pod, name) in pods.iter().zip(&names) {
            let load = PodLoad::new();
            if let Some(rate) = pod.rate {
                // One cold request of 100 blocks that answered after 100 × rate ms.
                load.observe(&Completed {
                    blocks: 100,
                    prefill_blocks: 100,
                    ttft: (100.0 * rate) as crate::Millis,
                    decode: 0,
                    usage: None,
                    sent_to_idle: false,
                    behind_copy: false,
                });
                assert_eq!(load.speed().prefill_ms_per_block(), Some(rate));
            }
            if pod.pending > 0 {
                guards.push(load.acquire_work(RequestWork {
                    blocks: pod.pending,
                    prefill_blocks: pod.pending,
                    shared_prefix: None,
                    copies_prefix: false,
                    max_tokens: None,
                }));
            }
            for _ in 0..pod.answered {
                let mut guard = load.acquire_work(RequestWork {
                    blocks: BLOCKS,
                    prefill_blocks: BLOCKS,
                    shared_prefix: None,
                    copies_prefix: false,
                    max_tokens: None,
                });
                guard.first_byte(0);
                guards.push(guard);
            }
            if pod.holds {
                index.add(MODEL, hashes, name, 0);
            }
            loads.push(load);
        }
        Fleet {
            names,
            loads,
            _guards: guards,
            index,
        }
    }

    /// The pod `prefix-load` picks with the rule at `slo_seconds` (0: off), in a fleet
    /// offered more prefill than it can do ([`OVERLOAD`]).
    fn choose(&self, hashes: &[u64], slo_seconds: f64) -> usize {
        self.choose_offered(hashes, slo_seconds, OVERLOAD)
    }

    /// The pod `prefix-load` picks with the rule at `slo_seconds`, after `offered` blocks to
    /// prefill were offered at once just before the request.
    fn choose_offered(&self, hashes: &[u64], slo_seconds: f64, offered: u64) -> usize {
        let pods: Vec<Candidate<'_>> = self
            .names
            .iter()
            .zip(&self.loads)
            .map(|(name, load)| Candidate {
                name,
                address: name,
                load,
            })
            .collect();
        let policy = PrefixLoad::new(PrefixLoadConfig {
            ttft_slo_seconds: slo_seconds,
            ..PrefixLoadConfig::default()
        });
        policy.offered.offer(0, offered, 0);
        let mut rng = StdRng::seed_from_u64(7);
        policy
            .choose(&mut PolicyInput {
                model: MODEL,
                pods: &pods,
                hashes,
                index: &self.index,
                found: Default::default(),
                recall: None,
                session: Default::default(),
                rng: &mut rng,
                now: 0,
            })
            .pod
    }
}

/// At 10 ms a block: the prompt's two holders 4 s and 2.5 s behind, a third pod 6 s behind
/// that holds none of it. Every pod is late for a 2 s SLO.
fn two_late_holders_and_a_later_pod(hashes: &[u64]) -> Fleet {
    Fleet::new(
        &[
            pod(10.0, 400, true),
            pod(10.0, 250, true),
            pod(10.0, 600, false),
        ],
        hashes,
    )
}

fn prompt() -> Vec<u64> {
    (0..BLOCKS).map(|i| 9 << 32 | i).collect()
}

#[test]
fn when_every_pod_is_late_the_request_goes_to_its_most_backed_up_holder() {
    let hashes = prompt();
    // At 10 ms a block: the holders are 4 s and 2.5 s behind, the third pod 6 s and would
    // prefill the whole prompt (1 s) besides. The cost model spreads: the lighter holder.
    let fleet = two_late_holders_and_a_later_pod(&hashes);
    assert_eq!(fleet.choose(&hashes, 0.0), 1, "the cost model alone");
    // Every pod is late: the most backed-up pod where the request adds no prefill. The
    // lighter holder keeps answering its own requests sooner; the third, further behind
    // still, would have to copy the family to miss anyway.
    assert_eq!(fleet.choose(&hashes, 2.0), 0);
}

#[test]
fn a_backlog_offered_slower_than_the_fleet_prefills_gives_no_pod_up() {
    let hashes = prompt();
    // Every pod is late, as above, but the fleet was offered 1 900 blocks over the last 10 s
    // (0.19 per ms; the request adds none, its holders hold it all) and prefills 0.3 per ms at 10 ms a block: the
    // backlog drains by itself (a burst, a phase's cold start), so the cost model spreads it
    // and no pod is given up for longer than it lasts.
    let fleet = two_late_holders_and_a_later_pod(&hashes);
    assert_eq!(fleet.choose_offered(&hashes, 2.0, 1_900), 1);
    // Offered faster than the three prefill (0.31 per ms): overload, the sink.
    assert_eq!(fleet.choose_offered(&hashes, 2.0, 3_100), 0);
    // The fleet's rate is each pod's own: at 40 ms a block the third prefills 0.025 per ms,
    // and 0.23 per ms outruns the 0.225 the three prefill.
    let fleet = Fleet::new(
        &[
            pod(10.0, 400, true),
            pod(10.0, 250, true),
            pod(40.0, 150, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose_offered(&hashes, 2.0, 2_300), 0);
    assert_eq!(fleet.choose_offered(&hashes, 2.0, 0), 1);
}

#[test]
fn a_new_family_late_everywhere_goes_to_the_most_backed_up_pod() {
    let hashes = prompt();
    let fleet = Fleet::new(
        &[
            pod(10.0, 300, false),
            pod(10.0, 500, false),
            pod(10.0, 400, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 0.0), 0, "the cost model alone");
    assert_eq!(fleet.choose(&hashes, 2.0), 1);
}

#[test]
fn lateness_is_at_each_pods_own_rate() {
    let hashes = prompt();
    // The lighter holder prefills at 4 ms a block: its 250 blocks take 1 s, in time, so the
    // rule stands aside and the cost model chooses it.
    let fleet = Fleet::new(
        &[
            pod(10.0, 400, true),
            pod(4.0, 250, true),
            pod(10.0, 600, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 2.0), 1);
    // At 10 ms a block the expected first token is 2.5 s: late.
    let fleet = two_late_holders_and_a_later_pod(&hashes);
    assert_eq!(fleet.choose(&hashes, 2.0), 0);
    // Within a looser SLO the same pods are in time.
    assert_eq!(fleet.choose(&hashes, 3.0), 1);
}

#[test]
fn while_some_pod_is_in_time_a_late_one_is_passed_over() {
    let hashes = prompt();
    // The holder is 2.5 s behind; the other pod has no prefill pending but carries 300 active
    // blocks, and would answer in 1 s. Prefilling the prompt there costs more than the
    // holder's queue, so the cost model alone keeps the request on the late holder, and the
    // rule sends it where it is answered in time.
    let mut other = pod(10.0, 0, false);
    other.answered = 3;
    let fleet = Fleet::new(&[pod(10.0, 250, true), other], &hashes);
    assert_eq!(fleet.choose(&hashes, 0.0), 0, "the cost model alone");
    assert_eq!(fleet.choose(&hashes, 2.0), 1);
    // Within a looser SLO the holder is in time, and the cost model chooses.
    assert_eq!(fleet.choose(&hashes, 3.0), 0);
}

#[test]
fn an_idle_pod_is_judged_by_its_own_prefill() {
    let hashes = prompt();
    // Both holders are late; the third pod is idle and prefills the whole prompt in 1 s at
    // 10 ms a block: in time, so the late holders are passed over.
    let fleet = Fleet::new(
        &[
            pod(10.0, 400, true),
            pod(10.0, 250, true),
            pod(10.0, 0, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 0.0), 1, "the cost model alone");
    assert_eq!(fleet.choose(&hashes, 2.0), 2);
}

#[test]
fn a_late_idle_pod_alone_passes_nothing_over() {
    let hashes = prompt();
    // Both holders are late, and the third pod would take 3 s to prefill the prompt. It is
    // idle, so it is not a sink either: no pod is in time and not every pod is busy, so the
    // cost model chooses as without the rule (the lighter holder), not the sink (pod 0).
    let fleet = Fleet::new(
        &[
            pod(10.0, 400, true),
            pod(10.0, 250, true),
            pod(30.0, 0, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 0.0), 1);
    assert_eq!(fleet.choose(&hashes, 2.0), 1);
    // A new family, every busy pod in time (1.5 s, 1.6 s) and the idle one late (3 s): the
    // idle pod's cheap prefill wins the cost model, and the rule leaves it.
    let fleet = Fleet::new(
        &[
            pod(10.0, 50, false),
            pod(10.0, 60, false),
            pod(30.0, 0, false),
        ],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 0.0), 2, "the cost model alone");
    assert_eq!(fleet.choose(&hashes, 2.0), 2);
}

#[test]
fn nothing_changes_until_every_pod_has_learned_its_rate() {
    let hashes = prompt();
    let mut unlearned = pod(10.0, 600, false);
    unlearned.rate = None;
    let fleet = Fleet::new(
        &[pod(10.0, 400, true), pod(10.0, 250, true), unlearned],
        &hashes,
    );
    assert_eq!(fleet.choose(&hashes, 2.0), 1);
}
