//! [`MooncakeIndex`]: the lookup server's Mooncake Store backend, a [`BlockIndex`] that
//! asks a real Mooncake master which block keys exist, over the master's own
//! existence RPC ([`mooncake_master::MasterClient`], `spec/mooncake-master-rpc.md`).
//!
//! It answers the way vLLM's MooncakeStoreConnector worker does (`spec/wire.md`, "What
//! the server computes"): the server builds every rank-namespace key of the blocks in
//! question with its [`KeyLayout`](mooncake_master::KeyLayout), and the index asks the master
//! about them in one logical `BatchExistKey` query per lookup.
//!
//! The master may be one `host:port` or a high-availability cluster
//! (`etcd://h1:p1;h2:p2`), whose leader the client follows across failovers
//! (`spec/mooncake-master-rpc.md`, "High availability"); leader changes are counted in
//! `lookup_server_mooncake_leader_changes_total`.
//!
//! The index is an adapter over the owner of the store's answer,
//! [`MasterLookup`]: its master client (with rule 17's replacement of a connection
//! on which calls time out in a row, counted per call by the client), batcher, lease
//! and presence cache (on by default) are the ones the direct transport and the
//! router's store check use.
//!
//! The master's read lease is read once per connection epoch (the batcher's
//! [`LeaseTtl`]), logged, exported as `lookup_server_mooncake_lease_seconds`, and
//! checked against the clients' `lookup_prefetch_ttl_s`
//! ([`check_client_ttl`](MooncakeIndex::check_client_ttl)): vLLM's wire cannot carry it
//! to them.

use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use metrics::{Counter, Gauge};
use mooncake_master::batch::LeaseTtl;
use mooncake_master::{
    BatchConfig, BatchStats, ChainAnswer, KeyLayout, LeaderState, LookupConfig, MasterAddr,
    MasterClient, MasterConfig, MasterError, MasterLookup, MasterStats,
};
use tokio::sync::watch;
use tracing::Instrument;

use super::{BlockIndex, IndexError, IndexFuture, LeadingRun};

/// What a [`MooncakeIndex`] does with a reset request (`spec/wire.md`, "Format
/// `tagged-blob`": vLLM's worker drains its pending puts, then calls
/// `remove_all(force=True)` on the store).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResetPolicy {
    /// Refuse: nothing is removed, [`clear`](BlockIndex::clear) fails with
    /// [`IndexError::Unsupported`] and the server answers `0x00` (failed). The
    /// default, because the only reset the master offers is tenant-wide.
    #[default]
    Refuse,
    /// Do what vLLM does: `RemoveAll(force = true)` on the master
    /// ([`MasterClient::remove_all`]). **Tenant-wide**: it removes every object of
    /// the tenant ([`MasterConfig::tenant_id`], `"default"` unless tenant quotas are
    /// on) from the whole store, whichever engine, model or worker wrote it, leased
    /// objects included. Unlike vLLM's worker the index owns no store writer, so it
    /// cannot drain pending puts first: a put that lands after the call stays.
    RemoveAll,
}

