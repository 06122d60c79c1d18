//! Drives one [`EngineModel`] in scaled real time and hands each generated token to the
//! stream of the request that produced it.
//!
//! The model is pure; this is the only place it meets a clock. One driver task per replica
//! owns the loop: advance the model to "now" (engine time = wall time since start × the time
//! scale, read from `tokio::time` so tests can pause it), deliver the tokens, then sleep until
//! the model's next wakeup or until a new submission or abort wakes it. The model sits behind a
//! mutex that is held only for those short, non-blocking sections.
//!
//! Each request gets a bounded channel sized to hold all of its tokens, so delivery never
//! blocks the driver and a slow client buffers at most `max_tokens` tokens. Its
//! [`Submission`] carries an [`AbortOnDrop`] guard: whoever drops the request before its last
//! token (a client that disconnected, a server shutting down, an injected abort) aborts it in
//! the model, which frees its blocks and counts `finished_reason="abort"`.
//!
//! With KV events on, the driver takes the model's event batches after every advance and
//! pushes them into the publisher's [`BatchQueue`], which never blocks (it drops the oldest
//! batch when full), so a slow or stuck publisher cannot stall the step loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::kv_events::BatchQueue;
use crate::model::{AdmissionError, EngineModel, EngineRequest, RequestId, Seconds, TokenOutput};

/// Engine time on a wall clock: `(now − origin) × time_scale`.
#[derive(Debug, Clone, Copy)]
pub struct EngineClock {
    origin: Instant,
    time_scale: f64,
}

/// The longest sleep the driver takes in one go; also what "a very long time" means when a
/// scaled duration does not fit a `Duration`.
const MAX_SLEEP: Duration = Duration::from_secs(3600);

impl EngineClock {
    /// A clock whose engine time 0 is now. `time_scale` must be finite and > 0 (checked by
    /// the caller, which owns the error message).
    pub fn start(time_scale: f64) -> Self {
        EngineClock {
            origin: Instant::now(),
            time_scale,
        }
    }

    /// Engine seconds since start.
    pub fn now(&self) -> Seconds {
        self.origin.elapsed().as_secs_f64() * self.time_scale
    }

    /// The wall duration of `engine` seconds (clamped to [0, one hour]).
    pub fn wall(&self, engine: Seconds) -> Duration {
        let secs = engine / self.time_scale;
        if secs.is_nan() || secs <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(secs)
            .unwrap_or(MAX_SLEEP)
            .min(MAX_SLEEP)
    }

    /// The wall instant at which engine time reaches `at`.
    pub fn deadline(&self, at: Seconds) -> Instant {
        let secs = at / self.time_scale;
        if secs.is_nan() || secs <= 0.0 {
            return self.origin;
        }
        let offset = Duration::try_from_secs_f64(secs).unwrap_or(MAX_SLEEP);
        self.origin
            .checked_add(offset)
            .unwrap_or_else(|| Instant::now() + MAX_SLEEP)
    }
}

/// The model plus the streams waiting for its tokens.
struct DriverState {
    model: EngineModel,
    streams: HashMap<RequestId, mpsc::Sender<TokenOutput>>,
    /// Engine time never goes backwards, even when a timer fires a hair before the clock
    /// reads its deadline (float rounding), which would otherwise spin the loop.
    floor: Seconds,
}

struct DriverShared {
    state: Mutex<DriverState>,
    wake: Notify,
    clock: EngineClock,
    /// False once the driver loop has ended (shutdown, or a panic in the model): nothing
    /// would advance a new request, so it must be refused rather than left hanging.
    running: AtomicBool,
    /// Where KV event batches go, when events are published.
    kv_queue: Option<Arc<BatchQueue>>,
}

/// Why a request could not be submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The model refused it (vLLM's 400 messages).
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    /// The driver is not running (vLLM's dead engine).
    #[error("The engine is not running.")]
    Stopped,
}

/// Ends every open stream when the driver loop ends, however it ends: dropping the senders
/// makes each waiting response finish (with a dropped connection) instead of hanging.
struct CloseStreamsOnExit(Arc<DriverShared>);

impl Drop for CloseStreamsOnExit {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        let mut state = self.0.lock();
        let now = self.0.now(&mut state);
        let ids: Vec<RequestId> = state.streams.drain().map(|(id, _)| id).collect();
        for id in ids {
            state.model.abort(id, now);
        }
    }
}

impl DriverShared {
    fn lock(&self) -> MutexGuard<'_, DriverState> {
        // A panic while holding the lock leaves the model as it was between two calls, which
        // is still consistent; keep serving rather than poison every later request.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands the model's KV event batches to the publisher (nothing when events are off).
    fn publish(&self, model: &mut EngineModel) {
        if let Some(queue) = &self.kv_queue {
            queue.push(model.take_kv_event_batches());
        }
    }

