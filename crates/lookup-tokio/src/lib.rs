//! Tokio driver of [`lookup_core`] over ZeroMQ (`tmq`): the scheduler's
//! `LookupClient` and the reference `LookupServer`.
//!
//! The core's state lives with the client handle on the scheduler's thread; one tokio
//! task owns the socket (DESIGN.md, "lookup-tokio").

mod endpoint;
mod error;

pub use endpoint::Endpoint;
pub use error::Error;