/// A [`BlockIndex`] over a Mooncake master: lookups are answered from the master's
/// `BatchExistKey` RPC, exactly as vLLM's worker answers them through the C++ client's
/// `batch_is_exist`.
///
/// # One query per lookup, chunked, with an early stop
///
/// The server asks [`leading_blocks`](BlockIndex::leading_blocks) once per lookup with
/// every key of the blocks in question, block-major. The keys go to the master in
/// `BatchExistKey` calls of at most [`MasterConfig::chunk_keys`] keys (default 1,024),
/// whole blocks per call, one call after another; the query stops after the first
/// call whose answer ends the leading run, so keys past the first missing block are
/// never asked about. A chain of up to `chunk_keys` keys costs exactly one call.
/// [`exists`](BlockIndex::exists) asks about every key (all chunks pipelined).
///
/// # Concurrent lookups share calls
///
/// The server keeps up to `max_concurrency` index calls in flight. Lookups that arrive
/// while a batch is asking the master wait for the next batch (at most
/// [`BatchConfig::max_wait`], 1 ms by default), which asks the union of their keys,
/// each key once, in chunks, with the early stop applied to each lookup on its own
/// ([`mooncake_master::Coalescer`]); a lookup arriving at an idle index goes out at
/// once. Each lookup still gets exactly the answer it would get alone. Keys found
/// present are kept in the lease-backed presence cache (on by default) and not asked
/// again while their lease outlasts the clients' result TTL. Set
/// [`BatchConfig::unbatched`] with [`with_batching`](Self::with_batching) to ask per
/// lookup with no cache, [`BatchConfig::uncached`] for batching alone. Counted in
/// [`IndexStats::batch`].
///
/// # Lease side effect
///
/// Every key the master answers `true` gets a read lease on the master
/// (`default_kv_lease_ttl`, 10 s by default): the object cannot be evicted or removed
/// until it expires (`spec/mooncake-master-rpc.md`, "The call"). The C++ client's
/// `batch_is_exist` does the same, so a lookup through this index pins the store
/// exactly as vLLM's worker does, and no more: keys past the call that ended the run
/// are not asked, so they get no lease. Probing is therefore never free for the store;
/// a scheduler should not re-probe the same chain in a loop (`spec/behaviour.md` rule 5
/// keeps one result per request).
///
/// # Errors become misses
///
/// - A failed call (master unreachable or restarting, timed out after
///   [`MasterConfig::call_timeout`], connection lost, an RPC-level refusal or a
///   malformed reply) fails the whole query with an [`IndexError`]; the server answers
///   0 hit tokens and counts it in `ServerStats::index_errors` (`spec/wire.md`, step
///   5: vLLM's worker answers 0 when the store call fails). The index counts it too
///   ([`IndexStats::errors`]). Calls fail fast while the connection is down;
///   the client reconnects in the background with backoff, so lookups succeed again
///   once the master is back on the same address. A connection on which calls keep
///   timing out is replaced after [`DEFAULT_REOPEN_AFTER_TIMEOUTS`] of them in a row
///   ([`with_reopen_after_timeouts`](Self::with_reopen_after_timeouts), rule 17),
///   counted per call: one call shared by many lookups is one timeout.
/// - A key the master answers with an application `ErrorCode` (inside an otherwise
///   good reply) is not present: vLLM's worker counts only answers equal to 1 (the C++
///   client turns such a key into `-1`), so the leading run ends at that key's block
///   (`spec/wire.md`, step 2). Counted in [`IndexStats::key_errors`].
///
/// # Reset
///
/// The master's only reset is `RemoveAll` (`spec/mooncake-master-rpc.md`, "Removing
/// everything"), and it is tenant-wide: every engine sharing the store loses its
/// cached blocks, not only the one that asked. So by default
/// ([`ResetPolicy::Refuse`]) [`clear`](BlockIndex::clear) removes nothing and fails
/// with [`IndexError::Unsupported`]: the server answers a reset request with `0x00`
/// (failed) and counts it in `ServerStats::reset_failures` and
/// [`IndexStats::resets_refused`]; every key stays in the store. With
/// [`ResetPolicy::RemoveAll`] ([`with_reset`](Self::with_reset)), a reset does what
/// vLLM's does: `RemoveAll(force = true)`, counted in
/// [`IndexStats::resets_done`] and [`IndexStats::objects_removed`]; a
/// failed call answers `0x00`.
#[derive(Debug)]
pub struct MooncakeIndex {
    master: MasterClient,
    lookup: MasterLookup,
    batch_config: BatchConfig,
    /// The configured read lease (until the master reports its own).
    lease_ttl: Duration,
    /// The clients' `lookup_prefetch_ttl_s`, when given, checked against the lease.
    client_ttl: Option<Duration>,
    /// `lookup_server_mooncake_lease_seconds`.
    lease_gauge: Gauge,
    reset: ResetPolicy,
    counters: IndexCounters,
}

