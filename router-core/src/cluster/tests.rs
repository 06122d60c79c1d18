use std::collections::HashMap;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::load::{Candidate, PodLoad, PrefixCounts, RequestWork};
use crate::{RouteRequest, Router, RouterConfig, Strategy};

const HASHING: u64 = 7;

fn router() -> Router {
    Router::new(RouterConfig {
        block_size: 4,
        ..RouterConfig::default()
    })
    .unwrap()
}

/// The pods "a" and "b", found by name as the gateway's replica set would.
struct Pods(HashMap<&'static str, Arc<PodLoad>>);

impl Pods {
    fn new() -> Self {
        Pods(HashMap::from([
            ("a", PodLoad::new()),
            ("b", PodLoad::new()),
        ]))
    }
    fn find(&self) -> impl Fn(&str) -> Option<Arc<PodLoad>> + '_ {
        |name| self.0.get(name).cloned()
    }
    fn load(&self, name: &str) -> &Arc<PodLoad> {
        &self.0[name]
    }
}

fn message(gateway: &str, event: PeerEvent) -> PeerMessage {
    PeerMessage {
        v: WIRE_VERSION,
        gateway: gateway.to_owned(),
        hashing: HASHING,
        event,
    }
}

fn decided(id: u64, pod: &str, hashes: &[u64], prefill_blocks: u64) -> PeerEvent {
    PeerEvent::Decided(Decided::new(
        id,
        "m",
        pod,
        hashes,
        RequestWork {
            blocks: hashes.len() as u64,
            prefill_blocks,
            shared_prefix: hashes.last().copied(),
            copies_prefix: true,
            max_tokens: None,
        },
    ))
}

#[test]
fn a_peer_decision_is_indexed_and_counted_until_its_release() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    let hashes = router.hashes("abcdefgh").unwrap();
    let outcome = table.apply(
        &message("peer", decided(1, "a", &hashes, 2)),
        &router,
        &pods.find(),
        10,
    );
    assert_eq!(outcome, Outcome::Applied);
    assert_eq!(
        router.index().match_names("m", &hashes, &["a", "b"]),
        [100, 0]
    );
    let a = pods.load("a");
    // The local view is untouched; the shared view carries the peer's request.
    assert_eq!(a.outstanding(), 0);
    assert_eq!(
        (
            a.shared_outstanding(),
            a.shared_active_blocks(),
            a.shared_pending_prefill_blocks()
        ),
        (1, 2, 2)
    );
    let prefix = *hashes.last().unwrap();
    assert_eq!(
        a.shared_prefix_counts(prefix),
        PrefixCounts {
            outstanding: 1,
            copying: 1
        }
    );
    let first = table.apply(
        &message("peer", PeerEvent::FirstByte { id: 1 }),
        &router,
        &pods.find(),
        20,
    );
    assert_eq!(first, Outcome::Applied);
    assert_eq!(a.shared_pending_prefill_blocks(), 0);
    assert_eq!(a.shared_prefix_counts(prefix).copying, 0);
    assert_eq!(a.shared_outstanding(), 1);
    let released = table.apply(
        &message("peer", PeerEvent::Released { id: 1 }),
        &router,
        &pods.find(),
        30,
    );
    assert_eq!(released, Outcome::Applied);
    assert_eq!((a.shared_outstanding(), a.shared_active_blocks()), (0, 0));
    assert_eq!(table.in_flight(), 0);
    // The blocks stay: a released request's prefix is still cached on its pod.
    assert_eq!(router.index().match_names("m", &hashes, &["a"]), [100]);
}

