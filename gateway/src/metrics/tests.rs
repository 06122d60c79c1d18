use super::*;
use router_core::load::Verdict;
use router_core::{Selection, Strategy};

fn decision(selection: Option<Selection>, match_percent: Option<u8>, imbalance: bool) -> Decision {
    Decision {
        pod: 0,
        pod_name: "a".into(),
        strategy: Strategy::PrefixCache,
        selection,
        match_percent,
        imbalance,
        outstanding_at_selection: 0,
        prefix_hashes: Vec::new(),
    }
}

#[test]
fn aibrix_metrics_have_their_names_labels_and_buckets() {
    let metrics = Metrics::new().unwrap();
    let d = decision(Some(Selection::PrefixMatch), Some(80), true);
    metrics
        .pod("a")
        .record_decision("m", &d, Duration::from_micros(15));
    metrics.record_routing_error("m", "tokenize_failed", Duration::from_micros(1));
    let text = metrics.render([]);
    for line in [
        r#"aibrix_prefix_cache_routing_decisions_total{match_percent_bucket="76-100",model="m",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_routing_selection_total{model="m",selection="prefix_match",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_load_imbalance_total{model="m",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_routing_errors_total{model="m",reason="tokenize_failed",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_routing_latency_seconds_bucket{model="m",using_kv_sync="false",le="0.00001"} 1"#,
        r#"aibrix_prefix_cache_routing_latency_seconds_bucket{model="m",using_kv_sync="false",le="0.16384"} 2"#,
        r#"aibrix_prefix_cache_routing_latency_seconds_count{model="m",using_kv_sync="false"} 2"#,
        r#"aibrix_prefix_cache_indexer_status{indexer_type="local",model=""} 1"#,
        r#"aibrix_prefix_cache_indexer_status{indexer_type="sync",model=""} 0"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    let buckets = text
        .lines()
        .filter(|l| l.starts_with("aibrix_prefix_cache_routing_latency_seconds_bucket"))
        .count();
    assert_eq!(buckets, 16, "15 finite buckets and +Inf");
}

#[test]
fn kv_sync_sets_the_label_the_indexer_and_the_zmq_families() {
    let metrics = Metrics::with_kv_sync(true).unwrap();
    let d = decision(Some(Selection::PrefixMatch), Some(80), false);
    metrics
        .pod("a")
        .record_decision("m", &d, Duration::from_micros(15));
    metrics.count_routing_error("m", "tokenize_failed");
    let zmq = metrics.kv_sync().unwrap();
    zmq.events_processed
        .with_label_values(&["pod-a", "BlockStored"])
        .inc();
    let text = metrics.render([]);
    for line in [
        r#"aibrix_prefix_cache_routing_decisions_total{match_percent_bucket="76-100",model="m",using_kv_sync="true"} 1"#,
        r#"aibrix_prefix_cache_routing_errors_total{model="m",reason="tokenize_failed",using_kv_sync="true"} 1"#,
        r#"aibrix_prefix_cache_routing_latency_seconds_count{model="m",using_kv_sync="true"} 1"#,
        r#"aibrix_prefix_cache_indexer_status{indexer_type="local",model=""} 0"#,
        r#"aibrix_prefix_cache_indexer_status{indexer_type="sync",model=""} 1"#,
        r#"aibrix_kvcache_zmq_events_processed_total{event_type="BlockStored",pod_key="pod-a"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    assert!(Metrics::new().unwrap().kv_sync().is_none());
    assert!(
        !Metrics::new()
            .unwrap()
            .render([])
            .contains("aibrix_kvcache_zmq")
    );
}

#[test]
fn non_prefix_decisions_move_no_aibrix_counter() {
    let metrics = Metrics::new().unwrap();
    metrics
        .pod("a")
        .record_decision("m", &decision(None, None, false), Duration::from_micros(5));
    let mut other = decision(Some(Selection::CostModel), Some(50), false);
    other.strategy = Strategy::LeastRequest;
    metrics
        .pod("a")
        .record_decision("m", &other, Duration::from_micros(5));
    let text = metrics.render([]);
    assert!(
        !text.contains("aibrix_prefix_cache_routing_decisions_total{"),
        "{text}"
    );
    assert!(
        !text.contains("aibrix_prefix_cache_routing_latency_seconds_count{"),
        "{text}"
    );
}

#[test]
fn prefix_load_decisions_move_the_aibrix_counters_with_their_own_label() {
    let metrics = Metrics::new().unwrap();
    let mut d = decision(Some(Selection::CostModel), Some(40), true);
    d.strategy = Strategy::PrefixLoad;
    metrics
        .pod("a")
        .record_decision("m", &d, Duration::from_micros(5));
    let text = metrics.render([]);
    for line in [
        r#"aibrix_prefix_cache_routing_decisions_total{match_percent_bucket="26-50",model="m",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_routing_selection_total{model="m",selection="cost_model",using_kv_sync="false"} 1"#,
        r#"aibrix_prefix_cache_load_imbalance_total{model="m",using_kv_sync="false"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
}

#[test]
fn requests_are_counted_by_status_code_text_and_clones_share_them() {
    let metrics = Metrics::new().unwrap();
    let clone = metrics.clone();
    metrics.record_request("m", "a", 200);
    clone.record_request("m", "a", 200);
    // Outside StatusCode's range: still counted, under its decimal text.
    metrics.record_request("m", "", 1000);
    let text = metrics.render([]);
    for line in [
        r#"prefixgate_requests_total{code="200",model="m",pod="a"} 2"#,
        r#"prefixgate_requests_total{code="1000",model="m",pod=""} 1"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
}

#[test]
fn per_pod_gauges_show_what_they_are_given() {
    let metrics = Metrics::new().unwrap();
    let pod = |outstanding, ready| PodGauges {
        pod: "a",
        outstanding,
        ready,
        models: &[],
        engine_waiting: None,
        cache_trust: router_core::load::CacheTrust::default(),
        engine_missing: &[],
    };
    let text = metrics.render([pod(1, true)]);
    assert!(
        text.contains(r#"prefixgate_outstanding_requests{pod="a"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"prefixgate_replica_ready{pod="a"} 1"#),
        "{text}"
    );
    let text = metrics.render([pod(0, false)]);
    assert!(
        text.contains(r#"prefixgate_outstanding_requests{pod="a"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"prefixgate_replica_ready{pod="a"} 0"#),
        "{text}"
    );
}

#[test]
fn model_gauges_sum_the_replicas_of_a_model_and_gone_pods_leave() {
    let metrics = Metrics::new().unwrap();
    let m = vec!["m".to_owned()];
    let other = vec!["x".to_owned()];
    let text = metrics.render([
        PodGauges {
            pod: "a",
            outstanding: 3,
            ready: true,
            models: &m,
            engine_waiting: Some(2),
            cache_trust: Default::default(),
            engine_missing: &[],
        },
        PodGauges {
            pod: "b",
            outstanding: 1,
            ready: false,
            models: &m,
            engine_waiting: Some(5),
            cache_trust: Default::default(),
            engine_missing: &[],
        },
        PodGauges {
            pod: "c",
            outstanding: 0,
            ready: true,
            models: &other,
            engine_waiting: None,
            cache_trust: Default::default(),
            engine_missing: &[],
        },
    ]);
    for line in [
        r#"prefixgate_model_in_flight_requests{model="m"} 4"#,
        r#"prefixgate_model_ready_replicas{model="m"} 1"#,
        r#"prefixgate_model_queue_depth{model="m"} 7"#,
        r#"prefixgate_model_ready_replicas{model="x"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    assert!(
        !text.contains(r#"prefixgate_model_queue_depth{model="x"}"#),
        "{text}"
    );
    // b is gone: its series and the model it alone served leave with it.
    let text = metrics.render([PodGauges {
        pod: "a",
        outstanding: 0,
        ready: true,
        models: &m,
        engine_waiting: None,
        cache_trust: Default::default(),
        engine_missing: &[],
    }]);
    assert!(!text.contains(r#"pod="b""#), "{text}");
    assert!(!text.contains(r#"model="x""#), "{text}");
    assert!(
        text.contains(r#"prefixgate_model_in_flight_requests{model="m"} 0"#),
        "{text}"
    );
}

#[test]
fn missing_engine_gauges_are_named_per_pod_and_follow_the_scrape() {
    let metrics = Metrics::new().unwrap();
    let m = vec!["m".to_owned()];
    let pod = |missing: &'static [&'static str]| PodGauges {
        pod: "a",
        outstanding: 0,
        ready: true,
        models: &m,
        engine_waiting: None,
        cache_trust: Default::default(),
        engine_missing: missing,
    };
    let text = metrics.render([pod(&["vllm:kv_cache_usage_perc"])]);
    assert!(
        text.contains(
            r#"prefixgate_engine_metric_missing{metric="vllm:kv_cache_usage_perc",pod="a"} 1"#
        ),
        "{text}"
    );
    // Present again: the series leaves rather than reading 0 as "known present".
    let text = metrics.render([pod(&[])]);
    assert!(
        !text.contains("prefixgate_engine_metric_missing{"),
        "{text}"
    );
}

/// What a request path records, done through label lookups as the gateway did before
/// per-replica handles (the reference the handles must render exactly as).
fn by_label_lookups(metrics: &Metrics, events: &[Event]) {
    let f = &metrics.families;
    let kv = f.using_kv_sync;
    for event in events {
        match *event {
            Event::Decision(pod, model, ref d, latency) => {
                let _ = pod;
                let Some((selection, bucket)) = aibrix_labels(d) else {
                    continue;
                };
                if d.imbalance {
                    f.load_imbalance.with_label_values(&[model, kv]).inc();
                }
                f.decisions.with_label_values(&[model, bucket, kv]).inc();
                f.selections
                    .with_label_values(&[model, selection, kv])
                    .inc();
                f.routing_latency
                    .with_label_values(&[model, kv])
                    .observe(latency.as_secs_f64());
            }
            Event::Request(pod, model, code) => metrics.record_request(model, pod, code),
            Event::Ttft(pod, elapsed) => f
                .upstream_ttft
                .with_label_values(&[pod])
                .observe(elapsed.as_secs_f64()),
            Event::Total(pod, elapsed) => f
                .upstream_total
                .with_label_values(&[pod])
                .observe(elapsed.as_secs_f64()),
            Event::Retry(pod) => f.retries.with_label_values(&[pod]).inc(),
            Event::CacheReport(pod, verdict) => f
                .cache_reports
                .with_label_values(&[pod, verdict.as_str()])
                .inc(),
            Event::Leave(_) => {}
        }
    }
}

/// The same through each replica's [`PodMetrics`], made when a pod is first seen and dropped
/// when it leaves (a pod that comes back gets new handles).
fn by_handles(metrics: &Metrics, events: &[Event]) {
    let mut pods: BTreeMap<&str, PodMetrics> = BTreeMap::new();
    for event in events {
        let name = match *event {
            Event::Decision(name, ..)
            | Event::Request(name, ..)
            | Event::Ttft(name, _)
            | Event::Total(name, _)
            | Event::Retry(name)
            | Event::CacheReport(name, _)
            | Event::Leave(name) => name,
        };
        if let Event::Leave(_) = event {
            pods.remove(name);
            continue;
        }
        let pod = pods.entry(name).or_insert_with(|| metrics.pod(name));
        match *event {
            Event::Decision(_, model, ref d, latency) => pod.record_decision(model, d, latency),
            Event::Request(_, model, code) => pod.record_request(model, code),
            Event::Ttft(_, elapsed) => pod.observe_ttft(elapsed),
            Event::Total(_, elapsed) => pod.observe_total(elapsed),
            Event::Retry(_) => pod.record_retry(),
            Event::CacheReport(_, verdict) => pod.record_cache_report(verdict),
            Event::Leave(_) => {}
        }
    }
}

enum Event {
    Decision(&'static str, &'static str, Decision, Duration),
    Request(&'static str, &'static str, u16),
    Ttft(&'static str, Duration),
    Total(&'static str, Duration),
    Retry(&'static str),
    CacheReport(&'static str, Verdict),
    Leave(&'static str),
}

fn requests_of_two_models_on_pods_that_come_and_go() -> Vec<Event> {
    let ms = Duration::from_millis;
    let mut events = Vec::new();
    for round in 0..3u64 {
        for (pod, model) in [("a", "m1"), ("b", "m1"), ("a", "m2"), ("c", "m2")] {
            let mut d = decision(Some(Selection::PrefixMatch), Some(80), round == 1);
            d.pod_name = pod.into();
            events.push(Event::Decision(
                pod,
                model,
                d,
                Duration::from_micros(15 + round),
            ));
            let mut skipped = decision(Some(Selection::PrefixMatchSkipped), Some(0), false);
            skipped.strategy = if round == 2 {
                Strategy::PrefixLoad
            } else {
                Strategy::PrefixCache
            };
            events.push(Event::Decision(
                pod,
                model,
                skipped,
                Duration::from_micros(3),
            ));
            let mut plain = decision(None, None, false);
            plain.strategy = Strategy::LeastRequest;
            events.push(Event::Decision(pod, model, plain, Duration::from_micros(1)));
            for code in [200, 200, 503, 1000] {
                events.push(Event::Request(pod, model, code));
            }
            events.push(Event::Ttft(pod, ms(3 * round + 1)));
            events.push(Event::Total(pod, ms(700 * round + 2)));
            events.push(Event::Retry(pod));
            for verdict in Verdict::ALL {
                events.push(Event::CacheReport(pod, verdict));
            }
        }
        // b leaves and, in the next round, a replica of that name is back.
        events.push(Event::Leave("b"));
    }
    events
}

#[test]
fn per_replica_handles_render_exactly_as_label_lookups() {
    let events = requests_of_two_models_on_pods_that_come_and_go();
    for kv_sync in [false, true] {
        let reference = Metrics::with_kv_sync(kv_sync).unwrap();
        by_label_lookups(&reference, &events);
        let handles = Metrics::with_kv_sync(kv_sync).unwrap();
        by_handles(&handles, &events);
        let expected = reference.render([]);
        assert!(expected.contains(r#"prefixgate_upstream_retries_total{pod="b"} 3"#));
        assert_eq!(handles.render([]), expected);
    }
}

#[test]
fn handles_make_no_series_until_something_is_counted() {
    let fresh = Metrics::new().unwrap().render([]);
    let metrics = Metrics::new().unwrap();
    let pod = metrics.pod("a");
    // A decision that moves no AIBrix counter resolves nothing either.
    pod.record_decision("m", &decision(None, None, false), Duration::from_micros(5));
    assert_eq!(metrics.render([]), fresh);
    pod.record_retry();
    assert!(
        metrics
            .render([])
            .contains(r#"prefixgate_upstream_retries_total{pod="a"} 1"#)
    );
}
