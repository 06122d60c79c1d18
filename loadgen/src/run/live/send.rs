//! The live sink: planned requests sent over HTTP at their scheduled times, each in its own
//! task (so a slow stream never delays the next send), each a streamed chat completion whose
//! record is timed on the phase clock.
//!
//! A request's body is built in its task just before it is sent, so a trace's prompts exist
//! only while they are in flight.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinSet;

use super::progress::PhaseProgress;
use super::request::{HttpClient, PhaseClock, chat_messages_body, stream_request};
use super::target::LiveTarget;
use crate::measure::{RequestRecord, is_good};
use crate::run::assignment::Assigner;
use crate::workload::PlannedRequest;

/// What sending a plan produced.
#[derive(Debug)]
pub struct Sent {
    /// One record per planned request, by index.
    pub records: Vec<RequestRecord>,
    /// Unix seconds of the phase clock's origin (time 0 of the plan).
    pub unix_origin: f64,
}

/// Sends `plan` (in arrival order) to the target's gateways, each request to the gateway
/// `assigner` picks, with the `routing-strategy` header `strategy` (none: the gateway's
/// default), and waits until every request has ended. `progress` counts sends, ends and good
/// requests as they happen.
pub async fn send_planned(
    client: &HttpClient,
    target: &LiveTarget,
    assigner: &mut Assigner,
    plan: Vec<PlannedRequest>,
    strategy: Option<&'static str>,
    progress: &Arc<PhaseProgress>,
) -> Sent {
    // A short lead so the first send is not late by the time spent spawning.
    let lead = Duration::from_millis(50);
    let clock = PhaseClock {
        origin: tokio::time::Instant::now() + lead,
        scale: target.time_scale,
    };
    let unix_origin = unix_now() + lead.as_secs_f64();
    let urls: Vec<String> = target
        .gateways
        .iter()
        .map(|g| format!("{}/v1/chat/completions", g.url))
        .collect();
    let planned = plan.len();
    let mut tasks = JoinSet::new();
    for request in plan {
        tokio::time::sleep_until(clock.instant(request.at)).await;
        let record = RequestRecord::sent(request.index, request.family, request.at, 0.0);
        let Some(url) = urls.get(assigner.next_gateway()).cloned() else {
            // A target without gateways sends nothing; its requests count as lost.
            continue;
        };
        let (client, limit) = (client.clone(), target.request_limit);
        let (progress, slo, model) = (Arc::clone(progress), target.slo, target.model.clone());
        progress.sent.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            let body = chat_messages_body(&model, &request.prompt.messages(), request.max_tokens);
            let record = stream_request(&client, &url, body, strategy, clock, record, limit).await;
            progress.done.fetch_add(1, Ordering::Relaxed);
            if is_good(&record, &slo) {
                progress.good.fetch_add(1, Ordering::Relaxed);
            }
            record
        });
    }
    let mut records = Vec::with_capacity(planned);
    while let Some(done) = tasks.join_next().await {
        // A panicked task is a bug in this crate; its request counts as lost.
        if let Ok(record) = done {
            records.push(record);
        }
    }
    records.sort_by_key(|r| r.index);
    Sent {
        records,
        unix_origin,
    }
}

/// Wall-clock Unix seconds now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
