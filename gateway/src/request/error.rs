//! The gateway's error type and its one mapping to an HTTP response.
//!
//! Every failure on the request path becomes a [`GatewayError`], which knows who caused it
//! (the client, the upstream replica, or the gateway) and maps, in one place, to a status code
//! and an OpenAI-shaped body `{"error":{"message","type","param","code"}}`. The `type` follows
//! AIBrix's table: 400/404/413 `invalid_request_error` (and 414 and 431, which AIBrix never
//! sends),
//! 503 `overloaded_error`, else `api_error`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use router_core::text::BodyError;

/// Why a request could not be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON, lacks a field routing needs, or has one of the wrong shape.
    #[error("{0}")]
    Body(#[from] BodyError),
    /// The body could not be read from the client (it disconnected or sent a broken body).
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    /// The request head has more header fields or bytes than the gateway takes.
    #[error("request header fields too large: {0}")]
    HeadTooLarge(String),
    /// The HTTP/1 request head cannot be parsed, or its body framing is invalid or
    /// ambiguous (`edge/head_limits.rs`).
    #[error("malformed request head: {0}")]
    MalformedHead(String),
    /// The request target is longer than the gateway takes.
    #[error("request target of {len} bytes, over the limit of {limit}")]
    TargetTooLong { len: usize, limit: usize },
    /// The body is longer than the configured limit.
    #[error("request body exceeds the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// No replica (ready or not) serves the model.
    #[error("model {0:?} does not exist")]
    UnknownModel(String),
    /// The `routing-strategy` header names no known strategy.
    #[error("incorrect routing strategy {0:?} (known: {known})", known = known_strategies())]
    UnknownStrategy(String),
    /// Replicas serve the model but none is ready.
    #[error("no ready replica for model {0:?}")]
    NoReadyReplica(String),
    /// The router failed to choose (e.g. the tokenizer failed).
    #[error("error on selecting target pod: {0}")]
    Routing(String),
    /// Every attempt failed before a response byte arrived (connect refused, reset, 502/503).
    /// `failures` says what went wrong on each attempt, in order (`a: …; b: …`), since a
    /// retry's error alone can hide the first replica's.
    #[error(
        "no replica could be reached for model {model:?} after {attempts} attempt(s): {failures}"
    )]
    UpstreamUnavailable {
        model: String,
        attempts: u32,
        failures: String,
    },
    /// The chosen replica sent no response headers within the first-byte timeout.
    #[error("replica {pod} did not answer within {timeout_ms} ms")]
    UpstreamTimeout { pod: String, timeout_ms: u64 },
    /// No route for this method and path.
    #[error("unknown request path {0}")]
    UnknownPath(String),
    /// API keys are configured and the request carries none of them.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// Over the global or the tenant's in-flight cap.
    #[error("rate limit exceeded: {message}")]
    RateLimited {
        message: String,
        retry_after_secs: u64,
    },
    /// A request header routing or admission reads has an unusable value.
    #[error("header {header}: {reason}")]
    BadHeader { header: String, reason: String },
    /// The shutdown's drain deadline passed while the request still waited for its
    /// replica's response headers (the upstream request is cancelled).
    #[error("the gateway shut down before replica {pod} answered")]
    ShuttingDown { pod: String },
}

/// The strategy names a `routing-strategy` header may carry, for error messages.
fn known_strategies() -> String {
    router_core::Strategy::ALL
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Who caused an error: decides the status family and whether a retry could help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    Client,
    Upstream,
    Gateway,
}

