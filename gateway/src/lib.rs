//! prefixgate's gateway: the serving path from an OpenAI request to a vLLM replica.
//!
//! The request path, one module per step (DESIGN.md): [`admit`] (API keys, in-flight caps)
//! → [`parse`] the body just enough to route → charge the tenant's token rate
//! ([`admit::Admission::charge_tokens`]) → [`pick`] a replica through router-core →
//! [`proxy`] the bytes upstream with bounded retries → stream the answer back in a
//! [`release`] body that holds the pod's outstanding guard, the admission permit and the
//! token charge;
//! [`inference`] ties the steps together, [`headers`] and [`error`] shape what the client
//! sees, [`metrics`] records it. [`kv_sync`] feeds engines' KV-cache events to the index. Around the path: [`replicas`] (static, embedded, health,
//! engine scrape), [`config`] and [`cli`], [`app`] (the routers as functions of their
//! state), [`listener`] (the accept loop: HTTP/1.1 and HTTP/2, with [`tls`] when
//! configured), [`server`] (listeners, background tasks and graceful shutdown, behind
//! [`start`]).

pub mod admit;
pub mod app;
pub mod cli;
#[cfg(test)]
mod cli_tests;
pub mod config;
pub mod error;
pub mod headers;
pub mod inference;
pub mod kv_sync;
pub mod listener;
pub mod metrics;
pub mod parse;
pub mod pick;
pub mod proxy;
pub mod release;
pub mod replicas;
pub mod server;
pub mod shutdown;
pub mod tls;

pub use config::GatewayConfig;
pub use server::{GatewayHandle, StartError, start};
