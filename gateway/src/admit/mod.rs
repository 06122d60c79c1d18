//! Step 1 of the request path: admission. API keys, a global in-flight cap, and per-tenant
//! in-flight caps, checked before the body is read; per-tenant token rates, charged once the
//! body is parsed.
//!
//! An admitted request holds an [`AdmissionPermit`] that the response body keeps until it
//! ends (like the outstanding guard), so the caps count responses still streaming, not just
//! requests being routed. Over a cap is 429 with `Retry-After`. Counters are atomics (the
//! global one) and a sharded map (tenants), so admission takes no global lock. A tenant's
//! entry is removed when its last request ends, so tenant names sent by clients cannot grow
//! the map without bound.
//!
//! Token rates need the body (the prompt and `max_tokens`), so [`Admission::charge_tokens`]
//! runs after parsing and before routing, once per request whatever the retries. The
//! [`TokenHold`] it returns rides on the response body like the permit and settles the
//! tenant's bucket to the replica's reported `usage` ([`token_rate`] for the buckets,
//! [`request_cost`] for the estimate). A request larger than its tenant's burst can never
//! pass and is a 400 naming `max_tokens`, not a 429 a client would retry in vain.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use http::HeaderMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;
use crate::request::error::GatewayError;

pub mod request_cost;
mod token_admission;
pub mod token_rate;

pub use token_admission::TokenHold;
use token_rate::TokenRates;

/// Longest tenant name taken from the header; longer values are refused, so clients cannot
/// make the gateway store arbitrarily large keys.
const MAX_TENANT_LEN: usize = 128;

/// The `[admission]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Accepted API keys (`authorization: Bearer KEY`); empty means no authentication.
    pub api_keys: Vec<String>,
    /// Requests in flight through the whole gateway at most; 0 for no cap.
    pub max_in_flight: usize,
    /// The request header that names the tenant.
    pub tenant_header: String,
    /// Requests in flight per tenant at most, for tenants without their own entry; 0 for
    /// no cap.
    pub tenant_max_in_flight: usize,
    /// Per-tenant caps that override `tenant_max_in_flight`.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// The `Retry-After` value (seconds) sent with a 429 for an in-flight cap.
    pub retry_after_secs: u64,
    /// Tokens per second per tenant, for tenants without their own rate; 0 for no limit.
    pub tenant_tokens_per_second: u64,
    /// Tokens a tenant may spend at once (and the largest request it may send); 0 for 10
    /// seconds of its rate (`DEFAULT_BURST_SECS`).
    pub tenant_token_burst: u64,
    /// Completion tokens charged for a request without `max_tokens` or
    /// `max_completion_tokens`.
    pub default_max_tokens: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            api_keys: Vec::new(),
            max_in_flight: 0,
            tenant_header: "x-tenant".to_owned(),
            tenant_max_in_flight: 0,
            tenants: BTreeMap::new(),
            retry_after_secs: 1,
            tenant_tokens_per_second: 0,
            tenant_token_burst: 0,
            default_max_tokens: 1024,
        }
    }
}

/// One tenant's limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Requests in flight for this tenant at most; 0 for no cap.
    pub max_in_flight: usize,
    /// Tokens per second for this tenant (overrides `tenant_tokens_per_second`); 0 for no
    /// limit.
    #[serde(default)]
    pub tokens_per_second: Option<u64>,
    /// This tenant's token burst; absent or 0 for 10 seconds of its rate
    /// (`DEFAULT_BURST_SECS`; its own rate when it sets one, else the default burst).
    #[serde(default)]
    pub token_burst: Option<u64>,
}

/// Admission state shared by all requests.
#[derive(Debug)]
pub struct Admission {
    config: AdmissionConfig,
    tenant_header: http::HeaderName,
    global: Arc<AtomicUsize>,
    tenants: Arc<TenantCounts>,
    token_rates: TokenRates,
}

/// In-flight counts per tenant (only tenants under a cap, only while they have requests).
type TenantCounts = DashMap<String, Arc<AtomicUsize>>;

/// A permit's count against one tenant.
#[derive(Debug)]
struct TenantHold {
    name: String,
    count: Arc<AtomicUsize>,
    map: Arc<TenantCounts>,
}