    fn now(&self, state: &mut DriverState) -> Seconds {
        state.floor = state.floor.max(self.clock.now());
        state.floor
    }
}

/// A cheap handle on a running driver.
#[derive(Clone)]
pub struct EngineDriver {
    shared: Arc<DriverShared>,
}

impl std::fmt::Debug for EngineDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineDriver").finish_non_exhaustive()
    }
}

/// A request admitted to the model: its tokens arrive on `tokens`, in order; the last one
/// has `finish` set. Dropping it before then aborts the request.
#[derive(Debug)]
pub struct Submission {
    pub id: RequestId,
    pub tokens: mpsc::Receiver<TokenOutput>,
    pub guard: AbortOnDrop,
}

/// Aborts its request in the model when dropped, unless [`AbortOnDrop::finished`] was called.
#[derive(Debug)]
pub struct AbortOnDrop {
    id: RequestId,
    driver: EngineDriver,
    finished: bool,
}

impl AbortOnDrop {
    /// The request's last token was delivered: nothing to abort.
    pub fn finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.driver.abort(self.id);
        }
    }
}

impl EngineDriver {
    /// Starts the driver task for `model`. It stops when `shutdown` changes or its sender
    /// is dropped.
    pub fn start(
        model: EngineModel,
        clock: EngineClock,
        shutdown: watch::Receiver<bool>,
    ) -> (EngineDriver, JoinHandle<()>) {
        Self::start_publishing(model, clock, shutdown, None)
    }

    /// As [`EngineDriver::start`], pushing the model's KV event batches into `kv_queue`
    /// (the model must have events enabled for there to be any).
    pub fn start_publishing(
        model: EngineModel,
        clock: EngineClock,
        shutdown: watch::Receiver<bool>,
        kv_queue: Option<Arc<BatchQueue>>,
    ) -> (EngineDriver, JoinHandle<()>) {
        let shared = Arc::new(DriverShared {
            state: Mutex::new(DriverState {
                model,
                streams: HashMap::new(),
                floor: 0.0,
            }),
            wake: Notify::new(),
            clock,
            running: AtomicBool::new(true),
            kv_queue,
        });
        let task = tokio::spawn(drive(Arc::clone(&shared), shutdown));
        (EngineDriver { shared }, task)
    }

    /// The clock this driver runs on.
    pub fn clock(&self) -> EngineClock {
        self.shared.clock
    }

    /// Admits a request at the current engine time.
    pub fn submit(&self, request: EngineRequest) -> Result<Submission, SubmitError> {
        // Room for every token the request can produce, so the driver never waits on a
        // client; the channel allocates lazily, so a large bound costs nothing up front.
        let capacity = usize::try_from(request.max_tokens)
            .unwrap_or(usize::MAX)
            .clamp(1, usize::MAX >> 4);
        let (sender, tokens) = mpsc::channel(capacity);
        let id = {
            let mut state = self.shared.lock();
            if !self.is_running() {
                return Err(SubmitError::Stopped);
            }
            let now = self.shared.now(&mut state);
            let id = state.model.submit(request, now)?;
            state.streams.insert(id, sender);
            id
        };
        self.shared.wake.notify_one();
        Ok(Submission {
            id,
            tokens,
            guard: AbortOnDrop {
                id,
                driver: self.clone(),
                finished: false,
            },
        })
    }

    /// Aborts a request (no-op when it already finished).
    pub fn abort(&self, id: RequestId) {
        {
            let mut state = self.shared.lock();
            let now = self.shared.now(&mut state);
            state.streams.remove(&id);
            state.model.abort(id, now);
        }
        self.shared.wake.notify_one();
    }

    /// vLLM's `reset_prefix_cache`: `false` while any request holds blocks. The
    /// `AllBlocksCleared` batch goes to the publisher at once.
    pub fn reset_prefix_cache(&self) -> bool {
        let mut state = self.shared.lock();
        let now = self.shared.now(&mut state);
        let reset = state.model.reset_prefix_cache(now);
        self.shared.publish(&mut state.model);
        reset
    }

    /// Reads the model (for `/metrics`) as of the driver's last step: the driver advances
    /// it on every step boundary, so gauges are never more than one step old.
    pub fn inspect<R>(&self, read: impl FnOnce(&EngineModel) -> R) -> R {
        let state = self.shared.lock();
        read(&state.model)
    }

    /// False once the driver loop has ended.
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// Engine time now.
    pub fn now(&self) -> Seconds {
        self.shared.clock.now()
    }
}

