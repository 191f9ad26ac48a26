//! The router's question, "how many leading blocks of this prompt does the store
//! hold?", asked of the Mooncake master directly: [`StoreCheck`], a `Clone + Send +
//! Sync` handle that any number of tasks call at once through `&self`, no `Mutex`.
//!
//! It is built from the configuration of the direct client ([`ClientConfig`] with
//! [`Transport::Direct`], or a [`DirectConfig`] and the block size) and is an adapter
//! over the same owner of the store's answer as the direct transport,
//! [`MasterLookup`]: one [`MasterClient`] (one pipelined TCP connection, reconnected
//! with backoff, following the leader of an `etcd://` cluster, replaced after call
//! timeouts in a row: rule 17, counted per call by the client), one batcher in front
//! of it, so checks made at the same moment share `BatchExistKey` calls (the union of
//! their keys, each key once, with an early stop per check:
//! `spec/mooncake-master-rpc.md`, "The call"), and the presence cache. Each check is
//! answered by the server's rules (`spec/wire.md`, "What the server computes", steps
//! 2-3): a block counts when its key exists in every rank namespace of the
//! [`KeyLayout`], and the run ends at the first block that does not.
//!
//! Like every lookup, a check grants each present key a read lease (the master's
//! `default_kv_lease_ttl`): it pins what it finds for that long, and asks nothing past
//! the chunk that ended the run. A failure is an [`Unavailable`] error, never 0 blocks
//! (`spec/behaviour.md` rule 11): a router must not read a down store as a cold cache.

use std::time::Duration;

use lookup_core::{BlockHashes, Unavailable};
use mooncake_master::batch::LeaseTtl;
use mooncake_master::{
    BatchStats, ChainAnswer, LookupConfig, MasterClient, MasterLookup, Unanswered,
};

#[cfg(doc)]
use mooncake_master::KeyLayout;

use crate::{ClientConfig, DirectConfig, Error, Transport};

/// What the store holds of a prompt: its leading blocks stored in every rank
/// namespace ([`StoreCheck::check`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StoredBlocks {
    /// Leading blocks stored (blocks of the check's block size; with
    /// [`KeyLayout::hashes_per_block`] `n > 1`, each covers `n` block hashes).
    pub hit_blocks: usize,
    /// `hit_blocks` × block size, in tokens (saturating at `u32::MAX`). The engine
    /// recomputes the prompt's last token ([`Self::hit_tokens_for`]).
    pub hit_tokens: u32,
}

impl StoredBlocks {
    /// The external tokens an engine would get for a prompt of `num_tokens` tokens:
    /// the hit capped at whole blocks of the prompt, with its last token always
    /// recomputed (`spec/wire.md`, steps 3-4; [`lookup_core::answer::hit_tokens`]).
    #[must_use]
    pub fn hit_tokens_for(&self, num_tokens: u32, block_size: u32) -> u32 {
        lookup_core::answer::hit_tokens(num_tokens, block_size, self.hit_blocks)
    }
}

/// Settings of a [`StoreCheck`]: [`StoreCheck::connect`] takes them from the client's
/// configuration, the other constructors from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreCheckLimits {
    /// Longest a check waits for its answer, however many `BatchExistKey` rounds it
    /// takes; past it the check is [`Unavailable::TimedOut`]. Default 5 s, the
    /// client's `lookup_timeout_s`.
    pub timeout: Duration,
    /// How long the caller acts on an answer: a key is taken from the presence cache
    /// (when [`DirectConfig::batch`] enables it) only while its read lease outlasts
    /// this. Default 2 s, the client's `lookup_prefetch_ttl_s`.
    pub answer_ttl: Duration,
    /// Master call timeouts in a row that replace the master connection
    /// (`spec/behaviour.md` rule 17), given to the master client that
    /// [`StoreCheck::connect_with`] makes; counted by that client per call, whoever
    /// waited on it (checks, lookups), with a reply in time starting the count again.
    /// 0 never replaces it. Default 3, the client's
    /// [`DirectConfig::reopen_after_timeouts`]. [`StoreCheck::from_parts`] keeps the
    /// given client's own setting.
    pub reopen_after_timeouts: u32,
}

impl Default for StoreCheckLimits {
    fn default() -> Self {
        let core = lookup_core::Config::new(16);
        Self {
            timeout: core.lookup_timeout,
            answer_ttl: core.lookup_prefetch_ttl,
            reopen_after_timeouts: mooncake_master::DEFAULT_REOPEN_AFTER_TIMEOUTS,
        }
    }
}

impl StoreCheckLimits {
    /// These limits with [`timeout`](Self::timeout) set.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// These limits with [`answer_ttl`](Self::answer_ttl) set.
    #[must_use]
    pub fn with_answer_ttl(mut self, answer_ttl: Duration) -> Self {
        self.answer_ttl = answer_ttl;
        self
    }

    /// These limits with [`reopen_after_timeouts`](Self::reopen_after_timeouts) set
    /// (0: never).
    #[must_use]
    pub fn with_reopen_after_timeouts(mut self, n: u32) -> Self {
        self.reopen_after_timeouts = n;
        self
    }
}

