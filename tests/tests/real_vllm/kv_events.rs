//! KV-event sync against vLLM's own publisher: its events decode, the index holds the
//! replica's blocks, and the ids the gateway gets from `/tokenize` for chat and completions
//! are the ones the events carry, so both sides hash the same router blocks. A chat
//! template or special-token handling that differed (a `<s>` too many or too few) would
//! fail here: the first block would differ, and with it every hash after it.

use std::time::Duration;

use gateway::config::BackendConfig;
use prefixgate_tests::{Client, sample_value};
use router_core::kv_sync::{KvEvent, decode_batch, token_bytes};
use router_core::text::Endpoint;
use zeromq::{Socket, SocketRecv, SubSocket};

use super::fleet::{Fleet, MODEL};
use super::gateway::Gateway;
use super::prompts;

/// Router blocks are 128 bytes: 32 token ids of 4 bytes, one vLLM CPU block.
const KV_SYNC: &str = "[kv_sync]\nenabled = true\ninitial_backoff_ms = 100\n";
const TOKENS_PER_BLOCK: usize = 32;

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn chat_tokens_from_tokenize_hash_like_vllms_events_and_fill_the_index() {
    let fleet = Fleet::from_env();
    let family = prompts::family("kv-chat");
    let messages = serde_json::json!([
        {"role": "system", "content": family},
        {"role": "user", "content": "One question."},
    ]);
    let body = prompts::chat(&family, "One question.", 8, false);
    events_line_up(
        &fleet,
        "kv-chat",
        Endpoint::ChatCompletions,
        "/v1/chat/completions",
        &messages,
        &body,
    )
    .await;
}

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn completion_tokens_from_tokenize_hash_like_vllms_events_and_fill_the_index() {
    let fleet = Fleet::from_env();
    let family = prompts::family("kv-completion");
    let prompt = serde_json::json!(format!("{family} One question."));
    let body = prompts::completion(&family, "One question.", 8, false);
    events_line_up(
        &fleet,
        "kv-completion",
        Endpoint::Completions,
        "/v1/completions",
        &prompt,
        &body,
    )
    .await;
}

