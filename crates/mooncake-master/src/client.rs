//! The tokio client: one pipelined TCP connection to the master, reconnected with
//! backoff (`spec/mooncake-master-rpc.md`, "Transport").
//!
//! Shape: callers encode their request, register a one-shot slot under a fresh
//! sequence number and hand the frame to the connection's writer task; the reader task
//! matches each reply to its slot by sequence number. A connection that breaks fails
//! every waiting call at once and is replaced in the background; calls made while it
//! is down fail fast with [`MasterError::Unavailable`] and start the next attempt when
//! the backoff allows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::codec::{
    self, CodecError, ERR_FUNCTION_NOT_REGISTERED, ERR_INVALID_ARGUMENTS, ExistResult, FunctionId,
    REPLY_HEADER_LEN, ReplyHeader, TypeLiteral,
};
use crate::{MasterError, StoreErrorCode};

/// How the client talks to the master. Build with `MasterConfig::default()` and set
/// fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterConfig {
    /// Longest wait for one reply, from handing the request to the connection. Default
    /// 1 s. The master answers 1,000 keys in ~0.3 ms on loopback; a call that takes
    /// a second is a master in trouble.
    pub call_timeout: Duration,
    /// Longest wait for the TCP connect. Default 1 s.
    pub connect_timeout: Duration,
    /// Most keys per `BatchExistKey` call; longer lists are split. Default 1,024
    /// (1,000 keys cost the master ~0.3 ms; a chunk bounds the work and the read
    /// leases one call grants).
    pub chunk_keys: usize,
    /// `tenant_id` argument of `BatchExistKey`/`ExistKey` (masters ≥ 0.3.12). Default
    /// `"default"`, the tenant of every client unless tenant quotas are on.
    pub tenant_id: String,
    /// Whether requests carry struct_pack's type literal (the debug form the PyPI
    /// client sends). Default [`TypeLiteral::Omit`]: shorter, and accepted by debug
    /// and release masters alike.
    pub type_literal: TypeLiteral,
    /// First wait before a reconnect attempt after a failed one; doubled on each
    /// further failure. Default 20 ms.
    pub backoff_min: Duration,
    /// Longest wait between reconnect attempts. Default 1 s.
    pub backoff_max: Duration,
    /// Largest reply (body plus attachment) accepted, in bytes; a larger header breaks
    /// the connection as a protocol violation instead of allocating. Default 16 MiB
    /// (a 1,024-key answer is ~2 KiB).
    pub max_reply_bytes: u32,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            chunk_keys: 1024,
            tenant_id: "default".to_owned(),
            type_literal: TypeLiteral::Omit,
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            max_reply_bytes: 16 << 20,
        }
    }
}

impl MasterConfig {
    fn validate(&self) -> Result<(), MasterError> {
        let invalid = |what, why: &str| {
            Err(MasterError::InvalidConfig {
                what,
                why: why.to_owned(),
            })
        };
        if self.chunk_keys == 0 {
            return invalid("chunk_keys", "must be at least 1");
        }
        if self.call_timeout.is_zero() {
            return invalid("call_timeout", "must be positive");
        }
        if self.connect_timeout.is_zero() {
            return invalid("connect_timeout", "must be positive");
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return invalid("backoff_min", "must be positive and at most backoff_max");
        }
        Ok(())
    }
}

/// Counters of one client since it was created (all handles share them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterStats {
    /// Requests handed to a connection (every function, retries included).
    pub requests: u64,
    /// `BatchExistKey` requests among them.
    pub batch_exist_calls: u64,
    /// Keys sent in `BatchExistKey` requests.
    pub keys_asked: u64,
    /// Replies matched to a waiting call.
    pub replies: u64,
    /// Replies that arrived after their call had given up (timed out or dropped).
    pub late_replies: u64,
    /// Calls that timed out.
    pub timeouts: u64,
    /// Calls that failed fast because the connection was down.
    pub failed_fast: u64,
    /// Successful connects, the first included.
    pub connects: u64,
    /// Failed connect attempts.
    pub connect_failures: u64,
    /// Connections that broke.
    pub connections_lost: u64,
    /// Connections that switched to the pre-0.3.12 signatures (no `tenant_id`) after
    /// an `err_code` 4.
    pub signature_fallbacks: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    batch_exist_calls: AtomicU64,
    keys_asked: AtomicU64,
    replies: AtomicU64,
    late_replies: AtomicU64,
    timeouts: AtomicU64,
    failed_fast: AtomicU64,
    connects: AtomicU64,
    connect_failures: AtomicU64,
    connections_lost: AtomicU64,
    signature_fallbacks: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every await-free step, so a
    // panic elsewhere never leaves it half-updated.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reply as framed by the reader task, before the function's decoder sees it.
