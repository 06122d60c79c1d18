//! The gateway's clock: milliseconds since start on tokio's clock, the time base of the
//! router's prefix index and of every time the router learns or judges (time to first token,
//! the TTFT SLO, the slow-replica rules, family windows). A leaf module, so every part that
//! ages or stamps index entries (the request path, KV sync, the index sweep) shares one
//! clock without sharing the app.
//!
//! It runs at the replicas' time scale (`replica_time_scale`): simulated replicas may run
//! faster than wall time (`mock-engine --time-scale N`), and a router reading wall time in
//! front of them would judge a 4 s first token as 0.4 s, so every time rule would act N
//! times too late (on the unequal fleet's cold phases at scale 10 the slow-replica rule never
//! acted: 7, 13 and 5 good requests against 46 at scale 1).

use tokio::time::Instant;

/// Milliseconds since the gateway started, on tokio's clock (pausable in tests) times the
/// replicas' time scale; the router's index ages blocks by it.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    /// Replica time per wall time (1 for real engines).
    scale: f64,
}

impl Clock {
    /// A clock at wall time.
    pub fn new() -> Self {
        Clock::scaled(1.0)
    }

    /// A clock that runs `scale` times faster than wall time (finite and > 0: the
    /// configuration checks `replica_time_scale`).
    pub fn scaled(scale: f64) -> Self {
        Clock {
            start: Instant::now(),
            scale,
        }
    }

    pub fn now_ms(&self) -> router_core::Millis {
        let elapsed = self.start.elapsed();
        if self.scale == 1.0 {
            return u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        }
        // A float-to-integer `as` saturates, so a clock past u64::MAX ms reads u64::MAX.
        (elapsed.as_secs_f64() * 1000.0 * self.scale) as u64
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_scaled_clock_reads_replica_time() {
        let (wall, fast) = (Clock::new(), Clock::scaled(10.0));
        tokio::time::advance(Duration::from_millis(400)).await;
        assert_eq!(wall.now_ms(), 400);
        assert_eq!(fast.now_ms(), 4000, "a 4 s first token of a 10x replica");
    }
}
