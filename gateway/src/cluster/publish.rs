//! Publishing this gateway's decisions: fire-and-forget from the request path, through a
//! bounded queue, to one task that writes batches to the stream.
//!
//! The request path only ever calls [`ClusterPublisher::decided`] and the returned
//! [`SharedTicket`] (first byte, drop): each is a `try_send` on the queue, never a wait. A
//! full queue drops the message and counts it (`dropped_total{reason="queue_full"}`). The
//! task takes what has queued up (up to [`BATCH`] messages) and writes it in one round trip;
//! while the server is unreachable it drops what arrives (`reason="disconnected"`) and
//! reconnects with backoff, so it resumes with fresh messages rather than a stale backlog.
//!
//! Every `heartbeat` the task publishes the ids this gateway has in flight. A request's id
//! enters that set as its decision is queued and leaves it as its release is queued, both
//! under the set's lock, and the heartbeat is built under the same lock after taking every
//! message already queued; so on the one ordered stream a heartbeat lists exactly the
//! requests whose decision came before it and whose release comes after it (peers drop what
//! a heartbeat no longer lists: see router-core's `cluster::PeerTable`). The lock is held
//! for one set operation and one `try_send`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_core::cluster::{Decided, PeerEvent, PeerMessage, WIRE_VERSION, encode};
use router_core::{Decision, InFlight};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::link::{Backoff, LinkStatus};
use super::metrics::ClusterMetrics;
use super::stream::Stream;

/// Messages written per round trip at most.
pub const BATCH: usize = 256;

/// The request path's handle on publishing (cheap to clone).
#[derive(Debug, Clone)]
pub struct ClusterPublisher {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    next_id: AtomicU64,
    in_flight: InFlightIds,
    queue: mpsc::Sender<PeerEvent>,
    metrics: ClusterMetrics,
}

/// The ids of this gateway's requests in flight, for its heartbeats.
#[derive(Debug, Clone, Default)]
struct InFlightIds(Arc<Mutex<HashSet<u64>>>);

impl InFlightIds {
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        // Every update is one set operation: a poisoned set is still consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One routed request's messages to the peers: its decision went out when it was made; its
/// first byte, its stream clock's points and its release go out through this ticket (the
/// release when it drops, which the response body or a retry does, exactly once).
#[derive(Debug)]
pub struct SharedTicket {
    publisher: ClusterPublisher,
    id: u64,
    first_byte_sent: bool,
}

impl ClusterPublisher {
    /// Publishes the decision that `guard` holds and returns the request's ticket.
    pub fn decided(&self, model: &str, decision: &Decision, guard: &InFlight) -> SharedTicket {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let event = PeerEvent::Decided(Decided::new(
            id,
            model,
            &decision.pod_name,
            &decision.prefix_hashes,
            guard.work(),
        ));
        let mut in_flight = self.inner.in_flight.ids();
        in_flight.insert(id);
        self.send(event);
        drop(in_flight);
        SharedTicket {
            publisher: self.clone(),
            id,
            first_byte_sent: false,
        }
    }

    fn send(&self, event: PeerEvent) {
        let label = event_label(&event);
        if let Err(error) = self.inner.queue.try_send(event) {
            let reason = match error {
                mpsc::error::TrySendError::Full(_) => "queue_full",
                mpsc::error::TrySendError::Closed(_) => "disconnected",
            };
            self.inner
                .metrics
                .dropped
                .with_label_values(&[reason])
                .inc();
            tracing::trace!(event = label, reason, "cluster message dropped");
        }
    }
}

impl SharedTicket {
    /// The request's first response byte arrived (once; later calls do nothing).
    pub fn first_byte(&mut self) {
        if !std::mem::replace(&mut self.first_byte_sent, true) {
            self.publisher.send(PeerEvent::FirstByte { id: self.id });
        }
    }

    /// The request's stream clock recorded `tokens` streamed (a point its peers record too).
    pub fn progress(&mut self, tokens: u64) {
        self.publisher.send(PeerEvent::Progress {
            id: self.id,
            tokens,
        });
    }
}

impl Drop for SharedTicket {
    fn drop(&mut self) {
        let mut in_flight = self.publisher.inner.in_flight.ids();
        in_flight.remove(&self.id);
        self.publisher.send(PeerEvent::Released { id: self.id });
    }
}

/// The `event` label of a message.
pub fn event_label(event: &PeerEvent) -> &'static str {
    match event {
        PeerEvent::Decided(_) => "decided",
        PeerEvent::FirstByte { .. } => "first_byte",
        PeerEvent::Progress { .. } => "progress",
        PeerEvent::Released { .. } => "released",
        PeerEvent::Heartbeat { .. } => "heartbeat",
    }
}

