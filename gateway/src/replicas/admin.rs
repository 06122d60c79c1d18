//! The runtime admin API on the metrics listener (never the API port): list, add, drain and
//! remove replicas while the gateway serves, as the SGLang and vLLM routers offer.
//!
//! ```text
//! GET    /admin/replicas              200 [{name, url, origin, state, outstanding,
//!                                          cached_blocks, models, engine}, …]
//! GET    /admin/replicas/NAME         200 {…one replica…}
//! POST   /admin/replicas              {"name", "url", "model"?} → 201 {…}
//! POST   /admin/replicas/NAME/drain   202 {…, "state": "draining"}, or 200 {…, "state":
//!                                     "removed"} when nothing was in flight
//! DELETE /admin/replicas/NAME         200 {…, "state": "removed"}
//! ```
//!
//! `state` is `ready`, `ejected` (health) or `draining`; `cached_blocks` is what the prefix
//! index records for the replica; `engine` the last engine scrape (`null` without one). An
//! added replica's models come from its `/v1/models` (one health probe runs before the
//! answer), as for static backends without a `model`. A drain stops routing to the replica at
//! once; a background task removes it when its last in-flight request has ended. A removal
//! takes it out at once; requests already on it still run to their end (they hold it).
//!
//! Replicas added here live in memory only: a restart forgets them. With Kubernetes
//! discovery the watch owns the set: adding, draining or removing by hand is refused with 409
//! (delete or scale the pods instead). With `[admin] token` set, every call needs
//! `Authorization: Bearer TOKEN`. Errors are OpenAI-shaped; a refused call changes nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::metrics::Metrics;
use crate::replicas::health::{self, HealthSettings};
use crate::replicas::static_::parse_base_url;
use crate::replicas::{Origin, Replica, Replicas};
use crate::request::error::openai_error;
use crate::upstream::UpstreamClient;

/// The `[admin]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token every admin call must present (env `PREFIXGATE_ADMIN_TOKEN`); without
    /// one the admin API is open to whoever reaches the metrics listener.
    pub token: Option<String>,
}

/// How often a drain checks whether the replica's last request has ended.
const DRAIN_POLL: Duration = Duration::from_millis(50);

/// What the admin handlers need: the replica set and what probing and describing a replica
/// takes. Narrow on purpose: not the whole application state.
#[derive(Debug, Clone)]
pub struct AdminHandle {
    pub replicas: Arc<Replicas>,
    pub router: Arc<router_core::Router>,
    pub client: UpstreamClient,
    pub health: HealthSettings,
    pub metrics: Metrics,
    pub token: Option<Arc<str>>,
    /// The set comes from Kubernetes discovery: changes by hand are refused.
    pub kubernetes: bool,
}

/// The admin routes, to merge into the metrics listener's router.
pub fn routes(handle: AdminHandle) -> Router {
    Router::new()
        .route("/admin/replicas", get(list).post(add))
        .route("/admin/replicas/{name}", get(one).delete(remove))
        .route("/admin/replicas/{name}/drain", post(drain))
        .with_state(Arc::new(handle))
}

/// A refused admin call, answered OpenAI-shaped.
#[derive(Debug)]
struct AdminError {
    status: StatusCode,
    code: &'static str,
    message: String,
    param: Option<&'static str>,
}

impl AdminError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        AdminError {
            status,
            code,
            message: message.into(),
            param: None,
        }
    }

    fn bad_field(param: &'static str, message: impl Into<String>) -> Self {
        AdminError {
            param: Some(param),
            ..AdminError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
        }
    }

    fn unknown(name: &str) -> Self {
        AdminError::new(
            StatusCode::NOT_FOUND,
            "replica_not_found",
            format!("no replica named `{name}`"),
        )
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let body = openai_error(self.status, &self.message, self.code, self.param);
        (self.status, axum::Json(body)).into_response()
    }
}

type Answer = Result<Response, AdminError>;

