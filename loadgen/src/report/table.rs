//! Markdown tables from result files: one row per scenario × route (rounds side by side),
//! and the same against a baseline (e.g. the seed) with differences.
//!
//! Pure: result structs in, text out.

use std::fmt::Write as _;

use crate::measure::{MatrixResult, PhaseResult};

/// The phases of one scenario × route, in round order.
#[derive(Debug)]
pub struct Cell<'a> {
    pub scenario: &'a str,
    pub route: &'a str,
    pub phases: Vec<&'a PhaseResult>,
}

impl Cell<'_> {
    /// Mean of `f` over the rounds (`None` when there are none).
    pub fn mean(&self, f: impl Fn(&PhaseResult) -> Option<f64>) -> Option<f64> {
        let values: Vec<f64> = self.phases.iter().filter_map(|p| f(p)).collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
    }

    /// Mean good requests over the rounds.
    pub fn good(&self) -> f64 {
        self.mean(|p| Some(p.good as f64)).unwrap_or(0.0)
    }

    fn goods(&self) -> String {
        let v: Vec<String> = self.phases.iter().map(|p| p.good.to_string()).collect();
        v.join(", ")
    }

    fn splits(&self) -> String {
        let v: Vec<String> = self.phases.iter().map(|p| replica_split(p)).collect();
        v.join("; ")
    }
}

/// `45/51`: requests per replica, in replica-name order, as the gateway's `target-pod` named
/// them; `45/51 (engines)` from the engines' completed-request deltas when no request was
/// named (a gateway without the header, such as the peer routers).
pub fn replica_split(phase: &PhaseResult) -> String {
    let named = phase.replicas.values().any(|r| r.requests > 0);
    let v: Vec<String> = phase
        .replicas
        .values()
        .map(|r| {
            if named {
                r.requests.to_string()
            } else {
                format!("{:.0}", r.engine_completed)
            }
        })
        .collect();
    let split = v.join("/");
    let engines = !named && phase.replicas.values().any(|r| r.engine_completed > 0.0);
    if engines {
        format!("{split} (engines)")
    } else {
        split
    }
}

/// Groups phases by scenario × route, in order of first appearance by scenario then route.
pub fn cells(result: &MatrixResult) -> Vec<Cell<'_>> {
    let mut scenarios: Vec<&str> = Vec::new();
    let mut routes: Vec<&str> = Vec::new();
    for p in &result.phases {
        if !scenarios.contains(&p.scenario.as_str()) {
            scenarios.push(&p.scenario);
        }
        if !routes.contains(&p.route.as_str()) {
            routes.push(&p.route);
        }
    }
    let mut out = Vec::new();
    for scenario in &scenarios {
        for route in &routes {
            let phases: Vec<&PhaseResult> = result
                .phases
                .iter()
                .filter(|p| p.scenario == *scenario && p.route == *route)
                .collect();
            if !phases.is_empty() {
                out.push(Cell {
                    scenario,
                    route,
                    phases,
                });
            }
        }
    }
    out
}

/// `v` with `digits` decimals, `–` when absent.
pub(crate) fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The result as a Markdown table (values are per round where it says so, else the mean of
/// the rounds).
pub fn render_table(result: &MatrixResult) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} phases of {} ({}{}), {} replicas\n",
        result.measured_phases,
        result.planned_phases,
        result.runtime,
        if result.complete { "" } else { "; INCOMPLETE" },
        result.replicas
    );
    s.push_str("| scenario | route | good (per round) | good (mean) | TTFT p50 s | TTFT p95 s | TPOT p50 s | hit ratio | replica split (per round) |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for c in cells(result) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
            c.scenario,
            c.route,
            c.goods(),
            c.good(),
            num(c.mean(|p| p.ttft.p50), 3),
            num(c.mean(|p| p.ttft.p95), 3),
            num(c.mean(|p| p.tpot.p50), 4),
            num(c.mean(|p| Some(p.cache_hit_ratio)), 3),
            c.splits()
        );
    }
    s
}

/// Ours beside a baseline: good per round, mean difference, and whether our mean falls in the
/// baseline's rounds widened by ±15 (the fidelity band of `matrix_compare.py`).
pub fn render_side_by_side(ours: &MatrixResult, baseline: &MatrixResult) -> String {
    let base = cells(baseline);
    let mut s = String::new();
    s.push_str("| scenario | route | good ours | good base | Δ mean | in band ±15 | TTFT p95 ours / base | hit ratio ours / base | split ours / base |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    let (mut within, mut compared) = (0, 0);
    for c in cells(ours) {
        let Some(b) = base
            .iter()
            .find(|b| b.scenario == c.scenario && b.route == c.route)
        else {
            let _ = writeln!(
                s,
                "| {} | {} | {} | – | – | – | {} / – | {} / – | {} / – |",
                c.scenario,
                c.route,
                c.goods(),
                num(c.mean(|p| p.ttft.p95), 2),
                num(c.mean(|p| Some(p.cache_hit_ratio)), 3),
                c.splits()
            );
            continue;
        };
        let lo = b.phases.iter().map(|p| p.good).min().unwrap_or(0) as f64 - 15.0;
        let hi = b.phases.iter().map(|p| p.good).max().unwrap_or(0) as f64 + 15.0;
        let ok = (lo..=hi).contains(&c.good());
        compared += 1;
        within += usize::from(ok);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:+.1} | {} | {} / {} | {} / {} | {} / {} |",
            c.scenario,
            c.route,
            c.goods(),
            b.goods(),
            c.good() - b.good(),
            if ok { "yes" } else { "**no**" },
            num(c.mean(|p| p.ttft.p95), 2),
            num(b.mean(|p| p.ttft.p95), 2),
            num(c.mean(|p| Some(p.cache_hit_ratio)), 3),
            num(b.mean(|p| Some(p.cache_hit_ratio)), 3),
            c.splits(),
            b.splits()
        );
    }
    let _ = writeln!(
        s,
        "\n{within}/{compared} scenario × route cells within the baseline's rounds ±15 good."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/matrix-24-phase.json");

    #[test]
    fn seed_table_has_one_row_per_cell_with_its_numbers() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        let table = render_table(&seed);
        assert_eq!(table.matches("\n| ").count(), 1 + 12, "{table}");
        assert!(
            table.contains("| hot50 | prefix-cache | 38, 37 | 37.5 |"),
            "{table}"
        );
        assert!(table.contains("27/69; 27/69"), "{table}");
    }

    #[test]
    fn seed_against_itself_is_all_in_band() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        let text = render_side_by_side(&seed, &seed);
        assert!(text.contains("| +0.0 | yes |"), "{text}");
        assert!(text.contains("12/12 scenario × route cells"), "{text}");
        assert!(!text.contains("**no**"), "{text}");
    }

    #[test]
    fn out_of_band_cells_are_flagged() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        let mut ours = seed.clone();
        for p in &mut ours.phases {
            if p.scenario == "hot50" && p.route == "prefix-cache" {
                p.good = 90;
            }
        }
        let text = render_side_by_side(&ours, &seed);
        assert!(
            text.contains("| hot50 | prefix-cache | 90, 90 | 38, 37 | +52.5 | **no** |"),
            "{text}"
        );
        assert!(text.contains("11/12"), "{text}");
    }
}