/// The driver loop: advance, deliver, sleep until the next thing to do.
async fn drive(shared: Arc<DriverShared>, mut shutdown: watch::Receiver<bool>) {
    let _close = CloseStreamsOnExit(Arc::clone(&shared));
    loop {
        let next = {
            let mut state = shared.lock();
            let now = shared.now(&mut state);
            let outputs = state.model.advance(now);
            shared.publish(&mut state.model);
            let gone = deliver(&mut state.streams, outputs);
            for id in gone {
                state.model.abort(id, now);
            }
            state.model.next_wakeup()
        };
        let deadline = match next {
            Some(at) => shared.clock.deadline(at),
            None => Instant::now() + MAX_SLEEP,
        };
        tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            () = shared.wake.notified() => {}
            () = tokio::time::sleep_until(deadline) => {
                if let Some(at) = next {
                    let mut state = shared.lock();
                    state.floor = state.floor.max(at);
                }
            }
        }
    }
}

/// Hands each token to its stream; returns the requests whose client is gone.
fn deliver(
    streams: &mut HashMap<RequestId, mpsc::Sender<TokenOutput>>,
    outputs: Vec<TokenOutput>,
) -> Vec<RequestId> {
    let mut gone = Vec::new();
    for output in outputs {
        let id = output.id;
        let last = output.finish.is_some();
        let Some(sender) = streams.get(&id) else {
            continue;
        };
        // Full cannot happen (the channel holds max_tokens); Closed means the client left.
        if sender.try_send(output).is_err() {
            streams.remove(&id);
            gone.push(id);
        } else if last {
            streams.remove(&id);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EngineProfile, FinishReason};

    fn model(step: Seconds) -> EngineModel {
        let mut profile = EngineProfile::builtin("fast").unwrap();
        profile.t0 = step;
        EngineModel::new(profile)
    }

    fn request(max_tokens: u32) -> EngineRequest {
        EngineRequest {
            prompt: (0..40).collect(),
            max_tokens,
            ignore_eos: true,
        }
    }

    #[tokio::test]
    async fn tokens_arrive_in_order_stamped_in_engine_time() {
        let (_stop, stopped) = watch::channel(false);
        // 10 ms engine steps at ×100: 0.1 ms of wall time each.
        let (driver, _task) = EngineDriver::start(model(0.01), EngineClock::start(100.0), stopped);
        let mut submission = driver.submit(request(5)).unwrap();
        let mut last_at = 0.0;
        for index in 0..5 {
            let token = submission.tokens.recv().await.unwrap();
            assert_eq!(token.index, index);
            assert!(token.at > last_at, "{} after {last_at}", token.at);
            last_at = token.at;
            assert_eq!(token.finish.is_some(), index == 4);
        }
        submission.guard.finished();
        assert!(last_at >= 0.05 - 1e-9, "five 10 ms steps: {last_at}");
        assert!(driver.now() >= last_at, "tokens are never delivered early");
        assert_eq!(driver.inspect(|m| m.metrics().request_success.length), 1);
    }

    #[tokio::test]
    async fn dropping_a_submission_aborts_it() {
        let (_stop, stopped) = watch::channel(false);
        let (driver, _task) = EngineDriver::start(model(1.0), EngineClock::start(1.0), stopped);
        let submission = driver.submit(request(1000)).unwrap();
        drop(submission);
        let (aborted, running, waiting) = driver.inspect(|m| {
            (
                m.metrics().request_success.get(FinishReason::Abort),
                m.num_running(),
                m.num_waiting(),
            )
        });
        assert_eq!((aborted, running, waiting), (1, 0, 0));
    }

    #[tokio::test]
    async fn a_stopped_driver_ends_streams_and_refuses_requests() {
        let (stop, stopped) = watch::channel(false);
        let (driver, task) = EngineDriver::start(model(1.0), EngineClock::start(1.0), stopped);
        let mut submission = driver.submit(request(1000)).unwrap();
        stop.send(true).unwrap();
        task.await.unwrap();
        assert!(!driver.is_running());
        // At most the tokens produced before the stop, then the end of the stream.
        let mut received = 0;
        while submission.tokens.recv().await.is_some() {
            received += 1;
            assert!(received < 1000);
        }
        assert!(matches!(
            driver.submit(request(1)),
            Err(SubmitError::Stopped)
        ));
        assert_eq!(
            driver.inspect(|m| m.metrics().request_success.get(FinishReason::Abort)),
            1
        );
    }

    #[test]
    fn the_clock_scales_and_clamps() {
        let clock = EngineClock::start(10.0);
        assert_eq!(clock.wall(1.0), Duration::from_millis(100));
        assert_eq!(clock.wall(-1.0), Duration::ZERO);
        assert_eq!(clock.wall(f64::NAN), Duration::ZERO);
        assert_eq!(clock.wall(f64::INFINITY), MAX_SLEEP);
        assert!(clock.deadline(1e300) > clock.deadline(1.0));
    }
}
