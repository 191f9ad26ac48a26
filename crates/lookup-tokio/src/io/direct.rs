//! The direct transport: the scheduler process asks the Mooncake master itself,
//! skipping the lookup server (DESIGN.md, "Mooncake master client"; the idea behind
//! vllm-ascend #15243).
//!
//! vLLM's scheduler asks a worker over ZeroMQ, and the worker asks the master: two
//! hops. With [`Transport::Direct`] the [`LookupClient`](crate::LookupClient) keeps the
//! same `lookup-core` state machine, handle API, timeouts, fail-open rule, metrics,
//! events and tracing, but its I/O task serves each lookup command itself: it builds
//! the store keys of the blocks in question with the server's [`KeyLayout`], asks the
//! master in one logical `BatchExistKey` query (chunked, stopping at the chunk that ends
//! the leading run: [`MasterClient::leading_blocks_flat`]) and computes the hit with the
//! server's own rules ([`blocks_to_check`], [`hit_tokens`]: `spec/wire.md`, "What the
//! server computes"). Up to `max_in_flight` lookups are pipelined on the master
//! client's one TCP connection.
//!
//! # Batching across lookups
//!
//! Lookups go through the owner of the store's answer, [`MasterLookup`] (the same
//! one the router's `StoreCheck` and lookup-server's index use): those the dispatcher
//! releases in one pass of the I/O task are submitted together and flushed at the end
//! of the pass, so they share `BatchExistKey` calls (the union of their keys, each key
//! once, chunked, with an early stop per lookup); those released while a batch is
//! asking the master wait for it to end, at most `batch.max_wait`. An idle link adds
//! no wait. Each lookup keeps its own answer, deadline (the dispatcher's) and
//! cancellation. With `batch.presence` enabled (the default), keys the master answered
//! present are not asked again while their read lease outlasts the result's TTL; the
//! cache ends with its connection epoch (a reconnect, a leader change, a restarted
//! master) and is dropped on a reset, on a failed call and on a lookup timeout.
//!
//! # Rule 17
//!
//! After [`DirectConfig::reopen_after_timeouts`] master call timeouts in a row the
//! master connection is replaced. The master client counts them, per call and per
//! connection (`mooncake_master`'s `client::streak`), so the count is the same
//! whichever deadline fires first: the call timeout (1 s by default) before
//! `lookup_timeout_s` (vLLM's 5 s), or a lookup timeout shorter than the call's,
//! whose call still ends at its own timeout. The dispatcher counts none of its own.
//!
//! # Lease side effect
//!
//! Every key the master answers `true` gets a read lease for the master's
//! `default_kv_lease_ttl` (10 s by default): the block cannot be evicted or removed
//! until it expires (`spec/mooncake-master-rpc.md`, "The call"). vLLM's worker has the
//! same effect through the C++ client's `batch_is_exist`, so a direct lookup pins the
//! store exactly as a lookup through the worker does, and no more: keys past the
//! chunk that ended the run are never asked about. A result the client keeps for
//! `lookup_prefetch_ttl_s` (2 s by default) is therefore backed by the lease for its
//! whole life as long as the TTL stays below the lease; [`LookupClient::connect`]
//! warns when it does not ([`DirectConfig::lease_ttl`]).
//!
//! # Reset
//!
//! The master's only reset, `RemoveAll` (`spec/mooncake-master-rpc.md`, "Removing
//! everything"), is tenant-wide: it removes every engine's blocks, not only this
//! scheduler's; and a wipe would also have to drain the writers' pending puts, which
//! only the worker that owns the store client can do. A reset (rule 13) is therefore
//! never sent: it ends at once as
//! [`ResetOutcome::Failed`](lookup_core::ResetOutcome::Failed) and every key stays
//! stored, as `lookup_server::MooncakeIndex` answers it through the server.
//!
//! [`LookupClient::connect`]: crate::LookupClient::connect

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_core::{Outgoing, Reply, RpcBody, RpcFailure, RpcId};
use mooncake_master::{
    BatchConfig, ChainAnswer, Coalescer, KeyLayout, LookupConfig, MasterAddr, MasterClient,
    MasterConfig, MasterError, MasterLookup, Unanswered,
};

#[cfg(doc)]
use crate::Transport;
use tracing::{Instrument, Span};

use super::{SendError, Wire, WireInput};
use crate::Error;
use crate::warn::WarnLimiter;

