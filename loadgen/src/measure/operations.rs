//! Records of an operations phase → its result in the operations seed's schema, overall and
//! per tenant. Per-request metrics (TTFT, TPOT, E2E, success, good) and quantiles are the
//! matrix's own ([`RequestRecord`], [`is_good`], [`quantile`]); only the aggregation differs:
//! no replicas or families, but tenants, status counts and dropped arrivals.

use std::collections::BTreeMap;

use super::operations_schema::{OperationsConfig, OperationsPhaseResult, TenantResult};
use super::phase::{Slo, is_good};
use super::quantile::quantile;
use super::record::RequestRecord;
use super::schema::Quantiles;

/// The `status_counts` key of a request that got no HTTP status.
pub const NO_RESPONSE: &str = "no_response";

/// One sent request and the tenant (index into [`OperationsOutcome::tenants`]) it went as.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRecord {
    pub tenant: usize,
    pub record: RequestRecord,
}

/// Everything a runner hands over at the end of an operations phase. Record times are
/// seconds on the phase clock (0 = the phase's start).
#[derive(Debug, Clone, PartialEq)]
pub struct OperationsOutcome {
    pub config: OperationsConfig,
    /// Tenant names, in the order records index them; every one gets an entry.
    pub tenants: Vec<String>,
    pub records: Vec<TenantRecord>,
    /// Arrivals the in-flight cap dropped.
    pub dropped: usize,
    /// The phase's start, in seconds since the run's first phase started.
    pub started_relative: f64,
}

fn quantiles(values: &[f64]) -> Quantiles {
    Quantiles {
        p50: quantile(values, 0.50),
        p95: quantile(values, 0.95),
        p99: quantile(values, 0.99),
    }
}

/// When a record's last event was seen: end of stream, else last token, else the send.
fn last_seen(r: &RequestRecord) -> f64 {
    r.stream_end.or(r.last_token).unwrap_or(r.dispatched)
}

fn tenant_result<'a>(
    records: impl Iterator<Item = &'a RequestRecord> + Clone,
    slo: &Slo,
) -> TenantResult {
    let ok: Vec<&RequestRecord> = records.clone().filter(|r| r.succeeded()).collect();
    let ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).collect();
    let mut status_counts = BTreeMap::new();
    for r in records.clone() {
        let key = r
            .status
            .map_or_else(|| NO_RESPONSE.to_owned(), |s| s.to_string());
        *status_counts.entry(key).or_default() += 1;
    }
    let prompt = ok.iter().filter_map(|r| r.usage).map(|u| u.prompt_tokens);
    TenantResult {
        requests: records.clone().count(),
        success: ok.len(),
        good: records.filter(|r| is_good(r, slo)).count(),
        status_counts,
        input_tokens_range: [prompt.clone().min().unwrap_or(0), prompt.max().unwrap_or(0)],
        ttft_p95_seconds: quantile(&ttft, 0.95),
        tpot_p95_seconds: quantile(&tpot, 0.95),
    }
}

