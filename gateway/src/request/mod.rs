//! The request path, one module per step (DESIGN.md). [`routes`] maps the listeners' paths
//! to handlers; [`inference`] ties the steps of an
//! OpenAI inference request together: admit ([`crate::admit`]) → [`parse`] the body just
//! enough to route → charge the tenant's tokens → [`pick`] a replica through router-core →
//! [`proxy`] the bytes upstream with bounded retries → stream the answer back in a
//! [`release`] body that keeps the request's [`hold`] (the pod's outstanding guard, the
//! admission permit and the token charge). [`headers`] and [`error`] shape what the client
//! sees. [`prepare`] (parse, strategy, token charge) and [`pick`] are also the Envoy ext_proc
//! front end's ([`crate::ext_proc`]), which keeps the same [`hold`] in its stream.

pub mod error;
pub mod headers;
pub mod hold;
pub mod inference;
pub mod parse;
pub mod pick;
pub mod prepare;
pub mod proxy;
pub mod release;
pub mod resume;
pub mod routes;
