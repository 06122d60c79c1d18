//! One HTTP request through Envoy's ext_proc filter: the messages it sends on the gRPC
//! stream, in the order Envoy sends them for its processing mode, and what it does with
//! each answer (docs: envoy.extensions.filters.http.ext_proc.v3, external_processor.proto).
//!
//! - Request headers always first, with `protocol_config` (when configured) and the
//!   metadata context on that first message. Envoy waits for their answer, except in
//!   `FULL_DUPLEX_STREAMED`, where the body and trailers follow at once.
//! - A `mode_override` in a headers answer replaces the whole processing mode for the rest
//!   of the stream (header modes: `DEFAULT` is `SEND`; trailers: `DEFAULT` is `SKIP`), when
//!   `allow_mode_override` is set and the body is not sent without waiting.
//! - `BUFFERED`: the whole body in one message (over the buffer limit Envoy answers 413
//!   itself); the answer's header mutation applies to the request headers. `STREAMED`: one
//!   message per chunk, each answered before it goes on; header mutations in those answers
//!   are ignored. `FULL_DUPLEX_STREAMED`: the answers carry the body Envoy sends on
//!   (`streamed_response`), after the headers answer; trailers (mode `SEND`) or the last
//!   chunk's `end_of_stream` end it. `NONE`: no body message.
//! - An immediate response at any point is the local reply; Envoy then closes the stream.
//!   A gRPC error, an answer of the wrong kind, or an answer missing when the server ends
//!   the stream: 500 (no `failure_mode_allow`); a clean end of the stream before answering:
//!   Envoy goes on without the server.
//! - When Envoy is done with the stream (the response ended) it half-closes it; a client
//!   that leaves, or an Envoy that goes away, resets it ([`EnvoyStream::reset`]).

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::Struct;
use http::HeaderMap;
use tokio::sync::mpsc;
use tonic::Streaming;

use super::mutation::{self, apply, wire_headers};
use super::{FilterConfig, Reply, Request};

/// Where a request goes once the filter let it pass.
#[derive(Debug)]
pub struct Forward {
    /// The request headers as they leave Envoy (after every mutation).
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The answers' dynamic metadata, merged.
    pub metadata: Option<Struct>,
    /// Whether an answer asked to clear the route cache (the route is chosen again).
    pub cleared_route: bool,
}

/// The filter's side of one ext_proc stream.
#[derive(Debug)]
pub struct EnvoyStream {
    sender: Option<mpsc::Sender<ProcessingRequest>>,
    answers: Streaming<ProcessingResponse>,
    mode: ProcessingMode,
    config: FilterConfig,
    /// Whether the first message (with `protocol_config`) has been sent.
    started: bool,
    /// Set once Envoy stopped processing (immediate response, server's clean end).
    done: bool,
}

/// What the filter does next after reading for an answer.
enum Read {
    Answer(ProcessingResponse),
    /// The local reply (immediate response, or Envoy's 500 for a broken stream).
    Local(Reply),
    /// The server ended the stream cleanly: Envoy goes on unprocessed.
    Ended,
}

fn body_mode(mode: i32) -> BodySendMode {
    BodySendMode::try_from(mode).unwrap_or(BodySendMode::None)
}

impl EnvoyStream {
    pub(super) fn new(
        sender: mpsc::Sender<ProcessingRequest>,
        answers: Streaming<ProcessingResponse>,
        config: FilterConfig,
    ) -> Self {
        EnvoyStream {
            sender: Some(sender),
            answers,
            mode: config.mode(),
            config,
            started: false,
            done: false,
        }
    }

    async fn send(&mut self, request: Message, metadata: Option<&Request>) {
        let mut message = ProcessingRequest {
            request: Some(request),
            ..Default::default()
        };
        if !self.started {
            self.started = true;
            if self.config.send_protocol_config {
                message.protocol_config = Some(ProtocolConfiguration {
                    request_body_mode: self.mode.request_body_mode,
                    response_body_mode: self.mode.response_body_mode,
                    send_body_without_waiting_for_header_response: false,
                });
            }
        }
        if let Some(request) = metadata {
            message.metadata_context = request.metadata.clone();
        }
        if let Some(sender) = &self.sender {
            // A server that went away shows in the next read.
            let _ = sender.send(message).await;
        }
    }

