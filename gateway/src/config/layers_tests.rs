//! Tests of the layers: each one over the last, values read by their setting's type, and
//! every error naming the setting and the layer it came from.

use super::layers::{ENV_ALIASES, Layer, Layers};
use super::settings;
use crate::config::{DiscoveryKind, GatewayConfig};

/// The configuration from `env` (name, value) and `--set` assignments, or the error text.
fn resolve(env: &[(&str, &str)], sets: &[&str]) -> Result<GatewayConfig, String> {
    let mut layers = Layers::default();
    let lookup = |name: &str| {
        env.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| (*v).to_owned())
    };
    layers.env(lookup).map_err(|e| e.to_string())?;
    for set in sets {
        layers.set(set).map_err(|e| e.to_string())?;
    }
    layers.resolve().map_err(|e| e.to_string())
}

#[test]
fn every_setting_under_plain_tables_has_its_own_environment_name() {
    let config = resolve(
        &[
            ("PREFIXGATE_ROUTING_BLOCK_SIZE", "64"),
            ("PREFIXGATE_UPSTREAM_MAX_RETRIES", " 5 "),
            ("PREFIXGATE_ROUTING_PREFIX_LOAD_COPY_WEIGHT", "1.5"),
            ("PREFIXGATE_DISCOVERY_KIND", "kubernetes"),
            ("PREFIXGATE_DISCOVERY_MODELS", "a, b,"),
            ("PREFIXGATE_ENGINE_SCRAPE_ENABLED", "FALSE"),
            ("PREFIXGATE_LISTEN", "127.0.0.1:7000"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(config.routing.block_size, 64);
    assert_eq!(config.upstream.max_retries, 5);
    assert_eq!(config.routing.prefix_load.copy_weight, 1.5);
    assert_eq!(config.discovery.kind, DiscoveryKind::Kubernetes);
    assert_eq!(config.discovery.models, ["a", "b"]);
    assert!(!config.engine_scrape.enabled);
    assert_eq!(config.listen.port(), 7000);
}

#[test]
fn the_older_names_are_aliases_and_a_settings_own_name_wins() {
    let config = resolve(
        &[
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "4"),
            ("AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED", "TRUE"),
            ("PREFIXGATE_API_KEYS", "k1, k2"),
            ("PREFIXGATE_PREFIX_LOAD_PREFILL_WEIGHT", "4"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(config.routing.block_size, 4);
    assert!(config.kv_sync.enabled);
    assert_eq!(config.admission.api_keys, ["k1", "k2"]);
    assert_eq!(config.routing.prefix_load.prefill_weight, 4.0);
    let config = resolve(
        &[
            ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "4"),
            ("PREFIXGATE_ROUTING_BLOCK_SIZE", "8"),
            ("AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED", "0"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(config.routing.block_size, 8, "the setting's own name wins");
    assert!(!config.kv_sync.enabled);
}

#[test]
fn a_blank_list_or_a_blank_api_key_is_refused_naming_its_layer() {
    // A Secret holding only spaces must not open the gateway (an empty list is no keys).
    for blank in ["", "  ", " , "] {
        let error = resolve(&[("PREFIXGATE_API_KEYS", blank)], &[]).unwrap_err();
        assert!(
            error.contains("admission.api_keys") && error.contains("env PREFIXGATE_API_KEYS"),
            "{blank:?}: {error}"
        );
    }
    let error = resolve(&[], &["admission.api_keys=[\"k1\", \" \"]"]).unwrap_err();
    assert!(
        error.contains("key 2 of 2 is blank") && error.contains("admission.api_keys from --set"),
        "{error}"
    );
    let config = resolve(&[], &["admission.api_keys=[]"]).unwrap();
    assert!(config.admission.api_keys.is_empty(), "[] is the empty list");
}

#[test]
fn set_reaches_every_kind_of_key_and_the_last_one_wins() {
    let config = resolve(
        &[("PREFIXGATE_ROUTING_BLOCK_SIZE", "64")],
        &[
            "routing.block_size=16",
            "routing.block_size = 32",
            "admission.tenants.B.max_in_flight=2",
            "admission.tenants.B.tokens_per_second=100",
            "routing.tokenizer=tiktoken",
            r#"backends=[{name = "a", url = "http://127.0.0.1:1"}]"#,
            "admission.api_keys=[\"x\"]",
            "kv_sync.data_parallel_size=1",
        ],
    )
    .unwrap();
    assert_eq!(
        config.routing.block_size, 32,
        "--set over env, later over earlier"
    );
    assert_eq!(config.admission.tenants["B"].max_in_flight, 2);
    assert_eq!(config.admission.tenants["B"].tokens_per_second, Some(100));
    assert_eq!(
        config.routing.tokenizer,
        router_core::tokenize::TokenizerKind::Tiktoken
    );
    assert_eq!(config.backends.len(), 1);
    assert_eq!(config.admission.api_keys, ["x"]);
    // An empty value unsets a setting that is unset by default.
    let config = resolve(&[], &["log_level=debug", "log_level="]).unwrap();
    assert_eq!(config.log_level, None);
}

#[test]
fn a_value_of_the_wrong_type_names_the_setting_and_its_layer() {
    /// The environment, the `--set`s, and words the error must contain.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a [&'a str]);
    let cases: [Case<'_>; 8] = [
        (
            &[("PREFIXGATE_ROUTING_BLOCK_SIZE", "big")],
            &[],
            &[
                "routing.block_size",
                "env PREFIXGATE_ROUTING_BLOCK_SIZE",
                "big",
                "whole number",
            ],
        ),
        (
            &[("AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED", "yes please")],
            &[],
            &[
                "kv_sync.enabled",
                "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED",
                "yes please",
            ],
        ),
        (
            &[("PREFIXGATE_KV_SYNC_DATA_PARALLEL_SIZE", "two")],
            &[],
            &[
                "kv_sync.data_parallel_size",
                "PREFIXGATE_KV_SYNC_DATA_PARALLEL_SIZE",
                "two",
            ],
        ),
        (
            &[],
            &["kv_sync.port=70000"],
            &["kv_sync.port", "--set", "0 to 65535"],
        ),
        (
            &[],
            &["routing.tokenizer=words"],
            &["routing.tokenizer", "--set", "character"],
        ),
        (
            &[],
            &["routing.blocksize=4"],
            &["routing.blocksize", "no such setting"],
        ),
        (
            &[],
            &["routing.block_size"],
            &["routing.block_size", "KEY=VALUE"],
        ),
        // Text the schema takes but the type does not: the address is checked on the whole.
        (&[], &["listen=nowhere"], &["listen", "--set"]),
    ];
    for (env, sets, words) in cases {
        let error = resolve(env, sets).unwrap_err();
        for word in words {
            assert!(error.contains(word), "{word:?} missing from: {error}");
        }
    }
}

#[test]
fn a_value_out_of_range_names_the_setting_and_its_layer() {
    let error = resolve(&[("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "0")], &[]).unwrap_err();
    assert!(
        error.contains("routing.block_size")
            && error.contains("must be at least 1")
            && error.contains("env AIBRIX_PREFIX_CACHE_BLOCK_SIZE"),
        "{error}"
    );
    let error = resolve(&[], &["routing.prefix_load.copy_weight=-1"]).unwrap_err();
    assert!(
        error.contains("routing.prefix_load.copy_weight from --set"),
        "{error}"
    );
    // An unsigned count has a lower bound only; no made-up upper one is printed.
    let error = resolve(&[], &["routing.prefix_load.recall_blocks=-3"]).unwrap_err();
    assert!(
        error.contains("routing.prefix_load.recall_blocks from --set")
            && error.contains("a whole number of at least 0")
            && error.len() < 200,
        "{error}"
    );
    let error = resolve(&[], &["embedded.time_scale=0"]).unwrap_err();
    assert!(error.contains("embedded.time_scale from --set"), "{error}");
    // Two settings that disagree: both named, each with its layer.
    let error = resolve(&[("PREFIXGATE_ADMISSION_TENANT_TOKEN_BURST", "100")], &[]).unwrap_err();
    assert!(
        error.contains(
            "admission.tenant_token_burst from env PREFIXGATE_ADMISSION_TENANT_TOKEN_BURST"
        ) && error.contains("admission.tenant_tokens_per_second from the default"),
        "{error}"
    );
    let error = resolve(&[], &["log_level=info,=x=y"]).unwrap_err();
    assert!(error.contains("log_level from --set"), "{error}");
}

#[test]
fn the_file_is_the_lowest_layer_and_its_errors_name_it() {
    let dir = std::env::temp_dir().join(format!("prefixgate-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(&path, "[routing]\nblock_size = 0\nhash_seed = 3\n").unwrap();
    let mut layers = Layers::default();
    layers.file(&path).unwrap();
    let error = layers.resolve().unwrap_err().to_string();
    assert!(
        error.contains("routing.block_size") && error.contains(&format!("file {}", path.display())),
        "{error}"
    );
    let mut layers = Layers::default();
    layers.file(&path).unwrap();
    layers
        .set_text("routing.block_size", "4", Layer::Flag("--test"))
        .unwrap();
    let config = layers.resolve().unwrap();
    assert_eq!(config.routing.block_size, 4);
    assert_eq!(config.routing.hash_seed, 3, "the file's other keys stay");
    std::fs::write(&path, "[routing]\nblock_size = \"x\"\n").unwrap();
    let error = Layers::default().file(&path).unwrap_err().to_string();
    assert!(
        error.contains(&path.display().to_string()) && error.contains("block_size"),
        "{error}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_alias_names_a_setting_and_covers_routers_names() {
    for (name, key) in ENV_ALIASES {
        assert!(
            settings::kind_at(key).is_some(),
            "{name} -> {key}: no such setting"
        );
    }
    let names: Vec<&str> = ENV_ALIASES.iter().map(|(n, _)| *n).collect();
    for name in router_core::config::ENV_NAMES
        .into_iter()
        .chain(router_core::policy::prefix_load::config::PREFIX_LOAD_ENV_NAMES)
    {
        assert!(names.contains(&name), "{name} is not an alias");
    }
}

#[test]
fn the_router_reads_time_at_the_replicas_scale() {
    let scale = |sets: &[&str]| resolve(&[], sets).map(|c| c.router_time_scale());
    assert_eq!(scale(&[]), Ok(1.0), "real engines: wall time");
    assert_eq!(scale(&["replica_time_scale=10"]), Ok(10.0));
    // Embedded mock engines at 10x: the router follows them unless told otherwise.
    let embedded = ["embedded.mock_engines=2", "embedded.time_scale=10"];
    assert_eq!(scale(&embedded), Ok(10.0));
    let both = [embedded[0], embedded[1], "replica_time_scale=10"];
    assert_eq!(scale(&both), Ok(10.0));
    let error = scale(&[embedded[0], embedded[1], "replica_time_scale=4"]).unwrap_err();
    assert!(
        error.contains("replica_time_scale") && error.contains("embedded.time_scale"),
        "{error}"
    );
    for bad in ["0", "-2", "NaN"] {
        let error = scale(&[&format!("replica_time_scale={bad}")]).unwrap_err();
        assert!(error.contains("replica_time_scale"), "{bad}: {error}");
    }
}

#[test]
fn a_removed_settings_environment_name_is_refused_with_what_replaced_it() {
    for name in [
        "PREFIXGATE_PREFIX_LOAD_COPY_IN_TIME_SECONDS",
        "PREFIXGATE_ROUTING_PREFIX_LOAD_COPY_IN_TIME_SECONDS",
    ] {
        let error = resolve(&[(name, "2")], &[]).unwrap_err();
        assert!(error.contains(name), "{error}");
        assert!(error.contains("ttft_slo_seconds"), "{error}");
    }
    assert!(resolve(&[], &[]).is_ok());
}
