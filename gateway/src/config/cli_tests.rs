//! Tests of the command line: parsing, help, and how flags override the config file.

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
        "--block-size",
        "16",
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
    let config = parse(&["--stddev-factor", "5"]).resolve(env).unwrap();
    assert_eq!(config.routing.block_size, 4, "env over the default");
    assert_eq!(config.routing.stddev_factor, 5, "flag over env");

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
    let error = Cli::try_parse_from(["prefixgate", "--tokenizer", "words"]).unwrap_err();
    assert!(error.to_string().contains("words"), "{error}");
    let error = parse(&["--prefix-load-prefill-weight=-1"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("prefill_weight"), "{error}");
    let error = parse(&["--prefix-load-copy-weight=-1"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("copy_weight"), "{error}");
    let config = parse(&["--prefix-load-copy-weight", "1.5"])
        .resolve(|_| None)
        .unwrap();
    assert_eq!(config.routing.prefix_load.copy_weight, 1.5);
    let error = parse(&["--time-scale", "0"]).resolve(|_| None).unwrap_err();
    assert!(error.to_string().contains("time_scale"), "{error}");
}

#[test]
fn help_lists_every_aibrix_variable() {
    use clap::CommandFactory;
    let help = Cli::command().render_help().to_string();
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
    assert_eq!(serve.mock_engines, Some(2));
    let replay = parse(&[
        "--block-size",
        "4",
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
fn discovery_flags_override_the_file_and_bad_ones_are_named() {
    let config = parse(&[
        "--discovery",
        "kubernetes",
        "--k8s-namespace",
        "llm",
        "--k8s-api-server",
        "http://127.0.0.1:8001",
        "--k8s-model",
        "a",
        "--k8s-model",
        "b",
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

    let error = Cli::try_parse_from(["prefixgate", "--discovery", "dns"]).unwrap_err();
    assert!(
        error.to_string().contains("--discovery") && error.to_string().contains("dns"),
        "{error}"
    );
    let error = parse(&["--discovery", "kubernetes", "--k8s-api-server", "ftp://x"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("api_server"), "{error}");
    let error = parse(&["--discovery", "kubernetes", "--mock-engines", "2"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(error.to_string().contains("mock_engines"), "{error}");
}

#[test]
fn token_rate_flags_override_the_file_and_are_in_help() {
    let config = parse(&[
        "--tenant-tokens-per-second",
        "500",
        "--tenant-token-burst",
        "8000",
        "--default-max-tokens",
        "64",
    ])
    .resolve(|_| None)
    .unwrap();
    assert_eq!(config.admission.tenant_tokens_per_second, 500);
    assert_eq!(config.admission.tenant_token_burst, 8000);
    assert_eq!(config.admission.default_max_tokens, 64);
    let error = parse(&["--tenant-token-burst", "10"])
        .resolve(|_| None)
        .unwrap_err();
    assert!(
        error.to_string().contains("tenant_tokens_per_second"),
        "{error}"
    );
    let error = Cli::try_parse_from(["prefixgate", "--tenant-tokens-per-second=-1"]).unwrap_err();
    assert!(
        error.to_string().contains("--tenant-tokens-per-second"),
        "{error}"
    );
    use clap::CommandFactory;
    let help = Cli::command().render_help().to_string();
    for flag in [
        "--tenant-tokens-per-second",
        "--tenant-token-burst",
        "--default-max-tokens",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
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
        "--cluster-name",
        "fleet-flag",
        "--cluster-gateway-id",
        "gw-1",
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
    assert!(error.contains("cluster.url"), "{error}");
}