    async fn read(&mut self) -> Read {
        match self.answers.message().await {
            Ok(Some(answer)) => match &answer.response {
                Some(Answer::ImmediateResponse(immediate)) => {
                    self.close();
                    let (status, headers, body) = mutation::local_reply(immediate);
                    Read::Local(Reply::local(status, headers, body))
                }
                _ => Read::Answer(answer),
            },
            Ok(None) => {
                self.done = true;
                Read::Ended
            }
            Err(status) => {
                self.close();
                Read::Local(Reply::ext_proc_error(&status.to_string()))
            }
        }
    }

    /// Envoy half-closes the stream: nothing more to send.
    fn close(&mut self) {
        self.sender = None;
        self.done = true;
    }

    /// Reads the answer to a message of `kind`; anything else fails the request.
    async fn expect(
        &mut self,
        kind: fn(&Answer) -> Option<&CommonResponse>,
    ) -> Result<Option<(CommonResponse, ProcessingResponse)>, Reply> {
        match self.read().await {
            Read::Local(reply) => Err(reply),
            Read::Ended => Ok(None),
            Read::Answer(answer) => match answer.response.as_ref().and_then(kind) {
                Some(common) => Ok(Some((common.clone(), answer))),
                None => {
                    self.close();
                    Err(Reply::ext_proc_error(&format!(
                        "spurious ext_proc answer {:?}",
                        answer.response
                    )))
                }
            },
        }
    }

    fn override_mode(&mut self, answer: &ProcessingResponse) {
        if let Some(mode) = &answer.mode_override
            && self.config.allow_mode_override
        {
            self.mode = *mode;
        }
    }

    /// The request side: headers, body, trailers. `Ok` with what goes upstream, `Err` with
    /// the local reply that ends the request.
    pub async fn request(&mut self, request: &Request) -> Result<Forward, Reply> {
        let mut headers = request.headers.clone();
        let body: Bytes = request.body.concat().into();
        let empty = body.is_empty() && request.trailers.is_none();
        let mut forward = Forward {
            headers: HeaderMap::new(),
            body: Bytes::new(),
            metadata: None,
            cleared_route: false,
        };
        let wire = wire_headers(
            &[
                (":method", &request.method),
                (":path", &request.path),
                (":authority", "gateway.example"),
                (":scheme", "http"),
            ],
            &headers,
        );
        let full_duplex =
            body_mode(self.mode.request_body_mode) == BodySendMode::FullDuplexStreamed;
        let buffered = matches!(
            body_mode(self.mode.request_body_mode),
            BodySendMode::Buffered | BodySendMode::BufferedPartial
        );
        if buffered
            && body.len() > self.config.buffer_limit
            && body_mode(self.mode.request_body_mode) == BodySendMode::Buffered
        {
            return Err(Reply::local(
                413,
                HeaderMap::new(),
                Bytes::from_static(b"Payload Too Large"),
            ));
        }
        self.send(
            Message::RequestHeaders(HttpHeaders {
                headers: Some(wire),
                end_of_stream: empty,
                ..Default::default()
            }),
            Some(request),
        )
        .await;
        if full_duplex && !empty {
            // Body and trailers without waiting, as they arrive.
            for (i, chunk) in request.body.iter().enumerate() {
                let last = i + 1 == request.body.len() && request.trailers.is_none();
                self.send(
                    Message::RequestBody(HttpBody {
                        body: chunk.to_vec(),
                        end_of_stream: last,
                        ..Default::default()
                    }),
                    Some(request),
                )
                .await;
            }
            if let Some(trailers) = &request.trailers {
                self.send(
                    Message::RequestTrailers(HttpTrailers {
                        trailers: Some(wire_headers(&[], trailers)),
                    }),
                    Some(request),
                )
                .await;
            }
        }
        let Some((common, answer)) = self.expect(request_headers).await? else {
            forward.headers = headers;
            forward.body = body;
            return Ok(forward);
        };
        apply(common.header_mutation.as_ref(), &mut headers);
        forward.cleared_route |= common.clear_route_cache;
        merge(&mut forward.metadata, answer.dynamic_metadata.clone());
        if !full_duplex {
            self.override_mode(&answer);
        }
        let mode = body_mode(self.mode.request_body_mode);
        let mut sent = BytesMut::new();
        match mode {
            _ if empty || self.done => sent.extend_from_slice(&body),
            BodySendMode::FullDuplexStreamed => loop {
                let Some((common, answer)) = self.expect(request_body_or_trailers).await? else {
                    break;
                };
                if matches!(answer.response, Some(Answer::RequestTrailers(_))) {
                    break;
                }
                merge(&mut forward.metadata, answer.dynamic_metadata.clone());
                let Some((chunk, end)) = mutation::streamed(common.body_mutation.as_ref()) else {
                    self.close();
                    return Err(Reply::ext_proc_error(
                        "a full-duplex body answer without streamed_response",
                    ));
                };
                sent.extend_from_slice(&chunk);
                if end {
                    break;
                }
            },
            BodySendMode::Buffered | BodySendMode::BufferedPartial => {
                let limit = if mode == BodySendMode::BufferedPartial {
                    self.config.buffer_limit.min(body.len())
                } else {
                    body.len()
                };
                let whole = limit == body.len();
                self.send(
                    Message::RequestBody(HttpBody {
                        body: body[..limit].to_vec(),
                        end_of_stream: whole && request.trailers.is_none(),
                        ..Default::default()
                    }),
                    Some(request),
                )
                .await;
                match self.expect(request_body).await? {
                    Some((common, answer)) => {
                        // Buffered: the headers have not left, so the mutation applies.
                        apply(common.header_mutation.as_ref(), &mut headers);
                        forward.cleared_route |= common.clear_route_cache;
                        merge(&mut forward.metadata, answer.dynamic_metadata.clone());
                        sent.extend_from_slice(&mutation::mutate_body(
                            common.body_mutation.as_ref(),
                            body.slice(..limit),
                        ));
                    }
                    None => sent.extend_from_slice(&body[..limit]),
                }
                sent.extend_from_slice(&body[limit..]);
                self.request_trailers(request).await?;
            }
            BodySendMode::Streamed => {
                for (i, chunk) in request.body.iter().enumerate() {
                    let last = i + 1 == request.body.len() && request.trailers.is_none();
                    if self.done {
                        sent.extend_from_slice(chunk);
                        continue;
                    }
                    self.send(
                        Message::RequestBody(HttpBody {
                            body: chunk.to_vec(),
                            end_of_stream: last,
                            ..Default::default()
                        }),
                        Some(request),
                    )
                    .await;
                    match self.expect(request_body).await? {
                        // Streamed: the headers are gone, only the body mutation applies.
                        Some((common, _)) => sent.extend_from_slice(&mutation::mutate_body(
                            common.body_mutation.as_ref(),
                            chunk.clone(),
                        )),
                        None => sent.extend_from_slice(chunk),
                    }
                }
                self.request_trailers(request).await?;
            }
            _ => sent.extend_from_slice(&body),
        }
        forward.headers = headers;
        forward.body = sent.freeze();
        Ok(forward)
    }

