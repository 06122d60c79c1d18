//! KV-cache events over real ZMQ sockets on loopback: a SUB socket sees a chat request's
//! prompt blocks stored with the ids `/tokenize` gives, a DEALER replay from seq 0 returns
//! the same batches then the end marker, and bad configurations are named start-up errors.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use mock_engine::kv_events::KvEventsConfig;
use router_core::kv_sync::wire::{END_OF_REPLAY, read_seq};
// Decoded with the gateway's decoder: what a real subscriber of the mock reads.
use mock_engine::model::block_hash::extend_hashes;
use mock_engine::server::{FailurePlan, ReplicaHandle, spawn_replica_with_events};
use router_core::kv_sync::{KvEvent, decode_batch};
use support::*;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const TOPIC: &str = "kv@mock-0@test-model";

/// How long one receive may wait before the test treats the message as not coming.
const RECV_WAIT: Duration = Duration::from_millis(500);

async fn start_publishing() -> ReplicaHandle {
    let kv = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0",
            "replay_endpoint":"tcp://127.0.0.1:0","topic":"{TOPIC}","buffer_steps":1000}}"#
    ))
    .expect("valid config");
    spawn_replica_with_events(config(fast(), FailurePlan::default()), kv)
        .await
        .expect("replica starts")
}

/// One PUB message: its seq and payload (the topic is checked on receipt).
#[derive(Debug, Clone, PartialEq)]
struct Published {
    seq: u64,
    payload: Bytes,
}

fn seq_of(frame: &[u8]) -> u64 {
    u64::from_be_bytes(frame.try_into().expect("seq is 8 bytes"))
}

async fn next_published(sub: &mut SubSocket, wait: Duration) -> Option<Published> {
    let message = tokio::time::timeout(wait, sub.recv()).await.ok()?;
    let frames = message.expect("SUB receive").into_vec();
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    assert_eq!(frames[0].as_ref(), TOPIC.as_bytes());
    Some(Published {
        seq: seq_of(&frames[1]),
        payload: frames[2].clone(),
    })
}

/// Subscribes, then sends probe requests until one's events arrive: a SUB socket only
/// receives once its subscription has reached the publisher, and nothing else says when.
async fn subscribe(replica: &ReplicaHandle) -> (SubSocket, Vec<Published>) {
    let mut sub = SubSocket::new();
    let endpoint = replica.kv_events_endpoint().expect("events on");
    sub.connect(endpoint).await.expect("SUB connects");
    sub.subscribe("").await.expect("subscribe");
    let first = probe_until_received(replica, &mut sub).await;
    (sub, vec![first])
}

async fn probe_until_received(replica: &ReplicaHandle, sub: &mut SubSocket) -> Published {
    for probe in 0..40 {
        let body = chat_body(&prompt_of(40, &format!("probe{probe}-")), 1, false, false);
        assert_eq!(post_chat(replica, &body).await.status, 200);
        if let Some(first) = next_published(sub, RECV_WAIT).await {
            return first;
        }
    }
    panic!("no KV event reached the subscriber after 40 probe requests");
}

#[tokio::test]
async fn a_pub_endpoint_with_a_named_host_connects_to_a_binding_subscriber() {
    bounded(async {
        // llm-d's layout: the subscriber binds, every engine dials it.
        let mut sub = SubSocket::new();
        let bound = sub.bind("tcp://127.0.0.1:0").await.expect("SUB binds");
        sub.subscribe("").await.expect("subscribe");
        let kv = KvEventsConfig::parse(&format!(
            r#"{{"enable_kv_cache_events":true,"endpoint":"{bound}","topic":"{TOPIC}"}}"#
        ))
        .expect("valid config");
        let replica = spawn_replica_with_events(config(fast(), FailurePlan::default()), kv)
            .await
            .expect("replica starts");
        assert_eq!(
            replica.kv_events_endpoint(),
            Some(bound.to_string().as_str())
        );
        let first = probe_until_received(&replica, &mut sub).await;
        let events = decode_batch(&first.payload).expect("payload").events;
        assert!(
            matches!(events[0], KvEvent::BlockStored { .. }),
            "{events:?}"
        );
        replica.shutdown().await;
    })
    .await;
}

