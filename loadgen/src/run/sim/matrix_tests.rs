//! The simulated runner on reduced matrices: schema, invariants and determinism.

use std::collections::BTreeMap;

use mock_engine::model::EngineProfile;
use router_core::Strategy;

use super::*;
use crate::measure::schema_check::check_against_seed;

const SEED: &str = include_str!("../../../testdata/matrix-24-phase.json");

fn options() -> SimOptions {
    let profile = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin profile");
    SimOptions::seed_like(profile)
}

fn reduced(count: usize) -> Matrix {
    Matrix::builtin().unwrap().with_count(count).unwrap()
}

/// A fresh cluster for `phase` with its priming done, as `simulate_phase` starts one.
fn primed_cluster(phase: &PhaseSpec, options: &SimOptions) -> (SimCluster, Setup) {
    let mut cluster = options.cluster(rng_for(1, &["test"])).unwrap();
    let setup = prime_phase(&mut cluster, phase, options).unwrap();
    (cluster, setup)
}

fn run(matrix: &Matrix) -> MatrixResult {
    simulate_matrix(matrix, &options(), &mut |_, _| {}).expect("simulation succeeds")
}

#[test]
fn reduced_matrix_has_the_seed_schema_and_sane_counts() {
    let result = run(&reduced(12));
    assert!(result.complete);
    assert_eq!((result.measured_phases, result.planned_phases), (24, 24));
    let ours = serde_json::to_value(&result).unwrap();
    let seed: serde_json::Value = serde_json::from_str(SEED).unwrap();
    let problems = check_against_seed(&seed, &ours);
    assert!(problems.is_empty(), "{problems:#?}");

    for p in &result.phases {
        let name = &p.phase;
        assert_eq!(
            (p.planned, p.requests, p.success, p.errors),
            (12, 12, 12, 0),
            "{name}"
        );
        assert!(p.good <= p.success, "{name}");
        assert_eq!(p.gateway_verified_requests, 12, "{name}");
        let routed: usize = p.replicas.values().map(|r| r.requests).sum();
        assert_eq!(routed, 12, "{name}");
        for (replica, r) in &p.replicas {
            // Every request routed to a replica completed there, and nothing else did.
            assert_eq!(r.engine_completed, r.requests as f64, "{name} {replica}");
            assert_eq!(
                r.family_counts.values().sum::<usize>(),
                r.requests,
                "{name}"
            );
            assert!(r.cache_hit_tokens <= r.cache_queries_tokens, "{name}");
            assert!(r.running_peak <= 8.0, "{name}");
        }
        let family_total: usize = p.families.values().map(|f| f.requests).sum();
        assert_eq!(family_total, 12, "{name}");
        let deltas = p
            .routing_counter_deltas
            .as_ref()
            .expect("simulator counts decisions");
        if p.route == "prefix-cache" {
            let selections: f64 = deltas
                .iter()
                .filter(|d| d.name == crate::measure::counters::SELECTION)
                .map(|d| d.delta)
                .sum();
            assert_eq!(selections, 12.0, "{name}");
        } else {
            assert!(deltas.is_empty(), "{name}");
        }
        match p.scenario.as_str() {
            "cold-uniform" => assert!(p.initial_prefix_owners.is_empty(), "{name}"),
            "warm-uniform" => {
                assert_eq!(p.initial_prefix_owners.len(), 8, "{name}");
                // Primed everywhere: every measured request hits its whole family prefix.
                assert!(p.cache_hit_ratio > 0.9, "{name}: {}", p.cache_hit_ratio);
            }
            _ => {
                let c = &p.config;
                let hot = c.hot_initial_replica.as_ref().expect("hot replica");
                assert_eq!(p.initial_prefix_owners["0"], vec![hot.clone()], "{name}");
                assert_eq!(c.family_map.as_ref().map(BTreeMap::len), Some(8), "{name}");
                assert_eq!(c.priming_candidates, Some(16));
                assert!(c.setup_attempt.is_some_and(|a| a >= 1));
                for replica in p.replicas.keys() {
                    let owned = p
                        .initial_prefix_owners
                        .values()
                        .filter(|o| o[0] == *replica)
                        .count();
                    assert_eq!(owned, 4, "{name}: {replica} owns {owned} families");
                }
            }
        }
    }
}

#[test]
fn same_seed_same_output() {
    let matrix = reduced(16)
        .with_routes(&["prefix-cache".into(), "random".into()])
        .unwrap();
    let a = serde_json::to_string(&run(&matrix)).unwrap();
    let b = serde_json::to_string(&run(&matrix)).unwrap();
    assert_eq!(a, b);
}

