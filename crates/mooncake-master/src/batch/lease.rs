//! The read lease a [`Coalescer`](super::Coalescer) goes by, and who checks against it
//! (`spec/mooncake-master-rpc.md`, "Where the lease can be read"). Owns the configured
//! lease, the lease the master reported (per leader), the one read of it in flight, and
//! the result TTLs that must stay below it, with their warnings.
//!
//! The master reports its lease only in a `GetReplicaList` reply for a key that
//! exists, so the lease is read once per connection epoch (a reconnect, a leader
//! change, a master restarted behind the same address: [`Epoch::master`]) with the
//! first key a batch found present; a new epoch forgets the old one's lease, so a
//! restarted master with a shorter lease is never taken for the old one. Until then, and when the master cannot report it (an older or newer reply
//! layout, a replica kind not decoded, a refused call), the configured lease applies,
//! and a failure to read it is a warning.

use std::time::Duration;

use tokio::sync::watch;

use crate::MasterError;
#[cfg(doc)]
use crate::client::Epoch;

/// The master a lease belongs to: [`Epoch::master`] (connection, leader changes).
pub(crate) type LeaseEpoch = (u64, u64);

/// Reads that fail with the master reachable, or three in a row unreachable, end the
/// attempts for the current leader.
const MAX_READ_FAILURES: u32 = 3;

/// Where the lease in use comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseSource {
    /// The setting (`DirectConfig::lease_ttl`, the index's default): nothing read yet,
    /// reading is off, or the master could not report it.
    Configured,
    /// The master's own `lease_ttl_ms`, read from the current leader.
    Master,
}

/// The read lease in use (`default_kv_lease_ttl`) and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTtl {
    /// The lease.
    pub ttl: Duration,
    /// Its source.
    pub source: LeaseSource,
}

impl std::fmt::Display for LeaseTtl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.source {
            LeaseSource::Configured => "configured",
            LeaseSource::Master => "reported by the master",
        };
        write!(f, "{} s, {source}", self.ttl.as_secs_f64())
    }
}

/// A result TTL that must stay below the lease, and the setting that sets it.
#[derive(Clone, Copy, Debug)]
struct Check {
    ttl: Duration,
    setting: &'static str,
}

#[derive(Debug)]
pub(crate) struct Lease {
    configured: Duration,
    reported: Option<Duration>,
    /// The connection epoch the figures below belong to.
    epoch: LeaseEpoch,
    reading: bool,
    failures: u32,
    gave_up: bool,
    enabled: bool,
    checks: Vec<Check>,
    reads: u64,
    /// The lease in use, for those who export it.
    watch: watch::Sender<LeaseTtl>,
}

impl Lease {
    pub(crate) fn new(configured: Duration, enabled: bool, epoch: LeaseEpoch) -> Self {
        let (watch, _) = watch::channel(LeaseTtl {
            ttl: configured,
            source: LeaseSource::Configured,
        });
        Self {
            watch,
            configured,
            reported: None,
            epoch,
            reading: false,
            failures: 0,
            gave_up: false,
            enabled,
            checks: Vec::new(),
            reads: 0,
        }
    }

    pub(crate) fn current(&self) -> LeaseTtl {
        match self.reported {
            Some(ttl) => LeaseTtl {
                ttl,
                source: LeaseSource::Master,
            },
            None => LeaseTtl {
                ttl: self.configured,
                source: LeaseSource::Configured,
            },
        }
    }

    pub(crate) const fn reads(&self) -> u64 {
        self.reads
    }

    /// The lease in use now and at every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<LeaseTtl> {
        self.watch.subscribe()
    }

    fn publish(&self) {
        self.watch.send_replace(self.current());
    }

    /// Adds a result TTL to hold below the lease, warning at once when it is not.
    pub(crate) fn check_ttl(&mut self, ttl: Duration, setting: &'static str, addr: &str) {
        let check = Check { ttl, setting };
        warn_if_outlived(check, self.current(), addr);
        self.checks.push(check);
    }

    /// Moves forward to `epoch`: a new connection forgets the old one's lease and
    /// failures; an epoch older than the current one (read before it) is ignored.
    pub(crate) fn enter(&mut self, epoch: LeaseEpoch) {
        if epoch > self.epoch {
            self.epoch = epoch;
            let had = self.reported.take().is_some();
            self.failures = 0;
            self.gave_up = false;
            if had {
                self.publish();
            }
        }
    }

    /// Whether the lease of `epoch` is known: read from the master, or the configured
    /// one because reading is off or gave up. Until then nothing is cached.
    pub(crate) fn settled(&self, epoch: LeaseEpoch) -> bool {
        epoch == self.epoch && (!self.enabled || self.reported.is_some() || self.gave_up)
    }

    /// Whether a read should start now against the master of `epoch` (marked as
    /// started). A new connection forgets the old one's lease and failures.
    pub(crate) fn start_read(&mut self, epoch: LeaseEpoch) -> bool {
        self.enter(epoch);
        if epoch != self.epoch
            || !self.enabled
            || self.reading
            || self.reported.is_some()
            || self.gave_up
        {
            return false;
        }
        self.reading = true;
        true
    }

    /// Records the read started for `epoch` (ignored when the leader changed since).
    pub(crate) fn finish_read(
        &mut self,
        epoch: LeaseEpoch,
        result: Result<Duration, MasterError>,
        addr: &str,
    ) {
        self.reading = false;
        if epoch != self.epoch {
            return;
        }
        match result {
            Ok(ttl) => {
                self.reads += 1;
                let before = self.current();
                self.reported = Some(ttl);
                self.publish();
                let now = self.current();
                tracing::info!(
                    master = addr,
                    lease_ttl_s = ttl.as_secs_f64(),
                    configured_lease_ttl_s = self.configured.as_secs_f64(),
                    "the Mooncake master reports a read lease of {} s",
                    ttl.as_secs_f64()
                );
                // Once per cause: a TTL already warned about against the configured
                // lease is not warned about again for the reported one.
                for &check in self.checks.iter().filter(|c| c.ttl < before.ttl) {
                    warn_if_outlived(check, now, addr);
                }
            }
            Err(error) => {
                self.failures += 1;
                if !error.is_unavailable() || self.failures >= MAX_READ_FAILURES {
                    self.gave_up = true;
                    tracing::warn!(
                        master = addr,
                        error = %error,
                        lease_ttl_s = self.configured.as_secs_f64(),
                        "cannot read the Mooncake master's read lease ({error}); going by \
                         the configured lease of {} s",
                        self.configured.as_secs_f64()
                    );
                }
            }
        }
    }
}

