//! Batching across lookups: several leading-run queries answered by shared
//! `BatchExistKey` calls ([`Coalescer`]), planned by the pure [`LeadingRuns`], with a
//! lease-backed [`PresenceCache`] (on by default), going by the master's own read lease once
//! it is read ([`LeaseTtl`]).
//!
//! # When lookups are batched (no added delay on an idle link)
//!
//! Lookups are [`submit`](Coalescer::submit)ted, then [`flush`](Coalescer::flush)ed.
//! A flush starts a batch at once unless
//! [`max_batches_in_flight`](BatchConfig::max_batches_in_flight) batches are already
//! asking the master; so on an idle link a lookup goes out the moment it is released,
//! with whatever was released together with it (the direct transport flushes once per
//! pass of its I/O task, after the dispatcher released everything it could). Lookups
//! submitted while batches are in flight wait for the next batch, which starts as one
//! ends: Nagle's idea without Nagle's timer. No lookup waits longer than
//! [`max_wait`](BatchConfig::max_wait) for a batch: past it, another batch starts
//! beside those in flight.
//!
//! # What each lookup gets
//!
//! Its own exact answer: the leading run that
//! [`MasterClient::leading_blocks_flat`] gives for its keys alone on the same store
//! (`spec/wire.md`, "What the server computes", steps 2-3), since keys are only
//! deduplicated, never guessed. A failed call fails exactly the lookups that needed one
//! of its keys. Dropping a lookup's [`Pending`] before its batch starts takes its keys
//! out of the batch (cancellation stays its own); timeouts are the caller's.

mod lease;
mod plan;
mod presence;
mod run;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

pub use lease::{LeaseSource, LeaseTtl};
pub use plan::LeadingRuns;
pub use presence::{PresenceCache, PresenceCacheConfig};

use crate::client::lock;
use crate::{Epoch, MasterClient, MasterError};
use lease::Lease;
use run::{run_batch, start_driver, stopped};

/// The master's default read lease (`default_kv_lease_ttl`, 10 s), granted to every key
/// an existence query answers `true` (`spec/mooncake-master-rpc.md`, "The call").
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// How lookups are batched ([`Coalescer`]) and cached ([`PresenceCacheConfig`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchConfig {
    /// Whether lookups share calls. Default `true`. With `false` each lookup is its
    /// own query, started at once (the presence cache still applies when enabled).
    pub enabled: bool,
    /// Most lookups in one batch. Default 64 (64 lookups of 512 blocks × 1 namespace
    /// are 32 calls of 1,024 keys per round).
    pub max_lookups: usize,
    /// Longest a submitted lookup waits for a batch to start. Default 1 ms, several
    /// times one 1,024-key call on loopback (~0.3 ms): a batch in flight normally ends
    /// before it. Zero starts a batch for every flush.
    pub max_wait: Duration,
    /// Batches asking the master at once before new lookups wait for one to end.
    /// Default 1.
    pub max_batches_in_flight: usize,
    /// The lease-backed presence cache (on by default).
    pub presence: PresenceCacheConfig,
    /// Whether the master's read lease is read (one `GetReplicaList` per leader, for
    /// the first key a batch finds present; it leases that key again, which its
    /// existence answer just did). Default `true`. The lease then bounds the presence
    /// cache and the TTL checks ([`Coalescer::check_ttl`]) instead of the configured
    /// one (`spec/mooncake-master-rpc.md`, "Where the lease can be read").
    pub read_lease: bool,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_lookups: 64,
            max_wait: Duration::from_millis(1),
            max_batches_in_flight: 1,
            presence: PresenceCacheConfig::default(),
            read_lease: true,
        }
    }
}

impl BatchConfig {
    /// No batching and no cache: every lookup asks alone, as before batching existed.
    #[must_use]
    pub fn unbatched() -> Self {
        Self {
            enabled: false,
            presence: PresenceCacheConfig::uncached(),
            ..Self::default()
        }
    }

