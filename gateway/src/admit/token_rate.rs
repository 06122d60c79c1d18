//! Per-tenant token-rate limits: one token bucket per limited tenant, and the charge a
//! request holds against it until its response ends.
//!
//! A bucket holds up to `burst` tokens and refills at `tokens_per_second`. A request takes
//! its estimated cost ([`super::request_cost`]) at admission; when it does not fit, the
//! answer says how long until it would (the 429's `Retry-After`), and a request costing more
//! than the whole burst can never fit. The [`TokenCharge`] then rides on the response body:
//! when the body ends or is dropped it settles the bucket to the tokens the replica's `usage`
//! reported (refunding unused `max_tokens`, or charging an under-estimated prompt), and a
//! request that never reached a replica gets its whole charge back.
//!
//! The bucket itself is pure: time is passed in as [`Instant`] (tokio's, so tests can pause
//! it), never read inside. [`TokenRates`] keeps buckets in a sharded map; only tenants under
//! a limit get one, and [`TokenRates::sweep`] drops buckets that have refilled and that no
//! response still holds, so client-chosen tenant names cannot grow the map without bound (a
//! full bucket and a missing one admit the same requests).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

/// A tenant's token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLimit {
    /// Refill rate; never 0 (a tenant without a rate has no limit and no bucket).
    pub tokens_per_second: u64,
    /// Bucket capacity: the most a tenant idle for long can spend at once, and the largest
    /// request it can ever send.
    pub burst: u64,
}

/// Why a request does not fit its tenant's bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It fits once the bucket has refilled for this long.
    Wait(Duration),
    /// It costs more than the burst, so it can never fit.
    TooLarge,
}

impl Refusal {
    /// The `Retry-After` seconds for a wait: rounded up, at least 1 (0 would invite an
    /// immediate retry that fails again).
    pub fn retry_after_secs(wait: Duration) -> u64 {
        let whole = wait.as_secs();
        let secs = if wait.subsec_nanos() > 0 {
            whole.saturating_add(1)
        } else {
            whole
        };
        secs.max(1)
    }
}

/// One tenant's bucket. The level may go below zero when a response's usage shows it cost
/// more than estimated; the tenant then waits for the debt to refill.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: TokenLimit,
    level: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(limit: TokenLimit, now: Instant) -> Self {
        TokenBucket {
            limit,
            level: limit.burst as f64,
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        // A `now` before the last update (callers racing on the clock) refills nothing.
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        let rate = self.limit.tokens_per_second as f64;
        self.level = (self.level + elapsed * rate).min(self.limit.burst as f64);
        self.updated = self.updated.max(now);
    }

    /// Tokens available at `now`.
    pub fn level(&mut self, now: Instant) -> f64 {
        self.refill(now);
        self.level
    }

    /// Takes `cost` tokens if they are there; otherwise says how long until they would be.
    pub fn try_take(&mut self, cost: u64, now: Instant) -> Result<(), Refusal> {
        if cost > self.limit.burst {
            return Err(Refusal::TooLarge);
        }
        self.refill(now);
        let cost = cost as f64;
        if self.level >= cost {
            self.level -= cost;
            return Ok(());
        }
        let missing = cost - self.level;
        let rate = self.limit.tokens_per_second.max(1) as f64;
        Err(Refusal::Wait(Duration::from_secs_f64(missing / rate)))
    }

    /// Puts `tokens` back (a refund), or takes more when negative (an under-estimate); the
    /// level stays within one burst of debt and one burst of credit.
    pub fn adjust(&mut self, tokens: f64, now: Instant) {
        self.refill(now);
        let burst = self.limit.burst as f64;
        self.level = (self.level + tokens).clamp(-burst, burst);
    }

    /// Whether the bucket is full at `now` (then it can be forgotten).
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.level(now) >= self.limit.burst as f64
    }
}

type SharedBucket = Arc<Mutex<TokenBucket>>;

fn lock(bucket: &SharedBucket) -> std::sync::MutexGuard<'_, TokenBucket> {
    // The critical sections only do arithmetic, so a poisoned lock still holds a usable
    // bucket.
    bucket.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Buckets of the tenants under a token limit.
#[derive(Debug, Default)]
pub struct TokenRates {
    buckets: DashMap<String, SharedBucket>,
}

impl TokenRates {
    pub fn new() -> Self {
        TokenRates::default()
    }

