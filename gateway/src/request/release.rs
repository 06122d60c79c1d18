//! Step 6 of the request path: stream the upstream body back and release the pod.
//!
//! [`GuardedBody`] wraps the upstream response body and is handed to the server as the
//! client's response body, so frames flow one at a time with the client's own backpressure
//! (no task, no channel). It owns the request's [`InFlight`]: the guard is released
//! when the upstream body ends, when it fails, or when the server drops the body because the
//! client went away. Dropping the body also drops the upstream connection, which cancels the
//! request on the replica. The admission permit and the tenant's token charge ride along
//! and are released with the guard; the charge reads each frame for the replica's `usage`,
//! so the tenant is settled to the tokens actually used.
//!
//! Failure after the response began cannot change the status any more. For an SSE response
//! the failure becomes one `data: {"error":…}` event followed by `data: [DONE]`, so OpenAI
//! clients see a clean end; for other responses the body errors and the connection is cut,
//! so the client sees a truncated body rather than a silently short one.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use router_core::InFlight;
use tokio::time::{Instant, Sleep};

use crate::admit::request_cost::UsageScan;
use crate::admit::{AdmissionPermit, TokenHold};
use crate::clock::Clock;
use crate::cluster::SharedTicket;
use crate::metrics::Metrics;
use crate::request::error::openai_error;

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
}

/// What to record when the body finishes.
#[derive(Debug)]
pub struct Completion {
    pub metrics: Metrics,
    pub pod: String,
    /// When the request was sent upstream.
    pub sent_at: Instant,
    /// The router's clock, for the request's lifecycle (first byte, end).
    pub clock: Clock,
}

#[derive(Debug)]
enum Phase {
    Streaming,
    /// The SSE error event and `[DONE]` still to send after a mid-stream failure.
    Tail(VecDeque<Bytes>),
    Done,
}