    /// Batching on, the presence cache off: every lookup's keys are asked, shared with
    /// the lookups released with it.
    #[must_use]
    pub fn uncached() -> Self {
        Self {
            presence: PresenceCacheConfig::uncached(),
            ..Self::default()
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] naming the field: `max_lookups` or
    /// `max_batches_in_flight` 0, or `presence.max_age` 0 with the cache enabled.
    pub fn validate(&self) -> Result<(), MasterError> {
        let invalid = |what, why: &str| {
            Err(MasterError::InvalidConfig {
                what,
                why: why.to_owned(),
            })
        };
        if self.max_lookups == 0 {
            return invalid("batch.max_lookups", "must be at least 1");
        }
        if self.max_batches_in_flight == 0 {
            return invalid("batch.max_batches_in_flight", "must be at least 1");
        }
        if self.presence.enabled && self.presence.max_age.is_zero() {
            return invalid("batch.presence.max_age", "must be positive");
        }
        Ok(())
    }
}

/// Counters of a [`Coalescer`] since it was made (all counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchStats {
    /// Batches started (one logical existence query each, one or more calls).
    pub batches: u64,
    /// Lookups answered by them.
    pub lookups: u64,
    /// Lookups dropped before their batch started (not asked).
    pub lookups_dropped: u64,
    /// Keys the lookups needed, counted per lookup (what unbatched queries send).
    pub keys_wanted: u64,
    /// Keys sent to the master (each key once per batch).
    pub keys_asked: u64,
    /// Keys taken from the presence cache instead of being asked.
    pub keys_from_cache: u64,
    /// Times the presence cache was dropped (reset, leader change, failed call).
    pub cache_drops: u64,
    /// Successful reads of the master's read lease (`GetReplicaList` calls answered).
    pub lease_reads: u64,
}

crate::counters! {
    /// The live counters behind [`BatchStats`] (its other two fields come from the
    /// presence cache and the lease).
    struct Counters => BatchStats {
        batches,
        lookups,
        lookups_dropped,
        keys_wanted,
        keys_asked,
        keys_from_cache,
    }
}

type Answer = Result<usize, MasterError>;

/// One submitted lookup.
struct Waiting {
    keys: Vec<String>,
    keys_per_block: usize,
    since: Instant,
    answer: oneshot::Sender<Answer>,
}

struct State {
    queue: VecDeque<Waiting>,
    /// Batches asking the master now.
    drivers: usize,
    cache: PresenceCache,
    /// The epoch the cache's entries belong to (`None`: no connection was up).
    cache_epoch: Option<Epoch>,
    /// The read lease in use, and its reading.
    lease: Lease,
}

impl State {
    /// How long a cache entry stays: the earlier of the lease and `max_age`.
    fn keep(&self, config: &BatchConfig) -> Duration {
        self.lease.current().ttl.min(config.presence.max_age)
    }

    /// Moves the cache and the lease forward to `epoch`: entries of an earlier epoch
    /// are dropped (a reconnect, a leader change, a restarted master, this client's
    /// `RemoveAll`), and the lease of an earlier connection is forgotten. An epoch
    /// read before the current one (a round that read it before another round moved
    /// on) moves nothing back: it returns false, and that round takes nothing from the
    /// cache. `None` (no connection) moves nothing either.
    fn enter(&mut self, epoch: Option<Epoch>) -> bool {
        let Some(epoch) = epoch else { return false };
        match self.cache_epoch {
            Some(current) if current > epoch => return false,
            Some(current) if current == epoch => {}
            _ => {
                self.cache.clear();
                self.cache_epoch = Some(epoch);
            }
        }
        self.lease.enter(epoch.master());
        true
    }
}

struct Shared {
    master: MasterClient,
    config: BatchConfig,
    /// How long past a lookup a cached key must stay valid.
    margin: Duration,
    state: Mutex<State>,
    counters: Counters,
}

