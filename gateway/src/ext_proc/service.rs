//! The `envoy.service.ext_proc.v3.ExternalProcessor` service: each `Process` stream is one
//! [`Exchange`], driven message by message.
//!
//! The answers are a stream made from the incoming one, without a task or a channel: the
//! next message is read only once the answers to the last have been taken by the transport,
//! so a slow Envoy slows the exchange (backpressure), and when Envoy goes away (it resets the
//! stream, the connection drops) the transport drops the answer stream and, with it, the
//! exchange and the request's hold. A clean end of the incoming stream ends the exchange;
//! a broken one drops it. At the shutdown's cut (the drain deadline) a stream still open
//! ends with `UNAVAILABLE`.

use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::{Stream, StreamExt, stream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::ext_proc::config::Dialect;
use crate::ext_proc::exchange::Exchange;
use crate::state::AppState;

/// The external processor over the gateway's shared state.
#[derive(Debug, Clone)]
pub struct ExtProcService {
    state: Arc<AppState>,
    dialect: Dialect,
}

impl ExtProcService {
    pub fn new(state: Arc<AppState>, dialect: Dialect) -> Self {
        ExtProcService { state, dialect }
    }
}

/// What the answer stream carries between messages; `None` once it has ended.
type Conversation = Option<(Streaming<ProcessingRequest>, Exchange, CancellationToken)>;

/// Reads one message and answers it: the answers, and what is left of the conversation.
async fn next_answers(
    conversation: Conversation,
) -> Option<(Vec<Result<ProcessingResponse, Status>>, Conversation)> {
    let (mut inbound, mut exchange, cut) = conversation?;
    let message = tokio::select! {
        biased;
        () = cut.cancelled() => {
            let status = Status::unavailable("prefixgate is shutting down");
            return Some((vec![Err(status)], None));
        }
        message = inbound.message() => message,
    };
    match message {
        Ok(Some(message)) => match exchange.handle(message).await {
            Ok(answers) => Some((
                answers.into_iter().map(Ok).collect(),
                Some((inbound, exchange, cut)),
            )),
            Err(status) => {
                tracing::warn!(%status, "ext_proc stream refused");
                Some((vec![Err(status)], None))
            }
        },
        Ok(None) => {
            exchange.end();
            None
        }
        Err(status) => {
            // Envoy reset the stream (its client left) or the connection broke: the
            // exchange, and the request's hold with it, is dropped here.
            tracing::debug!(%status, "ext_proc stream broke");
            None
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let exchange = Exchange::new(Arc::clone(&self.state), self.dialect);
        let conversation = Some((request.into_inner(), exchange, self.state.cut.clone()));
        let answers = stream::unfold(conversation, next_answers).flat_map(stream::iter);
        Ok(Response::new(Box::pin(answers)))
    }
}
