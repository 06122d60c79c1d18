//! Step 6 of the request path: stream the upstream body back and release the pod.
//!
//! [`GuardedBody`] wraps the upstream response body and is handed to the server as the
//! client's response body, so frames flow one at a time with the client's own backpressure
//! (no task, no channel). It owns the request's [`RequestHold`] (the pod's outstanding guard,
//! the admission permit, the tenant's token charge): the hold is released when the upstream
//! body ends, when it fails, or when the server drops the body because the client went away.
//! Dropping the body also drops the upstream connection, which cancels the request on the
//! replica. Each frame is shown to the hold on its way, for the first byte and the replica's
//! `usage`, so the tenant is settled to the tokens actually used.
//!
//! Failure after the response began cannot change the status any more. For an SSE response
//! the failure becomes one `data: {"error":…}` event followed by `data: [DONE]`, so OpenAI
//! clients see a clean end; for other responses the body errors and the connection is cut,
//! so the client sees a truncated body rather than a silently short one. A shutdown whose
//! drain deadline passes is such a failure too (the `cut` token): the body ends with the
//! event before the listener aborts the connection.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use router_core::InFlight;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::admit::{AdmissionPermit, TokenHold};
use crate::cluster::SharedTicket;
use crate::request::error::openai_error;
pub use crate::request::hold::Completion;
use crate::request::hold::RequestHold;
use crate::request::resume::{Refusal, Resume};

/// Why a response body stopped early.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("replica {pod} failed mid-response: {reason}")]
    Upstream { pod: String, reason: String },
    #[error("replica {pod} sent nothing for {idle_ms} ms mid-response")]
    Idle { pod: String, idle_ms: u128 },
    /// Nothing of the body within the first-token limit of the response headers: the
    /// request waited in the engine's queue or prefill (or generated a whole answer) too long.
    #[error(
        "replica {pod} sent no response body (no first token) within {wait_ms} ms of its headers"
    )]
    FirstToken { pod: String, wait_ms: u128 },
    /// The replica failed mid-answer and carrying the stream on on another one failed.
    #[error("replica {pod} failed mid-response ({cause}) and resuming the stream failed: {reason}")]
    Resume {
        pod: String,
        cause: String,
        reason: String,
    },
    /// The gateway's shutdown passed its drain deadline with the response unfinished.
    #[error("the gateway shut down before replica {pod} finished the response")]
    Cut { pod: String },
}

impl StreamError {
    /// The status and `code` of the SSE error event this failure becomes.
    fn status_and_code(&self) -> (http::StatusCode, &'static str) {
        match self {
            StreamError::Cut { .. } => (
                http::StatusCode::SERVICE_UNAVAILABLE,
                "gateway_shutting_down",
            ),
            _ => (http::StatusCode::BAD_GATEWAY, "upstream_stream_failed"),
        }
    }
}

#[derive(Debug)]
enum Phase {
    Streaming,
    /// The upstream broke at `pod` (with `cause`) and a continuation is on its way.
    Resuming {
        pod: String,
        cause: String,
    },
    /// The SSE error event and `[DONE]` still to send after a mid-stream failure.
    Tail(VecDeque<Bytes>),
    Done,
}

/// The client's response body: the upstream body plus the request's outstanding guard.
#[derive(Debug)]
pub struct GuardedBody<B> {
    /// The upstream body; `None` while a resume waits for its continuation (the broken
    /// upstream is dropped at the break, which cancels the request on a replica that only went
    /// silent).
    inner: Option<B>,
    /// The pod's guard, the admission permit and the token charge, until the body ends.
    hold: RequestHold,
    phase: Phase,
    sse: bool,
    idle: Duration,
    /// The limit on the wait for the body's first frame (queueing and prefill in the
    /// engine), which `idle` then takes over from.
    first_token: Duration,
    /// Made on the first wait only: a small body that is whole when first polled (the usual
    /// non-streamed answer) never allocates or registers a timer.
    idle_timer: Option<Pin<Box<Sleep>>>,
    /// Whether the idle timer measures the current wait (re-armed on the first `Pending`
    /// after each frame, so time the client spends not reading is not counted as upstream
    /// silence).
    timer_armed: bool,
    /// The shutdown's cut, and the wait on it (made on the first wait for the upstream, as
    /// the idle timer).
    cut: Option<CancellationToken>,
    cut_wait: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// Whether the last byte sent ended an SSE event, so an error event starts cleanly.
    at_event_boundary: bool,
    /// For a resumable stream: its transcript and the continuation machinery.
    resume: Option<Box<Resume<B>>>,
    /// The request's span: the first byte and a resume are its events.
    span: tracing::Span,
}

impl<B> GuardedBody<B> {
    pub fn new(
        inner: B,
        guard: InFlight,
        sse: bool,
        idle: Duration,
        completion: Completion,
    ) -> Self {
        GuardedBody {
            inner: Some(inner),
            hold: RequestHold::new(guard, completion),
            phase: Phase::Streaming,
            sse,
            idle,
            first_token: idle,
            idle_timer: None,
            timer_armed: false,
            cut: None,
            cut_wait: None,
            at_event_boundary: true,
            resume: None,
            span: tracing::Span::none(),
        }
    }