/// Holds a request's place under the caps; dropping it gives the place back.
#[derive(Debug)]
pub struct AdmissionPermit {
    global: Option<Arc<AtomicUsize>>,
    tenant: Option<TenantHold>,
}

impl Drop for AdmissionPermit {
    fn drop(&mut self) {
        if let Some(global) = &self.global {
            global.fetch_sub(1, Ordering::AcqRel);
        }
        if let Some(hold) = self.tenant.take() {
            if hold.count.fetch_sub(1, Ordering::AcqRel) == 1 {
                hold.map
                    .remove_if(&hold.name, |_, c| c.load(Ordering::Acquire) == 0);
            }
        }
    }
}

impl Admission {
    /// Admission under `config`; the tenant header name is checked here.
    pub fn new(mut config: AdmissionConfig) -> Result<Self, String> {
        let tenant_header = http::HeaderName::from_bytes(config.tenant_header.as_bytes())
            .map_err(|e| format!("admission.tenant_header {:?}: {e}", config.tenant_header))?;
        // Spaces around a key are never part of it (a list written "K1, K2", a key file's
        // newline). A blank key could never be presented: it is refused here rather than
        // starting a gateway that refuses every request.
        let count = config.api_keys.len();
        for (i, key) in config.api_keys.iter_mut().enumerate() {
            let trimmed = key.trim();
            if trimmed.is_empty() {
                return Err(format!(
                    "admission.api_keys: key {} of {count} is blank",
                    i + 1
                ));
            }
            if trimmed.len() != key.len() {
                *key = trimmed.to_owned();
            }
        }
        config.validate_token_rates()?;
        Ok(Admission {
            config,
            tenant_header,
            global: Arc::new(AtomicUsize::new(0)),
            tenants: Arc::new(DashMap::new()),
            token_rates: TokenRates::new(),
        })
    }

    /// Whether the request carries an accepted API key (always true without keys).
    ///
    /// The scheme is matched without regard to case (RFC 9110 §11.1: `bearer` is `Bearer`).
    /// Two `authorization` headers are refused with or without keys: which one decides
    /// would depend on who reads them (the gateway, the replica behind it), and a request
    /// must not be admitted on one credential and forwarded with another.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<(), GatewayError> {
        let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(GatewayError::BadHeader {
                header: "authorization".to_owned(),
                reason: "sent more than once".to_owned(),
            });
        }
        if self.config.api_keys.is_empty() {
            return Ok(());
        }
        let presented = first
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or_default();
        // Compare against every key without stopping early, in constant time per key.
        let mut accepted = false;
        for key in &self.config.api_keys {
            accepted |= constant_time_eq(presented.as_bytes(), key.as_bytes());
        }
        if accepted {
            Ok(())
        } else {
            Err(GatewayError::Unauthorized)
        }
    }

    /// Authenticates and takes a place under the caps.
    pub fn admit(
        &self,
        headers: &HeaderMap,
        metrics: &Metrics,
    ) -> Result<AdmissionPermit, GatewayError> {
        if let Err(error) = self.authenticate(headers) {
            if error == GatewayError::Unauthorized {
                metrics.record_admission_rejection("unauthorized");
            }
            return Err(error);
        }
        let mut permit = AdmissionPermit {
            global: None,
            tenant: None,
        };
        if self.config.max_in_flight > 0 {
            let before = self.global.fetch_add(1, Ordering::AcqRel);
            // Whether or not it fits, the permit now owns one count and gives it back.
            permit.global = Some(Arc::clone(&self.global));
            if before >= self.config.max_in_flight {
                metrics.record_admission_rejection("global_in_flight");
                return Err(self.rate_limited(format!(
                    "the gateway has {} requests in flight (limit {})",
                    before, self.config.max_in_flight
                )));
            }
        }
        let Some(tenant) = self.tenant(headers)? else {
            return Ok(permit);
        };
        let limit = self
            .config
            .tenants
            .get(tenant)
            .map_or(self.config.tenant_max_in_flight, |t| t.max_in_flight);
        if limit == 0 {
            return Ok(permit);
        }
        // Count under the shard lock, so a concurrent release cannot remove the entry
        // between finding it and counting on it.
        let (count, before) = {
            let entry = self
                .tenants
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(AtomicUsize::new(0)));
            let before = entry.value().fetch_add(1, Ordering::AcqRel);
            (Arc::clone(entry.value()), before)
        };
        permit.tenant = Some(TenantHold {
            name: tenant.to_owned(),
            count,
            map: Arc::clone(&self.tenants),
        });
        if before >= limit {
            metrics.record_admission_rejection("tenant_in_flight");
            return Err(self.rate_limited(format!(
                "tenant {tenant:?} has {before} requests in flight (limit {limit})"
            )));
        }
        Ok(permit)
    }

    /// The tenant a request names, if any; a bad value is a client error.
    pub(crate) fn tenant<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Result<Option<&'h str>, GatewayError> {
        let Some(value) = headers.get(&self.tenant_header) else {
            return Ok(None);
        };
        value
            .to_str()
            .ok()
            .filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_LEN)
            .map(Some)
            .ok_or_else(|| GatewayError::BadHeader {
                header: self.config.tenant_header.clone(),
                reason: format!("must be 1 to {MAX_TENANT_LEN} visible characters"),
            })
    }

    fn rate_limited(&self, message: String) -> GatewayError {
        GatewayError::RateLimited {
            message,
            retry_after_secs: self.config.retry_after_secs,
        }
    }

    /// Requests holding a place under the global cap (0 without a cap).
    pub fn in_flight(&self) -> usize {
        self.global.load(Ordering::Acquire)
    }

    /// Tenants with requests in flight under a cap.
    pub fn tracked_tenants(&self) -> usize {
        self.tenants.len()
    }
}

