//! Optional scrape of each replica's `/metrics` into router-core's load view:
//! `vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
//! become [`EngineStats`] for the policies that weigh engine load.
//!
//! Only those three gauges are read from the Prometheus text format; samples of the same
//! name (several engines behind one replica) are summed for counts and averaged for KV
//! usage. A failed scrape clears the stats so a policy never acts on stale numbers.

use std::sync::Arc;
use std::time::Duration;

use router_core::EngineStats;

use crate::replicas::Replicas;
use crate::replicas::health::get;
use crate::upstream::UpstreamClient;

/// Reads the three vLLM gauges from a Prometheus text exposition.
pub fn parse_engine_stats(text: &str) -> Option<EngineStats> {
    let (mut running, mut waiting) = (None::<f64>, None::<f64>);
    let (mut kv_sum, mut kv_count) = (0.0, 0u32);
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = sample(line) else {
            continue;
        };
        match name {
            "vllm:num_requests_running" => *running.get_or_insert(0.0) += value,
            "vllm:num_requests_waiting" => *waiting.get_or_insert(0.0) += value,
            "vllm:kv_cache_usage_perc" => {
                kv_sum += value;
                kv_count += 1;
            }
            _ => {}
        }
    }
    let kv_usage = if kv_count == 0 {
        0.0
    } else {
        kv_sum / f64::from(kv_count)
    };
    Some(EngineStats {
        running: to_count(running?),
        waiting: to_count(waiting?),
        kv_usage: kv_usage.clamp(0.0, 1.0),
    })
}

/// The metric name and value of one sample line (`name{labels} value [timestamp]`).
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let rest = if line[name_end..].starts_with('{') {
        &line[name_end + line[name_end..].find('}')? + 1..]
    } else {
        &line[name_end..]
    };
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    value.is_finite().then_some((name, value))
}

fn to_count(value: f64) -> u32 {
    // Gauges are whole numbers; clamp anything odd into range rather than fail the scrape.
    value.round().clamp(0.0, f64::from(u32::MAX - 1)) as u32
}

/// Scrapes every replica forever, every `interval`; stopped by aborting the task.
pub fn spawn(
    client: UpstreamClient,
    replicas: Arc<Replicas>,
    interval: Duration,
    timeout: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let snapshot = replicas.snapshot();
            futures_util::future::join_all(snapshot.iter().map(|replica| {
                let client = &client;
                async move {
                    let url = format!("{}/metrics", replica.base_url());
                    let stats = match get(client, &url, timeout).await {
                        Ok((status, body)) if status.is_success() => {
                            parse_engine_stats(&String::from_utf8_lossy(&body))
                        }
                        _ => None,
                    };
                    match stats {
                        Some(stats) => replica.load().set_engine_stats(stats),
                        None => replica.load().clear_engine_stats(),
                    }
                }
            }))
            .await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_three_gauges() {
        let text = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
vllm:num_requests_running_other 9
";
        let stats = parse_engine_stats(text).unwrap();
        assert_eq!(stats.running, 3);
        assert_eq!(stats.waiting, 2);
        assert!((stats.kv_usage - 0.25).abs() < 1e-12);
    }

    #[test]
    fn sums_engines_and_needs_both_counts() {
        let text = "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 2\nvllm:num_requests_waiting 0\n";
        assert_eq!(parse_engine_stats(text).unwrap().running, 3);
        assert_eq!(parse_engine_stats("vllm:num_requests_running 1\n"), None);
        assert_eq!(parse_engine_stats("garbage {{{ \n"), None);
    }
}
