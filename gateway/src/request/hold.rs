//! What a routed request holds until its response ends, whichever front end carries it.
//!
//! A [`RequestHold`] owns the request's [`InFlight`] (the pod's outstanding count and the
//! request's work in the load view), its admission permit, its cluster ticket and its
//! tenant's token charge. It is fed the response's bytes as they pass
//! ([`RequestHold::observe`]: the first byte, the tokens a stream passes on, the replica's
//! `usage`) and released exactly once ([`RequestHold::finish`], or its drop). The HTTP front
//! end keeps it in the response body ([`crate::request::release::GuardedBody`]), the Envoy
//! ext_proc front end in the ext_proc stream ([`crate::ext_proc`]), so both account for load
//! the same way: outstanding from the decision until the response ends, fails or its client
//! goes away.

use std::sync::Arc;

use bytes::Bytes;
use router_core::InFlight;
use tokio::time::Instant;

use crate::admit::request_cost::UsageScan;
use crate::admit::{AdmissionPermit, TokenHold};
use crate::clock::Clock;
use crate::cluster::SharedTicket;
use crate::metrics::PodMetrics;

/// How an SSE event carrying a chunk begins (vLLM writes one token per chunk).
const SSE_DATA: &[u8] = b"data: ";

/// The searcher for an event that begins after another's end, built once (as the usage
/// scan's).
static NEXT_SSE_DATA: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\ndata: "));

/// The SSE events that begin in `frame`: at its start, and after a newline (inside a JSON
/// string a newline is escaped, so generated text never matches). One that begins across
/// two frames is missed, and the stream clock's next point comes an event later.
fn sse_events(frame: &[u8]) -> u64 {
    u64::from(frame.starts_with(SSE_DATA)) + NEXT_SSE_DATA.find_iter(frame).count() as u64
}

/// What to record when the response finishes.
#[derive(Debug)]
pub struct Completion {
    /// The replica's series (its name, for errors, too).
    pub metrics: Arc<PodMetrics>,
    /// When the request was sent upstream (for ext_proc: when it was routed).
    pub sent_at: Instant,
    /// The router's clock, for the request's lifecycle (first byte, end).
    pub clock: Clock,
}

/// A routed request's hold on its pod, its admission place and its tenant's tokens.
#[derive(Debug)]
pub struct RequestHold {
    /// The request's lifecycle in the router's load view: first byte, then end (with the
    /// replica's usage) or drop, which releases the pod.
    guard: Option<InFlight>,
    /// The replica's `usage` as the response reports it, for the lifecycle's end.
    usage: UsageScan,
    /// The request's place under the admission caps, given back with the guard.
    permit: Option<AdmissionPermit>,
    /// The request's messages to the other gateways (cluster sharing): first byte, release.
    ticket: Option<SharedTicket>,
    /// The tokens charged to the request's tenant: fed the response's bytes to find
    /// `usage`, and settled when released with the guard.
    tokens: Option<TokenHold>,
    first_byte_seen: bool,
    /// Tokens the response has streamed (its SSE events), for its stream clock
    /// ([`InFlight::advance`]); `None` for a response that is not an SSE stream.
    streamed: Option<u64>,
    completion: Option<Completion>,
    /// The router's clock, kept for the replica a resumed stream moves to.
    clock: Clock,
}

impl RequestHold {
    pub fn new(guard: InFlight, completion: Completion) -> Self {
        RequestHold {
            clock: completion.clock,
            guard: Some(guard),
            usage: UsageScan::default(),
            permit: None,
            ticket: None,
            tokens: None,
            first_byte_seen: false,
            streamed: None,
            completion: Some(completion),
        }
    }

    /// Holds `permit` until the response ends, like the outstanding guard.
    pub fn with_permit(mut self, permit: AdmissionPermit) -> Self {
        self.permit = Some(permit);
        self
    }

    /// Holds the request's cluster ticket until the response ends, telling the other
    /// gateways of its first byte and its release.
    pub fn with_ticket(mut self, ticket: Option<SharedTicket>) -> Self {
        self.ticket = ticket;
        self
    }

