//! The live runner's reads of `/metrics`: replica counters before and after a phase, replica
//! gauges every 250 ms of engine time during it, and the gateway's routing counters.
//!
//! A failed counter read stops the phase (its deltas would be wrong); a failed gauge scrape is
//! skipped (it only lowers the peaks' resolution); a failed gateway read makes the phase's
//! routing counter deltas `null`.

use std::time::Duration;

use tokio::sync::watch;

use std::collections::BTreeMap;

use super::prom_text::{Scrape, routing_deltas};
use super::request::{HttpClient, get_text};
use super::target::{GatewayEndpoint, ReplicaEndpoint};
use crate::measure::{CounterDelta, EngineCounters, Peaks};

/// Wall-time bound on one scrape.
const SCRAPE_LIMIT: Duration = Duration::from_secs(5);

/// Engine seconds between gauge scrapes (the seed harness's 250 ms).
const SCRAPE_PERIOD: f64 = 0.25;

/// Shortest wall time between scrapes, so a high time scale cannot turn scraping into a
/// busy loop.
const MIN_SCRAPE_WALL: Duration = Duration::from_millis(20);

/// Bound on scrapes per phase (hours at the shortest period); the stop signal ends it first.
const MAX_SCRAPES: u64 = 1_000_000;

/// Every replica's engine counters now.
pub async fn engine_counters(
    client: &HttpClient,
    replicas: &[ReplicaEndpoint],
) -> Result<Vec<EngineCounters>, String> {
    let mut out = Vec::with_capacity(replicas.len());
    for r in replicas {
        let url = format!("{}/metrics", r.base);
        let s = Scrape::parse(&get_text(client, &url, SCRAPE_LIMIT).await?);
        out.push(EngineCounters {
            completed: s.sum("vllm:request_success_total"),
            queries: s.sum("vllm:prefix_cache_queries_total"),
            hits: s.sum("vllm:prefix_cache_hits_total"),
            preemptions: s.sum("vllm:num_preemptions_total"),
        });
    }
    Ok(out)
}

/// The gateway's metrics, or `None` without a URL or when the read fails.
pub async fn gateway_scrape(client: &HttpClient, url: Option<&str>) -> Option<Scrape> {
    let text = get_text(client, url?, SCRAPE_LIMIT).await.ok()?;
    Some(Scrape::parse(&text))
}

/// Every gateway's metrics, or `None` when one of them cannot be read (the routing counters
/// would then be short of its decisions).
pub async fn gateway_scrapes(
    client: &HttpClient,
    gateways: &[GatewayEndpoint],
) -> Option<Vec<Scrape>> {
    let mut scrapes = Vec::with_capacity(gateways.len());
    for gateway in gateways {
        scrapes.push(gateway_scrape(client, gateway.metrics.as_deref()).await?);
    }
    Some(scrapes)
}

/// The routing counter deltas of all the gateways together: each series' deltas summed over
/// the gateways, sorted by name then labels (`None` when a scrape is missing).
pub fn summed_routing_deltas(
    before: Option<&[Scrape]>,
    after: Option<&[Scrape]>,
) -> Option<Vec<CounterDelta>> {
    let (before, after) = (before?, after?);
    let mut sums: BTreeMap<(String, BTreeMap<String, String>), f64> = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for d in routing_deltas(b, a) {
            *sums.entry((d.name, d.labels)).or_default() += d.delta;
        }
    }
    Some(
        sums.into_iter()
            .map(|((name, labels), delta)| CounterDelta {
                name,
                labels,
                delta,
            })
            .collect(),
    )
}

/// Scrapes every replica's gauges every [`SCRAPE_PERIOD`] engine seconds until told to stop.
pub async fn scrape_peaks(
    client: HttpClient,
    replicas: Vec<ReplicaEndpoint>,
    time_scale: f64,
    mut stop: watch::Receiver<bool>,
) -> Vec<Peaks> {
    let mut peaks = vec![Peaks::default(); replicas.len()];
    let period = Duration::from_secs_f64(SCRAPE_PERIOD / time_scale).max(MIN_SCRAPE_WALL);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for _ in 0..MAX_SCRAPES {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return peaks,
        }
        for (p, r) in peaks.iter_mut().zip(&replicas) {
            let url = format!("{}/metrics", r.base);
            // A missed scrape only lowers the peak's resolution; the phase goes on.
            if let Ok(text) = get_text(&client, &url, SCRAPE_LIMIT).await {
                let s = Scrape::parse(&text);
                p.observe(
                    s.sum("vllm:num_requests_waiting"),
                    s.sum("vllm:num_requests_running"),
                    s.sum("vllm:kv_cache_usage_perc"),
                );
            }
        }
    }
    peaks
}