#[derive(Debug)]
struct RawReply {
    header: ReplyHeader,
    body: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<RawReply, MasterError>>;

#[derive(Default)]
struct Pending {
    /// Why the connection broke, once it has: no new call may wait on it.
    closed: Option<String>,
    waiters: HashMap<u32, Waiter>,
}

/// One TCP connection: the writer task's queue, the calls waiting for replies, and
/// what this master accepts.
struct Conn {
    id: u64,
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<Pending>,
    /// The master refused the `tenant_id` signatures (err_code 4) and accepted the
    /// older ones: remembered for this connection only, since a reconnect may reach an
    /// upgraded master.
    legacy_signatures: AtomicBool,
    shutdown: CancellationToken,
}

enum Link {
    Up(Arc<Conn>),
    Down {
        /// Earliest time a call may start the next connect attempt.
        retry_at: Instant,
        /// Wait after the next failed attempt.
        backoff: Duration,
        /// An attempt is running.
        connecting: bool,
        last_error: String,
    },
}

struct Inner {
    addr: String,
    config: MasterConfig,
    next_seq: AtomicU32,
    next_conn_id: AtomicU64,
    link: Mutex<Link>,
    counters: Arc<Counters>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Link::Up(conn) = &*lock(&self.link) {
            conn.shutdown.cancel();
        }
    }
}

