//! Tokio driver of [`lookup_core`] over ZeroMQ (`tmq`): the scheduler's
//! `LookupClient` and the reference `LookupServer`.
//!
//! The core's state lives with the client handle on the scheduler's thread; one tokio
//! task owns the socket (DESIGN.md, "lookup-tokio"). The client can also skip the
//! server and ask the Mooncake master directly ([`Transport::Direct`]).

mod client;
mod clock;
mod endpoint;
mod error;
mod index;
mod io;
pub mod metrics;
mod mooncake;
mod server;
mod warn;

pub use client::{ClientConfig, ClientStats, LookupClient, LookupHandle};
pub use endpoint::Endpoint;
pub use error::Error;
pub use index::{
    BlockIndex, DelayedIndex, InMemoryIndex, IndexError, IndexFuture, KeyLayout, RankNamespace,
};
pub use io::direct::{DEFAULT_LEASE_TTL, DirectConfig, Transport};
pub use mooncake::{MooncakeIndex, MooncakeIndexStats};
/// The Mooncake master client behind [`MooncakeIndex`] (its configuration and errors).
pub use mooncake_master;
pub use server::{
    DEFAULT_MAX_CONCURRENCY, DEFAULT_MAX_FRAME_BYTES, LookupServer, ServerConfig, ServerStats,
    blocks_to_check, hit_tokens, leading_run,
};
