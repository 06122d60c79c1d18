//! How a replica stops: vLLM's SIGTERM, or at once.
//!
//! vLLM 0.11's API server (`vllm/entrypoints/launcher.py`) answers SIGTERM by cancelling
//! uvicorn's serve task and awaiting `Server.shutdown()`: the listening socket is closed at
//! once (new connections are **refused**, nothing answers 503), idle keep-alive connections
//! are closed, connections with a response in flight lose keep-alive and close after that
//! response, and the server waits for them with no deadline of its own (it sets no
//! `timeout_graceful_shutdown`); the engine keeps stepping meanwhile, so streams run to their
//! end. `/health` is as unreachable as the rest. In Kubernetes the pod's
//! `terminationGracePeriodSeconds` (SIGKILL) is what cuts streams that are still running.
//! vLLM 0.18 added `--shutdown-timeout` (0, its default, aborts in-flight requests at once; N
//! waits up to N seconds). [`Drain`] mirrors both: the same refusal, and an optional
//! deadline after which the remaining connections are dropped (their requests are aborted
//! in the model, as a SIGKILL or vLLM's abort would end them).
//!
//! The accept loop lives here because draining is a property of it: a drain closes the
//! listener and asks every connection (hyper's `graceful_shutdown`) to finish its response
//! and close; a stop drops every connection.

use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::engine_driver::EngineDriver;

/// What a finished drain did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainOutcome {
    /// Requests in the engine (running or waiting) when the drain began.
    pub in_flight_at_signal: usize,
    /// Requests still in the engine when the deadline cut the connections (0 when every
    /// response finished in time).
    pub cut: usize,
}

/// A replica that was told to drain: refusing connections, finishing what it has.
/// [`Drain::finished`] waits for the end.
#[derive(Debug)]
pub struct Drain {
    pub(super) in_flight_at_signal: usize,
    pub(super) deadline: Option<Duration>,
    /// Kept so connections see the drain as a change, never as a closed channel.
    pub(super) _drain: watch::Sender<bool>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) server: JoinHandle<()>,
    pub(super) driver_task: JoinHandle<()>,
    pub(super) driver: EngineDriver,
    pub(super) kv_events: Option<crate::kv_events::KvEventPublisher>,
    pub(super) name: String,
}

impl Drain {
    /// Requests in the engine when the drain began.
    pub fn in_flight_at_signal(&self) -> usize {
        self.in_flight_at_signal
    }

    /// Waits until every connection has closed (or the deadline passed and the rest were
    /// dropped), then stops the engine.
    pub async fn finished(mut self) -> DrainOutcome {
        let mut cut = 0;
        let ended = match self.deadline {
            None => {
                let _ = (&mut self.server).await;
                true
            }
            Some(deadline) => tokio::time::timeout(deadline, &mut self.server)
                .await
                .is_ok(),
        };
        if !ended {
            cut = in_engine(&self.driver);
            tracing::warn!(
                replica = %self.name,
                cut,
                "shutdown timeout reached: dropping the connections still open"
            );
        }
        let _ = self.stop.send(true);
        if !ended {
            let _ = (&mut self.server).await;
        }
        let _ = (&mut self.driver_task).await;
        if let Some(publisher) = self.kv_events.take() {
            publisher.join().await;
        }
        tracing::info!(replica = %self.name, cut, "drained and stopped");
        DrainOutcome {
            in_flight_at_signal: self.in_flight_at_signal,
            cut,
        }
    }
}

/// Requests the engine holds (running or waiting).
pub(super) fn in_engine(driver: &EngineDriver) -> usize {
    driver.inspect(|model| model.num_running() + model.num_waiting())
}

/// Accepts connections until told to drain or stop.
///
/// Connections live in a `JoinSet` rather than detached tasks so that a stop can end them
/// all: a hung or streaming request must not outlive its replica. On a drain the listener is
/// closed first (so new connections are refused, as vLLM's are), then the loop waits for
/// the open connections to finish; a stop during that wait drops them.
pub(super) async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    mut drain: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => {
                connections.shutdown().await;
                return;
            }
            _ = drain.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // Tokens are tiny writes; Nagle would batch them and distort TTFT/ITL.
                    let _ = stream.set_nodelay(true);
                    let service = TowerToHyperService::new(app.clone());
                    connections.spawn(serve_connection(stream, service, drain.clone()));
                }
                Err(e) => {
                    // Out of descriptors or similar: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => {
                connections.shutdown().await;
                return;
            }
            next = connections.join_next() => if next.is_none() {
                return;
            },
        }
    }
}

/// One HTTP/1 connection; on a drain, the response in flight finishes and the connection
/// closes (an idle one closes at once).
async fn serve_connection(
    stream: tokio::net::TcpStream,
    service: TowerToHyperService<axum::Router>,
    mut drain: watch::Receiver<bool>,
) {
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut draining = *drain.borrow();
    if draining {
        connection.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            changed = drain.changed(), if !draining => {
                draining = true;
                if changed.is_ok() {
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
