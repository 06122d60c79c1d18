//! Header rules: which headers travel upstream and back, the request id, and the routing
//! headers prefixgate adds to every routed response (SPEC §3.1).
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1) are connection-scoped and are never forwarded in
//! either direction: the fixed list, and every header the message's own `connection` header
//! names. `host` and `content-length` are rewritten for the upstream hop, the client's
//! address is appended to `x-forwarded-for`, and a client's `target-pod` / `target-pod-ip`
//! stay behind (they are the gateway's answer, not an instruction to the replica). The
//! same rules serve HTTP/2 clients: their `:authority` lives in the URI, not in a header, so
//! the upstream HTTP/1.1 request's `host` is the replica's, and `te: trailers` (the one
//! hop-by-hop header HTTP/2 allows) stays behind. The
//! routing headers are: `request-id`, `routing-strategy`, `target-pod` (the pod **name**, as
//! AIBrix sets it), `target-pod-ip` (`ip:port`), `x-prefixgate-outstanding` (the chosen pod's
//! count just before this request) and `x-prefixgate-match-percent` (only when the policy
//! consulted the prefix index), and `x-session-id` (base64 of the pod's `ip:port`) under the
//! strategies that honour a session (`session-affinity`, `prefix-load`), as AIBrix's
//! `session-affinity` sets it. The session a request names is read from `x-session-id` and
//! `x-aibrix-session-key` ([`session`]); both also travel upstream unchanged.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use rand::RngCore;
use router_core::policy::session_affinity::session_id;
use router_core::{Decision, Session};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const ROUTING_STRATEGY: HeaderName = HeaderName::from_static("routing-strategy");
pub const TARGET_POD: HeaderName = HeaderName::from_static("target-pod");
pub const TARGET_POD_IP: HeaderName = HeaderName::from_static("target-pod-ip");
pub const OUTSTANDING: HeaderName = HeaderName::from_static("x-prefixgate-outstanding");
pub const MATCH_PERCENT: HeaderName = HeaderName::from_static("x-prefixgate-match-percent");
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_SESSION_ID: HeaderName = HeaderName::from_static("x-session-id");
pub const X_AIBRIX_SESSION_KEY: HeaderName = HeaderName::from_static("x-aibrix-session-key");

/// Longest client-supplied request id that is kept; longer ones are replaced, so a client
/// cannot make the gateway log or forward arbitrarily large values.
const MAX_REQUEST_ID_LEN: usize = 128;

/// Decimal text of 0 to 100 (outstanding counts and match percents are nearly always in that
/// range), so those per-response headers are built without allocating.
#[rustfmt::skip]
const SMALL_NUMBERS: [&str; 101] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
    "16", "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31",
    "32", "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47",
    "48", "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61", "62", "63",
    "64", "65", "66", "67", "68", "69", "70", "71", "72", "73", "74", "75", "76", "77", "78", "79",
    "80", "81", "82", "83", "84", "85", "86", "87", "88", "89", "90", "91", "92", "93", "94", "95",
    "96", "97", "98", "99", "100",
];

/// A header value holding `n` in decimal.
fn number_value(n: u64) -> HeaderValue {
    match usize::try_from(n).ok().and_then(|i| SMALL_NUMBERS.get(i)) {
        Some(text) => HeaderValue::from_static(text),
        None => HeaderValue::from(n),
    }
}

/// The client's `x-request-id` when it is a sane visible-ASCII value, else a fresh UUID v4.
pub fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(value) = headers.get(&X_REQUEST_ID) {
        let bytes = value.as_bytes();
        if !bytes.is_empty()
            && bytes.len() <= MAX_REQUEST_ID_LEN
            && bytes.iter().all(|b| b.is_ascii_graphic())
        {
            return value.clone();
        }
    }
    fresh_request_id()
}

