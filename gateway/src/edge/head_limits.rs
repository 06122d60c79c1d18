//! The gateway's rules for a request head: well-formed as hyper parses it, within the
//! gateway's limits, answered with OpenAI JSON when it is not.
//!
//! hyper refuses a head it cannot parse, or one over its own limits, with a bare status line
//! and an empty body, and offers no hook to write anything else. So HTTP/1.1 heads are judged
//! here first, by [`parse`], before hyper sees a byte of them ([`super::head_guard`] holds them
//! back until they are complete): the same parser hyper uses (`httparse`, with hyper's
//! configuration and its header slot count), then hyper's own checks of what it parsed (the
//! target's length and syntax, `content-length` and `transfer-encoding`), then the gateway's
//! limits. A head that passes is one hyper accepts; one that fails becomes a
//! [`GatewayError`] (400, 414 or 431) that the service answers in place of the request.
//!
//! HTTP/2 heads (and HTTP/1 heads on a connection the guard stopped following, after an
//! upgrade) reach the service parsed by hyper; [`check`] applies the gateway's limits there.

use http::HeaderMap;

use crate::request::error::GatewayError;

/// The most header fields a request may carry (hyper's and Envoy's default). It is also the
/// header slot count of hyper's parser, so the two parsers run out of slots together.
pub const MAX_HEADERS: usize = 100;

/// The most bytes a request's header names and values may add up to (Envoy's default is
/// 60 KiB, nginx's 32 KiB).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The longest request target hyper takes (`u16::MAX - 1`, hyper's `MAX_URI_LEN`): longer
/// ones are a 414.
pub const MAX_TARGET_LEN: usize = (u16::MAX - 1) as usize;

/// The longest head, request line and header lines with their separators, that may still be
/// within the two limits above (with room for the method, version and whitespace). A head
/// still incomplete past this is refused without waiting for its end.
pub const MAX_HEAD_LEN: usize = MAX_TARGET_LEN + MAX_HEADER_BYTES + 32 * 1024;

/// How the body after a well-formed head is framed: where the next head begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `content-length` (0 when absent).
    Length(u64),
    /// `transfer-encoding` ending in `chunked`.
    Chunked,
    /// `CONNECT`, or an HTTP/1.1 `upgrade` header: what follows may not be HTTP/1 once the
    /// response is given, so it is no longer followed.
    Upgrade,
}

/// A head judged by [`parse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// The head has not ended yet (and is within [`MAX_HEAD_LEN`]).
    Partial,
    /// A well-formed head of `len` bytes whose body is framed by `framing`.
    Complete { len: usize, framing: Framing },
}

/// Judges the HTTP/1 request head at the start of `bytes` as hyper would parse it, and
/// against the gateway's limits.
pub fn parse(bytes: &[u8]) -> Result<Head, GatewayError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    // hyper's server parses with httparse's default configuration.
    let len = match httparse::ParserConfig::default().parse_request(&mut request, bytes) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if bytes.len() > MAX_HEAD_LEN => {
            return Err(GatewayError::HeadTooLarge(format!(
                "the request head is not complete after {MAX_HEAD_LEN} bytes"
            )));
        }
        Ok(httparse::Status::Partial) => return Ok(Head::Partial),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(GatewayError::HeadTooLarge(format!(
                "more than {MAX_HEADERS} header fields"
            )));
        }
        Err(error) => return Err(malformed(what_is_wrong(error, &request))),
    };
    if len > MAX_HEAD_LEN {
        return Err(GatewayError::HeadTooLarge(format!(
            "a {len}-byte request head, over the limit of {MAX_HEAD_LEN}"
        )));
    }
    let framing = judge(&request)?;
    Ok(Head::Complete { len, framing })
}

/// hyper's checks of a parsed head, then the gateway's limits: the body's framing.
fn judge(request: &httparse::Request<'_, '_>) -> Result<Framing, GatewayError> {
    let (Some(method), Some(target), Some(version)) =
        (request.method, request.path, request.version)
    else {
        return Err(malformed("incomplete request line"));
    };
    if target.len() > MAX_TARGET_LEN {
        return Err(GatewayError::TargetTooLong {
            len: target.len(),
            limit: MAX_TARGET_LEN,
        });
    }
    // What hyper converts the request line to.
    http::Method::from_bytes(method.as_bytes()).map_err(|_| malformed("invalid method"))?;
    http::Uri::try_from(target).map_err(|error| malformed(&format!("request target: {error}")))?;
    let http11 = version == 1;
    let mut length = None;
    let mut chunked = None;
    let mut content_length_seen = false;
    let mut upgrade = method == "CONNECT";
    let mut bytes = 0;
    for header in request.headers.iter() {
        bytes += header.name.len() + header.value.len();
        let name = header.name;
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err(malformed("transfer-encoding in an HTTP/1.0 request"));
            }
            // hyper: the last field decides; `chunked` must be its last coding.
            chunked = Some(ends_in_chunked(header.value));
        } else if name.eq_ignore_ascii_case("content-length") {
            content_length_seen = true;
            let value = digits(header.value)
                .ok_or_else(|| malformed("invalid content-length (digits only)"))?;
            match length {
                Some(first) if first != value => {
                    return Err(malformed(&format!(
                        "two different content-length values ({first} and {value})"
                    )));
                }
                _ => length = Some(value),
            }
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade = http11;
        }
    }
    if bytes > MAX_HEADER_BYTES {
        return Err(GatewayError::HeadTooLarge(format!(
            "{bytes} bytes of header names and values, over the limit of {MAX_HEADER_BYTES}"
        )));
    }
    let framing = match chunked {
        Some(false) => {
            return Err(malformed(
                "transfer-encoding whose last coding is not chunked",
            ));
        }
        // hyper would take the chunked framing and drop the length; a request carrying both
        // is how requests are smuggled past a proxy, and Envoy and nginx refuse it.
        Some(true) if content_length_seen => {
            return Err(malformed(
                "both content-length and transfer-encoding (RFC 9112 §6.1)",
            ));
        }
        Some(true) => Framing::Chunked,
        None => Framing::Length(length.unwrap_or(0)),
    };
    if framing == Framing::Length(u64::MAX) || framing == Framing::Length(u64::MAX - 1) {
        // hyper keeps the top two values as markers.
        return Err(malformed("content-length too large"));
    }
    Ok(if upgrade { Framing::Upgrade } else { framing })
}

/// hyper's `content-length` rule: ASCII digits only (no sign, no list), within `u64`.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// hyper's rule: the last comma-separated coding of a UTF-8 value is `chunked`.
fn ends_in_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|value| {
        value
            .rsplit(',')
            .next()
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
    })
}

fn malformed(what: &str) -> GatewayError {
    GatewayError::MalformedHead(what.to_owned())
}

/// What httparse's error says, in words, and where in the head it is.
fn what_is_wrong(error: httparse::Error, request: &httparse::Request<'_, '_>) -> &'static str {
    match error {
        httparse::Error::Token if request.method.is_none() => "invalid method",
        httparse::Error::Token => "invalid request target",
        httparse::Error::Version => "invalid HTTP version (HTTP/1.0 or HTTP/1.1 expected)",
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending (CRLF expected)",
        httparse::Error::Status | httparse::Error::TooManyHeaders => "invalid request line",
    }
}

/// Refuses a head over [`MAX_HEADERS`] fields or [`MAX_HEADER_BYTES`] bytes (for heads
/// [`parse`] did not see: HTTP/2, and HTTP/1 after an upgrade).
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
#[path = "head_limits_tests.rs"]
mod tests;