/// The master's default read lease (`default_kv_lease_ttl`, 10 s), granted to every key
/// an existence query answers `true` (`spec/mooncake-master-rpc.md`, "The call").
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Settings of the direct transport ([`Transport::Direct`]): where the master is, how
/// keys are laid out, the master client's settings and the lease. Build with
/// [`DirectConfig::new`] and adjust fields. `#[non_exhaustive]`: later settings are
/// additions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DirectConfig {
    /// The master's RPC address, typed and checked when it was built
    /// ([`MasterAddr::parse`], or `"host:port".parse()`): `host:port`
    /// (`--rpc_address:--rpc_port`; port 50051 by default), or `etcd://h1:p1;h2:p2`
    /// for a high-availability cluster whose leader the master client finds and
    /// follows (its cluster id is resolved when the address is parsed;
    /// `spec/mooncake-master-rpc.md`, "High availability").
    pub master: MasterAddr,
    /// How block hashes become store keys: the same cache prefix, model and rank
    /// namespaces as the workers that write the blocks (`spec/wire.md`, "What the
    /// server computes", step 2). A block counts only when every namespace key exists.
    pub layout: KeyLayout,
    /// The master client's settings: `chunk_keys` (keys per `BatchExistKey` call,
    /// default 1,024), `call_timeout`, `connect_timeout`, `tenant_id`, backoff. Its
    /// `cluster_id` plays no part here: [`master`](Self::master) carries it, and a
    /// different one is refused by [`validate`](Self::validate).
    pub master_config: MasterConfig,
    /// The master's `default_kv_lease_ttl` (read lease per positive answer) until the
    /// master reports its own (read once per connection to it, at the first hit,
    /// [`LookupClient::master_lease`](crate::LookupClient::master_lease)), and when it
    /// cannot. Default 10 s, the master's default. It bounds the presence cache, and a
    /// `lookup_prefetch_ttl_s` not below it is warned about: a cached result older
    /// than the lease may name blocks evicted since.
    pub lease_ttl: Duration,
    /// First wait before trying again when connecting to the master fails, before
    /// the first success; it doubles per failure up to 1 s. Default 10 ms.
    pub connect_backoff: Duration,
    /// Drop the master connection and connect again after this many master call
    /// timeouts in a row (rule 17; given to the master client as
    /// [`MasterConfig::reopen_after_timeouts`], which it overrides): a hung or
    /// half-open master connection is replaced, not kept until the kernel drops it,
    /// and the presence cache and lease learned on it end with it. Counted per call
    /// (one call shared by many lookups is one timeout). 0 never reopens on timeouts.
    /// Default 3, as [`ZmqConfig`](crate::ZmqConfig).
    pub reopen_after_timeouts: u32,
    /// Batching across lookups and the lease-backed presence cache
    /// ([`BatchConfig`]: batching and the cache on by default). Lookups the I/O task
    /// releases in one pass, and those released while a batch is asking the master,
    /// share `BatchExistKey` calls: the union of their keys, each key once, chunked,
    /// with an early stop per lookup; each still gets its own answer, timeout and
    /// cancellation. [`BatchConfig::unbatched`] asks per lookup.
    pub batch: BatchConfig,
}

/// [`DirectConfig::reopen_after_timeouts`]'s default, shared by
/// [`StoreCheckLimits`](crate::StoreCheckLimits) and `ZmqConfig`: the master client's
/// own.
pub(crate) const DEFAULT_REOPEN_AFTER_TIMEOUTS: u32 =
    mooncake_master::DEFAULT_REOPEN_AFTER_TIMEOUTS;

impl DirectConfig {
    /// The master at `master`, keys laid out by `layout`, the master client's
    /// defaults, the master's default lease of 10 s and a connect backoff of 10 ms.
    #[must_use]
    pub fn new(master: MasterAddr, layout: KeyLayout) -> Self {
        Self {
            master,
            layout,
            master_config: MasterConfig::default(),
            lease_ttl: DEFAULT_LEASE_TTL,
            connect_backoff: Duration::from_millis(10),
            reopen_after_timeouts: DEFAULT_REOPEN_AFTER_TIMEOUTS,
            batch: BatchConfig::default(),
        }
    }

