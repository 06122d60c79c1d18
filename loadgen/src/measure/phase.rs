//! Records and engine observations → one [`PhaseResult`] (SPEC §5.2; formulas in
//! `docs/MEASUREMENT.md`). The only place a metric is defined.

use std::collections::BTreeMap;

use super::quantile::quantile;
use super::record::RequestRecord;
use super::schema::{
    CounterDelta, FamilyResult, PhaseConfig, PhaseResult, Quantiles, ReplicaResult,
};

/// The service-level objective a request must meet to be `good` (inclusive bounds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slo {
    pub ttft: f64,
    pub tpot: f64,
    pub e2e: f64,
}

impl Default for Slo {
    /// The campaign's SLO (`shared/seeds/operations-phases.json`): 2 s, 0.15 s, 30 s.
    fn default() -> Self {
        Slo {
            ttft: 2.0,
            tpot: 0.15,
            e2e: 30.0,
        }
    }
}

/// One replica's engine counters at one moment (`vllm:*_total`, summed over labels).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineCounters {
    /// `vllm:request_success_total`, every finish reason.
    pub completed: f64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub queries: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub hits: f64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: f64,
}

/// Highest gauge values seen by the periodic scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Peaks {
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
}

impl Peaks {
    /// Folds in one scrape.
    pub fn observe(&mut self, waiting: f64, running: f64, kv_usage: f64) {
        self.waiting = self.waiting.max(waiting);
        self.running = self.running.max(running);
        self.kv_usage = self.kv_usage.max(kv_usage);
    }
}

/// What was seen of one replica during a phase.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaObservation {
    pub name: String,
    pub before: EngineCounters,
    pub after: EngineCounters,
    pub peaks: Peaks,
}

impl ReplicaObservation {
    /// One observation per replica name, from counters read before and after a run and the
    /// peaks seen during it (a replica without peaks, e.g. a failed scrape, gets none).
    pub fn per_replica<'a>(
        names: impl IntoIterator<Item = &'a str>,
        before: &[EngineCounters],
        after: &[EngineCounters],
        peaks: &[Peaks],
    ) -> Vec<ReplicaObservation> {
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| ReplicaObservation {
                name: name.to_owned(),
                before: before.get(i).copied().unwrap_or_default(),
                after: after.get(i).copied().unwrap_or_default(),
                peaks: peaks.get(i).copied().unwrap_or_default(),
            })
            .collect()
    }
}

/// Everything a runner hands over at the end of a phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseOutcome {
    pub config: PhaseConfig,
    /// Added to phase-clock times to give `started_at` / `finished_at`.
    pub clock_origin: f64,
    pub families: usize,
    pub records: Vec<RequestRecord>,
    pub replicas: Vec<ReplicaObservation>,
    pub initial_prefix_owners: BTreeMap<String, Vec<String>>,
    pub routing_counter_deltas: Option<Vec<CounterDelta>>,
    /// Arrivals that were never sent (an in-flight cap); 0 in the matrix.
    pub dropped: usize,
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { num / den } else { 0.0 }
}

fn quantiles(values: &[f64]) -> Quantiles {
    Quantiles {
        p50: quantile(values, 0.50),
        p95: quantile(values, 0.95),
        p99: quantile(values, 0.99),
    }
}

/// Whether a record is `good` under `slo`.
pub fn is_good(record: &RequestRecord, slo: &Slo) -> bool {
    match (record.ttft(), record.tpot(), record.e2e()) {
        (Some(ttft), Some(tpot), Some(e2e)) => {
            record.succeeded() && ttft <= slo.ttft && tpot <= slo.tpot && e2e <= slo.e2e
        }
        _ => false,
    }
}

