//! The tokio client: one pipelined TCP connection to the master, reconnected with
//! backoff (`spec/mooncake-master-rpc.md`, "Transport").
//!
//! Shape: callers encode their request, register a one-shot slot under a fresh
//! sequence number and hand the frame to the connection's writer task; the reader task
//! matches each reply to its slot by sequence number. A connection that breaks fails
//! every waiting call at once and is replaced in the background; calls made while it
//! is down fail fast with [`MasterError::Unavailable`] and start the next attempt when
//! the backoff allows.
//!
//! With an `etcd://` address the connection goes to the leader etcd names, and moves
//! when a newer leader is elected (`spec/mooncake-master-rpc.md`, "High
//! availability"); nothing on the call path changes: a call takes the live
//! connection or fails fast.
//!
//! Submodules: `config` ([`MasterConfig`]), `stats` ([`MasterStats`] and the shared
//! counters), `conn` (one connection, its reader and writer tasks, the call path),
//! `leader` (following the leader through etcd), `streak` (rule 17: a connection on which calls
//! time out in a row is replaced, counted per call).

mod config;
mod conn;
mod leader;
mod stats;
mod streak;

use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

pub use config::{DEFAULT_REOPEN_AFTER_TIMEOUTS, MasterConfig};
use conn::{Link, State, check, open};
use leader::Follow;
pub use stats::MasterStats;
use stats::{Counters, bump};

use crate::addr::{LeaderState, MasterAddr, MasterView};
use crate::codec::{self, ExistResult, FunctionId};
use crate::{MasterError, StoreErrorCode};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every await-free step, so a
    // panic elsewhere never leaves it half-updated.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Inner {
    addr: MasterAddr,
    /// `addr` as text, for errors and logs.
    addr_text: String,
    config: MasterConfig,
    next_seq: AtomicU32,
    next_conn_id: AtomicU64,
    /// Rule 17's count ([`MasterConfig::reopen_after_timeouts`], changeable).
    reopen_after: AtomicU32,
    /// `RemoveAll` calls of this client started plus those ended: odd while one runs.
    wipes: AtomicU64,
    /// The signatures the last connection settled on (pre-0.3.12 when set): where
    /// the next connection starts.
    legacy_hint: std::sync::atomic::AtomicBool,
    state: Mutex<State>,
    counters: Arc<Counters>,
    /// The leader follower, for an `etcd://` address.
    follow: Option<Arc<Follow>>,
    /// The leader in use (`None` for a fixed address) and the changes so far.
    views: watch::Sender<LeaderState>,
}

impl Inner {
    /// A call failed: the follower (if any) reads the view sooner.
    fn trouble(&self, now: bool) {
        if let Some(follow) = &self.follow {
            follow.trouble(now);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Link::Up(conn) = &lock(&self.state).link {
            conn.shutdown.cancel();
        }
        if let Some(follow) = &self.follow {
            follow.shutdown.cancel();
        }
    }
}

/// One epoch of a client's view of the store: a connection (a reconnect, a leader
/// change, a master restarted behind the same address each make a new one), and this
/// client's own `RemoveAll` calls on it. What was learned in one epoch (the presence
/// cache, the read lease) is not trusted in another ([`MasterClient::epoch`]).
///
/// Epochs are ordered by time: each field only grows, so a later epoch of one client
/// compares greater (field by field, in the order below), and an epoch read before
/// another never compares above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch {
    /// The connection's id (1 for the first, growing by one per connection).
    pub connection: u64,
    /// Leader changes seen so far (0 for a fixed address).
    pub leader_changes: u64,
    /// This client's `RemoveAll` calls started plus those ended (odd while one runs).
    pub wipes: u64,
}

