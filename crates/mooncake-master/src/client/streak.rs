//! Rule 17 for the users of a [`MasterClient`] (`spec/behaviour.md`): a connection on
//! which calls keep timing out is replaced, not kept until the kernel drops it.
//! [`TimeoutStreak`] counts the timeouts in a row of one connection and replaces it
//! once per streak, however many callers of one timed-out call end together, on one
//! thread or many. The connection a call went out on is read before the call
//! ([`MasterClient::connection_id`]); a timeout of a connection already replaced is
//! not counted against the next one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::{Link, MasterClient, bump, conn, lock};

impl MasterClient {
    /// The id of the live connection ([`Epoch::connection`](crate::Epoch::connection)),
    /// `None` while no connection is up.
    #[must_use]
    pub fn connection_id(&self) -> Option<u64> {
        match &lock(&self.inner.state).link {
            Link::Up(conn) => Some(conn.id),
            Link::Down { .. } => None,
        }
    }

    /// As [`reconnect`](Self::reconnect), only while connection `connection` is the
    /// live one: true when it was replaced, false (nothing done) when it had already
    /// gone or another connection is up.
    pub fn replace_connection(&self, connection: u64, reason: &str) -> bool {
        let conn = match &lock(&self.inner.state).link {
            Link::Up(conn) if conn.id == connection => conn.clone(),
            _ => return false,
        };
        bump(&self.inner.counters.reconnects_asked, 1);
        conn::fail(
            &std::sync::Arc::downgrade(&self.inner),
            &conn,
            reason.to_owned(),
        );
        true
    }
}

/// Timeouts in a row on one master connection, and the rule that replaces it after
/// `reopen_after` of them (`spec/behaviour.md` rule 17). Shared through `&self` by any
/// number of tasks.
#[derive(Debug)]
pub struct TimeoutStreak {
    reopen_after: u32,
    in_a_row: AtomicU32,
    /// The connection the count is of (0: none yet; ids start at 1).
    connection: AtomicU64,
}

impl TimeoutStreak {
    /// A streak that replaces the connection at its `reopen_after`-th timeout in a
    /// row (0: never).
    #[must_use]
    pub const fn new(reopen_after: u32) -> Self {
        Self {
            reopen_after,
            in_a_row: AtomicU32::new(0),
            connection: AtomicU64::new(0),
        }
    }

    /// An answer, or a failure other than a timeout: the streak starts again. Reads
    /// before it writes, so callers on many threads share the count unwritten until a
    /// timeout.
    pub fn answered(&self) {
        if self.in_a_row.load(Ordering::Relaxed) != 0 {
            self.in_a_row.store(0, Ordering::Relaxed);
        }
    }

    /// A call made on connection `on` (read with [`MasterClient::connection_id`]
    /// before the call) timed out. It counts only while `on` is still the live
    /// connection, and a connection's first timeout starts the count at 1 (timeouts of
    /// one replaced otherwise, by a broken link or a leader change, do not carry
    /// over); the `reopen_after`-th in a row replaces it
    /// ([`MasterClient::replace_connection`]) and returns the count, once per
    /// streak: callers of the same call that end after it, or race it, get `None`.
    pub fn timed_out(&self, master: &MasterClient, on: Option<u64>, reason: &str) -> Option<u32> {
        let on = on?;
        if self.reopen_after == 0 || master.connection_id() != Some(on) {
            return None;
        }
        let n = if self.connection.swap(on, Ordering::Relaxed) == on {
            self.in_a_row.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.in_a_row.store(1, Ordering::Relaxed);
            1
        };
        if n < self.reopen_after {
            return None;
        }
        self.in_a_row.store(0, Ordering::Relaxed);
        master.replace_connection(on, reason).then_some(n)
    }
}
