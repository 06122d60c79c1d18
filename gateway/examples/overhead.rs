//! The gateway's overhead, measured: the same small requests sent straight to a replica and
//! through prefixgate, in one process and one run, at several concurrencies.
//!
//! One mock-engine replica with the `fast` profile (the engine is never the bottleneck) and
//! one gateway in front of it, both on loopback. For each concurrency the two targets take
//! turns in rounds so that machine noise hits both alike. Reported: p50/p99 latency of a
//! non-streamed completion (1 token), throughput, and for SSE (16 tokens) the p50 time to the
//! first and last chunk. Run with:
//!
//! ```sh
//! cargo run --release -p gateway --example overhead -- [REQUESTS_PER_ROUND] [ROUNDS]
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gateway::config::{BackendConfig, GatewayConfig};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use mock_engine::model::EngineProfile;
use mock_engine::server::{FailurePlan, ReplicaConfig, spawn_replica};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const MODEL: &str = "mock-model";

#[derive(Debug, Default)]
struct Samples {
    latencies: Vec<Duration>,
    first_chunk: Vec<Duration>,
    wall: Duration,
    requests: usize,
}

impl Samples {
    fn quantile(values: &mut [Duration], q: f64) -> Duration {
        if values.is_empty() {
            return Duration::ZERO;
        }
        values.sort();
        let index = ((values.len() - 1) as f64 * q).round() as usize;
        values[index]
    }

    fn throughput(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build(connector)
}

/// One request; its latency to the end of the body and to the first body chunk.
async fn one(client: &HttpClient, url: &str, body: &Bytes) -> (Duration, Duration) {
    let started = Instant::now();
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .expect("valid request");
    let response = client.request(request).await.expect("request sent");
    assert!(
        response.status().is_success(),
        "status {}",
        response.status()
    );
    let mut body = response.into_body();
    let mut first = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("body frame");
        if frame.is_data() && first.is_none() {
            first = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    (total, first.unwrap_or(total))
}

async fn run(
    client: &HttpClient,
    url: &str,
    body: &Bytes,
    requests: usize,
    concurrency: usize,
) -> Samples {
    let started = Instant::now();
    let per_worker = requests / concurrency;
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.to_owned(), body.clone());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                out.push(one(&client, &url, &body).await);
            }
            out
        }));
    }
    let mut samples = Samples::default();
    for worker in workers {
        for (total, first) in worker.await.expect("worker") {
            samples.latencies.push(total);
            samples.first_chunk.push(first);
        }
    }
    samples.wall = started.elapsed();
    samples.requests = samples.latencies.len();
    samples
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let per_round = args.first().copied().unwrap_or(2_000);
    let rounds = args.get(1).copied().unwrap_or(3);

    let profile = EngineProfile::builtin("fast").expect("builtin fast profile");
    let replica = spawn_replica(ReplicaConfig {
        name: "direct".to_owned(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        model: MODEL.to_owned(),
        profile,
        time_scale: 1.0,
        failures: FailurePlan::default(),
    })
    .await
    .expect("replica starts");
    let mut config = GatewayConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        metrics_listen: "127.0.0.1:0".parse().expect("addr"),
        backends: vec![BackendConfig {
            name: "direct".to_owned(),
            url: replica.url(),
            model: Some(MODEL.to_owned()),
            kv_events: None,
            kv_replay: None,
        }],
        ..GatewayConfig::default()
    };
    config.engine_scrape.enabled = false;
    let gateway = gateway::start(config).await.expect("gateway starts");

    let plain = Bytes::from(format!(
        r#"{{"model":"{MODEL}","prompt":"hello world","max_tokens":1}}"#
    ));
    let sse = Bytes::from(format!(
        r#"{{"model":"{MODEL}","prompt":"hello world","max_tokens":16,"stream":true}}"#
    ));
    let client = client();
    let targets = [
        ("direct", format!("{}/v1/completions", replica.url())),
        ("gateway", format!("{}/v1/completions", gateway.url())),
    ];
    println!("requests per round {per_round}, rounds {rounds}");
    for (kind, body) in [("plain", &plain), ("sse", &sse)] {
        for concurrency in [1usize, 64] {
            let mut results: [Samples; 2] = Default::default();
            // Warm the pools and the engine.
            for (_, url) in &targets {
                run(&client, url, body, concurrency * 4, concurrency).await;
            }
            for _ in 0..rounds {
                for (i, (_, url)) in targets.iter().enumerate() {
                    let s = run(&client, url, body, per_round, concurrency).await;
                    results[i].latencies.extend(s.latencies);
                    results[i].first_chunk.extend(s.first_chunk);
                    results[i].wall += s.wall;
                    results[i].requests += s.requests;
                }
            }
            let [mut direct, mut through] = results;
            let (d50, d99) = (
                Samples::quantile(&mut direct.latencies, 0.5),
                Samples::quantile(&mut direct.latencies, 0.99),
            );
            let (g50, g99) = (
                Samples::quantile(&mut through.latencies, 0.5),
                Samples::quantile(&mut through.latencies, 0.99),
            );
            let (df, gf) = (
                Samples::quantile(&mut direct.first_chunk, 0.5),
                Samples::quantile(&mut through.first_chunk, 0.5),
            );
            println!(
                "{kind:5} c={concurrency:<3} direct p50 {:8.1} µs p99 {:8.1} µs {:8.0} req/s | gateway p50 {:8.1} µs p99 {:8.1} µs {:8.0} req/s | added p50 {:7.1} µs p99 {:7.1} µs, first chunk +{:7.1} µs, throughput {:5.1} %",
                us(d50),
                us(d99),
                direct.throughput(),
                us(g50),
                us(g99),
                through.throughput(),
                us(g50) - us(d50),
                us(g99) - us(d99),
                us(gf) - us(df),
                100.0 * through.throughput() / direct.throughput(),
            );
        }
    }
    gateway.shutdown().await;
    replica.shutdown().await;
}
