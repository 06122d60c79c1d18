//! Kubernetes pod discovery (SPEC §3.4): the replica set follows the pods labelled
//! `model.aibrix.ai/name` in one namespace.
//!
//! [`spawn`] starts a task that lists and watches those pods ([`watch`]: kube-runtime's
//! watcher over a [`client`] built from the `[discovery]` settings) and keeps a [`PodTable`]:
//! every pod seen (k8s-openapi's `Pod`), translated by [`pod`] into routable or not. After
//! each change the table publishes a new [`Replicas`] snapshot holding one [`Replica`] per
//! routable pod. A pod that stays routable at the same address keeps its `Replica` (its
//! load view, outstanding count and health counters); a new pod, or one whose IP or model
//! changed, gets a new one. A pod that stops being routable (not Ready, terminating,
//! deleted) leaves the snapshot at once, so it is sent no new requests, while requests
//! already on it keep their `Arc<Replica>` and finish: that is the drain.
//!
//! Selection: with models configured, the label selector is `model.aibrix.ai/name in
//! (a,b)`; without, every pod that has the label key. If the API server cannot be reached
//! the last snapshot stays in force and the watcher retries with bounded backoff.

pub mod client;
pub mod pod;
pub mod watch;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch as signal;

use crate::replicas::discovery::DiscoveryConfig;
use crate::replicas::{Origin, Replica, Replicas};

use self::client::ApiServer;
use self::pod::{PodLabels, PodState};
use self::watch::WatchSettings;

/// The namespace when neither the configuration nor the service account names one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// A watch connection may stay silent this long past its `timeoutSeconds` before the client
/// gives up on it and the watch is resumed.
const WATCH_MARGIN: Duration = Duration::from_secs(30);

/// Every pod seen in the watched namespace and selection, and the snapshot built from it.
#[derive(Debug)]
pub struct PodTable {
    labels: PodLabels,
    pods: BTreeMap<String, PodState>,
    replicas: Arc<Replicas>,
    /// Counts published snapshots, so start-up can wait for the first list.
    published: signal::Sender<u64>,
}

impl PodTable {
    pub fn new(labels: PodLabels, replicas: Arc<Replicas>) -> (Self, signal::Receiver<u64>) {
        let (published, receiver) = signal::channel(0);
        let table = PodTable {
            labels,
            pods: BTreeMap::new(),
            replicas,
            published,
        };
        (table, receiver)
    }

    /// Replaces every pod with a fresh list (the first list, or a relist after 410 Gone).
    pub fn replace_all(&mut self, pods: Vec<Pod>) {
        let mut seen = BTreeMap::new();
        for pod in pods.iter().filter(|pod| has_name(pod)) {
            let state = PodState::of(pod, &self.labels);
            let name = pod::name(pod).to_owned();
            log_change(&name, self.pods.get(&name), &state);
            seen.insert(name, state);
        }
        for (name, old) in &self.pods {
            if !seen.contains_key(name) && matches!(old, PodState::Routable(_)) {
                tracing::info!(pod = %name, "pod gone: removed from routing");
            }
        }
        self.pods = seen;
        self.publish();
    }

    /// Applies an `ADDED` or `MODIFIED` event.
    pub fn upsert(&mut self, pod: &Pod) {
        if !has_name(pod) {
            return;
        }
        let name = pod::name(pod);
        let state = PodState::of(pod, &self.labels);
        log_change(name, self.pods.get(name), &state);
        self.pods.insert(name.to_owned(), state);
        self.publish();
    }

    /// Applies a `DELETED` event.
    pub fn remove(&mut self, name: &str) {
        if let Some(PodState::Routable(_)) = self.pods.remove(name) {
            tracing::info!(pod = %name, "pod deleted: removed from routing");
        }
        self.publish();
    }

