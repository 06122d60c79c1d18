//! The cost of one `prefix-cache` decision, and one `prefix-load` decision beside it (issue 7:
//! within 2× of `prefix-cache`), for a 20 KB prompt against a full 200 000-block index (SPEC §6
//! target: ≤ 5 µs), with 2 and 8 pods, the cost of hashing the prompt alone, and decisions
//! made by two threads at once (the shard locks under contention). Results and the command
//! go in `docs/PERFORMANCE.md`.
//!
//! A decision here is everything [`Router::route`] does: tokenize (`character`), hash the
//! 160 full blocks, read the loads, the imbalance gate, match, σ filter, count the request
//! against the chosen pod, and re-add the 160 blocks; dropping the guard is included too.
//!
//! `prefix-load-overload-20KB` is `prefix-load` where its overload rule (`ttft_slo_seconds`,
//! 2 s by default) runs in full: every pod has learned its prefill rate and is busy and late,
//! so each decision also reads every pod's rate and pending prefill, weighs the prefill
//! offered lately against the fleet's, and narrows the candidates. In the plain
//! `prefix-load` rows no pod has learned a rate, so the rule stops at the first pod.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use router_core::load::{Completed, RequestWork};
use router_core::{Candidate, InFlight, PodLoad, RouteRequest, Router, RouterConfig, Strategy};

const PROMPT_BYTES: usize = 20 * 1024;
const INDEX_BLOCKS: usize = 200_000;
const MODEL: &str = "bench-model";

/// 20 KB of word-like ASCII, deterministic.
fn prompt() -> String {
    let mut rng = StdRng::seed_from_u64(20);
    let mut text = String::with_capacity(PROMPT_BYTES + 16);
    while text.len() < PROMPT_BYTES {
        let len = rng.random_range(2..9);
        for _ in 0..len {
            text.push(char::from(b'a' + rng.random_range(0..26u8)));
        }
        text.push(' ');
    }
    text.truncate(PROMPT_BYTES);
    text
}

/// A router with `config` whose index is full: 200 000 blocks spread over eight pods, plus
/// `text`'s blocks held by `owner`. They are placed as decisions place them, so
/// `prefix-load`'s recall holds its share of them too.
fn full_router(config: RouterConfig, text: &str, owner: &str, pods: &[String]) -> Router {
    let router = Router::new(config).expect("the config is valid");
    let mut rng = StdRng::seed_from_u64(200_000);
    let mut now = 0;
    while router.index().len() < INDEX_BLOCKS {
        let hashes: Vec<u64> = (0..160).map(|_| rng.random()).collect();
        let pod = &pods[rng.random_range(0..pods.len())];
        router.record_placement(MODEL, &hashes, pod, None, now);
        now += 1;
    }
    let hashes = router
        .hashes(text)
        .expect("character tokenizer cannot fail");
    router.record_placement(MODEL, &hashes, owner, None, now);
    router
}

/// `n` pods that learned a prefill rate of 10 ms a block and each have 1 000 blocks (10 s)
/// pending: past the default 2 s SLO, so `prefix-load`'s overload rule runs in full. The
/// requests in flight hold that work for as long as they are kept.
fn late_loads(n: usize) -> (Vec<Arc<PodLoad>>, Vec<InFlight>) {
    let loads: Vec<Arc<PodLoad>> = (0..n).map(|_| PodLoad::new()).collect();
    let pending = loads
        .iter()
        .map(|load| {
            load.observe(&Completed {
                blocks: 100,
                prefill_blocks: 100,
                ttft: 1_000,
                decode: 0,
                usage: None,
                sent_to_idle: false,
                behind_copy: false,
            });
            load.acquire_work(RequestWork {
                blocks: 1_000,
                prefill_blocks: 1_000,
                shared_prefix: None,
                copies_prefix: false,
                max_tokens: None,
            })
        })
        .collect();
    (loads, pending)
}

/// The pods `names`, each with its load from `loads`.
fn candidates_on<'a>(names: &'a [String], loads: &'a [Arc<PodLoad>]) -> Vec<Candidate<'a>> {
    names
        .iter()
        .zip(loads)
        .map(|(name, load)| Candidate {
            name,
            address: name,
            load,
        })
        .collect()
}

