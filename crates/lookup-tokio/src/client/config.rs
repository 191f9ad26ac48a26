//! The client's configuration and counters.

use std::time::Duration;

use lookup_core::wire::Format;
use lookup_core::{Config, Stats};
use mooncake_master::MasterStats;

#[cfg(doc)]
use crate::LookupClient;
use crate::{DirectConfig, Endpoint, Transport};

/// Configuration of a [`LookupClient`].
///
/// Build with [`ClientConfig::new`] (a lookup server over ZeroMQ) or
/// [`ClientConfig::direct`] (the Mooncake master itself) and adjust fields. `core`
/// carries vLLM's keys (`spec/behaviour.md`, "Configuration"); its `max_in_flight` is
/// the number of lookup RPCs the client keeps on the wire at once (1, the default, is
/// vLLM's REQ socket; with the direct transport, queries pipelined on the master
/// connection).
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// The lookup lifecycle's configuration (validated by [`LookupClient::connect`]).
    pub core: Config,
    /// How lookups reach the store: [`Transport::Zmq`] (the default) or
    /// [`Transport::Direct`].
    pub transport: Transport,
    /// Where the lookup server listens (`spec/wire.md`, "Transport"). Used by
    /// [`Transport::Zmq`] only; [`ClientConfig::direct`] sets it to the master's
    /// address, which logs then show.
    pub endpoint: Endpoint,
    /// Wire format of requests and replies; default `tagged-blob` (vLLM 0.33).
    /// `msgpack-hex` has no reset message: a reset then ends as
    /// [`ResetOutcome::TimedOut`](lookup_core::ResetOutcome::TimedOut) without being sent. [`Transport::Zmq`] only.
    pub format: Format,
    /// Drop and reopen the socket after this many lookup timeouts in a row, so a
    /// serial server stuck on one request is not fed the backlog behind it (rule 17).
    /// 0 never reopens on timeouts. Default 3. [`Transport::Zmq`] only: the master
    /// answers pipelined calls concurrently, and its client reconnects by itself
    /// when the connection breaks.
    pub reopen_after_timeouts: u32,
    /// First wait before trying again when opening a socket (with the direct
    /// transport: connecting to the master) fails; it doubles per failure up to 1 s.
    /// Default 10 ms.
    pub reopen_backoff: Duration,
    /// Most events kept for [`LookupClient::poll_event`]; beyond it the oldest are
    /// dropped and counted in [`ClientStats::events_dropped`]. Default 1,024.
    pub event_capacity: usize,
    /// Slack added to `lookup_timeout_s` when a sync-mode probe waits
    /// ([`LookupClient::probe_wait`]), so the I/O task's own timeout report arrives
    /// first. Default 100 ms.
    pub wait_margin: Duration,
}

impl ClientConfig {
    /// Defaults (`spec/behaviour.md`) for `endpoint` with a block size of
    /// `block_size` tokens.
    #[must_use]
    pub fn new(endpoint: Endpoint, block_size: u32) -> Self {
        Self {
            core: Config::new(block_size),
            transport: Transport::Zmq,
            endpoint,
            format: Format::TaggedBlob,
            reopen_after_timeouts: 3,
            reopen_backoff: Duration::from_millis(10),
            event_capacity: 1024,
            wait_margin: Duration::from_millis(100),
        }
    }

    /// Defaults (`spec/behaviour.md`) with a block size of `block_size` tokens, asking
    /// the Mooncake master of `direct` from this process ([`Transport::Direct`]; see
    /// its docs for the lease side effect and resets). The default
    /// `lookup_prefetch_ttl_s` (2 s) is below the master's default lease (10 s).
    #[must_use]
    pub fn direct(direct: DirectConfig, block_size: u32) -> Self {
        let endpoint = Endpoint::Tcp(direct.master.clone());
        Self {
            transport: Transport::Direct(Box::new(direct)),
            ..Self::new(endpoint, block_size)
        }
    }
}

/// Counters of a [`LookupClient`]: the core's, plus the transport's. All counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// The lifecycle counters of [`Lookups`](lookup_core::Lookups).
    pub core: Stats,
    /// Prefetch slots in use now (rule 3).
    pub slots_in_use: u32,
    /// RPCs queued or in flight now.
    pub open_rpcs: usize,
    /// RPCs written to the wire (lookups and resets), counted by the I/O task's
    /// dispatcher.
    pub rpcs_sent: u64,
    /// Replies dropped because their RPC had already ended (timed out, or the socket
    /// was reopened) or was never sent by this client (rule 17), counted by the I/O
    /// task's dispatcher.
    pub late_replies: u64,
    /// Messages dropped because they lacked the `[rpc id, ""]` envelope.
    pub bad_envelopes: u64,
    /// Sockets dropped and opened again (after timeouts, on reset, on errors).
    pub socket_reopens: u64,
    /// Sends that failed.
    pub send_errors: u64,
    /// Receive errors on the socket.
    pub recv_errors: u64,
    /// Failed attempts to open a socket.
    pub open_errors: u64,
    /// Times the endpoint was found with nothing listening: a missing ipc socket
    /// file or a refused tcp port ([`Transport::Zmq`]). Lookups then fail fast as
    /// unavailable (warned about, naming the endpoint) until something listens.
    pub endpoint_unreachable: u64,
    /// Events dropped because nobody polled them ([`ClientConfig::event_capacity`]);
    /// the core's [`Stats::events_dropped`].
    pub events_dropped: u64,
    /// Requests the client tracks now (a lookup or a first-probe mark): it falls
    /// back to 0 once every request has finished; one that keeps growing means
    /// requests are dropped without `on_finished` (see `LookupClient::end_idle`).
    pub tracked_requests: usize,
    /// True when `lookup_prefetch_limit > 0` but prefetch does nothing, because
    /// `enable_lookup` or `lookup_async` is false (warned about at connect).
    pub prefetch_inactive: bool,
    /// Sync-mode waits that gave up (`lookup_timeout_s` plus the margin passed with
    /// the lookup still queued) and answered 0 external tokens (rules 10-11).
    pub waits_gave_up: u64,
    /// [`Transport::Direct`] only, once connected: the master client's counters
    /// (`BatchExistKey` calls, keys asked, timeouts, reconnects, late replies). With
    /// the direct transport `send_errors` counts master queries that failed (not
    /// connected, connection lost, refused), `open_errors` failed connect attempts
    /// before the first success, and `socket_reopens`, `recv_errors` and
    /// `bad_envelopes` stay 0.
    pub master: Option<MasterStats>,
}
