//! The ZMQ side of KV events, as vLLM's `ZmqEventPublisher` behaves: a PUB socket sending
//! `[topic, seq, payload]` per batch, a bounded replay buffer of the newest `buffer_steps`
//! batches, and a ROUTER socket answering replay requests from it.
//!
//! Two tasks per replica. The publisher task waits on the [`BatchQueue`] the engine driver
//! fills (the driver never waits on it), numbers each batch from 0, encodes it
//! (`router_core::kv_sync::wire`), keeps it for replay and sends it; a PUB socket drops for a subscriber
//! that cannot keep up, so sending never waits either. The replay task answers
//! `[identity, "", start_seq]` with `[identity, "", seq, payload]` for every buffered batch
//! with `seq ≥ start_seq`, then `[identity, "", END_OF_REPLAY, ""]`; a client that stops
//! reading its replay is abandoned after [`REPLAY_SEND_TIMEOUT`]. Both end when the
//! replica's stop signal changes or its sender is dropped.
//!
//! `ts` on the wire is `epoch + engine seconds`, where `epoch` is the Unix time at which the
//! replica's engine clock started: at time scale 1 that is vLLM's `time.time()` at the step's
//! end; at scale S it runs S times faster from the start, matching the engine's other times.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::config::{Attach, KvEventsConfig, KvEventsConfigError};
use super::queue::BatchQueue;
use crate::model::KvEventBatch;
use router_core::kv_sync::wire::{self, EventBatch, EventFormat};

