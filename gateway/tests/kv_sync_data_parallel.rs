//! KV-event sync end to end against a data-parallel engine: two hand-driven ranks, each
//! with its own PUB and replay ROUTER, rank `r` on the events port plus `r` and the replay
//! port plus `r` (vLLM's layout for `--data-parallel-size 2`), and a gateway configured with
//! `kv_sync.data_parallel_size = 2` in front of two mock engines (which answer `/tokenize`
//! and serve; both are on 127.0.0.1, so both pods subscribe to the same two ranks).
//!
//! - A prompt only rank 1 stored, published **before the gateway started**, matches 100 %:
//!   rank 1's stream was followed, through its own replay port (a gateway following rank 0
//!   alone matches 0 %).
//! - A prompt both ranks stored still matches 100 % after rank 0's `AllBlocksCleared`, while
//!   a prompt only rank 0 stored matches 0 %: a rank's clear drops only what no other rank of
//!   the pod holds (a pod-wide clear would drop both).
//! - A prompt both ranks stored, cleared by rank 0 and then removed by rank 1, matches 0 %.
//!
//! Each prompt is routed once, after its events: the gateway's own routing adds a prompt's
//! blocks for the chosen pod, so a second route of the same prompt would test nothing.
//!
//! Ports: loopback port 0 is the rule, but a rank's ports are consecutive, so the test binds
//! rank 0 on port 0 and rank 1 on the next port, retrying with a fresh pair when that one is
//! taken (bounded attempts). Every wait polls its condition under a bounded deadline.

#![expect(
    clippy::unwrap_used,
    reason = "the helpers below run only in tests: a panic is a failed assertion"
)]

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use gateway::GatewayConfig;
use gateway::config::BackendConfig;
use http_body_util::{BodyExt, Full};
use mock_engine::server::{ReplicaHandle, spawn_replica};
use router_core::kv_sync::wire::{END_OF_REPLAY, EventFormat, KvEvent, seq_frame};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

mod support;

use support::kv_events::{backend, fast_replica, kv_sync_config, payload, port, send_batch};

use support::{DEADLINE, HttpClient, MOCK_MODEL, http_client, metrics, sample, wait_for_metrics};

/// Tokens per engine block in the `fast` profile (vLLM's default 16).
const ENGINE_BLOCK: usize = 16;

/// Fresh consecutive port pairs tried before giving up.
const PORT_ATTEMPTS: usize = 50;

/// Replay requests one rank serves at most (the gateway asks about twice a second per pod).
const MAX_REPLAY_REQUESTS: usize = 100_000;

/// Batches one rank has published, kept for replay.
type Buffer = Arc<Mutex<Vec<(u64, Bytes)>>>;

/// One hand-driven data-parallel rank: a PUB, and a ROUTER serving its buffered batches.
struct Rank {
    rank: u32,
    publisher: PubSocket,
    buffer: Buffer,
    next_seq: u64,
    replay: JoinHandle<()>,
}

impl Rank {
    /// Publishes one batch of `events` (and keeps it for replay); returns its seq.
    async fn publish(&mut self, events: &[KvEvent]) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = payload(
            EventFormat::Positional,
            events.to_vec(),
            Vec::new(),
            i64::from(self.rank),
        );
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        send_batch(&mut self.publisher, seq, payload).await;
        seq
    }
}

/// Two sockets bound on consecutive loopback ports: the first on port 0, the second on the
/// next port, with a fresh first port when the next one is taken.
async fn consecutive<S: Socket>(make: impl Fn() -> S) -> (u16, S, S) {
    for _ in 0..PORT_ATTEMPTS {
        let mut first = make();
        let base = port(&first.bind("tcp://127.0.0.1:0").await.unwrap().to_string());
        let Some(next) = base.checked_add(1) else {
            continue;
        };
        let mut second = make();
        if second
            .bind(&format!("tcp://127.0.0.1:{next}"))
            .await
            .is_ok()
        {
            return (base, first, second);
        }
    }
    panic!("no two consecutive free loopback ports in {PORT_ATTEMPTS} attempts");
}

