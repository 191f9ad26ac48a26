//! Following the leader of a high-availability cluster (`spec/mooncake-master-rpc.md`,
//! "High availability"): one background task per client re-reads the leader's view
//! from etcd and moves the connection to a newer leader.
//!
//! When the task reads:
//! - at once (at most one read per [`VIEW_MIN_GAP`]) after a call's connection broke,
//!   a call timed out or a connect failed;
//! - every [`MasterConfig::view_retry`](super::MasterConfig::view_retry) (1 s) while
//!   calls fail or no connection is up;
//! - every [`MasterConfig::view_refresh`](super::MasterConfig::view_refresh) (10 s)
//!   otherwise.
//!
//! What a view does ([`apply_view`]): a higher version becomes the target, counts as
//! a leader change, and replaces a connection to another address by a reconnect that
//! backs off through the new leader's warm-up (it refuses connections for ~5 s after
//! winning). A lower version is ignored while the leader in use is connected (a stale
//! read: never back to an older leader), and followed once it is unreachable (etcd
//! replaced or restored, its elections counting again from there). An absent key means no leader: a live connection to the deposed one is dropped, and
//! calls fail fast as unavailable without connect attempts until a view appears. A
//! failed etcd read changes nothing: the last known leader stays the target.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::{Link, State, fail, spawn_reconnect};
use super::stats::bump;
use super::{Inner, MasterConfig, lock};
use crate::addr::{EtcdCluster, MasterView};
use crate::etcd::Gateway;

/// Shortest time between two reads of the view: bounds the load on etcd while every
/// call fails.
pub(super) const VIEW_MIN_GAP: Duration = Duration::from_millis(200);

/// What the follower task shares with the client.
#[derive(Debug)]
pub(super) struct Follow {
    pub(super) gateway: Gateway,
    /// Wakes the task for a read now (an RPC error).
    nudge: Notify,
    /// A call failed since the last read.
    failing: AtomicBool,
    /// Ends the task (the last client handle was dropped).
    pub(super) shutdown: CancellationToken,
    retry: Duration,
    refresh: Duration,
}

impl Follow {
    pub(super) fn new(cluster: &EtcdCluster, config: &MasterConfig) -> Self {
        Self {
            gateway: Gateway::new(cluster, config.etcd_timeout),
            nudge: Notify::new(),
            failing: AtomicBool::new(false),
            shutdown: CancellationToken::new(),
            retry: config.view_retry,
            refresh: config.view_refresh,
        }
    }

    /// A call failed: read at the retry pace from now on, and at once when `now`.
    pub(super) fn trouble(&self, now: bool) {
        self.failing.store(true, Ordering::Relaxed);
        if now {
            self.nudge.notify_one();
        }
    }

    /// Why calls fail while no leader is elected.
    pub(super) fn no_leader(&self) -> String {
        format!("no leader elected ({} absent in etcd)", self.gateway.key())
    }
}

/// The follower task: runs until `follow.shutdown` or the client is gone.
pub(super) async fn follow(weak: Weak<Inner>, follow: Arc<Follow>) {
    // The client read the first view just before starting this task.
    let mut last_read = Instant::now();
    loop {
        let wait = {
            let Some(inner) = weak.upgrade() else { return };
            let down = !matches!(lock(&inner.state).link, Link::Up(_));
            if down || follow.failing.load(Ordering::Relaxed) {
                follow.retry
            } else {
                follow.refresh
            }
        };
        tokio::select! {
            () = follow.shutdown.cancelled() => return,
            () = follow.nudge.notified() => {}
            () = tokio::time::sleep_until(last_read + wait) => {}
        }
        tokio::select! {
            () = follow.shutdown.cancelled() => return,
            () = tokio::time::sleep_until(last_read + VIEW_MIN_GAP) => {}
        }
        follow.failing.store(false, Ordering::Relaxed);
        last_read = Instant::now();
        let result = tokio::select! {
            () = follow.shutdown.cancelled() => return,
            result = follow.gateway.read_view() => result,
        };
        let Some(inner) = weak.upgrade() else { return };
        match result {
            Ok(view) => {
                bump(&inner.counters.view_reads, 1);
                apply_view(&inner, &follow, view);
            }
            Err(reason) => {
                bump(&inner.counters.view_read_failures, 1);
                follow.failing.store(true, Ordering::Relaxed);
                tracing::warn!(addr = %inner.addr_text, %reason, "cannot read the Mooncake leader from etcd; keeping the last known one");
            }
        }
    }
}