#[test]
fn a_peers_stream_clock_counts_in_the_slot_wait() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    let a = pods.load("a");
    // Pod a runs one request at a time, and a request holds its slot 5 s on average.
    a.set_engine_stats(crate::load::EngineStats {
        running: 1,
        waiting: 1,
        kv_usage: 0.1,
    });
    a.observe(&crate::load::Completed {
        blocks: 0,
        prefill_blocks: 0,
        ttft: 0,
        decode: 5_000,
        usage: None,
        sent_to_idle: false,
        behind_copy: false,
    });
    let decided = PeerEvent::Decided(Decided::new(
        1,
        "m",
        "a",
        &[],
        RequestWork {
            max_tokens: Some(101),
            ..Default::default()
        },
    ));
    let mut apply = |event, now| table.apply(&message("peer", event), &router, &pods.find(), now);
    assert_eq!(apply(decided, 0), Outcome::Applied);
    assert_eq!(apply(PeerEvent::FirstByte { id: 1 }, 0), Outcome::Applied);
    // The peer's stream has no pace yet: the slot frees in a mean turnover.
    assert_eq!(a.slot_wait_ms(160), Some(5_000.0));
    // 17 tokens by 160 ms, 10 ms each: its last 84 are due in 840 ms.
    let progress = PeerEvent::Progress { id: 1, tokens: 17 };
    assert_eq!(apply(progress, 160), Outcome::Applied);
    assert_eq!(a.slot_wait_ms(160), Some(840.0));
    let unknown = PeerEvent::Progress { id: 9, tokens: 17 };
    assert_eq!(
        apply(unknown, 160),
        Outcome::Ignored(Ignored::UnknownRequest)
    );
    assert_eq!(apply(PeerEvent::Released { id: 1 }, 200), Outcome::Applied);
    assert_eq!(a.slot_wait_ms(200), Some(0.0), "its slot is free");
}

#[test]
fn own_and_foreign_hashing_messages_change_nothing() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    let hashes = router.hashes("abcdefgh").unwrap();
    let own = table.apply(
        &message("me", decided(1, "a", &hashes, 2)),
        &router,
        &pods.find(),
        0,
    );
    assert_eq!(own, Outcome::Ignored(Ignored::Own));
    let mut other = message("peer", decided(2, "a", &hashes, 2));
    other.hashing = HASHING + 1;
    let outcome = table.apply(&other, &router, &pods.find(), 0);
    assert_eq!(outcome, Outcome::Ignored(Ignored::OtherHashing));
    assert!(router.index().is_empty());
    assert_eq!(pods.load("a").shared_outstanding(), 0);
    assert_eq!(table.peer_count(), 0);
}

#[test]
fn a_decision_for_an_unknown_pod_is_indexed_but_not_counted() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    let hashes = router.hashes("abcdefgh").unwrap();
    let outcome = table.apply(
        &message("peer", decided(1, "c", &hashes, 2)),
        &router,
        &pods.find(),
        0,
    );
    assert_eq!(outcome, Outcome::Ignored(Ignored::UnknownPod));
    assert_eq!(router.index().match_names("m", &hashes, &["c"]), [100]);
    let unknown = table.apply(
        &message("peer", PeerEvent::Released { id: 9 }),
        &router,
        &pods.find(),
        0,
    );
    assert_eq!(unknown, Outcome::Ignored(Ignored::UnknownRequest));
    let released = table.apply(
        &message("peer", PeerEvent::Released { id: 1 }),
        &router,
        &pods.find(),
        0,
    );
    assert_eq!(released, Outcome::Applied);
}

#[test]
fn a_heartbeat_drops_the_requests_it_does_not_list() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    for id in 1..=3 {
        table.apply(
            &message("peer", decided(id, "b", &[], 0)),
            &router,
            &pods.find(),
            0,
        );
    }
    assert_eq!(pods.load("b").shared_outstanding(), 3);
    // The release of 2 was lost: the heartbeat no longer lists it.
    let beat = PeerEvent::Heartbeat {
        in_flight: vec![1, 3, 4],
    };
    table.apply(&message("peer", beat), &router, &pods.find(), 100);
    assert_eq!(pods.load("b").shared_outstanding(), 2);
    assert_eq!(table.in_flight(), 2);
}