    /// Records the first byte and a resume as events of `span` (the request's).
    pub fn with_span(mut self, span: tracing::Span) -> Self {
        self.span = span;
        self
    }

    /// Carries the stream on on another replica when its upstream breaks mid-answer.
    pub fn with_resume(mut self, resume: Option<Resume<B>>) -> Self {
        self.resume = resume.map(Box::new);
        self
    }

    /// Waits at most `limit` for the body's first frame (the idle limit by default).
    pub fn with_first_token_limit(mut self, limit: Duration) -> Self {
        self.first_token = limit;
        self
    }

    /// Holds `permit` until the body ends, like the outstanding guard.
    pub fn with_permit(mut self, permit: AdmissionPermit) -> Self {
        self.hold = self.hold.with_permit(permit);
        self
    }

    /// Holds the request's cluster ticket until the body ends, telling the other gateways
    /// of its first byte and its release.
    pub fn with_ticket(mut self, ticket: Option<SharedTicket>) -> Self {
        self.hold = self.hold.with_ticket(ticket);
        self
    }

    /// Holds the tenant's token charge until the body ends, settling it to the `usage` the
    /// body reports.
    pub fn with_token_hold(mut self, tokens: Option<TokenHold>) -> Self {
        self.hold = self.hold.with_token_hold(tokens);
        self
    }

    /// Ends the body with [`StreamError::Cut`] when `cut` is cancelled (the shutdown's drain
    /// deadline), so a stream ends with an error event before its connection is aborted.
    pub fn with_cut(mut self, cut: CancellationToken) -> Self {
        self.cut = Some(cut);
        self
    }

    fn pod(&self) -> String {
        self.hold.pod()
    }

    /// Ends the stream after a failure: an SSE error tail, or a body error.
    fn fail(&mut self, error: StreamError) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        tracing::warn!(%error, "response stream failed");
        self.hold.finish(false);
        if !self.sse {
            self.phase = Phase::Done;
            return Poll::Ready(Some(Err(error)));
        }
        let (status, code) = error.status_and_code();
        let body = openai_error(status, &error.to_string(), code, None);
        let separator = if self.at_event_boundary { "" } else { "\n\n" };
        let mut tail = VecDeque::with_capacity(2);
        tail.push_back(Bytes::from(format!("{separator}data: {body}\n\n")));
        tail.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.phase = Phase::Tail(tail);
        self.next_tail_frame()
    }

    fn next_tail_frame(&mut self) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        if let Phase::Tail(tail) = &mut self.phase {
            if let Some(bytes) = tail.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
        }
        self.phase = Phase::Done;
        Poll::Ready(None)
    }
}

/// What [`GuardedBody::poll_frame`] does next.
type Step = Option<Poll<Option<Result<Frame<Bytes>, StreamError>>>>;

/// The parts of [`GuardedBody::poll_frame`]: a data frame passing, a wait, a break.
impl<B> GuardedBody<B> {
    /// Notes a data frame on its way to the client: the SSE event boundary, and for the
    /// request's hold the usage numbers and (on the first frame) the first byte.
    fn observe_data(&mut self, data: &Bytes) {
        if !data.is_empty() {
            self.at_event_boundary = data.ends_with(b"\n\n");
        }
        if !self.hold.first_byte_seen() {
            tracing::debug!(parent: &self.span, pod = %self.hold.pod(), "first_byte");
        }
        self.hold.observe(data);
    }

