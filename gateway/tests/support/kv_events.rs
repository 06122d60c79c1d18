//! What the KV-event sync end-to-end tests share: a static `fast` mock replica, its backend
//! entry, a hand-driven publisher's batch on the wire (topic, seq, payload, encoded by
//! `router_core::kv_sync::wire` as the mock engine's publisher does), and the
//! per-pod last applied sequence number read from the gateway's metrics.

use bytes::Bytes;
use gateway::GatewayConfig;
use gateway::config::BackendConfig;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, ReplicaHandle};
use router_core::kv_sync::wire::{EventBatch, EventFormat, KvEvent, encode_batch, seq_frame};
use zeromq::{PubSocket, SocketSend, ZmqMessage};

use super::{MOCK_MODEL, loopback_config, with_quick_retries};

/// The payload of one batch of `events` in `format` from data-parallel rank `rank`, each
/// event cached for the adapter at its place in `lora_names` (the base model when short).
pub fn payload(
    format: EventFormat,
    events: Vec<KvEvent>,
    lora_names: Vec<Option<String>>,
    rank: i64,
) -> Bytes {
    let batch = EventBatch {
        ts: 0.0,
        events,
        lora_names,
        data_parallel_rank: Some(rank),
        skipped: 0,
    };
    Bytes::from(encode_batch(&batch, format))
}

/// A replica on loopback port 0 with the never-busy `fast` profile, engine time ×10.
pub fn fast_replica(name: &str) -> ReplicaConfig {
    ReplicaConfig {
        name: name.to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        model: MOCK_MODEL.to_owned(),
        profile: EngineProfile::load("fast").unwrap(),
        time_scale: 10.0,
        failures: FailurePlan::default(),
    }
}

/// The gateway's static backend entry for a running replica.
pub fn backend(handle: &ReplicaHandle) -> BackendConfig {
    BackendConfig {
        name: handle.name().to_owned(),
        url: handle.url(),
        model: Some(MOCK_MODEL.to_owned()),
        kv_events: None,
        kv_replay: None,
    }
}

/// A gateway in front of `backends` with KV-event sync on, subscribed to the `events` and
/// `replay` ports on each backend's host, with reconnects and renewals quick enough for a
/// test.
pub fn kv_sync_config(backends: Vec<BackendConfig>, events: u16, replay: u16) -> GatewayConfig {
    let mut config = with_quick_retries(loopback_config());
    config.backends = backends;
    config.kv_sync.enabled = true;
    config.kv_sync.port = events;
    config.kv_sync.replay_port = replay;
    // A batch published while a subscription is still forming is caught by the next
    // renewal's replay.
    config.kv_sync.idle_resubscribe_ms = 500;
    config
}

/// The port of a `tcp://IP:PORT` endpoint.
pub fn port(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

/// Sends one batch as vLLM's publisher does: three frames, topic, 8-byte seq, msgpack payload.
pub async fn send_batch(socket: &mut PubSocket, seq: u64, payload: Bytes) {
    let mut message = ZmqMessage::from(Bytes::from_static(b"kv@test@mock-model"));
    message.push_back(Bytes::copy_from_slice(&seq_frame(seq)));
    message.push_back(payload);
    socket.send(message).await.unwrap();
}

/// The last sequence number the gateway applied for `pod` (one engine per replica).
pub fn last_seq(text: &str, pod: &str) -> Option<f64> {
    let key = format!("aibrix_kvcache_zmq_last_sequence_id{{pod_key=\"{pod}\"}}");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
}
