//! Token-rate admission: which tenants are under a token limit, and charging a parsed
//! request against it.
//!
//! [`Admission::charge_tokens`] runs after the body is parsed and before routing (the
//! estimate needs the prompt and `max_tokens`), once per request, so a retry on another
//! replica is never charged twice. It returns a [`TokenHold`] that the response body keeps:
//! the hold reads the body's frames for `usage` and settles the tenant's bucket when the
//! body ends or the client leaves; the request path refunds it whole when no replica took
//! the request. Requests without the tenant header, and tenants without a rate, are not
//! estimated at all.

use http::HeaderMap;
use router_core::text::{BodyError, Endpoint, RoutingFields};
use tokio::time::Instant;

use super::request_cost::{self, RequestCost, UsageScan};
use super::token_rate::{Refusal, TokenCharge, TokenLimit};
use super::{Admission, AdmissionConfig};
use crate::metrics::Metrics;
use crate::request::error::GatewayError;

/// A token burst left unset is this many seconds of the rate: enough for one long request
/// (an 8K-token prompt plus its completion at 1 000 tokens/s) after a pause, without letting
/// an idle tenant flood the replicas for long.
pub const DEFAULT_BURST_SECS: u64 = 10;

impl AdmissionConfig {
    /// The token budget of `tenant`, or `None` when it has no token limit.
    pub fn token_limit(&self, tenant: &str) -> Option<TokenLimit> {
        let own = self.tenants.get(tenant);
        let own_rate = own.and_then(|t| t.tokens_per_second);
        let tokens_per_second = own_rate.unwrap_or(self.tenant_tokens_per_second);
        if tokens_per_second == 0 {
            return None;
        }
        let default_burst = match (own_rate, self.tenant_token_burst) {
            (None, burst) if burst > 0 => burst,
            _ => tokens_per_second.saturating_mul(DEFAULT_BURST_SECS),
        };
        let burst = own
            .and_then(|t| t.token_burst)
            .filter(|&b| b > 0)
            .unwrap_or(default_burst);
        Some(TokenLimit {
            tokens_per_second,
            burst,
        })
    }

    /// Token settings that would silently do nothing are refused, naming the key.
    pub(super) fn validate_token_rates(&self) -> Result<(), String> {
        if self.tenant_token_burst > 0 && self.tenant_tokens_per_second == 0 {
            return Err(format!(
                "admission.tenant_token_burst = {} needs admission.tenant_tokens_per_second \
                 (0 means no token limit)",
                self.tenant_token_burst
            ));
        }
        for (name, tenant) in &self.tenants {
            let burst = tenant.token_burst.unwrap_or(0);
            if burst > 0 && self.token_limit(name).is_none() {
                return Err(format!(
                    "admission.tenants.{name}.token_burst = {burst} needs a token rate \
                     (tokens_per_second here or admission.tenant_tokens_per_second)"
                ));
            }
        }
        Ok(())
    }
}

impl Admission {
    /// Charges a parsed request's estimated tokens to its tenant's bucket: `None` when the
    /// request names no tenant or its tenant has no token limit (nothing is estimated then);
    /// 429 with the wait as `Retry-After` when the bucket is short; 400 when the request is
    /// larger than the burst.
    pub fn charge_tokens(
        &self,
        headers: &HeaderMap,
        endpoint: Endpoint,
        body: &[u8],
        fields: &RoutingFields,
        metrics: &Metrics,
    ) -> Result<Option<TokenHold>, GatewayError> {
        let Some(tenant) = self.tenant(headers)? else {
            return Ok(None);
        };
        let Some(limit) = self.config.token_limit(tenant) else {
            return Ok(None);
        };
        let estimate =
            request_cost::estimate(endpoint, body, fields, self.config.default_max_tokens)?;
        let cost = estimate.total();
        match self.token_rates.charge(tenant, limit, cost, Instant::now()) {
            Ok(charge) => Ok(Some(TokenHold {
                charge,
                estimate,
                usage: UsageScan::default(),
            })),
            Err(Refusal::Wait(wait)) => {
                metrics.record_admission_rejection("token_rate");
                let retry_after_secs = Refusal::retry_after_secs(wait);
                Err(GatewayError::RateLimited {
                    message: format!(
                        "tenant {tenant:?} is over its token rate of {} tokens/s (burst {}): \
                         this request is estimated at {cost} tokens, available in {retry_after_secs} s",
                        limit.tokens_per_second, limit.burst
                    ),
                    retry_after_secs,
                })
            }
            Err(Refusal::TooLarge) => {
                metrics.record_admission_rejection("token_burst");
                Err(GatewayError::Body(BodyError::InvalidField {
                    field: "max_tokens",
                    reason: format!(
                        "this request is estimated at {cost} tokens ({} prompt + {} completion), \
                         more than tenant {tenant:?} may ever send at once (token burst {}); \
                         lower max_tokens or shorten the prompt",
                        estimate.prompt_tokens, estimate.completion_tokens, limit.burst
                    ),
                }))
            }
        }
    }

