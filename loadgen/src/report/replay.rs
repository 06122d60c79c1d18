//! A trace replay's result as a Markdown table (one row per route) and SVG charts (good
//! requests, TTFT p90 and the busiest replica's share, by route), drawn with the matrix's bar
//! chart. Pure: a result in, text out.

use std::fmt::Write as _;

use super::svg::{Series, bar_chart};
use crate::measure::{ReplayResult, ReplayRun};

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"))
}

/// The busiest replica's share of the run's requests (1/N is perfectly even).
fn busiest_share(run: &ReplayRun) -> Option<f64> {
    let most = run.replicas.values().map(|r| r.requests).max()?;
    (run.requests > 0).then(|| most as f64 / run.requests as f64)
}

/// One header line about the trace, then a row per route.
pub fn render_replay_table(result: &ReplayResult) -> String {
    let t = &result.trace;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} of {} requests over {:.0} s of trace time (speedup {}), mean prompt {:.0} tokens (max {}), mean output {:.0}; {} mode, {} replicas, {} gateway(s) ({}){}; SLO TTFT ≤ {} s, TPOT ≤ {} s, E2E ≤ {} s\n",
        t.file,
        t.requests,
        t.file_requests,
        t.duration_s,
        t.speedup,
        t.input_tokens_mean,
        t.input_tokens_max,
        t.output_tokens_mean,
        t.mode,
        t.replicas,
        t.gateways,
        t.gateway_assignment,
        if t.kv_sync { ", KV-event sync" } else { "" },
        t.slo.ttft_s,
        t.slo.tpot_s,
        t.slo.e2e_s,
    );
    out.push_str("| route | good | good % | errors | TTFT p50 / p90 / p99 s | TPOT p50 / p99 s | E2E p50 / p99 s | hit ratio | busiest replica |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for run in &result.runs {
        let share =
            busiest_share(run).map_or_else(|| "–".into(), |s| format!("{:.0} %", s * 100.0));
        let percent = if run.requests > 0 {
            100.0 * run.good as f64 / run.requests as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "| {} | {} / {} | {percent:.1} | {} | {} / {} / {} | {} / {} | {} / {} | {:.3} | {share} |",
            run.route,
            run.good,
            run.requests,
            run.errors,
            secs(run.ttft.p50),
            secs(run.ttft.p90),
            secs(run.ttft.p99),
            secs(run.tpot.p50),
            secs(run.tpot.p99),
            secs(run.e2e.p50),
            secs(run.e2e.p99),
            run.cache_hit_ratio,
        );
    }
    if !result.complete {
        out.push_str("\n(incomplete: the replay stopped before every route ran)\n");
    }
    out
}

/// `(file name, SVG)` charts: good requests, TTFT p90 and the busiest replica's share, by route.
pub fn replay_charts(result: &ReplayResult) -> Vec<(String, String)> {
    let groups: Vec<String> = result.runs.iter().map(|r| r.route.clone()).collect();
    let series = |label: &str, f: &dyn Fn(&ReplayRun) -> Option<f64>| {
        vec![Series {
            label: label.to_owned(),
            values: result.runs.iter().map(f).collect(),
            faded: false,
        }]
    };
    let title = |what: &str| {
        format!(
            "{what}, {} requests of {}",
            result.trace.requests, result.trace.file
        )
    };
    vec![
        (
            "replay-good.svg".into(),
            bar_chart(
                &title("Requests within the SLO"),
                "good requests",
                &groups,
                &series("good", &|r| Some(r.good as f64)),
            ),
        ),
        (
            "replay-ttft-p90.svg".into(),
            bar_chart(
                &title("TTFT p90"),
                "seconds",
                &groups,
                &series("TTFT p90", &|r| r.ttft.p90),
            ),
        ),
        (
            "replay-busiest-share.svg".into(),
            bar_chart(
                &title("Busiest replica's share"),
                "share of requests",
                &groups,
                &series("busiest replica", &busiest_share),
            ),
        ),
    ]
}
