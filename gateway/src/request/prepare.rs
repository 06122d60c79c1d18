//! Between an admitted request's body and its pick: what routing needs from the body, the
//! strategy, the tenant's token charge and (with KV-event sync) the engine's tokens.
//!
//! Both front ends call [`prepare`] with the request's headers and its whole body, once per
//! request: the HTTP path after reading the body ([`crate::request::inference`]), the Envoy
//! ext_proc path once Envoy has sent the body ([`crate::ext_proc`]). So a request is parsed,
//! charged and refused the same way whichever way it came in.

use http::HeaderMap;
use router_core::Strategy;
use router_core::text::{Endpoint, RoutingFields, Text};

use crate::admit::TokenHold;
use crate::kv_sync::engine_tokens;
use crate::request::error::GatewayError;
use crate::request::{parse, pick};
use crate::state::AppState;

/// A request ready to be routed.
#[derive(Debug)]
pub struct Prepared {
    pub strategy: Strategy,
    pub fields: RoutingFields,
    /// The tenant's token charge, when it is under a token rate.
    pub tokens: Option<TokenHold>,
    /// With KV-event sync, the prompt as the engine tokenized it (hashed instead of the
    /// text, so the hashes meet the engine's `BlockStored` ones).
    pub engine_tokens: Option<Vec<u8>>,
}

impl Prepared {
    /// What the router hashes for the prompt: the engine's tokens, else the body's own
    /// token-id prompt (`None`: the text).
    pub fn tokens_to_hash(&self) -> Option<&[u8]> {
        self.engine_tokens
            .as_deref()
            .or(self.fields.tokens.as_deref())
    }

    /// Gives the tenant's tokens back: no replica ran the request.
    pub fn refund_tokens(&mut self) {
        if let Some(tokens) = self.tokens.take() {
            tokens.refund();
        }
    }
}

/// Parses `body` (sent to `endpoint` with `headers`), chooses the strategy and charges the
/// tenant's tokens. `model` is set as soon as the body names one, so a refusal after that
/// is counted under its model.
pub async fn prepare(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
    model: &mut String,
) -> Result<Prepared, GatewayError> {
    // The strategy decides whether the message text is built; a bad body is still
    // reported before a bad strategy header.
    let strategy = pick::strategy(headers, state.settings.default_strategy, endpoint);
    let text = match &strategy {
        Ok(strategy) if !strategy.uses_prefix_index() => Text::LengthOnly,
        _ => Text::Build,
    };
    let fields = parse::fields(endpoint, body, text)?;
    model.clone_from(&fields.model);
    let strategy = strategy?;
    // Charged once here, before routing, so retries never charge again.
    let tokens = state
        .admission
        .charge_tokens(headers, endpoint, body, &fields, &state.metrics)?;
    let engine_tokens = engine_tokens_for(state, strategy, endpoint, &fields, body).await;
    Ok(Prepared {
        strategy,
        fields,
        tokens,
        engine_tokens,
    })
}

/// With KV-event sync (`engine_tokenize_timeout` set) and a prefix-aware strategy, the
/// prompt as the engine tokenizes it, hashed instead of the text so the hashes meet the
/// engine's `BlockStored` ones; `None` otherwise, or when the engine's `/tokenize` fails.
async fn engine_tokens_for(
    state: &AppState,
    strategy: Strategy,
    endpoint: Endpoint,
    fields: &RoutingFields,
    bytes: &[u8],
) -> Option<Vec<u8>> {
    let timeout = state.settings.engine_tokenize_timeout?;
    // A token-id prompt is already what the engine sees; it is routed by its ids.
    if fields.tokens.is_some() || !strategy.uses_prefix_index() {
        return None;
    }
    // The prompt as the one parse found it in the body: not parsed again.
    let prompt = fields.prompt_span.clone().and_then(|span| bytes.get(span));
    let tokens = match prompt {
        Some(prompt) => {
            engine_tokens::engine_tokens(
                &state.replicas,
                &state.client,
                endpoint,
                &fields.model,
                prompt,
                timeout,
            )
            .await
        }
        None => None,
    };
    if tokens.is_none() {
        // Routed on the text tokenizer instead: its hashes will not meet the engine-fed
        // ones, so the decision may miss a cached prefix.
        state
            .metrics
            .count_routing_error(&fields.model, "tokenize_failed");
    }
    tokens
}
