//! The client's counters: [`MasterStats`], the snapshot callers read, and the atomics
//! every clone of a client bumps.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one client since it was created (all handles share them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterStats {
    /// Requests handed to a connection (every function, retries included).
    pub requests: u64,
    /// `BatchExistKey` requests among them.
    pub batch_exist_calls: u64,
    /// Keys sent in `BatchExistKey` requests.
    pub keys_asked: u64,
    /// Replies matched to a waiting call.
    pub replies: u64,
    /// Replies that arrived after their call had given up (timed out or dropped).
    pub late_replies: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Calls that failed fast because the connection was down.
    pub failed_fast: u64,
    /// Calls that failed fast because the connection's queue held
    /// [`MasterConfig::max_queued_bytes`](crate::MasterConfig::max_queued_bytes).
    pub queue_full: u64,
    /// Connections this client dropped itself ([`MasterClient::reconnect`](crate::MasterClient::reconnect)).
    pub reconnects_asked: u64,
    /// Connections replaced after calls timed out on them in a row
    /// ([`MasterConfig::reopen_after_timeouts`](crate::MasterConfig::reopen_after_timeouts),
    /// `spec/behaviour.md` rule 17); each is also one of
    /// [`reconnects_asked`](Self::reconnects_asked).
    pub timeout_reopens: u64,
    /// Successful connects, the first included.
    pub connects: u64,
    /// Failed connect attempts.
    pub connect_failures: u64,
    /// Connections that broke.
    pub connections_lost: u64,
    /// Times a connection switched signatures after an `err_code` 4: to the
    /// pre-0.3.12 ones (no `tenant_id`, masters up to 0.3.11), or back. Later
    /// connections start where the last one settled.
    pub signature_fallbacks: u64,
    /// Times the client moved to a newer leader (a higher view version in etcd); the
    /// first leader found is not a change. Always 0 for a fixed address.
    pub leader_changes: u64,
    /// Reads of the leader's view from etcd that got an answer (the first included).
    pub view_reads: u64,
    /// Reads of the view that failed at every etcd endpoint.
    pub view_read_failures: u64,
    /// Views older than the one in use (a lower version), ignored.
    pub stale_views: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) requests: AtomicU64,
    pub(super) batch_exist_calls: AtomicU64,
    pub(super) keys_asked: AtomicU64,
    pub(super) replies: AtomicU64,
    pub(super) late_replies: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) failed_fast: AtomicU64,
    pub(super) queue_full: AtomicU64,
    pub(super) reconnects_asked: AtomicU64,
    pub(super) timeout_reopens: AtomicU64,
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) connections_lost: AtomicU64,
    pub(super) signature_fallbacks: AtomicU64,
    pub(super) leader_changes: AtomicU64,
    pub(super) view_reads: AtomicU64,
    pub(super) view_read_failures: AtomicU64,
    pub(super) stale_views: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> MasterStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MasterStats {
            requests: get(&self.requests),
            batch_exist_calls: get(&self.batch_exist_calls),
            keys_asked: get(&self.keys_asked),
            replies: get(&self.replies),
            late_replies: get(&self.late_replies),
            timeouts: get(&self.timeouts),
            failed_fast: get(&self.failed_fast),
            queue_full: get(&self.queue_full),
            reconnects_asked: get(&self.reconnects_asked),
            timeout_reopens: get(&self.timeout_reopens),
            connects: get(&self.connects),
            connect_failures: get(&self.connect_failures),
            connections_lost: get(&self.connections_lost),
            signature_fallbacks: get(&self.signature_fallbacks),
            leader_changes: get(&self.leader_changes),
            view_reads: get(&self.view_reads),
            view_read_failures: get(&self.view_read_failures),
            stale_views: get(&self.stale_views),
        }
    }
}

pub(super) fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}
