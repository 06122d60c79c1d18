//! Resume: a streamed answer whose replica fails mid-answer is carried on on another replica,
//! into the same client response.
//!
//! [`plan`] decides per request, before it is forwarded, whether it may be resumed. The
//! response body ([`crate::request::release::GuardedBody`]) then passes the stream through a
//! [`transcript::Transcript`] (whole events only, noting the text and tokens sent). When the
//! upstream breaks (the body errors, or goes silent past the idle limit) after tokens were
//! sent, [`Resume::start`] builds the [`continuation`] and has a [`Reconnect`] route and send
//! it ([`reconnect`]: through the router like any request, the failed replicas excluded);
//! the body swaps the new upstream in and takes the new replica's hold, and the transcript
//! rewrites the continuation's events into the first stream's. At most `max_resumes` per
//! request, each within `deadline`; otherwise the stream ends with an SSE error event, as a
//! break without resume does. Every outcome is counted
//! (`prefixgate_stream_resumes_total{outcome}`).
//!
//! Only the HTTP front end resumes: in ext_proc mode Envoy owns the upstream stream.

pub mod config;
pub mod continuation;
pub mod counting;
pub mod plan;
pub mod reconnect;
pub mod transcript;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::request::pick::Picked;
use config::ResumeSettings;
use plan::Plan;
use transcript::Transcript;

/// A continuation that answered: its body, the pick it came from and when it was sent.
#[derive(Debug)]
pub struct Resumed<B> {
    pub body: B,
    pub picked: Picked,
    pub sent_at: Instant,
}

/// A continuation on its way: routed, sent, up to its response headers.
pub type Reconnecting<B> = Pin<Box<dyn Future<Output = Result<Resumed<B>, String>> + Send>>;

/// Sends a continuation to a replica other than those that failed the request.
pub trait Reconnect<B>: Send {
    /// Routes and sends `body`, `failed_pod` (and every replica failed before) excluded.
    fn reconnect(&mut self, failed_pod: &str, body: Bytes) -> Reconnecting<B>;
}

/// Why a break is not resumed; the stream then ends with an error event.
#[derive(Debug)]
pub enum Refusal {
    /// Nothing was sent yet, or the answer cannot be carried on: the break's own error.
    NotResumable,
    /// The request's resumes are used up.
    Exhausted { max: u32 },
}

/// A resumable response's state: the transcript, the resumes left, a continuation in flight.
pub struct Resume<B> {
    plan: Plan,
    transcript: Transcript,
    settings: ResumeSettings,
    used: u32,
    reconnect: Box<dyn Reconnect<B>>,
    pending: Option<Pin<Box<tokio::time::Timeout<Reconnecting<B>>>>>,
    metrics: Metrics,
}

impl<B> std::fmt::Debug for Resume<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resume")
            .field("transcript", &self.transcript)
            .field("used", &self.used)
            .field("resuming", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> Resume<B> {
    pub fn new(
        plan: Plan,
        settings: ResumeSettings,
        reconnect: Box<dyn Reconnect<B>>,
        metrics: Metrics,
    ) -> Self {
        Resume {
            transcript: Transcript::new(plan.shape, plan.asked),
            plan,
            settings,
            used: 0,
            reconnect,
            pending: None,
            metrics,
        }
    }

    /// One upstream frame in; the whole events it completes out, as the client sees them.
    pub fn pass(&mut self, data: &[u8]) -> Bytes {
        self.transcript.pass(data)
    }

    /// The upstream ended: the rest of an unended event.
    pub fn flush(&mut self) -> Bytes {
        self.transcript.flush()
    }

    /// The upstream broke at `failed_pod`: sends a continuation, or says why not.
    pub fn start(&mut self, failed_pod: &str) -> Result<(), Refusal> {
        let body = self
            .transcript
            .resumable()
            .then(|| continuation::continuation(&self.plan, &self.transcript))
            .flatten();
        let Some(body) = body else {
            self.metrics.record_resume("not_resumable");
            return Err(Refusal::NotResumable);
        };
        if self.used >= self.settings.max_resumes {
            self.metrics.record_resume("exhausted");
            return Err(Refusal::Exhausted {
                max: self.settings.max_resumes,
            });
        }
        self.used += 1;
        let reconnecting = self.reconnect.reconnect(failed_pod, body);
        self.pending = Some(Box::pin(tokio::time::timeout(
            self.settings.deadline,
            reconnecting,
        )));
        Ok(())
    }

    /// The continuation's answer, once it has one: the new upstream (whose events are
    /// rewritten from now on), or why the resume failed.
    pub fn poll_resumed(&mut self, cx: &mut Context<'_>) -> Poll<Result<Resumed<B>, String>> {
        let Some(pending) = self.pending.as_mut() else {
            return Poll::Ready(Err("no resume under way".to_owned()));
        };
        let answer = std::task::ready!(pending.as_mut().poll(cx));
        self.pending = None;
        Poll::Ready(match answer {
            Ok(Ok(resumed)) => {
                self.metrics.record_resume("resumed");
                self.transcript.begin_continuation();
                tracing::info!(
                    pod = resumed.picked.replica.name(),
                    resume = self.used,
                    tokens_sent = self.transcript.produced(),
                    "stream resumed on another replica"
                );
                Ok(resumed)
            }
            Ok(Err(reason)) => {
                self.metrics.record_resume("failed");
                Err(reason)
            }
            Err(_elapsed) => {
                self.metrics.record_resume("deadline");
                Err(format!(
                    "no replica answered the continuation within {} ms",
                    self.settings.deadline.as_millis()
                ))
            }
        })
    }
}
