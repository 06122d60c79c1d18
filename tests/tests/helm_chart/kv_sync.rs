//! The example engines against the gateway's `[kv_sync]`, for `helm_chart.rs`: the engines
//! publish KV events exactly where the resolved configuration subscribes, for every
//! data-parallel rank (vLLM offsets both the events and the replay endpoint by the rank), and
//! are labelled for discovery exactly when the sync is on.

use serde_json::Value;

use super::render::{Rendered, list};
use super::{ENGINES, Gateway, engine};
use mock_engine::kv_events::KvEventsConfig;

/// The container ports named `prefix-R` for R = 0, 1, …, in rank order.
fn rank_ports(container: &Value, prefix: &str) -> Vec<u64> {
    let ports = list(container, "/ports");
    (0..)
        .map_while(|rank| {
            let name = format!("{prefix}-{rank}");
            ports.iter().find(|p| p["name"] == name.as_str())
        })
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect()
}

/// The example engines publish KV events where `[kv_sync]` listens, on every rank's ports, and
/// are labelled for it, exactly when the gateway's sync is on; vLLM runs as many
/// data-parallel ranks as the gateway follows.
pub fn assert_engines_match_kv_sync(rendered: &Rendered, gateway: &Gateway) {
    let sync = &gateway.config.kv_sync;
    let statefulset = rendered.object("StatefulSet", ENGINES);
    let labels = &statefulset["spec"]["template"]["metadata"]["labels"];
    let (container, args) = engine(rendered);
    let events = args
        .iter()
        .find_map(|a| a.strip_prefix("--kv-events-config="));
    let ranks_flag = args
        .iter()
        .find_map(|a| a.strip_prefix("--data-parallel-size="));
    let kv_ports = list(container, "/ports")
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("kv-")))
        .count();
    if !sync.enabled {
        assert_eq!(events, None);
        assert_eq!(ranks_flag, None, "{args:?}");
        assert_eq!(kv_ports, 0, "no KV ports without sync");
        assert!(labels.get("model.aibrix.ai/kv-events-enabled").is_none());
        return;
    }
    assert_eq!(labels["model.aibrix.ai/kv-events-enabled"], "true");
    let events = events.expect("--kv-events-config=JSON in the engine's args");
    let events = KvEventsConfig::parse(events).unwrap_or_else(|e| panic!("{e}: {events}"));
    assert!(events.enable_kv_cache_events);
    assert_eq!(events.endpoint, format!("tcp://*:{}", sync.port));
    let replay = (sync.replay_port != 0).then(|| format!("tcp://*:{}", sync.replay_port));
    assert_eq!(events.replay_endpoint, replay);

    // Rank r publishes on port + r and replays on replay_port + r; the pod exposes each.
    let ranks = u64::from(sync.data_parallel_size);
    let expected = |base: u16| (0..ranks).map(|r| u64::from(base) + r).collect::<Vec<_>>();
    assert_eq!(rank_ports(container, "kv-events"), expected(sync.port));
    let replay_ports = if sync.replay_port == 0 {
        Vec::new()
    } else {
        expected(sync.replay_port)
    };
    assert_eq!(rank_ports(container, "kv-replay"), replay_ports);
    assert_eq!(kv_ports as u64, ranks + replay_ports.len() as u64);
    let flag = (ranks > 1).then(|| ranks.to_string());
    assert_eq!(ranks_flag, flag.as_deref(), "{args:?}");
    if ranks > 1 {
        assert_eq!(
            container["name"], "vllm",
            "only vLLM runs data-parallel ranks"
        );
    }
}