    /// Whether any tenant can be under a token limit (else no bucket is ever made).
    pub fn has_token_rates(&self) -> bool {
        self.config.tenant_tokens_per_second > 0
            || self
                .config
                .tenants
                .values()
                .any(|t| t.tokens_per_second.unwrap_or(0) > 0)
    }

    /// Forgets the token buckets that have refilled and that no response holds.
    pub fn sweep_token_buckets(&self) -> usize {
        self.token_rates.sweep(Instant::now())
    }

    /// Tenants with a token bucket.
    pub fn tracked_token_buckets(&self) -> usize {
        self.token_rates.len()
    }

    /// Tokens in `tenant`'s bucket now (`None`: no bucket, i.e. full or unlimited).
    pub fn token_level(&self, tenant: &str) -> Option<f64> {
        self.token_rates.level(tenant, Instant::now())
    }
}

/// A request's tokens charged to its tenant, held by the response body: it watches the
/// body for the replica's `usage` and, when dropped, settles the bucket to it.
#[derive(Debug)]
pub struct TokenHold {
    charge: TokenCharge,
    estimate: RequestCost,
    usage: UsageScan,
}

impl TokenHold {
    /// Tokens charged at admission.
    pub fn charged(&self) -> u64 {
        self.charge.charged()
    }

    /// Reads one response body frame for `usage`.
    pub fn observe(&mut self, frame: &[u8]) {
        self.usage.observe(frame);
        if let Some(used) = self.usage.used(self.estimate) {
            self.charge.set_used(used);
        }
    }

