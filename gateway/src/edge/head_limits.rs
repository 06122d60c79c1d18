//! The gateway's limits on a request head, answered with an OpenAI-shaped 431.
//!
//! hyper refuses a head over its own limits with a bare status line and an empty body, and
//! offers no hook to write anything else. So hyper's limits are set well above the
//! gateway's ([`HYPER_MAX_HEADERS`]; its read buffer, about 400 KiB, is far above
//! [`MAX_HEADER_BYTES`]) and the gateway's own are enforced here, on the parsed head, before
//! the router sees the request. Only a head past hyper's limits, or one hyper cannot parse
//! at all, still gets hyper's empty answer (docs/GATEWAY.md, "Errors").

use http::HeaderMap;

use crate::request::error::GatewayError;

/// The most header fields a request may carry (hyper's and Envoy's default).
pub const MAX_HEADERS: usize = 100;

/// The most bytes a request's header names and values may add up to (Envoy's default is
/// 60 KiB, nginx's 32 KiB).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// hyper's own header count limit, above [`MAX_HEADERS`] so that the gateway, not hyper,
/// answers a head between the two. hyper allocates room for this many per parsed head.
pub const HYPER_MAX_HEADERS: usize = 4 * MAX_HEADERS;

/// Refuses a head over [`MAX_HEADERS`] fields or [`MAX_HEADER_BYTES`] bytes.
pub fn check(headers: &HeaderMap) -> Result<(), GatewayError> {
    if headers.len() > MAX_HEADERS {
        return Err(GatewayError::HeadTooLarge(format!(
            "{} header fields, over the limit of {MAX_HEADERS}",
            headers.len()
        )));
    }
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if bytes > MAX_HEADER_BYTES {
        return Err(GatewayError::HeadTooLarge(format!(
            "{bytes} bytes of header names and values, over the limit of {MAX_HEADER_BYTES}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_within_the_limits_passes_and_one_past_either_is_a_431() {
        let mut headers = HeaderMap::new();
        for i in 0..MAX_HEADERS {
            headers.insert(
                http::HeaderName::try_from(format!("x-h{i}")).unwrap(),
                "v".parse().unwrap(),
            );
        }
        assert!(check(&headers).is_ok());
        headers.insert("x-one-more", "v".parse().unwrap());
        let error = check(&headers).unwrap_err();
        assert_eq!(error.status(), 431);
        assert!(error.to_string().contains("101 header fields"), "{error}");

        let mut headers = HeaderMap::new();
        let value = "a".repeat(MAX_HEADER_BYTES - "x-big".len());
        headers.insert("x-big", value.parse().unwrap());
        assert!(check(&headers).is_ok());
        headers.insert("x", "a".parse().unwrap());
        assert_eq!(check(&headers).unwrap_err().code(), "headers_too_large");
    }
}