    /// Holds the tenant's token charge until the response ends, settling it to the `usage`
    /// the response reports.
    pub fn with_token_hold(mut self, tokens: Option<TokenHold>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Gives the tenant's tokens back: the replica answered with an error status, so it
    /// generated nothing.
    pub fn refund_tokens(&mut self) {
        if let Some(tokens) = self.tokens.take() {
            tokens.refund();
        }
    }

    /// Whether a byte of the response body has been seen.
    pub fn first_byte_seen(&self) -> bool {
        self.first_byte_seen
    }

    /// Notes response body bytes on their way to the client: the usage numbers, on the
    /// first bytes the request's first byte (load view, cluster, TTFT), and on a stream the
    /// tokens passed on (its stream clock, and its peers').
    pub fn observe(&mut self, data: &Bytes) {
        self.usage.observe(data);
        if let Some(tokens) = self.tokens.as_mut() {
            tokens.observe(data);
        }
        if !self.first_byte_seen {
            self.first_byte(data);
        }
        if let Some(streamed) = self.streamed.as_mut() {
            let events = sse_events(data);
            if events == 0 {
                return;
            }
            *streamed += events;
            if let Some(guard) = self.guard.as_mut()
                && let Some(c) = &self.completion
                && guard.advance(*streamed, || c.clock.now_ms())
                && let Some(ticket) = self.ticket.as_mut()
            {
                ticket.progress(*streamed);
            }
        }
    }

    /// The response's first bytes, `data`: the replica has prefilled the request.
    fn first_byte(&mut self, data: &Bytes) {
        self.first_byte_seen = true;
        // Its blocks stop counting as pending prefill in the load view (`prefix-load` reads
        // it), and its stream clock starts; the first event is its first token, which
        // `observe` counts with the rest.
        if let Some(guard) = self.guard.as_mut()
            && let Some(c) = &self.completion
        {
            guard.first_byte(c.clock.now_ms());
        }
        if let Some(ticket) = self.ticket.as_mut() {
            ticket.first_byte();
        }
        if let Some(c) = &self.completion {
            c.metrics.observe_ttft(c.sent_at.elapsed());
        }
        self.streamed = data.starts_with(SSE_DATA).then_some(0);
    }

    /// Releases the guard, the permit and the token charge and records the total time, once.
    /// `complete`: the response ended well, so the request's end (and its usage) is recorded
    /// in the load view; after a failure the guard is only dropped.
    pub fn finish(&mut self, complete: bool) {
        if let Some(guard) = self.guard.take()
            && complete
            && let Some(c) = &self.completion
            && let Some(verdict) = guard.end(c.clock.now_ms(), self.usage.router_usage())
        {
            c.metrics.record_cache_report(verdict);
        }
        self.ticket = None;
        self.permit = None;
        self.tokens = None;
        if let Some(completion) = self.completion.take() {
            completion
                .metrics
                .observe_total(completion.sent_at.elapsed());
        }
    }

    /// The request's replica failed mid-answer and a resume is under way: its outstanding
    /// count, its cluster ticket and its time series are released now (the permit and the
    /// token charge stay with the request), so the failed replica carries none of the
    /// continuation's load.
    pub fn leave_replica(&mut self) {
        self.guard = None;
        self.ticket = None;
        if let Some(completion) = self.completion.take() {
            completion
                .metrics
                .observe_total(completion.sent_at.elapsed());
        }
    }

    /// A continuation answered: the request now holds the new replica, whose first byte
    /// and usage are awaited afresh.
    pub fn take_over(
        &mut self,
        guard: InFlight,
        ticket: Option<SharedTicket>,
        metrics: Arc<PodMetrics>,
        sent_at: Instant,
    ) {
        self.leave_replica();
        self.guard = Some(guard);
        self.ticket = ticket;
        self.completion = Some(Completion {
            metrics,
            sent_at,
            clock: self.clock,
        });
        self.usage = UsageScan::default();
        self.first_byte_seen = false;
        self.streamed = None;
    }

    /// The replica's name (empty once finished).
    pub fn pod(&self) -> String {
        self.completion
            .as_ref()
            .map(|c| c.metrics.pod().to_owned())
            .unwrap_or_default()
    }
}
