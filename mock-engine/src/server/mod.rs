//! The engine's HTTP server: vLLM 0.11's OpenAI surface and `/metrics` over one
//! [`EngineModel`](crate::model::EngineModel) per replica, driven in scaled real time.
//!
//! [`spawn_replica`] is the whole public API: it binds a listener (port 0 allowed), starts
//! the engine driver and an accept loop on the current tokio runtime, and returns a
//! [`ReplicaHandle`]. [`spawn_replica_with_events`] does the same and also publishes the
//! engine's KV-cache events over ZMQ as vLLM's `--kv-events-config` asks
//! ([`crate::kv_events`]). The gateway's `--mock-engines N`, loadgen's `--local`, the
//! `mock-engine` binary and end-to-end tests all start replicas this way, several per
//! process if they like.
//!
//! Inside, one file per concern: [`routes`] (the router and small endpoints), `generation`
//! (the two completion endpoints), `request` (body parsing), `chat`/`completions`/`envelope`/
//! `single_choice` (response shapes), `sse` (bodies), `engine_driver` (the model in real time),
//! `metrics_text` (Prometheus), [`failures`] (injection), `api_error` (vLLM's error shape) and
//! `drain` (the accept loop and vLLM's SIGTERM: [`ReplicaHandle::drain`]).

mod api_error;
mod chat;
mod completions;
mod drain;
mod engine_driver;
mod envelope;
pub mod failures;
mod generation;
mod metrics_text;
mod replica;
mod request;
pub mod routes;
mod single_choice;
mod sse;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use drain::{Drain, DrainOutcome};
pub use failures::{FAIL_HEADER, FailurePlan, FailureSpec, FailureSpecError};

use crate::kv_events::{KvEventPublisher, KvEventsConfig, PublisherError};
use crate::model::{EngineModel, EngineProfile};
use engine_driver::{EngineClock, EngineDriver};
use replica::Replica;

/// Everything one replica needs.
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    /// Replica name, e.g. `mock-0` (logs; the gateway names pods by it).
    pub name: String,
    /// Where to listen; port 0 picks a free port (see [`ReplicaHandle::addr`]).
    pub listen: SocketAddr,
    /// The served model name; requests for any other get vLLM's 404.
    pub model: String,
    pub profile: EngineProfile,
    /// Engine time = wall time × `time_scale` (finite, > 0).
    pub time_scale: f64,
    /// Injected failures; `Default` injects none.
    pub failures: FailurePlan,
}

/// Why a replica could not start.
#[derive(Debug, Error)]
pub enum ServerError {
    #[error("replica `{name}`: cannot listen on {addr}: {source}")]
    Bind {
        name: String,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("replica `{name}`: time scale must be a finite number > 0, got {value}")]
    TimeScale { name: String, value: f64 },
    #[error("replica `{name}`: failure rate must be within 0..=1, got {value}")]
    FailureRate { name: String, value: f64 },
    #[error("replica `{name}`: health failure period must be finite and >= 0, got {value}")]
    HealthFailFor { name: String, value: f64 },
    #[error("replica `{name}`: {source}")]
    KvEvents {
        name: String,
        #[source]
        source: PublisherError,
    },
}

/// A running replica. Dropping it stops the replica too (as [`ReplicaHandle::shutdown`]
/// does, without waiting); keep it for as long as the replica should serve.
#[derive(Debug)]
pub struct ReplicaHandle {
    name: String,
    addr: SocketAddr,
    /// Stops accepting and lets open responses finish ([`ReplicaHandle::drain`]).
    drain: watch::Sender<bool>,
    /// Drops every connection and stops the engine.
    stop: watch::Sender<bool>,
    server: JoinHandle<()>,
    driver: JoinHandle<()>,
    engine: EngineDriver,
    kv_events: Option<KvEventPublisher>,
}