struct Inner {
    lookup: MasterLookup,
    block_size: u32,
    limits: StoreCheckLimits,
}

/// How many leading blocks of a prompt the store holds, from any task: a cheap handle
/// (`Clone + Send + Sync`, an `Arc` inside) over one master connection and one
/// batcher (see the module docs).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use lookup_tokio::{BlockHashes, DirectConfig, KeyLayout, StoreCheck};
///
/// let direct = DirectConfig::parse("127.0.0.1:50051", KeyLayout::new("Qwen3-8B"))?;
/// let store = StoreCheck::connect_direct(direct, 16).await?;
/// let stored = store.check(&BlockHashes::from_u64s(&[1, 2, 3])).await?;
/// println!("{} blocks, {} tokens", stored.hit_blocks, stored.hit_tokens);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct StoreCheck {
    inner: std::sync::Arc<Inner>,
}

impl std::fmt::Debug for StoreCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCheck")
            .field("master", self.inner.lookup.master())
            .field("block_size", &self.inner.block_size)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

impl StoreCheck {
    /// Connects with the configuration of a direct [`LookupClient`](crate::LookupClient):
    /// its [`DirectConfig`], block size, `lookup_timeout_s` (a check's bound),
    /// `lookup_prefetch_ttl_s` (the life of an answer) and
    /// [`DirectConfig::reopen_after_timeouts`].
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] (key `transport`) for a ZeroMQ transport: a
    /// lookup server answers lookups of whole requests, not block checks; otherwise
    /// as [`connect_with`](Self::connect_with).
    pub async fn connect(config: &ClientConfig) -> Result<Self, Error> {
        let Transport::Direct(direct) = &config.transport else {
            return Err(Error::InvalidClientConfig {
                key: "transport",
                why: "a store check asks the Mooncake master itself: give a direct \
                      transport (Transport::Direct)"
                    .to_owned(),
            });
        };
        let limits = StoreCheckLimits {
            timeout: config.core.lookup_timeout,
            answer_ttl: config.core.lookup_prefetch_ttl,
            reopen_after_timeouts: direct.reopen_after_timeouts,
        };
        Self::connect_with((**direct).clone(), config.core.block_size, limits).await
    }

    /// Connects to `direct.master` with blocks of `block_size` tokens, the default
    /// [`StoreCheckLimits`] and `direct.reopen_after_timeouts`.
    ///
    /// # Errors
    /// As [`connect_with`](Self::connect_with).
    pub async fn connect_direct(direct: DirectConfig, block_size: u32) -> Result<Self, Error> {
        let limits =
            StoreCheckLimits::default().with_reopen_after_timeouts(direct.reopen_after_timeouts);
        Self::connect_with(direct, block_size, limits).await
    }

    /// Connects to `direct.master` (reading the leader from etcd first for an
    /// `etcd://` address); later failures are retried in the background by the master
    /// client, and checks meanwhile fail fast as [`Unavailable::Transport`]. The
    /// limits' `reopen_after_timeouts` applies, not `direct`'s (as `limits.timeout`
    /// stands for `lookup_timeout_s`).
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] for settings [`DirectConfig::validate`] refuses,
    /// a `block_size` of 0 or a zero `limits.timeout`; [`Error::Unreachable`] when the
    /// first connect fails (with the master client's reason: refused, no leader, etcd
    /// unreachable).
    pub async fn connect_with(
        direct: DirectConfig,
        block_size: u32,
        limits: StoreCheckLimits,
    ) -> Result<Self, Error> {
        direct.validate()?;
        check_limits(block_size, limits)?;
        let mut master_config = direct.master_config.clone();
        master_config.reopen_after_timeouts = limits.reopen_after_timeouts;
        let master = MasterClient::connect_to(direct.master.clone(), master_config)
            .await
            .map_err(|e| Error::Unreachable {
                target: direct.master.to_string(),
                why: e.to_string(),
            })?;
        let mut config = LookupConfig::default();
        config.batch = direct.batch.clone();
        config.lease_ttl = direct.lease_ttl;
        config.answer_ttl = limits.answer_ttl;
        let lookup = MasterLookup::new(master, direct.layout, config);
        lookup.check_ttl(limits.answer_ttl, "the store check's answer_ttl");
        Self::from_parts(lookup, block_size, limits)
    }

    /// A store check over an owner already made (shared with other checks, e.g. one
    /// per block size on one master, so that all of them share one connection, its
    /// batches, its cache and its rule-17 count), in blocks of `block_size` tokens.
    /// The owner's own answer TTL stays in force: `limits.answer_ttl` and
    /// `limits.reopen_after_timeouts` are not applied to it.
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] for a `block_size` of 0 or a zero
    /// `limits.timeout`.
    pub fn from_parts(
        lookup: MasterLookup,
        block_size: u32,
        limits: StoreCheckLimits,
    ) -> Result<Self, Error> {
        check_limits(block_size, limits)?;
        Ok(Self {
            inner: std::sync::Arc::new(Inner {
                lookup,
                block_size,
                limits,
            }),
        })
    }

    /// How many leading blocks of `block_hashes` the store holds in every rank
    /// namespace (chain order, as vLLM hashes a prompt's full blocks). Checks made by
    /// other tasks at the same moment share the master's calls. No block hash: 0 blocks,
    /// nothing asked.
    ///
    /// # Errors
    /// [`Unavailable::TimedOut`] when no answer came within
    /// [`StoreCheckLimits::timeout`] or the master client's call timeout;
    /// [`Unavailable::Malformed`] for a reply that does not decode or has a wrong
    /// number of answers; [`Unavailable::Transport`] when the master is down, lost,
    /// has no leader, or refused the call, or when the answer rested on the presence
    /// cache of an epoch that ended or on a cached key whose lease would not outlast
    /// [`StoreCheckLimits::answer_ttl`]. A key the master answers with an error code
    /// ends the run at its block, as vLLM's worker counts it. Master calls that time
    /// out in a row replace the master connection (rule 17, counted by the master
    /// client per call).
    pub async fn check(&self, block_hashes: &BlockHashes) -> Result<StoredBlocks, Unavailable> {
        let inner = &*self.inner;
        let layout = inner.lookup.layout();
        let blocks = layout.blocks_of(block_hashes.len());
        let answer = tokio::time::timeout(
            inner.limits.timeout,
            inner.lookup.leading_chain(block_hashes, blocks),
        )
        .await
        .map_err(|_| Unavailable::TimedOut)?;
        let run = match answer {
            ChainAnswer::Run { blocks, .. } => blocks,
            ChainAnswer::Failed { cause, .. } => {
                return Err(match cause {
                    Unanswered::TimedOut => Unavailable::TimedOut,
                    Unanswered::Malformed => Unavailable::Malformed,
                    Unanswered::Unavailable => Unavailable::Transport,
                });
            }
        };
        let hit_blocks = run.min(blocks);
        let tokens = u64::try_from(hit_blocks).unwrap_or(u64::MAX) * u64::from(inner.block_size);
        Ok(StoredBlocks {
            hit_blocks,
            hit_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
        })
    }

    /// The master client underneath (its address, leader, epoch, counters).
    #[must_use]
    pub fn master(&self) -> &MasterClient {
        self.inner.lookup.master()
    }

    /// The owner of the store's answer underneath (to share with other checks:
    /// [`from_parts`](Self::from_parts)).
    #[must_use]
    pub fn lookup(&self) -> &MasterLookup {
        &self.inner.lookup
    }

    /// The read lease in use: the master's own once read (at the first hit of each
    /// connection), the configured [`DirectConfig::lease_ttl`] before that or when the
    /// master cannot report it.
    #[must_use]
    pub fn lease(&self) -> LeaseTtl {
        self.inner.lookup.lease()
    }

    /// The batcher's counters: checks, batches, keys wanted and asked, lease reads.
    #[must_use]
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.lookup.batch_stats()
    }

    /// The block size in tokens.
    #[must_use]
    pub fn block_size(&self) -> u32 {
        self.inner.block_size
    }

    /// The settings beyond the direct client's.
    #[must_use]
    pub fn limits(&self) -> StoreCheckLimits {
        self.inner.limits
    }
}