impl AdminHandle {
    fn authorize(&self, headers: &HeaderMap) -> Result<(), AdminError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::admit::bearer_token)
            .unwrap_or_default();
        if crate::admit::constant_time_eq(presented.as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            Err(AdminError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_admin_token",
                "the admin API needs `Authorization: Bearer <admin token>`",
            ))
        }
    }

    /// Refuses hand changes to a set the Kubernetes watch owns.
    fn hand_changes_allowed(&self, what: &str) -> Result<(), AdminError> {
        if self.kubernetes {
            return Err(AdminError::new(
                StatusCode::CONFLICT,
                "replicas_from_kubernetes",
                format!(
                    "replicas come from Kubernetes discovery; {what} by deleting or scaling the pods"
                ),
            ));
        }
        Ok(())
    }

    fn find(&self, name: &str) -> Result<Arc<Replica>, AdminError> {
        self.replicas
            .find(name)
            .ok_or_else(|| AdminError::unknown(name))
    }

    /// A replica as the API shows it, with `state` overridden when given.
    fn describe(&self, replica: &Replica, state: Option<&str>) -> Value {
        let missing = replica.engine_missing();
        let engine = replica.load().engine_stats().map(|stats| {
            // A gauge the engine does not export shows as null, not as a zero it never said.
            let kv_usage = (!missing.lacks_kv_usage()).then_some(stats.kv_usage);
            json!({"running": stats.running, "waiting": stats.waiting, "kv_usage": kv_usage,
                "missing": missing.names().collect::<Vec<_>>()})
        });
        json!({
            "name": replica.name(),
            "url": replica.base_url(),
            "origin": replica.origin().as_str(),
            "state": state.unwrap_or_else(|| replica.state()),
            "outstanding": replica.load().outstanding(),
            "cached_blocks": self.router.index().blocks_held_by(replica.name()),
            "models": replica.models().as_ref(),
            "engine": engine,
        })
    }
}

fn answer(status: StatusCode, body: Value) -> Answer {
    Ok((status, axum::Json(body)).into_response())
}

async fn list(State(admin): State<Arc<AdminHandle>>, headers: HeaderMap) -> Answer {
    admin.authorize(&headers)?;
    let snapshot = admin.replicas.snapshot();
    let all: Vec<Value> = snapshot.iter().map(|r| admin.describe(r, None)).collect();
    answer(StatusCode::OK, Value::Array(all))
}

async fn one(
    State(admin): State<Arc<AdminHandle>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    admin.authorize(&headers)?;
    let replica = admin.find(&name)?;
    answer(StatusCode::OK, admin.describe(&replica, None))
}

/// `POST /admin/replicas`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewReplica {
    name: String,
    url: String,
    /// The model it serves; without it, read from its `/v1/models`.
    #[serde(default)]
    model: Option<String>,
}

async fn add(State(admin): State<Arc<AdminHandle>>, headers: HeaderMap, body: Bytes) -> Answer {
    admin.authorize(&headers)?;
    admin.hand_changes_allowed("add replicas")?;
    let new: NewReplica = serde_json::from_slice(&body).map_err(|e| {
        AdminError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("expected {{\"name\": …, \"url\": \"http://host:port\"}}: {e}"),
        )
    })?;
    let name = new.name.trim();
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(AdminError::bad_field(
            "name",
            format!(
                "`{}`: a replica name is not empty and has no spaces or `/`",
                new.name
            ),
        ));
    }
    let authority = parse_base_url(&new.url)
        .map_err(|reason| AdminError::bad_field("url", format!("`{}`: {reason}", new.url)))?;
    if let Some(existing) = admin.replicas.find(name) {
        return Err(duplicate(&existing));
    }
    let models = new.model.into_iter().collect();
    let replica = Arc::new(Replica::new(name, authority, models).with_origin(Origin::Admin));
    // One probe before it joins: its models are then known on its first request.
    health::probe(&admin.client, &replica, &admin.health, &admin.metrics).await;
    if let Err(existing) = admin.replicas.add(Arc::clone(&replica)) {
        // Another call added the name while this one probed.
        return Err(duplicate(&existing));
    }
    tracing::info!(
        pod = replica.name(),
        url = %replica.base_url(),
        models = ?replica.models(),
        "replica added by the admin API"
    );
    answer(StatusCode::CREATED, admin.describe(&replica, None))
}

