//! Rule 17 (`spec/behaviour.md`), in one place for every user of a [`MasterClient`]:
//! a connection on which calls keep timing out is replaced, not kept until the kernel
//! drops it (a wedged master, or a half-open connection that a proxy or a NAT stopped
//! forwarding while new connections pass).
//!
//! The count is the connection's own ([`Streak`], kept beside the calls waiting on
//! it) and counts calls, not their callers: one `BatchExistKey` shared by any number
//! of lookups, checks or engines is one timeout. Calls in flight together share a
//! stall: a timeout counts only for a call sent after the last counted one fired, so
//! the `k`-th count means `k` attempts one after another, each sent once the previous
//! one had already been given up on. A reply in time starts the count again. The
//! `k`-th ([`MasterConfig::reopen_after_timeouts`](super::MasterConfig::reopen_after_timeouts))
//! replaces that connection, once: its waiting calls fail as
//! [`MasterError::ConnectionLost`](crate::MasterError::ConnectionLost), and the client
//! connects again in the background. The call timeout that fired is the master
//! client's own ([`MasterConfig::call_timeout`](super::MasterConfig::call_timeout)),
//! whatever deadline its caller has on top of it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::conn::Conn;
use super::{Link, MasterClient, bump, conn, lock};

/// Timeouts in a row on one connection (sans-IO; kept under the connection's lock).
#[derive(Debug, Default)]
pub(crate) struct Streak {
    in_a_row: u32,
    /// Calls with a ticket below this were in flight when the last counted timeout
    /// fired: theirs are the same stall.
    counted_before: u64,
}

impl Streak {
    /// A reply in time: the timeouts are no longer in a row.
    pub(crate) fn answered(&mut self) {
        self.in_a_row = 0;
    }

    /// The call with `ticket` timed out; `next_ticket` is the connection's next. True
    /// when this is the `reopen_after`-th in a row (0: never), after which the count
    /// starts again.
    pub(crate) fn timed_out(&mut self, ticket: u64, next_ticket: u64, reopen_after: u32) -> bool {
        if reopen_after == 0 || ticket < self.counted_before {
            return false;
        }
        self.counted_before = next_ticket;
        self.in_a_row += 1;
        if self.in_a_row < reopen_after {
            return false;
        }
        self.in_a_row = 0;
        true
    }

    /// Timeouts in a row so far.
    pub(crate) const fn in_a_row(&self) -> u32 {
        self.in_a_row
    }
}

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

    /// Timeouts in a row on the live connection (rule 17; 0 while none is up).
    #[must_use]
    pub fn timeouts_in_a_row(&self) -> u32 {
        match &lock(&self.inner.state).link {
            Link::Up(conn) => lock(&conn.pending).streak.in_a_row(),
            Link::Down { .. } => 0,
        }
    }

    /// How many call timeouts in a row replace a connection now (0: never).
    #[must_use]
    pub fn reopen_after_timeouts(&self) -> u32 {
        self.inner.reopen_after.load(Ordering::Relaxed)
    }

    /// Changes [`MasterConfig::reopen_after_timeouts`](super::MasterConfig::reopen_after_timeouts)
    /// for every handle of this client (0: never replace a connection on timeouts).
    pub fn set_reopen_after_timeouts(&self, n: u32) {
        self.inner.reopen_after.store(n, Ordering::Relaxed);
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
        conn::fail(&Arc::downgrade(&self.inner), &conn, reason.to_owned());
        true
    }

    /// The call with `ticket` on `conn` timed out (rule 17, see the module docs).
    pub(super) fn timed_out(&self, conn: &Arc<Conn>, ticket: u64) {
        let reopen_after = self.reopen_after_timeouts();
        let replace = {
            let mut pending = lock(&conn.pending);
            let next = pending.tickets;
            pending.streak.timed_out(ticket, next, reopen_after)
        };
        if replace && self.replace_connection(conn.id, "calls timed out in a row (rule 17)") {
            bump(&self.inner.counters.timeout_reopens, 1);
            tracing::warn!(
                addr = %conn.addr,
                conn = conn.id,
                timeouts = reopen_after,
                call_timeout_s = self.inner.config.call_timeout.as_secs_f64(),
                "Mooncake master: {reopen_after} calls in a row timed out on this connection; \
                 it is replaced (rule 17)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Streak;

    #[test]
    fn calls_in_flight_together_share_one_timeout() {
        let mut streak = Streak::default();
        // Calls 0..5 in flight; each times out: only the first counts.
        assert!(!streak.timed_out(0, 5, 3));
        for ticket in 1..5 {
            assert!(!streak.timed_out(ticket, 5, 3));
        }
        assert_eq!(streak.in_a_row(), 1);
        // Call 5 was sent after that timeout fired: the second; 6 the third.
        assert!(!streak.timed_out(5, 6, 3));
        assert_eq!(streak.in_a_row(), 2);
        assert!(streak.timed_out(6, 7, 3), "the third in a row replaces");
        assert_eq!(streak.in_a_row(), 0);
        // An answer starts again.
        assert!(!streak.timed_out(7, 8, 2));
        streak.answered();
        assert!(!streak.timed_out(8, 9, 2));
        assert!(streak.timed_out(9, 10, 2));
        // 0: never; 1: the first.
        assert!(!Streak::default().timed_out(0, 1, 0));
        assert!(Streak::default().timed_out(0, 1, 1));
    }
}
