//! The result of a trace replay (`loadgen replay`): what was replayed, then one run per
//! route, each the same requests on fresh engines.
//!
//! ```text
//! {"trace": {"file", "requests", "duration_s", …},
//!  "runs": [{"route", "requests", "good", "errors", "dropped",
//!            "ttft": {"p50", "p90", "p99"}, "tpot": {…}, "e2e": {…},
//!            "cache_hit_ratio", "replicas": {NAME: {"requests", …}}, "records": […]?}]}
//! ```
//! Per-request metrics, success and `good` are the matrix's (docs/MEASUREMENT.md), computed by
//! the same functions; quantiles are over successful requests (`null` when none). The
//! per-request `records` are written only when asked for (`--records`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::phase::{ReplicaObservation, Slo, is_good};
use super::quantile::quantile;
use super::record::{ErrorClass, RequestRecord};

/// A replay result file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayResult {
    pub trace: TraceSummary,
    pub runs: Vec<ReplayRun>,
    /// False when the replay stopped before every route ran.
    pub complete: bool,
}

/// What was replayed, and on what.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSummary {
    /// The trace file, as given.
    pub file: String,
    /// Requests in the replayed slice.
    pub requests: usize,
    /// Requests in the whole file.
    pub file_requests: usize,
    /// Trace seconds from the slice's first request to its last (before `speedup`).
    pub duration_s: f64,
    pub start_s: f64,
    pub speedup: f64,
    pub limit: Option<usize>,
    pub input_tokens_mean: f64,
    pub input_tokens_max: usize,
    pub output_tokens_mean: f64,
    /// `sim`, `local` or `live`.
    pub mode: String,
    /// What served the requests (engine profiles and time scale, or the gateway's URL).
    pub runtime: String,
    pub replicas: usize,
    pub gateways: usize,
    pub gateway_assignment: String,
    pub kv_sync: bool,
    pub slo: SloSummary,
}

/// The SLO a request had to meet to be `good` (inclusive bounds), seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloSummary {
    pub ttft_s: f64,
    pub tpot_s: f64,
    pub e2e_s: f64,
}

impl From<Slo> for SloSummary {
    fn from(slo: Slo) -> Self {
        SloSummary {
            ttft_s: slo.ttft,
            tpot_s: slo.tpot,
            e2e_s: slo.e2e,
        }
    }
}

/// p50, p90 and p99 of a metric (seconds; `null` when no request succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tail {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

impl Tail {
    fn of(values: &[f64]) -> Tail {
        Tail {
            p50: quantile(values, 0.50),
            p90: quantile(values, 0.90),
            p99: quantile(values, 0.99),
        }
    }
}

/// One route's replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRun {
    pub route: String,
    /// Requests sent.
    pub requests: usize,
    /// Requests within the SLO.
    pub good: usize,
    /// Requests sent that did not succeed (a refusal, a broken stream, …).
    pub errors: usize,
    /// Requests never sent.
    pub dropped: usize,
    pub ttft: Tail,
    pub tpot: Tail,
    pub e2e: Tail,
    /// Σ replica cache hit tokens / Σ replica cache query tokens (engine counters).
    pub cache_hit_ratio: f64,
    /// Seconds from the first send to the last stream end (engine time).
    pub elapsed_s: f64,
    pub replicas: BTreeMap<String, ReplayReplica>,
    /// Every request, by index, with `--records`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<Vec<ReplayRecord>>,
}

/// One replica over one route's replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayReplica {
    /// Requests whose `target-pod` is this replica.
    pub requests: usize,
    pub good: usize,
    /// Δ `vllm:request_success_total`.
    pub engine_completed: f64,
    pub cache_queries_tokens: f64,
    pub cache_hit_tokens: f64,
    pub cache_hit_ratio: f64,
    pub preemptions: f64,
    pub waiting_peak: f64,
    pub running_peak: f64,
    pub kv_usage_peak: f64,
}

/// One request of a replay, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRecord {
    pub index: usize,
    /// Scheduled send time, seconds after the replay's first request.
    pub at_s: f64,
    pub pod: Option<String>,
    pub prompt_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub good: bool,
    /// Why it failed (`status 400`, `stream_broken`, …), `null` on success.
    pub error: Option<String>,
}

