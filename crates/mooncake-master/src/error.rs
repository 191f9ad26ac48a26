//! The crate's error type and the master's application error codes.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::{CodecError, FunctionId};

/// Mooncake Store's `ErrorCode` (a signed 32-bit enum, `mooncake-store/include/types.h`)
/// as the master returns it inside `expected<T, ErrorCode>`. Any value is kept, known
/// or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StoreErrorCode(pub i32);

impl StoreErrorCode {
    /// `INTERNAL_ERROR`.
    pub const INTERNAL_ERROR: Self = Self(-1);
    /// `INVALID_PARAMS`.
    pub const INVALID_PARAMS: Self = Self(-600);
    /// `OBJECT_NOT_FOUND`.
    pub const OBJECT_NOT_FOUND: Self = Self(-704);
    /// `OBJECT_HAS_LEASE`.
    pub const OBJECT_HAS_LEASE: Self = Self(-706);
    /// `RPC_FAIL`.
    pub const RPC_FAIL: Self = Self(-900);

    /// The code's name in Mooncake's source, when it is one this crate knows.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "OK",
            -1 => "INTERNAL_ERROR",
            -10 => "BUFFER_OVERFLOW",
            -100 => "SHARD_INDEX_OUT_OF_RANGE",
            -101 => "SEGMENT_NOT_FOUND",
            -102 => "SEGMENT_ALREADY_EXISTS",
            -103 => "CLIENT_NOT_FOUND",
            -200 => "NO_AVAILABLE_HANDLE",
            -300 => "INVALID_VERSION",
            -400 => "INVALID_KEY",
            -500 => "WRITE_FAIL",
            -600 => "INVALID_PARAMS",
            -601 => "ILLEGAL_CLIENT",
            -700 => "INVALID_WRITE",
            -701 => "INVALID_READ",
            -702 => "INVALID_REPLICA",
            -703 => "REPLICA_IS_NOT_READY",
            -704 => "OBJECT_NOT_FOUND",
            -705 => "OBJECT_ALREADY_EXISTS",
            -706 => "OBJECT_HAS_LEASE",
            -707 => "LEASE_EXPIRED",
            -800 => "TRANSFER_FAIL",
            -900 => "RPC_FAIL",
            -1010 => "UNAVAILABLE_IN_CURRENT_STATUS",
            -1011 => "UNAVAILABLE_IN_CURRENT_MODE",
            -1202 => "KEYS_EXCEED_BUCKET_LIMIT",
            -1203 => "KEYS_ULTRA_LIMIT",
            _ => return None,
        })
    }
}

impl fmt::Display for StoreErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "ErrorCode {}", self.0),
        }
    }
}

