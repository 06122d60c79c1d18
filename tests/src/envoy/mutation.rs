//! What Envoy's ext_proc filter does with an answer's header mutation, body mutation and
//! immediate response (envoy.service.ext_proc.v3, `CommonResponse`, `HeaderMutation`,
//! `BodyMutation`, `ImmediateResponse`).

use std::collections::HashMap;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap as WireHeaders, HeaderValue as Wire};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, HeaderMutation, ImmediateResponse, body_mutation,
};
use envoy_types::pb::google::protobuf::{Struct, value::Kind};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Headers as Envoy sends them: lower-case keys, values in `raw_value`, the pseudo-headers
/// first.
pub fn wire_headers(pseudo: &[(&str, &str)], headers: &HeaderMap) -> WireHeaders {
    let mut out: Vec<Wire> = pseudo
        .iter()
        .map(|(k, v)| Wire {
            key: (*k).to_owned(),
            value: String::new(),
            raw_value: v.as_bytes().to_vec(),
        })
        .collect();
    out.extend(headers.iter().map(|(k, v)| Wire {
        key: k.as_str().to_owned(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }));
    WireHeaders { headers: out }
}

/// Applies a header mutation as Envoy does: `append` (deprecated) when set decides, else
/// the append action; system headers (`:…`, `host`) are never set or removed, nor are
/// `x-envoy-*` ones.
pub fn apply(mutation: Option<&HeaderMutation>, headers: &mut HeaderMap) {
    let Some(mutation) = mutation else { return };
    for option in &mutation.set_headers {
        let Some(header) = &option.header else {
            continue;
        };
        let key = header.key.to_ascii_lowercase();
        if key.starts_with(':') || key == "host" || key.starts_with("x-envoy") {
            continue;
        }
        let raw = if header.raw_value.is_empty() {
            header.value.as_bytes()
        } else {
            &header.raw_value
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_bytes(raw),
        ) else {
            continue;
        };
        #[allow(deprecated)]
        let action = match &option.append {
            Some(append) if append.value => HeaderAppendAction::AppendIfExistsOrAdd,
            Some(_) => HeaderAppendAction::OverwriteIfExistsOrAdd,
            None => HeaderAppendAction::try_from(option.append_action)
                .unwrap_or(HeaderAppendAction::AppendIfExistsOrAdd),
        };
        match action {
            HeaderAppendAction::AppendIfExistsOrAdd => {
                headers.append(name, value);
            }
            HeaderAppendAction::AddIfAbsent => {
                headers.entry(name).or_insert(value);
            }
            HeaderAppendAction::OverwriteIfExistsOrAdd => {
                headers.insert(name, value);
            }
            HeaderAppendAction::OverwriteIfExists => {
                if headers.contains_key(&name) {
                    headers.insert(name, value);
                }
            }
        }
    }
    for key in &mutation.remove_headers {
        if !key.starts_with(':') && key != "host" {
            headers.remove(key.as_str());
        }
    }
}

/// A body chunk after a (non-streamed) body mutation.
pub fn mutate_body(mutation: Option<&BodyMutation>, chunk: Bytes) -> Bytes {
    match mutation.and_then(|m| m.mutation.as_ref()) {
        Some(body_mutation::Mutation::Body(body)) => Bytes::from(body.clone()),
        Some(body_mutation::Mutation::ClearBody(true)) => Bytes::new(),
        _ => chunk,
    }
}

/// A streamed body mutation's chunk and end flag (full-duplex answers).
pub fn streamed(mutation: Option<&BodyMutation>) -> Option<(Bytes, bool)> {
    match mutation.and_then(|m| m.mutation.as_ref()) {
        Some(body_mutation::Mutation::StreamedResponse(s)) => {
            Some((Bytes::from(s.body.clone()), s.end_of_stream))
        }
        _ => None,
    }
}

/// The local reply an immediate response makes: its status, headers (Envoy's
/// `content-type: text/plain` unless the mutation says otherwise) and body.
pub fn local_reply(immediate: &ImmediateResponse) -> (u16, HeaderMap, Bytes) {
    let status = immediate
        .status
        .as_ref()
        .and_then(|s| u16::try_from(s.code).ok())
        .unwrap_or(200);
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    apply(immediate.headers.as_ref(), &mut headers);
    (status, headers, Bytes::from(immediate.body.clone()))
}

/// Dynamic metadata as `namespace → key → text` (string values only).
pub fn metadata_strings(metadata: Option<&Struct>) -> HashMap<String, HashMap<String, String>> {
    let mut out = HashMap::new();
    for (namespace, value) in metadata.map(|m| &m.fields).into_iter().flatten() {
        if let Some(Kind::StructValue(inner)) = &value.kind {
            let entries = inner
                .fields
                .iter()
                .filter_map(|(k, v)| match &v.kind {
                    Some(Kind::StringValue(text)) => Some((k.clone(), text.clone())),
                    _ => None,
                })
                .collect();
            out.insert(namespace.clone(), entries);
        }
    }
    out
}