#[test]
fn guards_are_released_after_every_request() {
    let phase = &reduced(8).phases()[8]; // r1-hot50-prefix-cache
    let (mut cluster, setup) = primed_cluster(phase, &options());
    assert_eq!(cluster.outstanding(), vec![0, 0]);
    let origin = cluster.now();
    let arrivals = phase
        .planned_requests(&setup.prefixes)
        .into_iter()
        .map(|r| Arrival {
            request: PlannedRequest {
                at: origin + r.at,
                max_tokens: 4,
                ..r
            },
            target: Target::Routed(phase.route),
        })
        .collect();
    let served = cluster.drive(arrivals, None).unwrap();
    assert_eq!(served.len(), 8);
    assert_eq!(cluster.outstanding(), vec![0, 0]);
    assert!(
        served
            .iter()
            .all(|s| s.record.usage.map(|u| u.completion_tokens) == Some(4))
    );
}

#[test]
fn forced_warm_owners_set_the_priming_split_for_load_aware_routes() {
    // r1-warm-uniform-{random,least-request,prefix-cache}, 4 requests each, so it stays quick.
    let matrix = reduced(4);
    let owners = vec![1, 1, 0, 1, 0, 0, 1, 1];
    let mut options = options();
    options.warm_owners = Some(owners.clone());
    for phase in matrix
        .phases()
        .iter()
        .filter(|p| p.name.starts_with("r1-warm"))
    {
        let result = simulate_phase(phase, &options, 0.0).unwrap();
        let got: Vec<&str> = (0..8)
            .map(|f| result.initial_prefix_owners[&f.to_string()][0].as_str())
            .collect();
        let want: Vec<&str> = owners
            .iter()
            .map(|&r| if r == 0 { "L20-A" } else { "L20-B" })
            .collect();
        if phase.route == Strategy::Random {
            // Random ignores load: forcing cannot apply, and the run must still complete.
            continue;
        }
        assert_eq!(got, want, "{}", phase.name);
    }
    // An index that names no replica is a configuration error, not a panic.
    options.warm_owners = Some(vec![0, 2]);
    let phase = &matrix.phases()[3]; // r1-warm-uniform-random
    let err = simulate_phase(phase, &options, 0.0).expect_err("replica 2 does not exist");
    assert!(err.to_string().contains("warm_owners"), "{err}");
}

#[test]
fn kv_synced_priming_shows_every_primed_replica_to_the_index() {
    let phase = &reduced(4).phases()[5]; // r1-warm-uniform-prefix-cache
    assert_eq!(phase.name, "r1-warm-uniform-prefix-cache");
    for synced in [false, true] {
        let mut options = options();
        options.kv_synced_priming = synced;
        let (cluster, setup) = primed_cluster(phase, &options);
        let names: Vec<&str> = cluster.names().iter().map(String::as_str).collect();
        for (f, prefix) in setup.prefixes.iter().enumerate() {
            let hashes = cluster.router().hashes(prefix).unwrap();
            let matched = cluster
                .router()
                .index()
                .match_names(&options.model, &hashes, &names);
            let full = matched.iter().filter(|&&m| m == 100).count();
            // Without sync the index knows only the routed priming request's replica.
            let want = if synced { 2 } else { 1 };
            assert_eq!(full, want, "family {f}, synced {synced}: {matched:?}");
        }
    }
}

#[test]
fn first_owners_must_name_replicas() {
    let mut options = options();
    options.first_owners = Some(vec![0, 5]);
    let phase = &reduced(4).phases()[2]; // r1-cold-uniform-prefix-cache
    assert_eq!(phase.name, "r1-cold-uniform-prefix-cache");
    let err = simulate_phase(phase, &options, 0.0).expect_err("too few owners, replica 5");
    assert!(err.to_string().contains("first_owners"), "{err}");
}

#[test]
fn replica_names_follow_the_seed() {
    let mut o = options();
    assert_eq!(o.replica_names(), vec!["L20-A", "L20-B"]);
    o.replicas = 3;
    o.replica_prefix = "mock-".into();
    assert_eq!(o.replica_names(), vec!["mock-A", "mock-B", "mock-C"]);
}

