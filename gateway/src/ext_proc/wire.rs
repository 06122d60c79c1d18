//! Envoy's ext_proc messages to and from the gateway's own types: header maps, header
//! mutations, body chunks and `google.protobuf.Struct` metadata.
//!
//! Wire format (envoy.service.ext_proc.v3, envoy.config.core.v3): Envoy sends header keys
//! lower-cased, each value in `raw_value` (older Envoys in `value`), with the pseudo-headers
//! (`:method`, `:path`, `:status`, …) among them. Every header the gateway sets goes in
//! `raw_value` with `OVERWRITE_IF_EXISTS_OR_ADD`, so a header the client sent is replaced,
//! never doubled, whatever Envoy's default for a mutation without `append`.

use std::collections::HashMap;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap as WireHeaders, HeaderValue as WireHeader, HeaderValueOption,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, CommonResponse, HeaderMutation, StreamedBodyResponse, body_mutation,
};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The largest body chunk sent back to Envoy in one message: Envoy recommends at most
/// 64 KiB per streamed body response; a margin below it, as the Inference Extension keeps.
pub const MAX_BODY_CHUNK: usize = 62_000;

/// A header block as Envoy sent it: the pseudo-headers this gateway reads, and the rest.
#[derive(Debug, Default)]
pub struct Head {
    pub method: String,
    /// The path with its query, as `:path` carries it.
    pub path: String,
    /// The response's `:status`.
    pub status: Option<u16>,
    pub headers: HeaderMap,
}

/// Reads a header block. Entries whose name or value HTTP would refuse are left out (Envoy
/// never sends them; a stand-in client might).
pub fn head(wire: Option<&WireHeaders>) -> Head {
    let mut head = Head::default();
    for entry in wire.map(|w| w.headers.as_slice()).unwrap_or_default() {
        let value: &[u8] = if entry.raw_value.is_empty() {
            entry.value.as_bytes()
        } else {
            &entry.raw_value
        };
        match entry.key.as_str() {
            ":method" => head.method = String::from_utf8_lossy(value).into_owned(),
            ":path" => head.path = String::from_utf8_lossy(value).into_owned(),
            ":status" => {
                head.status = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
            }
            key if key.starts_with(':') => {}
            key => {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(key.as_bytes()),
                    HeaderValue::from_bytes(value),
                ) {
                    head.headers.append(name, value);
                }
            }
        }
    }
    head
}

/// One header to set, replacing any value already there.
pub fn set_header(name: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(WireHeader {
            key: name.to_owned(),
            value: String::new(),
            raw_value: value.to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// Every header of `headers`, to set.
pub fn set_headers(headers: &HeaderMap) -> Vec<HeaderValueOption> {
    headers
        .iter()
        .map(|(name, value)| set_header(name.as_str(), value.as_bytes()))
        .collect()
}

/// A response that changes nothing but sets `headers` (and clears the route cache when
/// they choose the route).
pub fn common(headers: Vec<HeaderValueOption>, clear_route_cache: bool) -> CommonResponse {
    CommonResponse {
        header_mutation: (!headers.is_empty()).then(|| HeaderMutation {
            set_headers: headers,
            remove_headers: Vec::new(),
        }),
        clear_route_cache,
        ..Default::default()
    }
}

/// Body bytes handed back to Envoy in full-duplex mode, in chunks of at most
/// [`MAX_BODY_CHUNK`]; the last one says `end_of_stream` when `end` is set. An empty body is
/// one empty chunk, so the end is still said.
pub fn streamed_chunks(body: &Bytes, end: bool) -> Vec<CommonResponse> {
    let mut chunks = Vec::with_capacity(body.len() / MAX_BODY_CHUNK + 1);
    let mut at = 0;
    loop {
        let upto = body.len().min(at + MAX_BODY_CHUNK);
        let last = upto == body.len();
        chunks.push(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(
                    StreamedBodyResponse {
                        body: body.slice(at..upto).to_vec(),
                        end_of_stream: end && last,
                        ..Default::default()
                    },
                )),
            }),
            ..Default::default()
        });
        if last {
            return chunks;
        }
        at = upto;
    }
}

/// `{namespace: {key: text}}`, the shape of Envoy dynamic metadata.
pub fn metadata(namespace: &str, key: &str, text: &str) -> Struct {
    let inner = Struct {
        fields: HashMap::from([(key.to_owned(), string_value(text))]),
    };
    Struct {
        fields: HashMap::from([(
            namespace.to_owned(),
            Value {
                kind: Some(value::Kind::StructValue(inner)),
            },
        )]),
    }
}

fn string_value(text: &str) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(text.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(pairs: &[(&str, &str)], raw: bool) -> WireHeaders {
        WireHeaders {
            headers: pairs
                .iter()
                .map(|(k, v)| WireHeader {
                    key: (*k).to_owned(),
                    value: if raw { String::new() } else { (*v).to_owned() },
                    raw_value: if raw {
                        v.as_bytes().to_vec()
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn a_head_reads_raw_values_and_plain_ones_and_keeps_pseudo_headers_apart() {
        for raw in [true, false] {
            let head = head(Some(&wire(
                &[
                    (":method", "POST"),
                    (":path", "/v1/completions?x=1"),
                    (":authority", "gw"),
                    ("routing-strategy", "prefix-cache"),
                    ("bad name", "x"),
                ],
                raw,
            )));
            assert_eq!(head.method, "POST");
            assert_eq!(head.path, "/v1/completions?x=1");
            assert_eq!(head.headers.len(), 1, "{:?}", head.headers);
            assert_eq!(head.headers["routing-strategy"], "prefix-cache");
        }
        let head = head(Some(&wire(&[(":status", "429")], true)));
        assert_eq!(head.status, Some(429));
    }

    #[test]
    fn bodies_go_back_in_chunks_under_the_limit_with_the_end_on_the_last() {
        let body = Bytes::from(vec![b'x'; MAX_BODY_CHUNK * 2 + 5]);
        let chunks = streamed_chunks(&body, true);
        let parts: Vec<(usize, bool)> = chunks
            .iter()
            .map(|c| match &c.body_mutation.as_ref().unwrap().mutation {
                Some(body_mutation::Mutation::StreamedResponse(s)) => {
                    (s.body.len(), s.end_of_stream)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            parts,
            [(MAX_BODY_CHUNK, false), (MAX_BODY_CHUNK, false), (5, true)]
        );
        assert_eq!(streamed_chunks(&Bytes::new(), false).len(), 1);
    }

    #[test]
    fn headers_are_set_by_overwriting() {
        let option = set_header("target-pod", b"10.0.0.5:8000");
        assert_eq!(
            option.append_action,
            HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
        assert_eq!(option.header.unwrap().raw_value, b"10.0.0.5:8000");
    }
}
