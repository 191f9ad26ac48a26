//! The crate's one error type.

/// Errors of `lookup-server`: binding a server. Once bound, a server never fails on
/// input or on its index: bad requests and index failures are answered (hit 0,
/// `0x00`) and counted in [`ServerStats`](crate::ServerStats).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// I/O: a ZeroMQ socket could not be created or bound (address in use).
    #[error("zeromq: {0}")]
    Zmq(#[from] tmq::TmqError),
    /// I/O: a file-system operation on the ipc socket file failed, or there is no
    /// tokio runtime to run the server on.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
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
    /// Caller misuse: an invalid server setting (block size 0, an ipc path that exists
    /// and is not a socket).
    #[error("invalid server configuration `{key}`: {why}")]
    InvalidServerConfig {
        /// The setting's name.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
}