    /// Charges `cost` tokens to `tenant`'s bucket (made full on first use), or refuses.
    pub fn charge(
        &self,
        tenant: &str,
        limit: TokenLimit,
        cost: u64,
        now: Instant,
    ) -> Result<TokenCharge, Refusal> {
        if cost > limit.burst {
            // Refused before making a bucket: it could never fit, and a name that is only
            // ever refused should not take a map entry.
            return Err(Refusal::TooLarge);
        }
        let bucket = match self.buckets.get(tenant) {
            Some(entry) => Arc::clone(entry.value()),
            None => Arc::clone(
                self.buckets
                    .entry(tenant.to_owned())
                    .or_insert_with(|| Arc::new(Mutex::new(TokenBucket::new(limit, now))))
                    .value(),
            ),
        };
        lock(&bucket).try_take(cost, now)?;
        Ok(TokenCharge {
            bucket,
            charged: cost,
            used: None,
        })
    }

    /// Drops the buckets that are full at `now` and held by no response; returns how many.
    pub fn sweep(&self, now: Instant) -> usize {
        let before = self.buckets.len();
        // The count is checked under the shard lock, and a charge only clones a bucket from
        // the map under that lock too, so no charge can start on a bucket being dropped.
        self.buckets
            .retain(|_, bucket| Arc::strong_count(bucket) > 1 || !lock(bucket).is_full(now));
        before.saturating_sub(self.buckets.len())
    }

    /// Tenants with a bucket.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Tokens in `tenant`'s bucket at `now` (`None` without a bucket: full, or unlimited).
    pub fn level(&self, tenant: &str, now: Instant) -> Option<f64> {
        let bucket = Arc::clone(self.buckets.get(tenant)?.value());
        let level = lock(&bucket).level(now);
        Some(level)
    }
}

/// Tokens a request took from its tenant's bucket. Dropping it settles the bucket to the
/// tokens reported used, if any were (none reported: the estimate stands).
#[derive(Debug)]
pub struct TokenCharge {
    bucket: SharedBucket,
    charged: u64,
    used: Option<u64>,
}

impl TokenCharge {
    /// Tokens taken at admission.
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// The request used `used` tokens in all; the bucket is settled to that on drop.
    pub fn set_used(&mut self, used: u64) {
        self.used = Some(used);
    }

    /// Gives the whole charge back now: the request never reached a replica.
    pub fn refund(mut self) {
        self.used = Some(0);
    }
}

impl Drop for TokenCharge {
    fn drop(&mut self) {
        let Some(used) = self.used else {
            return;
        };
        let difference = self.charged as f64 - used as f64;
        if difference != 0.0 {
            lock(&self.bucket).adjust(difference, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: TokenLimit = TokenLimit {
        tokens_per_second: 100,
        burst: 1_000,
    };

    fn settle(mut charge: TokenCharge, used: u64) {
        charge.set_used(used);
        drop(charge);
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_bucket_starts_full_and_refills_at_the_rate_up_to_the_burst() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMIT, t0);
        assert_eq!(bucket.level(t0), 1_000.0);
        bucket.try_take(900, t0).unwrap();
        assert_eq!(bucket.level(t0), 100.0);
        assert_eq!(bucket.level(t0 + secs(2.5)), 350.0);
        assert_eq!(
            bucket.level(t0 + secs(60.0)),
            1_000.0,
            "capped at the burst"
        );
        assert!(bucket.is_full(t0 + secs(60.0)));
        // A clock that goes backwards refills nothing and takes nothing away.
        assert_eq!(bucket.level(t0), 1_000.0);
    }

    #[test]
    fn a_refusal_says_how_long_until_the_request_fits() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMIT, t0);
        bucket.try_take(1_000, t0).unwrap();
        // 250 missing at 100/s: 2.5 s.
        assert_eq!(bucket.try_take(250, t0), Err(Refusal::Wait(secs(2.5))));
        assert_eq!(bucket.level(t0), 0.0, "a refusal takes nothing");
        assert_eq!(
            bucket.try_take(250, t0 + secs(2.0)),
            Err(Refusal::Wait(secs(0.5)))
        );
        bucket.try_take(250, t0 + secs(2.5)).unwrap();
        assert_eq!(
            bucket.try_take(1_001, t0 + secs(100.0)),
            Err(Refusal::TooLarge)
        );
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_at_least_one() {
        assert_eq!(Refusal::retry_after_secs(secs(2.5)), 3);
        assert_eq!(Refusal::retry_after_secs(secs(2.0)), 2);
        assert_eq!(Refusal::retry_after_secs(secs(0.001)), 1);
        assert_eq!(Refusal::retry_after_secs(Duration::ZERO), 1);
        assert_eq!(
            Refusal::retry_after_secs(Duration::from_nanos(3_000_000_001)),
            4
        );
    }

    #[test]
    fn adjustments_refund_and_charge_within_one_burst() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(LIMIT, t0);
        bucket.try_take(600, t0).unwrap();
        bucket.adjust(200.0, t0);
        assert_eq!(bucket.level(t0), 600.0);
        bucket.adjust(5_000.0, t0);
        assert_eq!(
            bucket.level(t0),
            1_000.0,
            "a refund never exceeds the burst"
        );
        bucket.adjust(-1_500.0, t0);
        assert_eq!(
            bucket.level(t0),
            -500.0,
            "usage above the estimate is a debt"
        );
        assert_eq!(bucket.try_take(100, t0), Err(Refusal::Wait(secs(6.0))));
        bucket.adjust(-1e9, t0);
        assert_eq!(bucket.level(t0), -1_000.0, "debt is bounded by one burst");
    }