impl GatewayError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::Body(_)
            | GatewayError::BodyRead(_)
            | GatewayError::UnknownStrategy(_)
            | GatewayError::MalformedHead(_)
            | GatewayError::BadHeader { .. } => StatusCode::BAD_REQUEST,
            GatewayError::TargetTooLong { .. } => StatusCode::URI_TOO_LONG,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::UnknownModel(_) | GatewayError::UnknownPath(_) => StatusCode::NOT_FOUND,
            GatewayError::NoReadyReplica(_)
            | GatewayError::Routing(_)
            | GatewayError::ShuttingDown { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::UpstreamUnavailable { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Who caused the error.
    pub fn blame(&self) -> Blame {
        match self {
            GatewayError::Body(_)
            | GatewayError::BodyRead(_)
            | GatewayError::BodyTooLarge { .. }
            | GatewayError::HeadTooLarge(_)
            | GatewayError::MalformedHead(_)
            | GatewayError::TargetTooLong { .. }
            | GatewayError::UnknownModel(_)
            | GatewayError::UnknownStrategy(_)
            | GatewayError::UnknownPath(_)
            | GatewayError::Unauthorized
            | GatewayError::RateLimited { .. }
            | GatewayError::BadHeader { .. } => Blame::Client,
            GatewayError::UpstreamUnavailable { .. } | GatewayError::UpstreamTimeout { .. } => {
                Blame::Upstream
            }
            GatewayError::NoReadyReplica(_)
            | GatewayError::Routing(_)
            | GatewayError::ShuttingDown { .. } => Blame::Gateway,
        }
    }

    /// The machine-readable `code` field.
    pub fn code(&self) -> &'static str {
        match self {
            GatewayError::Body(BodyError::InvalidJson(_)) => "invalid_json",
            GatewayError::Body(BodyError::MissingModel) => "missing_model",
            GatewayError::Body(BodyError::NoMessages) => "no_messages",
            GatewayError::Body(BodyError::InvalidField { .. }) => "invalid_field",
            GatewayError::BodyRead(_) => "invalid_body",
            GatewayError::BodyTooLarge { .. } => "body_too_large",
            GatewayError::HeadTooLarge(_) => "headers_too_large",
            GatewayError::MalformedHead(_) => "invalid_request_head",
            GatewayError::TargetTooLong { .. } => "uri_too_long",
            GatewayError::UnknownModel(_) => "model_not_found",
            GatewayError::UnknownStrategy(_) => "invalid_routing_strategy",
            GatewayError::NoReadyReplica(_) | GatewayError::Routing(_) => "service_unavailable",
            // As the SSE event of a stream cut at the same moment.
            GatewayError::ShuttingDown { .. } => "gateway_shutting_down",
            GatewayError::UpstreamUnavailable { .. } => "upstream_unavailable",
            GatewayError::UpstreamTimeout { .. } => "upstream_timeout",
            GatewayError::UnknownPath(_) => "unknown_path",
            GatewayError::Unauthorized => "invalid_api_key",
            GatewayError::RateLimited { .. } => "rate_limit_exceeded",
            GatewayError::BadHeader { .. } => "invalid_header",
        }
    }

    /// The replica the error is about, when one was chosen and is to blame: the response
    /// names it in `target-pod` and the request is counted under it.
    pub fn pod(&self) -> Option<&str> {
        match self {
            GatewayError::UpstreamTimeout { pod, .. } => Some(pod),
            _ => None,
        }
    }

    /// The request field the error is about, when there is one.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            GatewayError::Body(BodyError::MissingModel) | GatewayError::UnknownModel(_) => {
                Some("model")
            }
            GatewayError::Body(BodyError::InvalidField { field, .. }) => Some(field),
            GatewayError::Body(BodyError::NoMessages) => Some("messages"),
            _ => None,
        }
    }

    /// The OpenAI-shaped JSON body.
    pub fn body(&self) -> serde_json::Value {
        openai_error(self.status(), &self.to_string(), self.code(), self.param())
    }
}

/// An OpenAI-shaped error object for a status, message, code and param.
pub fn openai_error(
    status: StatusCode,
    message: &str,
    code: &str,
    param: Option<&str>,
) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": code,
        }
    })
}

/// AIBrix's status → `type` table.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 404 | 413 | 414 | 431 => "invalid_request_error",
        401 => "authentication_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if let GatewayError::RateLimited {
            retry_after_secs, ..
        } = &self
        {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                HeaderValue::from(*retry_after_secs),
            );
        }
        if matches!(
            self,
            GatewayError::UnknownStrategy(_) | GatewayError::Routing(_)
        ) {
            // AIBrix marks routing errors with this header; clients that grep for it keep working.
            response
                .headers_mut()
                .insert("x-error-routing", HeaderValue::from_static("true"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_status_and_shape() {
        let cases = [
            (
                GatewayError::Body(BodyError::InvalidJson("eof".into())),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::Body(BodyError::MissingModel),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::Body(BodyError::NoMessages),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::BodyTooLarge { limit: 10 },
                413,
                "invalid_request_error",
            ),
            (
                GatewayError::HeadTooLarge("101 header fields".into()),
                431,
                "invalid_request_error",
            ),
            (
                GatewayError::MalformedHead("invalid header name".into()),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::TargetTooLong {
                    len: 70000,
                    limit: 65534,
                },
                414,
                "invalid_request_error",
            ),
            (
                GatewayError::UnknownModel("m".into()),
                404,
                "invalid_request_error",
            ),
            (
                GatewayError::UnknownStrategy("x".into()),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::NoReadyReplica("m".into()),
                503,
                "overloaded_error",
            ),
            (
                GatewayError::ShuttingDown { pod: "a".into() },
                503,
                "overloaded_error",
            ),
            (
                GatewayError::UpstreamUnavailable {
                    model: "m".into(),
                    attempts: 2,
                    failures: "a: refused; b: refused".into(),
                },
                502,
                "api_error",
            ),
            (
                GatewayError::UpstreamTimeout {
                    pod: "a".into(),
                    timeout_ms: 5,
                },
                504,
                "api_error",
            ),
            (GatewayError::Unauthorized, 401, "authentication_error"),
            (
                GatewayError::RateLimited {
                    message: "m".into(),
                    retry_after_secs: 1,
                },
                429,
                "rate_limit_error",
            ),
        ];
        for (error, status, kind) in cases {
            assert_eq!(error.status().as_u16(), status, "{error}");
            let body = error.body();
            assert_eq!(body["error"]["type"], kind, "{error}");
            assert_eq!(body["error"]["code"], error.code(), "{error}");
            assert_eq!(body["error"]["message"], error.to_string());
            assert!(
                body["error"].get("param").is_some(),
                "param is always present"
            );
        }
    }

    #[test]
    fn model_errors_name_the_model_param() {
        assert_eq!(
            GatewayError::UnknownModel("m".into()).body()["error"]["param"],
            "model"
        );
        assert_eq!(
            GatewayError::Body(BodyError::MissingModel).param(),
            Some("model")
        );
        assert_eq!(GatewayError::NoReadyReplica("m".into()).param(), None);
    }
}
