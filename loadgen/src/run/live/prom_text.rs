//! Prometheus text exposition, read just enough for the live runner: samples with their
//! labels, sums over a metric's series, and the `aibrix_prefix_cache_*` counter deltas.
//!
//! Format: `# …` comment lines; `name{k="v",…} value [timestamp]` or `name value`; label
//! values escape `\\`, `\"` and `\n`. Lines that do not parse are skipped (a scrape must not
//! fail a phase), and counted so the caller can report them. Pure.

use std::collections::BTreeMap;

use crate::measure::CounterDelta;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// Lines that were neither comments nor valid samples.
    pub skipped: usize,
}

impl Scrape {
    /// Parses exposition text.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Some(sample) => scrape.samples.push(sample),
                None => scrape.skipped += 1,
            }
        }
        scrape
    }

    /// Sum of every series of `name` (0 when absent).
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    /// Whether any series of `name` is present.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// `aibrix_prefix_cache_*_total` counters keyed by (name, labels without `model`).
    fn routing_counters(&self) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
        let mut out = BTreeMap::new();
        for s in &self.samples {
            if s.name.starts_with("aibrix_prefix_cache_") && s.name.ends_with("_total") {
                let mut labels = s.labels.clone();
                labels.remove("model");
                *out.entry((s.name.clone(), labels)).or_insert(0.0) += s.value;
            }
        }
        out
    }
}

/// Every routing counter series that moved between two gateway scrapes, sorted by name then
/// labels (the seed's `routing_counter_deltas`).
pub fn routing_deltas(before: &Scrape, after: &Scrape) -> Vec<CounterDelta> {
    let before = before.routing_counters();
    after
        .routing_counters()
        .into_iter()
        .filter_map(|(key, value)| {
            let delta = value - before.get(&key).copied().unwrap_or(0.0);
            (delta != 0.0).then_some(CounterDelta {
                name: key.0,
                labels: key.1,
                delta,
            })
        })
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let i = line.find(['{', ' '])?;
    let (name, rest) = line.split_at(i);
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(body) => {
            let (labels, used) = parse_labels(body)?;
            (labels, &body[used..])
        }
        None => (BTreeMap::new(), rest),
    };
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `k="v",…}`; returns the labels and the bytes consumed, closing brace included.
fn parse_labels(body: &str) -> Option<(BTreeMap<String, String>, usize)> {
    let mut labels = BTreeMap::new();
    let mut it = body.char_indices().peekable();
    loop {
        while it.next_if(|(_, c)| *c == ',' || *c == ' ').is_some() {}
        let &(i, c) = it.peek()?;
        if c == '}' {
            return Some((labels, i + 1));
        }
        let mut key = String::new();
        loop {
            match it.next()?.1 {
                '=' => break,
                c => key.push(c),
            }
        }
        if it.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match it.next()?.1 {
                '"' => break,
                '\\' => match it.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.insert(key.trim().to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_and_aibrix_lines() {
        let text = r#"
# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 8.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 45.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2
vllm:prefix_cache_hits_total 174048
odd{a="x\"y\\z",b="1"} 3 1700000000
le_inf{le="+Inf"} +Inf
garbage line here
"#;
        let s = Scrape::parse(text);
        assert_eq!(s.sum("vllm:num_requests_running"), 8.0);
        assert_eq!(s.sum("vllm:request_success_total"), 47.0);
        assert_eq!(s.sum("vllm:prefix_cache_hits_total"), 174048.0);
        let odd = s.samples.iter().find(|x| x.name == "odd").unwrap();
        assert_eq!(odd.labels["a"], "x\"y\\z");
        assert_eq!(odd.labels["b"], "1");
        assert_eq!(odd.value, 3.0);
        assert_eq!(s.sum("le_inf"), f64::INFINITY);
        assert_eq!(s.skipped, 1);
        assert!(!s.has("absent") && s.sum("absent") == 0.0);
    }

    #[test]
    fn routing_deltas_drop_the_model_label_and_unmoved_series() {
        let before = Scrape::parse(
            r#"aibrix_prefix_cache_routing_selection_total{model="m",selection="prefix_match",using_kv_sync="false"} 10
aibrix_prefix_cache_load_imbalance_total{model="m",using_kv_sync="false"} 2
aibrix_prefix_cache_routing_latency_seconds_count{model="m",using_kv_sync="false"} 12
"#,
        );
        let after = Scrape::parse(
            r#"aibrix_prefix_cache_routing_selection_total{model="m",selection="prefix_match",using_kv_sync="false"} 105
aibrix_prefix_cache_routing_selection_total{model="m",selection="least_request_fallback",using_kv_sync="false"} 1
aibrix_prefix_cache_load_imbalance_total{model="m",using_kv_sync="false"} 2
aibrix_prefix_cache_routing_latency_seconds_count{model="m",using_kv_sync="false"} 108
"#,
        );
        let got = serde_json::to_value(routing_deltas(&before, &after)).unwrap();
        let want = serde_json::json!([
            {"name": "aibrix_prefix_cache_routing_selection_total", "labels": {"selection": "least_request_fallback", "using_kv_sync": "false"}, "delta": 1.0},
            {"name": "aibrix_prefix_cache_routing_selection_total", "labels": {"selection": "prefix_match", "using_kv_sync": "false"}, "delta": 95.0},
        ]);
        assert_eq!(got, want);
    }
}
