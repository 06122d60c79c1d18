//! The live sink for conversations: each session in its own task, sending its turns one after
//! another over HTTP: the first at the session's start, each later one when the previous
//! answer has streamed in plus its think time, carrying that answer (the concatenated
//! `delta.content`s) in its messages. Sessions run side by side, so a slow session never
//! delays another's turn.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinSet;

use super::progress::PhaseProgress;
use super::request::{HttpClient, PhaseClock, chat_messages_body, stream_request_answer};
use super::send::{Sent, unix_now};
use super::target::LiveTarget;
use crate::measure::{RequestRecord, Slo, is_good};
use crate::run::assignment::Assigner;
use crate::workload::{Conversation, Conversations, TurnEnd};

/// What sending a phase's conversations produced: the turns sent, and those never sent
/// because an earlier turn of their session failed.
#[derive(Debug)]
pub struct Conversed {
    pub sent: Sent,
    pub abandoned: usize,
}

/// Sends every session of `source` through the target's gateways with the `routing-strategy`
/// header `strategy`, and waits until every session is over. A session's turns all go through
/// the gateway `assigner` picks for it (in session order).
pub async fn send_conversations(
    client: &HttpClient,
    target: &LiveTarget,
    assigner: &mut Assigner,
    source: Conversations,
    strategy: Option<&'static str>,
    progress: &Arc<PhaseProgress>,
) -> Conversed {
    let lead = Duration::from_millis(50);
    let clock = PhaseClock {
        origin: tokio::time::Instant::now() + lead,
        scale: target.time_scale,
    };
    let unix_origin = unix_now() + lead.as_secs_f64();
    let mut tasks = JoinSet::new();
    for session in source.into_sessions() {
        let session_target = SessionTarget {
            client: client.clone(),
            url: format!(
                "{}/v1/chat/completions",
                target
                    .gateways
                    .get(assigner.next_gateway())
                    .map_or("", |g| g.url.as_str())
            ),
            model: target.model.clone(),
            limit: target.request_limit,
            strategy,
            clock,
        };
        let (progress, slo) = (Arc::clone(progress), target.slo);
        tasks.spawn(async move { run_session(session, &session_target, &progress, &slo).await });
    }
    let mut records = Vec::new();
    let mut abandoned = 0;
    while let Some(done) = tasks.join_next().await {
        // A panicked task is a bug in this crate; its turns count as lost.
        if let Ok((mut session_records, session_abandoned)) = done {
            records.append(&mut session_records);
            abandoned += session_abandoned;
        }
    }
    records.sort_by_key(|r| r.index);
    Conversed {
        sent: Sent {
            records,
            unix_origin,
        },
        abandoned,
    }
}

/// Where one session's turns go.
struct SessionTarget {
    client: HttpClient,
    url: String,
    model: String,
    limit: Duration,
    strategy: Option<&'static str>,
    clock: PhaseClock,
}

/// Runs one session to its end; returns its turns' records and the turns it abandoned.
async fn run_session(
    mut session: Conversation,
    to: &SessionTarget,
    progress: &PhaseProgress,
    slo: &Slo,
) -> (Vec<RequestRecord>, usize) {
    let mut records = Vec::new();
    let mut turn = session.opener();
    while let Some(t) = turn {
        tokio::time::sleep_until(to.clock.instant(t.at)).await;
        progress.sent.fetch_add(1, Ordering::Relaxed);
        let record = RequestRecord::sent(t.index, t.family, t.at, 0.0);
        let body = chat_messages_body(&to.model, &t.messages, t.max_tokens);
        let (record, answer) = stream_request_answer(
            &to.client,
            &to.url,
            body,
            to.strategy,
            to.clock,
            record,
            to.limit,
        )
        .await;
        progress.done.fetch_add(1, Ordering::Relaxed);
        if is_good(&record, slo) {
            progress.good.fetch_add(1, Ordering::Relaxed);
        }
        let end = if record.succeeded() {
            TurnEnd::Answered(&answer)
        } else {
            TurnEnd::Failed
        };
        let ended_at = record.stream_end.unwrap_or_else(|| to.clock.now());
        records.push(record);
        // The session holds exactly this turn in flight, so it cannot refuse the end.
        turn = session.turn_ended(end, ended_at).unwrap_or(None);
    }
    (records, session.abandoned())
}
