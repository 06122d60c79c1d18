//! mock-engine answers as the real vLLM the project pins does: every exchange recorded from
//! vLLM (tests/real-vllm/fixtures/, recorded by the real-vLLM suite) is sent to a mock
//! replica and compared field by field, in shape (tests/src/vllm_fixtures.rs). Each
//! difference the mock keeps is listed below with why it does not matter (mirrored in
//! docs/REAL_VLLM.md); any other difference fails, and so does a listed one that is gone.

use mock_engine::kv_events::KvEventsConfig;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, spawn_replica_with_events};
use prefixgate_tests::Client;
use prefixgate_tests::vllm_fixtures::{all_differences, load_fixtures, record_all};
use router_core::kv_sync::EventFormat;

/// The differences mock-engine keeps from vLLM 0.32.0, each `(fixture and path, why it
/// does not matter)`.
const KNOWN: &[(&str, &str)] = &[
    (
        "kv_event .payload[1][0].block_size: 32 in vLLM, 16 in the mock",
        "configuration, not protocol: vLLM's CPU build needs blocks of a multiple of 32 tokens, \
         GPU vLLM defaults to 16, and the mock's profiles model GPU engines; consumers read the \
         size from the event, as the gateway does",
    ),
    (
        CACHE_CONFIG_LABELS,
        "vllm:cache_config_info carries every CacheConfig field as a label, and which exist \
         changes with each vLLM release; the mock exports those routers read (block_size, \
         num_gpu_blocks, enable_prefix_caching, …), and no reader depends on the rest",
    ),
];

const CACHE_CONFIG_LABELS: &str = concat!(
    "metrics .families.vllm:cache_config_info.labels: ",
    r#"["_block_size_resolved","block_size","cache_dtype","cache_hit_alignment_tokens","effective_attention_block_size","enable_mamba_shared_prefix_checkpoint","enable_prefix_caching","engine","gpu_memory_utilization","hash_block_size","is_attention_free","kv_cache_dtype_skip_layers","kv_cache_layout","kv_cache_max_concurrency","kv_cache_memory_bytes","kv_cache_size_tokens","kv_offloading_backend","kv_offloading_size","kv_sharing_fast_prefill","mamba_block_size","mamba_cache_dtype","mamba_cache_mode","mamba_page_size_padded","mamba_ssm_cache_dtype","num_cpu_blocks","num_gpu_blocks","num_gpu_blocks_override","prefix_cache_retention_interval","prefix_caching_hash_algo","prefix_match_unit","replayssm_buffer_len","skip_page_size_padded","sliding_window","swa_bounded_replay","use_kda_recoverssm","use_replayssm","user_specified_block_size"] in vLLM, "#,
    r#"["block_size","cache_dtype","enable_prefix_caching","engine","gpu_memory_utilization","num_cpu_blocks","num_gpu_blocks","prefix_caching_hash_algo"] in the mock"#
);

#[tokio::test]
async fn mock_engine_answers_in_the_shapes_real_vllm_does() {
    let config = ReplicaConfig {
        name: "mock-0".to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        model: "tiny".to_owned(),
        profile: EngineProfile::load("fast").unwrap(),
        time_scale: 10.0,
        failures: FailurePlan::default(),
    };
    let events = KvEventsConfig::parse(
        r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","topic":"kv-events"}"#,
    )
    .unwrap()
    .with_format(EventFormat::Map);
    let replica = spawn_replica_with_events(config, events).await.unwrap();
    let endpoint = replica.kv_events_endpoint().unwrap().to_owned();
    let observed = record_all(&Client::new(), &replica.url(), "tiny", &endpoint).await;
    let differences = all_differences(&load_fixtures(), &observed);
    let unexplained: Vec<_> = differences
        .iter()
        .filter(|d| !KNOWN.iter().any(|(known, _)| d == known))
        .collect();
    let gone: Vec<_> = KNOWN
        .iter()
        .filter(|(known, _)| !differences.iter().any(|d| d == known))
        .map(|(known, _)| known)
        .collect();
    assert!(
        unexplained.is_empty() && gone.is_empty(),
        "mock-engine differs from vLLM where nothing says why:\n{}\n\nlisted differences that are gone (drop them from KNOWN and docs/REAL_VLLM.md):\n{}",
        unexplained
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        gone.iter().map(|d| **d).collect::<Vec<_>>().join("\n")
    );
}