/// A client of the Mooncake master's existence RPC: a cheap, cloneable handle
/// (`Send + Sync`) to one pipelined TCP connection shared by every clone and task.
///
/// Key lists are split into calls of at most [`MasterConfig::chunk_keys`] keys.
/// Leading-run queries ([`leading_run`](Self::leading_run),
/// [`leading_blocks`](Self::leading_blocks)) send their chunks one after another and
/// stop at the first chunk that ends the run: every present key a call reports gets
/// a read lease from the master (`spec/mooncake-master-rpc.md`, "The call"), so keys
/// past a miss are not asked about. [`batch_exist`](Self::batch_exist) asks about
/// every key, all chunks pipelined at once.
///
/// ```no_run
/// # async fn demo() -> Result<(), mooncake_master::MasterError> {
/// use mooncake_master::{MasterClient, MasterConfig};
///
/// let master = MasterClient::connect("127.0.0.1:50051", MasterConfig::default()).await?;
/// let keys = vec!["m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab01".to_owned()];
/// let present_blocks = master.leading_run(&keys).await?;
/// # let _ = present_blocks; Ok(()) }
/// ```
#[derive(Clone)]
pub struct MasterClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MasterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterClient")
            .field("addr", &self.inner.addr)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl MasterClient {
    /// Connects to the master at `addr` (`host:port`, e.g. `127.0.0.1:50051`). Must
    /// run inside a tokio runtime, which then hosts the connection's tasks.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] for an unusable `config`;
    /// [`MasterError::Connect`] when the first connect fails (later failures are
    /// retried in the background instead).
    #[tracing::instrument(level = "debug", skip(config), fields(addr = %addr.as_ref()))]
    pub async fn connect(addr: impl AsRef<str>, config: MasterConfig) -> Result<Self, MasterError> {
        config.validate()?;
        let inner = Arc::new(Inner {
            addr: addr.as_ref().to_owned(),
            next_seq: AtomicU32::new(1),
            next_conn_id: AtomicU64::new(1),
            link: Mutex::new(Link::Down {
                retry_at: Instant::now(),
                backoff: config.backoff_min,
                connecting: true,
                last_error: "not connected yet".to_owned(),
            }),
            counters: Arc::default(),
            config,
        });
        let conn = open(&inner).await?;
        *lock(&inner.link) = Link::Up(conn);
        Ok(Self { inner })
    }

    /// The master's address as given to [`connect`](Self::connect).
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &MasterConfig {
        &self.inner.config
    }

    /// Whether a connection is up right now (a call may still find it broken).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        matches!(&*lock(&self.inner.link), Link::Up(_))
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> MasterStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MasterStats {
            requests: get(&c.requests),
            batch_exist_calls: get(&c.batch_exist_calls),
            keys_asked: get(&c.keys_asked),
            replies: get(&c.replies),
            late_replies: get(&c.late_replies),
            timeouts: get(&c.timeouts),
            failed_fast: get(&c.failed_fast),
            connects: get(&c.connects),
            connect_failures: get(&c.connect_failures),
            connections_lost: get(&c.connections_lost),
            signature_fallbacks: get(&c.signature_fallbacks),
        }
    }

    /// `ServiceReady`: whether the master serves (in HA mode only the leader does).
    /// Returns the master's version string (`"2.0.0"` from PyPI 0.3.13.post1).
    ///
    /// # Errors
    /// Connection errors ([`MasterError::Unavailable`], [`MasterError::ConnectionLost`],
    /// [`MasterError::Timeout`]); [`MasterError::Store`] when the master answers with
    /// an `ErrorCode`; peer errors for a bad reply.
    pub async fn service_ready(&self) -> Result<String, MasterError> {
        let function = FunctionId::SERVICE_READY;
        let conn = self.conn()?;
        let seq = self.next_seq();
        let mut frame = Vec::with_capacity(codec::REQUEST_HEADER_LEN);
        codec::encode_service_ready(&mut frame, seq);
        let reply = self.roundtrip(&conn, function, seq, frame).await?;
        let body = check(function, reply)?;
        codec::decode_service_ready_reply(&body)
            .map_err(|source| MasterError::MalformedReply { function, source })?
            .map_err(|code| MasterError::Store {
                code,
                key_index: None,
            })
    }

    /// `ExistKey`: whether one key has a complete replica. Like every positive
    /// existence answer, a `true` grants the object a read lease on the master.
    ///
    /// # Errors
    /// As [`batch_exist`](Self::batch_exist).
    pub async fn exist(&self, key: &str) -> Result<bool, MasterError> {
        let function = FunctionId::EXIST_KEY;
        let tenant = self.inner.config.tenant_id.as_str();
        let literal = self.inner.config.type_literal;
        let reply = self
            .call_with_fallback(function, |out, seq, legacy| {
                codec::encode_exist_key(out, seq, key, (!legacy).then_some(tenant), literal)
            })
            .await?;
        codec::decode_exist_key_reply(&reply)
            .map_err(|source| MasterError::MalformedReply { function, source })?
            .map_err(|code| MasterError::Store {
                code,
                key_index: Some(0),
            })
    }

    /// `BatchExistKey` over every key: each key's answer, in order, as the master
    /// gave it (`Err` with its `ErrorCode` for keys it could not answer). Chunks of
    /// [`MasterConfig::chunk_keys`] keys are pipelined on the connection at once.
    ///
    /// # Errors
    /// Connection errors ([`MasterError::Unavailable`], [`MasterError::ConnectionLost`],
    /// [`MasterError::Timeout`]); peer errors ([`MasterError::MalformedReply`],
    /// [`MasterError::AnswerCount`], [`MasterError::InvalidArguments`],
    /// [`MasterError::FunctionNotRegistered`], [`MasterError::Rpc`]). One failed chunk
    /// fails the whole call.
    #[tracing::instrument(level = "debug", skip_all, fields(keys = keys.len()))]
    pub async fn batch_exist_results<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
    ) -> Result<Vec<ExistResult>, MasterError> {
        let calls = keys
            .chunks(self.inner.config.chunk_keys)
            .map(|chunk| self.batch_exist_chunk(chunk));
        let answers = futures::future::try_join_all(calls).await?;
        Ok(answers.into_iter().flatten().collect())
    }

    /// `BatchExistKey` over every key: whether each has a complete replica, in order.
    ///
    /// # Errors
    /// As [`batch_exist_results`](Self::batch_exist_results), and
    /// [`MasterError::Store`] (with the key's index) when the master answered some key
    /// with an `ErrorCode`.
    pub async fn batch_exist<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
    ) -> Result<Vec<bool>, MasterError> {
        self.batch_exist_results(keys)
            .await?
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.map_err(|code| MasterError::Store {
                    code,
                    key_index: Some(i),
                })
            })
            .collect()
    }

    /// The number of leading keys that exist: the run ends at the first key the
    /// master answers `false`. Chunks are asked one after another and the call stops
    /// after the first chunk that holds a missing key.
    ///
    /// # Errors
    /// As [`batch_exist_results`](Self::batch_exist_results), and
    /// [`MasterError::Store`] when the key that would end the run was answered with an
    /// `ErrorCode` (its `key_index` is then the number of keys known present, the
    /// answer vLLM's worker would give, since it counts only `1`s).
    pub async fn leading_run<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
    ) -> Result<usize, MasterError> {
        self.leading_blocks_flat(keys, 1).await
    }

    /// The number of leading blocks whose every key exists, for blocks stored under
    /// several rank namespaces (`spec/wire.md`, "What the server computes", steps 2-3):
    /// `blocks[i]` holds block `i`'s keys, one per namespace. Whole blocks are packed
    /// into calls of at most [`MasterConfig::chunk_keys`] keys (a larger block goes
    /// alone), asked one call after another, stopping at the first call that ends the
    /// run. A block without keys counts as absent.
    ///
    /// # Errors
    /// As [`leading_run`](Self::leading_run); `key_index` counts keys block-major.
    pub async fn leading_blocks<B, K>(&self, blocks: &[B]) -> Result<usize, MasterError>
    where
        B: AsRef<[K]> + Sync,
        K: AsRef<str> + Sync,
    {
        self.leading_blocks_by(blocks.len(), |i| blocks[i].as_ref())
            .await
    }

    /// As [`leading_blocks`](Self::leading_blocks) for keys laid out block-major in
    /// one list: block `i` is `keys[i * keys_per_block..(i + 1) * keys_per_block]`
    /// (a shorter tail counts as a block whose missing keys are absent).
    ///
    /// # Errors
    /// As [`leading_blocks`](Self::leading_blocks);
    /// [`MasterError::InvalidConfig`] for `keys_per_block == 0`.
    #[tracing::instrument(level = "debug", skip_all, fields(keys = keys.len(), keys_per_block))]
    pub async fn leading_blocks_flat<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        keys_per_block: usize,
    ) -> Result<usize, MasterError> {
        if keys_per_block == 0 {
            return Err(MasterError::InvalidConfig {
                what: "keys_per_block",
                why: "must be at least 1".to_owned(),
            });
        }
        let full = keys.len() / keys_per_block;
        let run = self
            .leading_blocks_by(full, |i| {
                &keys[i * keys_per_block..(i + 1) * keys_per_block]
            })
            .await?;
        Ok(run)
    }

    /// Sends `body` (already struct_pack-encoded arguments) to function `function`
    /// and returns the reply body undecoded. For functions this crate does not model,
    /// and for checking how a master handles calls it does not know.
    ///
    /// # Errors
    /// Connection errors; [`MasterError::InvalidArguments`] (`err_code` 4),
    /// [`MasterError::FunctionNotRegistered`] (11), [`MasterError::Rpc`] (others);
    /// [`MasterError::Encode`] for a body over 4 GiB.
    pub async fn call_raw(
        &self,
        function: FunctionId,
        body: &[u8],
    ) -> Result<Vec<u8>, MasterError> {
        let conn = self.conn()?;
        let seq = self.next_seq();
        let mut frame = Vec::with_capacity(codec::REQUEST_HEADER_LEN + body.len());
        codec::encode_raw(&mut frame, seq, function, body).map_err(MasterError::Encode)?;
        let reply = self.roundtrip(&conn, function, seq, frame).await?;
        check(function, reply)
    }

    // -----------------------------------------------------------------------------

    async fn leading_blocks_by<'k, K, F>(
        &self,
        blocks: usize,
        block: F,
    ) -> Result<usize, MasterError>
    where
        K: AsRef<str> + Sync + 'k,
        F: Fn(usize) -> &'k [K] + Sync,
    {
        let chunk_keys = self.inner.config.chunk_keys;
        let mut present = 0;
        let mut keys_before = 0;
        let mut start = 0;
        while start < blocks {
            let mut end = start;
            let mut total = 0;
            while end < blocks {
                let len = block(end).len();
                if end > start && total + len > chunk_keys {
                    break;
                }
                total += len;
                end += 1;
            }
            let keys: Vec<&str> = (start..end)
                .flat_map(|i| block(i).iter().map(AsRef::as_ref))
                .collect();
            let answers = self.batch_exist_chunk(&keys).await?;
            let mut offset = 0;
            for i in start..end {
                let len = block(i).len();
                let answers = &answers[offset..offset + len];
                if answers.is_empty() || answers.contains(&Ok(false)) {
                    return Ok(present);
                }
                if let Some(j) = answers.iter().position(Result::is_err) {
                    let code = answers[j].err().unwrap_or(StoreErrorCode::INTERNAL_ERROR);
                    return Err(MasterError::Store {
                        code,
                        key_index: Some(keys_before + offset + j),
                    });
                }
                present += 1;
                offset += len;
            }
            keys_before += total;
            start = end;
        }
        Ok(present)
    }

    /// One `BatchExistKey` call; exactly one answer per key or an error.
    async fn batch_exist_chunk<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
    ) -> Result<Vec<ExistResult>, MasterError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let function = FunctionId::BATCH_EXIST_KEY;
        let tenant = self.inner.config.tenant_id.as_str();
        let literal = self.inner.config.type_literal;
        let counters = &self.inner.counters;
        let reply = self
            .call_with_fallback(function, |out, seq, legacy| {
                bump(&counters.batch_exist_calls, 1);
                bump(&counters.keys_asked, keys.len() as u64);
                codec::encode_batch_exist_key(out, seq, keys, (!legacy).then_some(tenant), literal)
            })
            .await?;
        let answers = codec::decode_batch_exist_key_reply(&reply)
            .map_err(|source| MasterError::MalformedReply { function, source })?;
        if answers.len() != keys.len() {
            return Err(MasterError::AnswerCount {
                expected: keys.len(),
                got: answers.len(),
            });
        }
        Ok(answers)
    }

    /// Calls a function that gained a `tenant_id` argument in 0.3.12: first in the
    /// signature this connection is known to accept; on `err_code` 4 to the new
    /// signature, once more in the old one, remembered for the connection when that
    /// works. `encode(out, seq, legacy)` appends the frame.
    async fn call_with_fallback(
        &self,
        function: FunctionId,
        encode: impl Fn(&mut Vec<u8>, u32, bool) -> Result<(), CodecError>,
    ) -> Result<Vec<u8>, MasterError> {
        let conn = self.conn()?;
        let legacy = conn.legacy_signatures.load(Ordering::Relaxed);
        let mut reply = self
            .encoded_roundtrip(&conn, function, legacy, &encode)
            .await?;
        if reply.header.err_code == ERR_INVALID_ARGUMENTS && !legacy {
            let retry = self
                .encoded_roundtrip(&conn, function, true, &encode)
                .await?;
            if retry.header.err_code == 0 && !conn.legacy_signatures.swap(true, Ordering::Relaxed) {
                bump(&self.inner.counters.signature_fallbacks, 1);
                tracing::info!(addr = %self.inner.addr, "master takes no tenant_id: using the pre-0.3.12 signatures on this connection");
            }
            reply = retry;
        }
        check(function, reply)
    }

    async fn encoded_roundtrip(
        &self,
        conn: &Arc<Conn>,
        function: FunctionId,
        legacy: bool,
        encode: &impl Fn(&mut Vec<u8>, u32, bool) -> Result<(), CodecError>,
    ) -> Result<RawReply, MasterError> {
        let seq = self.next_seq();
        let mut frame = Vec::new();
        encode(&mut frame, seq, legacy).map_err(MasterError::Encode)?;
        self.roundtrip(conn, function, seq, frame).await
    }

    fn next_seq(&self) -> u32 {
        self.inner.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The live connection, or a fast failure that may start a reconnect attempt.
    fn conn(&self) -> Result<Arc<Conn>, MasterError> {
        let mut link = lock(&self.inner.link);
        match &mut *link {
            Link::Up(conn) => Ok(conn.clone()),
            Link::Down {
                retry_at,
                connecting,
                last_error,
                ..
            } => {
                if !*connecting && Instant::now() >= *retry_at {
                    *connecting = true;
                    tokio::spawn(reconnect(self.inner.clone()));
                }
                bump(&self.inner.counters.failed_fast, 1);
                Err(MasterError::Unavailable {
                    addr: self.inner.addr.clone(),
                    last_error: last_error.clone(),
                })
            }
        }
    }

    async fn roundtrip(
        &self,
        conn: &Arc<Conn>,
        function: FunctionId,
        seq: u32,
        frame: Vec<u8>,
    ) -> Result<RawReply, MasterError> {
        let lost = |reason: &str| MasterError::ConnectionLost {
            addr: self.inner.addr.clone(),
            reason: reason.to_owned(),
        };
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&conn.pending);
            if let Some(reason) = &pending.closed {
                return Err(lost(reason));
            }
            pending.waiters.insert(seq, tx);
        }
        // Removes the slot however this call ends (reply, timeout, or the caller
        // dropping the future), so a late reply finds no one and is counted.
        let _slot = SlotGuard { conn, seq };
        if conn.frames.send(frame).is_err() {
            return Err(lost("writer stopped"));
        }
        bump(&self.inner.counters.requests, 1);
        match tokio::time::timeout(self.inner.config.call_timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(lost("connection closed")),
            Err(_) => {
                bump(&self.inner.counters.timeouts, 1);
                Err(MasterError::Timeout {
                    function,
                    after: self.inner.config.call_timeout,
                })
            }
        }
    }
}

