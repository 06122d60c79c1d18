//! The state of the two links to the server (publish, read): the `connected` gauge, one log
//! line per change (not one per failed attempt), and the reconnect backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::metrics::ClusterMetrics;

/// First reconnect delay; it doubles per failure up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(250);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Reconnect delays: 250 ms doubling to 5 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: INITIAL_BACKOFF,
        }
    }
}

impl Backoff {
    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        delay
    }
}

/// Whether each link is up, shared by the publish and read tasks.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    inner: Arc<Flags>,
    server: Arc<str>,
}

#[derive(Debug)]
struct Flags {
    publishing: AtomicBool,
    reading: AtomicBool,
    /// Whether a failure has been logged since the last success (so a long outage logs once).
    publish_warned: AtomicBool,
    read_warned: AtomicBool,
}

impl LinkStatus {
    /// Both links down; `server` (without its password) names the server in the log.
    pub fn new(server: &str) -> Self {
        LinkStatus {
            inner: Arc::new(Flags {
                publishing: AtomicBool::new(false),
                reading: AtomicBool::new(false),
                publish_warned: AtomicBool::new(false),
                read_warned: AtomicBool::new(false),
            }),
            server: server.into(),
        }
    }

    /// Both links are up.
    pub fn connected(&self) -> bool {
        self.inner.publishing.load(Ordering::Acquire) && self.inner.reading.load(Ordering::Acquire)
    }

    pub fn set_publishing(&self, up: bool, metrics: &ClusterMetrics) {
        if up && !self.inner.publishing.swap(true, Ordering::AcqRel) {
            self.inner.publish_warned.store(false, Ordering::Release);
            tracing::info!(server = %self.server, "cluster: publishing");
        }
        if !up {
            self.inner.publishing.store(false, Ordering::Release);
        }
        self.update(metrics);
    }

    pub fn set_reading(&self, up: bool, metrics: &ClusterMetrics) {
        if up && !self.inner.reading.swap(true, Ordering::AcqRel) {
            self.inner.read_warned.store(false, Ordering::Release);
        }
        if !up {
            self.inner.reading.store(false, Ordering::Release);
        }
        self.update(metrics);
    }

    /// The publish link failed (a connect or a write): logged once per outage.
    pub fn publish_failed(&self, error: &str, metrics: &ClusterMetrics) {
        self.set_publishing(false, metrics);
        if !self.inner.publish_warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                server = %self.server,
                %error,
                "cluster: cannot publish; routing on this gateway's own view, messages dropped until the server is back"
            );
        }
    }

    /// The read link failed: logged once per outage.
    pub fn read_failed(&self, error: &str, metrics: &ClusterMetrics) {
        self.set_reading(false, metrics);
        if !self.inner.read_warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                server = %self.server,
                %error,
                "cluster: cannot read peers' messages; their load expires after peer_timeout_ms and this gateway routes on its own view"
            );
        }
    }

    fn update(&self, metrics: &ClusterMetrics) {
        metrics.connected.set(i64::from(self.connected()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap() {
        let mut backoff = Backoff::default();
        let delays: Vec<u128> = (0..7).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 4000, 5000, 5000]);
    }

    #[test]
    fn connected_needs_both_links() {
        let metrics = ClusterMetrics::register(&prometheus::Registry::new()).unwrap();
        let status = LinkStatus::new("redis://x:6379");
        status.set_publishing(true, &metrics);
        assert_eq!(metrics.connected.get(), 0);
        status.set_reading(true, &metrics);
        assert_eq!(metrics.connected.get(), 1);
        status.read_failed("gone", &metrics);
        assert_eq!(metrics.connected.get(), 0);
        assert!(!status.connected());
    }
}
