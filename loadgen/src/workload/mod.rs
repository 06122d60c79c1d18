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
pub mod conversation;
pub mod inter_arrival;
pub mod length;
pub mod matrix;
pub mod operations;
pub mod planned;
pub mod popularity;
pub mod priming;
pub mod prompt;
pub mod schedule;
pub mod seeding;

pub use admission::{AdmissionSpec, TenantLimit};
pub use arrivals::{OperationsRequest, stage_arrivals};
pub use matrix::{Matrix, MatrixError, PhaseSpec, Priming, WorkloadShape};
pub use operations::{
    ArrivalProcess, Load, Operations, OperationsError, OperationsPhase, PhaseDef, Stage,
    TenantShape,
};
pub use planned::{PlannedRequest, Prompt};
pub use priming::{
    HotAssignment, candidate_count, choose_hot_families, family_owners, initial_owners,
};
pub use schedule::{PhaseSlot, family_counts, plan_requests};

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
                max_tokens: self.shape.output,
            })
            .collect()
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
