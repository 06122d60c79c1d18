//! A conversation scenario on the simulated cluster: its sessions driven closed loop, each
//! turn released when the previous one has ended (its answer decoded from the engine's
//! tokens, as a live stream's `delta.content`s concatenate) plus its think time.

use std::collections::HashMap;

use router_core::Strategy;

use super::cluster::{Arrival, Served, SimCluster, SimError, Target};
use crate::measure::Peaks;
use crate::workload::{Conversations, PlannedRequest, Prompt, TurnEnd, TurnRequest};

/// Runs a conversation scenario's sessions closed loop from `t0`: every session's first turn
/// at its start, each later turn when the previous one has ended plus its think time. Returns
/// the turns as served, in request-index order, and the turns never sent because an earlier
/// turn of their session failed (the phase's `dropped`).
pub(super) fn converse(
    cluster: &mut SimCluster,
    route: Strategy,
    mut source: Conversations,
    t0: f64,
    peaks: &mut [Peaks],
) -> Result<(Vec<Served>, usize), SimError> {
    let mut session_of: HashMap<usize, usize> = HashMap::new();
    let arrival = |turn: TurnRequest, session_of: &mut HashMap<usize, usize>| {
        session_of.insert(turn.index, turn.session);
        let request = PlannedRequest {
            index: turn.index,
            family: turn.family,
            at: t0 + turn.at,
            prompt: Prompt::Chat(turn.messages),
            max_tokens: turn.max_tokens,
        };
        Arrival {
            request,
            target: Target::Routed(route),
        }
    };
    let openers: Vec<Arrival> = source
        .openers()
        .into_iter()
        .map(|turn| arrival(turn, &mut session_of))
        .collect();
    let mut ended = |served: &Served, answer: Option<&str>| {
        let record = &served.record;
        let session = session_of.get(&record.index).copied().ok_or_else(|| {
            SimError::Config(format!("request {} belongs to no session", record.index))
        })?;
        let end = answer.map_or(TurnEnd::Failed, TurnEnd::Answered);
        let ended_at = record.stream_end.unwrap_or(record.dispatched) - t0;
        let next = source
            .turn_ended(session, end, ended_at)
            .map_err(|e| SimError::Config(format!("conversation: {e}")))?;
        Ok(next.map(|turn| arrival(turn, &mut session_of)))
    };
    let mut served = cluster.drive_closed(openers, Some(peaks), &mut ended)?;
    served.sort_by_key(|s| s.record.index);
    Ok((served, source.abandoned()))
}

#[cfg(test)]
#[path = "converse_tests.rs"]
mod tests;
