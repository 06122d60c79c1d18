//! One ext_proc stream: one HTTP request and its response, as Envoy shows them, turned into
//! the gateway's decision and the answers Envoy waits for.
//!
//! The conversation, message by message (`ProcessingRequest` → `ProcessingResponse`):
//! - **request headers**: the path names the endpoint (`POST` chat, completions,
//!   embeddings; `GET /v1/models` is answered at once with the replicas' models; anything
//!   else is a 404); admission (API keys, in-flight caps) runs here, before the body, as on
//!   the HTTP front end. Answered at once when the body comes buffered (with a mode override
//!   when it would come streamed, `super::modes`), held back when it comes full-duplex.
//! - **request body** (and **request trailers**, which end a full-duplex body): gathered up
//!   to `max_body_bytes`; once whole, prepared and picked exactly as on the HTTP front end
//!   (`request::prepare`, `request::pick`), within the Inference Extension's subset hint.
//!   The decision goes out as the dialect's headers and metadata, in the answer to the body
//!   (buffered) or to the headers, followed by the body itself (full duplex).
//! - **response headers**, **response body**, **response trailers**: the routing headers
//!   are added; each body chunk is shown to the request's [`RequestHold`] (first byte,
//!   usage) and, in full duplex, sent back; the response's end releases the hold.
//!
//! Every refusal is an immediate response in the dialect's shape, after which Envoy sends
//! nothing more. The hold lives in this exchange, so a stream that Envoy ends early (the
//! client left, Envoy reset it) or that breaks drops it with the exchange: the pod's count,
//! the admission place and the token charge come back exactly once.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeadersResponse, HttpBody, HttpHeaders, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use http::{HeaderMap, HeaderValue};
use router_core::Decision;
use router_core::text::Endpoint;
use tokio::time::Instant;
use tonic::Status;

use crate::admit::AdmissionPermit;
use crate::ext_proc::config::Dialect;
use crate::ext_proc::dialect::Refusal;
use crate::ext_proc::modes::{BodyMode, Modes};
use crate::ext_proc::subset::Subset;
use crate::ext_proc::wire::{self, set_header};
use crate::metrics::PodMetrics;
use crate::replicas::Replica;
use crate::request::error::GatewayError;
use crate::request::headers;
use crate::request::hold::{Completion, RequestHold};
use crate::request::pick::pick_among;
use crate::request::prepare::prepare;
use crate::request::routes::model_list;
use crate::state::AppState;

/// Where the exchange is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the request headers.
    Start,
    /// The request body is on its way.
    RequestBody,
    /// Routed; the request trailers or the response may come.
    Routed,
    /// The response headers are answered; its body may come.
    ResponseBody,
    /// Nothing more to do (answered with an immediate response, or the response ended).
    Done,
}

/// Where the decision goes: in the answer to the body, or (full duplex, or a request
/// without a body) in the answer to the headers, followed by the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    BodyAnswer,
    HeadersAnswer { trailers: bool },
}

/// A routed request: its hold and what its response headers say.
#[derive(Debug)]
struct Routed {
    hold: RequestHold,
    replica: Arc<Replica>,
    metrics: Arc<PodMetrics>,
    decision: Decision,
}

/// One ext_proc stream's state.
#[derive(Debug)]
pub struct Exchange {
    state: Arc<AppState>,
    dialect: Dialect,
    /// Set by the first message.
    modes: Option<Modes>,
    phase: Phase,
    endpoint: Option<Endpoint>,
    headers: HeaderMap,
    request_id: HeaderValue,
    /// The model the body named, for the counts of a refusal.
    model: String,
    subset: Subset,
    body: BytesMut,
    permit: Option<AdmissionPermit>,
    routed: Option<Routed>,
}

impl Exchange {
    pub fn new(state: Arc<AppState>, dialect: Dialect) -> Self {
        Exchange {
            state,
            dialect,
            modes: None,
            phase: Phase::Start,
            endpoint: None,
            headers: HeaderMap::new(),
            request_id: HeaderValue::from_static(""),
            model: String::new(),
            subset: Subset::Any,
            body: BytesMut::new(),
            permit: None,
            routed: None,
        }
    }

