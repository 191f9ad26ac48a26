//! [`ActorMetrics`]: the metric handles of a client's I/O task (ZeroMQ or direct):
//! the wire gauge, socket reopens and late replies.

use metrics::{Counter, Gauge};

/// Why the I/O task dropped and reopened its socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReopenReason {
    /// `reopen_after_timeouts` lookups timed out in a row (rule 17).
    Timeouts,
    /// A reset is sent on a fresh socket (rule 13).
    Reset,
    /// The socket failed to send or receive.
    Error,
}

/// The metric handles of one client's I/O task.
pub(crate) struct ActorMetrics {
    in_flight: Gauge,
    /// This task's share of `in_flight`.
    on_wire: u32,
    reopens: [Counter; 3],
    late_replies: Counter,
}

impl ActorMetrics {
    /// Handles from the recorder installed now (no-ops without one), every series
    /// labelled `client = label`.
    pub(crate) fn new(label: &str) -> Self {
        use metrics::{counter, gauge};
        let c = label.to_owned();
        Self {
            in_flight: gauge!("lookup_in_flight", "client" => c.clone()),
            on_wire: 0,
            reopens: [
                counter!("lookup_socket_reopens_total", "client" => c.clone(), "reason" => "timeouts"),
                counter!("lookup_socket_reopens_total", "client" => c.clone(), "reason" => "reset"),
                counter!("lookup_socket_reopens_total", "client" => c.clone(), "reason" => "error"),
            ],
            late_replies: counter!("lookup_late_replies_total", "client" => c),
        }
    }

    /// A lookup RPC went on the wire.
    pub(crate) fn lookup_on_wire(&mut self) {
        self.on_wire += 1;
        self.in_flight.increment(1.0);
    }

    /// A lookup RPC left the wire (reply, timeout, socket dropped).
    pub(crate) fn lookup_off_wire(&mut self) {
        if self.on_wire > 0 {
            self.on_wire -= 1;
            self.in_flight.decrement(1.0);
        }
    }

    /// The socket was dropped and will be opened again.
    pub(crate) fn reopened(&self, reason: ReopenReason) {
        self.reopens[reason as usize].increment(1);
    }

    /// A reply came for an RPC no longer on the wire.
    pub(crate) fn late_reply(&self) {
        self.late_replies.increment(1);
    }
}

impl Drop for ActorMetrics {
    fn drop(&mut self) {
        if self.on_wire > 0 {
            self.in_flight.decrement(f64::from(self.on_wire));
        }
    }
}