fn warn_if_outlived(check: Check, lease: LeaseTtl, addr: &str) {
    if check.ttl >= lease.ttl {
        tracing::warn!(
            master = addr,
            ttl_s = check.ttl.as_secs_f64(),
            lease_ttl_s = lease.ttl.as_secs_f64(),
            "{} of {} s is not below the Mooncake master's read lease ({lease}): a cached \
             result may name blocks evicted since; set it below the lease",
            check.setting,
            check.ttl.as_secs_f64()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unavailable() -> MasterError {
        MasterError::Unavailable {
            addr: "m".to_owned(),
            last_error: "refused".to_owned(),
        }
    }

    #[test]
    fn the_reported_lease_replaces_the_configured_one_until_the_leader_changes() {
        let mut lease = Lease::new(Duration::from_secs(10), true, (1, 0));
        assert_eq!(lease.current().source, LeaseSource::Configured);
        let mut published = lease.subscribe();
        assert!(!lease.settled((1, 0)));
        assert!(lease.start_read((1, 0)));
        assert!(!lease.start_read((1, 0)), "one read at a time");
        lease.finish_read((1, 0), Ok(Duration::from_secs(5)), "m");
        assert!(lease.settled((1, 0)));
        assert!(!lease.settled((2, 0)));
        assert!(published.has_changed().unwrap());
        assert_eq!(published.borrow_and_update().ttl, Duration::from_secs(5));
        assert_eq!(
            lease.current(),
            LeaseTtl {
                ttl: Duration::from_secs(5),
                source: LeaseSource::Master
            }
        );
        assert!(!lease.start_read((1, 0)), "read once per connection");
        assert!(lease.start_read((2, 0)), "a new connection is asked again");
        assert_eq!(lease.current().source, LeaseSource::Configured);
        // A read started for the old connection lands after the change: ignored.
        lease.finish_read((1, 0), Ok(Duration::from_secs(1)), "m");
        assert_eq!(lease.current().ttl, Duration::from_secs(10));
        assert_eq!(lease.reads(), 1);
    }

    #[test]
    fn failures_end_the_attempts_and_a_longer_lease_is_taken_too() {
        let mut lease = Lease::new(Duration::from_secs(10), true, (1, 0));
        for _ in 0..MAX_READ_FAILURES {
            assert!(!lease.settled((1, 0)));
            assert!(lease.start_read((1, 0)));
            lease.finish_read((1, 0), Err(unavailable()), "m");
        }
        assert!(
            lease.settled((1, 0)),
            "gave up: the configured lease applies"
        );
        assert!(!lease.start_read((1, 0)));
        let mut refused = Lease::new(Duration::from_secs(10), true, (1, 0));
        assert!(refused.start_read((1, 0)));
        let not_registered = MasterError::FunctionNotRegistered {
            function: crate::codec::FunctionId::GET_REPLICA_LIST,
            message: "the rpc function not registered".to_owned(),
        };
        refused.finish_read((1, 0), Err(not_registered), "m");
        assert!(!refused.start_read((1, 0)), "a refusal is not retried");
        let mut longer = Lease::new(Duration::from_secs(10), true, (1, 0));
        assert!(longer.start_read((1, 0)));
        longer.finish_read((1, 0), Ok(Duration::from_secs(30)), "m");
        assert_eq!(longer.current().ttl, Duration::from_secs(30));
        let mut off = Lease::new(Duration::from_secs(10), false, (1, 0));
        assert!(off.settled((1, 0)));
        assert!(!off.start_read((1, 0)));
    }
}