    /// The answers to one message (none while a full-duplex body is still arriving, or
    /// once done); an error closes the stream (Envoy then fails the request, or lets it pass
    /// unprocessed with `failure_mode_allow`).
    pub async fn handle(
        &mut self,
        message: ProcessingRequest,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        // Observability mode: Envoy ignores every answer, and the request is not held up
        // for a decision, so there is nothing to route.
        if message.observability_mode {
            return Ok(Vec::new());
        }
        let modes = *self
            .modes
            .get_or_insert_with(|| Modes::of(message.protocol_config.as_ref(), self.dialect));
        if let Some(subset) = Subset::from_metadata(message.metadata_context.as_ref()) {
            self.subset = subset;
        }
        let Some(request) = message.request else {
            return Err(Status::invalid_argument(
                "a ProcessingRequest without request headers, body or trailers",
            ));
        };
        if self.phase == Phase::Done {
            return Ok(Vec::new());
        }
        match request {
            Message::RequestHeaders(headers) => self.request_headers(headers, modes).await,
            Message::RequestBody(body) => self.request_body(body, modes).await,
            Message::RequestTrailers(_) => self.request_trailers(modes).await,
            Message::ResponseHeaders(headers) => self.response_headers(&headers),
            Message::ResponseBody(body) => Ok(self.response_body(body, modes)),
            Message::ResponseTrailers(_) => Ok(self.response_end(trailers_answer(false))),
        }
    }

    /// The stream ended cleanly (Envoy half-closed it). After the response headers that is
    /// the response's end, when Envoy was not sending the response body; earlier, the
    /// request never completed, and its hold is only dropped.
    pub fn end(&mut self) {
        if matches!(self.phase, Phase::ResponseBody)
            && let Some(routed) = self.routed.as_mut()
        {
            routed.hold.finish(true);
        }
        self.routed = None;
        self.phase = Phase::Done;
    }