/// A block size of at least 1 and a positive timeout.
fn check_limits(block_size: u32, limits: StoreCheckLimits) -> Result<(), Error> {
    let bad = |key: &'static str, why: &str| {
        Err(Error::InvalidClientConfig {
            key,
            why: why.to_owned(),
        })
    };
    if block_size == 0 {
        return bad("block_size", "must be at least 1");
    }
    if limits.timeout.is_zero() {
        return bad("timeout", "must be positive");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mooncake_master::KeyLayout;

    fn assert_handle<T: Clone + Send + Sync + 'static>() {}

    #[test]
    fn the_handle_is_shared_across_tasks() {
        assert_handle::<StoreCheck>();
    }

    #[test]
    fn hit_tokens_for_recomputes_the_last_token() {
        let stored = StoredBlocks {
            hit_blocks: 2,
            hit_tokens: 32,
        };
        assert_eq!(stored.hit_tokens_for(33, 16), 32);
        assert_eq!(stored.hit_tokens_for(32, 16), 16);
        assert_eq!(stored.hit_tokens_for(20, 16), 16);
    }

    #[tokio::test]
    async fn bad_settings_are_refused_before_connecting() {
        let direct = DirectConfig::parse("127.0.0.1:1", KeyLayout::new("m")).unwrap();
        let error = StoreCheck::connect_direct(direct.clone(), 0)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid client configuration `block_size`: must be at least 1"
        );
        let zmq = ClientConfig::zmq("ipc:///tmp/none".parse().unwrap(), 16);
        let error = StoreCheck::connect(&zmq).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid client configuration `transport`: a store check asks the Mooncake \
             master itself: give a direct transport (Transport::Direct)"
        );
        let limits = StoreCheckLimits::default().with_timeout(Duration::ZERO);
        let error = StoreCheck::connect_with(direct, 16, limits)
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid client configuration `timeout`: must be positive"
        );
    }
}
