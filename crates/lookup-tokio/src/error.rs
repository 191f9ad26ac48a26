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
    /// Caller misuse: `LookupClient::connect` was called outside a tokio runtime
    /// (use `LookupClient::connect_with_handle`).
    #[error("LookupClient::connect needs a tokio runtime; use connect_with_handle")]
    NoRuntime,
    /// Caller misuse: `LookupClient::probe_blocking` was called on a thread of a
    /// current-thread tokio runtime, where blocking would stop the I/O task.
    #[error("probe_blocking called on a current-thread runtime's thread; use probe_wait")]
    BlockingInRuntime,
    /// Caller misuse: a server TCP bind to an address that is not loopback without
    /// `allow_remote`. ZeroMQ has no authentication: anyone who reaches the socket can
    /// ask about and wipe the store, so it stays on loopback or ipc unless asked.
    #[error(
        "refusing to bind `{endpoint}`: not a loopback address (set ServerConfig::allow_remote or --allow-remote to bind it)"
    )]
    RemoteBind {
        /// The endpoint asked for.
        endpoint: String,
    },
    /// Caller misuse: a running server already listens on this ipc path (set
    /// `ServerConfig::take_over` to replace it, as vLLM's worker does).
    #[error(
        "{endpoint} is in use by a running server (stop it, or take it over with take_over / --take-over)"
    )]
    EndpointInUse {
        /// The endpoint asked for.
        endpoint: String,
    },
    /// Caller misuse: an invalid client transport setting (an empty master address,
    /// a master client setting it would refuse: see `DirectConfig::validate`).
    #[error("invalid client configuration `{key}`: {why}")]
    InvalidClientConfig {
        /// The setting's name.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Caller misuse: an invalid server setting (block size 0, no rank namespace, an
    /// ipc path that exists and is not a socket).
    #[error("invalid server configuration `{key}`: {why}")]
    InvalidServerConfig {
        /// The setting's name.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
}