/// Answers replay requests (`[identity, "", start_seq]`) with every buffered batch from
/// `start_seq`, then the end marker, as vLLM's publisher does; ends after a quiet
/// [`DEADLINE`] or [`MAX_REPLAY_REQUESTS`].
async fn serve_replay(mut socket: RouterSocket, buffer: Buffer) {
    for _ in 0..MAX_REPLAY_REQUESTS {
        let Ok(Ok(request)) = tokio::time::timeout(DEADLINE, socket.recv()).await else {
            return;
        };
        let frames = request.into_vec();
        let [identity, _, start] = frames.as_slice() else {
            panic!("a replay request of {} frames", frames.len());
        };
        let start = u64::from_be_bytes(<[u8; 8]>::try_from(start.as_ref()).unwrap());
        let replies: Vec<(u64, Bytes)> = buffer
            .lock()
            .unwrap()
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let end = (END_OF_REPLAY, Bytes::new());
        for (seq, payload) in replies.into_iter().chain([end]) {
            let mut message = ZmqMessage::from(identity.clone());
            message.push_back(Bytes::new());
            message.push_back(Bytes::copy_from_slice(&seq_frame(seq)));
            message.push_back(payload);
            if socket.send(message).await.is_err() {
                break;
            }
        }
    }
}

/// Ranks 0 and 1 on consecutive events ports and consecutive replay ports; returns them
/// with the two base ports (rank 0's).
async fn two_ranks() -> (Vec<Rank>, u16, u16) {
    let (events, pub0, pub1) = consecutive(PubSocket::new).await;
    let (replay, router0, router1) = consecutive(RouterSocket::new).await;
    let ranks = [(pub0, router0), (pub1, router1)]
        .into_iter()
        .zip(0u32..)
        .map(|((publisher, router), rank)| {
            let buffer = Buffer::default();
            Rank {
                rank,
                publisher,
                buffer: Arc::clone(&buffer),
                next_seq: 0,
                replay: tokio::spawn(serve_replay(router, buffer)),
            }
        })
        .collect();
    (ranks, events, replay)
}

/// A gateway following two data-parallel ranks per backend from the base ports.
fn gateway_config(backends: Vec<BackendConfig>, events: u16, replay: u16) -> GatewayConfig {
    let mut config = kv_sync_config(backends, events, replay);
    config.kv_sync.data_parallel_size = 2;
    config
}

async fn post(client: &HttpClient, url: &str, strategy: Option<&str>, body: String) -> Bytes {
    let mut request = http::Request::post(url).header("content-type", "application/json");
    if let Some(strategy) = strategy {
        request = request.header("routing-strategy", strategy);
    }
    let response = client
        .request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    assert_eq!(parts.status, 200, "{body:?}");
    match parts.headers.get("x-prefixgate-match-percent") {
        Some(percent) => Bytes::copy_from_slice(percent.as_bytes()),
        None => body,
    }
}