    async fn request_headers(
        &mut self,
        message: HttpHeaders,
        modes: Modes,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        if self.phase != Phase::Start {
            return Err(Status::failed_precondition(
                "request headers arrived twice on one ext_proc stream",
            ));
        }
        let head = wire::head(message.headers.as_ref());
        self.request_id = headers::request_id(&head.headers);
        self.headers = head.headers;
        let path = head.path.split('?').next().unwrap_or_default();
        let endpoint = match (head.method.as_str(), path) {
            ("POST", "/v1/chat/completions") => Endpoint::ChatCompletions,
            ("POST", "/v1/completions") => Endpoint::Completions,
            ("POST", "/v1/embeddings") => Endpoint::Embeddings,
            ("GET", "/v1/models") => return Ok(vec![self.models()]),
            (method, path) => {
                let unknown = GatewayError::UnknownPath(format!("{method} {path}"));
                return Ok(vec![self.refuse(unknown.into())]);
            }
        };
        self.endpoint = Some(endpoint);
        match self
            .state
            .admission
            .admit(&self.headers, &self.state.metrics)
        {
            Ok(permit) => self.permit = Some(permit),
            Err(error) => return Ok(vec![self.refuse(error.into())]),
        }
        let limit = self.state.settings.max_body_bytes;
        let declared = self
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > limit as u64) {
            return Ok(vec![
                self.refuse(GatewayError::BodyTooLarge { limit }.into()),
            ]);
        }
        if message.end_of_stream {
            // No body: routed (or, the body being required, refused) on an empty one.
            return Ok(self
                .body_complete(Place::HeadersAnswer { trailers: false })
                .await);
        }
        self.phase = Phase::RequestBody;
        Ok(self.before_the_body(modes))
    }

    /// The answer to the request headers of a request whose body is on its way: at once
    /// when Envoy waits for it (with a mode override when the body would come streamed),
    /// nothing yet in full duplex.
    fn before_the_body(&mut self, modes: Modes) -> Vec<ProcessingResponse> {
        let unrouted = || {
            headers_answer(
                true,
                wire::common(self.dialect.unrouted_request_headers(), true),
            )
        };
        match modes.request {
            BodyMode::Buffered | BodyMode::BufferedPartial => vec![unrouted()],
            BodyMode::FullDuplex => Vec::new(),
            BodyMode::Streamed => match modes.buffering_override() {
                Some(mode) => {
                    // Whether Envoy honours it shows in the body: whole (with its end) or
                    // in pieces (the override ignored).
                    self.modes = Some(Modes {
                        request: BodyMode::Buffered,
                        told: false,
                        ..modes
                    });
                    let mut answer = unrouted();
                    answer.mode_override = Some(mode);
                    vec![answer]
                }
                None => vec![self.refuse(Refusal::Misconfigured(STREAMED_BODY.to_owned()))],
            },
            BodyMode::None | BodyMode::Grpc => {
                vec![self.refuse(Refusal::Misconfigured(
                "prefixgate's ext_proc routes on the request body, which this Envoy does not \
                 send: set the request body mode to BUFFERED (AIBrix) or FULL_DUPLEX_STREAMED \
                 (Inference Extension)"
                    .to_owned(),
            ))]
            }
        }
    }

    async fn request_body(
        &mut self,
        message: HttpBody,
        modes: Modes,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        if self.phase != Phase::RequestBody {
            return Err(Status::failed_precondition(
                "a request body chunk outside the request body",
            ));
        }
        let limit = self.state.settings.max_body_bytes;
        if self.body.len() + message.body.len() > limit {
            return Ok(vec![
                self.refuse(GatewayError::BodyTooLarge { limit }.into()),
            ]);
        }
        self.body.extend_from_slice(&message.body);
        let end = message.end_of_stream;
        Ok(match modes.request {
            BodyMode::FullDuplex if end => {
                self.body_complete(Place::HeadersAnswer { trailers: false })
                    .await
            }
            BodyMode::FullDuplex => Vec::new(),
            // Told BUFFERED: a body without its end is whole, the trailers follow.
            BodyMode::Buffered if end || modes.told => self.body_complete(Place::BodyAnswer).await,
            BodyMode::BufferedPartial if end => self.body_complete(Place::BodyAnswer).await,
            BodyMode::BufferedPartial => {
                vec![self.refuse(Refusal::Gateway(
                GatewayError::BodyRead(
                    "the request body is larger than Envoy's buffer (BUFFERED_PARTIAL sent only \
                     its start); raise the listener's buffer limit or send smaller bodies"
                        .to_owned(),
                ),
            ))]
            }
            _ => vec![self.refuse(Refusal::Misconfigured(STREAMED_BODY.to_owned()))],
        })
    }

    async fn request_trailers(&mut self, modes: Modes) -> Result<Vec<ProcessingResponse>, Status> {
        match self.phase {
            Phase::RequestBody if modes.request == BodyMode::FullDuplex => Ok(self
                .body_complete(Place::HeadersAnswer { trailers: true })
                .await),
            Phase::Routed => Ok(vec![trailers_answer(true)]),
            _ => Err(Status::failed_precondition(
                "request trailers outside the request",
            )),
        }
    }

    /// The whole request body is here: prepare, pick, and answer where the decision goes.
    async fn body_complete(&mut self, place: Place) -> Vec<ProcessingResponse> {
        let body = self.body.split().freeze();
        if let Err(refusal) = self.route(&body).await {
            return vec![self.refuse(refusal)];
        }
        let Some(routed) = self.routed.as_ref() else {
            return Vec::new();
        };
        self.phase = Phase::Routed;
        let authority = routed.replica.authority();
        let mut set =
            self.dialect
                .routed_request_headers(authority, &routed.decision, &self.request_id);
        let metadata = self.dialect.routed_metadata(authority);
        let echo = matches!(place, Place::HeadersAnswer { .. }) && !body.is_empty();
        if echo {
            // Envoy drops the client's length when the body is streamed back; the body is
            // the client's, unchanged, so its length is known.
            set.push(set_header(
                http::header::CONTENT_LENGTH.as_str(),
                body.len().to_string().as_bytes(),
            ));
        }
        let decided = wire::common(set, true);
        let mut answers = Vec::new();
        match place {
            Place::BodyAnswer => answers.push(body_answer(true, decided)),
            Place::HeadersAnswer { trailers } => {
                answers.push(headers_answer(true, decided));
                if echo {
                    answers.extend(
                        wire::streamed_chunks(&body, !trailers)
                            .into_iter()
                            .map(|chunk| body_answer(true, chunk)),
                    );
                }
                if trailers {
                    answers.push(trailers_answer(true));
                }
            }
        }
        if let Some(first) = answers.first_mut() {
            first.dynamic_metadata = metadata;
        }
        answers
    }

    /// Prepares and picks as the HTTP front end does; the request's hold is kept here.
    async fn route(&mut self, body: &Bytes) -> Result<(), Refusal> {
        let state = Arc::clone(&self.state);
        let endpoint = self.endpoint.unwrap_or(Endpoint::ChatCompletions);
        let mut prepared = prepare(&state, endpoint, &self.headers, body, &mut self.model).await?;
        let subset = &self.subset;
        let eligible = |replica: &Arc<Replica>| subset.admits(replica);
        let picked = pick_among(
            &state,
            prepared.strategy,
            &prepared.fields,
            prepared.tokens_to_hash(),
            None,
            headers::session(&self.headers),
            &eligible,
        );
        let picked = match picked {
            Ok(picked) => picked,
            Err(error) => {
                prepared.refund_tokens();
                return Err(error.into());
            }
        };
        let mut hold = RequestHold::new(
            picked.guard,
            Completion {
                metrics: Arc::clone(&picked.metrics),
                sent_at: Instant::now(),
                clock: state.clock,
            },
        )
        .with_ticket(picked.ticket)
        .with_token_hold(prepared.tokens);
        if let Some(permit) = self.permit.take() {
            hold = hold.with_permit(permit);
        }
        self.routed = Some(Routed {
            hold,
            replica: picked.replica,
            metrics: picked.metrics,
            decision: picked.decision,
        });
        Ok(())
    }

    fn response_headers(
        &mut self,
        message: &HttpHeaders,
    ) -> Result<Vec<ProcessingResponse>, Status> {
        let Some(routed) = self.routed.as_mut() else {
            // Not routed here (Envoy let the request pass without a decision): nothing to add.
            return Ok(vec![headers_answer(false, CommonResponse::default())]);
        };
        if self.phase != Phase::Routed {
            return Err(Status::failed_precondition(
                "response headers arrived twice on one ext_proc stream",
            ));
        }
        let head = wire::head(message.headers.as_ref());
        let status = head.status.unwrap_or(0);
        routed.metrics.record_request(&self.model, status);
        if !(200..300).contains(&status) {
            // The replica answered with an error: it generated nothing.
            routed.hold.refund_tokens();
        }
        let set = self.dialect.response_headers(
            &self.request_id,
            &routed.decision,
            routed.replica.authority(),
        );
        let answer = headers_answer(false, wire::common(set, false));
        if message.end_of_stream {
            return Ok(self.response_end(answer));
        }
        self.phase = Phase::ResponseBody;
        Ok(vec![answer])
    }

    fn response_body(&mut self, message: HttpBody, modes: Modes) -> Vec<ProcessingResponse> {
        let chunk = Bytes::from(message.body);
        if let Some(routed) = self.routed.as_mut() {
            routed.hold.observe(&chunk);
        }
        let answers: Vec<ProcessingResponse> = if modes.response == BodyMode::FullDuplex {
            wire::streamed_chunks(&chunk, message.end_of_stream)
                .into_iter()
                .map(|chunk| body_answer(false, chunk))
                .collect()
        } else {
            vec![body_answer(false, CommonResponse::default())]
        };
        if message.end_of_stream {
            self.finish_response();
        }
        answers
    }

    /// The response ended with `answer` (to its headers, last body chunk or trailers).
    fn response_end(&mut self, answer: ProcessingResponse) -> Vec<ProcessingResponse> {
        self.finish_response();
        vec![answer]
    }

    fn finish_response(&mut self) {
        if let Some(routed) = self.routed.as_mut() {
            routed.hold.finish(true);
        }
        self.phase = Phase::Done;
    }

    /// `GET /v1/models`, answered by the gateway as on its HTTP front end.
    fn models(&mut self) -> ProcessingResponse {
        if let Err(error) = self.state.admission.authenticate(&self.headers) {
            return self.refuse(error.into());
        }
        self.phase = Phase::Done;
        let body = model_list(&self.state.replicas).to_string();
        immediate(ImmediateResponse {
            status: Some(HttpStatus { code: 200 }),
            headers: Some(
                envoy_types::pb::envoy::service::ext_proc::v3::HeaderMutation {
                    set_headers: vec![set_header(
                        http::header::CONTENT_TYPE.as_str(),
                        b"application/json",
                    )],
                    remove_headers: Vec::new(),
                },
            ),
            body: body.into_bytes(),
            ..Default::default()
        })
    }

    /// Answers with the refusal, counted as the HTTP front end counts its own.
    fn refuse(&mut self, refusal: Refusal) -> ProcessingResponse {
        let status = refusal.status(self.dialect);
        tracing::debug!(?refusal, request_id = ?self.request_id, "ext_proc request refused");
        self.state
            .metrics
            .record_request(&self.model, "", status.as_u16());
        self.phase = Phase::Done;
        self.permit = None;
        immediate(self.dialect.refusal(&refusal, &self.request_id))
    }
}

