//! How Envoy sends this stream's bodies, as far as routing must know, and the one mode
//! override the gateway asks for.
//!
//! Routing needs the whole request body (the model, the prompt) before Envoy picks the
//! upstream, and Envoy takes its routing headers from the last response it gets before the
//! request goes on: in `BUFFERED` mode the answer to the body (whose header mutations apply,
//! the headers not having left yet), in `FULL_DUPLEX_STREAMED` mode the answer to the headers,
//! which the gateway holds back until the body has arrived. In `STREAMED` mode the headers
//! leave before the body is seen, so the gateway answers the headers with a `mode_override`
//! to `BUFFERED` (Envoy honours it with `allow_mode_override: true`).
//!
//! Which mode a stream uses, Envoy says in the first message's `protocol_config` (Envoy 1.34
//! and later); without it the dialect's documented configuration is assumed (AIBrix:
//! request body `BUFFERED`, response body `STREAMED`; the Inference Extension:
//! `FULL_DUPLEX_STREAMED` both ways). A mode override replaces Envoy's whole processing mode
//! for the stream (header modes `DEFAULT` mean `SEND` for headers and `SKIP` for trailers),
//! so it restates the response side as Envoy said it.

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::service::ext_proc::v3::ProtocolConfiguration;

use crate::ext_proc::config::Dialect;

/// How one body travels to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyMode {
    /// Not sent.
    None,
    /// Chunk by chunk, each answered before Envoy goes on.
    Streamed,
    /// Whole, in one message (and refused by Envoy beyond its buffer).
    Buffered,
    /// Whole up to Envoy's buffer, then only that part.
    BufferedPartial,
    /// Chunk by chunk without waiting; the gateway sends the body on itself.
    FullDuplex,
    /// gRPC messages one by one (not implemented by Envoy).
    Grpc,
}

impl BodyMode {
    fn from_wire(mode: i32) -> Option<BodyMode> {
        Some(match BodySendMode::try_from(mode).ok()? {
            BodySendMode::None => BodyMode::None,
            BodySendMode::Streamed => BodyMode::Streamed,
            BodySendMode::Buffered => BodyMode::Buffered,
            BodySendMode::BufferedPartial => BodyMode::BufferedPartial,
            BodySendMode::FullDuplexStreamed => BodyMode::FullDuplex,
            BodySendMode::Grpc => BodyMode::Grpc,
        })
    }

    fn wire(self) -> i32 {
        let mode = match self {
            BodyMode::None => BodySendMode::None,
            BodyMode::Streamed => BodySendMode::Streamed,
            BodyMode::Buffered => BodySendMode::Buffered,
            BodyMode::BufferedPartial => BodySendMode::BufferedPartial,
            BodyMode::FullDuplex => BodySendMode::FullDuplexStreamed,
            BodyMode::Grpc => BodySendMode::Grpc,
        };
        mode as i32
    }
}

/// A stream's body modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modes {
    pub request: BodyMode,
    pub response: BodyMode,
    /// Whether Envoy said so (`protocol_config`) rather than the dialect's default.
    pub told: bool,
    /// Envoy sends a streamed body without waiting for the headers' answer: it ignores any
    /// mode override then.
    pub body_without_waiting: bool,
}

impl Modes {
    /// The modes of a stream whose first message carried `config` (if any).
    pub fn of(config: Option<&ProtocolConfiguration>, dialect: Dialect) -> Modes {
        let assumed = match dialect {
            Dialect::Aibrix => (BodyMode::Buffered, BodyMode::Streamed),
            Dialect::Gie => (BodyMode::FullDuplex, BodyMode::FullDuplex),
        };
        let Some(config) = config else {
            return Modes {
                request: assumed.0,
                response: assumed.1,
                told: false,
                body_without_waiting: false,
            };
        };
        Modes {
            request: BodyMode::from_wire(config.request_body_mode).unwrap_or(assumed.0),
            response: BodyMode::from_wire(config.response_body_mode).unwrap_or(assumed.1),
            told: true,
            body_without_waiting: config.send_body_without_waiting_for_header_response,
        }
    }

    /// The override that has Envoy buffer a request body it would stream, when Envoy can
    /// honour it; the modes the stream then has are `self` with a buffered request body.
    pub fn buffering_override(&self) -> Option<ProcessingMode> {
        if self.request != BodyMode::Streamed || !self.told || self.body_without_waiting {
            return None;
        }
        // Full duplex needs its trailers sent (Envoy refuses it otherwise).
        let response_trailers = if self.response == BodyMode::FullDuplex {
            HeaderSendMode::Send
        } else {
            HeaderSendMode::Default
        };
        Some(ProcessingMode {
            request_header_mode: HeaderSendMode::Default as i32,
            response_header_mode: HeaderSendMode::Send as i32,
            request_body_mode: BodyMode::Buffered.wire(),
            response_body_mode: self.response.wire(),
            request_trailer_mode: HeaderSendMode::Default as i32,
            response_trailer_mode: response_trailers as i32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn told(request: BodySendMode, response: BodySendMode) -> ProtocolConfiguration {
        ProtocolConfiguration {
            request_body_mode: request as i32,
            response_body_mode: response as i32,
            send_body_without_waiting_for_header_response: false,
        }
    }

    #[test]
    fn without_protocol_config_the_dialect_s_configuration_is_assumed() {
        let aibrix = Modes::of(None, Dialect::Aibrix);
        assert_eq!(
            (aibrix.request, aibrix.response, aibrix.told),
            (BodyMode::Buffered, BodyMode::Streamed, false)
        );
        let gie = Modes::of(None, Dialect::Gie);
        assert_eq!(
            (gie.request, gie.response),
            (BodyMode::FullDuplex, BodyMode::FullDuplex)
        );
        let config = told(BodySendMode::BufferedPartial, BodySendMode::None);
        let said = Modes::of(Some(&config), Dialect::Gie);
        assert_eq!(
            (said.request, said.response, said.told),
            (BodyMode::BufferedPartial, BodyMode::None, true)
        );
    }

    #[test]
    fn only_a_streamed_request_body_envoy_waits_on_is_asked_to_buffer() {
        let config = told(BodySendMode::Streamed, BodySendMode::FullDuplexStreamed);
        let over = Modes::of(Some(&config), Dialect::Aibrix)
            .buffering_override()
            .unwrap();
        assert_eq!(over.request_body_mode, BodySendMode::Buffered as i32);
        assert_eq!(
            over.response_body_mode,
            BodySendMode::FullDuplexStreamed as i32
        );
        assert_eq!(over.response_trailer_mode, HeaderSendMode::Send as i32);
        let buffered = told(BodySendMode::Buffered, BodySendMode::Streamed);
        assert!(
            Modes::of(Some(&buffered), Dialect::Aibrix)
                .buffering_override()
                .is_none()
        );
        let mut eager = config;
        eager.send_body_without_waiting_for_header_response = true;
        assert!(
            Modes::of(Some(&eager), Dialect::Aibrix)
                .buffering_override()
                .is_none()
        );
    }
}
