//! `x-session-id`, AIBrix's gateway-issued session: standard base64 (with padding) of the
//! chosen pod's `ip:port`. It names an address, nothing more: it is not a credential, and a
//! value that does not decode, or names no ready pod, is as good as none.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// The `x-session-id` value for a pod at `address` (`ip:port`).
pub fn encode(address: &str) -> String {
    STANDARD.encode(address)
}

/// The address an `x-session-id` value names, when it is base64 of UTF-8 text.
pub fn decode(session_id: &[u8]) -> Option<String> {
    let bytes = STANDARD.decode(session_id).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_matches_an_independent_encoding() {
        // python3 -c 'import base64; print(base64.b64encode(b"10.0.0.1:8000"))'
        assert_eq!(encode("10.0.0.1:8000"), "MTAuMC4wLjE6ODAwMA==");
        assert_eq!(
            decode(b"MTAuMC4wLjE6ODAwMA==").as_deref(),
            Some("10.0.0.1:8000")
        );
        assert_eq!(
            decode(encode("[::1]:8000").as_bytes()).as_deref(),
            Some("[::1]:8000")
        );
    }

    #[test]
    fn garbage_names_nothing() {
        assert_eq!(decode(b"not base64!"), None);
        // Valid base64 of bytes that are not UTF-8.
        assert_eq!(decode(b"/w=="), None);
    }
}
