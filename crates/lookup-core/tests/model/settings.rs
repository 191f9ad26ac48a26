//! One test case's configuration, and the model's clock: nanoseconds since the case
//! started, wide enough for any deadline a configuration can produce.

use std::time::{Duration, Instant};

use lookup_core::{Config, OnPreemption};

use crate::server::Shape;

/// `lookup_core::RETRY_BACKOFF_MIN` and `_MAX`, in nanoseconds (rule 11).
pub(crate) const RETRY_MIN_NS: u128 = 10_000_000;
pub(crate) const RETRY_MAX_NS: u128 = 1_000_000_000;
/// Where a deadline beyond every representable instant lands, from its start
/// (`lookup_core::timer::deadline_after`: about 30 years, "never").
const FAR_FUTURE_NS: u128 = 30 * 365 * 24 * 3600 * 1_000_000_000;

/// The configuration of one test case: the [`Config`] keys that vary, the block
/// geometry, the pool size and how the driver writes.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `enable_lookup`.
    pub(crate) enable_lookup: bool,
    /// `lookup_async`.
    pub(crate) lookup_async: bool,
    /// `load_async`.
    pub(crate) load_async: bool,
    /// `lookup_prefetch_limit` (arrival-time lookups in flight).
    pub(crate) prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds, >= 0).
    pub(crate) ttl_s: f64,
    /// `lookup_timeout_s` (seconds, > 0).
    pub(crate) timeout_s: f64,
    /// `lookup_share`.
    pub(crate) share: bool,
    /// `lookup_priority`.
    pub(crate) priority: bool,
    /// `max_in_flight` (RPCs on the wire).
    pub(crate) max_in_flight: u32,
    /// `max_queued` (RPCs waiting for the wire).
    pub(crate) max_queued: u32,
    /// `block_size` and the length of each block hash (bytes).
    pub(crate) shape: Shape,
    /// Requests in the pool (ids `0..pool`).
    pub(crate) pool: usize,
    /// The driver holds every released RPC until a transition writes it (or fails
    /// it), instead of writing it at once.
    pub(crate) deferred_writes: bool,
    /// `lookup_on_preemption` (rule 8).
    pub(crate) on_preemption: OnPreemption,
    /// `lookup_preempted_wait_s` (seconds, >= 0).
    pub(crate) preempted_wait_s: f64,
}

impl Settings {
    /// The core's configuration.
    pub(crate) fn config(&self) -> Config {
        let mut config = Config::new(self.shape.block_size);
        config.enable_lookup = self.enable_lookup;
        config.lookup_async = self.lookup_async;
        config.load_async = self.load_async;
        config.lookup_prefetch_limit = self.prefetch_limit;
        config.lookup_prefetch_ttl = lookup_core::duration_from_secs(self.ttl_s).unwrap();
        config.lookup_timeout = lookup_core::duration_from_secs(self.timeout_s).unwrap();
        config.lookup_share = self.share;
        config.lookup_priority = self.priority;
        config.max_in_flight = self.max_in_flight;
        config.max_queued = self.max_queued;
        config.lookup_on_preemption = self.on_preemption;
        config.lookup_preempted_wait =
            lookup_core::duration_from_secs(self.preempted_wait_s).unwrap();
        config
    }

    /// Configuration table: prefetch needs lookup on, async mode and a positive limit.
    pub(crate) fn prefetch(&self) -> bool {
        self.enable_lookup && self.lookup_async && self.prefetch_limit > 0
    }
}

/// Seconds as nanoseconds, rounded to the nearest as [`Duration`] rounds them;
/// beyond `Duration`'s range, its maximum ("never": the configuration table).
pub(crate) fn seconds_ns(s: f64) -> u128 {
    Duration::try_from_secs_f64(s)
        .unwrap_or(Duration::MAX)
        .as_nanos()
}

/// `ns` nanoseconds as a [`Duration`] (any value the model's clock reaches).
pub(crate) fn duration(ns: u128) -> Duration {
    let secs = u64::try_from(ns / 1_000_000_000).expect("within Duration");
    let nanos = u32::try_from(ns % 1_000_000_000).expect("below a second");
    Duration::new(secs, nanos)
}

/// The model's clock: instants as nanoseconds since `base`, the instant the case
/// started (shared with the harness, so that both see the same representable range).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    pub(crate) base: Instant,
}

impl Clock {
    /// The instant `ns` after the start, if the platform can represent it.
    pub(crate) fn instant(self, ns: u128) -> Option<Instant> {
        let secs = u64::try_from(ns / 1_000_000_000).ok()?;
        let nanos = u32::try_from(ns % 1_000_000_000).expect("below a second");
        self.base.checked_add(Duration::new(secs, nanos))
    }

    /// A deadline `d_ns` after `at_ns`, saturating as `deadline_after` documents:
    /// beyond every representable instant it is 30 years after `at_ns` (never, in a
    /// process's life), so no duration can make it panic.
    pub(crate) fn deadline(self, at_ns: u128, d_ns: u128) -> u128 {
        if self.instant(at_ns + d_ns).is_some() {
            at_ns + d_ns
        } else if self.instant(at_ns + FAR_FUTURE_NS).is_some() {
            at_ns + FAR_FUTURE_NS
        } else {
            at_ns
        }
    }
}