/// Answers leading-run queries of many lookups with shared `BatchExistKey` calls (see
/// the module docs for when a batch starts). A cheap, cloneable handle over one
/// [`MasterClient`]; batches run as tasks of the tokio runtime of the caller of
/// [`flush`](Self::flush).
#[derive(Clone)]
pub struct Coalescer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("master", &self.shared.master.addr())
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Coalescer {
    /// A coalescer over `master`. `lease_ttl` is the master's `default_kv_lease_ttl`
    /// as configured (10 s by default), used until the master reports its own
    /// ([`BatchConfig::read_lease`]); a cached key is used only while it stays valid for
    /// `margin` more (the life of a result computed from it, e.g.
    /// `lookup_prefetch_ttl_s`). Settings are taken as given; check them with
    /// [`BatchConfig::validate`].
    #[must_use]
    pub fn new(
        master: MasterClient,
        config: BatchConfig,
        lease_ttl: Duration,
        margin: Duration,
    ) -> Self {
        let epoch = master.epoch();
        let cache = PresenceCache::new(if config.presence.enabled {
            config.presence.max_keys
        } else {
            0
        });
        Self {
            shared: Arc::new(Shared {
                master,
                margin,
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    drivers: 0,
                    cache,
                    cache_epoch: epoch,
                    lease: Lease::new(
                        lease_ttl,
                        config.read_lease,
                        epoch.map_or((0, 0), Epoch::master),
                    ),
                }),
                config,
                counters: Counters::default(),
            }),
        }
    }

    /// The settings in use.
    #[must_use]
    pub fn config(&self) -> &BatchConfig {
        &self.shared.config
    }

    /// Holds `ttl` (the life of results computed from the answers, e.g. a client's
    /// `lookup_prefetch_ttl_s`, named by `setting` in the warning) below the read lease:
    /// a warning now if it is not below the lease in use, and again if the lease the
    /// master reports later is not above it.
    pub fn check_ttl(&self, ttl: Duration, setting: &'static str) {
        lock(&self.shared.state)
            .lease
            .check_ttl(ttl, setting, self.shared.master.addr());
    }

    /// The read lease in use: the master's once read from the current leader, the
    /// configured one before that or when it cannot be read.
    #[must_use]
    pub fn lease(&self) -> LeaseTtl {
        lock(&self.shared.state).lease.current()
    }

    /// Queues one lookup: `keys` block-major, `keys_per_block` per block (as
    /// [`MasterClient::leading_blocks_flat`]). Nothing is sent before
    /// [`flush`](Self::flush) (or, unbatched, before the [`Pending`] is awaited).
    pub fn submit(&self, keys: Vec<String>, keys_per_block: usize) -> Pending {
        if !self.shared.config.enabled {
            return Pending {
                shared: self.shared.clone(),
                inner: PendingInner::Alone(keys, keys_per_block),
            };
        }
        let (tx, rx) = oneshot::channel();
        let since = Instant::now();
        lock(&self.shared.state).queue.push_back(Waiting {
            keys,
            keys_per_block,
            since,
            answer: tx,
        });
        Pending {
            shared: self.shared.clone(),
            inner: PendingInner::Queued(rx, since),
        }
    }

    /// Starts a batch of what is queued unless
    /// [`max_batches_in_flight`](BatchConfig::max_batches_in_flight) are under way (one
    /// of them then takes it when it ends). Must run inside a tokio runtime.
    pub fn flush(&self) {
        start_driver(&self.shared, false);
    }

    /// One lookup, batched with whatever else is queued: [`submit`](Self::submit),
    /// [`flush`](Self::flush), wait.
    ///
    /// # Errors
    /// As [`MasterClient::leading_blocks_flat`].
    pub async fn leading_blocks_flat(&self, keys: Vec<String>, keys_per_block: usize) -> Answer {
        let pending = self.submit(keys, keys_per_block);
        self.flush();
        pending.wait().await
    }

    /// Drops the presence cache (a reset, or an outcome that makes its answers
    /// doubtful).
    pub fn clear_presence(&self) {
        lock(&self.shared.state).cache.clear();
    }

    /// The read lease in use ([`lease`](Self::lease)) now and at every change: when
    /// the master reports its own, and back to the configured one on a leader change.
    #[must_use]
    pub fn subscribe_lease(&self) -> tokio::sync::watch::Receiver<LeaseTtl> {
        lock(&self.shared.state).lease.subscribe()
    }

    /// Batches asking the master now (at most
    /// [`max_batches_in_flight`](BatchConfig::max_batches_in_flight) unless some
    /// lookup waited [`max_wait`](BatchConfig::max_wait)). A batch task that ended its
    /// batch counts until it found nothing more queued.
    #[must_use]
    pub fn batches_in_flight(&self) -> usize {
        lock(&self.shared.state).drivers
    }

    /// Keys in the presence cache now.
    #[must_use]
    pub fn cached_keys(&self) -> usize {
        lock(&self.shared.state).cache.len()
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> BatchStats {
        let state = lock(&self.shared.state);
        self.shared.counters.snapshot_onto(BatchStats {
            cache_drops: state.cache.drops(),
            lease_reads: state.lease.reads(),
            ..BatchStats::default()
        })
    }
}