/// A random UUID v4 in its canonical text form.
pub fn fresh_request_id() -> HeaderValue {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 36];
    let mut at = 0;
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text[at] = b'-';
            at += 1;
        }
        text[at] = HEX[usize::from(byte >> 4)];
        text[at + 1] = HEX[usize::from(byte & 0x0f)];
        at += 2;
    }
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Whether `name` is listed in one of the message's `connection` headers (RFC 9110 §7.6.1:
/// those are hop-by-hop too). Almost every message has no `connection` header or only
/// `keep-alive`/`close`, so this is one lookup in the common case.
fn named_by_connection(connection: &[&HeaderValue], name: &HeaderName) -> bool {
    connection.iter().any(|value| {
        value.to_str().is_ok_and(|list| {
            list.split(',')
                .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
        })
    })
}

/// The message's `connection` header values, when any names more than the usual options.
fn connection_options(headers: &HeaderMap) -> Vec<&HeaderValue> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter(|v| {
            !v.as_bytes().eq_ignore_ascii_case(b"keep-alive")
                && !v.as_bytes().eq_ignore_ascii_case(b"close")
        })
        .collect()
}

/// Headers to send upstream: the client's, minus hop-by-hop ones (also those its
/// `connection` header names), `host` and `content-length` (hyper sets both for the new
/// hop) and the routing headers `target-pod` / `target-pod-ip`; with `x-request-id` set and
/// `client` (the peer's address, when known) appended to `x-forwarded-for`.
pub fn upstream_request_headers(
    client_headers: &HeaderMap,
    request_id: &HeaderValue,
    client: Option<IpAddr>,
) -> HeaderMap {
    let connection = connection_options(client_headers);
    let mut out = HeaderMap::with_capacity(client_headers.len() + 2);
    for (name, value) in client_headers {
        if is_hop_by_hop(name)
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == TARGET_POD
            || name == TARGET_POD_IP
            || name == X_FORWARDED_FOR
            || (!connection.is_empty() && named_by_connection(&connection, name))
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out.insert(X_REQUEST_ID, request_id.clone());
    if let Some(value) = forwarded_for(client_headers, client) {
        out.insert(X_FORWARDED_FOR, value);
    }
    out
}

/// `x-forwarded-for` for the next hop: the client's list (all its headers, in order, as one
/// comma-separated value) with the client's address appended, as nginx's
/// `$proxy_add_x_forwarded_for` and Envoy do. Without a known address the list passes as is.
fn forwarded_for(client_headers: &HeaderMap, client: Option<IpAddr>) -> Option<HeaderValue> {
    let mut list = String::new();
    for value in client_headers.get_all(&X_FORWARDED_FOR) {
        let Ok(text) = value.to_str() else { continue };
        let text = text.trim();
        if !text.is_empty() {
            if !list.is_empty() {
                list.push_str(", ");
            }
            list.push_str(text);
        }
    }
    if let Some(ip) = client {
        if !list.is_empty() {
            list.push_str(", ");
        }
        list.push_str(&ip.to_string());
    }
    if list.is_empty() {
        return None;
    }
    HeaderValue::from_str(&list).ok()
}

/// The session a request names by its `x-session-id` and `x-aibrix-session-key` (their
/// bytes as sent; router-core judges them).
pub fn session(headers: &HeaderMap) -> Session<'_> {
    Session {
        id: headers.get(&X_SESSION_ID).map(HeaderValue::as_bytes),
        key: headers
            .get(&X_AIBRIX_SESSION_KEY)
            .map(HeaderValue::as_bytes),
    }
}

/// A request's session headers, owned (shared bytes, not copies), for a path that hands its
/// header map on while it still routes: the request sent upstream takes the map on its last
/// attempt.
#[derive(Debug, Default)]
pub struct SessionHeaders {
    id: Option<HeaderValue>,
    key: Option<HeaderValue>,
}

impl SessionHeaders {
    pub fn of(headers: &HeaderMap) -> Self {
        SessionHeaders {
            id: headers.get(&X_SESSION_ID).cloned(),
            key: headers.get(&X_AIBRIX_SESSION_KEY).cloned(),
        }
    }

    /// The session they name, as [`session`] reads it from a header map.
    pub fn session(&self) -> Session<'_> {
        Session {
            id: self.id.as_ref().map(HeaderValue::as_bytes),
            key: self.key.as_ref().map(HeaderValue::as_bytes),
        }
    }
}

/// How many headers [`set_routing_headers`] adds at most.
const ROUTING_HEADERS: usize = 7;

