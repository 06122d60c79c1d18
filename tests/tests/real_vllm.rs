//! prefixgate in front of real vLLM servers (vLLM's CPU build and a tiny model made on the
//! spot): the suite `tests/real-vllm/run.sh` runs. Every test is `#[ignore]`d, so that
//! `cargo test --workspace` passes on a machine without vLLM; run.sh installs vLLM, starts
//! two replicas and runs these one at a time (they share the replicas) against the release
//! binary. docs/REAL_VLLM.md says what each checks and what it costs.

mod real_vllm {
    pub mod fleet;
    pub mod gateway;
    pub mod prompts;
    pub mod stream;
    pub mod tap;

    mod bad_input;
    mod cache_routing;
    mod disconnect;
    mod drain_and_kill;
    mod engine_metrics;
    mod fixtures;
    mod kv_events;
    mod passthrough;
    mod resume;
}
