//! The gateway as Envoy's external processor: an ext_proc gRPC server that makes the routing
//! decision for requests Envoy proxies itself, in place of AIBrix's gateway-plugins or as a
//! Gateway API Inference Extension endpoint picker (docs/ENVOY.md).
//!
//! With `ext_proc.listen` set, a third listener serves `envoy.service.ext_proc.v3.
//! ExternalProcessor` ([`service`]) and `grpc.health.v1.Health` ([`health`]) over HTTP/2
//! (h2c, or TLS with `ext_proc.tls_cert_file`), through the same accept loop, drain and cut
//! as the HTTP listeners (`edge::listener`; tonic's routes as an axum router). Each ext_proc
//! stream is one request ([`exchange`]): it is admitted, parsed, charged and picked by the
//! HTTP front end's own steps (`request::prepare`, `request::pick`) with the same router,
//! policies, prefix index and `aibrix_prefix_cache_*` metrics, and it holds the pod's
//! outstanding count in the same [`crate::request::hold::RequestHold`] until the response
//! ends or the stream breaks. Envoy forwards the request itself; the gateway never sees the
//! request go upstream, so there are no retries here and no upstream timeouts.
//!
//! What differs between AIBrix and the Inference Extension (headers, metadata, refusals) is
//! [`dialect`]; how Envoy sends the bodies and the mode override, [`modes`]; the Inference
//! Extension's subset hint, [`subset`]; the protocol's messages, [`wire`].

pub mod config;
mod dialect;
mod exchange;
mod health;
mod modes;
mod service;
mod subset;
mod wire;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tonic_health::pb::health_server::HealthServer;

pub use config::{Dialect, ExtProcConfig};

use crate::edge::listener;
use crate::state::AppState;

/// Serves the ext_proc and health services on `listener` until `stop`, then drains.
pub fn spawn(
    listener: TcpListener,
    state: Arc<AppState>,
    dialect: Dialect,
    tls: Option<TlsAcceptor>,
    stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let health = health::ExtProcHealth::new(Arc::clone(&state.replicas));
    let routes = tonic::service::Routes::new(ExternalProcessorServer::new(
        service::ExtProcService::new(state, dialect),
    ))
    .add_service(HealthServer::new(health))
    .prepare()
    .into_axum_router();
    listener::spawn(listener, routes, tls, stop)
}
