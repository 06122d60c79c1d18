//! Step 2 of the request path: read the body (bounded) and parse only what routing needs.
//!
//! The body is read whole, up to `max_body_bytes`, because routing needs the prompt; the
//! bytes read are the bytes forwarded (never re-serialised). Parsing is router-core's
//! [`routing_fields_with`], one pass over the body: model, stream flag, the completion bound
//! token admission reads, and the message text, built only for a strategy that hashes it.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::HeaderMap;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use router_core::text::{Endpoint, RoutingFields, Text, routing_fields_with};

use crate::request::error::GatewayError;

/// A client gets this long to send its whole body, so a trickling body cannot hold a
/// connection and an admission place forever.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// After a 413, the rest of the body is read and thrown away for at most this long and this
/// many bytes (a lingering close, as nginx's `lingering_time`): closing with unread bytes
/// would reset the connection, and a client still writing its body would lose the 413.
pub(crate) const LINGER_TIME: Duration = Duration::from_secs(10);
pub(crate) const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Reads the whole body, refusing more than `limit` bytes (413) before reading them when the
/// client declares a `content-length`, and while reading otherwise. A refused body's rest
/// is drained in the background ([`linger`]), so the client reads its 413.
pub async fn read_body(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        linger(body);
        return Err(GatewayError::BodyTooLarge { limit });
    }
    let collected =
        tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(&mut body, limit).collect())
            .await
            .map_err(|_| {
                GatewayError::BodyRead(format!(
                    "the body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ))
            })?;
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => {
            linger(body);
            Err(GatewayError::BodyTooLarge { limit })
        }
        Err(error) => Err(GatewayError::BodyRead(with_causes(error.as_ref()))),
    }
}

/// An error and its causes, `outer: inner: …`: hyper's body error alone says only "error
/// reading a body from connection", its cause what was wrong (e.g. "invalid chunk size line").
fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = inner.source();
    }
    message
}

/// Reads and discards the rest of a refused body in its own task, for at most
/// [`LINGER_TIME`] and [`LINGER_BYTES`]; the connection then closes without a reset.
pub(crate) fn linger(mut body: Body) {
    tokio::spawn(async move {
        let drain = async {
            let mut read = 0usize;
            while read < LINGER_BYTES {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        read += frame.data_ref().map_or(0, |data| data.len());
                    }
                    Some(Err(_)) | None => break,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

/// The routing fields of a body sent to `endpoint`, its message text built when `text`
/// asks for it.
pub fn fields(endpoint: Endpoint, body: &[u8], text: Text) -> Result<RoutingFields, GatewayError> {
    Ok(routing_fields_with(endpoint, body, text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_a_body_within_the_limit() {
        let body = read_body(&HeaderMap::new(), Body::from("12345"), 5)
            .await
            .unwrap();
        assert_eq!(&body[..], b"12345");
    }

    #[tokio::test]
    async fn refuses_an_undeclared_body_over_the_limit() {
        let error = read_body(&HeaderMap::new(), Body::from("123456"), 5)
            .await
            .unwrap_err();
        assert_eq!(error, GatewayError::BodyTooLarge { limit: 5 });
    }

    #[tokio::test]
    async fn refuses_a_declared_length_over_the_limit_without_reading() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_LENGTH, "999".parse().unwrap());
        let error = read_body(&headers, Body::empty(), 5).await.unwrap_err();
        assert_eq!(error, GatewayError::BodyTooLarge { limit: 5 });
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_finishes_times_out() {
        let never =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let error = read_body(&HeaderMap::new(), never, 5).await.unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.to_string().contains("did not arrive"), "{error}");
    }

    #[test]
    fn bad_bodies_are_client_errors() {
        let error = fields(Endpoint::ChatCompletions, b"{not json", Text::Build).unwrap_err();
        assert_eq!(error.status(), 400);
        let error =
            fields(Endpoint::ChatCompletions, b"{\"messages\":[]}", Text::Build).unwrap_err();
        assert_eq!(error.code(), "missing_model");
    }
}
