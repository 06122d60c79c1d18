//! The gateway's clock: milliseconds since start on tokio's clock, the time base of the
//! router's prefix index. A leaf module, so every part that ages or stamps index entries
//! (the request path, KV sync, the index sweep) shares one clock without sharing the app.

use tokio::time::Instant;

/// Milliseconds since the gateway started, on tokio's clock (pausable in tests); the
/// router's index ages blocks by it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    pub fn now_ms(&self) -> router_core::Millis {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
