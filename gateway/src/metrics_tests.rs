use super::*;
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
    metrics.record_decision("m", &d, Duration::from_micros(15));
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
    metrics.record_decision("m", &d, Duration::from_micros(15));
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
    metrics.record_decision("m", &decision(None, None, false), Duration::from_micros(5));
    let mut other = decision(Some(Selection::CostModel), Some(50), false);
    other.strategy = Strategy::LeastRequest;
    metrics.record_decision("m", &other, Duration::from_micros(5));
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
    metrics.record_decision("m", &d, Duration::from_micros(5));
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
        },
        PodGauges {
            pod: "b",
            outstanding: 1,
            ready: false,
            models: &m,
            engine_waiting: Some(5),
            cache_trust: Default::default(),
        },
        PodGauges {
            pod: "c",
            outstanding: 0,
            ready: true,
            models: &other,
            engine_waiting: None,
            cache_trust: Default::default(),
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
    }]);
    assert!(!text.contains(r#"pod="b""#), "{text}");
    assert!(!text.contains(r#"model="x""#), "{text}");
    assert!(
        text.contains(r#"prefixgate_model_in_flight_requests{model="m"} 0"#),
        "{text}"
    );
}
