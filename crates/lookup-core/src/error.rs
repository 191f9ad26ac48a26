//! The crate's one error type, [`Error`], and [`WireError`], the peer's protocol
//! violations it nests.

/// Errors of this crate; each variant says who is at fault. The caller's mistakes are
/// variants of their own; a peer that breaks the wire format is
/// [`PeerMisbehaved`](Self::PeerMisbehaved), with the [`WireError`] that says how.
///
/// Lifecycle outcomes the scheduler must see (a timed-out or malformed lookup, a
/// reset's result) are [`Event`](crate::Event)s and [`Stats`](crate::Stats) counters,
/// never errors (CONTRIBUTING.md rule 9).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// Caller misuse: a configuration key has a value that makes no sense
    /// (`spec/behaviour.md`, "Configuration").
    #[error("invalid configuration `{key}`: {why}")]
    InvalidConfig {
        /// The vLLM key name (for example `block_size`).
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// Caller misuse: hash bytes given to [`BlockHashes::new`](crate::BlockHashes::new)
    /// or [`BlockHashes::from_hashes`](crate::BlockHashes::from_hashes) that do not
    /// split into equal hashes. (Hashes a peer sends that do not split are
    /// [`WireError::HashBytes`].)
    #[error("{bytes} bytes of block hashes do not split into hashes of {hash_len} bytes")]
    BadHashes {
        /// Claimed length of each hash (bytes).
        hash_len: u16,
        /// Bytes given.
        bytes: usize,
    },
    /// Caller misuse: an endpoint string that does not parse (`spec/wire.md`,
    /// "Transport").
    #[error("bad endpoint `{endpoint}`: {why}")]
    Endpoint {
        /// What was given.
        endpoint: String,
        /// What is wrong.
        why: String,
    },
    /// Caller misuse: a reset was asked for in `msgpack-hex`, which has no reset
    /// message (`spec/wire.md`, `msgpack-hex`).
    #[error("format msgpack-hex has no reset message")]
    NoReset,
    /// Caller misuse: a format name other than `tagged-blob` or `msgpack-hex`.
    #[error("unknown wire format `{0}` (expected `tagged-blob` or `msgpack-hex`)")]
    UnknownFormat(String),
    /// Peer protocol violation: a received message breaks `spec/wire.md`, as the
    /// nested [`WireError`] says.
    #[error("peer protocol violation: {0}")]
    PeerMisbehaved(#[from] WireError),
}

/// How a received lookup-channel message breaks `spec/wire.md`: always the peer's
/// fault (the server, for a reply a client decodes; the client, for a request a server
/// decodes). Nested in [`Error::PeerMisbehaved`]; the decoders return it on its own,
/// since nothing else can make them fail.
///
/// A server turns one into [`ServerRequest::Malformed`](crate::wire::ServerRequest::Malformed)
/// and answers hit 0; a client counts the lookup as failed (`spec/wire.md`,
/// "Client-side guards").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Peer protocol violation: a message had the wrong number of frames.
    #[error("expected {expected} frame(s), got {got}")]
    WrongFrameCount {
        /// Frames the format requires.
        expected: usize,
        /// Frames received.
        got: usize,
    },
    /// Peer protocol violation: a fixed-size field had the wrong byte length.
    #[error("field `{what}` must be {expected} bytes, got {got}")]
    BadLength {
        /// The field's name in `spec/wire.md` (`num_tokens`, `hash_len`, `token_len`).
        what: &'static str,
        /// Bytes the field must have.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// Peer protocol violation: a lookup reply of this many bytes. `tagged-blob` needs
    /// 4 + 8k bytes (k ≥ 0); `msgpack-hex` exactly 4 (`spec/wire.md`, lookup reply).
    #[error("malformed lookup reply of {0} bytes")]
    ReplyLength(usize),
    /// Peer (its store): a `tagged-blob` lookup reply that is the server's error reply,
    /// the single byte `0x00` (vLLM's `RESP_ERR`): the server is up and could not ask
    /// its store (master down, timed out, no leader). Not a broken reply: a client
    /// reads it as unavailable, never as a miss nor as malformed (`spec/wire.md`,
    /// "Store unavailable", an extension; vLLM 0.33's own client reads it as 0 hits).
    #[error("the lookup server could not ask its store (error reply 0x00)")]
    StoreUnavailable,
    /// Peer protocol violation: the hash frame of a `tagged-blob` lookup does not split
    /// into hashes of `hash_len` bytes (or is not empty while `hash_len` is 0).
    #[error("{bytes} bytes of block hashes do not split into hashes of {hash_len} bytes")]
    HashBytes {
        /// Claimed length of each hash (bytes).
        hash_len: u16,
        /// Bytes in the hash frame.
        bytes: usize,
    },
    /// Peer protocol violation: more hashes than [`MAX_HASHES`](crate::wire::MAX_HASHES) (counted or claimed).
    #[error("{count} block hashes, at most {max} accepted")]
    TooManyHashes {
        /// Hashes counted in, or claimed by, the request.
        count: usize,
        /// [`MAX_HASHES`](crate::wire::MAX_HASHES).
        max: usize,
    },
    /// Peer protocol violation: a hash longer than [`MAX_HASH_LEN`](crate::wire::MAX_HASH_LEN) bytes.
    #[error("block hash of {len} bytes, at most {max} accepted")]
    HashTooLong {
        /// Claimed hash length (bytes, not hex digits).
        len: usize,
        /// [`MAX_HASH_LEN`](crate::wire::MAX_HASH_LEN).
        max: usize,
    },
    /// Peer protocol violation: a hash of zero bytes in a `msgpack-hex` lookup (an
    /// empty string cannot name a block).
    #[error("block hash {index} is empty")]
    EmptyHash {
        /// 0-based index of the hash in the array.
        index: usize,
    },
    /// Peer protocol violation: the `msgpack-hex` hash frame is not one MessagePack
    /// array of strings (wrong type, or a header cut short). Carries rmp's message.
    #[error("malformed msgpack: {0}")]
    Msgpack(String),
    /// Peer protocol violation: the `msgpack-hex` hash frame is shorter than its
    /// headers claim (bytes).
    #[error("msgpack hash frame truncated: needs at least {needed} more bytes, has {available}")]
    Truncated {
        /// Bytes still needed, at least (a lower bound computed from the claims).
        needed: usize,
        /// Bytes left in the frame.
        available: usize,
    },
    /// Peer protocol violation: bytes after the `msgpack-hex` hash array.
    #[error("{0} trailing bytes after the msgpack array")]
    TrailingBytes(usize),
    /// Peer protocol violation: a `msgpack-hex` hash string that is not hex digits of
    /// even length.
    #[error("block hash {index} is not hex of even length")]
    BadHex {
        /// 0-based index of the hash in the array.
        index: usize,
    },
    /// Peer protocol violation: a `msgpack-hex` hash whose length differs from the
    /// first one's.
    #[error("block hash {index} differs in length from hash 0")]
    UnequalHashLengths {
        /// 0-based index of the first hash that differs.
        index: usize,
    },
    /// Peer protocol violation: a reset reply other than the single byte `0x01` or
    /// `0x00`. Holds at most its first 16 bytes.
    #[error("malformed reset reply {0:02x?}")]
    ResetReply(Vec<u8>),
}