#[test]
fn refused_requests_are_errors_and_refused_priming_stops_the_phase() {
    let mut options = options();
    // Prompts of ~5040 tokens cannot fit: the engine refuses them as vLLM does (400).
    options.profile.max_model_len = 1000;
    let phases = reduced(4).phases();
    let cold = simulate_phase(&phases[0], &options, 0.0).unwrap();
    assert_eq!(
        (cold.requests, cold.success, cold.errors, cold.good),
        (4, 0, 4, 0)
    );
    assert_eq!(cold.ttft.p50, None);
    let err = simulate_phase(&phases[3], &options, 0.0).unwrap_err();
    assert!(matches!(err, SimError::Priming(Some(400))), "{err}");
}

#[test]
fn the_trace_has_one_line_per_request_agreeing_with_the_phase() {
    use super::super::trace_lines::{TraceLine, trace_lines};
    let matrix = reduced(6);
    let options = options();
    let mut traced: Vec<(PhaseResult, Vec<TraceLine>)> = Vec::new();
    simulate_matrix(&matrix, &options, &mut |p, served| {
        traced.push((p.clone(), trace_lines(p, served, &options.slo)));
    })
    .expect("simulation succeeds");
    assert_eq!(traced.len(), 24);
    let names = options.replica_names();
    for (phase, lines) in &traced {
        let name = &phase.phase;
        assert_eq!(lines.len(), phase.requests, "{name}");
        assert_eq!(
            lines.iter().filter(|l| l.good).count(),
            phase.good,
            "{name}"
        );
        assert!(lines.iter().all(|l| &l.phase == name));
        assert_eq!(lines[0].at_s, 0.0, "{name}");
        assert!(lines.windows(2).all(|w| w[0].at_s <= w[1].at_s), "{name}");
        for line in lines {
            let pod = line.pod.as_ref().expect("every request was routed");
            assert!(names.contains(pod), "{name}: {pod}");
            assert!(line.ttft_s.is_some() && line.e2e_s.is_some(), "{name}");
            // Only prefix-aware routes consult the index and label their decisions.
            assert_eq!(
                line.selection.is_some(),
                phase.route == "prefix-cache",
                "{name}: {:?}",
                line.selection
            );
            // The engine's report of what it held of the prompt.
            let prompt = line
                .prompt_tokens
                .expect("every request finished with usage");
            assert!(line.cached_tokens.is_some_and(|c| c <= prompt), "{name}");
        }
        let hit = |l: &TraceLine| l.cached_tokens.is_some_and(|c| c > 0);
        if phase.scenario == "warm-uniform" {
            // Every family was primed on every engine.
            assert!(lines.iter().all(hit), "{name}");
        }
        if phase.scenario == "cold-uniform" {
            // A family's first request finds nothing anywhere.
            let mut seen = std::collections::HashSet::new();
            let firsts: Vec<&TraceLine> = lines.iter().filter(|l| seen.insert(l.family)).collect();
            assert!(firsts.len() > 1, "{name}");
            assert!(!firsts.iter().any(|l| hit(l)), "{name}");
        }
    }
}

/// The seed's warm-uniform `prefix-cache` cells: the index knows one owner per family from
/// routed priming, so the route follows those owners (the seed's 43/96 in round 2). With
/// KV-event sync the engines' events show every replica primed, the route balances, and
/// nearly every request is good (docs/POLICY-EVALUATION.md: 96.0 with the index told of
/// priming).
#[test]
fn kv_sync_shows_warm_priming_and_balances_prefix_cache() {
    let matrix = Matrix::builtin()
        .unwrap()
        .with_routes(&["prefix-cache".into()])
        .unwrap();
    let warm: Vec<PhaseSpec> = matrix
        .phases()
        .into_iter()
        .filter(|p| p.scenario == "warm-uniform")
        .collect();
    assert_eq!(warm.len(), 2, "one warm-uniform phase per round");
    for phase in &warm {
        let mut options = options();
        let off = simulate_phase_run(phase, &options, 0.0).unwrap();
        assert!(off.kv_sync.is_none());
        options.kv_sync = true;
        let on = simulate_phase_run(phase, &options, 0.0).unwrap();
        let name = &phase.name;
        let stats = on.kv_sync.expect("sync is on");
        assert_eq!(stats.error_count(), 0, "{name}: {}", stats.summary());
        assert!(stats.events_applied > 0 && stats.blocks_added > 0, "{name}");
        assert!(
            on.result.good >= 95,
            "{name}: {} good with sync",
            on.result.good
        );
        assert!(
            off.result.good + 20 <= on.result.good,
            "{name}: {} good without sync, {} with",
            off.result.good,
            on.result.good
        );
        // Every measured decision matched a primed prefix.
        for s in &on.served {
            let decision = s.decision.as_ref().expect("routed");
            assert!(decision.match_percent.is_some_and(|m| m >= 90), "{name}");
        }
    }
}

