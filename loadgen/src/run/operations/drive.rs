//! The two ways an operations phase sends load, independent of what a request is: open loop
//! (send at scheduled arrival times, dropping arrivals over an in-flight cap) and closed loop
//! (`concurrency` senders, each sending its next request when its last one ends, until a
//! deadline). The runner passes a `send` function; tests pass one that only takes time.
//!
//! The cap counts requests this client has in flight: an arrival that finds the cap full is
//! dropped and counted, never queued, so a backlog shows as `dropped_arrivals` rather than as
//! client-side waiting hidden in TTFT. Times are engine seconds on the [`PhaseClock`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::measure::RequestRecord;
use crate::run::live::request::PhaseClock;
use crate::workload::operations::MAX_PHASE_REQUESTS;

/// Admits arrivals while fewer than `cap` are in flight (any number with cap 0).
#[derive(Debug, Clone)]
pub struct ArrivalGate {
    slots: Option<Arc<Semaphore>>,
}

/// An admitted arrival's place under the cap; dropping it frees the place.
#[derive(Debug)]
pub struct GatePass {
    _permit: Option<OwnedSemaphorePermit>,
}

impl ArrivalGate {
    pub fn new(cap: usize) -> Self {
        ArrivalGate {
            slots: (cap > 0).then(|| Arc::new(Semaphore::new(cap))),
        }
    }

    /// A pass when there is room; `None` means the arrival is dropped.
    pub fn try_enter(&self) -> Option<GatePass> {
        match &self.slots {
            None => Some(GatePass { _permit: None }),
            Some(slots) => Arc::clone(slots)
                .try_acquire_owned()
                .ok()
                .map(|p| GatePass { _permit: Some(p) }),
        }
    }
}

/// What a driver sent: one record per request sent, and the arrivals it dropped.
#[derive(Debug, Default)]
pub struct Driven {
    pub records: Vec<RequestRecord>,
    pub dropped: usize,
}

/// Sends arrival `i` at `arrivals[i]` (each in its own task, so a slow stream never delays the
/// next send) unless the gate is full. `send(i, at)` makes the request's future.
pub async fn open_loop<F, Fut>(
    arrivals: &[f64],
    inflight_cap: usize,
    clock: PhaseClock,
    send: F,
) -> Driven
where
    F: Fn(usize, f64) -> Fut,
    Fut: Future<Output = RequestRecord> + Send + 'static,
{
    let gate = ArrivalGate::new(inflight_cap);
    let mut tasks = JoinSet::new();
    let mut dropped = 0;
    for (i, &at) in arrivals.iter().enumerate() {
        tokio::time::sleep_until(clock.instant(at)).await;
        let Some(pass) = gate.try_enter() else {
            dropped += 1;
            continue;
        };
        let request = send(i, at);
        tasks.spawn(async move {
            let record = request.await;
            drop(pass);
            record
        });
    }
    let mut records = Vec::new();
    while let Some(done) = tasks.join_next().await {
        // A panicked task is a bug in this crate; its request counts as lost.
        if let Ok(record) = done {
            records.push(record);
        }
    }
    records.sort_by_key(|r| r.index);
    Driven { records, dropped }
}

