//! Tests of the command line: parsing, help, and how flags and `--set` override the config
//! file and the environment.

use clap::Parser;

use crate::config::cli::*;
use crate::config::{DiscoveryKind, GatewayConfig};

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("prefixgate").chain(args.iter().copied())).unwrap()
}

#[test]
fn defaults_without_flags() {
    let config = parse(&[]).resolve(|_| None).unwrap();
    assert_eq!(config, GatewayConfig::default());
    assert_eq!(config.default_strategy, "prefix-load");
    assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.metrics_listen.to_string(), "127.0.0.1:9090");
}

#[test]
fn flags_override_the_file() {
    let dir = std::env::temp_dir().join(format!("prefixgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gateway.toml");
    std::fs::write(
        &path,
        "default_strategy = \"random\"\nmax_body_bytes = 10\n[routing]\nblock_size = 4\n",
    )
    .unwrap();
    let cli = parse(&[
        "--config",
        path.to_str().unwrap(),
        "--default-strategy",
        "prefix-cache",
        "--backend",
        "a=http://127.0.0.1:1",
        "--set",
        "routing.block_size=16",
    ]);
    let config = cli.resolve(|_| None).unwrap();
    assert_eq!(config.default_strategy, "prefix-cache");
    assert_eq!(
        config.max_body_bytes, 10,
        "file value kept where no flag is given"
    );
    assert_eq!(config.routing.block_size, 16);
    assert_eq!(config.backends.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn aibrix_env_sits_between_file_and_flags() {
    let env = |key: &str| match key {
        "AIBRIX_PREFIX_CACHE_BLOCK_SIZE" => Some("4".to_owned()),
        "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR" => Some("3".to_owned()),
        _ => None,
    };
    let config = parse(&["--set", "routing.stddev_factor=5"])
        .resolve(env)
        .unwrap();
    assert_eq!(config.routing.block_size, 4, "env over the default");
    assert_eq!(config.routing.stddev_factor, 5, "--set over env");

    let bad = |key: &str| (key == "AIBRIX_PREFIX_CACHE_BLOCK_SIZE").then(|| "big".to_owned());
    let error = parse(&[]).resolve(bad).unwrap_err().to_string();
    assert!(error.contains("AIBRIX_PREFIX_CACHE_BLOCK_SIZE"), "{error}");
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let error = Cli::try_parse_from(["prefixgate", "--backend", "nope"]).unwrap_err();
    assert!(error.to_string().contains("NAME=URL"), "{error}");
    let error = parse(&["--default-strategy", "fastest"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("default_strategy"), "{error}");
    let error = parse(&["--default-strategy", "fastest"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error.to_string().contains("from --default-strategy"),
        "{error}"
    );
    let error = parse(&["--mock-engines", "two"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("embedded.mock_engines from --mock-engines"),
        "{error}"
    );
    let error = parse(&["--set", "routing.tokenizer=words"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("words"), "{error}");
    let error = parse(&["--set", "routing.prefix_load.prefill_weight=-1"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("prefill_weight"), "{error}");
    let error = parse(&["--set", "routing.prefix_load.copy_weight=-1"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("copy_weight"), "{error}");
    let config = parse(&["--set", "routing.prefix_load.copy_weight=1.5"])
        .resolve(|_| None)
        .unwrap();
    assert_eq!(config.routing.prefix_load.copy_weight, 1.5);
    let error = parse(&["--set", "embedded.time_scale=0"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("time_scale"), "{error}");
}

#[test]
fn help_lists_every_setting_and_every_aibrix_variable() {
    let help = Cli::command_with_settings().render_long_help().to_string();
    for setting in crate::config::settings::settings() {
        assert!(
            help.contains(&setting.key),
            "{} missing from --help",
            setting.key
        );
    }
    let prefix_load = router_core::policy::prefix_load::config::PREFIX_LOAD_ENV_NAMES;
    for name in router_core::config::ENV_NAMES
        .into_iter()
        .chain(prefix_load)
    {
        assert!(help.contains(name), "{name} missing from --help");
    }
}

#[test]
fn serving_stays_the_default_and_route_replay_takes_the_router_flags() {
    let serve = parse(&["--mock-engines", "2"]);
    assert!(serve.command.is_none());
    assert_eq!(serve.mock_engines.as_deref(), Some("2"));
    let replay = parse(&[
        "--set",
        "routing.block_size=4",
        "route-replay",
        "--trace",
        "t.jsonl",
        "--seed",
        "7",
        "--emit-hashes",
    ]);
    let Some(Command::RouteReplay(args)) = &replay.command else {
        panic!("{replay:?}");
    };
    assert_eq!(args.trace.as_deref(), Some(std::path::Path::new("t.jsonl")));
    assert_eq!(args.seed, Some(7));
    assert!(args.emit_hashes);
    assert_eq!(replay.resolve(|_| None).unwrap().routing.block_size, 4);
    let error = Cli::try_parse_from(["prefixgate", "route-replay", "--seed", "x"]).unwrap_err();
    assert!(error.to_string().contains("--seed"), "{error}");
    use clap::CommandFactory;
    let mut command = Cli::command();
    let help = command
        .find_subcommand_mut("route-replay")
        .unwrap()
        .render_help()
        .to_string();
    assert!(help.contains("given before the subcommand"), "{help}");
}

#[test]
fn discovery_settings_are_set_and_bad_ones_are_named() {
    let config = parse(&[
        "--set",
        "discovery.kind=kubernetes",
        "--set",
        "discovery.namespace=llm",
        "--set",
        "discovery.api_server=http://127.0.0.1:8001",
        "--set",
        "discovery.models=a,b",
    ])
    .resolve(|_| None)
    .unwrap();
    assert_eq!(config.discovery.kind, DiscoveryKind::Kubernetes);
    assert_eq!(config.discovery.namespace.as_deref(), Some("llm"));
    assert_eq!(
        config.discovery.api_server.as_deref(),
        Some("http://127.0.0.1:8001")
    );
    assert_eq!(config.discovery.models, ["a", "b"]);

    let error = parse(&["--set", "discovery.kind=dns"])
        .resolve(|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("discovery.kind") && error.contains("dns"),
        "{error}"
    );
    let error = parse(&[
        "--set",
        "discovery.kind=kubernetes",
        "--set",
        "discovery.api_server=ftp://x",
    ])
    .resolve(|_| None)
    .unwrap_err();
    assert!(error.to_string().contains("api_server"), "{error}");
    let error = parse(&["--set", "discovery.kind=kubernetes", "--mock-engines", "2"])
        .resolve(|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("mock_engines") && error.contains("discovery.kind from --set"),
        "{error}"
    );
}

#[test]
fn token_rate_settings_are_set_and_in_help() {
    let config = parse(&[
        "--set",
        "admission.tenant_tokens_per_second=500",
        "--set",
        "admission.tenant_token_burst=8000",
        "--set",
        "admission.default_max_tokens=64",
    ])
    .resolve(|_| None)
    .unwrap();
    assert_eq!(config.admission.tenant_tokens_per_second, 500);
    assert_eq!(config.admission.tenant_token_burst, 8000);
    assert_eq!(config.admission.default_max_tokens, 64);
    let error = parse(&["--set", "admission.tenant_token_burst=10"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error.to_string().contains("tenant_tokens_per_second"),
        "{error}"
    );
    let error = parse(&["--set", "admission.tenant_tokens_per_second=-1"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("admission.tenant_tokens_per_second from --set"),
        "{error}"
    );
    let help = Cli::command_with_settings().render_long_help().to_string();
    for key in [
        "admission.tenant_tokens_per_second",
        "admission.tenant_token_burst",
        "admission.default_max_tokens",
    ] {
        assert!(help.contains(key), "{key} missing from --help");
    }
}

#[test]
fn a_missing_config_file_is_named() {
    let error = parse(&["--config", "/nonexistent/gw.toml"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error.to_string().contains("/nonexistent/gw.toml"),
        "{error}"
    );
}

#[test]
fn cluster_flags_sit_over_the_environment() {
    let env = |key: &str| match key {
        "PREFIXGATE_CLUSTER_URL" => Some("redis://10.0.0.1:6379".to_owned()),
        "PREFIXGATE_CLUSTER_NAME" => Some("fleet-env".to_owned()),
        _ => None,
    };
    let config = parse(&[]).resolve(env).unwrap();
    assert_eq!(config.cluster.url.as_deref(), Some("redis://10.0.0.1:6379"));
    assert_eq!(config.cluster.name, "fleet-env");
    let config = parse(&[
        "--cluster-url",
        "redis://10.0.0.2:6379",
        "--set",
        "cluster.name=fleet-flag",
        "--set",
        "cluster.gateway_id=gw-1",
    ])
    .resolve(env)
    .unwrap();
    assert_eq!(config.cluster.url.as_deref(), Some("redis://10.0.0.2:6379"));
    assert_eq!(config.cluster.name, "fleet-flag");
    assert_eq!(config.cluster.gateway_id.as_deref(), Some("gw-1"));
    let error = parse(&["--cluster-url", "nats://10.0.0.3:4222"])
        .resolve(|_| None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("cluster.url from --cluster-url"), "{error}");
    // An empty URL turns sharing off, as unset.
    let off = |key: &str| (key == "PREFIXGATE_CLUSTER_URL").then(String::new);
    let config = parse(&[]).resolve(off).unwrap();
    assert!(!config.cluster.enabled());
    let config = parse(&[])
        .resolve(|key| (key == "PREFIXGATE_CLUSTER_GATEWAY_ID").then(|| " gw-2 ".to_owned()))
        .unwrap();
    assert_eq!(config.cluster.gateway_id.as_deref(), Some("gw-2"));
}