    /// Swaps in the snapshot of the routable pods, reusing the `Replica` of each pod whose
    /// name, address and model are unchanged.
    fn publish(&self) {
        let current = self.replicas.snapshot();
        let next: Vec<Arc<Replica>> = self
            .pods
            .values()
            .filter_map(|state| match state {
                PodState::Routable(endpoint) => Some(endpoint),
                _ => None,
            })
            .map(|endpoint| {
                current
                    .iter()
                    .find(|r| {
                        r.name() == endpoint.name
                            && r.authority() == endpoint.authority
                            && r.publishes_kv_events() == endpoint.kv_events
                            && matches!(r.models().as_slice(), [m] if *m == endpoint.model)
                    })
                    .map(Arc::clone)
                    .unwrap_or_else(|| {
                        let replica = Replica::new(
                            endpoint.name.clone(),
                            endpoint.authority.clone(),
                            vec![endpoint.model.clone()],
                        )
                        .with_origin(Origin::Kubernetes);
                        Arc::new(if endpoint.kv_events {
                            replica
                        } else {
                            replica.without_kv_events()
                        })
                    })
            })
            .collect();
        let unchanged = next.len() == current.len()
            && next
                .iter()
                .zip(current.iter())
                .all(|(a, b)| Arc::ptr_eq(a, b));
        if !unchanged {
            self.replicas.replace(next);
        }
        self.published.send_modify(|count| *count += 1);
    }
}

/// Whether `pod` has a name to be kept under; one without is logged and left out.
fn has_name(pod: &Pod) -> bool {
    let named = !pod::name(pod).is_empty();
    if !named {
        tracing::warn!("pod without metadata.name skipped");
    }
    named
}

/// Logs what a pod's new state means, once per change.
fn log_change(name: &str, old: Option<&PodState>, new: &PodState) {
    if old == Some(new) {
        return;
    }
    match new {
        PodState::Routable(endpoint) => tracing::info!(
            pod = %name,
            model = %endpoint.model,
            address = %endpoint.authority,
            "pod routable"
        ),
        PodState::NotRoutable(reason) => {
            if matches!(old, Some(PodState::Routable(_))) {
                tracing::info!(pod = %name, reason, "pod removed from routing; in-flight requests finish");
            } else {
                tracing::debug!(pod = %name, reason, "pod not routable yet");
            }
        }
        PodState::Invalid(problem) => {
            tracing::warn!(pod = %name, %problem, "pod skipped");
        }
    }
}

/// The label selector for `models` (all pods with the label key when empty).
pub fn label_selector(model_label: &str, models: &[String]) -> String {
    match models {
        [] => model_label.to_owned(),
        [model] => format!("{model_label}={model}"),
        models => format!("{model_label} in ({})", models.join(",")),
    }
}

/// The namespace to watch: the configured one, else the pod's own (the service account's
/// `namespace` file), else `default`.
pub fn namespace(configured: Option<&str>, service_account_dir: &Path) -> String {
    if let Some(namespace) = configured {
        return namespace.to_owned();
    }
    std::fs::read_to_string(service_account_dir.join("namespace"))
        .ok()
        .map(|text| text.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned())
}

/// A running discovery task and the count of snapshots it has published.
#[derive(Debug)]
pub struct Discovery {
    pub task: tokio::task::JoinHandle<()>,
    pub published: signal::Receiver<u64>,
}

impl Discovery {
    /// Waits until the first pod list has been applied, or `limit` passed; whether it was.
    pub async fn first_sync(&mut self, limit: Duration) -> bool {
        let first = self.published.wait_for(|count| *count > 0);
        matches!(tokio::time::timeout(limit, first).await, Ok(Ok(_)))
    }
}