/// How long one replay message may wait for a slow client before the replay is abandoned.
pub const REPLAY_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the publisher could not start.
#[derive(Debug, Error)]
pub enum PublisherError {
    #[error(transparent)]
    Config(#[from] KvEventsConfigError),
    #[error("KV events: cannot bind {endpoint}: {source}")]
    Bind {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
}

/// Batches kept for replay, oldest first, each with its seq and encoded payload.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// A running publisher: where it listens, and the queue the engine driver fills.
#[derive(Debug)]
pub struct KvEventPublisher {
    queue: Arc<BatchQueue>,
    endpoint: String,
    replay_endpoint: Option<String>,
    tasks: Vec<JoinHandle<()>>,
}

impl KvEventPublisher {
    /// Binds the sockets (or starts dialling, for a connecting PUB) and spawns the tasks on
    /// the current runtime. `epoch` is added to every batch's engine time to make `ts`.
    pub async fn start(
        config: &KvEventsConfig,
        epoch: f64,
        stop: watch::Receiver<bool>,
    ) -> Result<KvEventPublisher, PublisherError> {
        let mut socket = PubSocket::new();
        let (endpoint, connect) = match config.pub_attach()? {
            Attach::Bind(endpoint) => {
                let bound = socket
                    .bind(&endpoint)
                    .await
                    .map_err(|source| PublisherError::Bind { endpoint, source })?;
                (bound.to_string(), None)
            }
            Attach::Connect(endpoint) => (endpoint.clone(), Some(endpoint)),
        };
        let replay = match config.replay_attach()? {
            Some(endpoint) => {
                let mut router = RouterSocket::new();
                let bound = router
                    .bind(&endpoint)
                    .await
                    .map_err(|source| PublisherError::Bind { endpoint, source })?;
                Some((router, bound.to_string()))
            }
            None => None,
        };
        let queue = Arc::new(BatchQueue::new(config.max_queue_size));
        let buffer: ReplayBuffer = Arc::new(Mutex::new(VecDeque::new()));
        let mut tasks = vec![tokio::spawn(publish_loop(
            socket,
            connect,
            Arc::clone(&queue),
            PublishState {
                buffer: Arc::clone(&buffer),
                buffer_steps: config.buffer_steps,
                topic: Bytes::from(config.topic.clone().into_bytes()),
                format: config.format,
                epoch,
            },
            stop.clone(),
        ))];
        let replay_endpoint = replay.map(|(router, bound)| {
            tasks.push(tokio::spawn(replay_loop(router, buffer, stop)));
            bound
        });
        Ok(KvEventPublisher {
            queue,
            endpoint,
            replay_endpoint,
            tasks,
        })
    }

    /// The queue the engine driver pushes batches into.
    pub fn queue(&self) -> Arc<BatchQueue> {
        Arc::clone(&self.queue)
    }

    /// The PUB endpoint: the bound address (real port when 0 was asked) or the one dialled.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint, if replay is served.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Waits for the tasks to end (after the stop signal).
    pub async fn join(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// What the publisher task needs besides its socket and queue.
struct PublishState {
    buffer: ReplayBuffer,
    buffer_steps: usize,
    topic: Bytes,
    format: EventFormat,
    epoch: f64,
}

impl PublishState {
    /// Numbers, encodes and keeps one batch; returns the message to send.
    fn prepare(&self, seq: u64, batch: &KvEventBatch) -> ZmqMessage {
        let payload = Bytes::from(wire::encode_batch(
            &EventBatch {
                ts: self.epoch + batch.ts,
                lora_names: vec![None; batch.events.len()],
                events: batch.events.clone(),
                data_parallel_rank: Some(0),
                skipped: 0,
            },
            self.format,
        ));
        if self.buffer_steps > 0 {
            let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buffer.len() == self.buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload.clone()));
        }
        let mut message = ZmqMessage::from(self.topic.clone());
        message.push_back(Bytes::copy_from_slice(&wire::seq_frame(seq)));
        message.push_back(payload);
        message
    }
}

async fn publish_loop(
    mut socket: PubSocket,
    connect: Option<String>,
    queue: Arc<BatchQueue>,
    state: PublishState,
    mut stop: watch::Receiver<bool>,
) {
    if let Some(endpoint) = connect {
        // zeromq retries until the peer answers; batches wait in the queue meanwhile.
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            connected = socket.connect(&endpoint) => if let Err(e) = connected {
                tracing::error!(%endpoint, error = %e, "KV events: cannot connect; not publishing");
                return;
            },
        }
    }
    let mut seq = 0u64;
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            () = queue.pushed() => {}
        }
        for batch in queue.drain() {
            let message = state.prepare(seq, &batch);
            seq += 1;
            if let Err(e) = socket.send(message).await {
                tracing::debug!(error = %e, "KV events: send failed");
            }
        }
    }
}

async fn replay_loop(
    mut socket: RouterSocket,
    buffer: ReplayBuffer,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let request = tokio::select! {
            biased;
            _ = stop.changed() => return,
            request = socket.recv() => request,
        };
        let frames = match request {
            Ok(message) => message.into_vec(),
            Err(e) => {
                tracing::debug!(error = %e, "KV events: replay receive failed");
                continue;
            }
        };
        // vLLM's check: exactly [identity, "", start_seq]; anything else is ignored.
        let [identity, _, start] = frames.as_slice() else {
            tracing::warn!(frames = frames.len(), "KV events: malformed replay request");
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            tracing::warn!("KV events: replay start_seq is not 8 bytes");
            continue;
        };
        let start = u64::from_be_bytes(start);
        let replies: Vec<(u64, Bytes)> = buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let end = (wire::END_OF_REPLAY, Bytes::new());
        for (seq, payload) in replies.into_iter().chain(std::iter::once(end)) {
            let mut message = ZmqMessage::from(identity.clone());
            message.push_back(Bytes::new());
            message.push_back(Bytes::copy_from_slice(&wire::seq_frame(seq)));
            message.push_back(payload);
            match tokio::time::timeout(REPLAY_SEND_TIMEOUT, socket.send(message)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "KV events: replay send failed");
                    break;
                }
                Err(_) => {
                    tracing::warn!("KV events: replay client stopped reading; abandoned");
                    break;
                }
            }
        }
    }
}
