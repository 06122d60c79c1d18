//! Errors as vLLM (≥ 0.10.1) writes them: `{"error":{"message","type","param","code"}}` with
//! `code` the integer HTTP status. Every handler failure becomes one of these, so clients and
//! the gateway see the same bodies a real replica would send.
//!
//! vLLM 0.32 has two kinds of 400: a request its pydantic models refuse (malformed JSON, a
//! missing field, a wrong type) is `type: "Bad Request"` with `param` the location
//! (`body.messages`; `body.43`, the offset, for JSON that does not parse) and pydantic's
//! one-error message; one its serving code refuses is `BadRequestError` with the parameter
//! named (`max_tokens`, `input_tokens`, `model`) or null.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An HTTP error answer in vLLM's nested shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    /// `type`, when not the one the status implies (pydantic's "Bad Request").
    pub kind: Option<&'static str>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorInfo<'a>,
}

#[derive(Serialize)]
struct ErrorInfo<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: u16,
}

impl ApiError {
    /// A 400 `BadRequestError`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::with_status(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 `BadRequestError` about one request parameter.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_owned()),
            ..Self::bad_request(message)
        }
    }

    /// A 400 from request validation: pydantic error `kind` at `loc` (a field path, empty
    /// for the body itself), with its message and a rendering of the input.
    pub fn validation(kind: &str, loc: &str, msg: &str, input: &str) -> Self {
        let loc = if loc.is_empty() {
            "body".to_owned()
        } else {
            format!("body.{loc}")
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', 'input': {input}}}"
            ),
            param: Some(loc),
            kind: Some("Bad Request"),
        }
    }

    /// vLLM's 404 for a model it does not serve (`served`, its one name).
    pub fn unknown_model(model: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".to_owned()),
            ..Self::with_status(
                StatusCode::NOT_FOUND,
                format!("The model `{model}` does not exist. Valid aliases: {served}."),
            )
        }
    }

    /// Any status with a message.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            kind: None,
        }
    }

    /// The `type` vLLM writes: pydantic's for a validation error, else its exception class
    /// name for the status.
    pub fn kind(&self) -> &'static str {
        if let Some(kind) = self.kind {
            return kind;
        }
        match self.status.as_u16() {
            400 => "BadRequestError",
            401 => "UnauthorizedError",
            404 => "NotFoundError",
            413 => "RequestEntityTooLargeError",
            429 => "RateLimitError",
            501 => "NotImplementedError",
            503 => "ServiceUnavailableError",
            500..=599 => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    /// The JSON body, for places that write it outside a response (an SSE error event).
    pub fn body_json(&self) -> String {
        let body = ErrorBody {
            error: ErrorInfo {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| String::from("{}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorInfo {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_shape_with_integer_code() {
        let err = ApiError::unknown_model("gpt-x", "m");
        assert_eq!(
            err.body_json(),
            r#"{"error":{"message":"The model `gpt-x` does not exist. Valid aliases: m.","type":"NotFoundError","param":"model","code":404}}"#
        );
        assert_eq!(
            ApiError::validation(
                "list_type",
                "messages",
                "Input should be a valid list",
                "'hi'"
            )
            .body_json(),
            r#"{"error":{"message":"1 validation error:\n  {'type': 'list_type', 'loc': 'body.messages', 'msg': 'Input should be a valid list', 'input': 'hi'}","type":"Bad Request","param":"body.messages","code":400}}"#
        );
        assert_eq!(ApiError::bad_request("x").kind(), "BadRequestError");
        assert_eq!(
            ApiError::with_status(StatusCode::BAD_GATEWAY, "x").kind(),
            "InternalServerError"
        );
    }
}