/// Copies an upstream response's headers, minus hop-by-hop ones (also those its
/// `connection` header names), into `out`, with room
/// reserved for the routing headers so the map is allocated once.
pub fn copy_response_headers(upstream: &HeaderMap, out: &mut HeaderMap) {
    out.reserve(upstream.len() + ROUTING_HEADERS);
    let connection = connection_options(upstream);
    for (name, value) in upstream {
        if !is_hop_by_hop(name)
            && (connection.is_empty() || !named_by_connection(&connection, name))
        {
            out.append(name.clone(), value.clone());
        }
    }
}

/// Adds prefixgate's routing headers to a response.
pub fn set_routing_headers(
    out: &mut HeaderMap,
    request_id: &HeaderValue,
    decision: &Decision,
    pod_authority: &str,
) {
    out.insert(REQUEST_ID, request_id.clone());
    out.insert(
        ROUTING_STRATEGY,
        HeaderValue::from_static(decision.strategy.as_str()),
    );
    if let Ok(value) = HeaderValue::from_str(&decision.pod_name) {
        out.insert(TARGET_POD, value);
    }
    if let Ok(value) = HeaderValue::from_str(pod_authority) {
        out.insert(TARGET_POD_IP, value);
    }
    out.insert(OUTSTANDING, number_value(decision.outstanding_at_selection));
    if let Some(percent) = decision.match_percent {
        out.insert(MATCH_PERCENT, number_value(u64::from(percent)));
    }
    if decision.strategy.issues_session_id()
        && let Ok(value) = HeaderValue::from_str(&session_id::encode(pod_authority))
    {
        out.insert(X_SESSION_ID, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::Strategy;

    #[test]
    fn keeps_a_sane_request_id_and_replaces_others() {
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&headers), "abc-123");
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("has space"));
        assert_ne!(request_id(&headers), "has space");
        let long = "x".repeat(MAX_REQUEST_ID_LEN + 1);
        headers.insert(X_REQUEST_ID, HeaderValue::from_str(&long).unwrap());
        assert_eq!(request_id(&headers).len(), 36);
    }

    #[test]
    fn fresh_ids_are_uuid_v4_and_differ() {
        let a = fresh_request_id();
        let b = fresh_request_id();
        assert_ne!(a, b);
        let text = a.to_str().unwrap();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4");
        let groups: Vec<usize> = text.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert!(text.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
    }

    #[test]
    fn hop_by_hop_and_length_are_not_forwarded() {
        let mut client = HeaderMap::new();
        client.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        client.insert(header::HOST, HeaderValue::from_static("gw"));
        client.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        client.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        let id = HeaderValue::from_static("rid");
        let out = upstream_request_headers(&client, &id, None);
        assert_eq!(out.get(header::AUTHORIZATION).unwrap(), "Bearer k");
        assert_eq!(out.get(&X_REQUEST_ID).unwrap(), "rid");
        assert!(out.get(header::CONNECTION).is_none());
        assert!(out.get(header::HOST).is_none());
        assert!(out.get(header::CONTENT_LENGTH).is_none());
    }

    #[test]
    fn an_h2_request_s_te_and_an_h1_upgrade_are_not_forwarded() {
        let mut client = HeaderMap::new();
        client.insert(header::TE, HeaderValue::from_static("trailers"));
        client.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        client.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        client.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let out = upstream_request_headers(&client, &HeaderValue::from_static("rid"), None);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(out[header::CONTENT_TYPE], "application/json");
        assert_eq!(out[&X_REQUEST_ID], "rid");
    }

    #[test]
    fn headers_the_connection_header_names_are_hop_by_hop_both_ways() {
        let mut client = HeaderMap::new();
        client.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        client.append(
            header::CONNECTION,
            HeaderValue::from_static("X-Secret , x-trace"),
        );
        client.insert("x-secret", HeaderValue::from_static("s"));
        client.insert("x-trace", HeaderValue::from_static("t"));
        client.insert("x-kept", HeaderValue::from_static("k"));
        let out = upstream_request_headers(&client, &HeaderValue::from_static("rid"), None);
        assert!(out.get("x-secret").is_none(), "{out:?}");
        assert!(out.get("x-trace").is_none(), "{out:?}");
        assert_eq!(out["x-kept"], "k");

        let mut upstream = HeaderMap::new();
        upstream.insert(header::CONNECTION, HeaderValue::from_static("x-hop"));
        upstream.insert("x-hop", HeaderValue::from_static("h"));
        upstream.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let mut back = HeaderMap::new();
        copy_response_headers(&upstream, &mut back);
        assert!(back.get("x-hop").is_none(), "{back:?}");
        assert!(back.get(header::CONNECTION).is_none(), "{back:?}");
        assert_eq!(back[header::CONTENT_TYPE], "text/plain");
    }

    #[test]
    fn a_client_s_target_pod_stays_behind_and_its_address_is_forwarded_for() {
        let mut client = HeaderMap::new();
        client.insert(&TARGET_POD, HeaderValue::from_static("pod-b"));
        client.insert(&TARGET_POD_IP, HeaderValue::from_static("10.0.0.2:8000"));
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        let rid = HeaderValue::from_static("rid");
        let out = upstream_request_headers(&client, &rid, Some(peer));
        assert!(out.get(&TARGET_POD).is_none(), "{out:?}");
        assert!(out.get(&TARGET_POD_IP).is_none(), "{out:?}");
        assert_eq!(out[&X_FORWARDED_FOR], "192.0.2.7");
        // A list the client brings is kept (all its headers, in order), the peer appended.
        client.append(&X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.1"));
        client.append(&X_FORWARDED_FOR, HeaderValue::from_static(" 198.51.100.2 "));
        let out = upstream_request_headers(&client, &rid, Some(peer));
        assert_eq!(out.get_all(&X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(
            out[&X_FORWARDED_FOR],
            "203.0.113.1, 198.51.100.2, 192.0.2.7"
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let out = upstream_request_headers(&HeaderMap::new(), &rid, Some(v6));
        assert_eq!(out[&X_FORWARDED_FOR], "2001:db8::1");
        let out = upstream_request_headers(&HeaderMap::new(), &rid, None);
        assert!(out.get(&X_FORWARDED_FOR).is_none());
    }

    #[test]
    fn numbers_are_their_decimal_text_inside_and_outside_the_table() {
        for n in (0..=150).chain([999, u64::MAX]) {
            assert_eq!(number_value(n), n.to_string().as_str(), "{n}");
        }
    }

    #[test]
    fn routing_headers_name_the_pod() {
        let decision = Decision {
            pod: 1,
            pod_name: "L20-B".into(),
            strategy: Strategy::PrefixCache,
            selection: None,
            match_percent: Some(42),
            imbalance: false,
            outstanding_at_selection: 3,
            prefix_hashes: vec![],
        };
        let mut out = HeaderMap::new();
        set_routing_headers(
            &mut out,
            &HeaderValue::from_static("rid"),
            &decision,
            "10.0.0.6:8000",
        );
        assert_eq!(out.get(&TARGET_POD).unwrap(), "L20-B");
        assert_eq!(out.get(&TARGET_POD_IP).unwrap(), "10.0.0.6:8000");
        assert_eq!(out.get(&ROUTING_STRATEGY).unwrap(), "prefix-cache");
        assert_eq!(out.get(&OUTSTANDING).unwrap(), "3");
        assert_eq!(out.get(&MATCH_PERCENT).unwrap(), "42");
        assert_eq!(out.get(&REQUEST_ID).unwrap(), "rid");
        // AIBrix's prefix-cache issues no session; the strategies that honour one do.
        assert!(out.get(&X_SESSION_ID).is_none());
        let decision = Decision {
            strategy: Strategy::PrefixLoad,
            ..decision
        };
        set_routing_headers(
            &mut out,
            &HeaderValue::from_static("rid"),
            &decision,
            "10.0.0.6:8000",
        );
        // python3 -c 'import base64; print(base64.b64encode(b"10.0.0.6:8000"))'
        assert_eq!(out.get(&X_SESSION_ID).unwrap(), "MTAuMC4wLjY6ODAwMA==");
        // The reservation in `copy_response_headers` covers every routing header.
        assert_eq!(out.len(), ROUTING_HEADERS);
    }
}
