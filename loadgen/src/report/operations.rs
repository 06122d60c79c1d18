//! Markdown tables from an operations result: one row per phase (requests, success, errors,
//! dropped arrivals, good, TTFT, TPOT, statuses) with a line per tenant under it, and the same
//! beside a baseline (e.g. the operations seed), phases matched by name.
//!
//! Pure: result structs in, text out. Cluster events have their own table and charts
//! (`super::cluster_events`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::table::num;
use crate::measure::{OperationsPhaseResult, OperationsResult, TenantResult};

/// `200: 10, 429: 95`, summed over tenants for a phase.
fn statuses<'a>(tenants: impl Iterator<Item = &'a TenantResult>) -> String {
    let mut total: BTreeMap<&str, usize> = BTreeMap::new();
    for t in tenants {
        for (status, n) in &t.status_counts {
            *total.entry(status).or_default() += n;
        }
    }
    let parts: Vec<String> = total.iter().map(|(s, n)| format!("{s}: {n}")).collect();
    parts.join(", ")
}

/// The run as a Markdown table.
pub fn render_operations_table(result: &OperationsResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} operations phases ({}{})\n",
        result.phases.len(),
        result.runtime_version,
        if result.complete == Some(false) {
            "; INCOMPLETE"
        } else {
            ""
        }
    );
    s.push_str("| phase | requests | success | errors | dropped | good | TTFT p50 s | TTFT p95 s | TPOT p95 s | statuses |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for p in &result.phases {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.phase,
            p.requests,
            p.success,
            p.errors,
            p.dropped_arrivals,
            p.good,
            num(p.ttft.p50, 3),
            num(p.ttft.p95, 3),
            num(p.tpot.p95, 4),
            statuses(p.tenants.values())
        );
        if p.tenants.len() > 1 {
            for (name, t) in &p.tenants {
                let _ = writeln!(
                    s,
                    "| ↳ tenant {name} | {} | {} | {} | | {} | | {} | {} | {} |",
                    t.requests,
                    t.success,
                    t.requests - t.success.min(t.requests),
                    t.good,
                    num(t.ttft_p95_seconds, 3),
                    num(t.tpot_p95_seconds, 4),
                    statuses(std::iter::once(t))
                );
            }
        }
    }
    s
}

fn pair(ours: String, base: String) -> String {
    format!("{ours} / {base}")
}

/// Ours beside a baseline, phase by phase (phases the baseline lacks show `–`).
pub fn render_operations_side_by_side(
    ours: &OperationsResult,
    baseline: &OperationsResult,
) -> String {
    let mut s = String::new();
    s.push_str("| phase | requests ours / base | dropped ours / base | good ours / base | TTFT p50 s ours / base | TTFT p95 s ours / base | statuses ours / base |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for p in &ours.phases {
        let b: Option<&OperationsPhaseResult> = baseline.phases.iter().find(|b| b.phase == p.phase);
        let dash = || "–".to_owned();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.phase,
            pair(
                p.requests.to_string(),
                b.map_or_else(dash, |b| b.requests.to_string())
            ),
            pair(
                p.dropped_arrivals.to_string(),
                b.map_or_else(dash, |b| b.dropped_arrivals.to_string())
            ),
            pair(
                p.good.to_string(),
                b.map_or_else(dash, |b| b.good.to_string())
            ),
            pair(num(p.ttft.p50, 2), num(b.and_then(|b| b.ttft.p50), 2)),
            pair(num(p.ttft.p95, 2), num(b.and_then(|b| b.ttft.p95), 2)),
            pair(
                statuses(p.tenants.values()),
                b.map_or_else(dash, |b| statuses(b.tenants.values()))
            ),
        );
        if p.tenants.len() > 1 {
            for (name, t) in &p.tenants {
                let bt = b.and_then(|b| b.tenants.get(name));
                let _ = writeln!(
                    s,
                    "| ↳ tenant {name} | {} | | {} | | {} | {} |",
                    pair(
                        t.requests.to_string(),
                        bt.map_or_else(dash, |b| b.requests.to_string())
                    ),
                    pair(
                        t.good.to_string(),
                        bt.map_or_else(dash, |b| b.good.to_string())
                    ),
                    pair(
                        num(t.ttft_p95_seconds, 2),
                        num(bt.and_then(|b| b.ttft_p95_seconds), 2)
                    ),
                    pair(
                        statuses(std::iter::once(t)),
                        bt.map_or_else(dash, |b| statuses(std::iter::once(b)))
                    ),
                );
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/operations-phases.json");

    #[test]
    fn the_seed_renders_a_row_per_phase_and_a_line_per_tenant_of_a_mix() {
        let seed: OperationsResult = serde_json::from_str(SEED).unwrap();
        let table = render_operations_table(&seed);
        // Header, 13 phases, 2 tenant lines for each of the two tenant phases.
        assert_eq!(table.matches("\n| ").count(), 1 + 13 + 4, "{table}");
        assert!(
            table.contains(
                "| fixed1-wave | 309 | 309 | 0 | 105 | 28 | 39.902 | 40.381 | 0.0615 | 200: 309 |"
            ),
            "{table}"
        );
        assert!(
            table.contains(
                "| ↳ tenant B | 105 | 10 | 95 | | 10 | | 0.592 | 0.0556 | 200: 10, 429: 95 |"
            ),
            "{table}"
        );
    }

    #[test]
    fn side_by_side_matches_phases_by_name() {
        let seed: OperationsResult = serde_json::from_str(SEED).unwrap();
        let mut ours = seed.clone();
        ours.phases.retain(|p| p.phase.starts_with("tenants-"));
        ours.phases[1].phase = "tenants-mine".into();
        let text = render_operations_side_by_side(&ours, &seed);
        assert!(
            text.contains("| tenants-baseline | 172 / 172 | 38 / 38 | 15 / 15 | 25.24 / 25.24 |"),
            "{text}"
        );
        assert!(
            text.contains("| tenants-mine | 210 / – | 0 / – | 115 / – | 0.28 / – |"),
            "{text}"
        );
        assert!(
            text.contains("| ↳ tenant B | 105 / – | | 10 / – |"),
            "{text}"
        );
    }
}
