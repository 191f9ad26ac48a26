//! The crate's one error type.

/// Errors of `lookup-tokio`. Lookup outcomes (timeouts, malformed replies) are not
/// errors: they are [`lookup_core::Event`]s and counters, and probes fail open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Caller misuse: an invalid configuration (see [`lookup_core::Config::validate`]),
    /// or an endpoint that does not parse.
    #[error(transparent)]
    Core(#[from] lookup_core::Error),
    /// I/O: a ZeroMQ socket could not be created or connected.
    #[error("zeromq: {0}")]
    Zmq(#[from] tmq::TmqError),
    /// I/O: a file-system operation on the ipc socket file failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The client was closed, or its I/O task ended.
    #[error("the lookup client is closed")]
    Closed,
    /// Caller misuse: `LookupClient::connect` was called outside a tokio runtime
    /// (use `LookupClient::connect_with_handle`).
    #[error("LookupClient::connect needs a tokio runtime; use connect_with_handle")]
    NoRuntime,
    /// Caller misuse: `LookupClient::probe_blocking` was called on a thread of a
    /// current-thread tokio runtime, where blocking would stop the I/O task.
    #[error("probe_blocking called on a current-thread runtime's thread; use probe_wait")]
    BlockingInRuntime,
    /// Caller misuse: an invalid client transport setting (an empty master address,
    /// a master client setting it would refuse: see `DirectConfig::validate`).
    #[error("invalid client configuration `{key}`: {why}")]
    InvalidClientConfig {
        /// The setting's name.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
}