#[test]
fn a_silent_peer_expires_with_all_its_requests() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    table.apply(
        &message("dead", decided(1, "a", &[], 0)),
        &router,
        &pods.find(),
        1_000,
    );
    table.apply(
        &message("alive", decided(1, "a", &[], 0)),
        &router,
        &pods.find(),
        1_000,
    );
    let beat = PeerEvent::Heartbeat { in_flight: vec![1] };
    table.apply(&message("alive", beat), &router, &pods.find(), 5_500);
    assert_eq!(pods.load("a").shared_outstanding(), 2);
    // Exactly the timeout since it was heard: not yet.
    assert!(table.expire(6_000).is_empty());
    assert_eq!(table.expire(6_001), ["dead"]);
    assert_eq!(pods.load("a").shared_outstanding(), 1);
    assert_eq!(table.peer_count(), 1);
    assert_eq!(table.expire(10_501), ["alive"]);
    assert_eq!(pods.load("a").shared_outstanding(), 0);
}

#[test]
fn policies_see_the_peers_load_and_the_peers_blocks() {
    let router = router();
    let pods = Pods::new();
    let mut table = PeerTable::new("me", HASHING, 5_000);
    let (a, b) = (pods.load("a").clone(), pods.load("b").clone());
    let list = [
        Candidate {
            name: "a",
            address: "a",
            load: &a,
        },
        Candidate {
            name: "b",
            address: "b",
            load: &b,
        },
    ];
    let mut rng = StdRng::seed_from_u64(1);
    // Two requests of another gateway on "a": least-request goes to "b" every time.
    for id in 1..=2 {
        table.apply(
            &message("peer", decided(id, "a", &[], 0)),
            &router,
            &pods.find(),
            0,
        );
    }
    for _ in 0..8 {
        let routed = router
            .route(
                Strategy::LeastRequest,
                &RouteRequest {
                    model: "m",
                    text: "x",
                    tokens: None,
                    session: Default::default(),
                    max_tokens: None,
                },
                &list,
                &mut rng,
                0,
            )
            .unwrap();
        assert_eq!(routed.decision.pod_name, "b");
    }
    // A family's first request went to "b" through the peer and has begun answering: its
    // second goes there too with prefix-load, though "b" is busier by a whole prompt.
    let text = "a family prefix shared by its requests";
    let hashes = router.hashes(text).unwrap();
    for event in [
        decided(3, "b", &hashes, hashes.len() as u64),
        PeerEvent::FirstByte { id: 3 },
    ] {
        table.apply(&message("peer", event), &router, &pods.find(), 0);
    }
    assert_eq!(b.shared_active_blocks(), hashes.len() as u64);
    let second = router
        .route(
            Strategy::PrefixLoad,
            &RouteRequest {
                model: "m",
                text,
                tokens: None,
                session: Default::default(),
                max_tokens: None,
            },
            &list,
            &mut rng,
            0,
        )
        .unwrap();
    assert_eq!(second.decision.pod_name, "b");
    assert_eq!(second.decision.match_percent, Some(100));
}

#[test]
fn messages_round_trip_and_other_versions_or_bytes_are_refused() {
    let hashes = [0xe47f32a254016b00, u64::MAX];
    for event in [
        decided(3, "a", &hashes, 1),
        PeerEvent::FirstByte { id: 3 },
        PeerEvent::Progress { id: 3, tokens: 32 },
        PeerEvent::Released { id: 3 },
        PeerEvent::Heartbeat {
            in_flight: vec![1, 2, 3],
        },
    ] {
        let sent = message("gw-1", event);
        assert_eq!(decode(&encode(&sent).unwrap()).unwrap(), sent);
    }
    let mut newer = message("gw-1", PeerEvent::Released { id: 3 });
    newer.v = 2;
    assert_eq!(decode(&encode(&newer).unwrap()), Err(WireError::Version(2)));
    // A newer version whose body this build cannot read is still named by its version.
    let body = rmp_serde::to_vec_named(&HashMap::from([("v", 3u32)])).unwrap();
    assert_eq!(decode(&body), Err(WireError::Version(3)));
    assert!(matches!(decode(b"{\"v\":1}"), Err(WireError::Malformed(_))));
}

