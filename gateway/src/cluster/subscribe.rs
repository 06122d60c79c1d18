//! Reading the peers' messages: follow the stream, apply each message to the router's index
//! and the replicas' peer loads, and expire silent peers.
//!
//! The read task connects, reads the stream from where it left off (or, the first time,
//! from `history` before the server's clock: the catch-up snapshot), then follows it with
//! blocking reads. A lost connection is retried with backoff and resumed after the last
//! entry applied, so nothing still in the stream is missed. The expiry task runs every
//! heartbeat, apart from the reads, so a peer's load expires on time even while the server
//! is unreachable: that is what returns a gateway to its own view.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use router_core::cluster::{Outcome, PeerEvent, PeerTable, WireError, decode};
use router_core::{PodLoad, Router};
use tokio::task::JoinHandle;

use super::link::{Backoff, LinkStatus};
use super::metrics::ClusterMetrics;
use super::publish::{event_label, wall_ms};
use super::stream::{Entry, Stream};
use crate::clock::Clock;
use crate::replicas::Replicas;

/// What applying messages needs: the table, the router, the replicas, the clock.
#[derive(Debug, Clone)]
pub struct Applier {
    pub table: Arc<Mutex<PeerTable>>,
    pub router: Arc<Router>,
    pub replicas: Arc<Replicas>,
    pub clock: Clock,
    pub metrics: ClusterMetrics,
}

impl Applier {
    fn table(&self) -> MutexGuard<'_, PeerTable> {
        // Applying a message is a few map operations; a poisoned table is still usable.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies one stream entry; `live` when read after the catch-up (its lag is measured).
    fn apply(&self, entry: &Entry, live: bool) {
        let phase = if live { "live" } else { "catch_up" };
        self.metrics.received.with_label_values(&[phase]).inc();
        let Some(bytes) = &entry.message else {
            self.metrics.errors.with_label_values(&["decode"]).inc();
            return;
        };
        let message = match decode(bytes) {
            Ok(message) => message,
            Err(error) => {
                let label = match error {
                    WireError::Version(_) => "version",
                    WireError::Malformed(_) | WireError::Encode(_) => "decode",
                };
                self.metrics.errors.with_label_values(&[label]).inc();
                tracing::debug!(id = %entry.id, %error, "cluster entry skipped");
                return;
            }
        };
        let find = |name: &str| -> Option<Arc<PodLoad>> {
            self.replicas
                .snapshot()
                .iter()
                .find(|replica| replica.name() == name)
                .map(|replica| Arc::clone(replica.load()))
        };
        let outcome = {
            let mut table = self.table();
            let outcome = table.apply(&message, &self.router, &find, self.clock.now_ms());
            // The gauges follow each message, not only the expiry tick: a peer heard from
            // or a request released shows in /metrics at once.
            self.set_gauges(&table);
            outcome
        };
        match outcome {
            Outcome::Applied => {
                self.metrics
                    .applied
                    .with_label_values(&[event_label(&message.event)])
                    .inc();
            }
            Outcome::Ignored(reason) => {
                self.metrics
                    .ignored
                    .with_label_values(&[reason.as_str()])
                    .inc();
            }
        }
        if live && !matches!(message.event, PeerEvent::Heartbeat { .. }) {
            let lag_ms = wall_ms().saturating_sub(entry.added_ms);
            self.metrics.lag.observe(lag_ms as f64 / 1000.0);
        }
    }

    /// Forgets silent peers and updates the gauges.
    fn expire(&self) {
        let mut table = self.table();
        for peer in table.expire(self.clock.now_ms()) {
            self.metrics.peers_expired.inc();
            tracing::info!(
                %peer,
                "cluster: peer silent past peer_timeout_ms; its requests in flight no longer count"
            );
        }
        self.set_gauges(&table);
    }

    fn set_gauges(&self, table: &PeerTable) {
        self.metrics.peers.set(table.peer_count() as i64);
        self.metrics.peer_requests.set(table.in_flight() as i64);
    }
}

/// Starts the read and expiry tasks.
pub fn spawn(
    stream: Stream,
    applier: Applier,
    status: LinkStatus,
    expiry_period: Duration,
) -> [JoinHandle<()>; 2] {
    let expiry = {
        let applier = applier.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(expiry_period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                applier.expire();
            }
        })
    };
    let read = tokio::spawn(read_loop(stream, applier, status));
    [read, expiry]
}

async fn read_loop(stream: Stream, applier: Applier, status: LinkStatus) {
    let metrics = applier.metrics.clone();
    let mut last_id: Option<String> = None;
    let mut backoff = Backoff::default();
    loop {
        let connected = async {
            let mut connection = stream.connect_reader().await?;
            let caught_up_at = stream.server_ms(&mut connection).await?;
            let start = match &last_id {
                Some(id) => id.clone(),
                None => stream.catch_up_from(&mut connection).await?,
            };
            Ok::<_, redis::RedisError>((connection, caught_up_at, start))
        }
        .await;
        let (mut connection, caught_up_at, start) = match connected {
            Ok(made) => made,
            Err(error) => {
                metrics.errors.with_label_values(&["connect"]).inc();
                status.read_failed(&error.to_string(), &metrics);
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        backoff = Backoff::default();
        status.set_reading(true, &metrics);
        tracing::info!(from = %start, "cluster: following peers' decisions");
        let mut after = start;
        loop {
            match stream.read(&mut connection, &after).await {
                Ok(entries) => {
                    for entry in &entries {
                        applier.apply(entry, entry.added_ms > caught_up_at);
                        after.clone_from(&entry.id);
                    }
                    if let Some(entry) = entries.last() {
                        last_id = Some(entry.id.clone());
                    }
                }
                Err(error) => {
                    metrics.errors.with_label_values(&["read"]).inc();
                    status.read_failed(&error.to_string(), &metrics);
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            }
        }
    }
}
