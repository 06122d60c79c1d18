//! Optional scrape of each replica's `/metrics` into router-core's load view:
//! `vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
//! become [`EngineStats`] for the policies that weigh engine load.
//!
//! Only those three gauges are read from the Prometheus text format; samples of the same
//! name (several engines behind one replica, told apart by vLLM's `engine` label) are summed
//! for counts and averaged for KV usage. vLLM before 0.10 named the KV gauge
//! `vllm:gpu_cache_usage_perc`; it is read when the new name is absent.
//!
//! A gauge that is absent is never read as zero: the replica's [`MissingGauges`] name it,
//! in the log (a warning when the set changes) and in `prefixgate_engine_metric_missing
//! {pod,metric}`. Without both counts the stats are cleared, as after a failed scrape, so a
//! policy never acts on numbers it does not have; without the KV gauge the counts are still
//! used (no policy reads KV usage; the admin API shows it as `null`). A scrape that fails
//! (unreachable, an error status) clears the stats too and is logged when it starts and
//! stops failing.

use std::sync::Arc;
use std::time::Duration;

use router_core::EngineStats;

use crate::replicas::health::get;
use crate::replicas::{Replica, Replicas};
use crate::upstream::UpstreamClient;

/// The gauges the load view reads, in [`MissingGauges`] bit order.
const GAUGES: [&str; 3] = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
];
const RUNNING: u8 = 1;
const WAITING: u8 = 1 << 1;
const KV_USAGE: u8 = 1 << 2;

/// The KV gauge's name before vLLM 0.10 (still exported, hidden, until 0.12).
const KV_USAGE_BEFORE_0_10: &str = "vllm:gpu_cache_usage_perc";

/// Which of the load view's gauges a replica's `/metrics` lacked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MissingGauges(u8);

impl MissingGauges {
    pub fn from_bits(bits: u8) -> Self {
        MissingGauges(bits & (RUNNING | WAITING | KV_USAGE))
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the KV-usage gauge (under either name) was absent.
    pub fn lacks_kv_usage(self) -> bool {
        self.0 & KV_USAGE != 0
    }

    /// The missing gauges' metric names.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        GAUGES
            .into_iter()
            .enumerate()
            .filter(move |(bit, _)| self.0 & (1 << bit) != 0)
            .map(|(_, name)| name)
    }
}

/// What one readable `/metrics` gave: the stats (`None` without both counts) and what it
/// lacked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineScrape {
    pub stats: Option<EngineStats>,
    pub missing: MissingGauges,
}

/// Reads the three vLLM gauges from a Prometheus text exposition.
pub fn parse_engine_stats(text: &str) -> EngineScrape {
    let (mut running, mut waiting) = (None::<f64>, None::<f64>);
    let mut kv = Mean::default();
    let mut kv_before_0_10 = Mean::default();
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
            "vllm:kv_cache_usage_perc" => kv.add(value),
            KV_USAGE_BEFORE_0_10 => kv_before_0_10.add(value),
            _ => {}
        }
    }
    let kv_usage = kv.mean().or_else(|| kv_before_0_10.mean());
    let mut missing = 0;
    for (absent, bit) in [
        (running.is_none(), RUNNING),
        (waiting.is_none(), WAITING),
        (kv_usage.is_none(), KV_USAGE),
    ] {
        if absent {
            missing |= bit;
        }
    }
    let stats = match (running, waiting) {
        (Some(running), Some(waiting)) => Some(EngineStats {
            running: to_count(running),
            waiting: to_count(waiting),
            kv_usage: kv_usage.unwrap_or(0.0).clamp(0.0, 1.0),
        }),
        _ => None,
    };
    EngineScrape {
        stats,
        missing: MissingGauges(missing),
    }
}

/// The mean of a gauge's samples.
#[derive(Default)]
struct Mean {
    sum: f64,
    count: u32,
}

