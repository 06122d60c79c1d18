//! Conversation scenarios on the simulated cluster: every turn sent, failures abandoning the
//! rest of their session, and the history found in the cache where the previous turn ran.

use mock_engine::model::EngineProfile;

use super::super::matrix::simulate_phase_run;
use super::super::options::SimOptions;
use crate::workload::Matrix;

fn matrix(scenario: &str) -> Matrix {
    let text = format!(
        r#"
routes = ["prefix-cache", "least-request"]
scenarios = ["chat"]
[workload]
count = 96
rps = 1.6
output = 32
repeat = 300
families = 2
prefix_tokens = 480
tail_tokens = [40, 60]
priming_candidates = 16
max_setup_attempts = 8
[[round]]
number = 1
seed = 7
[scenario.chat]
priming = "none"
{scenario}
"#
    );
    Matrix::from_toml_str(&text, "test").unwrap()
}

fn options() -> SimOptions {
    SimOptions::seed_like(EngineProfile::builtin("l20-qwen27b-fp8").unwrap())
}

#[test]
fn every_turn_extends_its_history_and_finds_it_cached_on_the_same_replica() {
    let m = matrix(
        "rps = 0.5\nconversations = { sessions = 4, turns = 3, think_s = 2.0, user_tokens = [20, 30] }",
    );
    for phase in m.phases() {
        let run = simulate_phase_run(&phase, &options(), 0.0).unwrap();
        let (result, served) = (&run.result, &run.served);
        assert_eq!(
            (result.planned, result.requests, result.dropped),
            (12, 12, 0)
        );
        assert_eq!(result.success, 12, "{}", phase.name);
        // Sessions are numbered in start order and their turns indexed in order.
        for session in served.chunks(3) {
            for pair in session.windows(2) {
                let (prev, next) = (&pair[0].record, &pair[1].record);
                assert_eq!(next.index, prev.index + 1);
                assert!(next.scheduled >= prev.stream_end.unwrap() + 0.0);
                let (pu, nu) = (prev.usage.unwrap(), next.usage.unwrap());
                // The next prompt holds the previous prompt and answer, and more.
                assert!(nu.prompt_tokens > pu.prompt_tokens + pu.completion_tokens);
                if pair[0].engine == pair[1].engine {
                    // Every full block of the previous prompt and answer but the last
                    // token (sampled, never fed back) is cached.
                    let kept = (pu.prompt_tokens + pu.completion_tokens - 1) / 16 * 16;
                    assert!(nu.cached_tokens.unwrap() >= kept, "{}", phase.name);
                }
            }
        }
        if phase.route.as_str() == "prefix-cache" {
            // A prefix route keeps a session where its history is.
            let stays = served
                .chunks(3)
                .flat_map(|s| s.windows(2).map(|w| w[0].engine == w[1].engine))
                .filter(|&same| same)
                .count();
            assert_eq!(stays, 8, "{}", phase.name);
        }
    }
}

#[test]
fn a_failed_turn_abandons_the_rest_of_its_session() {
    // Answers of 12000 tokens outgrow the 32768-token context by the third turn.
    let m = matrix("output = 12000\nconversations = { sessions = 2, turns = 4, think_s = 0.0 }");
    let phase = &m.phases()[0];
    let run = simulate_phase_run(phase, &options(), 0.0).unwrap();
    let r = &run.result;
    assert_eq!(r.planned, 8);
    assert_eq!(r.requests + r.dropped, 8);
    assert_eq!(
        (r.errors, r.dropped),
        (2, 2),
        "one refused turn and one abandoned per session"
    );
}

#[test]
fn conversation_phases_are_deterministic() {
    let m = matrix(
        "arrival = \"poisson\"\nrps = 0.5\nconversations = { sessions = 6, turns = [1, 5], think_s = 3.0 }",
    );
    let phase = &m.phases()[0];
    let a = simulate_phase_run(phase, &options(), 0.0).unwrap().result;
    let b = simulate_phase_run(phase, &options(), 0.0).unwrap().result;
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    assert!(
        a.config
            .traffic
            .as_deref()
            .unwrap()
            .contains("conversations")
    );
}