/// A prompt of 100 words tagged `tag`.
fn prompt(tag: &str) -> String {
    (0..100)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The engine's ids for a completion prompt (the `/tokenize` the gateway calls).
async fn engine_ids(client: &HttpClient, engine: &ReplicaHandle, prompt: &str) -> Vec<u32> {
    let body = serde_json::json!({"model": MOCK_MODEL, "prompt": prompt}).to_string();
    let answer = post(client, &format!("{}/tokenize", engine.url()), None, body).await;
    let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    serde_json::from_value(json["tokens"].clone()).unwrap()
}

/// Engine hashes of `ids`' full blocks as one rank names them (`base + i`).
fn engine_hashes(ids: &[u32], base: u64) -> Vec<u64> {
    (0..(ids.len() / ENGINE_BLOCK) as u64)
        .map(|i| base + i)
        .collect()
}

/// One `BlockStored` of `ids`' full blocks under engine hashes from `base`.
fn stored(ids: &[u32], base: u64) -> KvEvent {
    let block_hashes = engine_hashes(ids, base);
    KvEvent::BlockStored {
        token_ids: ids[..block_hashes.len() * ENGINE_BLOCK].to_vec(),
        block_hashes,
        parent: None,
        block_size: ENGINE_BLOCK,
    }
}

fn last_seq_key(pod: &str, rank: u32) -> String {
    format!("aibrix_kvcache_zmq_last_sequence_id{{dp_rank=\"{rank}\",pod_key=\"{pod}\"}}")
}

/// Waits until both pods applied each rank's batches up to `seqs[rank]`.
async fn wait_applied(client: &HttpClient, gateway: &gateway::GatewayHandle, seqs: [u64; 2]) {
    wait_for_metrics(client, gateway, "every rank's batches applied", |m| {
        ["a", "b"].iter().all(|pod| {
            (0..2u32).all(|rank| {
                m.lines().any(|line| {
                    line.strip_prefix(last_seq_key(pod, rank).as_str())
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        == Some(seqs[rank as usize] as f64)
                })
            })
        })
    })
    .await;
}

/// The match percent the gateway's `prefix-cache` reports for `prompt`.
async fn routed_match(client: &HttpClient, gateway: &gateway::GatewayHandle, text: &str) -> String {
    let body = serde_json::json!({"model": MOCK_MODEL, "prompt": text, "max_tokens": 1});
    let percent = post(
        client,
        &format!("{}/v1/completions", gateway.url()),
        Some("prefix-cache"),
        body.to_string(),
    )
    .await;
    String::from_utf8(percent.to_vec()).unwrap()
}

#[tokio::test]
async fn a_data_parallel_pods_index_is_the_union_of_its_ranks() {
    let client = http_client();
    let a = spawn_replica(fast_replica("a")).await.unwrap();
    let b = spawn_replica(fast_replica("b")).await.unwrap();
    let (mut ranks, events, replay) = two_ranks().await;
    let [only_rank_1, both_kept, only_rank_0, both_gone] =
        ["onlyone", "bothkept", "onlyzero", "bothgone"].map(prompt);
    let ids_1 = engine_ids(&client, &a, &only_rank_1).await;
    let ids_kept = engine_ids(&client, &a, &both_kept).await;
    let ids_0 = engine_ids(&client, &a, &only_rank_0).await;
    let ids_gone = engine_ids(&client, &a, &both_gone).await;
    // Before any subscriber exists: only each rank's replay can deliver these. Rank 0's
    // empty batch gives its subscribers a last seq, so any later batch a forming
    // subscription misses is a gap that replay fills.
    let first = ranks[1].publish(&[stored(&ids_1, 1_000)]).await;
    let empty = ranks[0].publish(&[]).await;

    let config = gateway_config(vec![backend(&a), backend(&b)], events, replay);
    let gateway = gateway::start(config).await.unwrap();
    wait_applied(&client, &gateway, [empty, first]).await;
    assert_eq!(routed_match(&client, &gateway, &only_rank_1).await, "100");

    // Both ranks store two prompts, rank 0 one of its own; then rank 0 clears its cache.
    ranks[1]
        .publish(&[stored(&ids_kept, 2_000), stored(&ids_gone, 3_000)])
        .await;
    ranks[0]
        .publish(&[stored(&ids_kept, 12_000), stored(&ids_gone, 13_000)])
        .await;
    ranks[0].publish(&[stored(&ids_0, 14_000)]).await;
    let cleared = ranks[0].publish(&[KvEvent::AllBlocksCleared]).await;
    // Rank 1 then evicts one of the prompts both ranks had.
    let evicted = ranks[1]
        .publish(&[KvEvent::BlockRemoved {
            block_hashes: engine_hashes(&ids_gone, 3_000),
        }])
        .await;
    wait_applied(&client, &gateway, [cleared, evicted]).await;
    assert_eq!(
        routed_match(&client, &gateway, &both_kept).await,
        "100",
        "rank 1 still holds it after rank 0's clear"
    );
    assert_eq!(
        routed_match(&client, &gateway, &only_rank_0).await,
        "0",
        "rank 0's clear was applied"
    );
    assert_eq!(
        routed_match(&client, &gateway, &both_gone).await,
        "0",
        "rank 0 cleared it and rank 1 evicted it"
    );

    let text = metrics(&client, &gateway).await;
    for pod in ["a", "b"] {
        let processed = |kind: &str| {
            sample(
                &text,
                &format!(
                    "aibrix_kvcache_zmq_events_processed_total{{event_type=\"{kind}\",pod_key=\"{pod}\"}}"
                ),
            )
        };
        // Summed over both ranks: 1 + 2 on rank 1, 3 on rank 0.
        assert_eq!(processed("BlockStored"), 6.0, "{text}");
        assert_eq!(processed("AllBlocksCleared"), 1.0, "{text}");
        assert_eq!(processed("BlockRemoved"), 1.0, "{text}");
        for rank in 0..2 {
            let status = format!(
                "aibrix_kvcache_zmq_connection_status{{dp_rank=\"{rank}\",pod_key=\"{pod}\"}}"
            );
            assert!(text.contains(&status), "{status}: {text}");
        }
    }
    for error in ["dp_rank_mismatch", "unknown_parent", "sequence_reset"] {
        assert!(!text.contains(error), "{error}: {text}");
    }
    gateway.shutdown().await;
    for rank in ranks {
        rank.replay.abort();
    }
    a.shutdown().await;
    b.shutdown().await;
}
