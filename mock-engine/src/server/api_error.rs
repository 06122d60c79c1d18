//! Errors as vLLM (≥ 0.10.1) writes them: `{"error":{"message","type","param","code"}}` with
//! `code` the integer HTTP status. Every handler failure becomes one of these, so clients and
//! the gateway see the same bodies a real replica would send.

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

    /// vLLM's 404 for a model it does not serve.
    pub fn unknown_model(model: &str) -> Self {
        Self::with_status(
            StatusCode::NOT_FOUND,
            format!("The model `{model}` does not exist."),
        )
    }

    /// Any status with a message.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    /// The `type` vLLM writes for a status (its exception class names).
    pub fn kind(&self) -> &'static str {
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
        let err = ApiError::unknown_model("gpt-x");
        assert_eq!(
            err.body_json(),
            r#"{"error":{"message":"The model `gpt-x` does not exist.","type":"NotFoundError","param":null,"code":404}}"#
        );
        assert_eq!(ApiError::bad_request("x").kind(), "BadRequestError");
        assert_eq!(
            ApiError::with_status(StatusCode::BAD_GATEWAY, "x").kind(),
            "InternalServerError"
        );
    }
}