async fn events_line_up(
    fleet: &Fleet,
    name: &str,
    endpoint: Endpoint,
    path: &str,
    prompt: &serde_json::Value,
    body: &str,
) {
    let client = Client::new();
    let mut events = Events::subscribe(&client, &fleet.backends).await;
    let gateway = Gateway::start(fleet, name, &[fleet.a(), fleet.b()], KV_SYNC).await;
    wait_subscribed(&gateway, &client, &fleet.backends).await;

    let first = gateway.post(&client, path, &[], body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let pod = first.header("target-pod").unwrap().to_owned();
    let prompt_tokens = first.json()["usage"]["prompt_tokens"].as_u64().unwrap() as usize;

    // The gateway's own /tokenize body, asked of the replica that served the request.
    let tokenize = gateway::tokenize_body(endpoint, MODEL, prompt.to_string().as_bytes()).unwrap();
    let url = &fleet.named(&pod).url;
    let answer = client
        .call(
            "POST",
            &format!("{url}/tokenize"),
            &[("content-type", "application/json")],
            tokenize,
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let ids: Vec<u32> = serde_json::from_value(answer.json()["tokens"].clone()).unwrap();
    assert_eq!(
        ids.len(),
        prompt_tokens,
        "/tokenize counts the tokens vLLM prefilled for the request (template and special tokens alike)"
    );

    let full = prompt_tokens / TOKENS_PER_BLOCK * TOKENS_PER_BLOCK;
    let stored = events.stored_starting_with(&ids[..TOKENS_PER_BLOCK]).await;
    assert!(
        stored.len() >= full,
        "the request's full prompt blocks were stored: {} < {full}",
        stored.len()
    );
    assert_eq!(
        &stored[..full],
        &ids[..full],
        "the event's token ids are /tokenize's"
    );
    let hashes = |tokens: &[u32]| {
        router_core::hash::block_hashes(&token_bytes(tokens), 4 * TOKENS_PER_BLOCK, 0)
    };
    assert_eq!(hashes(&stored[..full]), hashes(&ids[..full]));

    // The gateway decoded the same events into its index.
    let blocks = (full / TOKENS_PER_BLOCK) as u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = gateway.replica(&client, &pod).await["cached_blocks"]
            .as_u64()
            .unwrap_or(0);
        if held >= blocks {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pod} holds {held} of {blocks} blocks in the index"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = gateway.metrics(&client).await;
    let processed = metrics
        .lines()
        .filter(|l| {
            l.starts_with("aibrix_kvcache_zmq_events_processed_total{") && l.contains("BlockStored")
        })
        .count();
    assert!(processed > 0, "{metrics}");

    // The same prompt again: every full block matched from the events, on the same replica.
    let again = gateway.post(&client, path, &[], body).await;
    assert_eq!(again.header("target-pod"), Some(pod.as_str()));
    assert_eq!(
        again.header("x-prefixgate-match-percent"),
        Some("100"),
        "{}",
        again.text()
    );
    let cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        cached as usize >= full - TOKENS_PER_BLOCK,
        "vLLM found them too: {cached}"
    );
    gateway.wait_outstanding_zero(&client).await;
}

/// Waits (bounded) until the gateway's subscribers are connected to every replica.
async fn wait_subscribed(gateway: &Gateway, client: &Client, backends: &[BackendConfig]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = gateway.metrics(client).await;
        let up = backends
            .iter()
            .filter(|b| {
                sample_value(
                    &metrics,
                    &format!(
                        "aibrix_kvcache_zmq_connection_status{{pod_key=\"{}\"}}",
                        b.name
                    ),
                ) == 1.0
            })
            .count();
        if up == backends.len() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "KV sync did not connect: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// This test's own subscription to the replicas' events.
struct Events {
    socket: SubSocket,
}

impl Events {
    /// Subscribed to every replica, and known to receive: a SUB drops what was published
    /// before its subscription reached the publisher, so warm-up requests are sent
    /// straight to each replica until an event of each arrives (bounded).
    async fn subscribe(client: &Client, backends: &[BackendConfig]) -> Events {
        let mut socket = SubSocket::new();
        for backend in backends {
            socket
                .connect(backend.kv_events.as_deref().unwrap())
                .await
                .unwrap();
        }
        socket.subscribe("").await.unwrap();
        let mut events = Events { socket };
        for backend in backends {
            let family = prompts::family("warm-up");
            let mut heard = false;
            for _ in 0..20 {
                let body = prompts::completion(&family, &format!("{heard}"), 1, false);
                let url = format!("{}/v1/completions", backend.url);
                client
                    .call("POST", &url, &[("content-type", "application/json")], body)
                    .await;
                let first: Vec<u32> = Vec::new();
                if events
                    .next_stored(Duration::from_millis(500), &first)
                    .await
                    .is_some()
                {
                    heard = true;
                    break;
                }
            }
            assert!(
                heard,
                "no KV event from {} after 20 warm-up requests",
                backend.name
            );
        }
        events
    }

    /// The token ids of the next `BlockStored` whose ids start with `start` (bounded: 10 s).
    async fn stored_starting_with(&mut self, start: &[u32]) -> Vec<u32> {
        self.next_stored(Duration::from_secs(10), start)
            .await
            .unwrap_or_else(|| panic!("no BlockStored starting with {start:?} within 10 s"))
    }

    async fn next_stored(&mut self, within: Duration, start: &[u32]) -> Option<Vec<u32>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let message = tokio::time::timeout_at(deadline, self.socket.recv())
                .await
                .ok()?
                .unwrap();
            let frames = message.into_vec();
            assert_eq!(frames.len(), 3, "[topic, seq, payload]");
            let batch = decode_batch(&frames[2]).expect("vLLM's batch decodes");
            for event in batch.events {
                if let KvEvent::BlockStored {
                    token_ids,
                    block_size,
                    ..
                } = event
                {
                    assert_eq!(block_size, TOKENS_PER_BLOCK);
                    if token_ids.starts_with(start) {
                        return Some(token_ids);
                    }
                }
            }
        }
    }
}