/// A snapshot of a [`MooncakeIndex`]'s counters since it was created (the index's
/// counterpart of `ServerStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexStats {
    /// Leading-run queries ([`BlockIndex::leading_blocks`]): one per lookup the server
    /// asked about (lookups with no full block never reach the index).
    pub lookups: u64,
    /// Plain existence queries ([`BlockIndex::exists`]).
    pub exists_calls: u64,
    /// Present blocks answered by leading-run queries, summed (blocks, not tokens; the
    /// server's full-hit rule may still trim the last one).
    pub blocks_found: u64,
    /// Queries that failed: the server answered those lookups with 0 hit tokens.
    pub errors: u64,
    /// Among [`errors`](Self::errors), those where the master could not be reached:
    /// not connected, connection lost, or no reply within the call timeout.
    pub unavailable: u64,
    /// Keys the master answered with an application `ErrorCode`, counted as absent.
    pub key_errors: u64,
    /// Reset requests refused ([`ResetPolicy::Refuse`]).
    pub resets_refused: u64,
    /// Resets done with `RemoveAll` ([`ResetPolicy::RemoveAll`]).
    pub resets_done: u64,
    /// Objects the master reported removed by those resets.
    pub objects_removed: u64,
    /// Master connections replaced after [`with_reopen_after_timeouts`](MooncakeIndex::with_reopen_after_timeouts)
    /// calls timed out in a row (`spec/behaviour.md` rule 17): the master client's
    /// [`MasterStats::timeout_reopens`].
    pub reopens: u64,
    /// Resets whose `RemoveAll` call failed (the server answered `0x00`).
    pub reset_errors: u64,
    /// The master client's own counters: `BatchExistKey` calls, keys sent, timeouts,
    /// reconnects.
    pub master: MasterStats,
    /// How lookups shared calls: batches, lookups per batch, keys wanted and asked.
    pub batch: BatchStats,
}

/// The live counters behind [`IndexStats`], one atomic per field of the same name.
#[derive(Debug, Default)]
struct IndexCounters {
    lookups: AtomicU64,
    exists_calls: AtomicU64,
    blocks_found: AtomicU64,
    errors: AtomicU64,
    unavailable: AtomicU64,
    key_errors: AtomicU64,
    resets_refused: AtomicU64,
    resets_done: AtomicU64,
    objects_removed: AtomicU64,
    reset_errors: AtomicU64,
}

/// Call timeouts in a row after which the index's master client replaces its
/// connection: the master client's default, as the direct transport's
/// `DirectConfig::reopen_after_timeouts` (`spec/behaviour.md` rule 17).
pub const DEFAULT_REOPEN_AFTER_TIMEOUTS: u32 = mooncake_master::DEFAULT_REOPEN_AFTER_TIMEOUTS;

/// The result TTL assumed for the clients when none is given: vLLM's default
/// `lookup_prefetch_ttl_s` (`spec/behaviour.md`, "Configuration").
pub const DEFAULT_CLIENT_TTL: Duration = Duration::from_secs(2);

/// The index's owner of the store's answer over `master`, going by the configured
/// `lease_ttl` until the master reports its own. The clients keep each answer for
/// their result TTL (`client_ttl`, else [`DEFAULT_CLIENT_TTL`]), so a cached key is
/// used only while its lease outlasts that margin; the TTL is also checked against
/// the lease. The server builds the keys; the layout here is unused.
fn owner(
    master: &MasterClient,
    batch: BatchConfig,
    lease_ttl: Duration,
    client_ttl: Option<Duration>,
) -> MasterLookup {
    let mut config = LookupConfig::default();
    config.batch = batch;
    config.lease_ttl = lease_ttl;
    config.answer_ttl = client_ttl.unwrap_or(DEFAULT_CLIENT_TTL);
    let lookup = MasterLookup::new(master.clone(), KeyLayout::default(), config);
    if let Some(ttl) = client_ttl {
        lookup.check_ttl(ttl, CLIENT_TTL_SETTING);
    }
    lookup
}

/// How the lease warning names the clients' TTL.
const CLIENT_TTL_SETTING: &str = "the clients' lookup_prefetch_ttl_s (--client-ttl-s)";