fn decision(c: &mut Criterion) {
    let text = prompt();
    let names: Vec<String> = (0..8).map(|i| format!("pod-{i}")).collect();
    let router = full_router(RouterConfig::default(), &text, &names[1], &names);
    let blocks = router.index().len();
    eprintln!(
        "index: {blocks} blocks, ~{} heap bytes per block",
        router.index().heap_bytes() / blocks.max(1)
    );
    let loads: Vec<Arc<PodLoad>> = (0..8).map(|i| PodLoad::with_outstanding(i % 3)).collect();
    let (late, _pending) = late_loads(8);
    let mut group = c.benchmark_group("decision");
    for pods in [2usize, 8] {
        let candidates = candidates_on(&names[..pods], &loads);
        let late_candidates = candidates_on(&names[..pods], &late);
        let mut rng = StdRng::seed_from_u64(5);
        let request = RouteRequest {
            model: MODEL,
            text: &text,
            tokens: None,
            session: Default::default(),
            max_tokens: None,
        };
        // The same request in a session (its key's rendezvous pod is weighed as holding it).
        let in_session = RouteRequest {
            session: router_core::Session {
                id: None,
                key: Some(b"conversation-7"),
            },
            ..request
        };
        for (request, strategy, label, candidates) in [
            (
                &request,
                Strategy::PrefixCache,
                "prefix-cache-20KB",
                &candidates,
            ),
            (
                &request,
                Strategy::PrefixLoad,
                "prefix-load-20KB",
                &candidates,
            ),
            (
                &request,
                Strategy::PrefixLoad,
                "prefix-load-overload-20KB",
                &late_candidates,
            ),
            (
                &in_session,
                Strategy::PrefixLoad,
                "prefix-load-session-20KB",
                &candidates,
            ),
            (
                &in_session,
                Strategy::SessionAffinity,
                "session-affinity-20KB",
                &candidates,
            ),
        ] {
            group.bench_with_input(
                BenchmarkId::new(label, format!("{pods}-pods")),
                candidates,
                |b, candidates| {
                    b.iter(|| {
                        let routed = router
                            .route(strategy, black_box(request), candidates, &mut rng, 1_000)
                            .expect("pods are ready");
                        black_box(routed.decision.pod)
                    })
                },
            );
        }
    }
    group.finish();
}

fn hashing(c: &mut Criterion) {
    let text = prompt();
    let router = Router::new(RouterConfig::default()).expect("default config is valid");
    let mut group = c.benchmark_group("hash");
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("block-hashes-20KB", |b| {
        b.iter(|| {
            router
                .hashes(black_box(&text))
                .expect("character tokenizer")
        })
    });
    group.finish();
}

/// The two index operations of a decision, alone: matching the prompt's 160 blocks for 8
/// pods, and re-adding them for one pod.
fn index_ops(c: &mut Criterion) {
    let text = prompt();
    let names: Vec<String> = (0..8).map(|i| format!("pod-{i}")).collect();
    let router = full_router(RouterConfig::default(), &text, &names[1], &names);
    let hashes = router.hashes(&text).expect("character tokenizer");
    let pods: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut group = c.benchmark_group("index");
    group.bench_function("match-160-blocks-8-pods", |b| {
        b.iter(|| router.index().match_names(MODEL, black_box(&hashes), &pods))
    });
    group.bench_function("add-160-blocks", |b| {
        b.iter(|| {
            router
                .index()
                .add(MODEL, black_box(&hashes), &names[1], 1_000)
        })
    });
    group.finish();
}

/// `prefix-cache` decisions made by 1 and 2 threads at once on one router (the gateway's
/// tokio workers share it), every one the same 20 KB prompt: the worst case for the shard
/// locks, as each decision walks and re-adds the same 160 blocks. The time reported is wall
/// time per decision, so perfect scaling halves it with two threads; what it loses to the
/// locks is the difference.
fn concurrent_decisions(c: &mut Criterion) {
    let text = prompt();
    let names: Vec<String> = (0..8).map(|i| format!("pod-{i}")).collect();
    let router = full_router(RouterConfig::default(), &text, &names[1], &names);
    let loads: Vec<Arc<PodLoad>> = (0..8).map(|i| PodLoad::with_outstanding(i % 3)).collect();
    let candidates = candidates_on(&names[..2], &loads);
    let request = RouteRequest {
        model: MODEL,
        text: &text,
        tokens: None,
        session: Default::default(),
        max_tokens: None,
    };
    let mut group = c.benchmark_group("decision-threads");
    for threads in [1u64, 2] {
        group.bench_function(BenchmarkId::new("prefix-cache-20KB", threads), |b| {
            b.iter_custom(|iters| {
                let start = std::sync::Barrier::new(threads as usize);
                let began = std::thread::scope(|scope| {
                    let workers: Vec<_> = (0..threads)
                        .map(|t| {
                            let (router, candidates, start) = (&router, &candidates, &start);
                            scope.spawn(move || {
                                let mut rng = StdRng::seed_from_u64(t);
                                start.wait();
                                let began = std::time::Instant::now();
                                for _ in 0..iters.div_ceil(threads) {
                                    let routed = router
                                        .route(
                                            Strategy::PrefixCache,
                                            black_box(&request),
                                            candidates,
                                            &mut rng,
                                            1_000,
                                        )
                                        .expect("pods are ready");
                                    black_box(routed.decision.pod);
                                }
                                began.elapsed()
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| w.join().expect("no panic"))
                        .max()
                });
                began.expect("one thread at least")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decision, hashing, index_ops, concurrent_decisions);
criterion_main!(benches);