/// The phase's result in the operations seed's schema.
pub fn summarize_operations(outcome: &OperationsOutcome, slo: &Slo) -> OperationsPhaseResult {
    let records: Vec<&RequestRecord> = outcome.records.iter().map(|t| &t.record).collect();
    let ok: Vec<&RequestRecord> = records.iter().copied().filter(|r| r.succeeded()).collect();
    let ttfts: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).collect();
    let tpots: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).collect();
    let e2es: Vec<f64> = ok.iter().filter_map(|r| r.e2e()).collect();
    let elapsed = records
        .iter()
        .map(|r| last_seen(r))
        .fold(0.0, f64::max)
        .max(0.0);
    let output_tokens: u64 = ok
        .iter()
        .filter_map(|r| r.usage)
        .map(|u| u64::from(u.completion_tokens))
        .sum();
    let tenants = outcome
        .tenants
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mine = outcome
                .records
                .iter()
                .filter(move |t| t.tenant == i)
                .map(|t| &t.record);
            (name.clone(), tenant_result(mine, slo))
        })
        .collect();
    OperationsPhaseResult {
        phase: outcome.config.phase.clone(),
        config: outcome.config.clone(),
        elapsed,
        requests: records.len(),
        success: ok.len(),
        errors: records.len() - ok.len(),
        dropped_arrivals: outcome.dropped,
        good: records.iter().filter(|r| is_good(r, slo)).count(),
        output_tokens_per_second: if elapsed > 0.0 {
            output_tokens as f64 / elapsed
        } else {
            0.0
        },
        ttft: quantiles(&ttfts),
        tpot: quantiles(&tpots),
        e2e: quantiles(&e2es),
        started_relative_seconds: outcome.started_relative,
        finished_relative_seconds: outcome.started_relative + elapsed,
        tenants,
        drain: None,
        scale_up: None,
        replica_split: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::record::{ErrorClass, Usage};

    /// A streamed success sent at `at`: first token `ttft` later, `tokens` tokens `tpot` apart.
    fn streamed(
        index: usize,
        at: f64,
        ttft: f64,
        tokens: u32,
        tpot: f64,
        prompt: u32,
    ) -> RequestRecord {
        let mut r = RequestRecord::sent(index, 0, at, at);
        r.status = Some(200);
        r.first_content = Some(at + ttft);
        r.last_token = Some(at + ttft + tpot * f64::from(tokens - 1));
        r.stream_end = r.last_token;
        r.usage = Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: tokens,
            cached_tokens: None,
        });
        r
    }

    fn rejected(index: usize, at: f64, status: Option<u16>) -> RequestRecord {
        let mut r = RequestRecord::sent(index, 0, at, at);
        r.status = status;
        r.error = Some(if status.is_some() {
            ErrorClass::Status
        } else {
            ErrorClass::Connect
        });
        r
    }

    #[test]
    fn tenants_get_their_own_counts_statuses_ranges_and_quantiles() {
        let records = vec![
            TenantRecord {
                tenant: 0,
                record: streamed(0, 0.0, 0.3, 64, 0.05, 515),
            },
            TenantRecord {
                tenant: 1,
                record: streamed(1, 1.0, 0.5, 512, 0.05, 1475),
            },
            TenantRecord {
                tenant: 0,
                record: streamed(2, 2.0, 2.5, 64, 0.05, 520),
            },
            TenantRecord {
                tenant: 1,
                record: rejected(3, 3.0, Some(429)),
            },
            TenantRecord {
                tenant: 1,
                record: rejected(5, 5.0, None),
            },
        ];
        let outcome = OperationsOutcome {
            config: OperationsConfig {
                phase: "tenants-protected".into(),
                ..OperationsConfig::default()
            },
            tenants: vec!["A".into(), "B".into(), "C".into()],
            records,
            dropped: 7,
            started_relative: 100.0,
        };
        let p = summarize_operations(&outcome, &Slo::default());
        assert_eq!((p.requests, p.success, p.errors, p.good), (5, 3, 2, 2));
        assert_eq!(p.dropped_arrivals, 7);
        // The B stream ends last: 1 + 0.5 + 511 × 0.05.
        let end = 1.0 + 0.5 + 511.0 * 0.05;
        assert!((p.elapsed - end).abs() < 1e-9, "{}", p.elapsed);
        assert!((p.finished_relative_seconds - (100.0 + end)).abs() < 1e-9);
        assert!((p.output_tokens_per_second - 640.0 / end).abs() < 1e-9);
        let a = &p.tenants["A"];
        assert_eq!((a.requests, a.success, a.good), (2, 2, 1));
        assert_eq!(a.status_counts, BTreeMap::from([("200".to_owned(), 2)]));
        assert_eq!(a.input_tokens_range, [515, 520]);
        // Linear interpolation between 0.3 and 2.5 at rank 0.95.
        assert!((a.ttft_p95_seconds.unwrap() - (0.3 + 0.95 * 2.2)).abs() < 1e-9);
        let b = &p.tenants["B"];
        assert_eq!((b.requests, b.success, b.good), (3, 1, 1));
        assert_eq!(
            b.status_counts,
            BTreeMap::from([
                ("200".to_owned(), 1),
                ("429".to_owned(), 1),
                (NO_RESPONSE.to_owned(), 1)
            ])
        );
        assert_eq!(b.input_tokens_range, [1475, 1475]);
        assert!((b.tpot_p95_seconds.unwrap() - 0.05).abs() < 1e-9);
        // A tenant that sent nothing is listed, with nothing measured.
        let c = &p.tenants["C"];
        assert_eq!((c.requests, c.input_tokens_range), (0, [0, 0]));
        assert_eq!(c.ttft_p95_seconds, None);
        assert!(c.status_counts.is_empty());
    }

    #[test]
    fn a_phase_with_nothing_sent_has_null_quantiles_and_zero_rates() {
        let outcome = OperationsOutcome {
            config: OperationsConfig::default(),
            tenants: vec!["A".into()],
            records: Vec::new(),
            dropped: 3,
            started_relative: 0.0,
        };
        let p = summarize_operations(&outcome, &Slo::default());
        assert_eq!((p.requests, p.dropped_arrivals, p.elapsed), (0, 3, 0.0));
        assert_eq!(p.output_tokens_per_second, 0.0);
        assert_eq!(p.ttft.p50, None);
    }
}
