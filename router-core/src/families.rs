//! The prompt families a pod serves now: the distinct first blocks of the prefix-aware
//! requests routed to it, each remembered until it has gone a window without a request.
//!
//! `prefix-load` places a *new* family (a prompt no pod holds any block of) by them. Every
//! family a pod serves brings its later requests there, because they follow the cache, so
//! the families a pod serves are the load it is committed to. Its outstanding requests
//! only sample that load: a family between two requests has none outstanding, yet its
//! next request will come to this pod.
//!
//! Each entry also says whether the family has recurred (a second request routed here):
//! the policy scales the term by that fraction, so a stream of one-off prompts, each its
//! own "family" that will never come back, steers nothing.
//!
//! Bounded: entries idle for a window are pruned every quarter window (one sweep, however
//! many requests come between), and at most [`MAX_FAMILIES`] are kept per pod (beyond that
//! new ones are not counted until a sweep makes room, so the count saturates instead of
//! growing with a flood of one-off prompts).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::Millis;

/// The most families remembered per pod.
pub const MAX_FAMILIES: usize = 65_536;

/// The families recently routed to one pod (see the module docs).
#[derive(Debug, Default)]
pub struct RecentFamilies {
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// First-block hash → the family's entry.
    last: HashMap<u64, Family>,
    /// How many of the entries have recurred (kept with them, so reading it is O(1)).
    recurring: usize,
    pruned_at: Millis,
}

#[derive(Debug, Clone, Copy)]
struct Family {
    /// When a request of the family was last routed here.
    last: Millis,
    /// A second request of it has been routed here.
    recurred: bool,
}

/// The families [`RecentFamilies::count`] found, and how many of them have recurred.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FamilyCount {
    pub families: usize,
    /// Families with at least two requests routed here within the window: proof that the
    /// prompts are families at all, not one-off prompts.
    pub recurring: usize,
}

impl Seen {
    /// Drops the families idle for `window` when a quarter window has passed since the
    /// last sweep. Only then: a full map is not swept per request (a flood of one-off
    /// prompts would make every request pay for the whole map); new families are simply
    /// not counted until the next sweep makes room.
    fn prune(&mut self, now: Millis, window: Millis) {
        if now.saturating_sub(self.pruned_at) >= (window / 4).max(1) {
            self.last
                .retain(|_, family| now.saturating_sub(family.last) < window);
            self.recurring = self.last.values().filter(|f| f.recurred).count();
            self.pruned_at = now;
        }
    }
}

impl RecentFamilies {
    /// Records that a request of the family whose first block hashes to `root` was routed
    /// here at `now`.
    pub fn record(&self, root: u64, now: Millis, window: Millis) {
        let mut seen = self.seen();
        seen.prune(now, window);
        let Seen {
            last, recurring, ..
        } = &mut *seen;
        if let Some(family) = last.get_mut(&root) {
            family.last = family.last.max(now);
            if !family.recurred {
                family.recurred = true;
                *recurring += 1;
            }
        } else if last.len() < MAX_FAMILIES {
            last.insert(
                root,
                Family {
                    last: now,
                    recurred: false,
                },
            );
        }
    }

    /// The families with a request routed here within `window` before `now` (entries up to
    /// a quarter window older may still count until the next sweep).
    pub fn count(&self, now: Millis, window: Millis) -> FamilyCount {
        let mut seen = self.seen();
        seen.prune(now, window);
        FamilyCount {
            families: seen.last.len(),
            recurring: seen.recurring,
        }
    }

    /// Every update is one map operation, so the map stays consistent under a poisoned lock.
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Millis = 60_000;

    #[test]
    fn a_family_counts_once_however_many_requests_it_sends() {
        let families = RecentFamilies::default();
        for t in 0..10 {
            families.record(7, t * 1000, WINDOW);
        }
        families.record(8, 10_000, WINDOW);
        assert_eq!(families.count(10_000, WINDOW).families, 2);
    }

    #[test]
    fn a_family_recurs_with_its_second_request_and_stops_with_its_entry() {
        let families = RecentFamilies::default();
        families.record(1, 0, WINDOW);
        families.record(2, 0, WINDOW);
        let count = |now| families.count(now, WINDOW);
        assert_eq!(
            count(0),
            FamilyCount {
                families: 2,
                recurring: 0
            }
        );
        families.record(1, 1_000, WINDOW);
        families.record(1, 2_000, WINDOW);
        assert_eq!(
            count(2_000),
            FamilyCount {
                families: 2,
                recurring: 1
            }
        );
        // Family 2 idles out; family 1 (last seen at 2 s) goes at the sweep after 62 s.
        assert_eq!(
            count(61_000),
            FamilyCount {
                families: 1,
                recurring: 1
            }
        );
        assert_eq!(count(80_000), FamilyCount::default());
    }

    #[test]
    fn a_family_idle_for_a_window_stops_counting_and_a_new_request_revives_it() {
        let families = RecentFamilies::default();
        families.record(1, 0, WINDOW);
        families.record(2, 50_000, WINDOW);
        // Family 1 was last seen at 0 ms. The sweep at 66 s (more than a quarter window
        // after the one at 50 s) drops it and keeps family 2 (16 s idle).
        assert_eq!(families.count(66_000, WINDOW).families, 1);
        families.record(1, 67_000, WINDOW);
        assert_eq!(families.count(67_000, WINDOW).families, 2);
        assert_eq!(families.count(200_000, WINDOW).families, 0);
    }

    #[test]
    fn the_count_saturates_at_the_bound() {
        let families = RecentFamilies::default();
        for root in 0..(MAX_FAMILIES as u64 + 100) {
            families.record(root, 1, WINDOW);
        }
        assert_eq!(families.count(1, WINDOW).families, MAX_FAMILIES);
        // A family already counted still refreshes; it does not need a free slot.
        families.record(0, 30_000, WINDOW);
        assert_eq!(families.count(70_000, WINDOW).families, 1);
    }

    #[test]
    fn a_clock_that_steps_back_is_not_a_panic_and_keeps_the_later_time() {
        let families = RecentFamilies::default();
        families.record(1, 10_000, WINDOW);
        families.record(1, 5_000, WINDOW);
        assert_eq!(families.count(5_000, WINDOW).families, 1);
        assert_eq!(families.count(69_000, WINDOW).families, 1);
        assert_eq!(families.count(85_000, WINDOW).families, 0);
    }
}