#[test]
fn the_wire_format_is_a_named_msgpack_map() {
    // The documented layout, byte for byte: a reader in another language can rely on it.
    let sent = message("g", PeerEvent::Released { id: 5 });
    let bytes = encode(&sent).unwrap();
    let value: rmpv::Value = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
    assert_eq!(
        value.to_string(),
        r#"{"v": 1, "gateway": "g", "hashing": 7, "event": {"released": {"id": 5}}}"#
    );
}

#[test]
fn the_hashing_digest_follows_every_setting_that_shapes_hashes() {
    let base = RouterConfig::default();
    let digest = hashing_digest(&base, false);
    assert_eq!(digest, hashing_digest(&base.clone(), false));
    assert_ne!(digest, hashing_digest(&base, true));
    let block = RouterConfig {
        block_size: 64,
        ..base.clone()
    };
    let seed = RouterConfig {
        hash_seed: 1,
        ..base.clone()
    };
    let tokenizer = RouterConfig {
        tokenizer: crate::tokenize::TokenizerKind::Tiktoken,
        ..base.clone()
    };
    for other in [block, seed, tokenizer] {
        assert_ne!(digest, hashing_digest(&other, false));
    }
    // Settings that do not shape hashes do not split a cluster.
    let weights = RouterConfig {
        imbalance_abs_count: 3,
        ..base
    };
    assert_eq!(digest, hashing_digest(&weights, false));
}

/// Three gateways sharing state, each routing its share of a burst before the others'
/// messages reach it, so all three read the same figures: an older peer's answered requests
/// make "a" cheaper than "b" and "c" by 1 and 2 blocks of about 70, within the estimate's
/// error. With no spread every gateway sends its request to "a"; with the default spread
/// they spread over the three.
#[test]
fn a_burst_over_several_gateways_spreads_within_the_estimate_s_error() {
    let spread_default = crate::policy::prefix_load::config::SPREAD_FRACTION;
    for (spread, herded) in [(0.0, true), (spread_default, false)] {
        let mut on_a = 0;
        let mut chosen = std::collections::BTreeSet::new();
        for burst in 0..10u64 {
            let mut config = RouterConfig {
                block_size: 4,
                ..RouterConfig::default()
            };
            config.prefix_load.spread_fraction = spread;
            for gateway in 0..3u64 {
                let router = Router::new(config.clone()).unwrap();
                let pods = Pods(HashMap::from([
                    ("a", PodLoad::new()),
                    ("b", PodLoad::new()),
                    ("c", PodLoad::new()),
                ]));
                let mut table = PeerTable::new("me", HASHING, 5_000);
                for (id, (pod, blocks)) in [("a", 40), ("b", 41), ("c", 42)].into_iter().enumerate()
                {
                    let hashes: Vec<u64> = (0..blocks).map(|i| (id as u64) << 32 | i).collect();
                    for event in [
                        decided(id as u64, pod, &hashes, blocks),
                        PeerEvent::FirstByte { id: id as u64 },
                    ] {
                        table.apply(&message("older", event), &router, &pods.find(), 0);
                    }
                }
                let list: Vec<Candidate<'_>> = ["a", "b", "c"]
                    .into_iter()
                    .map(|name| Candidate {
                        name,
                        address: name,
                        load: pods.load(name),
                    })
                    .collect();
                let text = format!("burst {burst} gateway {gateway}: 32 bytes");
                let request = RouteRequest {
                    model: "m",
                    text: &text,
                    tokens: None,
                    session: Default::default(),
                    max_tokens: None,
                };
                let mut rng = StdRng::seed_from_u64(burst * 3 + gateway);
                let routed = router
                    .route(Strategy::PrefixLoad, &request, &list, &mut rng, 0)
                    .unwrap();
                on_a += usize::from(routed.decision.pod_name == "a");
                chosen.insert(routed.decision.pod_name);
            }
        }
        if herded {
            assert_eq!(on_a, 30, "no spread: every gateway takes the cheapest");
        } else {
            assert_eq!(chosen.len(), 3, "{chosen:?}");
            assert!(on_a <= 15, "{on_a} of 30 on a");
        }
    }
}
