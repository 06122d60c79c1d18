//! What each dialect says to Envoy: the request headers and metadata that carry a decision,
//! the response headers, and the shape of a refusal.
//!
//! **AIBrix** (gateway-plugins, v0.7.0): once routed, the request gets `routing-strategy`
//! (the route AIBrix's EnvoyPatchPolicy installs matches on it), `target-pod: ip:port` (its
//! ORIGINAL_DST cluster's `http_header_name`) and `x-request-id`; the request headers' answer
//! says `x-went-into-req-headers: true`. The response gets `x-went-into-req-headers`,
//! `request-id`, `routing-strategy`, `target-pod` (the pod's **name**) and `target-pod-ip`,
//! plus prefixgate's `x-prefixgate-outstanding` and `x-prefixgate-match-percent`. A refusal
//! is an immediate response with AIBrix's status, `content-type: application/json`, the
//! `x-error-*` header AIBrix sets for that case and an OpenAI error body; an unknown model is
//! AIBrix's 400 (`model_not_found`, `x-error-no-model-backends: MODEL`), not the HTTP front
//! end's 404.
//!
//! **Gateway API Inference Extension** (endpoint picker protocol v1): once routed, the
//! request gets `x-gateway-destination-endpoint: ip:port` and the same value in the dynamic
//! metadata `{"envoy.lb": {"x-gateway-destination-endpoint": "ip:port"}}`, one endpoint (no
//! fallback list). The response gets the reference picker's `x-went-into-resp-headers: true`
//! and the routing headers above. A refusal is the reference picker's: the status (503 no
//! endpoint, 429 over a limit, 404 model not found, 400 a bad request, …) and a plain-text
//! body `inference error: CODE - MESSAGE`.
//!
//! Both: `Retry-After` on a 429, and the error's `code` as the immediate response's
//! `details` (Envoy's `%RESPONSE_CODE_DETAILS%`).

use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;
use envoy_types::pb::envoy::service::ext_proc::v3::{HeaderMutation, ImmediateResponse};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::Struct;
use http::{HeaderMap, HeaderValue, StatusCode};
use router_core::Decision;

use crate::ext_proc::config::Dialect;
use crate::ext_proc::wire::{self, set_header};
use crate::request::error::{GatewayError, openai_error};
use crate::request::headers::{self, ROUTING_STRATEGY, TARGET_POD, X_REQUEST_ID};

/// AIBrix's marker of a request its gateway processed (in the request and the response).
pub const WENT_INTO_REQ_HEADERS: &str = "x-went-into-req-headers";
/// The reference endpoint picker's marker of a response it processed.
pub const WENT_INTO_RESP_HEADERS: &str = "x-went-into-resp-headers";
/// The header and the metadata key naming the picked endpoint.
pub const DESTINATION_ENDPOINT: &str = "x-gateway-destination-endpoint";
/// The dynamic metadata namespace of the picked endpoint.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";

/// Why a request is refused: a gateway error, as on the HTTP front end, or an Envoy whose
/// ext_proc filter is configured so that the gateway cannot route (named, with the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Gateway(GatewayError),
    Misconfigured(String),
}

impl From<GatewayError> for Refusal {
    fn from(error: GatewayError) -> Self {
        Refusal::Gateway(error)
    }
}

impl Refusal {
    /// The status the dialect answers with.
    pub fn status(&self, dialect: Dialect) -> StatusCode {
        match (self, dialect) {
            (Refusal::Misconfigured(_), _) => StatusCode::INTERNAL_SERVER_ERROR,
            (Refusal::Gateway(GatewayError::UnknownModel(_)), Dialect::Aibrix) => {
                StatusCode::BAD_REQUEST
            }
            (Refusal::Gateway(error), _) => error.status(),
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Refusal::Gateway(error) => error.code(),
            Refusal::Misconfigured(_) => "ext_proc_misconfigured",
        }
    }

    fn message(&self) -> String {
        match self {
            Refusal::Gateway(error) => error.to_string(),
            Refusal::Misconfigured(message) => message.clone(),
        }
    }
}

impl Dialect {
    /// The request headers' answer before the request is routed.
    pub fn unrouted_request_headers(self) -> Vec<HeaderValueOption> {
        match self {
            Dialect::Aibrix => vec![set_header(WENT_INTO_REQ_HEADERS, b"true")],
            Dialect::Gie => Vec::new(),
        }
    }

    /// The request headers that send the request to `authority` (`ip:port`).
    pub fn routed_request_headers(
        self,
        authority: &str,
        decision: &Decision,
        request_id: &HeaderValue,
    ) -> Vec<HeaderValueOption> {
        let id = set_header(X_REQUEST_ID.as_str(), request_id.as_bytes());
        match self {
            Dialect::Aibrix => vec![
                set_header(
                    ROUTING_STRATEGY.as_str(),
                    decision.strategy.as_str().as_bytes(),
                ),
                set_header(TARGET_POD.as_str(), authority.as_bytes()),
                id,
            ],
            Dialect::Gie => vec![set_header(DESTINATION_ENDPOINT, authority.as_bytes()), id],
        }
    }

    /// The dynamic metadata that sends the request to `authority`.
    pub fn routed_metadata(self, authority: &str) -> Option<Struct> {
        match self {
            Dialect::Aibrix => None,
            Dialect::Gie => Some(wire::metadata(
                DESTINATION_NAMESPACE,
                DESTINATION_ENDPOINT,
                authority,
            )),
        }
    }

