//! One KV-event stream's subscription: a ZeroMQ SUB on its PUB socket (every topic), a
//! DEALER for replay, and the batches applied to the router's index through the replica's
//! [`PodSync`]. A replica runs one stream per vLLM data-parallel rank (one for a plain
//! engine); each rank is a subscription of its own, with its own sequence numbers, replay
//! and restart detection, writing into the replica's shared [`PodSync`] as that rank.
//!
//! Wire (vLLM `ZmqEventPublisher`): a live message is `[topic, seq (8 bytes BE), payload]`;
//! a replay request is `["", start_seq (8 bytes BE)]` on the DEALER, answered with
//! `["", seq, payload]` per buffered batch from `start_seq`, then `["", 0xFF×8, ""]` (the end
//! marker). Sequence numbers start at 0 and grow by one per batch.
//!
//! The session, repeated until the task is aborted (the replica left the set):
//! 1. connect the SUB and subscribe (each step under `socket_timeout_ms`);
//! 2. replay from the last applied seq + 1 (0 at first), so what was published while the
//!    gateway was away is not lost;
//! 3. apply live batches in order: a duplicate (seq ≤ last, from the replay overlap) is
//!    skipped; a gap asks for a replay of the missing range and counts what it could not
//!    fill as missed; a live seq at or below the previous live one, or at or below where
//!    the session started, means the engine restarted (its counter and its cache start
//!    over): the blocks this rank fed (and no other rank of the pod holds) are dropped and
//!    the new engine is replayed from 0 (a restart whose new counter has already passed the
//!    old one goes unnoticed until its evictions do);
//! 4. with no batch for `idle_resubscribe_ms`, the session ends and starts again at once,
//!    because a ZeroMQ SUB never notices that its publisher went away.
//!
//! A failed connect, subscribe or receive backs off (doubling from `initial_backoff_ms` to
//! `max_backoff_ms`) before the next session. Every wait is under a timeout; nothing here
//! touches the request path.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use router_core::kv_sync::wire::{END_OF_REPLAY, read_seq};
use router_core::kv_sync::{KvEvent, PodSync, decode_batch, index_models};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::clock::Clock;
use crate::kv_sync::config::KvSyncConfig;
use crate::kv_sync::metrics::KvSyncMetrics;
use crate::replicas::Replica;
use crate::replicas::kv_events::EventEndpoints;

/// Replay messages taken in one replay at most (vLLM keeps 10 000 batches by default).
const MAX_REPLAY_MESSAGES: usize = 1_000_000;

/// What one subscriber needs.
#[derive(Debug)]
pub struct Subscription {
    /// The router whose index the events feed.
    pub router: Arc<router_core::Router>,
    /// The index's clock.
    pub clock: Clock,
    pub replica: Arc<Replica>,
    /// The data-parallel rank this stream is (0 for a single-engine replica).
    pub rank: u32,
    /// This rank's endpoints.
    pub endpoints: EventEndpoints,
    pub sync: Arc<Mutex<PodSync>>,
    pub metrics: KvSyncMetrics,
    pub config: KvSyncConfig,
}

/// Why a session ended.
enum SessionEnd {
    /// No batch for the idle period: renew the subscription now.
    Idle,
    /// Something failed (`error_type` label): back off first.
    Failed(&'static str),
}

/// Runs the subscription until the task is aborted.
pub async fn run(subscription: Subscription) {
    let mut applier = Applier {
        subscription: &subscription,
        last: None,
        logged: HashSet::new(),
        renewal: false,
    };
    let pod = subscription.replica.name().to_owned();
    let initial = Duration::from_millis(subscription.config.initial_backoff_ms);
    let max = Duration::from_millis(subscription.config.max_backoff_ms);
    let mut backoff = initial;
    let mut first = true;
    loop {
        if !first {
            applier
                .metrics()
                .reconnect_attempts
                .with_label_values(&[&pod])
                .inc();
        }
        first = false;
        let end = applier.session().await;
        applier
            .metrics()
            .set_connection_status(&pod, subscription.rank, false);
        applier.renewal = matches!(end, SessionEnd::Idle);
        match end {
            SessionEnd::Idle => backoff = initial,
            SessionEnd::Failed(kind) => {
                applier.metrics().error(&pod, kind);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(max);
            }
        }
    }
}

/// The session state kept across reconnects: the last applied seq.
struct Applier<'a> {
    subscription: &'a Subscription,
    last: Option<u64>,
    /// Error kinds already logged (each is logged once per subscriber, counted always).
    logged: HashSet<&'static str>,
    /// This session renews an idle one (logged at debug: it happens every idle period).
    renewal: bool,
}

