//! The crate's one error type.

/// Errors of `lookup-tokio`, the client; each variant says who is at fault (the
/// caller, or I/O). A server or master that misbehaves is never an error here: lookup
/// outcomes (timeouts, malformed replies) are [`lookup_core::Event`]s and counters,
/// and probes fail open.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Caller misuse, from the core: an invalid configuration (see
    /// [`lookup_core::Config::validate`]), an endpoint that does not parse, or another
    /// of [`lookup_core::Error`]'s caller-misuse variants.
    #[error(transparent)]
    Core(#[from] lookup_core::Error),
    /// I/O: a ZeroMQ socket could not be created or connected.
    #[error("zeromq: {0}")]
    Zmq(#[from] tmq::TmqError),
    /// Caller misuse: the client was closed before the call; or I/O: its I/O task
    /// ended (the runtime that hosted it shut down).
    #[error("the lookup client is closed")]
    Closed,
    /// Caller misuse: `LookupClient::connect_lazy` was called outside a tokio runtime
    /// (use `LookupClient::connect_lazy_with_handle`).
    #[error("LookupClient::connect_lazy needs a tokio runtime; use connect_lazy_with_handle")]
    NoRuntime,
    /// I/O: the strict `LookupClient::connect` found that the lookup server (the
    /// master) did not answer within `ClientConfig::connect_timeout`, for `why`.
    #[error("{target} does not answer: {why}")]
    Unreachable {
        /// Where lookups go (`Transport::target`).
        target: String,
        /// Why: no socket file, a stale one, a refused port, no ZeroMQ greeting, the
        /// master's connect error, or the bound.
        why: String,
    },
    /// Caller misuse: `LookupClient::probe_until_blocking` was called on a thread of a
    /// current-thread tokio runtime, where blocking would stop the I/O task.
    #[error("probe_until_blocking called on a current-thread runtime's thread; use probe_until")]
    BlockingInRuntime,
    /// Caller misuse: an invalid client setting: a master address that does not parse
    /// (`DirectConfig::parse`), a master client setting it would refuse
    /// (`DirectConfig::validate`), a builder without a transport, an endpoint that
    /// does not parse (`ClientBuilder`).
    #[error("invalid client configuration `{key}`: {why}")]
    InvalidClientConfig {
        /// The setting's name.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Caller misuse: a key of vLLM's `kv_connector_extra_config` that is unknown,
    /// has a value of the wrong type, or is out of range
    /// (`KvConnectorExtraConfig::from_kv_connector_extra_config`).
    #[error("kv_connector_extra_config key `{key}`: {why}")]
    ExtraConfig {
        /// The key as written.
        key: String,
        /// What is wrong with it.
        why: String,
    },
}