#[test]
fn kv_sync_refuses_a_router_block_that_splits_engine_blocks() {
    let mut options = options();
    options.kv_sync = true;
    options.router.block_size = 96; // 24 tokens: one and a half engine blocks of 16
    let err = options
        .cluster(rng_for(1, &["test"]))
        .expect_err("misaligned");
    assert!(err.to_string().contains("block_size (96 bytes)"), "{err}");
    options.router.block_size = 192; // 3 engine blocks
    assert!(options.cluster(rng_for(1, &["test"])).is_ok());
}

/// The 16k-token sweep's failure: an engine evicts a prefix the router's index still lists.
/// With sync the engine's `BlockRemoved` events make the index forget it; without, the
/// router's own record of the routed request keeps it at 100 %.
#[test]
fn kv_sync_forgets_what_an_engine_evicts() {
    use router_core::kv_sync::token_bytes;
    let prompt = |tag: &str| -> String {
        (0..640)
            .map(|i| format!("{tag}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for sync in [false, true] {
        let mut options = options();
        options.kv_sync = sync;
        // 80 blocks of 16 tokens: room for one 640-token prompt (40 blocks) and its output,
        // not for two, so the second evicts the first once the first is freed.
        options.profile.num_gpu_blocks = 81;
        options.profile.max_model_len = 1200;
        let mut cluster = options.cluster(rng_for(1, &["test"])).unwrap();
        let first = prompt("first");
        let ids = mock_engine::tokenizer::encode(&first);
        let bytes = token_bytes(&ids);
        let request = router_core::RouteRequest {
            model: &options.model,
            text: &first,
            tokens: sync.then_some(bytes.as_slice()),
            session: Default::default(),
            max_tokens: None,
        };
        let hashes = cluster.router().request_hashes(&request).unwrap();
        if sync {
            // 640 token ids of 4 bytes in router blocks of 128 bytes.
            assert_eq!(hashes.len(), 20);
        }
        let target = Target::RoutedOnto(Strategy::PrefixCache, 0);
        cluster.run_one(first.clone(), 16, target).unwrap();
        let owned = cluster.names().to_vec();
        let names: Vec<&str> = owned.iter().map(String::as_str).collect();
        let listed = |cluster: &SimCluster| {
            cluster
                .router()
                .index()
                .match_names(&options.model, &hashes, &names)
        };
        assert_eq!(listed(&cluster), vec![100, 0], "sync {sync}: routed there");
        cluster
            .run_one(prompt("second"), 16, Target::Direct(0))
            .unwrap();
        let after = listed(&cluster);
        let stats = cluster.kv_sync_stats();
        if sync {
            let stats = stats.expect("sync is on");
            assert!(after[0] < 100, "evicted blocks are forgotten: {after:?}");
            assert!(
                stats.blocks_removed > 0 && stats.error_count() == 0,
                "{stats:?}"
            );
        } else {
            assert!(stats.is_none());
            assert_eq!(after, vec![100, 0], "without sync the index never forgets");
        }
    }
}

#[test]
fn unequal_replicas_run_their_own_profiles() {
    // The fast profile answers well inside the SLO; the calibrated one does not for cold
    // prompts. Alternating them, replica A (fast) serves better than replica B.
    let fast = EngineProfile::builtin("fast").expect("builtin fast profile");
    let l20 = EngineProfile::builtin("l20-qwen27b-fp8").expect("builtin profile");
    let mut unequal = options();
    unequal.replica_profiles = vec![fast.clone(), l20.clone()];
    assert_eq!(unequal.profile_names(), "fast, l20-qwen27b-fp8");
    let matrix = reduced(12)
        .with_routes(&["least-request".to_owned()])
        .unwrap();
    let result = simulate_matrix(&matrix, &unequal, &mut |_, _| {}).unwrap();
    assert!(
        result.runtime.contains("fast, l20-qwen27b-fp8"),
        "{}",
        result.runtime
    );
    let all_fast = SimOptions::seed_like(fast);
    let fast_result = simulate_matrix(&matrix, &all_fast, &mut |_, _| {}).unwrap();
    let all_l20 = simulate_matrix(&matrix, &options(), &mut |_, _| {}).unwrap();
    let ttft_sum = |r: &MatrixResult| -> f64 {
        r.phases
            .iter()
            .map(|p| p.ttft.p95.unwrap_or(f64::INFINITY))
            .sum()
    };
    // Between the two equal clusters, strictly: each replica ran its own profile.
    assert!(
        ttft_sum(&fast_result) < ttft_sum(&result),
        "unequal no slower than all fast"
    );
    assert!(
        ttft_sum(&result) < ttft_sum(&all_l20),
        "unequal no faster than all L20"
    );
}

/// Several gateways: every request is still measured once, each decision tallied once, and
/// every gateway's outstanding counts return to zero; one gateway is the default and routes
/// exactly as a cluster built without gateways.
#[test]
fn several_gateways_measure_every_request_and_release_every_count() {
    let matrix = reduced(12)
        .with_routes(&["least-request".into(), "prefix-cache".into()])
        .unwrap();
    let mut three = options();
    three.gateways = 3;
    three.gateway_assignment = crate::run::assignment::GatewayAssignment::Random;
    let result = simulate_matrix(&matrix, &three, &mut |_, _| {}).expect("simulates");
    assert!(
        result.runtime.contains("3 gateways (random)"),
        "{}",
        result.runtime
    );
    for p in &result.phases {
        assert_eq!((p.requests, p.success), (12, 12), "{}", p.phase);
        let routed: usize = p.replicas.values().map(|r| r.requests).sum();
        assert_eq!(routed, 12, "{}", p.phase);
        if p.route == "prefix-cache" {
            let deltas = p.routing_counter_deltas.as_ref().unwrap();
            let selections: f64 = deltas
                .iter()
                .filter(|d| d.name == crate::measure::counters::SELECTION)
                .map(|d| d.delta)
                .sum();
            assert_eq!(selections, 12.0, "{}", p.phase);
        }
    }
    let phase = &matrix.phases()[5]; // r1-hot50-prefix-cache
    let (mut cluster, setup) = primed_cluster(phase, &three);
    let origin = cluster.now();
    let arrivals = phase
        .planned_requests(&setup.prefixes)
        .into_iter()
        .map(|r| Arrival {
            request: PlannedRequest {
                at: origin + r.at,
                ..r
            },
            target: Target::Routed(phase.route),
        })
        .collect();
    cluster.drive(arrivals, None).unwrap();
    assert_eq!(cluster.gateways().len(), 3);
    for gateway in cluster.gateways().iter() {
        let counts: Vec<u64> = gateway.loads.iter().map(|l| l.outstanding()).collect();
        assert_eq!(counts, vec![0, 0]);
    }
    // The default is one gateway: the same figures as the options without the field set.
    assert_eq!(options().gateways, 1);
}

/// Gateways that share routing state with no propagation delay (`SimOptions::cluster_delay`)
/// see what one gateway sees: every decision and release reaches the others before the next
/// arrival. So three of them route exactly as one, every phase's figures the same, but for
/// the outstanding count each gateway records at selection, which is its own (as prefixgate's
/// is, docs/CLUSTER.md); sharing nothing, they do not. What each gateway learns from its own
/// responses is not shared (docs/CLUSTER.md): the `cached_tokens` lessons and each replica's
/// speed, which the TTFT-SLO rules judge lateness by. So `prefix-load` runs here without
/// either (`learn_weight` 0, `ttft_slo_seconds` 0), to compare what is shared; the stream
/// clocks a peer shares are checked in router-core's cluster tests.
#[test]
fn gateways_sharing_without_delay_route_as_one_gateway() {
    let matrix = reduced(12)
        .with_routes(&["prefix-cache".into(), "prefix-load".into()])
        .unwrap();
    let routing = |options: &SimOptions| {
        let mut phases = simulate_matrix(&matrix, options, &mut |_, _| {})
            .expect("simulates")
            .phases;
        for replica in phases.iter_mut().flat_map(|p| p.replicas.values_mut()) {
            replica.gateway_outstanding_at_selection_peak = 0;
        }
        phases
    };
    let mut unlearned = options();
    unlearned.router.prefix_load.learn_weight = 0.0;
    unlearned.router.prefix_load.ttft_slo_seconds = 0.0;
    let one = routing(&unlearned);
    let mut three = unlearned;
    three.gateways = 3;
    assert_ne!(routing(&three), one);
    three.cluster_delay = Some(0.0);
    assert_eq!(routing(&three), one);
}
