//! A simulated request in flight: where its record goes, and its lifecycle in its gateway's
//! load view (router-core's `InFlight`), driven by the engine's tokens as the gateway's
//! response body drives it by bytes. The event loop in [`super::cluster`] owns the flights.

use router_core::InFlight;

use super::gateways::{GatewayEvent, Gateways};
use crate::measure::Usage;

/// A submitted request, as the event loop tracks it: where its record goes, its lifecycle in
/// the router's load view (router-core's [`InFlight`], driven here by the engine's tokens as
/// the gateway's response body drives it by bytes: first token, end with the engine's usage),
/// and a chat's answer.
pub(super) struct Flight {
    /// Index into the `Served` list being filled.
    pub(super) slot: usize,
    /// The engine it runs on.
    pub(super) engine: usize,
    /// The gateway that routed it and its lifecycle in that gateway's load view; `None` for
    /// requests sent straight to an engine.
    pub(super) routed: Option<(usize, InFlight)>,
    /// Its number across the cluster, naming it in what its gateway tells the others.
    pub(super) request: u64,
    /// A chat's answer as the engine streams it (its next turn carries it); `None` for
    /// other prompts, which nothing reads back.
    pub(super) answer: Option<String>,
}

impl Flight {
    /// The first token came at `now` (seconds): the request's pending prefill ends, as at the
    /// gateway's first response byte, and the gateway's peers hear of it.
    pub(super) fn first_token(&mut self, gateways: &mut Gateways, now: f64) {
        if let Some((gateway, routed)) = self.routed.as_mut() {
            routed.first_byte(millis(now));
            let event = GatewayEvent::FirstToken {
                request: self.request,
                pod: self.engine,
            };
            gateways.publish(*gateway, event, now);
        }
    }

    /// `tokens` of the answer had come by `now` (the first token was the first): its stream
    /// clock advances, and when it records a point the gateway's peers hear of it.
    pub(super) fn streamed(&mut self, gateways: &mut Gateways, tokens: u64, now: f64) {
        if let Some((gateway, routed)) = self.routed.as_mut()
            && routed.advance(tokens, || millis(now))
        {
            let event = GatewayEvent::Progress {
                request: self.request,
                tokens,
            };
            gateways.publish(*gateway, event, now);
        }
    }

    /// The last token came at `now`: the request ends with the engine's usage and releases
    /// its count exactly then.
    pub(super) fn end(
        &mut self,
        gateways: &mut Gateways,
        now: f64,
        usage: Option<router_core::Usage>,
    ) {
        if let Some((gateway, routed)) = self.routed.take() {
            routed.end(millis(now), usage);
            self.ended(gateways, gateway, now);
        }
    }

    /// The request was cut or refused at `now`: its count is released and it teaches nothing
    /// about the replica's speed.
    pub(super) fn cut(&mut self, gateways: &mut Gateways, now: f64) {
        if let Some((gateway, routed)) = self.routed.take() {
            drop(routed);
            self.ended(gateways, gateway, now);
        }
    }

    /// Its gateway tells the others that it ended.
    fn ended(&self, gateways: &mut Gateways, gateway: usize, now: f64) {
        let event = GatewayEvent::Ended {
            request: self.request,
            pod: self.engine,
        };
        gateways.publish(gateway, event, now);
    }
}

/// A response's usage as the router's load view takes it, as a vLLM started with
/// `--enable-prompt-tokens-details` reports it: `cached_tokens` only when something hit
/// (`prompt_tokens_details` is null otherwise), so the router must know a replica reports
/// them before reading their absence as 0, as it must with vLLM.
pub(super) fn engine_usage(usage: Usage) -> router_core::Usage {
    router_core::Usage {
        prompt_tokens: u64::from(usage.prompt_tokens),
        cached_tokens: usage.cached_tokens.filter(|&c| c > 0).map(u64::from),
        completion_tokens: u64::from(usage.completion_tokens),
    }
}

/// Virtual seconds as the router's milliseconds.
fn millis(seconds: f64) -> u64 {
    (seconds * 1000.0) as u64
}