    /// As [`new`](Self::new) with the address as text (`host:port` or
    /// `etcd://h1:p1;h2:p2`, cluster id from `$MC_STORE_CLUSTER_ID` or
    /// `mooncake_cluster`).
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] with key `master` and the parser's reason, for
    /// an address that does not parse (`"not-a-host"`: no port).
    pub fn parse(master: &str, layout: KeyLayout) -> Result<Self, Error> {
        let master = MasterAddr::parse(master, None).map_err(|e| Error::InvalidClientConfig {
            key: "master",
            why: e.to_string(),
        })?;
        Ok(Self::new(master, layout))
    }

    /// Checks the settings the master client would refuse only once connecting, so
    /// that the mistake is an error of `connect`, not a stream of failed lookups.
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] naming the field: whatever
    /// [`MasterConfig::validate`] refuses in `master_config` (as
    /// `master_config.<field>`); whatever [`BatchConfig::validate`] refuses in
    /// `batch`; a `master_config.cluster_id` that differs from the cluster id of an
    /// `etcd://` [`master`](Self::master) (the address's is the one used). (The
    /// address was checked when it was parsed.)
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key: &'static str, why: &str| {
            Err(Error::InvalidClientConfig {
                key,
                why: why.to_owned(),
            })
        };
        let m = &self.master_config;
        if let Err(MasterError::InvalidConfig { what, why }) = m.validate() {
            return bad(master_config_key(what), &why);
        }
        if let (Some(id), MasterAddr::Etcd(cluster)) = (&m.cluster_id, &self.master) {
            if id != cluster.cluster_id() {
                return bad(
                    "master_config.cluster_id",
                    &format!(
                        "{id} differs from the address's cluster id {}: give it with the \
                         address (MasterAddr::parse(addr, Some(id)))",
                        cluster.cluster_id()
                    ),
                );
            }
        }
        if let Err(MasterError::InvalidConfig { what, why }) = self.batch.validate() {
            return bad(what, &why);
        }
        Ok(())
    }

    /// Whether a result TTL of `ttl` outlives the read lease (see
    /// [`lease_ttl`](Self::lease_ttl)).
    #[must_use]
    pub fn ttl_outlives_lease(&self, ttl: Duration) -> bool {
        ttl >= self.lease_ttl
    }
}