impl Epoch {
    /// The part that names the master answering (connection and leader), without
    /// this client's wipes: what the read lease belongs to.
    #[must_use]
    pub const fn master(self) -> (u64, u64) {
        (self.connection, self.leader_changes)
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
            .field("addr", &self.inner.addr_text)
            .field("leader", &self.inner.views.borrow().view)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl MasterClient {
    /// Connects to the master at `addr`: `host:port` (e.g. `127.0.0.1:50051`), or
    /// `etcd://h1:p1;h2:p2` to follow the leader of a high-availability cluster whose
    /// id is [`MasterConfig::cluster_id`], else `$MC_STORE_CLUSTER_ID`, else
    /// `mooncake_cluster` ([`MasterAddr::parse`]). Must run inside a tokio runtime,
    /// which then hosts the connection's tasks.
    ///
    /// # Errors
    /// As [`connect_to`](Self::connect_to), and [`MasterError::InvalidAddress`] for
    /// an address that does not parse.
    pub async fn connect(addr: impl AsRef<str>, config: MasterConfig) -> Result<Self, MasterError> {
        let addr = MasterAddr::parse(addr.as_ref(), config.cluster_id.as_deref())?;
        Self::connect_to(addr, config).await
    }

    /// Connects to the master at `addr`. For [`MasterAddr::Etcd`] it reads the
    /// leader's view first, connects to the leader, and starts a task that follows
    /// later elections (`spec/mooncake-master-rpc.md`, "High availability").
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] for an unusable `config`;
    /// [`MasterError::Discovery`] when no etcd endpoint answers the view;
    /// [`MasterError::Unavailable`] when no leader is elected;
    /// [`MasterError::Connect`] when the first connect fails (later failures are
    /// retried in the background instead).
    #[tracing::instrument(level = "debug", skip(config), fields(addr = %addr))]
    pub async fn connect_to(addr: MasterAddr, config: MasterConfig) -> Result<Self, MasterError> {
        config.validate()?;
        let counters = Arc::<Counters>::default();
        let addr_text = addr.to_string();
        let (target, view, follow) = match &addr {
            MasterAddr::Fixed(endpoint) => (endpoint.clone(), None, None),
            MasterAddr::Etcd(cluster) => {
                let follow = Follow::new(cluster, &config);
                let view = follow.gateway.read_view().await.map_err(|reason| {
                    bump(&counters.view_read_failures, 1);
                    MasterError::Discovery {
                        addr: addr_text.clone(),
                        reason,
                    }
                })?;
                bump(&counters.view_reads, 1);
                let Some(view) = view else {
                    return Err(MasterError::Unavailable {
                        addr: addr_text,
                        last_error: follow.no_leader(),
                    });
                };
                (view.leader.clone(), Some(view), Some(Arc::new(follow)))
            }
        };
        let inner = Arc::new(Inner {
            addr_text,
            next_seq: AtomicU32::new(1),
            next_conn_id: AtomicU64::new(1),
            reopen_after: AtomicU32::new(config.reopen_after_timeouts),
            wipes: AtomicU64::new(0),
            legacy_hint: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(State {
                link: Link::Down {
                    retry_at: Instant::now(),
                    backoff: config.backoff_min,
                    connecting: true,
                    last_error: "not connected yet".to_owned(),
                },
                target: Some(target.clone()),
                version: view.as_ref().map_or(0, |v| v.version),
            }),
            counters,
            follow,
            views: watch::Sender::new(LeaderState { view, changes: 0 }),
            addr,
            config,
        });
        let conn = open(&inner, &target).await?;
        lock(&inner.state).link = Link::Up(conn);
        if let Some(follow) = &inner.follow {
            tokio::spawn(leader::follow(Arc::downgrade(&inner), follow.clone()));
        }
        Ok(Self { inner })
    }

    /// The master's address as given to [`connect`](Self::connect) (for `etcd://`,
    /// the etcd endpoints; [`leader`](Self::leader) names the master).
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.inner.addr_text
    }

    /// The master's address, parsed.
    #[must_use]
    pub fn master_addr(&self) -> &MasterAddr {
        &self.inner.addr
    }

    /// The leader in use for an `etcd://` address (its endpoint and view version);
    /// `None` for a fixed address.
    #[must_use]
    pub fn leader(&self) -> Option<MasterView> {
        self.inner.views.borrow().view.clone()
    }