/// The phase's result in the seed's schema.
pub fn summarize(outcome: &PhaseOutcome, slo: &Slo) -> PhaseResult {
    let records = &outcome.records;
    let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.succeeded()).collect();
    let ttfts: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).collect();
    let e2es: Vec<f64> = ok.iter().filter_map(|r| r.e2e()).collect();

    let start = records
        .iter()
        .map(|r| r.dispatched)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0);
    let end = records
        .iter()
        .filter_map(|r| r.stream_end.or(r.last_token))
        .max_by(f64::total_cmp)
        .unwrap_or(start)
        .max(start);
    let elapsed = end - start;
    let output_tokens: u64 = ok
        .iter()
        .filter_map(|r| r.usage)
        .map(|u| u64::from(u.completion_tokens))
        .sum();

    // Families that got no request are left out (a reduced run can starve the cold ones);
    // the seed lists every family because each got at least one.
    let families = (0..outcome.families)
        .filter(|f| records.iter().any(|r| r.family == *f))
        .map(|f| {
            let ttft: Vec<f64> = ok
                .iter()
                .filter(|r| r.family == f)
                .filter_map(|r| r.ttft())
                .collect();
            let result = FamilyResult {
                requests: records.iter().filter(|r| r.family == f).count(),
                ttft_p95: quantile(&ttft, 0.95),
            };
            (f.to_string(), result)
        })
        .collect();

    let mut replicas = BTreeMap::new();
    let (mut all_queries, mut all_hits) = (0.0, 0.0);
    for obs in &outcome.replicas {
        let routed: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| r.target_pod.as_deref() == Some(obs.name.as_str()))
            .collect();
        let mut family_counts: BTreeMap<String, usize> = BTreeMap::new();
        for r in &routed {
            *family_counts.entry(r.family.to_string()).or_default() += 1;
        }
        let queries = obs.after.queries - obs.before.queries;
        let hits = obs.after.hits - obs.before.hits;
        all_queries += queries;
        all_hits += hits;
        replicas.insert(
            obs.name.clone(),
            ReplicaResult {
                requests: routed.len(),
                engine_completed: obs.after.completed - obs.before.completed,
                cache_queries_tokens: queries,
                cache_hit_tokens: hits,
                cache_hit_ratio: ratio(hits, queries),
                waiting_peak: obs.peaks.waiting,
                running_peak: obs.peaks.running,
                family_counts,
                kv_usage_peak: obs.peaks.kv_usage,
                preemptions: obs.after.preemptions - obs.before.preemptions,
                gateway_outstanding_at_selection_peak: routed
                    .iter()
                    .filter_map(|r| r.outstanding_at_selection)
                    .max()
                    .unwrap_or(0),
            },
        );
    }

    let prompt_tokens = ok.iter().filter_map(|r| r.usage).map(|u| u.prompt_tokens);
    let input_tokens_range = [
        prompt_tokens.clone().min().unwrap_or(0),
        prompt_tokens.max().unwrap_or(0),
    ];
    let gateway_verified_requests = records
        .iter()
        .filter(|r| {
            r.target_pod
                .as_deref()
                .is_some_and(|pod| outcome.replicas.iter().any(|o| o.name == pod))
        })
        .count();

    PhaseResult {
        phase: outcome.config.phase.clone(),
        scenario: outcome.config.scenario.clone(),
        route: outcome.config.route.clone(),
        config: outcome.config.clone(),
        started_at: outcome.clock_origin + start,
        finished_at: outcome.clock_origin + end,
        elapsed,
        planned: outcome.config.count,
        requests: records.len(),
        success: ok.len(),
        errors: records.len() - ok.len(),
        dropped: outcome.dropped,
        good: records.iter().filter(|r| is_good(r, slo)).count(),
        output_tokens_per_second: ratio(output_tokens as f64, elapsed),
        ttft: quantiles(&ttfts),
        tpot: quantiles(&tpots),
        e2e: quantiles(&e2es),
        families,
        replicas,
        cache_hit_ratio: ratio(all_hits, all_queries),
        input_tokens_range,
        initial_prefix_owners: outcome.initial_prefix_owners.clone(),
        routing_counter_deltas: outcome.routing_counter_deltas.clone(),
        gateway_verified_requests,
    }
}

#[cfg(test)]
#[path = "phase_tests.rs"]
mod tests;