fn duplicate(existing: &Replica) -> AdminError {
    AdminError {
        param: Some("name"),
        ..AdminError::new(
            StatusCode::CONFLICT,
            "replica_exists",
            format!(
                "a replica named `{}` is already in the set ({})",
                existing.name(),
                existing.base_url()
            ),
        )
    }
}

async fn drain(
    State(admin): State<Arc<AdminHandle>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    admin.authorize(&headers)?;
    admin.hand_changes_allowed("drain replicas")?;
    let replica = admin.find(&name)?;
    let first = replica.start_draining();
    if replica.load().outstanding() == 0 {
        admin.replicas.remove(&replica);
        tracing::info!(pod = %name, "replica drained (nothing in flight) and removed");
        return answer(StatusCode::OK, admin.describe(&replica, Some("removed")));
    }
    if first {
        tracing::info!(
            pod = %name,
            outstanding = replica.load().outstanding(),
            "replica draining: no new requests; removed when its requests end"
        );
        tokio::spawn(remove_when_idle(
            Arc::clone(&admin.replicas),
            Arc::clone(&replica),
        ));
    }
    answer(StatusCode::ACCEPTED, admin.describe(&replica, None))
}

/// Removes `replica` once nothing is in flight on it.
async fn remove_when_idle(replicas: Arc<Replicas>, replica: Arc<Replica>) {
    let mut ticker = tokio::time::interval(DRAIN_POLL);
    while replica.load().outstanding() > 0 {
        ticker.tick().await;
    }
    if replicas.remove(&replica) {
        tracing::info!(pod = replica.name(), "replica drained and removed");
    }
}

async fn remove(
    State(admin): State<Arc<AdminHandle>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Answer {
    admin.authorize(&headers)?;
    admin.hand_changes_allowed("remove replicas")?;
    let replica = admin.find(&name)?;
    replica.start_draining();
    admin.replicas.remove(&replica);
    tracing::info!(
        pod = %name,
        outstanding = replica.load().outstanding(),
        "replica removed by the admin API; its requests in flight run to their end"
    );
    answer(StatusCode::OK, admin.describe(&replica, Some("removed")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    /// The admin router over `replicas`, as a gateway with Kubernetes discovery builds it.
    fn kubernetes_admin(replicas: Vec<Arc<Replica>>) -> Router {
        routes(AdminHandle {
            replicas: Arc::new(Replicas::new(replicas)),
            router: Arc::new(router_core::Router::new(Default::default()).unwrap()),
            client: crate::upstream::upstream_client(
                Duration::from_secs(1),
                Duration::from_secs(1),
            ),
            health: HealthSettings {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                eject_after_failures: 3,
                readmit_after_successes: 2,
            },
            metrics: Metrics::new().unwrap(),
            token: None,
            kubernetes: true,
        })
    }

    #[tokio::test]
    async fn kubernetes_replicas_cannot_be_changed_by_hand() {
        let pod = Replica::new("vllm-0", "10.0.0.5:8000", vec!["m".into()])
            .with_origin(Origin::Kubernetes);
        let app = kubernetes_admin(vec![Arc::new(pod)]);
        for (method, path, body) in [
            (
                "POST",
                "/admin/replicas",
                r#"{"name":"x","url":"http://10.0.0.9:8000"}"#,
            ),
            ("POST", "/admin/replicas/vllm-0/drain", ""),
            ("DELETE", "/admin/replicas/vllm-0", ""),
        ] {
            let request = http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::from(body))
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::CONFLICT, "{method} {path}");
            let bytes = axum::body::to_bytes(response.into_body(), 4096)
                .await
                .unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(body["error"]["code"], "replicas_from_kubernetes");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("pods"), "{message}");
        }
        let listed = http::Request::get("/admin/replicas")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = app.oneshot(listed).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body[0]["origin"], "kubernetes");
        assert_eq!(body[0]["state"], "ready", "nothing changed");
    }
}