/// Applies a view read from etcd (`None`: the key is absent).
pub(super) fn apply_view(inner: &Arc<Inner>, follow: &Follow, view: Option<MasterView>) {
    let mut state = lock(&inner.state);
    let State {
        link,
        target,
        version,
    } = &mut *state;
    let Some(view) = view else {
        // The leader's key is gone: its lease ended, so it is no longer the leader
        // (or etcd lost the key). Stop trusting it: drop a live connection (its calls
        // fail as a lost connection, the presence cache's epoch ends) and connect to
        // nobody until a view appears.
        let (old, connecting) = match link {
            Link::Up(conn) => (Some(conn.clone()), false),
            Link::Down { connecting, .. } => (None, *connecting),
        };
        if target.take().is_some() {
            tracing::info!(addr = %inner.addr_text, "no Mooncake leader elected");
        }
        *link = Link::Down {
            retry_at: Instant::now(),
            backoff: inner.config.backoff_min,
            connecting,
            last_error: follow.no_leader(),
        };
        drop(state);
        if let Some(conn) = old {
            fail(&Arc::downgrade(inner), &conn, follow.no_leader());
        }
        return;
    };
    let connected = matches!(link, Link::Up(_));
    if view.version == *version {
        // The same election: restore the target if an absent read cleared it.
        if target.is_none() {
            *target = Some(view.leader);
            if let Link::Down {
                retry_at,
                connecting,
                ..
            } = link
            {
                if !*connecting {
                    *retry_at = Instant::now();
                    *connecting = true;
                    spawn_reconnect(inner.clone());
                }
            }
        }
        return;
    }
    if view.version < *version {
        // An older election than the one in use. While the leader in use is
        // connected this is a stale read (a lagging etcd member): ignored, never back
        // to an older leader. When the leader in use is unreachable, the view etcd
        // holds now is the one to follow, whatever its version (etcd was replaced or
        // restored from a backup, and its elections count again from there).
        if connected {
            bump(&inner.counters.stale_views, 1);
            return;
        }
        if target.as_ref() == Some(&view.leader) {
            *version = view.version;
            return;
        }
    }
    tracing::info!(
        addr = %inner.addr_text,
        leader = %view.leader,
        version = view.version,
        previous = *version,
        "the Mooncake leader changed"
    );
    *version = view.version;
    *target = Some(view.leader.clone());
    bump(&inner.counters.leader_changes, 1);
    let reason = format!(
        "the leader moved to {} (view {})",
        view.leader, view.version
    );
    inner.views.send_modify(|state| {
        state.view = Some(view);
        state.changes += 1;
    });
    let old = match link {
        Link::Up(conn) if Some(&conn.addr) == target.as_ref() => None,
        Link::Up(conn) => {
            let conn = conn.clone();
            *link = Link::Down {
                retry_at: Instant::now(),
                backoff: inner.config.backoff_min,
                connecting: true,
                last_error: reason.clone(),
            };
            spawn_reconnect(inner.clone());
            Some(conn)
        }
        Link::Down {
            retry_at,
            backoff,
            connecting,
            last_error,
        } => {
            *retry_at = Instant::now();
            *backoff = inner.config.backoff_min;
            last_error.clone_from(&reason);
            if !*connecting {
                *connecting = true;
                spawn_reconnect(inner.clone());
            }
            None
        }
    };
    drop(state);
    if let Some(conn) = old {
        // Its waiting calls fail as a lost connection; the link is already replaced.
        fail(&Arc::downgrade(inner), &conn, reason);
    }
}
