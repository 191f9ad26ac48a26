//! The reference lookup server: answers vLLM's lookup channel from a [`BlockIndex`],
//! the worker side of the channel whose scheduler side is `lookup-tokio`.
//!
//! A ROUTER socket (ZeroMQ, `tmq`) bound over ipc or tcp serves unmodified vLLM REQ
//! clients and DEALER clients that put an envelope (an RPC id) before the empty
//! delimiter, in both wire formats (`spec/wire.md`). Each lookup asks the index once,
//! for every key of the blocks in question, and answers per "What the server computes".
//! Lookups are answered concurrently, up to [`ServerConfig::max_concurrency`] at
//! once, so a slow index call does not hold up other clients; replies go out in
//! completion order. The server never dies on input: malformed lookups get hit 0,
//! unknown tags `0x00`, and messages without a delimiter are dropped; all are counted
//! in [`ServerStats`].
//!
//! # Security
//!
//! ZeroMQ has no authentication and no encryption here: anyone who can reach the
//! socket can ask which blocks are stored and wipe the store with a reset. So a TCP
//! bind to a non-loopback address is refused unless [`ServerConfig::allow_remote`] is
//! set, an ipc socket file is made owner-only (mode 0600) right after bind, and a
//! missing parent directory is created owner-only (0700). Keep the channel on ipc or
//! loopback; put anything wider behind a tunnel that authenticates.
//!
//! # Layout
//!
//! - [`LookupServer`] (`serve`): the socket task and the answer to each message;
//! - [`ServerConfig`] (`config`), [`ServerStats`] (`stats`), [`Error`] (`error`);
//! - [`index`]: [`BlockIndex`] and its implementations [`InMemoryIndex`],
//!   [`DelayedIndex`] and [`MooncakeIndex`];
//! - [`metrics`]: the `lookup_server_*` metrics.
//!
//! The answer rules themselves ([`lookup_core::answer`]) and the key layout
//! ([`mooncake_master::KeyLayout`]) live where a client that asks the store directly
//! shares them.
#![forbid(unsafe_code)]

mod bind;
mod config;
mod error;
pub mod index;
pub mod metrics;
mod serve;
mod stats;

pub use config::{
    DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_HASHES,
    DEFAULT_MAX_PENDING_BYTES, DEFAULT_RECV_HWM, ServerConfig,
};
pub use error::Error;
pub use index::{
    BlockIndex, DelayedIndex, InMemoryIndex, IndexError, IndexFuture, IndexStats, LeadingRun,
    MooncakeIndex, ResetPolicy,
};
/// The endpoint type [`LookupServer::bind`] takes (`spec/wire.md`, "Transport").
pub use lookup_core::Endpoint;
/// The Mooncake master client behind [`MooncakeIndex`] (its configuration and errors),
/// and the key layout ([`KeyLayout`], [`RankNamespace`]).
pub use mooncake_master;
pub use mooncake_master::{KeyLayout, RankNamespace};
pub use serve::LookupServer;
pub use stats::ServerStats;