    #[tokio::test(start_paused = true)]
    async fn charges_settle_to_usage_and_refund_in_full() {
        let rates = TokenRates::new();
        let now = Instant::now();
        let charge = rates.charge("B", LIMIT, 700, now).unwrap();
        assert_eq!(charge.charged(), 700);
        assert_eq!(rates.level("B", now), Some(300.0));
        assert_eq!(
            rates.charge("B", LIMIT, 400, now).unwrap_err(),
            Refusal::Wait(secs(1.0))
        );
        settle(charge, 250);
        assert_eq!(
            rates.level("B", now),
            Some(750.0),
            "450 unused tokens refunded"
        );
        let charge = rates.charge("B", LIMIT, 400, now).unwrap();
        charge.refund();
        assert_eq!(rates.level("B", now), Some(750.0));
        let charge = rates.charge("B", LIMIT, 100, now).unwrap();
        settle(charge, 300);
        assert_eq!(
            rates.level("B", now),
            Some(450.0),
            "200 more than estimated"
        );
        assert_eq!(rates.level("A", now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn sweeping_forgets_full_idle_buckets_only() {
        let rates = TokenRates::new();
        let t0 = Instant::now();
        assert_eq!(
            rates.charge("huge", LIMIT, 1_001, t0).unwrap_err(),
            Refusal::TooLarge
        );
        assert!(
            rates.is_empty(),
            "a request that can never fit makes no bucket"
        );
        let held = rates.charge("held", LIMIT, 10, t0).unwrap();
        settle(rates.charge("settled", LIMIT, 500, t0).unwrap(), 500);
        rates.charge("refunded", LIMIT, 500, t0).unwrap().refund();
        assert_eq!(rates.len(), 3);
        assert_eq!(rates.sweep(t0), 1, "only the refunded bucket is full");
        assert_eq!(rates.level("refunded", t0), None);
        // 5 s later "settled" has refilled; "held" is full too but a response holds it.
        assert_eq!(rates.sweep(t0 + secs(5.0)), 1);
        assert_eq!(rates.len(), 1);
        drop(held);
        assert_eq!(rates.sweep(t0 + secs(5.0)), 1);
        assert!(rates.is_empty());
    }

    proptest::proptest! {
        /// Whatever the sequence of charges, settles and waits, the level stays within one
        /// burst either side of zero, and a refused request changes nothing.
        #[test]
        fn the_level_stays_bounded(
            steps in proptest::collection::vec((0u64..1_500, 0u64..3_000, 0u64..5_000), 1..40),
        ) {
            let t0 = Instant::now();
            let mut bucket = TokenBucket::new(LIMIT, t0);
            let mut now = t0;
            for (cost, used, wait_ms) in steps {
                now += Duration::from_millis(wait_ms);
                let before = bucket.level(now);
                match bucket.try_take(cost, now) {
                    Ok(()) => bucket.adjust(cost as f64 - used as f64, now),
                    Err(_) => proptest::prop_assert_eq!(bucket.level(now), before),
                }
                let level = bucket.level(now);
                proptest::prop_assert!((-1_000.0..=1_000.0).contains(&level), "{}", level);
            }
        }
    }
}