/// Every BlockStored event in `messages`.
fn stored_events(messages: &[Published]) -> Vec<KvEvent> {
    messages
        .iter()
        .flat_map(|m| decode_batch(&m.payload).expect("valid payload").events)
        .filter(|e| matches!(e, KvEvent::BlockStored { .. }))
        .collect()
}

/// Follows parent links from the request's first block; returns the chain's tokens.
fn chain_tokens(stored: &[KvEvent], first_tokens: &[u32]) -> Vec<u32> {
    let mut tokens = Vec::new();
    let mut parent = None;
    // Each pass extends the chain by one event or stops; at most one pass per event.
    for _ in 0..stored.len() {
        let next = stored.iter().find(|e| match e {
            KvEvent::BlockStored {
                parent: event_parent,
                token_ids,
                ..
            } => {
                *event_parent == parent && (parent.is_some() || token_ids.starts_with(first_tokens))
            }
            _ => false,
        });
        let Some(KvEvent::BlockStored {
            block_hashes,
            token_ids,
            ..
        }) = next
        else {
            break;
        };
        tokens.extend_from_slice(token_ids);
        parent = block_hashes.last().copied();
    }
    tokens
}

#[tokio::test]
async fn a_chat_requests_prompt_blocks_are_published_with_tokenizes_ids_and_replayed() {
    bounded(async {
        let replica = start_publishing().await;
        let (mut sub, mut seen) = subscribe(&replica).await;

        let content = prompt_of(100, "family-a-");
        let body = chat_body(&content, 2, false, false);
        assert_eq!(post_chat(&replica, &body).await.status, 200);
        let tokenize_body = serde_json::json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": content}],
        })
        .to_string();
        let tokenized = post(&replica, "/tokenize", &tokenize_body).await.json();
        let tokens: Vec<u32> = tokenized["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| u32::try_from(t.as_u64().expect("id")).expect("u32"))
            .collect();
        let block_size = fast().block_size;
        let full = tokens.len() / block_size;
        assert!(full >= 6, "{} tokens", tokens.len());
        let expected = &tokens[..full * block_size];

        // Receive until the request's full prompt blocks have all been seen (each receive
        // bounded; the test deadline bounds the whole).
        let mut chain = Vec::new();
        for _ in 0..200 {
            chain = chain_tokens(&stored_events(&seen), &expected[..block_size]);
            if chain.len() >= expected.len() {
                break;
            }
            if let Some(message) = next_published(&mut sub, RECV_WAIT).await {
                seen.push(message);
            }
        }
        assert!(
            chain.len() >= expected.len(),
            "saw {} of the prompt's tokens",
            chain.len()
        );
        assert_eq!(
            &chain[..expected.len()],
            expected,
            "token ids match /tokenize"
        );

        // The published hashes are the engine's documented chain over those ids.
        let mut hashes = Vec::new();
        extend_hashes(&mut hashes, expected, block_size);
        let published: Vec<u64> = stored_events(&seen)
            .iter()
            .flat_map(|e| match e {
                KvEvent::BlockStored { block_hashes, .. } => block_hashes.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert!(hashes.iter().all(|h| published.contains(h)));
        for pair in seen.windows(2) {
            assert_eq!(
                pair[1].seq,
                pair[0].seq + 1,
                "seq counts up by one per batch"
            );
        }
        let decoded = decode_batch(&seen[0].payload).expect("payload");
        assert_eq!(decoded.data_parallel_rank, Some(0));
        assert!(decoded.ts > 1.0e9, "ts is Unix time");

        // Replay from 0: every batch so far, in order, byte for byte, then the end marker.
        let replayed = replay(&replica, 0).await;
        let last_seen = seen.last().expect("messages").seq;
        assert!(replayed.len() as u64 > last_seen);
        for (i, message) in replayed.iter().enumerate() {
            assert_eq!(message.seq, i as u64);
        }
        for message in &seen {
            assert_eq!(&replayed[message.seq as usize], message);
        }
        // From the middle: only the batches from there.
        let tail = replay(&replica, last_seen).await;
        assert_eq!(tail.first(), Some(&replayed[last_seen as usize]));
        assert!(tail.iter().all(|m| m.seq >= last_seen));
        replica.shutdown().await;
    })
    .await;
}

/// Asks the replay socket for every batch from `start`; returns them (the end marker is
/// checked and not returned).
async fn replay(replica: &ReplicaHandle, start: u64) -> Vec<Published> {
    let mut dealer = DealerSocket::new();
    let endpoint = replica.kv_events_replay_endpoint().expect("replay on");
    dealer.connect(endpoint).await.expect("DEALER connects");
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&start.to_be_bytes()),
    ])
    .expect("two frames");
    dealer.send(request).await.expect("replay request");
    let mut messages = BTreeMap::new();
    // At most the buffer (1000 batches) plus the end marker.
    for _ in 0..=1001 {
        let reply = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
            .await
            .expect("replay answers")
            .expect("DEALER receive")
            .into_vec();
        assert_eq!(reply.len(), 3, "[\"\", seq, payload]");
        assert!(reply[0].is_empty(), "empty delimiter frame");
        if read_seq(&reply[1]) == Some(END_OF_REPLAY) {
            assert!(reply[2].is_empty(), "the end marker has an empty payload");
            return messages.into_values().collect();
        }
        let seq = seq_of(&reply[1]);
        messages.insert(
            seq,
            Published {
                seq,
                payload: reply[2].clone(),
            },
        );
    }
    panic!("no end-of-replay marker");
}

