//! The fixtures mock-engine is held to (tests/tests/vllm_fidelity.rs) are what this vLLM
//! answers: with `PREFIXGATE_RECORD_FIXTURES=1` this test records them afresh from a real
//! replica into `tests/real-vllm/fixtures/` (`tests/real-vllm/run.sh fixtures` after a
//! vLLM upgrade); otherwise it checks vLLM still answers in the recorded shapes, so a pin
//! moved without re-recording fails here, not silently in the mock's test.

use prefixgate_tests::Client;
use prefixgate_tests::vllm_fixtures::{all_differences, fixtures_dir, load_fixtures, record_all};

use super::fleet::{Fleet, MODEL};

#[tokio::test]
#[ignore = "needs real vLLM replicas: tests/real-vllm/run.sh"]
async fn vllm_answers_in_the_shapes_its_fixtures_record() {
    let fleet = Fleet::from_env();
    let replica = fleet.b();
    let client = Client::new();
    let observed = record_all(
        &client,
        &replica.url,
        MODEL,
        replica.kv_events.as_deref().unwrap(),
    )
    .await;
    if std::env::var_os("PREFIXGATE_RECORD_FIXTURES").is_some() {
        let dir = fixtures_dir();
        std::fs::create_dir_all(&dir).unwrap();
        for (name, fixture) in &observed {
            let text = serde_json::to_string_pretty(fixture).unwrap() + "\n";
            std::fs::write(dir.join(format!("{name}.json")), text).unwrap();
        }
        return;
    }
    let differences = all_differences(&load_fixtures(), &observed);
    assert!(
        differences.is_empty(),
        "this vLLM no longer answers as tests/real-vllm/fixtures/ records; re-record them \
         (PREFIXGATE_RECORD_FIXTURES=1 tests/real-vllm/run.sh fixtures) and review the mock:\n{}",
        differences.join("\n")
    );
}
