//! A phase's cluster events in local mode, made to happen while its load runs: a drain (a
//! replica leaves) and a scale-up (replicas join), at their engine times on the phase clock.
//!
//! - **native drain**: the engine gets vLLM's SIGTERM (mock-engine's `ReplicaHandle::drain`:
//!   connections refused, streams finish, or are cut at `grace`). The gateway is told nothing;
//!   it learns from refused connections (retried elsewhere, then ejected) and failed probes,
//!   as with a Kubernetes pod deleted without a preStop hook and not yet seen by discovery.
//! - **graceful drain**: the replica first leaves the gateway's set through its admin API
//!   (`POST /admin/replicas/NAME/drain`: no new request; the ones in flight run out), as a pod
//!   marked terminating leaves the watched set; once the gateway has removed it the engine
//!   gets SIGTERM and stops with nothing in flight.
//! - **scale-up**: a new replica starts and joins the gateway through `POST /admin/replicas`
//!   (the Kubernetes watch's job in a cluster); it is "ready" when the gateway answers.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use crate::measure::DrainObserved;
use crate::run::live::request::{HttpClient, PhaseClock};
use crate::run::local::LocalStack;
use crate::workload::cluster_events::{DrainDef, DrainKind, ScaleUpDef};

/// What the events did, as the runner saw them.
#[derive(Debug, Default)]
pub struct EventsSeen {
    pub drain: Option<DrainObserved>,
    /// Each added replica and when the gateway had it (phase seconds).
    pub added: Vec<(String, f64)>,
}

/// How often a graceful drain asks the gateway whether the replica has left.
const REMOVAL_POLL: Duration = Duration::from_millis(20);

/// Runs the phase's events against `stack`; returns when every one has finished (a drained
/// engine stopped, added replicas joined).
pub async fn run_events(
    drain: Option<&DrainDef>,
    scale_up: Option<&ScaleUpDef>,
    stack: &LocalStack,
    clock: PhaseClock,
    client: &HttpClient,
    limit: Duration,
) -> Result<EventsSeen, String> {
    let drained = async {
        match drain {
            Some(def) => run_drain(def, stack, clock, client, limit).await.map(Some),
            None => Ok(None),
        }
    };
    let added = async {
        match scale_up {
            Some(def) => run_scale_up(def, stack, clock, client, limit).await,
            None => Ok(Vec::new()),
        }
    };
    let (drain, added) = tokio::join!(drained, added);
    Ok(EventsSeen {
        drain: drain?,
        added: added?,
    })
}

async fn run_drain(
    def: &DrainDef,
    stack: &LocalStack,
    clock: PhaseClock,
    client: &HttpClient,
    limit: Duration,
) -> Result<DrainObserved, String> {
    tokio::time::sleep_until(clock.instant(def.at)).await;
    let names = stack.replica_names();
    let name = match &def.replica {
        Some(name) => name.clone(),
        None => names
            .last()
            .cloned()
            .ok_or("drain: no replica is running")?,
    };
    let handle = stack
        .take_replica(&name)
        .ok_or_else(|| format!("drain.replica `{name}` is not one of {names:?}"))?;
    let grace = def.grace.map(|g| Duration::from_secs_f64(g / clock.scale));
    let mut in_flight_at_signal = handle.in_flight();
    let mut signalled_s = clock.now();
    if def.kind == DrainKind::Graceful {
        let admin = format!("{}/admin/replicas/{name}", stack.admin_base());
        let (status, body) = admin_call(client, "POST", &format!("{admin}/drain"), None).await?;
        if !matches!(status, 200 | 202) {
            return Err(format!("admin drain of {name}: {status} {body}"));
        }
        // Signalled when the gateway has answered: from then on it routes nothing there (a
        // request sent during the call may still have been).
        signalled_s = clock.now();
        in_flight_at_signal = handle.in_flight();
        // Gone from the gateway's set once its last request has ended.
        let deadline = tokio::time::Instant::now() + limit;
        while admin_call(client, "GET", &admin, None).await?.0 != 404 {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "the gateway did not finish draining {name} in {limit:?}"
                ));
            }
            tokio::time::sleep(REMOVAL_POLL).await;
        }
    }
    let outcome = handle.drain(grace).finished().await;
    Ok(DrainObserved {
        replica: name,
        kind: def.kind.as_str().to_owned(),
        signalled_s,
        exited_s: clock.now(),
        in_flight_at_signal,
        cut: outcome.cut,
    })
}

async fn run_scale_up(
    def: &ScaleUpDef,
    stack: &LocalStack,
    clock: PhaseClock,
    client: &HttpClient,
    limit: Duration,
) -> Result<Vec<(String, f64)>, String> {
    tokio::time::sleep_until(clock.instant(def.at)).await;
    let model = &stack.target().model;
    let mut added = Vec::with_capacity(def.add);
    for _ in 0..def.add {
        let name = next_name(&stack.names_ever());
        let url = stack.start_replica(&name).await?;
        let body = serde_json::json!({"name": name, "url": url, "model": model}).to_string();
        let admin = format!("{}/admin/replicas", stack.admin_base());
        let (status, answer) =
            tokio::time::timeout(limit, admin_call(client, "POST", &admin, Some(body)))
                .await
                .map_err(|_| format!("adding {name}: no answer in {limit:?}"))??;
        if status != 201 {
            return Err(format!(
                "adding {name} through the admin API: {status} {answer}"
            ));
        }
        added.push((name, clock.now()));
    }
    Ok(added)
}

/// A name for a new replica, after `taken` (every name the stack ever ran): the last name
/// with its final capital advanced (`L20-A`, `L20-B` → `L20-C`), else `LAST-N`.
fn next_name(taken: &[String]) -> String {
    let last = taken.last().map_or("replica", String::as_str);
    let advanced = match last.chars().last() {
        Some(c @ 'A'..='Y') => {
            let next = char::from(c as u8 + 1);
            Some(format!("{}{next}", &last[..last.len() - 1]))
        }
        _ => None,
    };
    advanced
        .filter(|name| !taken.contains(name))
        .unwrap_or_else(|| {
            (taken.len()..)
                .map(|i| format!("{last}-{i}"))
                .find(|name| !taken.contains(name))
                .unwrap_or_default()
        })
}

/// One admin API call: status and body text.
async fn admin_call(
    client: &HttpClient,
    method: &str,
    url: &str,
    body: Option<String>,
) -> Result<(u16, String), String> {
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{method} {url}: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_replicas_continue_the_stacks_naming() {
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(next_name(&names(&["L20-A"])), "L20-B");
        assert_eq!(next_name(&names(&["L20-A", "L20-B"])), "L20-C");
        assert_eq!(next_name(&names(&["L20-A", "L20-B", "L20-Z"])), "L20-Z-3");
        assert_eq!(next_name(&names(&["mock-0"])), "mock-0-1");
        assert_eq!(next_name(&[]), "replica-0");
    }
}
