//! List and watch the selected pods, forever, feeding a [`PodTable`]: kube-runtime's
//! [`watcher`] does the Kubernetes protocol, this module maps its events onto the table and
//! owns the retry policy.
//!
//! The watcher lists the pods (paged), then watches from the list's `resourceVersion` with
//! bookmarks and `timeoutSeconds`; a watch that ends is resumed from the last version seen.
//! The list arrives as `Init`, `InitApply`… and `InitDone`; it is buffered and replaces the
//! table at `InitDone`, so a relist swaps the replica set once. A `410 Gone` `ERROR` event
//! makes the watcher list again by itself. A `410` answered as the watch request's HTTP status
//! (which kube's watcher treats as a plain stream error and would retry with the same stale
//! version) restarts the watcher here, which lists again.
//!
//! Every failure keeps the last snapshot, is logged once, and is retried after an exponential
//! backoff ([`Backoff`], `backoff_initial` doubling to `backoff_max`). The backoff starts
//! over when the table changes (a list completes, a pod event arrives) or when a failure
//! follows a long quiet spell (a watch that stayed open), so a broken API server costs a log
//! line per backoff step, not a busy loop. The backoff is this module's rather than
//! kube-runtime's `StreamBackoff`, which resets on the `Init` event every list attempt
//! begins with, so failing lists would never back off beyond the first step.

use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher::{self, Event, watcher};
use tokio::time::Instant;

use super::PodTable;
use super::pod;
use crate::upstream::describe;

/// A failure this long after the previous one's retry, plus `backoff_max`, starts the backoff
/// over: the attempt in between was healthy for a while.
const HEALTHY_SPELL: Duration = Duration::from_secs(10);

/// What to watch and how to retry.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    pub selector: String,
    /// The server ends each watch after this long (`timeoutSeconds`); it is then resumed.
    pub watch_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

/// Exponential backoff: `initial`, doubling, at most `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    /// When the last delay was handed out.
    last_failure: Option<Instant>,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            next: initial.min(max),
            last_failure: None,
        }
    }

    /// The delay before retrying a failure seen at `now`; each call doubles the following
    /// one, unless the previous failure was long ago.
    pub fn next_delay(&mut self, now: Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|last| now.saturating_duration_since(last) > self.max + HEALTHY_SPELL)
        {
            self.reset();
        }
        self.last_failure = Some(now);
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

/// Lists and watches forever; stopped by aborting the task.
pub async fn run(pods: Api<Pod>, settings: WatchSettings, mut table: PodTable) {
    let config = watcher::Config::default()
        .labels(&settings.selector)
        .timeout(u32::try_from(settings.watch_timeout.as_secs()).unwrap_or(u32::MAX));
    let mut backoff = Backoff::new(settings.backoff_initial, settings.backoff_max);
    loop {
        let mut events = std::pin::pin!(watcher(pods.clone(), config.clone()));
        // The pods of a list in progress; they replace the table when it is complete.
        let mut listed = Vec::new();
        while let Some(event) = events.next().await {
            let error = match event {
                Ok(Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(Event::InitApply(pod)) => {
                    listed.push(pod);
                    continue;
                }
                Ok(Event::InitDone) => {
                    tracing::debug!(pods = listed.len(), "pods listed");
                    table.replace_all(std::mem::take(&mut listed));
                    backoff.reset();
                    continue;
                }
                Ok(Event::Apply(pod)) => {
                    table.upsert(&pod);
                    backoff.reset();
                    continue;
                }
                Ok(Event::Delete(pod)) => {
                    table.remove(pod::name(&pod));
                    backoff.reset();
                    continue;
                }
                Err(error) => error,
            };
            let delay = backoff.next_delay(Instant::now());
            let retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            let gone = is_gone_status(&error);
            let error = describe(&error);
            if gone {
                tracing::info!(%error, retry_in_ms, "410 Gone: listing pods again");
            } else {
                tracing::warn!(
                    %error,
                    retry_in_ms,
                    "pod list or watch failed; keeping the last replica set"
                );
            }
            tokio::time::sleep(delay).await;
            if gone {
                // A new watcher starts with a list.
                break;
            }
        }
    }
}

/// A watch request answered with HTTP status 410 (the `ERROR` event form is handled by
/// the watcher itself).
fn is_gone_status(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::WatchFailed(kube::Error::Api(response))
            | watcher::Error::WatchStartFailed(kube::Error::Api(response))
            if response.code == 410
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_bound_and_resets() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(350));
        let start = Instant::now();
        let delays: Vec<Duration> = (0..5)
            .map(|i| backoff.next_delay(start + ms(400) * i))
            .collect();
        assert_eq!(delays, [ms(100), ms(200), ms(350), ms(350), ms(350)]);
        backoff.reset();
        assert_eq!(backoff.next_delay(start + ms(2_000)), ms(100));
        assert_eq!(backoff.next_delay(start + ms(2_400)), ms(200));
        // A failure after a long healthy spell starts over.
        let later = start + ms(2_400) + ms(350) + HEALTHY_SPELL + ms(1);
        assert_eq!(backoff.next_delay(later), ms(100));
    }

    #[test]
    fn only_a_410_status_restarts_the_watcher() {
        let gone = kube::core::ErrorResponse {
            status: "Failure".to_owned(),
            message: "too old resource version".to_owned(),
            reason: "Expired".to_owned(),
            code: 410,
        };
        let forbidden = kube::core::ErrorResponse {
            code: 403,
            ..gone.clone()
        };
        assert!(is_gone_status(&watcher::Error::WatchFailed(
            kube::Error::Api(gone.clone())
        )));
        assert!(!is_gone_status(&watcher::Error::WatchFailed(
            kube::Error::Api(forbidden)
        )));
        // The ERROR event: the watcher relists by itself.
        assert!(!is_gone_status(&watcher::Error::WatchError(gone)));
    }
}