/// The token of `Bearer TOKEN` (the scheme in any case, spaces around the token ignored);
/// `None` for another scheme or no token.
pub(crate) fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Equal bytes, in time that depends only on the lengths.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        difference |= x ^ b.get(i).copied().unwrap_or(!x);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn keys_are_required_only_when_configured() {
        let metrics = Metrics::new().unwrap();
        let open = Admission::new(AdmissionConfig::default()).unwrap();
        assert!(open.admit(&HeaderMap::new(), &metrics).is_ok());

        let config = AdmissionConfig {
            api_keys: vec!["k1".into(), "secret-2".into()],
            ..AdmissionConfig::default()
        };
        let locked = Admission::new(config).unwrap();
        let ok = headers(&[("authorization", "Bearer secret-2")]);
        assert!(locked.admit(&ok, &metrics).is_ok());
        for bad in ["Bearer secret-", "Bearer secret-22", "secret-2", "Bearer "] {
            let error = locked
                .admit(&headers(&[("authorization", bad)]), &metrics)
                .unwrap_err();
            assert_eq!(error, GatewayError::Unauthorized, "{bad}");
        }
        assert!(locked.admit(&HeaderMap::new(), &metrics).is_err());
    }

    #[test]
    fn the_global_cap_counts_permits_until_dropped() {
        let metrics = Metrics::new().unwrap();
        let config = AdmissionConfig {
            max_in_flight: 2,
            ..AdmissionConfig::default()
        };
        let admission = Admission::new(config).unwrap();
        let a = admission.admit(&HeaderMap::new(), &metrics).unwrap();
        let _b = admission.admit(&HeaderMap::new(), &metrics).unwrap();
        let error = admission.admit(&HeaderMap::new(), &metrics).unwrap_err();
        assert_eq!(error.status(), 429);
        assert_eq!(admission.in_flight(), 2, "a refusal gives its place back");
        drop(a);
        assert!(admission.admit(&HeaderMap::new(), &metrics).is_ok());
    }

    #[test]
    fn tenants_have_their_own_caps_and_are_forgotten_when_idle() {
        let metrics = Metrics::new().unwrap();
        let mut tenants = BTreeMap::new();
        tenants.insert(
            "B".to_owned(),
            TenantConfig {
                max_in_flight: 1,
                tokens_per_second: None,
                token_burst: None,
            },
        );
        let config = AdmissionConfig {
            tenant_max_in_flight: 3,
            tenants,
            ..AdmissionConfig::default()
        };
        let admission = Admission::new(config).unwrap();
        let b = headers(&[("x-tenant", "B")]);
        let a = headers(&[("x-tenant", "A")]);
        let first_b = admission.admit(&b, &metrics).unwrap();
        assert_eq!(admission.admit(&b, &metrics).unwrap_err().status(), 429);
        let held: Vec<_> = (0..3)
            .map(|_| admission.admit(&a, &metrics).unwrap())
            .collect();
        assert_eq!(admission.admit(&a, &metrics).unwrap_err().status(), 429);
        assert!(
            admission.admit(&HeaderMap::new(), &metrics).is_ok(),
            "no tenant, no tenant cap"
        );
        assert_eq!(admission.tracked_tenants(), 2);
        drop(first_b);
        drop(held);
        assert_eq!(admission.tracked_tenants(), 0);
        assert!(admission.admit(&b, &metrics).is_ok());
    }

    #[test]
    fn a_bad_tenant_header_is_a_client_error() {
        let metrics = Metrics::new().unwrap();
        let config = AdmissionConfig {
            tenant_max_in_flight: 1,
            ..AdmissionConfig::default()
        };
        let admission = Admission::new(config).unwrap();
        let long = "t".repeat(MAX_TENANT_LEN + 1);
        let error = admission
            .admit(&headers(&[("x-tenant", &long)]), &metrics)
            .unwrap_err();
        assert_eq!(error.status(), 400);
        assert!(error.to_string().contains("x-tenant"), "{error}");
    }

    #[test]
    fn bad_settings_are_named() {
        let config = AdmissionConfig {
            tenant_header: "bad header".into(),
            ..AdmissionConfig::default()
        };
        assert!(
            Admission::new(config)
                .unwrap_err()
                .contains("tenant_header")
        );
        for keys in [vec![String::new()], vec!["k1".to_owned(), " \t".to_owned()]] {
            let config = AdmissionConfig {
                api_keys: keys.clone(),
                ..AdmissionConfig::default()
            };
            let error = Admission::new(config).unwrap_err();
            assert!(error.contains("api_keys"), "{keys:?}: {error}");
            assert!(error.contains("blank"), "{keys:?}: {error}");
        }
    }

    #[test]
    fn keys_are_trimmed_and_the_scheme_is_matched_in_any_case() {
        let metrics = Metrics::new().unwrap();
        let config = AdmissionConfig {
            api_keys: vec!["K1".into(), " K2".into(), "K3\n".into()],
            ..AdmissionConfig::default()
        };
        let admission = Admission::new(config).unwrap();
        for ok in [
            "Bearer K1",
            "Bearer K2",
            "Bearer K3",
            "bearer K2",
            "BEARER  K3 ",
        ] {
            let presented = headers(&[("authorization", ok)]);
            assert!(admission.admit(&presented, &metrics).is_ok(), "{ok}");
        }
        for bad in ["Basic K1", "BearerK1", "Bearer", "Bearer K", "K1 Bearer"] {
            let error = admission
                .admit(&headers(&[("authorization", bad)]), &metrics)
                .unwrap_err();
            assert_eq!(error, GatewayError::Unauthorized, "{bad}");
        }
    }

    #[test]
    fn a_second_authorization_header_is_refused_with_or_without_keys() {
        let metrics = Metrics::new().unwrap();
        let mut two = HeaderMap::new();
        two.append(http::header::AUTHORIZATION, "Bearer K1".parse().unwrap());
        two.append(http::header::AUTHORIZATION, "Bearer other".parse().unwrap());
        let locked = Admission::new(AdmissionConfig {
            api_keys: vec!["K1".into()],
            ..AdmissionConfig::default()
        })
        .unwrap();
        let open = Admission::new(AdmissionConfig::default()).unwrap();
        for admission in [&locked, &open] {
            let error = admission.admit(&two, &metrics).unwrap_err();
            assert_eq!(error.status(), 400, "{error}");
            assert!(error.to_string().contains("authorization"), "{error}");
        }
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }
}
