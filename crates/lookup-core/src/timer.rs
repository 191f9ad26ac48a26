//! Deadlines as data (CONTRIBUTING.md rule 4): one ordered table that every deadline holder of
//! the project uses, so "the next timeout" is always its minimum and a due deadline is
//! handled exactly once.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Deadlines keyed by `K`, ordered by instant (ties by key).
///
/// [`next`](Self::next) is the earliest; [`pop_due`](Self::pop_due) takes the due ones
/// one at a time, so a caller handles every deadline at or before `now`, and an early or
/// repeated call finds nothing (CONTRIBUTING.md rule 3).
#[derive(Debug, Clone)]
pub struct Timers<K: Ord + Copy> {
    set: BTreeSet<(Instant, K)>,
}

impl<K: Ord + Copy> Default for Timers<K> {
    fn default() -> Self {
        Self {
            set: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Copy> Timers<K> {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a deadline for `key` at `at`.
    pub fn insert(&mut self, at: Instant, key: K) {
        self.set.insert((at, key));
    }

    /// Removes the deadline `(at, key)`; false when it was not there.
    pub fn remove(&mut self, at: Instant, key: K) -> bool {
        self.set.remove(&(at, key))
    }

    /// The earliest deadline.
    #[must_use]
    pub fn next(&self) -> Option<Instant> {
        self.set.first().map(|(t, _)| *t)
    }

    /// Takes the earliest deadline if it is at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<(Instant, K)> {
        match self.set.first() {
            Some(&(at, _)) if at <= now => self.set.pop_first(),
            _ => None,
        }
    }

    /// Deadlines held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// True when no deadline is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Drops every deadline.
    pub fn clear(&mut self) {
        self.set.clear();
    }
}

/// `now + d`, saturating at a far-future instant instead of panicking on overflow, so
/// that any finite configured duration is safe (`spec/behaviour.md`, configuration:
/// huge values mean "never").
#[must_use]
pub fn deadline_after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

/// About 30 years: later than any deadline a process lives to see, and small enough to
/// add to any `Instant` this platform produces.
const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// Exponential backoff between attempts (opening a socket, connecting to a master):
/// starts at `initial`, doubles per failure up to `max`, back to `initial` on success.
/// Shared by every transport so that each retries the same way (rule 17).
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Longest wait between two attempts used by the drivers (1 s).
    pub const MAX: Duration = Duration::from_secs(1);

    /// A backoff from `initial` up to `max` (`max` is raised to `initial` if lower).
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The wait before the next attempt after a failure; the one after it doubles.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        delay
    }

    /// An attempt succeeded: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_deadlines_come_out_in_order_once() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        timers.insert(t0 + Duration::from_millis(20), 2u64);
        timers.insert(t0 + Duration::from_millis(10), 1u64);
        timers.insert(t0 + Duration::from_millis(30), 3u64);
        assert_eq!(timers.next(), Some(t0 + Duration::from_millis(10)));
        let now = t0 + Duration::from_millis(20);
        assert_eq!(timers.pop_due(now).map(|(_, k)| k), Some(1));
        assert_eq!(timers.pop_due(now).map(|(_, k)| k), Some(2));
        assert_eq!(timers.pop_due(now), None);
        assert_eq!(timers.pop_due(now), None);
        assert_eq!(timers.len(), 1);
        assert!(timers.remove(t0 + Duration::from_millis(30), 3));
        assert!(timers.is_empty());
    }

    #[test]
    fn deadline_after_saturates_instead_of_panicking() {
        let now = Instant::now();
        let far = deadline_after(now, Duration::MAX);
        assert_eq!(far, now + FAR_FUTURE);
        assert_eq!(
            deadline_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
        let delays: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, vec![10, 20, 40, 50, 50]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(10));
    }
}
