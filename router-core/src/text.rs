//! The routing fields of an OpenAI request body: model, stream flag, message text.
//!
//! (Placeholder; the implementation lands with the router-core issue.)

use serde::Deserialize;

/// Which OpenAI endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    Embeddings,
}

/// What routing needs from a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingFields {
    pub model: String,
    pub stream: bool,
    /// The message text the prefix is computed from (empty for embeddings).
    pub text: String,
}

/// Why a body cannot be routed. Every variant is a client error (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("request body has no `model`")]
    MissingModel,
    #[error("`{field}` is invalid: {reason}")]
    InvalidField { field: &'static str, reason: String },
}

#[derive(Deserialize)]
struct Minimal {
    model: Option<String>,
    #[serde(default)]
    stream: bool,
}

/// Parses just what routing needs from `body`.
pub fn routing_fields(_endpoint: Endpoint, body: &[u8]) -> Result<RoutingFields, BodyError> {
    let minimal: Minimal =
        serde_json::from_slice(body).map_err(|e| BodyError::InvalidJson(e.to_string()))?;
    let model = minimal.model.ok_or(BodyError::MissingModel)?;
    Ok(RoutingFields {
        model,
        stream: minimal.stream,
        text: String::new(),
    })
}