    /// Gives the whole charge back: the request never reached a replica.
    pub fn refund(self) {
        self.charge.refund();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::admit::TenantConfig;

    fn tenant(rate: Option<u64>, burst: Option<u64>) -> TenantConfig {
        TenantConfig {
            max_in_flight: 0,
            tokens_per_second: rate,
            token_burst: burst,
        }
    }

    fn config(rate: u64, burst: u64, tenants: &[(&str, TenantConfig)]) -> AdmissionConfig {
        AdmissionConfig {
            tenant_tokens_per_second: rate,
            tenant_token_burst: burst,
            default_max_tokens: 100,
            tenants: tenants
                .iter()
                .map(|(name, t)| ((*name).to_owned(), t.clone()))
                .collect::<BTreeMap<_, _>>(),
            ..AdmissionConfig::default()
        }
    }

    fn limit(tokens_per_second: u64, burst: u64) -> Option<TokenLimit> {
        Some(TokenLimit {
            tokens_per_second,
            burst,
        })
    }

    #[test]
    fn limits_resolve_from_the_tenant_entry_then_the_defaults() {
        let c = config(
            100,
            0,
            &[
                ("own-rate", tenant(Some(7), None)),
                ("own-both", tenant(Some(7), Some(50))),
                ("own-burst", tenant(None, Some(300))),
                ("unlimited", tenant(Some(0), None)),
                ("caps-only", tenant(None, None)),
            ],
        );
        assert_eq!(
            c.token_limit("anyone"),
            limit(100, 1_000),
            "10 s of the rate"
        );
        assert_eq!(c.token_limit("own-rate"), limit(7, 70));
        assert_eq!(c.token_limit("own-both"), limit(7, 50));
        assert_eq!(c.token_limit("own-burst"), limit(100, 300));
        assert_eq!(c.token_limit("unlimited"), None);
        assert_eq!(c.token_limit("caps-only"), limit(100, 1_000));
        let c = config(100, 250, &[("own-rate", tenant(Some(7), None))]);
        assert_eq!(c.token_limit("anyone"), limit(100, 250));
        assert_eq!(
            c.token_limit("own-rate"),
            limit(7, 70),
            "the default burst belongs to the default rate"
        );
        let c = config(0, 0, &[("B", tenant(Some(5), Some(9)))]);
        assert_eq!(c.token_limit("A"), None);
        assert_eq!(c.token_limit("B"), limit(5, 9));
        assert!(!Admission::new(config(0, 0, &[])).unwrap().has_token_rates());
        assert!(Admission::new(c).unwrap().has_token_rates());
    }

    #[test]
    fn a_burst_without_a_rate_is_refused_naming_the_key() {
        let error = Admission::new(config(0, 10, &[])).unwrap_err();
        assert!(error.contains("admission.tenant_token_burst"), "{error}");
        let error = Admission::new(config(0, 0, &[("B", tenant(None, Some(10)))])).unwrap_err();
        assert!(error.contains("admission.tenants.B.token_burst"), "{error}");
        let error = Admission::new(config(10, 0, &[("B", tenant(Some(0), Some(10)))])).unwrap_err();
        assert!(error.contains("admission.tenants.B.token_burst"), "{error}");
        assert!(Admission::new(config(10, 0, &[("B", tenant(None, Some(10)))])).is_ok());
    }

    fn headers(tenant: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(tenant) = tenant {
            headers.insert("x-tenant", tenant.parse().unwrap());
        }
        headers
    }

    /// A completion whose estimate is `prompt_tokens` (4 bytes each) + `max_tokens`.
    fn completion(prompt_tokens: usize, max_tokens: u64) -> (Vec<u8>, RoutingFields) {
        let body = format!(
            r#"{{"model":"m","prompt":"{}","max_tokens":{max_tokens}}}"#,
            "abcd".repeat(prompt_tokens)
        );
        let fields =
            router_core::text::routing_fields(Endpoint::Completions, body.as_bytes()).unwrap();
        (body.into_bytes(), fields)
    }

    fn charge(
        admission: &Admission,
        metrics: &Metrics,
        tenant: Option<&str>,
        prompt_tokens: usize,
        max_tokens: u64,
    ) -> Result<Option<TokenHold>, GatewayError> {
        let (body, fields) = completion(prompt_tokens, max_tokens);
        admission.charge_tokens(
            &headers(tenant),
            Endpoint::Completions,
            &body,
            &fields,
            metrics,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_bucket_is_a_429_with_the_wait_and_other_tenants_pass() {
        let metrics = Metrics::new().unwrap();
        // 10 tokens/s, burst 100; tenant A has no limit of its own but the default.
        let admission = Admission::new(config(
            0,
            0,
            &[
                ("B", tenant(Some(10), Some(100))),
                ("C", tenant(Some(10), Some(100))),
            ],
        ))
        .unwrap();
        assert!(
            charge(&admission, &metrics, None, 50, 50)
                .unwrap()
                .is_none()
        );
        assert!(
            charge(&admission, &metrics, Some("A"), 50, 50)
                .unwrap()
                .is_none()
        );
        let held = charge(&admission, &metrics, Some("B"), 20, 60)
            .unwrap()
            .unwrap();
        assert_eq!(held.charged(), 80);
        // 20 left; 45 more needed at 10/s: 4.5 s, so Retry-After 5.
        let error = charge(&admission, &metrics, Some("B"), 15, 50).unwrap_err();
        let GatewayError::RateLimited {
            message,
            retry_after_secs,
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*retry_after_secs, 5);
        assert!(
            message.contains("\"B\"") && message.contains("10 tokens/s") && message.contains("65"),
            "{message}"
        );
        assert_eq!(error.status(), 429);
        assert!(charge(&admission, &metrics, Some("C"), 15, 50).is_ok());
        tokio::time::advance(std::time::Duration::from_millis(4_500)).await;
        assert!(charge(&admission, &metrics, Some("B"), 15, 50).is_ok());
        let text = metrics.render([]);
        assert!(
            text.contains(r#"prefixgate_admission_rejections_total{reason="token_rate"} 1"#),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_over_the_burst_is_a_400_naming_max_tokens() {
        let metrics = Metrics::new().unwrap();
        let admission = Admission::new(config(10, 100, &[])).unwrap();
        let error = charge(&admission, &metrics, Some("B"), 1, 100).unwrap_err();
        assert_eq!(error.status(), 400);
        assert_eq!(error.param(), Some("max_tokens"));
        assert!(error.to_string().contains("token burst 100"), "{error}");
        assert_eq!(admission.tracked_token_buckets(), 0);
        let text = metrics.render([]);
        assert!(
            text.contains(r#"prefixgate_admission_rejections_total{reason="token_burst"} 1"#),
            "{text}"
        );
        let error = charge(&admission, &metrics, Some(&"t".repeat(500)), 1, 1).unwrap_err();
        assert_eq!(error.status(), 400, "a bad tenant header: {error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_settles_to_the_usage_its_body_reports() {
        let metrics = Metrics::new().unwrap();
        let admission = Admission::new(config(1, 1_000, &[])).unwrap();
        let mut hold = charge(&admission, &metrics, Some("B"), 100, 500)
            .unwrap()
            .unwrap();
        assert_eq!(admission.token_level("B"), Some(400.0));
        hold.observe(br#"data: {"choices":[{"text":"x"}]}"#);
        hold.observe(
            br#"data: {"choices":[],"usage":{"prompt_tokens":80,"completion_tokens":20}}"#,
        );
        assert_eq!(
            admission.token_level("B"),
            Some(400.0),
            "settled on release"
        );
        drop(hold);
        assert_eq!(
            admission.token_level("B"),
            Some(900.0),
            "500 unused tokens back"
        );

        let hold = charge(&admission, &metrics, Some("B"), 100, 500)
            .unwrap()
            .unwrap();
        drop(hold);
        assert_eq!(
            admission.token_level("B"),
            Some(300.0),
            "no usage: the estimate stands"
        );
        let hold = charge(&admission, &metrics, Some("B"), 100, 100)
            .unwrap()
            .unwrap();
        hold.refund();
        assert_eq!(admission.token_level("B"), Some(300.0));
        assert_eq!(admission.sweep_token_buckets(), 0, "not full yet");
        tokio::time::advance(std::time::Duration::from_secs(700)).await;
        assert_eq!(admission.sweep_token_buckets(), 1);
        assert_eq!(admission.tracked_token_buckets(), 0);
    }
}
