//! Tokio driver of [`lookup_core`] over ZeroMQ (`tmq`): the scheduler's
//! `LookupClient`.
//!
//! The core's state lives with the client handle on the scheduler's thread; one tokio
//! task owns the socket (DESIGN.md, "lookup-tokio"). The client can also skip the
//! server and ask the Mooncake master directly ([`Transport::Direct`]). The worker
//! side of the channel, the reference `LookupServer`, is the `lookup-server` crate.

mod client;
mod clock;
mod error;
mod io;
pub mod metrics;
mod warn;

pub use client::{ClientConfig, ClientStats, LookupClient, LookupHandle};
pub use error::Error;
pub use io::direct::{DEFAULT_LEASE_TTL, DirectConfig, Transport};
/// Where the lookup server listens (`spec/wire.md`, "Transport").
pub use lookup_core::Endpoint;
/// The Mooncake master client behind [`Transport::Direct`] (its configuration and
/// errors).
pub use mooncake_master;
/// How [`DirectConfig`] turns block hashes into store keys.
pub use mooncake_master::{KeyLayout, RankNamespace};
