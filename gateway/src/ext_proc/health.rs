//! The gRPC health service (`grpc.health.v1.Health`) on the ext_proc listener, which Envoy's
//! gRPC health checks and the kubelet's `grpc` probes ask.
//!
//! The services it knows, as the Inference Extension's endpoint picker names them:
//! `liveness` is always `SERVING` (the process answers); `readiness`, the empty name (the
//! server as a whole), `envoy.service.ext_proc.v3.ExternalProcessor` and
//! `inference-extension` (the name the Inference Extension's chart probes) are `SERVING`
//! while some replica takes requests and `NOT_SERVING` otherwise, like the HTTP listener's
//! `/ready`. An unknown name is `NOT_FOUND` to `Check` and `SERVICE_UNKNOWN` to `Watch`, as
//! the protocol says. `Watch` sends the status at once and then each change, looking every
//! [`WATCH_INTERVAL`], until the caller goes away.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::Health;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::replicas::Replicas;

/// How often a `Watch` looks at readiness again.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The service names that follow readiness.
const READINESS: [&str; 4] = [
    "",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
    "inference-extension",
];

/// Health as the replica set makes it.
#[derive(Debug, Clone)]
pub struct ExtProcHealth {
    replicas: Arc<Replicas>,
}

impl ExtProcHealth {
    pub fn new(replicas: Arc<Replicas>) -> Self {
        ExtProcHealth { replicas }
    }

    /// The status of `service`, `None` for a name this server does not know.
    fn status(&self, service: &str) -> Option<ServingStatus> {
        if service == "liveness" {
            return Some(ServingStatus::Serving);
        }
        READINESS.contains(&service).then(|| {
            if self.replicas.any_ready() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            }
        })
    }
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

#[tonic::async_trait]
impl Health for ExtProcHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match self.status(service) {
            Some(status) => Ok(Response::new(answer(status))),
            None => Err(Status::not_found(format!("unknown service {service:?}"))),
        }
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let health = self.clone();
        let service = request.into_inner().service;
        let mut ticks = tokio::time::interval(WATCH_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let changes = futures_util::stream::unfold(
            (health, service, ticks, None::<ServingStatus>),
            |(health, service, mut ticks, last)| async move {
                loop {
                    ticks.tick().await;
                    let now = health
                        .status(&service)
                        .unwrap_or(ServingStatus::ServiceUnknown);
                    if last != Some(now) {
                        return Some((Ok(answer(now)), (health, service, ticks, Some(now))));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(changes)))
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::replicas::Replica;

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_replicas_and_liveness_does_not() {
        let replica = Arc::new(Replica::new("a", "127.0.0.1:1", vec!["m".into()]));
        let health = ExtProcHealth::new(Arc::new(Replicas::new(vec![Arc::clone(&replica)])));
        let check = |name: &str| {
            let health = health.clone();
            let request = Request::new(HealthCheckRequest {
                service: name.to_owned(),
            });
            async move { health.check(request).await.map(|r| r.into_inner().status) }
        };
        for name in READINESS.iter().chain(&["liveness"]) {
            assert_eq!(check(name).await.unwrap(), ServingStatus::Serving as i32);
        }
        let unknown = check("nope").await.unwrap_err();
        assert_eq!(unknown.code(), tonic::Code::NotFound);

        let request = Request::new(HealthCheckRequest {
            service: "readiness".into(),
        });
        let mut watch = health.watch(request).await.unwrap().into_inner();
        let first = watch.next().await.unwrap().unwrap();
        assert_eq!(first.status, ServingStatus::Serving as i32);
        replica.report_failure(1);
        assert_eq!(
            check("readiness").await.unwrap(),
            ServingStatus::NotServing as i32
        );
        assert_eq!(
            check("liveness").await.unwrap(),
            ServingStatus::Serving as i32
        );
        let change = watch.next().await.unwrap().unwrap();
        assert_eq!(change.status, ServingStatus::NotServing as i32);
    }
}