/// Adds `n` and returns the new value.
fn bump(counter: &AtomicU64, n: u64) -> u64 {
    counter.fetch_add(n, Ordering::Relaxed) + n
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The server-side view of a master failure: unreachable (no connection, no leader,
/// no reply in time), or a store-side error.
fn index_error(e: &MasterError) -> IndexError {
    if e.is_unavailable() {
        IndexError::Unavailable(e.to_string())
    } else {
        IndexError::Store(e.to_string())
    }
}

impl MooncakeIndex {
    /// Connects to the Mooncake master at `addr` with `config` (chunk size, call
    /// timeout, `tenant_id`, and `cluster_id` for an HA address): `host:port`
    /// (default port 50051), or `etcd://h1:p1;h2:p2` to follow the leader of a
    /// high-availability cluster ([`MasterClient::connect`]). Must run inside a tokio
    /// runtime, which then hosts the connection's tasks. Resets are refused; see
    /// [`with_reset`](Self::with_reset).
    ///
    /// # Errors
    /// [`MasterError::InvalidAddress`] for an address that does not parse;
    /// [`MasterError::InvalidConfig`] for an unusable `config` (for example
    /// `chunk_keys` 0); [`MasterError::Connect`] when the first connect fails; for
    /// `etcd://`, [`MasterError::Discovery`] when etcd does not answer and
    /// [`MasterError::Unavailable`] when no leader is elected. Later failures are not
    /// errors here: lookups fail open while the client reconnects or waits for a
    /// leader.
    pub async fn connect(addr: &str, config: MasterConfig) -> Result<Self, MasterError> {
        Ok(Self::new(MasterClient::connect(addr, config).await?))
    }

    /// An index over an existing client (which may be shared with other users; its
    /// counters then count their calls too). Resets are refused. For an `etcd://`
    /// client inside a tokio runtime, a task counts its leader changes in
    /// `lookup_server_mooncake_leader_changes_total`, on the metrics recorder
    /// installed now (see [`crate::metrics`]).
    #[must_use]
    pub fn new(master: MasterClient) -> Self {
        if matches!(master.master_addr(), MasterAddr::Etcd(_)) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(count_leader_changes(
                    master.subscribe_leader(),
                    crate::metrics::mooncake_leader_changes(),
                ));
            }
        }
        let lease_ttl = mooncake_master::batch::DEFAULT_LEASE_TTL;
        let lookup = owner(&master, BatchConfig::default(), lease_ttl, None);
        let lease_gauge = crate::metrics::mooncake_lease();
        export_lease(lookup.coalescer(), &lease_gauge);
        Self {
            master,
            lookup,
            batch_config: BatchConfig::default(),
            lease_ttl,
            client_ttl: None,
            lease_gauge,
            reset: ResetPolicy::Refuse,
            counters: IndexCounters::default(),
        }
    }

    /// The index replacing its master connection after `n` calls in a row timed out
    /// ([`MasterConfig::call_timeout`]) with none answered between, counted per call
    /// whichever lookups waited on it ([`DEFAULT_REOPEN_AFTER_TIMEOUTS`]; 0: never).
    /// Sets [`MasterClient::set_reopen_after_timeouts`] of the index's client (shared
    /// with its other users). A connection on which every
    /// call times out (a partitioned or wedged master, whose socket the kernel would
    /// keep for minutes) is dropped, its waiting calls fail as `ConnectionLost`, and
    /// the client connects again in the background ([`MasterClient::reconnect`]), so
    /// lookups fail fast while the master cannot be reached and are answered once it
    /// can (`spec/behaviour.md` rule 17). Counted in [`IndexStats::reopens`].
    #[must_use]
    pub fn with_reopen_after_timeouts(self, n: u32) -> Self {
        self.master.set_reopen_after_timeouts(n);
        self
    }

    /// The index with reset policy `reset`. [`ResetPolicy::RemoveAll`] makes every
    /// reset request remove every object of the tenant from the store (see
    /// [`ResetPolicy`]): opt in only when the store serves this deployment alone.
    #[must_use]
    pub fn with_reset(mut self, reset: ResetPolicy) -> Self {
        self.reset = reset;
        self
    }

    /// The index with batching settings `batch` (batched by default;
    /// [`BatchConfig::unbatched`] asks per lookup). A presence cache enabled in
    /// `batch.presence` is trusted up to the master's default lease (10 s) or its
    /// `max_age`, whichever is earlier, and dropped on a leader change or a failed call.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] naming the field `batch` sets to 0.
    pub fn with_batching(mut self, batch: BatchConfig) -> Result<Self, MasterError> {
        batch.validate()?;
        self.batch_config = batch;
        self.rebuild_batcher();
        Ok(self)
    }

    /// The index going by a read lease of `lease_ttl` (the master's
    /// `-default_kv_lease_ttl`; default 10 s) until the master reports its own, and
    /// when it cannot (`spec/mooncake-master-rpc.md`, "Where the lease can be read").
    #[must_use]
    pub fn with_lease_ttl(mut self, lease_ttl: Duration) -> Self {
        self.lease_ttl = lease_ttl;
        self.rebuild_batcher();
        self
    }

    /// The clients in front of this server keep results for `ttl` (their
    /// `lookup_prefetch_ttl_s`; [`DEFAULT_CLIENT_TTL`] until given): the presence
    /// cache uses a key only while its lease outlasts `ttl` from the lookup, and a
    /// warning is logged when `ttl` is not below the read lease, now against the lease
    /// in use and again when the master reports a lease that is not above it. vLLM's
    /// wire carries no lease, so this server is where the check can use the master's
    /// own figure.
    #[must_use]
    pub fn check_client_ttl(mut self, ttl: Duration) -> Self {
        self.client_ttl = Some(ttl);
        self.rebuild_batcher();
        self
    }

    /// The read lease in use: the master's own once read (at the first present key
    /// per leader), the configured one before that or when the master cannot report
    /// it.
    #[must_use]
    pub fn lease(&self) -> LeaseTtl {
        self.lookup.lease()
    }

    fn rebuild_batcher(&mut self) {
        self.lookup = owner(
            &self.master,
            self.batch_config.clone(),
            self.lease_ttl,
            self.client_ttl,
        );
        export_lease(self.lookup.coalescer(), &self.lease_gauge);
    }

    /// The reset policy.
    #[must_use]
    pub const fn reset_policy(&self) -> ResetPolicy {
        self.reset
    }

    /// The master client.
    #[must_use]
    pub const fn master(&self) -> &MasterClient {
        &self.master
    }

    /// The counters so far, with the master client's.
    #[must_use]
    pub fn stats(&self) -> IndexStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IndexStats {
            lookups: get(&c.lookups),
            exists_calls: get(&c.exists_calls),
            blocks_found: get(&c.blocks_found),
            errors: get(&c.errors),
            unavailable: get(&c.unavailable),
            key_errors: get(&c.key_errors),
            resets_refused: get(&c.resets_refused),
            resets_done: get(&c.resets_done),
            objects_removed: get(&c.objects_removed),
            reset_errors: get(&c.reset_errors),
            reopens: self.master.stats().timeout_reopens,
            master: self.master.stats(),
            batch: self.lookup.batch_stats(),
        }
    }

    /// Counts a query that failed and turns it into the server's error (rule 17 is
    /// the master client's: it counts the call's timeout itself).
    fn failed(&self, e: &MasterError) -> IndexError {
        let n = bump(&self.counters.errors, 1);
        if e.is_unavailable() {
            bump(&self.counters.unavailable, 1);
        }
        // The 1st, 2nd, 4th, ... failure: a dead master must not flood the log.
        if n.is_power_of_two() {
            tracing::warn!(addr = %self.master.addr(), error = %e, count = n, "Mooncake master query failed; the lookup answers 0 hit tokens");
        }
        index_error(e)
    }

    fn key_error(&self, what: &dyn std::fmt::Display) {
        let n = bump(&self.counters.key_errors, 1);
        if n.is_power_of_two() {
            tracing::warn!(addr = %self.master.addr(), error = %what, count = n, "the Mooncake master answered a key with an error; counted as absent");
        }
    }

    async fn query_leading_blocks(
        &self,
        keys_per_block: usize,
        keys: &[String],
    ) -> Result<LeadingRun, IndexError> {
        bump(&self.counters.lookups, 1);
        if keys_per_block == 0 {
            return Ok(LeadingRun::default());
        }
        let run = match self
            .lookup
            .leading_keys(keys.to_vec(), keys_per_block)
            .await
        {
            ChainAnswer::Run { blocks, key_error } => {
                // The key that would end the run carries an ErrorCode: every key
                // before it was answered `true`, so the run ends at its block (vLLM
                // counts only 1s).
                if let Some(e) = key_error {
                    self.key_error(&e);
                }
                blocks
            }
            ChainAnswer::Failed { error, .. } => return Err(self.failed(&error)),
        };
        bump(&self.counters.blocks_found, count(run));
        let keys_asked = keys_needed(
            keys.len() / keys_per_block,
            keys_per_block,
            self.master.config().chunk_keys,
            run,
        );
        Ok(LeadingRun {
            blocks: run,
            keys_asked,
        })
    }

    async fn query_exists(&self, keys: &[String]) -> Result<Vec<bool>, IndexError> {
        bump(&self.counters.exists_calls, 1);
        let answers = self
            .master
            .batch_exist_results(keys)
            .await
            .map_err(|e| self.failed(&e))?;
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|code| {
                    self.key_error(&code);
                    false
                })
            })
            .collect())
    }
}