    /// The headers added to a routed request's response.
    pub fn response_headers(
        self,
        request_id: &HeaderValue,
        decision: &Decision,
        authority: &str,
    ) -> Vec<HeaderValueOption> {
        let mut routing = HeaderMap::new();
        headers::set_routing_headers(&mut routing, request_id, decision, authority);
        let marker = match self {
            Dialect::Aibrix => WENT_INTO_REQ_HEADERS,
            Dialect::Gie => WENT_INTO_RESP_HEADERS,
        };
        let mut set = vec![set_header(marker, b"true")];
        set.extend(wire::set_headers(&routing));
        set
    }

    /// The immediate response refusing a request.
    pub fn refusal(self, refusal: &Refusal, request_id: &HeaderValue) -> ImmediateResponse {
        let status = refusal.status(self);
        let mut set = Vec::new();
        if let Refusal::Gateway(GatewayError::RateLimited {
            retry_after_secs, ..
        }) = refusal
        {
            let seconds = retry_after_secs.to_string();
            set.push(set_header(
                http::header::RETRY_AFTER.as_str(),
                seconds.as_bytes(),
            ));
        }
        let body = match self {
            Dialect::Aibrix => {
                set.push(set_header(
                    http::header::CONTENT_TYPE.as_str(),
                    b"application/json",
                ));
                set.push(set_header(
                    headers::REQUEST_ID.as_str(),
                    request_id.as_bytes(),
                ));
                if let Some((name, value)) = aibrix_error_header(refusal) {
                    set.push(set_header(name, value.as_bytes()));
                }
                let param = match refusal {
                    Refusal::Gateway(error) => error.param(),
                    Refusal::Misconfigured(_) => None,
                };
                openai_error(status, &refusal.message(), refusal.code(), param).to_string()
            }
            Dialect::Gie => format!(
                "inference error: {} - {}",
                gie_code(status),
                refusal.message()
            ),
        };
        ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers: set,
                remove_headers: Vec::new(),
            }),
            body: body.into_bytes(),
            grpc_status: None,
            details: refusal.code().to_owned(),
        }
    }
}

/// The `x-error-*` header AIBrix's gateway sets for this refusal.
fn aibrix_error_header(refusal: &Refusal) -> Option<(&'static str, String)> {
    let Refusal::Gateway(error) = refusal else {
        return None;
    };
    match error {
        GatewayError::UnknownModel(model) => Some(("x-error-no-model-backends", model.clone())),
        GatewayError::NoReadyReplica(_) => Some(("x-error-no-model-backends", "true".into())),
        GatewayError::UnknownStrategy(_) | GatewayError::Routing(_) => {
            Some(("x-error-routing", "true".into()))
        }
        GatewayError::Body(_)
        | GatewayError::BodyRead(_)
        | GatewayError::BodyTooLarge { .. }
        | GatewayError::UnknownPath(_) => Some(("x-error-request-body-processing", "true".into())),
        _ => None,
    }
}

/// The reference endpoint picker's error code for a status.
fn gie_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 414 | 431 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        429 => "ResourceExhausted",
        503 => "ServiceUnavailable",
        _ => "Internal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(response: &'a ImmediateResponse, name: &str) -> Option<&'a [u8]> {
        response
            .headers
            .as_ref()?
            .set_headers
            .iter()
            .filter_map(|o| o.header.as_ref())
            .find(|h| h.key == name)
            .map(|h| h.raw_value.as_slice())
    }

    #[test]
    fn refusals_take_each_dialect_s_shape() {
        let id = HeaderValue::from_static("rid");
        let unknown = Refusal::Gateway(GatewayError::UnknownModel("m".into()));
        let aibrix = Dialect::Aibrix.refusal(&unknown, &id);
        assert_eq!(aibrix.status.unwrap().code, 400);
        assert_eq!(
            header(&aibrix, "x-error-no-model-backends"),
            Some(&b"m"[..])
        );
        assert_eq!(header(&aibrix, "request-id"), Some(&b"rid"[..]));
        let body: serde_json::Value = serde_json::from_slice(&aibrix.body).unwrap();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(aibrix.details, "model_not_found");

        let gie = Dialect::Gie.refusal(&unknown, &id);
        assert_eq!(gie.status.unwrap().code, 404);
        assert_eq!(
            String::from_utf8(gie.body).unwrap(),
            "inference error: NotFound - model \"m\" does not exist"
        );
        let none = Refusal::Gateway(GatewayError::NoReadyReplica("m".into()));
        let gie = Dialect::Gie.refusal(&none, &id);
        assert_eq!(gie.status.unwrap().code, 503);
        assert!(
            String::from_utf8(gie.body)
                .unwrap()
                .starts_with("inference error: ServiceUnavailable - ")
        );
        let limited = Refusal::Gateway(GatewayError::RateLimited {
            message: "over".into(),
            retry_after_secs: 3,
        });
        for dialect in [Dialect::Aibrix, Dialect::Gie] {
            let response = dialect.refusal(&limited, &id);
            assert_eq!(response.status.unwrap().code, 429);
            assert_eq!(header(&response, "retry-after"), Some(&b"3"[..]));
        }
        let misconfigured = Refusal::Misconfigured("set BUFFERED".into());
        assert_eq!(
            Dialect::Gie
                .refusal(&misconfigured, &id)
                .status
                .unwrap()
                .code,
            500
        );
    }
}
