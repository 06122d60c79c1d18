//! The request path, one module per step (DESIGN.md). [`routes`] maps the listeners' paths
//! to handlers; [`inference`] ties the steps of an
//! OpenAI inference request together: admit ([`crate::admit`]) → [`parse`] the body just
//! enough to route → charge the tenant's tokens → [`pick`] a replica through router-core →
//! [`proxy`] the bytes upstream with bounded retries → stream the answer back in a
//! [`release`] body that holds the pod's outstanding guard, the admission permit and the
//! token charge. [`headers`] and [`error`] shape what the client sees.

pub mod error;
pub mod headers;
pub mod inference;
pub mod parse;
pub mod pick;
pub mod proxy;
pub mod release;
pub mod routes;