struct SlotGuard<'a> {
    conn: &'a Conn,
    seq: u32,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        lock(&self.conn.pending).waiters.remove(&self.seq);
    }
}

/// The reply's body when `err_code` is 0, the typed RPC failure otherwise.
fn check(function: FunctionId, reply: RawReply) -> Result<Vec<u8>, MasterError> {
    let err_code = reply.header.err_code;
    if err_code == 0 {
        return Ok(reply.body);
    }
    let (code, message) = match codec::decode_error_reply(err_code, &reply.body) {
        Ok(e) => (e.code, e.message),
        Err(e) => (u16::from(err_code), format!("(undecodable message: {e})")),
    };
    Err(match err_code {
        ERR_INVALID_ARGUMENTS => MasterError::InvalidArguments { function, message },
        ERR_FUNCTION_NOT_REGISTERED => MasterError::FunctionNotRegistered { function, message },
        _ => MasterError::Rpc {
            function,
            code,
            message,
        },
    })
}

/// Connects and starts the connection's reader and writer tasks.
async fn open(inner: &Arc<Inner>) -> Result<Arc<Conn>, MasterError> {
    let connect_error = |source: std::io::Error| {
        bump(&inner.counters.connect_failures, 1);
        MasterError::Connect {
            addr: inner.addr.clone(),
            source: Arc::new(source),
        }
    };
    let stream = match tokio::time::timeout(
        inner.config.connect_timeout,
        TcpStream::connect(inner.addr.as_str()),
    )
    .await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(connect_error(e)),
        Err(_) => {
            return Err(connect_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {:?}", inner.config.connect_timeout),
            )));
        }
    };
    // Small requests must leave at once (Nagle would hold them for the previous
    // reply's ACK); closing with a request unanswered must not linger.
    stream.set_nodelay(true).map_err(connect_error)?;
    stream.set_zero_linger().map_err(connect_error)?;
    let (read, write) = stream.into_split();
    let (frames, queue) = mpsc::unbounded_channel();
    let conn = Arc::new(Conn {
        id: inner.next_conn_id.fetch_add(1, Ordering::Relaxed),
        frames,
        pending: Mutex::new(Pending::default()),
        legacy_signatures: AtomicBool::new(false),
        shutdown: CancellationToken::new(),
    });
    bump(&inner.counters.connects, 1);
    tracing::debug!(addr = %inner.addr, conn = conn.id, "connected to the Mooncake master");
    let weak = Arc::downgrade(inner);
    tokio::spawn(read_loop(
        weak.clone(),
        inner.counters.clone(),
        conn.clone(),
        read,
        inner.config.max_reply_bytes,
    ));
    tokio::spawn(write_loop(weak, conn.clone(), write, queue));
    Ok(conn)
}

