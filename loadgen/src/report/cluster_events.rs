//! The cluster events of an operations run: a Markdown table of every drain and scale-up
//! (when, which replica, what it served around the event) and, per phase with an event, an
//! SVG chart of requests per replica over time (the split the result records), drawn with
//! the matrix's bar chart. Pure: result in, text out.

use std::fmt::Write as _;

use super::svg::{Series, bar_chart};
use super::table::num;
use crate::measure::OperationsResult;

/// The events as a Markdown table (empty when the run had none).
pub fn render_events_table(result: &OperationsResult) -> String {
    let mut s = String::new();
    for p in &result.phases {
        if let Some(d) = &p.drain {
            let _ = writeln!(
                s,
                "| {} | drain ({}) | {} | {} | {} | {} / {} | {} | {} |",
                p.phase,
                d.kind,
                d.replica,
                num(Some(d.signalled_s), 1),
                num(Some(d.exited_s), 1),
                d.requests_before,
                d.requests_after,
                d.in_flight_at_signal,
                d.cut
            );
        }
        for a in p.scale_up.iter().flat_map(|s| &s.added) {
            let _ = writeln!(
                s,
                "| {} | scale-up | {} | {} | {} | – / {} | | |",
                p.phase,
                a.name,
                num(Some(a.ready_s), 1),
                num(a.first_request_s, 1),
                a.requests
            );
        }
    }
    if s.is_empty() {
        return s;
    }
    format!(
        "| phase | event | replica | signalled / ready s | exited / first request s | requests before / after | in flight at signal | cut |\n|---|---|---|---|---|---|---|---|\n{s}"
    )
}

/// One chart per phase with a recorded split: `(file name, SVG)`.
pub fn events_charts(result: &OperationsResult) -> Vec<(String, String)> {
    result
        .phases
        .iter()
        .filter_map(|p| {
            let split = p.replica_split.as_ref()?;
            let buckets = split.requests.values().map(Vec::len).max().unwrap_or(0);
            let groups: Vec<String> = (0..buckets)
                .map(|i| format!("{:.0}s", i as f64 * split.bucket_s))
                .collect();
            let series: Vec<Series> = split
                .requests
                .iter()
                .map(|(replica, counts)| Series {
                    label: replica.clone(),
                    values: counts.iter().map(|&n| Some(n as f64)).collect(),
                    faded: false,
                })
                .collect();
            let mut title = format!("{}: requests per replica by send time", p.phase);
            if let Some(d) = &p.drain {
                let _ = write!(title, " ({} drained at {:.0} s)", d.replica, d.signalled_s);
            }
            for a in p.scale_up.iter().flat_map(|s| &s.added) {
                let _ = write!(title, " ({} added at {:.0} s)", a.name, a.ready_s);
            }
            let chart = bar_chart(&title, "requests sent", &groups, &series);
            Some((format!("{}-replica-split.svg", p.phase), chart))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::{
        AddedReplica, DrainRecord, OperationsPhaseResult, ReplicaSplit, ScaleUpRecord,
    };

    fn result_with_events() -> OperationsResult {
        let seed: OperationsResult =
            serde_json::from_str(include_str!("../../testdata/operations-phases.json")).unwrap();
        let mut result = seed.clone();
        let mut drained: OperationsPhaseResult = seed.phases[4].clone();
        drained.drain = Some(DrainRecord {
            replica: "L20-B".into(),
            kind: "native".into(),
            signalled_s: 60.0,
            exited_s: 80.5,
            requests_before: 6,
            requests_after: 0,
            in_flight_at_signal: 2,
            cut: 0,
        });
        drained.replica_split = Some(ReplicaSplit {
            bucket_s: 15.0,
            requests: [("L20-A".into(), vec![2, 4]), ("L20-B".into(), vec![2, 0])].into(),
        });
        let mut scaled = seed.phases[0].clone();
        scaled.phase = "scale-up".into();
        scaled.scale_up = Some(ScaleUpRecord {
            added: vec![AddedReplica {
                name: "L20-B".into(),
                ready_s: 90.0,
                first_request_s: Some(90.4),
                ready_to_first_request_s: Some(0.4),
                requests: 120,
            }],
        });
        result.phases = vec![drained, scaled];
        result
    }

    #[test]
    fn the_table_has_a_row_per_event_and_nothing_without_events() {
        let table = render_events_table(&result_with_events());
        assert!(
            table.contains(
                "| drain-native | drain (native) | L20-B | 60.0 | 80.5 | 6 / 0 | 2 | 0 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| scale-up | scale-up | L20-B | 90.0 | 90.4 | – / 120 | | |"),
            "{table}"
        );
        let seed: OperationsResult =
            serde_json::from_str(include_str!("../../testdata/operations-phases.json")).unwrap();
        assert_eq!(render_events_table(&seed), "");
        assert!(events_charts(&seed).is_empty());
    }

    #[test]
    fn a_chart_per_split_with_a_bar_per_replica_and_bucket() {
        let charts = events_charts(&result_with_events());
        assert_eq!(charts.len(), 1);
        let (name, svg) = &charts[0];
        assert_eq!(name, "drain-native-replica-split.svg");
        assert_eq!(svg.matches("<title>").count(), 4, "2 replicas × 2 buckets");
        assert!(svg.contains("L20-B drained at 60 s"), "{svg}");
    }
}
