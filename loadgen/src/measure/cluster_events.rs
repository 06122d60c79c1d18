//! What a phase's cluster events did, from what the runner saw of them and the requests'
//! records: the drain record (which replica, when it was signalled and exited, how many
//! requests it served before and after), the scale-up record (when each new replica was
//! ready and took its first request), and the per-replica split over time. Times are phase
//! seconds (engine time), as every record's.
//!
//! A request counts for the replica named by its `target-pod` (the replica that answered,
//! after any retry), at the time it was sent. So a request the drained replica refused and
//! the gateway retried elsewhere counts for the replica that served it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::RequestRecord;

/// A drained replica, as the result file records it (`"drain"` of a phase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRecord {
    pub replica: String,
    /// `native` or `graceful`.
    pub kind: String,
    /// When it was told to leave: SIGTERM (native), or the gateway's answer that it left the
    /// routing set (graceful).
    pub signalled_s: f64,
    /// When its engine had stopped.
    pub exited_s: f64,
    /// Requests it served that were sent before / after `signalled_s`.
    pub requests_before: usize,
    pub requests_after: usize,
    /// Requests in its engine at the signal.
    pub in_flight_at_signal: usize,
    /// Requests its engine cut at its grace period (0 when every stream finished).
    pub cut: usize,
}

/// What the runner observed of a drain; [`drain_record`] adds the request counts.
#[derive(Debug, Clone, PartialEq)]
pub struct DrainObserved {
    pub replica: String,
    pub kind: String,
    pub signalled_s: f64,
    pub exited_s: f64,
    pub in_flight_at_signal: usize,
    pub cut: usize,
}

/// The drain record of `observed`, with the replica's requests counted from `records`.
pub fn drain_record<'a>(
    observed: DrainObserved,
    records: impl IntoIterator<Item = &'a RequestRecord>,
) -> DrainRecord {
    let (mut before, mut after) = (0, 0);
    for record in records {
        if record.target_pod.as_deref() == Some(observed.replica.as_str()) {
            if record.dispatched < observed.signalled_s {
                before += 1;
            } else {
                after += 1;
            }
        }
    }
    DrainRecord {
        replica: observed.replica,
        kind: observed.kind,
        signalled_s: observed.signalled_s,
        exited_s: observed.exited_s,
        requests_before: before,
        requests_after: after,
        in_flight_at_signal: observed.in_flight_at_signal,
        cut: observed.cut,
    }
}

/// One replica added during a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddedReplica {
    pub name: String,
    /// When the gateway had it in its set (the admin API's answer; a request sent during
    /// that call may reach it first, so the wait below can be a little negative: the send
    /// latency, at most).
    pub ready_s: f64,
    /// When the first request it served was sent (`null` if none).
    pub first_request_s: Option<f64>,
    /// `first_request_s − ready_s`: how long the new capacity sat unused.
    pub ready_to_first_request_s: Option<f64>,
    /// Requests it served in the phase.
    pub requests: usize,
}

/// The replicas a phase added (`"scale_up"` of a phase).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleUpRecord {
    pub added: Vec<AddedReplica>,
}

/// The scale-up record for replicas that became ready at the given times.
pub fn scale_up_record<'a>(
    ready: &[(String, f64)],
    records: impl IntoIterator<Item = &'a RequestRecord> + Clone,
) -> ScaleUpRecord {
    let added = ready
        .iter()
        .map(|(name, ready_s)| {
            let served: Vec<f64> = records
                .clone()
                .into_iter()
                .filter(|r| r.target_pod.as_deref() == Some(name.as_str()))
                .map(|r| r.dispatched)
                .collect();
            let first = served.iter().copied().reduce(f64::min);
            AddedReplica {
                name: name.clone(),
                ready_s: *ready_s,
                first_request_s: first,
                ready_to_first_request_s: first.map(|f| f - ready_s),
                requests: served.len(),
            }
        })
        .collect();
    ScaleUpRecord { added }
}

/// Requests per replica per time bucket (`"replica_split"` of a phase with cluster events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSplit {
    /// Bucket width, phase seconds; bucket `i` covers `[i·bucket_s, (i+1)·bucket_s)`.
    pub bucket_s: f64,
    /// Replica → requests it served that were sent in each bucket (all the same length).
    pub requests: BTreeMap<String, Vec<usize>>,
}

/// The split of `records` over `buckets` buckets spanning `span` seconds (requests sent
/// later fall in the last bucket); requests no replica answered are left out.
pub fn replica_split<'a>(
    records: impl IntoIterator<Item = &'a RequestRecord>,
    span: f64,
    buckets: usize,
) -> ReplicaSplit {
    let buckets = buckets.max(1);
    let bucket_s = if span > 0.0 {
        span / buckets as f64
    } else {
        1.0
    };
    let mut requests: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for record in records {
        let Some(pod) = &record.target_pod else {
            continue;
        };
        let slot = ((record.dispatched.max(0.0) / bucket_s) as usize).min(buckets - 1);
        requests
            .entry(pod.clone())
            .or_insert_with(|| vec![0; buckets])[slot] += 1;
    }
    ReplicaSplit { bucket_s, requests }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(pod: &str, at: f64) -> RequestRecord {
        let mut record = RequestRecord::sent(0, 0, at, at);
        record.target_pod = Some(pod.to_owned());
        record
    }

    #[test]
    fn a_drain_counts_the_replicas_requests_around_its_signal() {
        let records = [
            served("A", 1.0),
            served("B", 2.0),
            served("B", 9.9),
            served("A", 10.0),
            served("B", 10.0),
            RequestRecord::sent(5, 0, 11.0, 11.0),
        ];
        let observed = DrainObserved {
            replica: "B".into(),
            kind: "native".into(),
            signalled_s: 10.0,
            exited_s: 30.0,
            in_flight_at_signal: 2,
            cut: 0,
        };
        let record = drain_record(observed, &records);
        assert_eq!((record.requests_before, record.requests_after), (2, 1));
        assert_eq!(record.in_flight_at_signal, 2);
        let json = serde_json::to_value(&record).unwrap();
        for key in [
            "replica",
            "kind",
            "signalled_s",
            "exited_s",
            "requests_before",
            "requests_after",
            "in_flight_at_signal",
        ] {
            assert!(json.get(key).is_some(), "{key} missing: {json}");
        }
    }

    #[test]
    fn a_scale_up_reports_the_wait_before_the_first_request() {
        let records = [served("A", 1.0), served("C", 12.5), served("C", 20.0)];
        let ready = [("C".to_owned(), 10.0), ("D".to_owned(), 11.0)];
        let record = scale_up_record(&ready, &records);
        assert_eq!(record.added[0].first_request_s, Some(12.5));
        assert_eq!(record.added[0].ready_to_first_request_s, Some(2.5));
        assert_eq!(record.added[0].requests, 2);
        assert_eq!(record.added[1].first_request_s, None);
        assert_eq!(record.added[1].requests, 0);
    }

    #[test]
    fn the_split_buckets_requests_by_send_time_per_replica() {
        let records = [
            served("A", 0.0),
            served("A", 4.9),
            served("B", 5.0),
            served("B", 99.0),
            RequestRecord::sent(9, 0, 1.0, 1.0),
        ];
        let split = replica_split(&records, 10.0, 2);
        assert_eq!(split.bucket_s, 5.0);
        assert_eq!(split.requests["A"], vec![2, 0]);
        assert_eq!(
            split.requests["B"],
            vec![0, 2],
            "late sends fall in the last bucket"
        );
    }
}