/// Why a streamed request body cannot be routed.
const STREAMED_BODY: &str = "prefixgate's ext_proc routes on the whole request body, and this \
    Envoy streams it: set the request body mode to BUFFERED (AIBrix) or FULL_DUPLEX_STREAMED \
    (Inference Extension), or set allow_mode_override so that prefixgate can ask for BUFFERED";

fn answer(response: Answer) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

fn immediate(response: ImmediateResponse) -> ProcessingResponse {
    answer(Answer::ImmediateResponse(response))
}

/// The answer to the request's (`request`) or the response's headers.
fn headers_answer(request: bool, common: CommonResponse) -> ProcessingResponse {
    let headers = HeadersResponse {
        response: Some(common),
    };
    answer(if request {
        Answer::RequestHeaders(headers)
    } else {
        Answer::ResponseHeaders(headers)
    })
}

/// The answer to a chunk of the request's (`request`) or the response's body.
fn body_answer(request: bool, common: CommonResponse) -> ProcessingResponse {
    let body = BodyResponse {
        response: Some(common),
    };
    answer(if request {
        Answer::RequestBody(body)
    } else {
        Answer::ResponseBody(body)
    })
}

/// The answer to the request's (`request`) or the response's trailers.
fn trailers_answer(request: bool) -> ProcessingResponse {
    let trailers = TrailersResponse::default();
    answer(if request {
        Answer::RequestTrailers(trailers)
    } else {
        Answer::ResponseTrailers(trailers)
    })
}
