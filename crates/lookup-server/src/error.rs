//! The crate's one error type, [`Error`], and [`IndexError`], the store failures it
//! nests.

/// Errors of `lookup-server`; each variant says who is at fault (the caller, I/O, or
/// the store behind an index). Binding a server is where they arise: once bound, a
/// server never fails on input or on its index, since bad requests and index failures
/// are answered (hit 0, `0x00`) and counted in [`ServerStats`](crate::ServerStats).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// I/O: a ZeroMQ socket could not be created or bound (address in use).
    #[error("zeromq: {0}")]
    Zmq(#[from] tmq::TmqError),
    /// I/O: a file-system operation on the ipc socket file failed. Also (caller
    /// misuse) a bind outside a tokio runtime, which has no task to run the server on.
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
    /// The store behind an index failed, as the nested [`IndexError`] says (I/O, the
    /// store's answer, or an operation it cannot do). A server never returns it (a
    /// failed index call gets the store-unavailable error reply); it lets code that
    /// calls a
    /// [`BlockIndex`](crate::BlockIndex) itself use `?` into this one type.
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// Why an index call failed: the store's fault (I/O or its answers) or a request it
/// cannot serve. Nested in [`Error::Index`]; [`BlockIndex`](crate::BlockIndex) calls
/// return it on its own. The server answers such a lookup with the error reply of
/// `spec/wire.md`, "Store unavailable" (the single byte `0x00` in either format, which
/// vLLM's clients read as 0 hit tokens and this project's as unavailable), never as a
/// miss, and counts it in `index_errors`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// I/O: the store could not be reached (connection refused, timed out, closed).
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Peer: the store was reached and answered with an error of its own.
    #[error("store error: {0}")]
    Store(String),
    /// Caller misuse (of this index): the store cannot do what was asked at all (for
    /// example a reset on a store whose client has no way to remove every key);
    /// asking again will not help.
    #[error("{operation} is not supported by this index: {why}")]
    Unsupported {
        /// The operation refused (`"reset"`).
        operation: &'static str,
        /// Why, for the log.
        why: &'static str,
    },
    /// Peer (index protocol violation): an existence answer with a different number
    /// of flags than keys asked about. Raised where an answer is checked (the default
    /// [`BlockIndex::leading_blocks`](crate::BlockIndex::leading_blocks)).
    #[error("the index answered {got} existence flags for {expected} keys")]
    AnswerCount {
        /// Keys asked about.
        expected: usize,
        /// Flags received.
        got: usize,
    },
}
