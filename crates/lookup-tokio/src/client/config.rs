//! The client's configuration ([`ClientConfig`]) and counters ([`ClientStats`]).

use std::time::Duration;

use lookup_core::{Config, Stats};
use mooncake_master::MasterStats;

#[cfg(doc)]
use crate::{DirectConfig, LookupClient, ZmqConfig};
use crate::{Endpoint, Transport};

/// Configuration of a [`LookupClient`]. Build it with
/// [`LookupClient::builder`](crate::LookupClient::builder), or with
/// [`ClientConfig::new`] and adjust fields; `#[non_exhaustive]`: later settings are
/// additions.
///
/// `core` carries vLLM's keys (`spec/behaviour.md`, "Configuration"; read from
/// `kv_connector_extra_config` by
/// [`KvConnectorExtraConfig`](crate::KvConnectorExtraConfig)). Its `lookup_async` is
/// the one switch between sync and async mode: [`LookupClient::step_deadline`]
/// follows it. Its `max_in_flight` is the number
/// of lookup RPCs the client keeps on the wire at once (1, the default, is vLLM's REQ
/// socket; with the direct transport, queries pipelined on the master connection).
/// Each transport's own settings sit in its variant ([`ZmqConfig`],
/// [`DirectConfig`]).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClientConfig {
    /// The lookup lifecycle's configuration (validated by [`LookupClient::connect`]
    /// and [`LookupClient::connect_lazy`]).
    pub core: Config,
    /// How lookups reach the store, with that transport's settings:
    /// [`Transport::Zmq`] or [`Transport::Direct`].
    pub transport: Transport,
    /// Most events kept for [`LookupClient::poll_event`]; beyond it the oldest are
    /// dropped and counted in [`ClientStats::events_dropped`]. Default 1,024.
    pub event_capacity: usize,
    /// Slack added to `lookup_timeout_s` when a sync-mode probe waits
    /// ([`Deadline::Answer`](crate::Deadline::Answer)), so the I/O task's own timeout report arrives
    /// first. Default 100 ms.
    pub wait_margin: Duration,
    /// Async mode only: how long a probe at [`LookupClient::step_deadline`] waits for
    /// a pending answer before it answers `Pending` (prefetch plus a bounded wait,
    /// [`Deadline::Within`](crate::Deadline::Within)). Zero (the default) never waits: vLLM's async
    /// mode, where `Pending` means "try again next step".
    pub probe_budget: Duration,
    /// The `client` label on every metric series of this client, so that clients of
    /// one process (data-parallel engines, one per DP rank) are told apart instead of
    /// adding up ([`crate::metrics`]). `None` (the default): where lookups go,
    /// [`Transport::target`] (a vLLM worker's ipc path names its DP rank).
    pub client_label: Option<String>,
    /// How long the strict [`LookupClient::connect`] waits for the server to answer
    /// (the ZeroMQ handshake completes; with the direct transport, the master
    /// connects) before it fails with the reason. [`LookupClient::connect_lazy`]
    /// does not wait. Default 1 s.
    pub connect_timeout: Duration,
}

impl ClientConfig {
    /// The defaults of `spec/behaviour.md` with a block size of `block_size` tokens,
    /// reaching the store through `transport`.
    #[must_use]
    pub fn new(transport: impl Into<Transport>, block_size: u32) -> Self {
        Self {
            core: Config::new(block_size),
            transport: transport.into(),
            event_capacity: 1024,
            wait_margin: Duration::from_millis(100),
            probe_budget: Duration::ZERO,
            client_label: None,
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// The `client` label of this client's metric series:
    /// [`client_label`](Self::client_label), else [`Transport::target`].
    #[must_use]
    pub fn label(&self) -> String {
        self.client_label
            .clone()
            .unwrap_or_else(|| self.transport.target())
    }

    /// [`new`](Self::new) with a lookup server at `endpoint` over ZeroMQ, with
    /// [`ZmqConfig::new`]'s defaults.
    #[must_use]
    pub fn zmq(endpoint: Endpoint, block_size: u32) -> Self {
        Self::new(crate::ZmqConfig::new(endpoint), block_size)
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
    /// Outages of the server ([`Transport::Zmq`]), one per outage: it closed the
    /// connection (its process died), nothing listens (a missing ipc socket file, a
    /// stale one, a refused tcp port), or it is stopped or hung (no ZeroMQ greeting
    /// within [`LIVENESS_BOUND`](crate::LIVENESS_BOUND), checked after a lookup timed
    /// out). The lookups on the wire then fail at once, and new ones fail fast as
    /// unavailable (warned about once, naming the endpoint and the cause) until it is
    /// back.
    pub endpoint_unreachable: u64,
    /// Lookups that waited `max_pending_age` in the queue and ended unsent
    /// (`Failed(NotSent)`, answered 0 hits as unavailable).
    pub lookups_expired: u64,
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
    /// before the first success, `socket_reopens` the master connections replaced
    /// after `reopen_after_timeouts` lookup timeouts in a row (rule 17), and
    /// `recv_errors` and `bad_envelopes` stay 0.
    pub master: Option<MasterStats>,
}