    async fn request_trailers(&mut self, request: &Request) -> Result<(), Reply> {
        let send = self.mode.request_trailer_mode == HeaderSendMode::Send as i32;
        let Some(trailers) = request.trailers.as_ref().filter(|_| send && !self.done) else {
            return Ok(());
        };
        self.send(
            Message::RequestTrailers(HttpTrailers {
                trailers: Some(wire_headers(&[], trailers)),
            }),
            Some(request),
        )
        .await;
        self.expect(request_trailers).await.map(|_| ())
    }

    /// The response headers from upstream; `Ok` with the headers Envoy sends downstream.
    pub async fn response_headers(
        &mut self,
        status: u16,
        mut headers: HeaderMap,
        end_of_stream: bool,
    ) -> Result<HeaderMap, Reply> {
        let send = self.mode.response_header_mode != HeaderSendMode::Skip as i32;
        if self.done || !send {
            return Ok(headers);
        }
        let status_text = status.to_string();
        let wire = wire_headers(&[(":status", &status_text)], &headers);
        self.send(
            Message::ResponseHeaders(HttpHeaders {
                headers: Some(wire),
                end_of_stream,
                ..Default::default()
            }),
            None,
        )
        .await;
        if let Some((common, answer)) = self.expect(response_headers).await? {
            apply(common.header_mutation.as_ref(), &mut headers);
            self.override_mode(&answer);
        }
        Ok(headers)
    }