impl BlockIndex for MooncakeIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        let span = tracing::debug_span!("mooncake_exists", keys = keys.len());
        Box::pin(self.query_exists(keys).instrument(span))
    }

    fn leading_blocks<'a>(
        &'a self,
        keys_per_block: usize,
        keys: &'a [String],
    ) -> IndexFuture<'a, LeadingRun> {
        let span = tracing::debug_span!("mooncake_lookup", keys = keys.len(), keys_per_block);
        Box::pin(
            self.query_leading_blocks(keys_per_block, keys)
                .instrument(span),
        )
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        match self.reset {
            ResetPolicy::Refuse => {
                let n = bump(&self.counters.resets_refused, 1);
                if n.is_power_of_two() {
                    tracing::warn!(
                        count = n,
                        "reset refused: RemoveAll is tenant-wide and not enabled; no key was removed"
                    );
                }
                Box::pin(std::future::ready(Err(IndexError::Unsupported {
                    operation: "reset",
                    why: REFUSED,
                })))
            }
            ResetPolicy::RemoveAll => {
                let span = tracing::info_span!("mooncake_reset");
                Box::pin(self.remove_all().instrument(span))
            }
        }
    }
}

/// Why a reset is refused under [`ResetPolicy::Refuse`].
const REFUSED: &str = "the Mooncake master's RemoveAll is tenant-wide (every engine sharing the \
    store loses its blocks) and this index was not given ResetPolicy::RemoveAll; keys stay stored";