/// A submitted lookup's answer, to await with [`wait`](Self::wait). Dropped before its
/// batch starts, the lookup is not asked.
#[must_use = "a lookup is answered only through its Pending"]
pub struct Pending {
    shared: Arc<Shared>,
    inner: PendingInner,
}

enum PendingInner {
    Queued(oneshot::Receiver<Answer>, Instant),
    Alone(Vec<String>, usize),
}

impl Pending {
    /// The lookup's leading run in blocks.
    ///
    /// # Errors
    /// As [`MasterClient::leading_blocks_flat`]; [`MasterError::Unavailable`] when the
    /// runtime running its batch stopped before answering.
    pub async fn wait(self) -> Answer {
        let Self { shared, inner } = self;
        match inner {
            PendingInner::Alone(keys, keys_per_block) => {
                let (tx, rx) = oneshot::channel();
                let one = Waiting {
                    keys,
                    keys_per_block,
                    since: Instant::now(),
                    answer: tx,
                };
                run_batch(&shared, vec![one]).await;
                rx.await.unwrap_or_else(|_| Err(stopped(&shared)))
            }
            PendingInner::Queued(mut rx, since) => {
                // A `max_wait` past the clock's range never makes a lookup overdue.
                let overdue = async {
                    match since.checked_add(shared.config.max_wait) {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    answer = &mut rx => return answer.unwrap_or_else(|_| Err(stopped(&shared))),
                    () = overdue => start_driver(&shared, true),
                }
                rx.await.unwrap_or_else(|_| Err(stopped(&shared)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(connection: u64, wipes: u64) -> Option<Epoch> {
        Some(Epoch {
            connection,
            leader_changes: 0,
            wipes,
        })
    }

    /// A round that read its epoch before another round moved on neither wipes the
    /// cache nor takes the lease back to the older epoch.
    #[test]
    fn the_cache_and_lease_epochs_never_move_backwards() {
        let at = std::time::Instant::now();
        let mut state = State {
            queue: VecDeque::new(),
            drivers: 0,
            cache: PresenceCache::new(8),
            cache_epoch: epoch(1, 0),
            lease: Lease::new(Duration::from_secs(10), true, (1, 0)),
        };
        assert!(state.enter(epoch(2, 0)));
        state.cache.insert("k", at + Duration::from_secs(5), at);
        assert!(state.lease.start_read((2, 0)));
        state
            .lease
            .finish_read((2, 0), Ok(Duration::from_secs(4)), "m");
        assert!(!state.enter(epoch(1, 0)), "an older epoch");
        assert!(!state.enter(None), "no connection");
        assert!(state.enter(epoch(2, 0)));
        assert_eq!(state.cache_epoch, epoch(2, 0));
        assert_eq!(state.cache.len(), 1, "the newer epoch's entries stay");
        assert_eq!(state.lease.current().ttl, Duration::from_secs(4));
        assert!(state.lease.settled((2, 0)));
        // The lease alone: an older connection's epoch moves nothing back either.
        state.lease.enter((1, 0));
        assert!(state.lease.settled((2, 0)));
        // Forward: this client's RemoveAll ends the entries, not the lease.
        assert!(state.enter(epoch(2, 1)));
        assert!(state.cache.is_empty());
        assert!(state.lease.settled((2, 0)));
    }
}