    /// A receiver that sees every leader change (the hook for a metric or a log):
    /// it holds [`leader`](Self::leader) and the number of changes so far, and is
    /// marked changed at each switch to a newer leader. For a fixed address it holds
    /// no view and never changes. Its `changed()` ends with an error once every
    /// handle of this client is dropped.
    #[must_use]
    pub fn subscribe_leader(&self) -> watch::Receiver<LeaderState> {
        self.inner.views.subscribe()
    }

    /// Leader changes so far (0 for a fixed address): what
    /// [`subscribe_leader`](Self::subscribe_leader) reports, read without subscribing.
    #[must_use]
    pub fn leader_changes(&self) -> u64 {
        self.inner.views.borrow().changes
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &MasterConfig {
        &self.inner.config
    }

    /// Whether a connection is up right now (a call may still find it broken).
    #[must_use]
    pub fn is_connected(&self) -> bool {
        matches!(&lock(&self.inner.state).link, Link::Up(_))
    }

    /// The epoch now ([`Epoch`]): the live connection with the leader changes and
    /// this client's `RemoveAll` calls so far; `None` while no connection is up.
    #[must_use]
    pub fn epoch(&self) -> Option<Epoch> {
        let state = lock(&self.inner.state);
        let Link::Up(conn) = &state.link else {
            return None;
        };
        Some(Epoch {
            connection: conn.id,
            leader_changes: self.inner.views.borrow().changes,
            wipes: self.inner.wipes.load(std::sync::atomic::Ordering::SeqCst),
        })
    }

    /// Drops the live connection, failing its waiting calls with
    /// [`MasterError::ConnectionLost`] carrying `reason`, and connects again in the
    /// background (rule 17: a connection on which calls keep timing out is replaced,
    /// not kept until the kernel drops it). A new epoch begins. No-op while no
    /// connection is up.
    pub fn reconnect(&self, reason: &str) {
        if let Some(connection) = self.connection_id() {
            self.replace_connection(connection, reason);
        }
    }

    /// Bytes of requests queued for the live connection and not yet handed to its
    /// socket (at most [`MasterConfig::max_queued_bytes`] but for one larger request);
    /// 0 while no connection is up.
    #[must_use]
    pub fn queued_bytes(&self) -> usize {
        match &lock(&self.inner.state).link {
            Link::Up(conn) => conn.queued_bytes(),
            Link::Down { .. } => 0,
        }
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> MasterStats {
        self.inner.counters.snapshot()
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
        self.leading_blocks_by(blocks.len(), |i| blocks[i].as_ref(), &mut 0)
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
        self.leading_blocks_flat_counted(keys, keys_per_block)
            .await
            .0
    }

    /// As [`leading_blocks_flat`](Self::leading_blocks_flat), also returning how many
    /// keys were asked of the master in this call (every chunk handed to the
    /// connection, up to the one
    /// that ended the run or failed): fewer than `keys.len()` when the run ends
    /// early, and never a key past the chunk that ended it. The count is this call's
    /// own, where [`MasterStats::keys_asked`] sums every call of the client.
    ///
    /// # Errors
    /// As [`leading_blocks_flat`](Self::leading_blocks_flat); the count is returned
    /// beside the error too.
    pub async fn leading_blocks_flat_counted<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        keys_per_block: usize,
    ) -> (Result<usize, MasterError>, usize) {
        if keys_per_block == 0 {
            let error = MasterError::InvalidConfig {
                what: "keys_per_block",
                why: "must be at least 1".to_owned(),
            };
            return (Err(error), 0);
        }
        let full = keys.len() / keys_per_block;
        let mut asked = 0;
        let run = self
            .leading_blocks_by(
                full,
                |i| &keys[i * keys_per_block..(i + 1) * keys_per_block],
                &mut asked,
            )
            .await;
        (run, asked)
    }

    /// `RemoveAll`: removes every object of the tenant ([`MasterConfig::tenant_id`])
    /// from the store, whichever client wrote it, and returns how many were removed
    /// (`spec/mooncake-master-rpc.md`, "Removing everything"). With `force` objects
    /// holding a read lease go too (every positive existence answer grants one); what
    /// vLLM's reset calls through the store (`remove_all(force=True)`). Without it,
    /// leased objects stay. Tenant-wide: every engine sharing the store loses its
    /// cached blocks, not only the caller's.
    ///
    /// The master answers 0 also when it refuses the tenant id (the RPC has no error
    /// result).
    ///
    /// # Errors
    /// Connection errors ([`MasterError::Unavailable`], [`MasterError::ConnectionLost`],
    /// [`MasterError::Timeout`]); RPC refusals; [`MasterError::MalformedReply`].
    ///
    /// The call begins a new [`Epoch`] when it starts and another when it ends, so
    /// that nothing learned before or during it is trusted after it.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn remove_all(&self, force: bool) -> Result<i64, MasterError> {
        struct Wiping<'a>(&'a AtomicU64);
        impl Drop for Wiping<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let function = FunctionId::REMOVE_ALL;
        let tenant = self.inner.config.tenant_id.as_str();
        let literal = self.inner.config.type_literal;
        self.inner
            .wipes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ended = Wiping(&self.inner.wipes);
        let reply = self
            .call_with_fallback(function, |out, seq, legacy| {
                codec::encode_remove_all(out, seq, force, (!legacy).then_some(tenant), literal)
            })
            .await?;
        codec::decode_remove_all_reply(&reply)
            .map_err(|source| MasterError::MalformedReply { function, source })
    }

    /// `GetReplicaList`: one key's replicas and the master's read lease
    /// (`spec/mooncake-master-rpc.md`, "Where the lease can be read"). Like a positive
    /// existence answer, the call grants the object a read lease.
    ///
    /// # Errors
    /// Connection errors and RPC refusals as [`exist`](Self::exist);
    /// [`MasterError::Store`] with `-704` (`OBJECT_NOT_FOUND`) for a key without a
    /// complete replica; [`MasterError::MalformedReply`] for a reply in none of the
    /// layouts read (0.3.10's, 0.3.13's and 0.3.14's:
    /// [`ReplicaListLayout`](codec::ReplicaListLayout)), including a replica kind the
    /// decoder does not read.
    pub async fn get_replica_list(&self, key: &str) -> Result<codec::ReplicaList, MasterError> {
        let function = FunctionId::GET_REPLICA_LIST;
        let tenant = self.inner.config.tenant_id.as_str();
        let literal = self.inner.config.type_literal;
        let reply = self
            .call_with_fallback(function, |out, seq, legacy| {
                codec::encode_get_replica_list(out, seq, key, (!legacy).then_some(tenant), literal)
            })
            .await?;
        codec::decode_get_replica_list_reply(&reply)
            .map_err(|source| MasterError::MalformedReply { function, source })?
            .map_err(|code| MasterError::Store {
                code,
                key_index: Some(0),
            })
    }

    /// The master's read lease (`-default_kv_lease_ttl`) as its `GetReplicaList` reply
    /// for `key` reports it. `key` must exist: the master reports the lease only
    /// beside a key's replicas.
    ///
    /// # Errors
    /// As [`get_replica_list`](Self::get_replica_list).
    pub async fn read_lease(&self, key: &str) -> Result<Duration, MasterError> {
        let list = self.get_replica_list(key).await?;
        Ok(Duration::from_millis(list.lease_ttl_ms))
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
        asked: &mut usize,
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
            *asked += keys.len();
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
    pub(crate) async fn batch_exist_chunk<K: AsRef<str> + Sync>(
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
        // Counted once per call, when it is first encoded for a live connection: a call
        // the master refused for its signature and took in the other asked it about
        // these keys once.
        let first = std::sync::atomic::AtomicBool::new(true);
        let reply = self
            .call_with_fallback(function, |out, seq, legacy| {
                if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                    bump(&counters.batch_exist_calls, 1);
                    bump(&counters.keys_asked, keys.len() as u64);
                }
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
}