/// One reconnect attempt; on failure the next waits for the doubled backoff.
async fn reconnect(inner: Arc<Inner>) {
    let result = open(&inner).await;
    let mut link = lock(&inner.link);
    match result {
        Ok(conn) => {
            tracing::info!(addr = %inner.addr, conn = conn.id, "reconnected to the Mooncake master");
            *link = Link::Up(conn);
        }
        Err(e) => {
            if let Link::Down {
                retry_at,
                backoff,
                connecting,
                last_error,
            } = &mut *link
            {
                *connecting = false;
                *retry_at = Instant::now() + *backoff;
                *backoff = (*backoff * 2).min(inner.config.backoff_max);
                *last_error = e.to_string();
            }
        }
    }
}

/// Marks `conn` broken: fails its waiting calls, and if it is still the client's
/// connection, replaces it by a pending reconnect (started at once).
fn fail(weak: &Weak<Inner>, conn: &Conn, reason: String) {
    conn.shutdown.cancel();
    let waiters = {
        let mut pending = lock(&conn.pending);
        if pending.closed.is_some() {
            return;
        }
        pending.closed = Some(reason.clone());
        std::mem::take(&mut pending.waiters)
    };
    let Some(inner) = weak.upgrade() else { return };
    tracing::warn!(addr = %inner.addr, conn = conn.id, %reason, "connection to the Mooncake master lost");
    bump(&inner.counters.connections_lost, 1);
    for (_, waiter) in waiters {
        let _ = waiter.send(Err(MasterError::ConnectionLost {
            addr: inner.addr.clone(),
            reason: reason.clone(),
        }));
    }
    let mut link = lock(&inner.link);
    if matches!(&*link, Link::Up(current) if current.id == conn.id) {
        *link = Link::Down {
            retry_at: Instant::now(),
            backoff: inner.config.backoff_min,
            connecting: true,
            last_error: reason,
        };
        tokio::spawn(reconnect(inner.clone()));
    }
}

