//! What traffic to send: the matrix definition, prompts, schedules and priming plans, the
//! operations phases (staged or closed-loop load, tenant mixes), and the shapes of production
//! traffic (arrival processes, family popularity and churn, length distributions, multi-turn
//! conversations).
//!
//! Every workload is a source of [`PlannedRequest`]s (when, what prompt, how many tokens);
//! runners are their sinks. Pure: no I/O (beyond [`Matrix::load`] reading its file), no
//! clock, no threads. Runners (simulated or live) ask this module what to send and when,
//! send it, and hand what happened to [`crate::measure`].

pub mod admission;
pub mod arrivals;
pub mod blocks;
pub mod chat;
pub mod cluster_events;
pub mod conversation;
pub mod inter_arrival;
pub mod length;
pub mod matrix;
pub mod operations;
pub mod planned;
pub mod popularity;
pub mod priming;
pub mod prompt;
pub mod scenario;
pub mod schedule;
pub mod seeding;
pub mod trace;
pub mod traffic;

pub use admission::{AdmissionSpec, TenantLimit};
pub use arrivals::{OperationsRequest, stage_arrivals};
pub use conversation::{Conversation, Conversations, TurnEnd, TurnRequest};
pub use matrix::{Matrix, MatrixError, PhaseSpec};
pub use operations::{
    ArrivalProcess, Load, Operations, OperationsError, OperationsPhase, PhaseDef, Stage,
    TenantShape,
};
pub use planned::{PlannedRequest, Prompt};
pub use popularity::family_counts;
pub use priming::{
    HotAssignment, candidate_count, choose_hot_families, family_owners, initial_owners,
};
pub use scenario::{Priming, ScenarioSpec, WorkloadShape};
pub use schedule::{PhaseSlot, plan_conversations, plan_requests};
pub use trace::{Trace, TraceError, TraceRequest, TraceSlice};

impl PhaseSpec {
    /// The prefix of candidate `candidate` in setup attempt `attempt` (families of cold and
    /// warm phases are candidates `0..families` of attempt 0).
    pub fn prefix(&self, attempt: u32, candidate: usize) -> String {
        prompt::family_prefix(
            &self.name,
            self.seed,
            attempt,
            candidate,
            self.shape.prefix_tokens,
        )
    }

    /// The measured requests, in send order, once priming has chosen `prefixes[f]` for each
    /// family `f` (the phase as a source of planned requests).
    pub fn planned_requests(&self, prefixes: &[String]) -> Vec<PlannedRequest> {
        plan_requests(self)
            .iter()
            .map(|slot| PlannedRequest {
                index: slot.index,
                family: slot.family,
                at: slot.at,
                prompt: Prompt::Text(self.measured_prompt(&prefixes[slot.family], slot)),
                max_tokens: slot.max_tokens,
            })
            .collect()
    }

    /// A conversation scenario's sessions as a source of turns, once priming has chosen
    /// `prefixes[f]` (each session's system prompt) for each family; `None` for a scenario
    /// of single requests.
    pub fn conversations(&self, prefixes: &[String]) -> Option<Conversations> {
        let plans = plan_conversations(self)?;
        Some(Conversations::new(&self.name, self.seed, plans, prefixes))
    }

    /// The requests a phase plans: its count, or a conversation scenario's turns.
    pub fn planned_count(&self) -> usize {
        match plan_conversations(self) {
            Some(plans) => plans.iter().map(|s| s.turns.len()).sum(),
            None => self.shape.count,
        }
    }

    /// The full prompt of a measured request whose family uses `prefix`.
    pub fn measured_prompt(&self, prefix: &str, request: &PhaseSlot) -> String {
        let tail = prompt::request_tail(
            &self.name,
            self.seed,
            "measure",
            request.index,
            request.tail_tokens,
        );
        prompt::join(prefix, &tail)
    }

    /// The full prompt of priming request `index` of kind `tag` (its tail is the shortest
    /// allowed, with its own nonce).
    pub fn priming_prompt(&self, prefix: &str, tag: &str, index: usize) -> String {
        let tail =
            prompt::request_tail(&self.name, self.seed, tag, index, self.shape.tail_tokens[0]);
        prompt::join(prefix, &tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_have_the_seed_sizes_under_the_mock_tokenizer() {
        let phase = &Matrix::builtin().unwrap().phases()[0];
        let prefix = phase.prefix(0, 3);
        assert_eq!(mock_engine::tokenizer::encode(&prefix).len(), 4704);
        for request in plan_requests(phase).iter().take(12) {
            let text = phase.measured_prompt(&prefix, request);
            let tokens = mock_engine::tokenizer::encode(&text).len();
            assert!((5037..=5057).contains(&tokens), "{tokens} tokens");
        }
        let priming = phase.priming_prompt(&prefix, "warm", 0);
        assert_eq!(mock_engine::tokenizer::encode(&priming).len(), 4704 + 333);
    }
}
