//! The example engines against the gateway's `[kv_sync]`, for `helm_chart.rs`: the engines
//! publish KV events exactly where the resolved configuration subscribes, for every
//! data-parallel rank (vLLM offsets both the events and the replay endpoint by the rank), and
//! are labelled for discovery exactly when the sync is on; and the chart refuses exactly the
//! rank counts and port layouts the gateway refuses, naming the same key and the same fix.

use gateway::config::KvSyncConfig;
use serde_json::Value;

use super::ENGINES;
use super::cases::engine;
use super::deployed::{Gateway, gateway};
use super::render::{CHART, NAMESPACE, RELEASE, Rendered, helm, list, render};
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

/// The most ranks the gateway follows, 128 sockets per engine pod (ports 1000-1063 and
/// 1064-1127), as the layout test below renders them: the schema test validates its objects.
pub const SIXTY_FOUR_RANKS: &str = "vllm.enabled=true,kvSync.enabled=true,\
    kvSync.dataParallelSize=64,kvSync.port=1000,kvSync.replayPort=1064,\
    vllm.resources.limits.nvidia\\.com/gpu=64,vllm.resources.requests.nvidia\\.com/gpu=64";

/// The chart's value named in a refusal for each `[kv_sync]` key the gateway names.
const KEYS: [(&str, &str); 3] = [
    ("kv_sync.data_parallel_size", "kvSync.dataParallelSize="),
    ("kv_sync.replay_port", "kvSync.replayPort="),
    ("kv_sync.port", "kvSync.port="),
];

/// The `at least N` a refusal suggests for the replay port, if any.
fn suggested(message: &str) -> Option<&str> {
    let rest = message.split_once("at least ")?.1;
    rest.split(|c: char| !c.is_ascii_digit()).next()
}

#[tokio::test]
#[ignore = "needs helm: PREFIXGATE_HELM (.ci/run sets it)"]
async fn helm_refuses_kv_sync_ranks_and_ports_exactly_where_the_gateway_does() {
    // (ranks, port, replay port): vLLM's defaults with 2 ranks, ranges just apart above and
    // below, just touching, equal ports, no replay, past 65535 on either side, 64 ranks.
    let layouts: [(u32, u16, u16); 11] = [
        (2, 5557, 5558),
        (2, 5557, 5559),
        (2, 5557, 5555),
        (2, 5557, 5556),
        (1, 5557, 5557),
        (3, 6000, 0),
        (4, 65533, 0),
        (2, 5557, 65535),
        (64, 1000, 1064),
        (64, 1000, 1063),
        (1, 65535, 1),
    ];
    let mut refused = 0;
    for (ranks, port, replay_port) in layouts {
        let sync = KvSyncConfig {
            enabled: true,
            port,
            replay_port,
            data_parallel_size: ranks,
            ..KvSyncConfig::default()
        };
        let values = format!(
            "vllm.enabled=true,kvSync.enabled=true,kvSync.dataParallelSize={ranks},\
             kvSync.port={port},kvSync.replayPort={replay_port},\
             vllm.resources.limits.nvidia\\.com/gpu={ranks},\
             vllm.resources.requests.nvidia\\.com/gpu={ranks}"
        );
        let layout = (ranks, port, replay_port);
        if layout == (64, 1000, 1064) {
            assert_eq!(values, SIXTY_FOUR_RANKS, "the render schema.rs validates");
        }
        match sync.validate(128) {
            Err(error) => {
                refused += 1;
                let error = error.to_string();
                let args = ["template", RELEASE, CHART, "--namespace", NAMESPACE];
                let output = helm(&[&args[..], &["--set", &values]].concat()).await;
                let stderr = String::from_utf8_lossy(&output.stderr);
                assert!(
                    !output.status.success(),
                    "{layout:?} rendered; gateway: {error}"
                );
                let (_, value) = KEYS
                    .iter()
                    .find(|(key, _)| error.contains(key))
                    .unwrap_or_else(|| panic!("{layout:?}: which key? {error}"));
                assert!(stderr.contains(value), "{layout:?}: {stderr} vs {error}");
                assert_eq!(
                    suggested(&stderr),
                    suggested(&error),
                    "{layout:?}: {stderr}"
                );
            }
            Ok(()) => {
                let rendered = render(&["--set", &values]).await;
                let gateway = gateway(&rendered);
                assert_eq!(gateway.config.kv_sync, sync, "{layout:?}");
                assert_engines_match_kv_sync(&rendered, &gateway);
            }
        }
    }
    assert_eq!(refused, 6, "the table holds refusals and acceptances");
}