/// Starts watching as configured, publishing into `replicas`. Errors name what is wrong
/// with the configuration or the pod's service account files.
pub fn spawn(
    config: &DiscoveryConfig,
    env: impl Fn(&str) -> Option<String>,
    service_account_dir: &Path,
    replicas: Arc<Replicas>,
) -> Result<Discovery, String> {
    let server = ApiServer::locate(config.api_server.as_deref(), env, service_account_dir)?;
    let namespace = namespace(config.namespace.as_deref(), service_account_dir);
    let selector = label_selector(&config.model_label, &config.models);
    let watch_timeout = Duration::from_secs(config.watch_timeout_secs);
    let client = server.client(&namespace, watch_timeout + WATCH_MARGIN)?;
    tracing::info!(
        api_server = %server.url,
        %namespace,
        %selector,
        "Kubernetes pod discovery"
    );
    let settings = WatchSettings {
        selector,
        watch_timeout,
        backoff_initial: Duration::from_millis(config.backoff_initial_ms),
        backoff_max: Duration::from_millis(config.backoff_max_ms),
    };
    let labels = PodLabels::of(config);
    let (table, published) = PodTable::new(labels, replicas);
    let pods = kube::Api::namespaced(client, &namespace);
    let task = tokio::spawn(watch::run(pods, settings, table));
    Ok(Discovery { task, published })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> PodLabels {
        PodLabels::of(&DiscoveryConfig::default())
    }

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"model.aibrix.ai/name": "m"}},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
            }
        }))
        .unwrap()
    }

    fn names(replicas: &Replicas) -> Vec<String> {
        replicas
            .snapshot()
            .iter()
            .map(|r| r.name().to_owned())
            .collect()
    }

    #[test]
    fn routable_pods_become_replicas_and_keep_their_identity() {
        let replicas = Arc::new(Replicas::new(Vec::new()));
        let (mut table, published) = PodTable::new(labels(), Arc::clone(&replicas));
        table.replace_all(vec![
            pod("a", "10.0.0.1", true),
            pod("b", "10.0.0.2", false),
        ]);
        assert_eq!(names(&replicas), ["a"]);
        assert_eq!(*published.borrow(), 1);
        let a = Arc::clone(&replicas.snapshot()[0]);
        assert_eq!(a.authority(), "10.0.0.1:8000");
        assert!(a.serves("m"));

        table.upsert(&pod("b", "10.0.0.2", true));
        assert_eq!(names(&replicas), ["a", "b"]);
        assert!(
            Arc::ptr_eq(&replicas.snapshot()[0], &a),
            "a stays the same replica"
        );

        // Not Ready: out at once; the Arc held by an in-flight request stays valid.
        table.upsert(&pod("a", "10.0.0.1", false));
        assert_eq!(names(&replicas), ["b"]);
        assert_eq!(a.name(), "a");

        // Back, and with a new IP: a new replica (new load view, new health counters).
        table.upsert(&pod("a", "10.0.0.9", true));
        let again = Arc::clone(&replicas.snapshot()[0]);
        assert_eq!(again.authority(), "10.0.0.9:8000");
        assert!(!Arc::ptr_eq(&again, &a));

        table.remove("b");
        assert_eq!(names(&replicas), ["a"]);
        table.replace_all(Vec::new());
        assert!(replicas.snapshot().is_empty());
    }

    #[test]
    fn an_unchanged_event_does_not_swap_the_snapshot() {
        let replicas = Arc::new(Replicas::new(Vec::new()));
        let (mut table, _published) = PodTable::new(labels(), Arc::clone(&replicas));
        table.replace_all(vec![pod("a", "10.0.0.1", true)]);
        let before = replicas.snapshot();
        table.upsert(&pod("a", "10.0.0.1", true));
        assert!(Arc::ptr_eq(&before, &replicas.snapshot()));
    }

    #[test]
    fn a_pod_with_a_bad_port_label_is_skipped() {
        let replicas = Arc::new(Replicas::new(Vec::new()));
        let (mut table, _published) = PodTable::new(labels(), Arc::clone(&replicas));
        let mut bad: serde_json::Value = serde_json::json!({
            "metadata": {"name": "bad", "labels": {
                "model.aibrix.ai/name": "m", "model.aibrix.ai/port": "eighty"}},
            "status": {"podIP": "10.0.0.3", "conditions": [{"type": "Ready", "status": "True"}]}
        });
        table.replace_all(vec![
            serde_json::from_value(bad.take()).unwrap(),
            pod("a", "10.0.0.1", true),
        ]);
        assert_eq!(names(&replicas), ["a"]);
    }

    #[test]
    fn selectors_and_namespaces() {
        let key = "model.aibrix.ai/name";
        assert_eq!(label_selector(key, &[]), key);
        assert_eq!(
            label_selector(key, &["q".to_owned()]),
            "model.aibrix.ai/name=q"
        );
        assert_eq!(
            label_selector(key, &["a".to_owned(), "b".to_owned()]),
            "model.aibrix.ai/name in (a,b)"
        );
        let none = Path::new("/nonexistent-prefixgate-sa");
        assert_eq!(namespace(Some("llm"), none), "llm");
        assert_eq!(namespace(None, none), DEFAULT_NAMESPACE);
        let dir = std::env::temp_dir().join(format!("prefixgate-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("namespace"), "inference\n").unwrap();
        assert_eq!(namespace(None, &dir), "inference");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
