//! [`PresenceCache`]: keys the master answered present, kept only as long as the read
//! lease that answer granted guarantees they stay (`spec/mooncake-master-rpc.md`, "The
//! call": every `true` answer leases the object for `default_kv_lease_ttl`, 10 s by
//! default). Pure: every call takes `now`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Settings of the lease-backed presence cache. On by default.
///
/// A key answered present is known present until the earlier of its read lease and
/// [`max_age`](Self::max_age), both measured from the moment the batch that asked it
/// was handed to the connection (before the master granted the lease, so the entry
/// never outlives it). A lookup then asks only for its unknown tail: a continuation of
/// a conversation, or a prompt sharing a system prefix with one asked shortly before.
/// The cache belongs to one connection epoch ([`Epoch`](crate::Epoch): a reconnect, a
/// leader change, a restarted master, this client's `RemoveAll` each end it) and is
/// also dropped on a reset and on any unavailable outcome; a round takes a key from it
/// only at that round's send time, and an answer resting on it is given only while its
/// epoch lasts (`spec/mooncake-master-rpc.md`, "Connection epochs and the presence
/// cache").
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PresenceCacheConfig {
    /// Whether the cache is used. Default `true`: a key the master answered present
    /// is not asked again while its read lease outlasts the answer's TTL. `false`
    /// asks the master about every key of every run, as vLLM's worker does.
    pub enabled: bool,
    /// The longest an entry is trusted, in addition to the lease. Default 10 s (the
    /// master's default lease; set it lower to bound how stale an answer may be when
    /// another engine removes keys with `RemoveAll(force)`).
    pub max_age: Duration,
    /// Most keys kept. Default 1,048,576 (~100 MiB of keys at vLLM's key length);
    /// when full, expired entries go, and if none had expired, the whole cache.
    pub max_keys: usize,
}

impl Default for PresenceCacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_age: Duration::from_secs(10),
            max_keys: 1 << 20,
        }
    }
}

impl PresenceCacheConfig {
    /// The cache off.
    #[must_use]
    pub fn uncached() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

/// Keys known present and until when (exclusive), the earlier of the lease and the
/// configured bound.
#[derive(Debug, Default)]
pub struct PresenceCache {
    until: HashMap<String, Instant>,
    max_keys: usize,
    drops: u64,
}

impl PresenceCache {
    /// An empty cache holding at most `max_keys` keys (0: nothing is ever kept).
    #[must_use]
    pub fn new(max_keys: usize) -> Self {
        Self {
            until: HashMap::new(),
            max_keys,
            drops: 0,
        }
    }

    /// Whether `key` is known present at `now` and stays so for at least `margin`
    /// (the time a result computed now may still be used: a cached lookup result must
    /// not outlive the lease either).
    #[must_use]
    pub fn is_present(&self, key: &str, now: Instant, margin: Duration) -> bool {
        self.until
            .get(key)
            .is_some_and(|until| now.checked_add(margin).is_some_and(|t| t < *until))
    }

    /// When `key`'s entry ends, if it is known present at `now` and stays so for at
    /// least `margin` ([`is_present`](Self::is_present)).
    #[must_use]
    pub fn valid_until(&self, key: &str, now: Instant, margin: Duration) -> Option<Instant> {
        let until = *self.until.get(key)?;
        now.checked_add(margin)
            .is_some_and(|t| t < until)
            .then_some(until)
    }

    /// Records `key` as present until `until`. An entry never moves to an earlier
    /// expiry (a later answer renewed the lease further).
    pub fn insert(&mut self, key: &str, until: Instant, now: Instant) {
        if self.max_keys == 0 {
            return;
        }
        if let Some(at) = self.until.get_mut(key) {
            *at = (*at).max(until);
            return;
        }
        if self.until.len() >= self.max_keys {
            self.until.retain(|_, at| *at > now);
            if self.until.len() >= self.max_keys {
                self.clear();
            }
        }
        self.until.insert(key.to_owned(), until);
    }

    /// Ends every entry `by` earlier (the lease they were kept for turned out
    /// shorter).
    pub fn shorten(&mut self, by: Duration) {
        self.until.retain(|_, until| match until.checked_sub(by) {
            Some(earlier) => {
                *until = earlier;
                true
            }
            None => false,
        });
    }

    /// Forgets every key (a reset, a leader change, an unavailable outcome).
    pub fn clear(&mut self) {
        if !self.until.is_empty() {
            self.drops += 1;
        }
        self.until.clear();
    }

    /// Keys held (expired ones included until a full cache sweeps them).
    #[must_use]
    pub fn len(&self) -> usize {
        self.until.len()
    }

    /// Whether no key is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    /// Times a non-empty cache was dropped.
    #[must_use]
    pub const fn drops(&self) -> u64 {
        self.drops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_holds_until_its_expiry_less_the_margin() {
        let t0 = Instant::now();
        let mut cache = PresenceCache::new(4);
        cache.insert("a", t0 + Duration::from_secs(10), t0);
        assert!(cache.is_present("a", t0, Duration::ZERO));
        assert!(cache.is_present("a", t0 + Duration::from_secs(7), Duration::from_secs(2)));
        assert!(!cache.is_present("a", t0 + Duration::from_secs(8), Duration::from_secs(2)));
        assert!(!cache.is_present("a", t0 + Duration::from_secs(10), Duration::ZERO));
        assert!(!cache.is_present("b", t0, Duration::ZERO));
        // A later answer extends; an earlier one never shortens.
        cache.insert("a", t0 + Duration::from_secs(5), t0);
        assert!(cache.is_present("a", t0 + Duration::from_secs(9), Duration::ZERO));
        cache.insert("a", t0 + Duration::from_secs(12), t0);
        assert!(cache.is_present("a", t0 + Duration::from_secs(11), Duration::ZERO));
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.drops(), 1);
        cache.clear();
        assert_eq!(cache.drops(), 1);
    }

    #[test]
    fn a_shorter_lease_ends_every_entry_that_much_earlier() {
        let t0 = Instant::now();
        let mut cache = PresenceCache::new(4);
        cache.insert("a", t0 + Duration::from_secs(10), t0);
        cache.insert("b", t0 + Duration::from_secs(12), t0);
        cache.shorten(Duration::from_secs(5));
        assert!(cache.is_present("a", t0 + Duration::from_millis(4_999), Duration::ZERO));
        assert!(!cache.is_present("a", t0 + Duration::from_secs(5), Duration::ZERO));
        assert!(cache.is_present("b", t0 + Duration::from_millis(6_999), Duration::ZERO));
        assert!(!cache.is_present("b", t0 + Duration::from_secs(7), Duration::ZERO));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_full_cache_sweeps_expired_entries_then_everything() {
        let t0 = Instant::now();
        let mut cache = PresenceCache::new(2);
        cache.insert("a", t0 + Duration::from_secs(1), t0);
        cache.insert("b", t0 + Duration::from_secs(10), t0);
        let later = t0 + Duration::from_secs(2);
        cache.insert("c", t0 + Duration::from_secs(10), later);
        assert_eq!(cache.len(), 2);
        assert!(cache.is_present("b", later, Duration::ZERO));
        assert!(cache.is_present("c", later, Duration::ZERO));
        cache.insert("d", t0 + Duration::from_secs(10), later);
        assert_eq!(cache.len(), 1);
        assert!(cache.is_present("d", later, Duration::ZERO));
        assert_eq!(cache.drops(), 1);
        let mut none = PresenceCache::new(0);
        none.insert("a", t0 + Duration::from_secs(1), t0);
        assert!(none.is_empty());
    }
}