impl ReplicaHandle {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT` of the replica.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The KV events PUB endpoint (`tcp://IP:PORT`, the real port when 0 was asked), when
    /// events are published.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events.as_ref().map(KvEventPublisher::endpoint)
    }

    /// The KV events replay (ROUTER) endpoint, when replay is served.
    pub fn kv_events_replay_endpoint(&self) -> Option<&str> {
        self.kv_events
            .as_ref()
            .and_then(KvEventPublisher::replay_endpoint)
    }

    /// Requests in the engine now (running or waiting).
    pub fn in_flight(&self) -> usize {
        drain::in_engine(&self.engine)
    }

    /// vLLM's answer to SIGTERM, begun now: the listener closes (new connections are
    /// refused), idle connections close, responses in flight run to their end and their
    /// connections then close. With a `deadline` (wall time) the connections still open
    /// after it are dropped, aborting their requests. [`Drain::finished`] waits for the end
    /// and stops the engine.
    pub fn drain(self, deadline: Option<Duration>) -> Drain {
        let in_flight_at_signal = self.in_flight();
        let _ = self.drain.send(true);
        tracing::info!(
            replica = %self.name,
            in_flight = in_flight_at_signal,
            deadline_s = deadline.map(|d| d.as_secs_f64()),
            "draining: refusing connections, finishing responses in flight"
        );
        Drain {
            in_flight_at_signal,
            deadline,
            _drain: self.drain,
            stop: self.stop,
            server: self.server,
            driver_task: self.driver,
            driver: self.engine,
            kv_events: self.kv_events,
            name: self.name,
        }
    }

    /// Stops accepting, drops every open connection (in-flight requests are aborted in the
    /// model) and waits for the replica's tasks to end.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.server.await;
        let _ = self.driver.await;
        if let Some(publisher) = self.kv_events {
            publisher.join().await;
        }
        tracing::info!(replica = %self.name, "stopped");
    }
}

/// Starts one replica on the current tokio runtime.
pub async fn spawn_replica(config: ReplicaConfig) -> Result<ReplicaHandle, ServerError> {
    spawn_replica_with_events(config, KvEventsConfig::default()).await
}

/// Starts one replica that also publishes KV-cache events as `kv_events` says (nothing
/// more than [`spawn_replica`] unless events are enabled with the "zmq" publisher).
pub async fn spawn_replica_with_events(
    config: ReplicaConfig,
    kv_events: KvEventsConfig,
) -> Result<ReplicaHandle, ServerError> {
    let ReplicaConfig {
        name,
        listen,
        model,
        profile,
        time_scale,
        failures,
    } = config;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(ServerError::TimeScale {
            name,
            value: time_scale,
        });
    }
    if !(0.0..=1.0).contains(&failures.rate) {
        return Err(ServerError::FailureRate {
            name,
            value: failures.rate,
        });
    }
    if let Some(secs) = failures.health_fail_for
        && !(secs.is_finite() && secs >= 0.0)
    {
        return Err(ServerError::HealthFailFor { name, value: secs });
    }
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| ServerError::Bind {
            name: name.clone(),
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServerError::Bind {
        name: name.clone(),
        addr: listen,
        source,
    })?;

    let (stop, stopped) = watch::channel(false);
    let (drain, draining) = watch::channel(false);
    let max_model_len = profile.max_model_len;
    let block_size = profile.block_size;
    let profile_name = profile.name.clone();
    let clock = EngineClock::start(time_scale);
    // Unix time at engine time 0: the events' `ts` is this plus engine seconds.
    let epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let publisher = if kv_events.publishes() {
        let publisher = KvEventPublisher::start(&kv_events, epoch, stopped.clone())
            .await
            .map_err(|source| ServerError::KvEvents {
                name: name.clone(),
                source,
            })?;
        tracing::info!(
            replica = %name,
            endpoint = publisher.endpoint(),
            replay = publisher.replay_endpoint().unwrap_or("none"),
            topic = %kv_events.topic,
            "publishing KV events"
        );
        Some(publisher)
    } else {
        None
    };
    let mut engine = EngineModel::new(profile);
    engine.set_kv_events(publisher.is_some());
    let (driver, driver_task) = EngineDriver::start_publishing(
        engine,
        clock,
        stopped.clone(),
        publisher.as_ref().map(KvEventPublisher::queue),
    );
    let replica = Arc::new(Replica::new(
        name.clone(),
        model.clone(),
        max_model_len,
        block_size,
        driver.clone(),
        failures,
    ));
    let server = tokio::spawn(drain::accept_loop(
        listener,
        routes::app(replica),
        draining,
        stopped,
    ));
    tracing::info!(replica = %name, %addr, model = %model, profile = %profile_name, time_scale, "serving");
    Ok(ReplicaHandle {
        name,
        addr,
        drain,
        stop,
        server,
        driver: driver_task,
        engine: driver,
        kv_events: publisher,
    })
}
