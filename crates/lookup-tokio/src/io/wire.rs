//! What the I/O task drives: the [`Wire`] a transport implements (ZeroMQ in
//! [`super::zmq`], the Mooncake master in [`super::direct`]), what it yields
//! ([`WireInput`]) and how a write fails ([`SendError`]), and the transport counters
//! the task publishes for the handle ([`TransportStats`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lookup_core::{Outgoing, Reply, RpcFailure, RpcId};
use tracing::Span;

use super::peer::EndpointUnreachable;
use crate::warn::WarnLimiter;
#[cfg(doc)]
use lookup_core::Dispatcher;

/// Transport counters the I/O task publishes and the handle reads (all counts).
#[derive(Debug, Default)]
pub(crate) struct TransportStats {
    /// The dispatcher's `rpcs_sent`, as of the task's last turn.
    pub(crate) rpcs_sent: AtomicU64,
    /// The dispatcher's `late_replies`, as of the task's last turn (rule 17).
    pub(crate) late_replies: AtomicU64,
    /// Messages without a valid `[8-byte rpc id, ""]` envelope: dropped.
    pub(crate) bad_envelopes: AtomicU64,
    /// Connections dropped and opened again (after timeouts, on reset, on errors).
    pub(crate) reopens: AtomicU64,
    /// Writes that failed or did not complete within the timeout; with the direct
    /// transport, master queries that failed.
    pub(crate) send_errors: AtomicU64,
    /// Receive errors on the connection.
    pub(crate) recv_errors: AtomicU64,
    /// Attempts to open a connection that failed.
    pub(crate) open_errors: AtomicU64,
    /// Times the server was found down: nothing listening (a missing ipc socket
    /// file, a refused tcp port), its connection closed, or stopped (no greeting).
    /// One per outage.
    pub(crate) unreachable: AtomicU64,
    /// Lookups that waited `max_pending_age` in the queue and ended unsent.
    pub(crate) expired: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What a [`Wire`] yields.
#[derive(Debug)]
pub(crate) enum WireInput<P> {
    /// A reply for `rpc_id`, to decode with [`Wire::decode`].
    Reply { rpc_id: RpcId, payload: P },
    /// `rpc_id` failed on the transport's side (the direct transport's query).
    Failed { rpc_id: RpcId, failure: RpcFailure },
    /// The connection failed: drop it, and open a new one after the backoff.
    Broken(String),
    /// A connection attempt started by [`Wire::open`] succeeded.
    Connected,
    /// A connection attempt started by [`Wire::open`] failed: retry after the backoff.
    ConnectFailed(String),
    /// A message without a valid envelope: dropped.
    BadEnvelope,
    /// The server is gone (it closed the connection, nothing listens, it is stopped):
    /// the RPCs on the wire fail now, and new ones fail fast until
    /// [`WireInput::Reachable`]. Reported once per outage.
    Unreachable(EndpointUnreachable),
    /// The server is there and alive again.
    Reachable,
}

/// Why a released RPC could not be written.
#[derive(Debug)]
pub(crate) enum SendError {
    /// There is no connection now (a reopen waits for its backoff): fail fast.
    NotConnected,
    /// The write failed: the connection is reopened after the backoff.
    Failed(String),
    /// The RPC cannot be expressed on this transport (a reset in `msgpack-hex`).
    NotSent(String),
}

/// What a transport's reply carries until [`Wire::decode`]: a [`Reply`] already (the
/// direct and fake transports decode as they read), or the frames only the wire can
/// decode (ZeroMQ).
pub(crate) trait Payload: Send {
    /// The reply this payload already is, for the default [`Wire::decode`]; `None` for
    /// frames, which their wire decodes itself.
    fn decoded(self) -> Option<Reply>;
}

impl Payload for Reply {
    fn decoded(self) -> Option<Reply> {
        Some(self)
    }
}

/// A transport as the I/O task drives it. Implementations keep only what their
/// connection needs; every RPC's state is the task's [`Dispatcher`].
pub(crate) trait Wire: Send + 'static {
    /// What a reply carries until [`decode`](Self::decode).
    type Payload: Payload;

    /// Where it leads, for logs (an endpoint URL, a master address).
    fn name(&self) -> &str;

    /// True while a connection attempt is under way that RPCs should wait for rather
    /// than fail fast (the direct transport's first connect).
    fn connecting(&self) -> bool;

    /// Whether a reset goes on a fresh connection (ZeroMQ: a serial server must not
    /// answer the discarded lookups first; rule 13).
    fn reopens_for_reset(&self) -> bool;

    /// Writes one released RPC.
    fn send(
        &mut self,
        out: Outgoing,
        span: &Span,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Called after every pass that wrote RPCs: a transport that batches what one pass
    /// released (the direct transport) sends it now. No wait is added: what was
    /// released together goes together.
    fn flush(&mut self) {}

    /// Called when lookups timed out on this wire (`lookup_timeout_s`): a transport
    /// keeping answers (the direct transport's presence cache) drops them.
    fn lookups_timed_out(&mut self) {}

    /// The next input. Cancel-safe: dropped before completion, it loses nothing.
    fn next(&mut self) -> impl Future<Output = WireInput<Self::Payload>> + Send;

    /// Decodes a reply (`Reply::Malformed` when its bytes break the wire format). By
    /// default the payload is the reply ([`Payload::decoded`]); a wire whose payload is
    /// frames decodes them here.
    fn decode(
        &mut self,
        payload: Self::Payload,
        _is_reset: bool,
        _span: &Span,
        _warn: &mut WarnLimiter,
        _now: Instant,
    ) -> Reply {
        payload.decoded().unwrap_or(Reply::Malformed)
    }

    /// Drops the connection (replies on it can no longer arrive).
    fn close(&mut self);

    /// Opens a connection, or starts an attempt that reports through
    /// [`next`](Self::next). `Err` when it cannot be opened now.
    fn open(&mut self) -> Result<(), String>;
}
