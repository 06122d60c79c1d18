//! The hand-off from the engine's step loop to the publisher task: a bounded queue that
//! never blocks the producer. When it is full the **oldest** batch is dropped and counted,
//! so a stalled publisher costs subscribers old events (which a replay could not have served
//! either) rather than stalling the engine. Sequence numbers are given at publication, so
//! dropped batches leave no gap in `seq` (as in vLLM, whose publisher numbers what it sends).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use crate::model::KvEventBatch;

/// A bounded multi-producer queue of batches with drop-oldest overflow.
#[derive(Debug)]
pub struct BatchQueue {
    batches: Mutex<VecDeque<KvEventBatch>>,
    capacity: usize,
    ready: Notify,
    dropped: AtomicU64,
}

impl BatchQueue {
    /// A queue holding at most `capacity` batches (at least 1).
    pub fn new(capacity: usize) -> BatchQueue {
        BatchQueue {
            batches: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            ready: Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Appends `batches` in order, dropping the oldest queued ones beyond the capacity.
    /// Never waits beyond a short lock.
    pub fn push(&self, batches: Vec<KvEventBatch>) {
        if batches.is_empty() {
            return;
        }
        let mut dropped = 0u64;
        {
            let mut queue = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
            for batch in batches {
                if queue.len() == self.capacity {
                    queue.pop_front();
                    dropped += 1;
                }
                queue.push_back(batch);
            }
        }
        if dropped > 0 {
            let total = self.dropped.fetch_add(dropped, Ordering::Relaxed) + dropped;
            // Once each time the total passes a power of two: visible, not flooding.
            let before = total - dropped;
            if before == 0 || before.ilog2() != total.ilog2() {
                tracing::warn!(
                    dropped = total,
                    "KV event queue full: dropped the oldest batches"
                );
            }
        }
        self.ready.notify_one();
    }

    /// Takes everything queued, oldest first.
    pub fn drain(&self) -> VecDeque<KvEventBatch> {
        std::mem::take(&mut *self.batches.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits until a push happened since the last wait returned (a push before the wait
    /// began counts: the wake-up is stored).
    pub async fn pushed(&self) {
        self.ready.notified().await;
    }

    /// Batches dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::KvEvent;

    fn batch(ts: f64) -> KvEventBatch {
        KvEventBatch {
            ts,
            events: vec![KvEvent::AllBlocksCleared],
        }
    }

    #[test]
    fn overflow_drops_the_oldest_and_counts() {
        let queue = BatchQueue::new(2);
        queue.push(vec![batch(1.0), batch(2.0)]);
        queue.push(vec![batch(3.0)]);
        assert_eq!(queue.dropped(), 1);
        let kept: Vec<f64> = queue.drain().iter().map(|b| b.ts).collect();
        assert_eq!(kept, [2.0, 3.0]);
        assert!(queue.drain().is_empty());
        queue.push(vec![batch(4.0), batch(5.0), batch(6.0), batch(7.0)]);
        assert_eq!(queue.dropped(), 3);
        let kept: Vec<f64> = queue.drain().iter().map(|b| b.ts).collect();
        assert_eq!(kept, [6.0, 7.0]);
    }

    #[tokio::test]
    async fn a_push_before_the_wait_still_wakes_it() {
        let queue = BatchQueue::new(4);
        queue.push(vec![batch(1.0)]);
        tokio::time::timeout(std::time::Duration::from_secs(10), queue.pushed())
            .await
            .expect("the stored wake-up is taken at once");
        assert_eq!(queue.drain().len(), 1);
    }
}
