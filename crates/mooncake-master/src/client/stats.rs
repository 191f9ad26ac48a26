//! The client's counters: [`MasterStats`], the snapshot callers read, and the atomics
//! every clone of a client bumps.

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

crate::counters! {
    /// The live counters behind [`MasterStats`], one per field of the same name.
    pub(super) struct Counters => MasterStats {
        requests,
        batch_exist_calls,
        keys_asked,
        replies,
        late_replies,
        timeouts,
        failed_fast,
        queue_full,
        reconnects_asked,
        timeout_reopens,
        connects,
        connect_failures,
        connections_lost,
        signature_fallbacks,
        leader_changes,
        view_reads,
        view_read_failures,
        stale_views,
    }
}

pub(super) use crate::counters::bump;
