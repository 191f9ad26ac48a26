//! The crate's one error type.

/// Errors of `lookup-tokio`. Lookup outcomes (timeouts, malformed replies) are not
/// errors: they are [`lookup_core::Event`]s and counters, and probes fail open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Caller misuse: an endpoint string that does not parse.
    #[error("bad endpoint `{endpoint}`: {why}")]
    Endpoint {
        /// What was given.
        endpoint: String,
        /// What is wrong.
        why: String,
    },
    /// Caller misuse: an invalid configuration (see [`lookup_core::Config::validate`]).
    #[error(transparent)]
    Core(#[from] lookup_core::Error),
    /// I/O: a ZeroMQ socket could not be created, bound or connected.
    #[error("zeromq: {0}")]
    Zmq(#[from] tmq::TmqError),
    /// I/O: a file-system operation on the ipc socket file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The client was closed, or its I/O task ended.
    #[error("the lookup client is closed")]
    Closed,
}