    /// One chunk of the response body; `Ok` with what Envoy sends downstream for it.
    pub async fn response_chunk(
        &mut self,
        chunk: Bytes,
        end_of_stream: bool,
    ) -> Result<Bytes, Reply> {
        let mode = body_mode(self.mode.response_body_mode);
        if self.done || matches!(mode, BodySendMode::None) {
            return Ok(chunk);
        }
        self.send(
            Message::ResponseBody(HttpBody {
                body: chunk.to_vec(),
                end_of_stream,
                ..Default::default()
            }),
            None,
        )
        .await;
        if mode != BodySendMode::FullDuplexStreamed {
            return Ok(match self.expect(response_body).await? {
                Some((common, _)) => mutation::mutate_body(common.body_mutation.as_ref(), chunk),
                None => chunk,
            });
        }
        // Full duplex: the server's streamed answers are what goes downstream; read until
        // they have given back as much, or said the end.
        let mut out = BytesMut::new();
        loop {
            let Some((common, _)) = self.expect(response_body).await? else {
                return Ok(out.freeze());
            };
            let Some((part, end)) = mutation::streamed(common.body_mutation.as_ref()) else {
                self.close();
                return Err(Reply::ext_proc_error(
                    "a full-duplex body answer without streamed_response",
                ));
            };
            out.extend_from_slice(&part);
            if end || (!end_of_stream && out.len() >= chunk.len()) {
                return Ok(out.freeze());
            }
        }
    }

    /// The response trailers (sent with trailer mode `SEND`).
    pub async fn response_trailers(&mut self, trailers: &HeaderMap) -> Result<(), Reply> {
        if self.done || self.mode.response_trailer_mode != HeaderSendMode::Send as i32 {
            return Ok(());
        }
        self.send(
            Message::ResponseTrailers(HttpTrailers {
                trailers: Some(wire_headers(&[], trailers)),
            }),
            None,
        )
        .await;
        self.expect(response_trailers).await.map(|_| ())
    }

    /// Envoy is done with the request: it half-closes the stream and the server ends it.
    /// Returns the server's final status (`Ok` for a clean end).
    pub async fn finish(mut self) -> Result<(), tonic::Status> {
        self.sender = None;
        match self.answers.message().await {
            Ok(Some(extra)) => Err(tonic::Status::internal(format!(
                "an answer after the end: {extra:?}"
            ))),
            Ok(None) => Ok(()),
            Err(status) => Err(status),
        }
    }

    /// Waits, the stream still open on Envoy's side, for the server to end it.
    pub async fn ended_by_server(mut self) -> Result<(), tonic::Status> {
        loop {
            match self.answers.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    }

    /// The client left, or Envoy went away: the stream is reset (dropped, RST_STREAM).
    pub fn reset(self) {}
}

static DEFAULT_COMMON: CommonResponse = CommonResponse {
    status: 0,
    header_mutation: None,
    body_mutation: None,
    trailers: None,
    clear_route_cache: false,
};

/// Later metadata adds to earlier metadata, namespace by namespace.
fn merge(into: &mut Option<Struct>, more: Option<Struct>) {
    let Some(more) = more else { return };
    match into {
        Some(existing) => existing.fields.extend(more.fields),
        None => *into = Some(more),
    }
}

/// The answers each message awaits: the common part of the answer of that kind.
fn request_headers(answer: &Answer) -> Option<&CommonResponse> {
    match answer {
        Answer::RequestHeaders(h) => Some(h.response.as_ref().unwrap_or(&DEFAULT_COMMON)),
        _ => None,
    }
}

fn request_body(answer: &Answer) -> Option<&CommonResponse> {
    match answer {
        Answer::RequestBody(b) => Some(b.response.as_ref().unwrap_or(&DEFAULT_COMMON)),
        _ => None,
    }
}

/// Full duplex: a body chunk, or the trailers' answer that follows the last one.
fn request_body_or_trailers(answer: &Answer) -> Option<&CommonResponse> {
    match answer {
        Answer::RequestTrailers(_) => Some(&DEFAULT_COMMON),
        other => request_body(other),
    }
}

fn request_trailers(answer: &Answer) -> Option<&CommonResponse> {
    matches!(answer, Answer::RequestTrailers(_)).then_some(&DEFAULT_COMMON)
}

fn response_headers(answer: &Answer) -> Option<&CommonResponse> {
    match answer {
        Answer::ResponseHeaders(h) => Some(h.response.as_ref().unwrap_or(&DEFAULT_COMMON)),
        _ => None,
    }
}

fn response_body(answer: &Answer) -> Option<&CommonResponse> {
    match answer {
        Answer::ResponseBody(b) => Some(b.response.as_ref().unwrap_or(&DEFAULT_COMMON)),
        _ => None,
    }
}

fn response_trailers(answer: &Answer) -> Option<&CommonResponse> {
    matches!(answer, Answer::ResponseTrailers(_)).then_some(&DEFAULT_COMMON)
}
