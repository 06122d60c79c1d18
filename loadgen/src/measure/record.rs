//! What happened to one request, as every runner records it.
//!
//! Times are seconds on the phase's clock (engine time: virtual in the simulator, wall time ×
//! time scale in local mode), taken when the event was observed. The record keeps raw
//! timestamps only; [`crate::measure::phase`] derives TTFT, TPOT, E2E and `good` from them in
//! one place.

/// Token counts from the stream's `usage` chunk (the server's counts, never re-tokenised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens` when the server reports it.
    pub cached_tokens: Option<u32>,
}

/// Why a request did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Could not connect or send.
    Connect,
    /// No response, or the stream stalled, within the client's limits.
    Timeout,
    /// A non-200 status (kept in [`RequestRecord::status`]).
    Status,
    /// The stream ended without `[DONE]`, carried an error event, or was not valid SSE.
    StreamBroken,
    /// The stream finished without any content token or without usage.
    Incomplete,
}

/// One request of a phase.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub index: usize,
    pub family: usize,
    /// When the workload scheduled it.
    pub scheduled: f64,
    /// When the runner started sending it (the dispatch lag is `dispatched − scheduled`).
    pub dispatched: f64,
    /// The first SSE chunk with non-empty content.
    pub first_content: Option<f64>,
    /// The last chunk that carried a token.
    pub last_token: Option<f64>,
    /// `[DONE]` or the end of the body.
    pub stream_end: Option<f64>,
    pub usage: Option<Usage>,
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// The `target-pod` response header.
    pub target_pod: Option<String>,
    /// The `x-prefixgate-outstanding` response header.
    pub outstanding_at_selection: Option<u64>,
    pub error: Option<ErrorClass>,
}

impl RequestRecord {
    /// A request that has been scheduled and sent, nothing observed yet.
    pub fn sent(index: usize, family: usize, scheduled: f64, dispatched: f64) -> Self {
        RequestRecord {
            index,
            family,
            scheduled,
            dispatched,
            first_content: None,
            last_token: None,
            stream_end: None,
            usage: None,
            status: None,
            target_pod: None,
            outstanding_at_selection: None,
            error: None,
        }
    }

    /// Success: status 200, no error, a content token, a last token and usage.
    pub fn succeeded(&self) -> bool {
        self.status == Some(200)
            && self.error.is_none()
            && self.first_content.is_some()
            && self.last_token.is_some()
            && self.usage.is_some()
    }

    /// Seconds from dispatch to the first content chunk.
    pub fn ttft(&self) -> Option<f64> {
        self.first_content.map(|t| t - self.dispatched)
    }

    /// Seconds from dispatch to the last token chunk.
    pub fn e2e(&self) -> Option<f64> {
        self.last_token.map(|t| t - self.dispatched)
    }

    /// `(E2E − TTFT) / (completion_tokens − 1)`; 0 for a single-token completion (as vLLM's
    /// benchmark does), `None` without usage or timestamps.
    pub fn tpot(&self) -> Option<f64> {
        let (ttft, e2e, usage) = (self.ttft()?, self.e2e()?, self.usage?);
        if usage.completion_tokens <= 1 {
            return Some(0.0);
        }
        Some((e2e - ttft) / f64::from(usage.completion_tokens - 1))
    }
}
