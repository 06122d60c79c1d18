//! Counts of the live phase in progress, shared between the request tasks that update them and
//! the status line that shows them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts of the phase in progress, updated as requests go out and finish, for a progress
/// display (`loadgen matrix` on a terminal).
#[derive(Debug, Default)]
pub struct PhaseProgress {
    phase: Mutex<String>,
    pub planned: AtomicUsize,
    pub sent: AtomicUsize,
    pub done: AtomicUsize,
    pub good: AtomicUsize,
}

impl PhaseProgress {
    pub(crate) fn start(&self, phase: &str, planned: usize) {
        if let Ok(mut name) = self.phase.lock() {
            phase.clone_into(&mut name);
        }
        self.planned.store(planned, Ordering::Relaxed);
        for counter in [&self.sent, &self.done, &self.good] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// One line: phase, requests sent and done, in flight, good so far.
    pub fn line(&self) -> String {
        let name = self.phase.lock().map(|n| n.clone()).unwrap_or_default();
        let sent = self.sent.load(Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        format!(
            "{name}: sent {sent}/{}, done {done}, in flight {}, good {}",
            self.planned.load(Ordering::Relaxed),
            sent.saturating_sub(done),
            self.good.load(Ordering::Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_shows_in_flight_and_resets_per_phase() {
        let p = PhaseProgress::default();
        p.start("r1-x", 96);
        p.sent.store(10, Ordering::Relaxed);
        p.done.store(7, Ordering::Relaxed);
        p.good.store(5, Ordering::Relaxed);
        assert_eq!(p.line(), "r1-x: sent 10/96, done 7, in flight 3, good 5");
        p.start("r1-y", 8);
        assert_eq!(p.line(), "r1-y: sent 0/8, done 0, in flight 0, good 0");
    }
}