/// `field` of [`MasterConfig`] as a key of [`DirectConfig`].
fn master_config_key(field: &'static str) -> &'static str {
    match field {
        "chunk_keys" => "master_config.chunk_keys",
        "call_timeout" => "master_config.call_timeout",
        "connect_timeout" => "master_config.connect_timeout",
        "max_queued_bytes" => "master_config.max_queued_bytes",
        "backoff_min" => "master_config.backoff_min",
        "etcd_timeout" => "master_config.etcd_timeout",
        "view_refresh" => "master_config.view_refresh",
        "view_retry" => "master_config.view_retry",
        _ => "master_config",
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<MasterClient, MasterError>> + Send>>;
type Query = Pin<Box<dyn Future<Output = Ended> + Send>>;

/// The state of the master connection.
enum Link {
    /// A connect attempt is under way.
    Connecting(Connecting),
    /// The last attempt failed; the I/O task opens again after its backoff.
    Down,
    /// Connected: the master client reconnects on its own from here on.
    Up,
}

/// One finished master query.
struct Ended {
    rpc_id: RpcId,
    num_tokens: u32,
    blocks: usize,
    span: Span,
    result: Result<usize, MasterError>,
}

/// The direct transport's wire: the master connection and the queries on it, each
/// answering one lookup with the server's rules (`spec/wire.md`).
pub(crate) struct DirectWire {
    direct: DirectConfig,
    /// The master's address as text, for logs.
    name: String,
    block_size: u32,
    keys_per_block: usize,
    link: Link,
    /// Shared with the handle for [`ClientStats::master`](crate::ClientStats::master).
    master: Arc<OnceLock<MasterClient>>,
    /// Shared with the handle for [`LookupClient::batch_stats`](crate::LookupClient::batch_stats).
    batch: Arc<OnceLock<Coalescer>>,
    /// How long a result may be used after its lookup (`lookup_prefetch_ttl_s`): a key
    /// is taken from the presence cache only while its lease outlasts that.
    result_ttl: Duration,
    /// The owner of the store's answer, set once connected.
    lookup: Option<MasterLookup>,
    /// Lookups submitted since the last flush.
    unflushed: bool,
    queries: FuturesUnordered<Query>,
    /// Inputs decided without the master (a refused reset), handed out first.
    ready: VecDeque<WireInput<Reply>>,
    warn: WarnLimiter,
}

impl DirectWire {
    /// A wire that starts connecting to `direct.master` at once; results of its
    /// lookups are used for up to `result_ttl` (`lookup_prefetch_ttl_s`).
    pub(crate) fn new(
        mut direct: DirectConfig,
        block_size: u32,
        result_ttl: Duration,
        master: Arc<OnceLock<MasterClient>>,
        batch: Arc<OnceLock<Coalescer>>,
    ) -> Self {
        let keys_per_block = direct.layout.namespaces().len();
        direct.master_config.reopen_after_timeouts = direct.reopen_after_timeouts;
        let link = Link::Connecting(connect(&direct));
        Self {
            name: direct.master.to_string(),
            direct,
            block_size,
            keys_per_block,
            link,
            master,
            batch,
            result_ttl,
            lookup: None,
            unflushed: false,
            queries: FuturesUnordered::new(),
            ready: VecDeque::new(),
            warn: WarnLimiter::default(),
        }
    }

    /// The master's answer as a lookup reply, or why there is none.
    fn answer(&mut self, ended: Ended) -> WireInput<Reply> {
        let Ended {
            rpc_id,
            num_tokens,
            blocks,
            span,
            result,
        } = ended;
        let now = crate::clock::now();
        let run = match ChainAnswer::of(result, self.keys_per_block) {
            ChainAnswer::Run { blocks, key_error } => {
                // The key that would end the run carries an ErrorCode: every key
                // before it was answered `true`, so the run ends at its block (vLLM
                // counts only 1s).
                if let Some(error) = key_error {
                    self.warn.warn(
                        "key_error",
                        now,
                        format_args!(
                            "the Mooncake master answered a key with an error ({error}); counted as absent"
                        ),
                    );
                }
                blocks
            }
            ChainAnswer::Failed {
                cause: Unanswered::TimedOut,
                ..
            } => {
                return WireInput::Failed {
                    rpc_id,
                    failure: RpcFailure::TimedOut,
                };
            }
            ChainAnswer::Failed {
                cause: Unanswered::Malformed,
                error,
            } => {
                self.warn.warn(
                    "malformed",
                    now,
                    format_args!("malformed reply from the Mooncake master: {error}"),
                );
                return WireInput::Reply {
                    rpc_id,
                    payload: Reply::Malformed,
                };
            }
            ChainAnswer::Failed {
                cause: Unanswered::Unavailable,
                error,
            } => {
                self.warn.warn(
                    "master_error",
                    now,
                    format_args!(
                        "Mooncake master query failed: {error}; the lookup answers 0 hits"
                    ),
                );
                return WireInput::Failed {
                    rpc_id,
                    failure: RpcFailure::Transport,
                };
            }
        };
        // A client never finds more blocks than it asked about; the cap keeps the
        // answer within the prompt whatever the master says.
        let hit = hit_tokens(num_tokens, self.block_size, run.min(blocks));
        span.record("hit_tokens", hit);
        WireInput::Reply {
            rpc_id,
            payload: Reply::Lookup { hit_tokens: hit },
        }
    }
}

impl Wire for DirectWire {
    type Payload = Reply;

    fn name(&self) -> &str {
        &self.name
    }

    fn connecting(&self) -> bool {
        matches!(self.link, Link::Connecting(_))
    }

    fn reopens_for_reset(&self) -> bool {
        false
    }

    async fn send(&mut self, out: Outgoing, span: &Span) -> Result<(), SendError> {
        let Outgoing { rpc_id, body } = out;
        let (num_tokens, block_hashes) = match body {
            RpcBody::Lookup {
                num_tokens,
                block_hashes,
            } => (num_tokens, block_hashes),
            RpcBody::Reset => {
                // Whatever the reset's fate, the scheduler forgets what it knew: so
                // does the presence cache.
                if let Some(lookup) = &self.lookup {
                    lookup.clear_presence();
                }
                // The master's RPC has no remove-all (see the module docs): refused.
                self.warn.warn(
                    "no_reset",
                    crate::clock::now(),
                    format_args!(
                        "reset refused: the Mooncake master's RemoveAll is tenant-wide; no key was removed"
                    ),
                );
                self.ready.push_back(WireInput::Reply {
                    rpc_id,
                    payload: Reply::Reset { ok: false },
                });
                return Ok(());
            }
        };
        let Some(lookup) = self
            .lookup
            .as_ref()
            .filter(|_| matches!(self.link, Link::Up))
        else {
            // No connection (a connect failed and waits for its backoff): fail fast
            // rather than hold the lookup (rule 17).
            return Err(SendError::NotConnected);
        };
        let blocks = blocks_to_check(
            num_tokens,
            self.block_size,
            self.direct.layout.blocks_of(block_hashes.len()),
        );
        let keys = lookup.chain_keys(&block_hashes, blocks);
        let ended_span = span.clone();
        let answer: Query = if keys.is_empty() {
            // No full block: nothing to ask (`spec/wire.md`, step 1).
            Box::pin(std::future::ready(Ended {
                rpc_id,
                num_tokens,
                blocks,
                span: ended_span,
                result: Ok(0),
            }))
        } else {
            // Queued now, asked at the flush that ends this pass of the I/O task.
            let pending = lookup.submit(keys, self.keys_per_block);
            self.unflushed = true;
            Box::pin(
                async move {
                    let result = pending.wait().await;
                    Ended {
                        rpc_id,
                        num_tokens,
                        blocks,
                        span: ended_span,
                        result,
                    }
                }
                .instrument(span.clone()),
            )
        };
        self.queries.push(answer);
        Ok(())
    }

    fn flush(&mut self) {
        if std::mem::take(&mut self.unflushed) {
            if let Some(lookup) = &self.lookup {
                lookup.flush();
            }
        }
    }

    fn lookups_timed_out(&mut self) {
        // An unanswered lookup may mean a master in trouble: trust nothing cached.
        if let Some(lookup) = &self.lookup {
            lookup.clear_presence();
        }
    }

    async fn next(&mut self) -> WireInput<Reply> {
        if let Some(input) = self.ready.pop_front() {
            return input;
        }
        if let Link::Connecting(attempt) = &mut self.link {
            tokio::select! {
                biased;
                result = attempt => {
                    return match result {
                        Ok(master) => {
                            tracing::debug!(master = %master.addr(), "connected to the Mooncake master");
                            let _ = self.master.set(master.clone());
                            let mut config = LookupConfig::default();
                            config.batch = self.direct.batch.clone();
                            config.lease_ttl = self.direct.lease_ttl;
                            config.answer_ttl = self.result_ttl;
                            let lookup =
                                MasterLookup::new(master, self.direct.layout.clone(), config);
                            lookup.check_ttl(self.result_ttl, "lookup_prefetch_ttl_s");
                            let _ = self.batch.set(lookup.coalescer().clone());
                            self.lookup = Some(lookup);
                            self.link = Link::Up;
                            WireInput::Connected
                        }
                        Err(error) => {
                            self.link = Link::Down;
                            WireInput::ConnectFailed(error.to_string())
                        }
                    };
                }
                Some(ended) = self.queries.next(), if !self.queries.is_empty() => {
                    return self.answer(ended);
                }
            }
        }
        match self.queries.next().await {
            Some(ended) => self.answer(ended),
            None => std::future::pending().await,
        }
    }

    fn decode(
        &mut self,
        reply: Reply,
        _is_reset: bool,
        _span: &Span,
        _warn: &mut WarnLimiter,
        _now: Instant,
    ) -> Reply {
        reply
    }

    fn close(&mut self) {
        // The dispatcher failed every lookup on the wire: their queries are dropped
        // (those not yet in a batch leave it; calls under way end with their batch).
        self.queries.clear();
        self.unflushed = false;
    }

    fn open(&mut self) -> Result<(), String> {
        // Rule 17's reopen is the master client's (see the module docs): nothing to
        // replace here.
        if matches!(self.link, Link::Down) {
            // Configuration errors were refused by `connect`; anything else may heal.
            self.link = Link::Connecting(connect(&self.direct));
        }
        Ok(())
    }
}

fn connect(direct: &DirectConfig) -> Connecting {
    Box::pin(MasterClient::connect_to(
        direct.master.clone(),
        direct.master_config.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(master: &str) -> Result<DirectConfig, Error> {
        DirectConfig::parse(master, KeyLayout::default())
    }

    fn why_of(result: Result<DirectConfig, Error>) -> String {
        match result.and_then(|c| c.validate().map(|()| c)) {
            Err(e) => e.to_string(),
            Ok(c) => panic!("expected an error, got {c:?}"),
        }
    }

    #[test]
    fn the_master_address_is_checked_when_it_is_built() {
        assert_eq!(
            why_of(direct("not-a-host")),
            "invalid client configuration `master`: invalid Mooncake master address not-a-host: expected host:port"
        );
        assert_eq!(
            why_of(direct(" ")),
            "invalid client configuration `master`: invalid Mooncake master address  : expected host:port"
        );
        assert_eq!(
            why_of(direct("127.0.0.1")),
            "invalid client configuration `master`: invalid Mooncake master address 127.0.0.1: expected host:port"
        );
        assert_eq!(
            why_of(direct("redis://h:1")),
            "invalid client configuration `master`: invalid Mooncake master address redis://h:1: unsupported scheme redis:// (host:port or etcd://h1:p1;h2:p2)"
        );
        assert_eq!(
            why_of(direct("etcd://")),
            "invalid client configuration `master`: invalid Mooncake master address etcd://: etcd:// needs at least one host:port"
        );
        let ok = direct("127.0.0.1:50051").unwrap();
        assert_eq!(ok.master.to_string(), "127.0.0.1:50051");
        assert!(ok.validate().is_ok());
        let ha = direct("etcd://127.0.0.1:2379;h:2380").unwrap();
        assert_eq!(ha.master.to_string(), "etcd://127.0.0.1:2379;h:2380");
    }

    #[test]
    fn validate_names_the_bad_field() {
        let base = || direct("127.0.0.1:50051").unwrap();
        let mut config = base();
        config.master_config.chunk_keys = 0;
        assert_eq!(
            why_of(Ok(config)),
            "invalid client configuration `master_config.chunk_keys`: must be at least 1"
        );
        let mut config = base();
        config.master_config.call_timeout = Duration::ZERO;
        assert_eq!(
            why_of(Ok(config)),
            "invalid client configuration `master_config.call_timeout`: must be positive"
        );
        let mut config = base();
        config.master_config.connect_timeout = Duration::ZERO;
        assert_eq!(
            why_of(Ok(config)),
            "invalid client configuration `master_config.connect_timeout`: must be positive"
        );
        let mut config = direct("etcd://127.0.0.1:2379").unwrap();
        config.master = MasterAddr::parse("etcd://127.0.0.1:2379", Some("prod")).unwrap();
        config.master_config.cluster_id = Some("staging".to_owned());
        assert_eq!(
            why_of(Ok(config.clone())),
            "invalid client configuration `master_config.cluster_id`: staging differs from the \
             address's cluster id prod: give it with the address (MasterAddr::parse(addr, \
             Some(id)))"
        );
        config.master_config.cluster_id = Some("prod".to_owned());
        assert!(config.validate().is_ok());
        let mut fixed = base();
        fixed.master_config.cluster_id = Some("staging".to_owned());
        assert!(fixed.validate().is_ok(), "no cluster for a fixed address");
        // The master client's own checks, each named (MasterConfig::validate).
        for (field, set) in [
            (
                "max_queued_bytes",
                (|c| c.max_queued_bytes = 0) as fn(&mut MasterConfig),
            ),
            ("etcd_timeout", |c| c.etcd_timeout = Duration::ZERO),
            ("view_refresh", |c| c.view_refresh = Duration::ZERO),
            ("view_retry", |c| c.view_retry = Duration::ZERO),
        ] {
            let mut config = base();
            set(&mut config.master_config);
            let why = why_of(Ok(config));
            assert!(
                why.starts_with(&format!(
                    "invalid client configuration `master_config.{field}`: must be"
                )),
                "{why}"
            );
        }
        let mut config = base();
        config.master_config.backoff_min = config.master_config.backoff_max * 2;
        assert_eq!(
            why_of(Ok(config)),
            "invalid client configuration `master_config.backoff_min`: must be positive and at most backoff_max"
        );
    }

    #[test]
    fn the_default_ttl_stays_below_the_default_lease() {
        let config = direct("127.0.0.1:50051").unwrap();
        assert_eq!(config.lease_ttl, Duration::from_secs(10));
        assert!(!config.ttl_outlives_lease(lookup_core::Config::new(16).lookup_prefetch_ttl));
        assert!(!config.ttl_outlives_lease(Duration::from_millis(9_999)));
        assert!(config.ttl_outlives_lease(Duration::from_secs(10)));
        assert!(config.ttl_outlives_lease(Duration::from_secs(30)));
    }
}