/// The client's response body: the upstream body plus the request's outstanding guard.
#[derive(Debug)]
pub struct GuardedBody<B> {
    inner: B,
    /// The request's lifecycle in the router's load view: first byte, then end (with the
    /// replica's usage) or drop, which releases the pod.
    guard: Option<InFlight>,
    /// The replica's `usage` as the body reports it, for the lifecycle's end.
    usage: UsageScan,
    /// The request's place under the admission caps, given back with the guard.
    permit: Option<AdmissionPermit>,
    /// The request's messages to the other gateways (cluster sharing): first byte, release.
    ticket: Option<SharedTicket>,
    /// The tokens charged to the request's tenant: fed the body's frames to find `usage`,
    /// and settled when released with the guard.
    tokens: Option<TokenHold>,
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
    /// Whether the last byte sent ended an SSE event, so an error event starts cleanly.
    at_event_boundary: bool,
    first_frame_seen: bool,
    completion: Option<Completion>,
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
            inner,
            guard: Some(guard),
            usage: UsageScan::default(),
            permit: None,
            ticket: None,
            tokens: None,
            phase: Phase::Streaming,
            sse,
            idle,
            first_token: idle,
            idle_timer: None,
            timer_armed: false,
            at_event_boundary: true,
            first_frame_seen: false,
            completion: Some(completion),
        }
    }

    /// Waits at most `limit` for the body's first frame (the idle limit by default).
    pub fn with_first_token_limit(mut self, limit: Duration) -> Self {
        self.first_token = limit;
        self
    }

    /// Holds `permit` until the body ends, like the outstanding guard.
    pub fn with_permit(mut self, permit: AdmissionPermit) -> Self {
        self.permit = Some(permit);
        self
    }

    /// Holds the request's cluster ticket until the body ends, telling the other gateways
    /// of its first byte and its release.
    pub fn with_ticket(mut self, ticket: Option<SharedTicket>) -> Self {
        self.ticket = ticket;
        self
    }

    /// Holds the tenant's token charge until the body ends, settling it to the `usage` the
    /// body reports.
    pub fn with_token_hold(mut self, tokens: Option<TokenHold>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Releases the guard, the permit and the token charge and records the total time, once.
    /// `complete`: the body ended well, so the request's end (and its usage) is recorded in
    /// the load view; after a failure the guard is only dropped.
    fn finish(&mut self, complete: bool) {
        if let Some(guard) = self.guard.take()
            && complete
            && let Some(c) = &self.completion
        {
            guard.end(c.clock.now_ms(), self.usage.router_usage());
        }
        self.ticket = None;
        self.permit = None;
        self.tokens = None;
        if let Some(completion) = self.completion.take() {
            completion
                .metrics
                .observe_total(&completion.pod, completion.sent_at.elapsed());
        }
    }

    fn pod(&self) -> String {
        self.completion
            .as_ref()
            .map(|c| c.pod.clone())
            .unwrap_or_default()
    }

    /// Ends the stream after a failure: an SSE error tail, or a body error.
    fn fail(&mut self, error: StreamError) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        tracing::warn!(%error, "response stream failed");
        self.finish(false);
        if !self.sse {
            self.phase = Phase::Done;
            return Poll::Ready(Some(Err(error)));
        }
        let body = openai_error(
            http::StatusCode::BAD_GATEWAY,
            &error.to_string(),
            "upstream_stream_failed",
            None,
        );
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
        match this.phase {
            Phase::Done => return Poll::Ready(None),
            Phase::Tail(_) => return this.next_tail_frame(),
            Phase::Streaming => {}
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.timer_armed = false;
                if let Some(data) = frame.data_ref() {
                    if !data.is_empty() {
                        this.at_event_boundary = data.ends_with(b"\n\n");
                    }
                    this.usage.observe(data);
                    if let Some(tokens) = this.tokens.as_mut() {
                        tokens.observe(data);
                    }
                    if !this.first_frame_seen {
                        this.first_frame_seen = true;
                        // The replica has prefilled this request: its blocks stop counting
                        // as pending prefill in the load view (`prefix-load` reads it).
                        if let Some(guard) = this.guard.as_mut()
                            && let Some(c) = &this.completion
                        {
                            guard.first_byte(c.clock.now_ms());
                        }
                        if let Some(ticket) = this.ticket.as_mut() {
                            ticket.first_byte();
                        }
                        if let Some(c) = &this.completion {
                            c.metrics.observe_ttft(&c.pod, c.sent_at.elapsed());
                        }
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                let pod = this.pod();
                this.fail(StreamError::Upstream {
                    pod,
                    reason: error.to_string(),
                })
            }
            Poll::Ready(None) => {
                this.finish(true);
                this.phase = Phase::Done;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let limit = if this.first_frame_seen {
                    this.idle
                } else {
                    this.first_token
                };
                if !this.timer_armed {
                    this.timer_armed = true;
                    let deadline = Instant::now() + limit;
                    match this.idle_timer.as_mut() {
                        Some(timer) => timer.as_mut().reset(deadline),
                        None => {
                            this.idle_timer = Some(Box::pin(tokio::time::sleep_until(deadline)))
                        }
                    }
                }
                if let Some(timer) = this.idle_timer.as_mut()
                    && timer.as_mut().poll(cx).is_ready()
                {
                    let pod = this.pod();
                    let error = if this.first_frame_seen {
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
                    return this.fail(error);
                }
                Poll::Pending
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
            self.inner.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};
    use router_core::PodLoad;

    type Chunks = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, String>>>>;

    fn upstream(chunks: Vec<Result<&'static str, &'static str>>) -> Chunks {
        let frames: Vec<Result<Frame<Bytes>, String>> = chunks
            .into_iter()
            .map(|c| {
                c.map(|s| Frame::data(Bytes::from_static(s.as_bytes())))
                    .map_err(str::to_owned)
            })
            .collect();
        StreamBody::new(stream::iter(frames))
    }

    fn completion() -> Completion {
        Completion {
            metrics: Metrics::new().unwrap(),
            pod: "a".into(),
            sent_at: Instant::now(),
            clock: Clock::new(),
        }
    }

    #[tokio::test]
    async fn releases_once_at_the_end_of_a_good_stream() {
        let load = PodLoad::new();
        let body = GuardedBody::new(
            upstream(vec![Ok("data: 1\n\n"), Ok("data: [DONE]\n\n")]),
            load.acquire(),
            true,
            Duration::from_secs(5),
            completion(),
        );
        assert_eq!(load.outstanding(), 1);
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: 1\n\ndata: [DONE]\n\n");
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test]
    async fn sse_failure_becomes_an_error_event_then_done() {
        let load = PodLoad::new();
        let body = GuardedBody::new(
            upstream(vec![Ok("data: 1\n\ndata: par"), Err("connection reset")]),
            load.acquire(),
            true,
            Duration::from_secs(5),
            completion(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.starts_with("data: 1\n\ndata: par\n\ndata: {\"error\":"),
            "{text}"
        );
        assert!(text.contains("connection reset"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test]
    async fn non_sse_failure_is_a_body_error() {
        let load = PodLoad::new();
        let body = GuardedBody::new(
            upstream(vec![Ok("{\"a\":"), Err("reset")]),
            load.acquire(),
            false,
            Duration::from_secs(5),
            completion(),
        );
        assert!(body.collect().await.is_err());
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test]
    async fn the_first_chunk_ends_pending_prefill_and_the_end_releases_the_rest() {
        let load = PodLoad::new();
        let guard = load.acquire_work(router_core::load::RequestWork {
            blocks: 10,
            prefill_blocks: 4,
            shared_prefix: None,
            copies_prefix: false,
        });
        let mut body = GuardedBody::new(
            upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
            guard,
            true,
            Duration::from_secs(5),
            completion(),
        );
        assert_eq!(
            (load.pending_prefill_blocks(), load.active_blocks()),
            (4, 10)
        );
        body.frame().await.unwrap().unwrap();
        assert_eq!(
            (load.pending_prefill_blocks(), load.active_blocks()),
            (0, 10)
        );
        assert_eq!(load.outstanding(), 1);
        while body.frame().await.is_some() {}
        assert_eq!((load.active_blocks(), load.outstanding()), (0, 0));
    }

    #[tokio::test]
    async fn dropping_the_body_mid_stream_releases() {
        let load = PodLoad::new();
        let mut body = GuardedBody::new(
            upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
            load.acquire(),
            true,
            Duration::from_secs(5),
            completion(),
        );
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "data: 1\n\n");
        assert_eq!(load.outstanding(), 1);
        drop(body);
        assert_eq!(load.outstanding(), 0);
    }

    proptest::proptest! {
        /// Whatever the upstream does and wherever the client stops reading, the pod is
        /// released exactly once, and a fully read SSE stream always ends with `[DONE]`.
        #[test]
        fn releases_exactly_once_whatever_happens(
            chunks in proptest::collection::vec(proptest::option::weighted(0.8, "[a-z]{0,8}"), 0..8),
            read in 0usize..10,
            sse in proptest::bool::ANY,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            runtime.block_on(async {
                let load = PodLoad::new();
                let frames: Vec<Result<Frame<Bytes>, String>> = chunks
                    .iter()
                    .map(|c| match c {
                        Some(text) => Ok(Frame::data(Bytes::from(format!("data: {text}\n\n")))),
                        None => Err("reset".to_owned()),
                    })
                    .collect();
                let mut body = GuardedBody::new(
                    StreamBody::new(stream::iter(frames)),
                    load.acquire(),
                    sse,
                    Duration::from_secs(5),
                    completion(),
                );
                let mut seen = Vec::new();
                let mut ended = false;
                for _ in 0..read {
                    match body.frame().await {
                        Some(Ok(frame)) => seen.extend_from_slice(&frame.into_data().unwrap()),
                        Some(Err(_)) | None => {
                            ended = true;
                            break;
                        }
                    }
                }
                let failed = chunks.iter().any(Option::is_none);
                if ended && sse && failed {
                    proptest::prop_assert!(seen.ends_with(b"data: [DONE]\n\n"));
                }
                // Released by the end of the stream (or its failure), before the body drops.
                proptest::prop_assert!(load.outstanding() <= 1);
                if ended {
                    proptest::prop_assert_eq!(load.outstanding(), 0);
                }
                drop(body);
                proptest::prop_assert_eq!(load.outstanding(), 0);
                Ok(())
            })?;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_charge_settles_to_the_streamed_usage_when_the_body_ends() {
        use crate::admit::{Admission, AdmissionConfig};
        use router_core::text::Endpoint;
        let admission = Admission::new(AdmissionConfig {
            tenant_tokens_per_second: 1,
            tenant_token_burst: 1_000,
            ..AdmissionConfig::default()
        })
        .unwrap();
        let body = br#"{"model":"m","prompt":"abcdabcd","max_tokens":500}"#;
        let fields = router_core::text::routing_fields(Endpoint::Completions, body).unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert("x-tenant", "B".parse().unwrap());
        let metrics = Metrics::new().unwrap();
        let charge = || {
            admission
                .charge_tokens(&headers, Endpoint::Completions, body, &fields, &metrics)
                .unwrap()
        };
        let load = PodLoad::new();
        let stream = GuardedBody::new(
            upstream(vec![
                Ok("data: {\"choices\":[{\"text\":\"x\"}]}\n\n"),
                Ok("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":30}}\n\n"),
                Ok("data: [DONE]\n\n"),
            ]),
            load.acquire(),
            true,
            Duration::from_secs(5),
            completion(),
        )
        .with_token_hold(charge());
        assert_eq!(admission.token_level("B"), Some(498.0));
        stream.collect().await.unwrap();
        assert_eq!(
            admission.token_level("B"),
            Some(968.0),
            "settled to 32 used"
        );

        // A client that leaves before the usage chunk leaves the estimate charged.
        let mut stream = GuardedBody::new(
            upstream(vec![Ok("data: 1\n\n"), Ok("data: 2\n\n")]),
            load.acquire(),
            true,
            Duration::from_secs(5),
            completion(),
        )
        .with_token_hold(charge());
        stream.frame().await.unwrap().unwrap();
        drop(stream);
        assert_eq!(admission.token_level("B"), Some(466.0));
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_times_out_into_an_error_event() {
        let load = PodLoad::new();
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, String>>());
        let body = GuardedBody::new(
            silent,
            load.acquire(),
            true,
            Duration::from_secs(3),
            completion(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("no first token) within 3000 ms"), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"));
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_token_has_its_own_limit_and_message() {
        // 5 s in the engine's queue, then tokens 1 s apart: within a 10 s first-token limit
        // though past the 3 s idle limit, which only counts once the body has begun.
        let queued_then_silent = StreamBody::new(stream::unfold(0u8, |sent| async move {
            let wait = match sent {
                0 => Duration::from_secs(5),
                1 => Duration::from_secs(1),
                _ => return std::future::pending().await,
            };
            tokio::time::sleep(wait).await;
            Some((
                Ok::<_, String>(Frame::data(Bytes::from("data: x\n\n"))),
                sent + 1,
            ))
        }));
        let load = PodLoad::new();
        let body = GuardedBody::new(
            Box::pin(queued_then_silent),
            load.acquire(),
            true,
            Duration::from_secs(3),
            completion(),
        )
        .with_first_token_limit(Duration::from_secs(10));
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.starts_with("data: x\n\ndata: x\n\n"), "{text}");
        assert!(
            text.contains("sent nothing for 3000 ms mid-response"),
            "{text}"
        );
        // Past the first-token limit, the message says what was waited for.
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, String>>());
        let body = GuardedBody::new(
            silent,
            load.acquire(),
            true,
            Duration::from_secs(3),
            completion(),
        )
        .with_first_token_limit(Duration::from_secs(10));
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("no first token) within 10000 ms"), "{text}");
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test]
    async fn a_body_that_is_whole_at_once_never_makes_a_timer() {
        let load = PodLoad::new();
        let mut body = GuardedBody::new(
            upstream(vec![Ok("{\"ok\":true}")]),
            load.acquire(),
            false,
            Duration::from_secs(3),
            completion(),
        );
        let bytes = (&mut body).collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"{\"ok\":true}");
        assert!(body.idle_timer.is_none());
        assert_eq!(load.outstanding(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_limit_counts_each_wait_not_the_whole_stream() {
        let load = PodLoad::new();
        // Three chunks 2 s apart: 6 s in all, but no single wait reaches the 3 s limit.
        let slow = StreamBody::new(stream::unfold(0u8, |sent| async move {
            if sent == 3 {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
            Some((
                Ok::<_, String>(Frame::data(Bytes::from("data: x\n\n"))),
                sent + 1,
            ))
        }));
        let body = GuardedBody::new(
            Box::pin(slow),
            load.acquire(),
            true,
            Duration::from_secs(3),
            completion(),
        );
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"data: x\n\ndata: x\n\ndata: x\n\n");
        assert_eq!(load.outstanding(), 0);
    }
}