impl Applier<'_> {
    fn metrics(&self) -> &KvSyncMetrics {
        &self.subscription.metrics
    }

    fn pod(&self) -> &str {
        self.subscription.replica.name()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.subscription.config.socket_timeout_ms)
    }

    async fn session(&mut self) -> SessionEnd {
        let endpoint = &self.subscription.endpoints.events;
        let mut socket = SubSocket::new();
        match tokio::time::timeout(self.timeout(), socket.connect(endpoint)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.log_once("connect", &e.to_string());
                return SessionEnd::Failed("connect");
            }
            Err(_) => return SessionEnd::Failed("connect_timeout"),
        }
        match tokio::time::timeout(self.timeout(), socket.subscribe("")).await {
            Ok(Ok(())) => {}
            _ => return SessionEnd::Failed("subscribe"),
        }
        let pod = self.pod().to_owned();
        self.metrics().connections.with_label_values(&[&pod]).inc();
        let rank = self.subscription.rank;
        self.metrics().set_connection_status(&pod, rank, true);
        if self.renewal {
            tracing::debug!(%pod, rank, %endpoint, "KV events: subscription renewed after idling");
        } else {
            tracing::info!(%pod, rank, %endpoint, "KV events: subscribed");
        }
        // Within one session a publisher numbers its batches upwards, and a session
        // starts above every batch seen before it: a live seq at or below either bound
        // means the publisher behind the endpoint started over.
        let mut floor = self.last;
        let mut previous_live: Option<u64> = None;
        self.replay_from(self.next_seq()).await;
        let idle = Duration::from_millis(self.subscription.config.idle_resubscribe_ms);
        let end = loop {
            let message = match tokio::time::timeout(idle, socket.recv()).await {
                Err(_) => break SessionEnd::Idle,
                Ok(Err(e)) => {
                    self.log_once("receive", &e.to_string());
                    break SessionEnd::Failed("receive");
                }
                Ok(Ok(message)) => message,
            };
            let Some((seq, payload)) = self.live_frames(message) else {
                continue;
            };
            let went_back = floor.is_some_and(|floor| seq <= floor)
                || previous_live.is_some_and(|previous| seq <= previous);
            previous_live = Some(seq);
            if went_back {
                // A new engine: its cache is empty and its counter starts over.
                self.metrics().error(&pod, "sequence_reset");
                self.log_once("sequence_reset", &format!("seq {seq}: engine restarted"));
                self.forget_engine();
                floor = None;
                self.replay_from(0).await;
            }
            self.live(seq, &payload).await;
        };
        self.metrics()
            .disconnections
            .with_label_values(&[&pod])
            .inc();
        end
    }

    fn next_seq(&self) -> u64 {
        self.last.map_or(0, |last| last.saturating_add(1))
    }

    /// `[topic, seq, payload]`, or `None` (counted) when the message is not that.
    fn live_frames(&mut self, message: ZmqMessage) -> Option<(u64, Bytes)> {
        let frames = message.into_vec();
        let parsed = match frames.as_slice() {
            [_topic, seq, payload] => read_seq(seq).map(|seq| (seq, payload.clone())),
            _ => None,
        };
        if parsed.is_none() {
            let pod = self.pod().to_owned();
            self.metrics().error(&pod, "malformed_message");
            self.log_once(
                "malformed_message",
                &format!("{} frames, expected [topic, seq, payload]", frames.len()),
            );
        }
        parsed
    }

    /// One live batch: skip a duplicate, fill a gap by replay, then apply.
    async fn live(&mut self, seq: u64, payload: &[u8]) {
        if self.last.is_some_and(|last| seq <= last) {
            return;
        }
        if self.last.is_some() && seq > self.next_seq() {
            self.replay_from(self.next_seq()).await;
        }
        if self.last.is_some_and(|last| seq <= last) {
            return;
        }
        if let Some(last) = self.last
            && seq > last + 1
        {
            let pod = self.pod().to_owned();
            self.metrics()
                .missed_events
                .with_label_values(&[&pod])
                .inc_by(seq - last - 1);
        }
        self.apply(seq, payload);
    }

    /// Asks the replay socket for every buffered batch from `start` and applies those past
    /// the last one applied. Without a replay endpoint this does nothing.
    async fn replay_from(&mut self, start: u64) {
        let Some(endpoint) = self.subscription.endpoints.replay.clone() else {
            return;
        };
        let pod = self.pod().to_owned();
        self.metrics()
            .replay_requests
            .with_label_values(&[&pod])
            .inc();
        match self.replay(&endpoint, start).await {
            Ok(()) => self
                .metrics()
                .replay_success
                .with_label_values(&[&pod])
                .inc(),
            Err(reason) => {
                self.metrics()
                    .replay_failures
                    .with_label_values(&[&pod])
                    .inc();
                self.log_once("replay", &format!("replay from {start}: {reason}"));
            }
        }
    }

    async fn replay(&mut self, endpoint: &str, start: u64) -> Result<(), String> {
        let timeout = self.timeout();
        let mut dealer = DealerSocket::new();
        tokio::time::timeout(timeout, dealer.connect(endpoint))
            .await
            .map_err(|_| format!("no connection to {endpoint}"))?
            .map_err(|e| format!("connect {endpoint}: {e}"))?;
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
        tokio::time::timeout(timeout, dealer.send(request))
            .await
            .map_err(|_| "send timed out".to_owned())?
            .map_err(|e| format!("send: {e}"))?;
        for _ in 0..MAX_REPLAY_MESSAGES {
            let reply = tokio::time::timeout(timeout, dealer.recv())
                .await
                .map_err(|_| "no reply within the socket timeout".to_owned())?
                .map_err(|e| format!("receive: {e}"))?
                .into_vec();
            let (seq, payload) = match reply.as_slice() {
                [_, seq, payload] => (read_seq(seq), payload),
                _ => (None, &Bytes::new()),
            };
            let Some(seq) = seq else {
                return Err(format!("a reply of {} frames", reply.len()));
            };
            if seq == END_OF_REPLAY {
                return Ok(());
            }
            if self.last.is_none_or(|last| seq > last) {
                self.apply(seq, payload);
            }
        }
        Err(format!("more than {MAX_REPLAY_MESSAGES} messages"))
    }

    /// Decodes and applies one batch, and records it as the last.
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        let pod = self.pod().to_owned();
        let rank = self.subscription.rank;
        self.last = Some(seq);
        self.metrics().set_last_sequence_id(&pod, rank, seq);
        let started = Instant::now();
        let batch = match decode_batch(payload) {
            Ok(batch) => batch,
            Err(e) => {
                self.metrics().error(&pod, e.kind());
                self.log_once(e.kind(), &e.to_string());
                return;
            }
        };
        if let Some(stated) = batch.data_parallel_rank
            && stated != i64::from(rank)
        {
            // The port says which rank this is (vLLM offsets it by the rank); a batch that
            // says otherwise is applied as the port's rank, and the mismatch is reported.
            self.metrics().error(&pod, "dp_rank_mismatch");
            self.log_once(
                "dp_rank_mismatch",
                &format!("a batch says data_parallel_rank {stated} on rank {rank}'s port"),
            );
        }
        if batch.skipped > 0 {
            let skipped = batch.skipped as u64;
            self.metrics()
                .events_received
                .with_label_values(&[&pod, "unknown"])
                .inc_by(skipped);
            self.metrics()
                .errors
                .with_label_values(&[&pod, "unknown_event_type"])
                .inc_by(skipped);
        }
        let models = self.subscription.replica.models();
        let router = &self.subscription.router;
        let now = self.subscription.clock.now_ms();
        let settings = router.kv_sync_settings();
        let mut failures = Vec::new();
        {
            let mut sync = self
                .subscription
                .sync
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (event, lora_name) in batch.events_with_lora() {
                let kind = event_type(event);
                // A LoRA adapter's blocks serve only requests naming the adapter.
                let models = index_models(lora_name, &models);
                self.subscription
                    .metrics
                    .events_received
                    .with_label_values(&[&pod, kind])
                    .inc();
                match sync.apply_rank(rank, event, &pod, &models, router.index(), &settings, now) {
                    Ok(_) => self
                        .subscription
                        .metrics
                        .events_processed
                        .with_label_values(&[&pod, kind])
                        .inc(),
                    Err(e) => failures.push(e),
                }
            }
        }
        for error in failures {
            self.metrics().error(&pod, error.kind());
            self.log_once(error.kind(), &error.to_string());
        }
        self.metrics()
            .processing_duration
            .with_label_values(&[&pod])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Drops what this rank's events put in the index and no other rank of the pod holds
    /// (this rank's engine restarted).
    fn forget_engine(&mut self) {
        let pod = self.pod().to_owned();
        let mut sync = self
            .subscription
            .sync
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        sync.clear_rank(
            self.subscription.rank,
            &pod,
            self.subscription.router.index(),
        );
        self.last = None;
    }

    fn log_once(&mut self, kind: &'static str, detail: &str) {
        if self.logged.insert(kind) {
            let rank = self.subscription.rank;
            tracing::warn!(pod = %self.pod(), rank, kind, detail, "KV events (logged once per kind)");
        }
    }
}

/// The `event_type` label.
pub fn event_type(event: &KvEvent) -> &'static str {
    match event {
        KvEvent::BlockStored { .. } => "BlockStored",
        KvEvent::BlockRemoved { .. } => "BlockRemoved",
        KvEvent::AllBlocksCleared => "AllBlocksCleared",
    }
}