/// Starts publishing as `gateway` (hashing digest `hashing`) to `stream`: the request
/// path's handle, and the task.
pub fn spawn(
    stream: Stream,
    gateway: String,
    hashing: u64,
    queue_capacity: usize,
    heartbeat: Duration,
    metrics: ClusterMetrics,
    status: LinkStatus,
) -> (ClusterPublisher, JoinHandle<()>) {
    let (queue, receiver) = mpsc::channel(queue_capacity);
    let in_flight = InFlightIds::default();
    let publisher = ClusterPublisher {
        inner: Arc::new(Inner {
            next_id: AtomicU64::new(0),
            in_flight: in_flight.clone(),
            queue,
            metrics: metrics.clone(),
        }),
    };
    let task = tokio::spawn(
        Task {
            stream,
            gateway,
            hashing,
            in_flight,
            metrics,
            status,
        }
        .run(receiver, heartbeat),
    );
    (publisher, task)
}

struct Task {
    stream: Stream,
    gateway: String,
    hashing: u64,
    in_flight: InFlightIds,
    metrics: ClusterMetrics,
    status: LinkStatus,
}

impl Task {
    async fn run(self, mut receiver: mpsc::Receiver<PeerEvent>, heartbeat: Duration) {
        let mut ticker = tokio::time::interval(heartbeat);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut connection = None;
        let mut backoff = Backoff::default();
        let mut retry_at = Instant::now();
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            tokio::select! {
                received = receiver.recv_many(&mut batch, BATCH) => {
                    if received == 0 {
                        return; // every publisher handle is gone: the gateway stopped
                    }
                }
                _ = ticker.tick() => {
                    // Under the lock: every decision and release queued so far goes out
                    // before this list of what is in flight.
                    let in_flight = self.in_flight.ids();
                    while let Ok(event) = receiver.try_recv() {
                        batch.push(event);
                    }
                    let mut ids: Vec<u64> = in_flight.iter().copied().collect();
                    drop(in_flight);
                    ids.sort_unstable();
                    batch.push(PeerEvent::Heartbeat { in_flight: ids });
                }
            }
            if connection.is_none() && Instant::now() >= retry_at {
                match self.stream.connect().await {
                    Ok(made) => {
                        connection = Some(made);
                        backoff = Backoff::default();
                        self.status.set_publishing(true, &self.metrics);
                    }
                    Err(error) => {
                        self.metrics.errors.with_label_values(&["connect"]).inc();
                        self.status
                            .publish_failed(&error.to_string(), &self.metrics);
                        retry_at = Instant::now() + backoff.next_delay();
                    }
                }
            }
            let Some(link) = connection.as_mut() else {
                self.drop_batch(&mut batch, "disconnected");
                continue;
            };
            let mut bytes = Vec::with_capacity(batch.len());
            let mut labels = Vec::with_capacity(batch.len());
            for event in batch.drain(..) {
                labels.push(event_label(&event));
                let message = PeerMessage {
                    v: WIRE_VERSION,
                    gateway: self.gateway.clone(),
                    hashing: self.hashing,
                    event,
                };
                match encode(&message) {
                    Ok(encoded) => bytes.push(encoded),
                    Err(error) => {
                        labels.pop();
                        self.metrics.dropped.with_label_values(&["encode"]).inc();
                        tracing::warn!(%error, "cluster message not encoded");
                    }
                }
            }
            match self.stream.publish(link, &bytes, wall_ms()).await {
                Ok(()) => {
                    for label in labels {
                        self.metrics.published.with_label_values(&[label]).inc();
                    }
                }
                Err(error) => {
                    self.metrics
                        .dropped
                        .with_label_values(&["publish_failed"])
                        .inc_by(bytes.len() as u64);
                    self.status
                        .publish_failed(&error.to_string(), &self.metrics);
                    connection = None;
                    retry_at = Instant::now() + backoff.next_delay();
                }
            }
        }
    }

    fn drop_batch(&self, batch: &mut Vec<PeerEvent>, reason: &str) {
        self.metrics
            .dropped
            .with_label_values(&[reason])
            .inc_by(batch.len() as u64);
        batch.clear();
    }
}

/// Milliseconds since the Unix epoch (the trimming horizon; the server's ids use its own).
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}