impl Mean {
    fn add(&mut self, value: f64) {
        self.sum += value;
        self.count += 1;
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
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

/// Applies one scrape's result to `replica`: its load view, and what it reports missing.
fn apply(replica: &Replica, scrape: Option<EngineScrape>) {
    let Some(scrape) = scrape else {
        replica.load().clear_engine_stats();
        if !replica.set_engine_scrape_failing(true) {
            tracing::warn!(pod = %replica.name(), "engine scrape: /metrics cannot be read; engine stats cleared until it can");
        }
        return;
    };
    if replica.set_engine_scrape_failing(false) {
        tracing::info!(pod = %replica.name(), "engine scrape: /metrics readable again");
    }
    match scrape.stats {
        Some(stats) => replica.load().set_engine_stats(stats),
        None => replica.load().clear_engine_stats(),
    }
    let before = replica.set_engine_missing(scrape.missing);
    if before != scrape.missing {
        if scrape.missing.is_empty() {
            tracing::info!(pod = %replica.name(), "engine scrape: every engine gauge present again");
        } else {
            let missing: Vec<_> = scrape.missing.names().collect();
            tracing::warn!(pod = %replica.name(), ?missing,
                "engine scrape: /metrics lacks gauges the load view reads (renamed in this vLLM version?); they are not read as zero");
        }
    }
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
                    let scrape = match get(client, &url, timeout).await {
                        Ok((status, body)) if status.is_success() => {
                            Some(parse_engine_stats(&String::from_utf8_lossy(&body)))
                        }
                        _ => None,
                    };
                    apply(replica, scrape);
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
        let scrape = parse_engine_stats(text);
        let stats = scrape.stats.unwrap();
        assert_eq!(stats.running, 3);
        assert_eq!(stats.waiting, 2);
        assert!((stats.kv_usage - 0.25).abs() < 1e-12);
        assert!(scrape.missing.is_empty());
    }

    #[test]
    fn sums_engines_and_needs_both_counts() {
        let text = "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 2\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n";
        assert_eq!(parse_engine_stats(text).stats.unwrap().running, 3);
        let only_running = parse_engine_stats("vllm:num_requests_running 1\n");
        assert_eq!(only_running.stats, None);
        assert_eq!(
            only_running.missing.names().collect::<Vec<_>>(),
            ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
        );
        let garbage = parse_engine_stats("garbage {{{ \n");
        assert_eq!(garbage.stats, None);
        assert_eq!(garbage.missing.names().count(), 3);
    }

    #[test]
    fn a_missing_kv_gauge_is_named_not_read_as_zero() {
        let text =
            "vllm:num_requests_running 1\nvllm:num_requests_waiting 4\nvllm:kv_cache_usage 0.5\n";
        let scrape = parse_engine_stats(text);
        assert_eq!(scrape.stats.unwrap().waiting, 4);
        assert_eq!(
            scrape.missing.names().collect::<Vec<_>>(),
            ["vllm:kv_cache_usage_perc"]
        );
    }

    #[test]
    fn the_kv_gauges_old_name_is_read_when_the_new_one_is_absent() {
        let old = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n";
        let scrape = parse_engine_stats(old);
        assert!((scrape.stats.unwrap().kv_usage - 0.5).abs() < 1e-12);
        assert!(scrape.missing.is_empty());
        // Both exported (vLLM 0.10): the current name wins.
        let both = format!("{old}vllm:kv_cache_usage_perc 0.25\n");
        assert!((parse_engine_stats(&both).stats.unwrap().kv_usage - 0.25).abs() < 1e-12);
    }

    #[test]
    fn a_replica_keeps_what_its_scrapes_lacked() {
        let replica = Replica::new("a", "127.0.0.1:1", vec![]);
        apply(
            &replica,
            Some(parse_engine_stats("vllm:num_requests_running 2\n")),
        );
        assert_eq!(replica.load().engine_stats(), None);
        assert_eq!(replica.engine_missing().names().count(), 2);
        let full = "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.1\n";
        apply(&replica, Some(parse_engine_stats(full)));
        assert_eq!(replica.load().engine_stats().unwrap().running, 2);
        assert!(replica.engine_missing().is_empty());
        // A failed scrape clears the stats and leaves what is known to be missing alone.
        apply(&replica, None);
        assert_eq!(replica.load().engine_stats(), None);
        assert!(replica.engine_missing().is_empty());
        assert!(
            replica.set_engine_scrape_failing(false),
            "the failure was recorded"
        );
    }
}
