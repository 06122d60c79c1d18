//! One replica's shared state, as every handler sees it: its name and served model, the
//! engine driver, the failure plan and the health switch.

use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;

use super::api_error::ApiError;
use super::engine_driver::EngineDriver;
use super::failures::{FAIL_HEADER, FailurePlan, FailureSpec};
use crate::model::Seconds;

/// What the handlers of one replica share.
#[derive(Debug)]
pub struct Replica {
    pub name: String,
    /// The served model name (`model` must equal it).
    pub model: String,
    pub max_model_len: usize,
    /// Tokens per KV block (what a request's `created_cache_tokens` counts in).
    pub block_size: usize,
    pub driver: EngineDriver,
    pub failures: FailurePlan,
    /// Unix seconds at start, for `/v1/models`.
    pub created: u64,
    /// Engine time until which `/health` answers 503.
    health_fail_until: Mutex<Seconds>,
}

impl Replica {
    pub fn new(
        name: String,
        model: String,
        max_model_len: usize,
        block_size: usize,
        driver: EngineDriver,
        failures: FailurePlan,
    ) -> Self {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let health_fail_until = failures
            .health_fail_for
            .map_or(0.0, |secs| driver.now() + secs);
        Replica {
            name,
            model,
            max_model_len,
            block_size,
            driver,
            failures,
            created,
            health_fail_until: Mutex::new(health_fail_until),
        }
    }

    /// `/health`'s answer now.
    pub fn healthy(&self) -> bool {
        let until = *self
            .health_fail_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.driver.now() >= until
    }

    /// Makes `/health` answer 503 for the next `secs` engine seconds (0 clears it).
    pub fn fail_health_for(&self, secs: Seconds) {
        let until = self.driver.now() + secs;
        *self
            .health_fail_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = until;
    }

    /// The failure this request gets: its `x-mock-fail` header when present, else a draw
    /// from the replica's plan.
    pub fn failure_for(&self, headers: &HeaderMap) -> Result<FailureSpec, ApiError> {
        match headers.get(FAIL_HEADER) {
            Some(value) => {
                let text = value.to_str().map_err(|_| {
                    ApiError::bad_request(format!("invalid {FAIL_HEADER} header: not ASCII"))
                })?;
                FailureSpec::parse(text).map_err(|e| {
                    ApiError::bad_request(format!("invalid {FAIL_HEADER} header: {e}"))
                })
            }
            None => Ok(self.failures.draw(&mut rand::rng())),
        }
    }
}