    /// Whether the shutdown's cut has come (registering the wait on it).
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(cut) = &self.cut else {
            return false;
        };
        let wait = self
            .cut_wait
            .get_or_insert_with(|| Box::pin(cut.clone().cancelled_owned()));
        wait.as_mut().poll(cx).is_ready()
    }

    /// The replica sent nothing this poll: arms the first-token or idle timer (created on
    /// the first wait only), and ends the stream at a shutdown's cut or when the timer has
    /// run out (a break, which a resumable stream may survive).
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Step {
        let limit = if self.hold.first_byte_seen() {
            self.idle
        } else {
            self.first_token
        };
        if !self.timer_armed {
            self.timer_armed = true;
            let deadline = Instant::now() + limit;
            match self.idle_timer.as_mut() {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.idle_timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        if self.poll_cut(cx) {
            let pod = self.pod();
            return Some(self.fail(StreamError::Cut { pod }));
        }
        if let Some(timer) = self.idle_timer.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            let pod = self.pod();
            let error = if self.hold.first_byte_seen() {
                StreamError::Idle {
                    pod,
                    idle_ms: limit.as_millis(),
                }
            } else {
                StreamError::FirstToken {
                    pod,
                    wait_ms: limit.as_millis(),
                }
            };
            return self.broke(error);
        }
        Some(Poll::Pending)
    }

    /// The upstream failed mid-answer: a resumable stream sends a continuation (`None`:
    /// carry on polling), any other ends with the failure.
    fn broke(&mut self, error: StreamError) -> Step {
        let Some(resume) = self.resume.as_mut() else {
            return Some(self.fail(error));
        };
        let pod = self.hold.pod();
        match resume.start(&pod) {
            Ok(()) => {
                tracing::warn!(%error, "response stream broke; resuming on another replica");
                self.hold.leave_replica();
                self.inner = None;
                self.phase = Phase::Resuming {
                    pod,
                    cause: error.to_string(),
                };
                None
            }
            Err(Refusal::NotResumable) => Some(self.fail(error)),
            Err(Refusal::Exhausted { max }) => Some(self.fail(StreamError::Resume {
                pod,
                cause: error.to_string(),
                reason: format!("the request's {max} resumes are used up"),
            })),
        }
    }

    /// Waits for the continuation: its upstream is swapped in (`None`: stream it), or the
    /// stream ends with why the resume failed.
    fn poll_resuming(&mut self, cx: &mut Context<'_>) -> Step {
        let Phase::Resuming { pod, cause } = &self.phase else {
            return None;
        };
        let (pod, cause) = (pod.clone(), cause.clone());
        if self.poll_cut(cx) {
            return Some(self.fail(StreamError::Cut { pod }));
        }
        let resume = self.resume.as_mut()?;
        match resume.poll_resumed(cx) {
            Poll::Pending => Some(Poll::Pending),
            Poll::Ready(Ok(resumed)) => {
                self.inner = Some(resumed.body);
                let picked = resumed.picked;
                tracing::info!(
                    parent: &self.span,
                    failed_pod = %pod,
                    pod = picked.replica.name(),
                    "resumed"
                );
                self.hold
                    .take_over(picked.guard, picked.ticket, picked.metrics, resumed.sent_at);
                self.phase = Phase::Streaming;
                self.timer_armed = false;
                None
            }
            Poll::Ready(Err(reason)) => Some(self.fail(StreamError::Resume { pod, cause, reason })),
        }
    }

    /// A data frame as the client gets it: a resumable stream's whole events (`None`: none
    /// complete yet).
    fn through_resume(&mut self, frame: Frame<Bytes>) -> Option<Frame<Bytes>> {
        let Some(resume) = self.resume.as_mut() else {
            return Some(frame);
        };
        match frame.into_data() {
            Ok(data) => {
                let events = resume.pass(&data);
                (!events.is_empty()).then(|| Frame::data(events))
            }
            Err(frame) => Some(frame),
        }
    }

    /// The upstream ended: the request is complete (a resumable stream's unended tail, if
    /// any, still to send).
    fn ended(&mut self) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        self.hold.finish(true);
        let rest = self.resume.as_mut().map(|resume| resume.flush());
        match rest {
            Some(rest) if !rest.is_empty() => {
                self.phase = Phase::Tail(VecDeque::from([rest]));
                self.next_tail_frame()
            }
            _ => {
                self.phase = Phase::Done;
                Poll::Ready(None)
            }
        }
    }

    /// One poll of the upstream body.
    fn poll_upstream(&mut self, cx: &mut Context<'_>) -> Step
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: std::fmt::Display,
    {
        let Some(inner) = self.inner.as_mut() else {
            return Some(self.ended());
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.timer_armed = false;
                let frame = self.through_resume(frame)?;
                if let Some(data) = frame.data_ref() {
                    self.observe_data(data);
                }
                // A body of known length (a plain JSON answer) is whole with its last frame,
                // and the server, seeing its size hint met, drops it without polling for the
                // end: the request ends here, with its usage, or it would only be dropped.
                if self.inner.as_ref().is_none_or(Body::is_end_stream) {
                    self.hold.finish(true);
                    self.phase = Phase::Done;
                }
                Some(Poll::Ready(Some(Ok(frame))))
            }
            Poll::Ready(Some(Err(error))) => {
                let pod = self.pod();
                self.broke(StreamError::Upstream {
                    pod,
                    reason: error.to_string(),
                })
            }
            Poll::Ready(None) => Some(self.ended()),
            Poll::Pending => self.poll_wait(cx),
        }
    }
}

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        // Each turn either answers or moves on: a frame with no whole event yet, a
        // continuation started, or one that answered.
        loop {
            let step = match this.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Tail(_) => return this.next_tail_frame(),
                Phase::Resuming { .. } => this.poll_resuming(cx),
                Phase::Streaming => {
                    // A stream that never waits (tokens back to back) still ends at the cut.
                    if this
                        .cut
                        .as_ref()
                        .is_some_and(CancellationToken::is_cancelled)
                    {
                        let pod = this.pod();
                        return this.fail(StreamError::Cut { pod });
                    }
                    this.poll_upstream(cx)
                }
            };
            if let Some(poll) = step {
                return poll;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    fn size_hint(&self) -> SizeHint {
        // An SSE stream may grow an error tail, so only non-SSE bodies pass the exact size on.
        if self.sse || !matches!(self.phase, Phase::Streaming) {
            SizeHint::default()
        } else {
            self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
        }
    }
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