/// Summarizes one route's records (in any order) and replica observations.
pub fn summarize_run(
    route: &str,
    records: &[RequestRecord],
    replicas: &[ReplicaObservation],
    slo: &Slo,
    with_records: bool,
) -> ReplayRun {
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.succeeded()).collect();
    let metric = |f: fn(&RequestRecord) -> Option<f64>| -> Vec<f64> {
        ok.iter().filter_map(|r| f(r)).collect()
    };
    let start = records.iter().map(|r| r.dispatched).min_by(f64::total_cmp);
    let end = records
        .iter()
        .filter_map(|r| r.stream_end.or(r.last_token))
        .max_by(f64::total_cmp);
    let (mut hits, mut queries) = (0.0, 0.0);
    let replicas = replicas
        .iter()
        .map(|o| {
            let mine = records
                .iter()
                .filter(|r| r.target_pod.as_deref() == Some(o.name.as_str()));
            let (requests, good) = mine.fold((0, 0), |(n, g), r| {
                (n + 1, g + usize::from(is_good(r, slo)))
            });
            let q = o.after.queries - o.before.queries;
            let h = o.after.hits - o.before.hits;
            queries += q;
            hits += h;
            let replica = ReplayReplica {
                requests,
                good,
                engine_completed: o.after.completed - o.before.completed,
                cache_queries_tokens: q,
                cache_hit_tokens: h,
                cache_hit_ratio: ratio(h, q),
                preemptions: o.after.preemptions - o.before.preemptions,
                waiting_peak: o.peaks.waiting,
                running_peak: o.peaks.running,
                kv_usage_peak: o.peaks.kv_usage,
            };
            (o.name.clone(), replica)
        })
        .collect();
    let origin = records
        .iter()
        .map(|r| r.scheduled)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0);
    ReplayRun {
        route: route.to_owned(),
        requests: records.len(),
        good: records.iter().filter(|r| is_good(r, slo)).count(),
        errors: records.len() - ok.len(),
        dropped: 0,
        ttft: Tail::of(&metric(RequestRecord::ttft)),
        tpot: Tail::of(&metric(RequestRecord::tpot)),
        e2e: Tail::of(&metric(RequestRecord::e2e)),
        cache_hit_ratio: ratio(hits, queries),
        elapsed_s: match (start, end) {
            (Some(s), Some(e)) => e - s,
            _ => 0.0,
        },
        replicas,
        records: with_records.then(|| {
            let mut list: Vec<ReplayRecord> =
                records.iter().map(|r| record(r, slo, origin)).collect();
            list.sort_by_key(|r| r.index);
            list
        }),
    }
}

fn record(r: &RequestRecord, slo: &Slo, origin: f64) -> ReplayRecord {
    let ok = r.succeeded();
    ReplayRecord {
        index: r.index,
        at_s: r.scheduled - origin,
        pod: r.target_pod.clone(),
        prompt_tokens: r.usage.map(|u| u.prompt_tokens),
        cached_tokens: r.usage.and_then(|u| u.cached_tokens),
        output_tokens: r.usage.map(|u| u.completion_tokens),
        ttft_s: ok.then(|| r.ttft()).flatten(),
        tpot_s: ok.then(|| r.tpot()).flatten(),
        e2e_s: ok.then(|| r.e2e()).flatten(),
        good: is_good(r, slo),
        error: (!ok).then(|| failure(r)),
    }
}

/// Why a record did not succeed, in a few words.
fn failure(r: &RequestRecord) -> String {
    match (r.error, r.status) {
        (Some(ErrorClass::Status), Some(status)) => format!("status {status}"),
        (Some(ErrorClass::Connect), _) => "connect".into(),
        (Some(ErrorClass::Timeout), _) => "timeout".into(),
        (Some(ErrorClass::StreamBroken), _) => "stream_broken".into(),
        _ => "incomplete".into(),
    }
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{EngineCounters, Peaks, Usage};

    fn done(index: usize, pod: &str, ttft: f64, e2e: f64) -> RequestRecord {
        let mut r = RequestRecord::sent(index, 0, index as f64, index as f64);
        r.status = Some(200);
        r.target_pod = Some(pod.into());
        r.first_content = Some(index as f64 + ttft);
        r.last_token = Some(index as f64 + e2e);
        r.stream_end = r.last_token;
        r.usage = Some(Usage {
            prompt_tokens: 1000,
            completion_tokens: 11,
            cached_tokens: Some(512),
        });
        r
    }

    #[test]
    fn a_run_counts_good_errors_and_the_cache_from_the_engines() {
        let mut refused = RequestRecord::sent(2, 0, 2.0, 2.0);
        refused.status = Some(400);
        refused.error = Some(ErrorClass::Status);
        refused.target_pod = Some("a".into());
        let records = vec![done(1, "b", 3.0, 4.0), done(0, "a", 0.5, 1.5), refused];
        let observation = |name: &str, queries: f64, hits: f64| ReplicaObservation {
            name: name.into(),
            before: EngineCounters::default(),
            after: EngineCounters {
                completed: 1.0,
                queries,
                hits,
                preemptions: 0.0,
            },
            peaks: Peaks::default(),
        };
        let replicas = [
            observation("a", 1000.0, 0.0),
            observation("b", 1000.0, 512.0),
        ];
        let run = summarize_run("prefix-cache", &records, &replicas, &Slo::default(), true);
        assert_eq!(
            (run.requests, run.good, run.errors, run.dropped),
            (3, 1, 1, 0)
        );
        assert_eq!(run.ttft.p50, Some(1.75));
        assert_eq!(run.cache_hit_ratio, 0.256);
        assert_eq!((run.replicas["a"].requests, run.replicas["a"].good), (2, 1));
        assert_eq!(run.replicas["b"].cache_hit_ratio, 0.512);
        let list = run.records.as_ref().unwrap();
        assert_eq!(
            list.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(list[2].error.as_deref(), Some("status 400"));
        assert_eq!(list[1].tpot_s, Some(0.1));
        assert_eq!(run.elapsed_s, 5.0);
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<ReplayRun>(&json).unwrap(), run);
    }
}
