//! Active health checks: probe each replica's `/health`, eject after consecutive failures,
//! re-admit after consecutive successes, and learn a replica's models from `/v1/models`
//! when the configuration did not name them.
//!
//! The request path reports refused connections through the same counters (passive health),
//! so a dead replica is ejected by whichever notices first. One probe round runs before the
//! gateway starts serving, so models are known on the first request.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::metrics::Metrics;
use crate::replicas::{HealthChange, Replica, Replicas};
use crate::upstream::UpstreamClient;

/// The health checker's settings.
#[derive(Debug, Clone, Copy)]
pub struct HealthSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub eject_after_failures: u32,
    pub readmit_after_successes: u32,
}

/// Largest body read from a replica's `/v1/models` or `/metrics`, so a broken replica
/// cannot make the gateway buffer without bound.
const MAX_PROBE_BODY: usize = 4 * 1024 * 1024;

/// `GET url` with a deadline covering the whole exchange; the status and body.
pub async fn get(
    client: &UpstreamClient,
    url: &str,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), String> {
    let request = Request::get(url)
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad URL {url}: {e}"))?;
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = http_body_util::Limited::new(response.into_body(), MAX_PROBE_BODY)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no answer from {url} within {} ms", timeout.as_millis()))?
}

/// The model ids of an OpenAI `/v1/models` body.
pub fn parse_models(body: &[u8]) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("/v1/models is not JSON: {e}"))?;
    let data = value
        .get("data")
        .and_then(|d| d.as_array())
        .ok_or_else(|| "/v1/models has no `data` list".to_owned())?;
    Ok(data
        .iter()
        .filter_map(|m| m.get("id").and_then(|id| id.as_str()).map(str::to_owned))
        .collect())
}

/// Probes one replica and applies the result.
pub async fn probe(
    client: &UpstreamClient,
    replica: &Replica,
    settings: &HealthSettings,
    metrics: &Metrics,
) {
    let url = format!("{}/health", replica.base_url());
    let healthy =
        matches!(get(client, &url, settings.timeout).await, Ok((status, _)) if status.is_success());
    let change = if healthy {
        if replica.models().is_empty() {
            discover_models(client, replica, settings.timeout).await;
        }
        replica.report_success(settings.readmit_after_successes)
    } else {
        replica.report_failure(settings.eject_after_failures)
    };
    match change {
        HealthChange::Ejected => {
            tracing::warn!(
                pod = replica.name(),
                "replica ejected after failed health checks"
            );
            metrics.record_ejection(replica.name());
        }
        HealthChange::Readmitted => {
            tracing::info!(pod = replica.name(), "replica re-admitted");
            metrics.record_readmission(replica.name());
        }
        HealthChange::Unchanged => {}
    }
}

async fn discover_models(client: &UpstreamClient, replica: &Replica, timeout: Duration) {
    let url = format!("{}/v1/models", replica.base_url());
    match get(client, &url, timeout).await {
        Ok((status, body)) if status.is_success() => match parse_models(&body) {
            Ok(models) => replica.set_models(models),
            Err(error) => tracing::warn!(pod = replica.name(), %error, "cannot read models"),
        },
        Ok((status, _)) => {
            tracing::warn!(pod = replica.name(), %status, "/v1/models failed");
        }
        Err(error) => tracing::warn!(pod = replica.name(), %error, "/v1/models failed"),
    }
}

/// Probes every replica of the current set, concurrently.
pub async fn probe_all(
    client: &UpstreamClient,
    replicas: &Replicas,
    settings: &HealthSettings,
    metrics: &Metrics,
) {
    let snapshot = replicas.snapshot();
    futures_util::future::join_all(
        snapshot
            .iter()
            .map(|replica| probe(client, replica, settings, metrics)),
    )
    .await;
}

/// Probes forever, every `settings.interval`; stopped by aborting the task.
pub fn spawn(
    client: UpstreamClient,
    replicas: Arc<Replicas>,
    settings: HealthSettings,
    metrics: Metrics,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            probe_all(&client, &replicas, &settings, &metrics).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_are_read_from_the_openai_list() {
        let body = br#"{"object":"list","data":[{"id":"a","object":"model"},{"id":"b"}]}"#;
        assert_eq!(parse_models(body).unwrap(), vec!["a", "b"]);
        assert!(parse_models(b"{}").unwrap_err().contains("data"));
        assert!(parse_models(b"<html>").unwrap_err().contains("JSON"));
    }
}