#[tokio::test]
async fn reset_prefix_cache_publishes_all_blocks_cleared() {
    bounded(async {
        let replica = start_publishing().await;
        let (mut sub, _) = subscribe(&replica).await;
        assert_eq!(post(&replica, "/reset_prefix_cache", "").await.status, 200);
        // Other probe batches may still be in flight; the clear follows them.
        let mut cleared = false;
        for _ in 0..100 {
            let Some(message) = next_published(&mut sub, RECV_WAIT).await else {
                continue;
            };
            let events = decode_batch(&message.payload).expect("payload").events;
            if events == [KvEvent::AllBlocksCleared] {
                cleared = true;
                break;
            }
        }
        assert!(cleared, "AllBlocksCleared was published");
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn events_off_means_no_endpoints() {
    bounded(async {
        let replica = start(fast()).await;
        assert_eq!(replica.kv_events_endpoint(), None);
        assert_eq!(replica.kv_events_replay_endpoint(), None);
        let null = KvEventsConfig::parse(r#"{"enable_kv_cache_events":true,"publisher":"null"}"#)
            .expect("valid");
        let quiet = spawn_replica_with_events(config(fast(), FailurePlan::default()), null)
            .await
            .expect("starts");
        assert_eq!(quiet.kv_events_endpoint(), None);
        quiet.shutdown().await;
        replica.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn a_replay_port_in_use_is_a_named_start_up_error() {
    bounded(async {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("addr").port();
        let kv = KvEventsConfig::parse(&format!(
            r#"{{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:0",
                "replay_endpoint":"tcp://127.0.0.1:{port}"}}"#
        ))
        .expect("valid config");
        let err = spawn_replica_with_events(config(fast(), FailurePlan::default()), kv)
            .await
            .expect_err("the port is taken")
            .to_string();
        assert!(
            err.contains("mock-0") && err.contains(&format!("tcp://127.0.0.1:{port}")),
            "{err}"
        );
    })
    .await;
}
