//! Charts as plain SVG text (no fonts, no drawing library): grouped bar charts of goodput,
//! TTFT p95 and the busiest replica's share, by scenario and route, optionally beside a
//! baseline. Pure: results in, `(file name, SVG text)` out.

use std::fmt::Write as _;

use super::table::{Cell, cells};
use crate::measure::MatrixResult;

/// One bar colour per series, readable on white.
const COLOURS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// A named series of values, one per group (`None`: no bar).
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub values: Vec<Option<f64>>,
    /// Drawn lighter (a baseline).
    pub faded: bool,
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A grouped bar chart.
pub fn bar_chart(title: &str, y_label: &str, groups: &[String], series: &[Series]) -> String {
    let (width, height) = (900.0, 420.0);
    let (left, right, top, bottom) = (70.0, 200.0, 40.0, 50.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0_f64, |m, v| m.max(*v));
    let max = if max > 0.0 { max * 1.1 } else { 1.0 };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        left + plot_w / 2.0,
        escape(title)
    );
    for tick in 0..=4 {
        let v = max * f64::from(tick) / 4.0;
        let y = top + plot_h - plot_h * f64::from(tick) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.2}</text>"##,
            left + plot_w,
            left - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(y_label)
    );
    let group_w = plot_w / groups.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    for (g, group) in groups.iter().enumerate() {
        let x0 = left + g as f64 * group_w + group_w * 0.1;
        for (i, ser) in series.iter().enumerate() {
            let Some(v) = ser.values.get(g).copied().flatten() else {
                continue;
            };
            let h = plot_h * v / max;
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}" fill-opacity="{}"><title>{}: {v:.3}</title></rect>"#,
                x0 + i as f64 * bar_w,
                top + plot_h - h,
                bar_w * 0.95,
                COLOURS[i % COLOURS.len()],
                if ser.faded { 0.35 } else { 1.0 },
                escape(&format!("{} {}", group, ser.label))
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x0 + group_w * 0.4,
            top + plot_h + 20.0,
            escape(group)
        );
    }
    for (i, ser) in series.iter().enumerate() {
        let y = top + 10.0 + i as f64 * 20.0;
        let x = width - right + 16.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}" fill-opacity="{}"/><text x="{}" y="{y}">{}</text>"#,
            y - 10.0,
            COLOURS[i % COLOURS.len()],
            if ser.faded { 0.35 } else { 1.0 },
            x + 18.0,
            escape(&ser.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn scenarios(result: &MatrixResult) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in &result.phases {
        if !out.contains(&p.scenario) {
            out.push(p.scenario.clone());
        }
    }
    out
}

fn series_of(
    result: &MatrixResult,
    groups: &[String],
    suffix: &str,
    faded: bool,
    value: &dyn Fn(&Cell<'_>) -> Option<f64>,
) -> Vec<Series> {
    let all = cells(result);
    let mut routes: Vec<&str> = Vec::new();
    for c in &all {
        if !routes.contains(&c.route) {
            routes.push(c.route);
        }
    }
    routes
        .iter()
        .map(|route| Series {
            label: format!("{route}{suffix}"),
            values: groups
                .iter()
                .map(|g| {
                    all.iter()
                        .find(|c| c.scenario == g && c.route == *route)
                        .and_then(value)
                })
                .collect(),
            faded,
        })
        .collect()
}

/// The busiest replica's share of a phase's requests, in percent.
fn busiest_share(cell: &Cell<'_>) -> Option<f64> {
    cell.mean(|p| {
        let total: usize = p.replicas.values().map(|r| r.requests).sum();
        let max = p.replicas.values().map(|r| r.requests).max()?;
        (total > 0).then(|| 100.0 * max as f64 / total as f64)
    })
}

/// Every chart for a result (and a baseline beside it, faded), as `(file name, SVG)`.
pub fn charts(result: &MatrixResult, baseline: Option<&MatrixResult>) -> Vec<(String, String)> {
    let groups = scenarios(result);
    type Metric = (
        &'static str,
        &'static str,
        &'static str,
        fn(&Cell<'_>) -> Option<f64>,
    );
    let metrics: [Metric; 3] = [
        (
            "goodput.svg",
            "Good requests (mean of rounds)",
            "good requests",
            |c| Some(c.good()),
        ),
        (
            "ttft_p95.svg",
            "TTFT p95 (mean of rounds)",
            "seconds",
            |c| c.mean(|p| p.ttft.p95),
        ),
        (
            "replica_split.svg",
            "Busiest replica's share of requests",
            "percent",
            busiest_share,
        ),
    ];
    metrics
        .iter()
        .map(|(file, title, unit, f)| {
            let mut series = series_of(result, &groups, "", false, f);
            if let Some(base) = baseline {
                series.extend(series_of(base, &groups, " (baseline)", true, f));
            }
            ((*file).to_owned(), bar_chart(title, unit, &groups, &series))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = include_str!("../../testdata/matrix-24-phase.json");

    #[test]
    fn charts_have_one_bar_per_cell_and_escape_text() {
        let seed: MatrixResult = serde_json::from_str(SEED).unwrap();
        let charts = charts(&seed, Some(&seed));
        let names: Vec<&str> = charts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["goodput.svg", "ttft_p95.svg", "replica_split.svg"]);
        let (_, goodput) = &charts[0];
        assert!(goodput.starts_with("<svg") && goodput.ends_with("</svg>\n"));
        // 4 scenarios × 3 routes, ours and baseline.
        assert_eq!(goodput.matches("<title>").count(), 24);
        assert!(goodput.contains("hot50 prefix-cache: 37.500"), "{goodput}");
        let chart = bar_chart("a<b", "y", &["g&h".into()], &[]);
        assert!(chart.contains("a&lt;b") && chart.contains("g&amp;h"));
    }
}