/// `concurrency` senders; each starts requests (numbered in start order) one after another
/// while the clock is before `duration`. `send(i, at)` makes request `i`'s future.
pub async fn closed_loop<F, Fut>(
    concurrency: usize,
    duration: f64,
    clock: PhaseClock,
    send: F,
) -> Driven
where
    F: Fn(usize, f64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = RequestRecord> + Send + 'static,
{
    let send = Arc::new(send);
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = JoinSet::new();
    for _ in 0..concurrency {
        let (send, next) = (Arc::clone(&send), Arc::clone(&next));
        senders.spawn(async move {
            let mut mine = Vec::new();
            // Bounded in count as well as by the deadline.
            while next.load(Ordering::Relaxed) < MAX_PHASE_REQUESTS {
                let at = clock.now();
                if at >= duration {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                mine.push(send(i, at).await);
            }
            mine
        });
    }
    let mut records = Vec::new();
    while let Some(done) = senders.join_next().await {
        if let Ok(mine) = done {
            records.extend(mine);
        }
    }
    records.sort_by_key(|r| r.index);
    Driven {
        records,
        dropped: 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A request that takes `service` engine seconds (scale 1), counting how many are in
    /// flight at once.
    fn fake_send(
        clock: PhaseClock,
        service: f64,
        in_flight: Arc<AtomicUsize>,
        peak: Arc<AtomicUsize>,
    ) -> impl Fn(usize, f64) -> std::pin::Pin<Box<dyn Future<Output = RequestRecord> + Send>>
    + Send
    + Sync
    + 'static {
        move |i, at| {
            let (in_flight, peak) = (Arc::clone(&in_flight), Arc::clone(&peak));
            Box::pin(async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let mut record = RequestRecord::sent(i, 0, at, clock.now());
                tokio::time::sleep(Duration::from_secs_f64(service)).await;
                record.stream_end = Some(clock.now());
                in_flight.fetch_sub(1, Ordering::SeqCst);
                record
            })
        }
    }

    fn paused_clock() -> PhaseClock {
        PhaseClock {
            origin: tokio::time::Instant::now(),
            scale: 1.0,
        }
    }

    #[test]
    fn the_gate_admits_up_to_its_cap_and_frees_a_place_on_release() {
        let gate = ArrivalGate::new(2);
        let a = gate.try_enter().expect("first");
        let _b = gate.try_enter().expect("second");
        assert!(gate.try_enter().is_none());
        drop(a);
        assert!(gate.try_enter().is_some());
        let open = ArrivalGate::new(0);
        let passes: Vec<_> = (0..1000).filter_map(|_| open.try_enter()).collect();
        assert_eq!(passes.len(), 1000);
    }

    /// Arrivals every second, each taking 3.5 s, at most 2 in flight: 0 and 1 go, 2 and 3
    /// find both places taken, 4 and 5 go once 0 and 1 have ended, and so on.
    #[tokio::test(start_paused = true)]
    async fn arrivals_over_the_cap_are_dropped_not_queued() {
        let clock = paused_clock();
        let (in_flight, peak) = (Arc::default(), Arc::default());
        let arrivals: Vec<f64> = (0..10).map(f64::from).collect();
        let send = fake_send(clock, 3.5, in_flight, Arc::clone(&peak));
        let driven = open_loop(&arrivals, 2, clock, send).await;
        let sent: Vec<usize> = driven.records.iter().map(|r| r.index).collect();
        assert_eq!(sent, vec![0, 1, 4, 5, 8, 9]);
        assert_eq!(driven.dropped, 4);
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        // Sent at their scheduled times: nothing waited for a place.
        for r in &driven.records {
            assert!((r.dispatched - r.scheduled).abs() < 1e-6, "{r:?}");
        }
        // Without a cap every arrival is sent.
        let (in_flight, peak) = (Arc::default(), Arc::default());
        let send = fake_send(paused_clock(), 3.5, in_flight, Arc::clone(&peak));
        let all = open_loop(&arrivals, 0, paused_clock(), send).await;
        assert_eq!((all.records.len(), all.dropped), (10, 0));
        assert_eq!(peak.load(Ordering::SeqCst), 4);
    }

    /// 3 senders, 4 s requests, 10 s: each starts at 0, 4 and 8, none at 12.
    #[tokio::test(start_paused = true)]
    async fn closed_loop_keeps_concurrency_busy_until_the_deadline() {
        let clock = paused_clock();
        let (in_flight, peak) = (Arc::default(), Arc::default());
        let send = fake_send(clock, 4.0, Arc::clone(&in_flight), Arc::clone(&peak));
        let driven = closed_loop(3, 10.0, clock, send).await;
        let indices: Vec<usize> = driven.records.iter().map(|r| r.index).collect();
        assert_eq!(indices, (0..9).collect::<Vec<_>>());
        assert_eq!(driven.dropped, 0);
        assert_eq!(peak.load(Ordering::SeqCst), 3);
        assert_eq!(in_flight.load(Ordering::SeqCst), 0);
        let mut starts: Vec<f64> = driven.records.iter().map(|r| r.scheduled).collect();
        starts.sort_by(f64::total_cmp);
        for (k, s) in starts.iter().enumerate() {
            assert!((s - (k / 3) as f64 * 4.0).abs() < 1e-6, "{starts:?}");
        }
        let end = driven
            .records
            .iter()
            .filter_map(|r| r.stream_end)
            .fold(0.0, f64::max);
        assert!((end - 12.0).abs() < 1e-6, "{end}");
    }
}