/// Everything that can go wrong talking to the master. Each variant says who is at
/// fault: the caller (misuse, configuration), the peer (the master broke the protocol
/// or refused the call), or I/O (the network or the master's process).
///
/// Clone, so that one broken connection can fail every call that was waiting on it.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MasterError {
    /// Caller: a [`MasterConfig`](crate::MasterConfig) value that cannot work.
    #[error("invalid master client configuration: {what}: {why}")]
    InvalidConfig {
        /// The field.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// Caller: a master address that cannot work ([`MasterAddr::parse`](crate::MasterAddr::parse)):
    /// a malformed `host:port`, an unsupported scheme, or an unusable cluster id.
    #[error("invalid Mooncake master address {addr}: {why}")]
    InvalidAddress {
        /// The address, or the part of it that was refused.
        addr: String,
        /// Why it was refused.
        why: String,
    },
    /// I/O or peer: no etcd endpoint of a high-availability address answered the
    /// leader's view (unreachable, no answer within
    /// [`MasterConfig::etcd_timeout`](crate::MasterConfig::etcd_timeout), an HTTP
    /// error, or an answer that does not decode). Only
    /// [`MasterClient::connect`](crate::MasterClient::connect) returns it; later
    /// failures keep the last known leader and are counted in
    /// [`MasterStats::view_read_failures`](crate::MasterStats::view_read_failures).
    #[error("cannot read the Mooncake leader from {addr}: {reason}")]
    Discovery {
        /// The `etcd://` address as configured.
        addr: String,
        /// One reason per endpoint tried.
        reason: String,
    },
    /// Caller: a request the codec cannot encode (a body over 4 GiB).
    #[error("request cannot be encoded: {0}")]
    Encode(CodecError),
    /// I/O: connecting to the master failed (refused, unreachable, or no answer within
    /// [`MasterConfig::connect_timeout`](crate::MasterConfig::connect_timeout), which
    /// shows as [`io::ErrorKind::TimedOut`]).
    #[error("cannot connect to the Mooncake master at {addr}: {source}")]
    Connect {
        /// The master's `host:port` (the leader's, for a high-availability address).
        addr: String,
        /// The connect error.
        #[source]
        source: Arc<io::Error>,
    },
    /// I/O: the connection is down and a reconnect is pending (backing off), or, with
    /// a high-availability address, no leader is elected right now; the call failed
    /// at once without touching the network. Retrying later may succeed.
    #[error("Mooncake master at {addr} unavailable (reconnecting): {last_error}")]
    Unavailable {
        /// The master's address: the leader's when one is known, else as configured.
        addr: String,
        /// Why the last connection or connect attempt failed, or why no leader is
        /// known.
        last_error: String,
    },
    /// I/O or peer: the connection broke (closed by the master, reset, or a reply that
    /// could not be framed) while the call was in flight. A reconnect is under way.
    #[error("connection to the Mooncake master at {addr} lost: {reason}")]
    ConnectionLost {
        /// The master's `host:port` (the leader's, for a high-availability address).
        addr: String,
        /// What broke it.
        reason: String,
    },
    /// Peer or I/O: no reply within
    /// [`MasterConfig::call_timeout`](crate::MasterConfig::call_timeout). The
    /// connection stays open; a late reply is recognised by its sequence number and
    /// dropped.
    #[error("{function} got no reply from the Mooncake master within {after:?}")]
    Timeout {
        /// The function called.
        function: FunctionId,
        /// The timeout that expired.
        after: Duration,
    },
    /// Peer: a reply body that does not decode as the function's return type.
    #[error("malformed {function} reply from the Mooncake master: {source}")]
    MalformedReply {
        /// The function called.
        function: FunctionId,
        /// What the decoder found.
        #[source]
        source: CodecError,
    },
    /// Peer: a `BatchExistKey` reply with a different number of answers than keys.
    #[error("the Mooncake master answered {got} existence results for {expected} keys")]
    AnswerCount {
        /// Keys asked about.
        expected: usize,
        /// Answers received.
        got: usize,
    },
    /// Peer (version mismatch) or caller: `err_code` 4, the master could not read the
    /// arguments as the function's parameter types. For `BatchExistKey` and `ExistKey`
    /// the client has already retried with the other signature (with or without
    /// `tenant_id`).
    #[error("the Mooncake master refused the arguments of {function}: {message}")]
    InvalidArguments {
        /// The function called.
        function: FunctionId,
        /// The master's message (`"invalid rpc arg"`).
        message: String,
    },
    /// Peer (wrong service or version): `err_code` 11, the master does not register
    /// this function id.
    #[error("the Mooncake master does not register function {function}: {message}")]
    FunctionNotRegistered {
        /// The function called.
        function: FunctionId,
        /// The master's message.
        message: String,
    },
    /// Peer: any other coro_rpc-level failure (`err_code` not 0, 4 or 11; for 255, the
    /// 16-bit code from the body).
    #[error("the Mooncake master failed {function} with coro_rpc error {code}: {message}")]
    Rpc {
        /// The function called.
        function: FunctionId,
        /// coro_rpc's error code.
        code: u16,
        /// The master's message.
        message: String,
    },
    /// Peer (application): the master answered with its own `ErrorCode` (for example
    /// `INTERNAL_ERROR` -1, `INVALID_PARAMS` -600, `OBJECT_NOT_FOUND` -704). For an
    /// existence answer, `key_index` is the position of the first such key in the
    /// caller's list: every key before it was answered.
    #[error("the Mooncake master answered {code}{}", key_index.map(|i| format!(" for key #{i}")).unwrap_or_default())]
    Store {
        /// The master's error code.
        code: StoreErrorCode,
        /// Index of the key it concerns, for per-key answers.
        key_index: Option<usize>,
    },
}

impl MasterError {
    /// Whether the master could not be reached or did not answer in time
    /// ([`Connect`](Self::Connect), [`Discovery`](Self::Discovery),
    /// [`Unavailable`](Self::Unavailable), [`ConnectionLost`](Self::ConnectionLost),
    /// [`Timeout`](Self::Timeout)): the answer is unknown, never "absent", and the same
    /// call may succeed later (after a reconnect or a leader change).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. }
                | Self::Discovery { .. }
                | Self::Unavailable { .. }
                | Self::ConnectionLost { .. }
                | Self::Timeout { .. }
        )
    }
}
