//! The scheduler-side client of the asynchronous prefix-cache lookup: [`LookupClient`]
//! drives [`lookup_core`] over ZeroMQ (a vLLM MooncakeStoreConnector worker or
//! `lookup-server`) or straight to the Mooncake master ([`Transport::Direct`]).
//!
//! # Threads and channels
//!
//! - **The scheduler's thread** owns the [`LookupClient`] and, inside it, the
//!   lifecycle state machine ([`lookup_core::Lookups`]): every request's lookup, the
//!   cached results, the prefetch slots, the event queue. No lock: every call is
//!   `&mut self` and runs on the caller's thread.
//! - **One tokio task** (the I/O task, spawned by `connect` on the current runtime,
//!   or on the one given to `connect_with_handle`) owns the socket or the master
//!   connection, and the wire's half of the protocol ([`lookup_core::Dispatcher`]):
//!   the send queue (priority, `max_in_flight`), every RPC on the wire and its
//!   deadline, late replies, reopening with backoff.
//! - **Two unbounded channels** link them: the core's `Command`s (with the lookup's
//!   tracing span) go to the task; one `WireEvent` per RPC that ended comes back.
//!   Nothing else crosses. The client applies the wire events at the start of each of
//!   its calls, so a call never waits for the task; only the explicit waits
//!   ([`LookupClient::probe_until`], [`LookupClient::probe_until_blocking`],
//!   `reset_and_wait`, `wait_progress`) sleep, on the channel, bounded by `lookup_timeout_s` plus
//!   [`ClientConfig::wait_margin`].
//!
//! # The call-order contract
//!
//! 0. Build the client: [`LookupClient::builder`] (`.zmq(..)` or `.direct(..)`, vLLM's
//!    `kv_connector_extra_config` through `.kv_connector_extra_config(..)`, then
//!    `.connect().await`). Keys must be the engines' own: [`vllm::key_layout`] and
//!    [`vllm_block_hash`] compute them as vLLM does.
//! 1. Announce each request when it arrives: [`LookupClient::on_new_request`] (starts
//!    a prefetch when `lookup_async` and `lookup_prefetch_limit > 0`), or
//!    [`LookupClient::on_new_request_with_id`] to name it in spans; other tasks use a
//!    cloned [`LookupHandle`].
//! 2. Each scheduler step, for each waiting request, one of the three probe forms,
//!    whose wait is written at the call site: [`LookupClient::probe`] (never waits;
//!    `Pending` means "not known yet, try next step"),
//!    [`LookupClient::probe_until`] with a [`Deadline`] (`Answer`: sync mode, always
//!    `Ready`; `Within(budget)` or `At(instant)`: prefetch plus a bounded wait), or
//!    [`LookupClient::probe_until_blocking`] on a thread.
//!    [`LookupClient::step_deadline`] gives the deadline the configuration's
//!    `lookup_async` stands for. [`LookupClient::answer_of`] says whether a 0 was a miss or
//!    an unavailable store.
//! 3. When blocks are allocated: [`LookupClient::on_allocated`]; when the request
//!    finishes or aborts: [`LookupClient::on_finished`]; when preempted:
//!    [`LookupClient::on_preempted`]. A request never finished stays tracked.
//! 4. Read outcomes with [`LookupClient::poll_event`] when you want them (the queue is
//!    bounded by [`ClientConfig::event_capacity`]; metrics and spans never depend on
//!    it), and counters with [`LookupClient::stats`].
//! 5. [`LookupClient::close`] or drop it (rule 14), or `shutdown().await` to wait for
//!    the task to end.
//!
//! # What happens on each failure
//!
//! | failure | what the client does | what the scheduler sees |
//! |---|---|---|
//! | no reply within `lookup_timeout_s` | the dispatcher fails the RPC; after `reopen_after_timeouts` in a row the socket is reopened | `Ready(0)`, [`Answer::Unavailable`]`(TimedOut)` |
//! | a reply after its timeout, or twice | dropped, counted in [`ClientStats::late_replies`] | nothing |
//! | a reply that does not decode, or above the prompt, or not whole blocks | counted as malformed, warned about | `Ready(0)`, `Unavailable(Malformed)` |
//! | socket or master connection lost | RPCs on it fail; reopen after a backoff (10 ms doubling to 1 s) | `Ready(0)`, `Unavailable(Transport)` |
//! | a failed request probed again | looked up again only after the failure backoff, one failed request at a time | `Ready(0)`, `Unavailable(Retrying)` meanwhile |
//! | the I/O task ends (its runtime shut down) | the client closes itself | `Ready(0)`, `Unavailable(Closed)` |
//!
//! Warnings are rate-limited per kind (the first at once, then one per 10 s with the
//! count suppressed) and name the endpoint.

mod client;
mod clock;
mod error;
mod io;
pub mod io_thread;
pub mod metrics;
mod store_check;
mod transport;
pub mod vllm;
mod warn;

pub use client::{
    ClientBuilder, ClientConfig, ClientStats, Deadline, KvConnectorExtraConfig, LookupClient,
    LookupHandle, Step, VLLM_STORE_KEYS,
};
pub use error::Error;
pub use io::direct::{DEFAULT_LEASE_TTL, DirectConfig};
pub use io::peer::{EndpointUnreachable, LIVENESS_BOUND, check_alive, check_reachable};
/// Where the lookup server listens (`spec/wire.md`, "Transport").
pub use lookup_core::Endpoint;
/// The core's types a scheduler names, so that one dependency line is enough.
pub use lookup_core::{
    Answer, BlockHashes, Config, Event, LookupOutcome, OnPreemption, Probe, Request, RequestId,
    ResetOutcome, RpcId, Unavailable,
};
/// The Mooncake master client behind [`Transport::Direct`] (its configuration and
/// errors).
pub use mooncake_master;
/// The master's address (`host:port` or `etcd://...`), checked when parsed.
pub use mooncake_master::MasterAddr;
/// How [`DirectConfig`] turns block hashes into store keys ([`vllm::key_layout`]
/// makes the one a vLLM deployment uses), and how it batches them.
pub use mooncake_master::batch::{LeaseSource, LeaseTtl};
pub use mooncake_master::{BatchConfig, BatchStats, KeyLayout, PresenceCacheConfig, RankNamespace};
pub use store_check::{StoreCheck, StoreCheckLimits, StoredBlocks};
pub use transport::{Transport, ZmqConfig};
/// vLLM 0.33's block hashes and store keys, byte for byte ([`vllm`]).
pub use vllm_block_hash;