async fn read_loop(
    weak: Weak<Inner>,
    counters: Arc<Counters>,
    conn: Arc<Conn>,
    mut read: OwnedReadHalf,
    max_reply_bytes: u32,
) {
    let reason = tokio::select! {
        () = conn.shutdown.cancelled() => return,
        reason = read_replies(&counters, &conn, &mut read, max_reply_bytes) => reason,
    };
    fail(&weak, &conn, reason);
}

/// Reads replies until the stream fails; returns why it stopped.
async fn read_replies(
    counters: &Counters,
    conn: &Conn,
    read: &mut OwnedReadHalf,
    max_reply_bytes: u32,
) -> String {
    let mut head = [0u8; REPLY_HEADER_LEN];
    loop {
        if let Err(e) = read.read_exact(&mut head).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "closed by the master".to_owned()
            } else {
                format!("read failed: {e}")
            };
        }
        let header = match ReplyHeader::decode(&head) {
            Ok(header) => header,
            Err(e) => return format!("protocol violation: {e}"),
        };
        if header.payload_len() > u64::from(max_reply_bytes) {
            return format!(
                "protocol violation: a reply of {} bytes (limit {max_reply_bytes})",
                header.payload_len()
            );
        }
        let mut body = vec![0; header.body_length as usize];
        if let Err(e) = read.read_exact(&mut body).await {
            return format!("read failed inside a reply: {e}");
        }
        if header.attach_length > 0 {
            // No existence call has an attachment; read past it to stay in step.
            let mut attachment = vec![0; header.attach_length as usize];
            if let Err(e) = read.read_exact(&mut attachment).await {
                return format!("read failed inside a reply: {e}");
            }
        }
        let waiter = lock(&conn.pending).waiters.remove(&header.seq_num);
        let delivered = waiter.is_some_and(|w| w.send(Ok(RawReply { header, body })).is_ok());
        bump(
            if delivered {
                &counters.replies
            } else {
                &counters.late_replies
            },
            1,
        );
    }
}

async fn write_loop(
    weak: Weak<Inner>,
    conn: Arc<Conn>,
    mut write: OwnedWriteHalf,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let reason = tokio::select! {
        () = conn.shutdown.cancelled() => return,
        reason = write_frames(&mut write, &mut queue) => reason,
    };
    fail(&weak, &conn, reason);
}

/// Writes queued frames, coalescing those already waiting into one write.
async fn write_frames(
    write: &mut OwnedWriteHalf,
    queue: &mut mpsc::UnboundedReceiver<Vec<u8>>,
) -> String {
    const COALESCE_BYTES: usize = 256 << 10;
    while let Some(mut frame) = queue.recv().await {
        while frame.len() < COALESCE_BYTES {
            match queue.try_recv() {
                Ok(next) => frame.extend_from_slice(&next),
                Err(_) => break,
            }
        }
        if let Err(e) = write.write_all(&frame).await {
            return format!("write failed: {e}");
        }
    }
    "writer queue closed".to_owned()
}
