//! How a client reaches the store: [`Transport`], each variant with its own settings
//! ([`ZmqConfig`], [`DirectConfig`]).

use std::time::Duration;

use lookup_core::Endpoint;
use lookup_core::wire::Format;

use crate::DirectConfig;
#[cfg(doc)]
use crate::KeyLayout;
#[cfg(doc)]
use mooncake_master::{MasterClient, MasterConfig};

/// How a [`LookupClient`](crate::LookupClient) reaches the store (DESIGN.md,
/// "Mooncake master client": both paths sit behind the same state machine).
///
/// With [`Direct`](Self::Direct) the client computes the server's answer itself:
/// the store keys of the blocks in question with the server's [`KeyLayout`], one
/// logical `BatchExistKey` query per lookup (chunks of
/// [`MasterConfig::chunk_keys`], stopping at the chunk that ends the leading run),
/// the leading run over every rank namespace and the full-hit rule (`spec/wire.md`,
/// "What the server computes"). Two things differ from a server:
///
/// - **Lease side effect.** Every key the master answers `true` gets a read lease for
///   its `default_kv_lease_ttl` (10 s by default), exactly as through vLLM's worker.
///   Keep `lookup_prefetch_ttl_s` (2 s by default) below it, so that a cached result
///   is backed by the lease for its whole life ([`DirectConfig::lease_ttl`]).
/// - **Reset.** The master's only reset (`RemoveAll`) is tenant-wide: a reset is
///   never sent and ends as
///   [`ResetOutcome::Failed`](lookup_core::ResetOutcome::Failed); every key stays.
///
/// # Failures
///
/// Every failure answers 0 hits (rule 11), as a
/// [`LookupOutcome`](lookup_core::LookupOutcome) in its `Event::LookupDone`:
///
/// | what happened | outcome |
/// |---|---|
/// | the master answered; a key with an application `ErrorCode` ends the run at its block (vLLM counts only `1`s) | `Hit` / `Miss` |
/// | no answer within `lookup_timeout_s` of the send, or the master client's own `call_timeout` | `Failed(TimedOut)` |
/// | a reply that does not decode, or with a wrong number of answers | `Malformed` |
/// | not connected yet after a failed connect, connection down or lost, the call refused | `Failed(Transport)` |
///
/// Until the first connect succeeds, lookups wait while an attempt is under way (at
/// most the master client's `connect_timeout`, 1 s by default) and fail fast during
/// the backoff between attempts, which starts at [`DirectConfig::connect_backoff`] and
/// doubles up to 1 s. Once connected, the master client reconnects on its own after a
/// lost connection, and calls fail fast while it is down.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// A lookup server over ZeroMQ (a vLLM MooncakeStoreConnector worker, or our
    /// `lookup_server::LookupServer`), with its settings.
    Zmq(ZmqConfig),
    /// The Mooncake master itself, from the scheduler's process (see above), with
    /// its settings. Boxed: they are large and read once, at connect.
    Direct(Box<DirectConfig>),
}

impl Transport {
    /// Where lookups go, as logs and metrics name it: the ZeroMQ URL
    /// (`tcp://127.0.0.1:5555`, `ipc:///tmp/...`) or the master's address
    /// (`127.0.0.1:50051`, `etcd://...`).
    #[must_use]
    pub fn target(&self) -> String {
        match self {
            Self::Zmq(zmq) => zmq.endpoint.to_string(),
            Self::Direct(direct) => direct.master.to_string(),
        }
    }

    /// The ZeroMQ transport's settings; `None` for another transport.
    #[must_use]
    pub fn zmq_mut(&mut self) -> Option<&mut ZmqConfig> {
        match self {
            Self::Zmq(zmq) => Some(zmq),
            Self::Direct(_) => None,
        }
    }

    /// The direct transport's settings; `None` for another transport.
    #[must_use]
    pub fn direct_mut(&mut self) -> Option<&mut DirectConfig> {
        match self {
            Self::Direct(direct) => Some(direct),
            Self::Zmq(_) => None,
        }
    }
}

/// Settings of the ZeroMQ transport ([`Transport::Zmq`]). Build with
/// [`ZmqConfig::new`] and adjust fields. `#[non_exhaustive]`: later settings are
/// additions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZmqConfig {
    /// Where the lookup server listens (`spec/wire.md`, "Transport"; a vLLM worker's
    /// ipc path: [`Endpoint::vllm`]).
    pub endpoint: Endpoint,
    /// Wire format of requests and replies; default `tagged-blob` (vLLM 0.33).
    /// `msgpack-hex` has no reset message: a reset then ends as
    /// [`ResetOutcome::TimedOut`](lookup_core::ResetOutcome::TimedOut) without being
    /// sent.
    pub format: Format,
    /// Drop and reopen the socket after this many lookup timeouts in a row, so a
    /// serial server stuck on one request is not fed the backlog behind it (rule 17).
    /// 0 never reopens on timeouts. Default 3.
    pub reopen_after_timeouts: u32,
    /// First wait before trying again when opening the socket fails; it doubles per
    /// failure up to 1 s. Default 10 ms.
    pub reopen_backoff: Duration,
    /// The read lease of the store behind the server (for `lookup-server
    /// --mooncake-master`, the master's `-default_kv_lease_ttl`, which that server logs
    /// and exports as `lookup_server_mooncake_lease_seconds`). vLLM's wire carries no
    /// lease, so the client cannot learn it: when set, a `lookup_prefetch_ttl_s` at or
    /// above it is warned about at connect (a cached result could outlive the lease
    /// that keeps its blocks). Default `None`: no check.
    pub store_lease_ttl: Option<Duration>,
}

impl ZmqConfig {
    /// The server at `endpoint` with the defaults: `tagged-blob`, reopen after 3
    /// timeouts in a row, a 10 ms reopen backoff.
    #[must_use]
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            format: Format::TaggedBlob,
            reopen_after_timeouts: crate::io::direct::DEFAULT_REOPEN_AFTER_TIMEOUTS,
            reopen_backoff: Duration::from_millis(10),
            store_lease_ttl: None,
        }
    }
}

impl ZmqConfig {
    /// Warns when `ttl` (`lookup_prefetch_ttl_s`) is not below
    /// [`store_lease_ttl`](Self::store_lease_ttl), when set.
    pub(crate) fn check_lease(&self, ttl: Duration) {
        let Some(lease) = self.store_lease_ttl else {
            return;
        };
        if ttl >= lease {
            tracing::warn!(
                endpoint = %self.endpoint.url(),
                ttl_s = ttl.as_secs_f64(),
                lease_ttl_s = lease.as_secs_f64(),
                "lookup_prefetch_ttl_s of {} s is not below the store's read lease ({} s, \
                 ZmqConfig::store_lease_ttl): a cached result may name blocks evicted since; \
                 set it below the lease",
                ttl.as_secs_f64(),
                lease.as_secs_f64()
            );
        }
    }
}

impl From<ZmqConfig> for Transport {
    fn from(zmq: ZmqConfig) -> Self {
        Self::Zmq(zmq)
    }
}

impl From<DirectConfig> for Transport {
    fn from(direct: DirectConfig) -> Self {
        Self::Direct(Box::new(direct))
    }
}