impl MooncakeIndex {
    async fn remove_all(&self) -> Result<(), IndexError> {
        let tenant = self.master.config().tenant_id.as_str();
        match self.master.remove_all(true).await {
            Ok(removed) => {
                bump(&self.counters.resets_done, 1);
                bump(
                    &self.counters.objects_removed,
                    u64::try_from(removed).unwrap_or(0),
                );
                tracing::warn!(removed, tenant, addr = %self.master.addr(), "reset: RemoveAll removed every object of the tenant from the Mooncake store");
                Ok(())
            }
            Err(e) => {
                bump(&self.counters.reset_errors, 1);
                tracing::warn!(error = %e, tenant, addr = %self.master.addr(), "reset: RemoveAll failed");
                Err(index_error(&e))
            }
        }
    }
}

/// Sets `gauge` to the lease `batch` goes by now and, inside a tokio runtime, at every
/// change, until that batcher is gone.
fn export_lease(batch: &mooncake_master::Coalescer, gauge: &Gauge) {
    let mut lease = batch.subscribe_lease();
    gauge.set(lease.borrow_and_update().ttl.as_secs_f64());
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let gauge = gauge.clone();
        runtime.spawn(async move {
            while lease.changed().await.is_ok() {
                gauge.set(lease.borrow_and_update().ttl.as_secs_f64());
            }
        });
    }
}

/// Adds every leader change `views` reports after this call to `counter`, until the
/// client is gone. The starting count is read now, not when the task first runs.
fn count_leader_changes(
    mut views: watch::Receiver<LeaderState>,
    counter: Counter,
) -> impl Future<Output = ()> + Send {
    let mut seen = views.borrow_and_update().changes;
    async move {
        while views.changed().await.is_ok() {
            let changes = views.borrow_and_update().changes;
            counter.increment(changes.saturating_sub(seen));
            seen = changes;
        }
    }
}

#[cfg(test)]
mod tests;

/// The keys one lookup needs asked to learn a leading run of `run` blocks out of
/// `blocks` (each `keys_per_block` keys): whole chunks of at most `chunk_keys` keys, up
/// to and including the chunk holding the first absent block, as an unbatched
/// `BatchExistKey` sequence sends them (`spec/mooncake-master-rpc.md`, early stop).
/// With batching, concurrent lookups share these keys (the master is asked each once:
/// `IndexStats::batch`); this count is the lookup's own.
fn keys_needed(blocks: usize, keys_per_block: usize, chunk_keys: usize, run: usize) -> usize {
    if keys_per_block == 0 {
        return 0;
    }
    let per_chunk = (chunk_keys / keys_per_block).max(1);
    let through = if run >= blocks {
        blocks
    } else {
        ((run / per_chunk + 1) * per_chunk).min(blocks)
    };
    through * keys_per_block
}
