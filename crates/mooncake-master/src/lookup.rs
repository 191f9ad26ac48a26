//! [`MasterLookup`]: the one owner of the store's answer to a chain of blocks. The
//! direct transport (`lookup_tokio`'s `DirectWire`), the router's `StoreCheck` and
//! lookup-server's `MooncakeIndex` are adapters over it: each builds its question
//! (keys of a chain), asks here, and turns the [`ChainAnswer`] into its own reply.
//!
//! It owns, once for all three:
//! - the master client ([`MasterClient`]: one pipelined connection, reconnects,
//!   the HA leader) and rule 17, which the client counts per timed-out call on each
//!   connection, whoever waited on it ([`MasterConfig::reopen_after_timeouts`],
//!   `spec/behaviour.md` rule 17);
//! - the batcher ([`Coalescer`]): lookups released together share `BatchExistKey`
//!   calls, each with its own early stop;
//! - the read lease and the checks of result TTLs against it, and the presence cache
//!   (on by default: [`PresenceCacheConfig`](crate::PresenceCacheConfig)), bound to
//!   the connection epoch and re-checked when each answer is handed out;
//! - the key layout of vLLM's store ([`KeyLayout`]) for callers that ask by block
//!   hashes;
//! - what an answer means ([`ChainAnswer::of`]): a key answered with an `ErrorCode`
//!   ends the run at its block, as vLLM's worker counts only `1`s; a failed call is
//!   never a run of 0 (`spec/behaviour.md` rule 11).

use std::time::Duration;

use crate::batch::{LeaseTtl, Pending};
use crate::{
    BatchConfig, BatchStats, Coalescer, KeyLayout, MasterAddr, MasterClient, MasterConfig,
    MasterError,
};

/// How a [`MasterLookup`] batches, caches and checks its answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LookupConfig {
    /// Batching and the presence cache ([`BatchConfig`]; both on by default).
    pub batch: BatchConfig,
    /// The master's `default_kv_lease_ttl` until it reports its own (10 s, the
    /// master's default: [`DEFAULT_LEASE_TTL`](crate::batch::DEFAULT_LEASE_TTL)).
    pub lease_ttl: Duration,
    /// How long the caller acts on an answer (vLLM's `lookup_prefetch_ttl_s`, 2 s by
    /// default): a cached key is used only while its lease outlasts the answer by
    /// this much.
    pub answer_ttl: Duration,
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self {
            batch: BatchConfig::default(),
            lease_ttl: crate::batch::DEFAULT_LEASE_TTL,
            answer_ttl: Duration::from_secs(2),
        }
    }
}

/// Why a chain has no answer: the cause each adapter reports (a lookup's
/// `Unavailable` cause, an index error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unanswered {
    /// No reply within the master client's call timeout.
    TimedOut,
    /// A reply that does not decode, or with a wrong number of answers.
    Malformed,
    /// The master is down, lost, has no leader, refused the call, or an answer rested
    /// on knowledge that ended (a cache epoch, a lease too short).
    Unavailable,
}

/// The store's answer to one chain.
#[derive(Clone, Debug)]
pub enum ChainAnswer {
    /// The leading run in blocks. `key_error` is the store error of the key that
    /// ended it, when one did (counted as absent, as vLLM's worker does).
    Run {
        /// Leading blocks present in every rank namespace.
        blocks: usize,
        /// The error of the key that ended the run, if it was one.
        key_error: Option<MasterError>,
    },
    /// No answer; never to be read as a run of 0.
    Failed {
        /// The cause, for the adapter's reply.
        cause: Unanswered,
        /// The master client's error.
        error: MasterError,
    },
}

impl ChainAnswer {
    /// The answer a leading-run query's result gives, with `keys_per_block` keys per
    /// block (`spec/wire.md`, "What the server computes", steps 2-3).
    #[must_use]
    pub fn of(result: Result<usize, MasterError>, keys_per_block: usize) -> Self {
        match result {
            Ok(blocks) => Self::Run {
                blocks,
                key_error: None,
            },
            Err(
                error @ MasterError::Store {
                    key_index: Some(i), ..
                },
            ) => Self::Run {
                blocks: i / keys_per_block.max(1),
                key_error: Some(error),
            },
            Err(error) => {
                let cause = match error {
                    MasterError::Timeout { .. } => Unanswered::TimedOut,
                    MasterError::MalformedReply { .. } | MasterError::AnswerCount { .. } => {
                        Unanswered::Malformed
                    }
                    _ => Unanswered::Unavailable,
                };
                Self::Failed { cause, error }
            }
        }
    }
}

/// The store's answer to chains of blocks, for any number of tasks: a cheap,
/// cloneable handle over one [`MasterClient`] and one [`Coalescer`] (see the module
/// docs).
#[derive(Clone, Debug)]
pub struct MasterLookup {
    master: MasterClient,
    coalescer: Coalescer,
    layout: KeyLayout,
    config: LookupConfig,
}

impl MasterLookup {
    /// Connects to the master at `addr` with `master` settings.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] for settings [`MasterConfig::validate`] or
    /// [`BatchConfig::validate`] refuse; otherwise as [`MasterClient::connect_to`].
    pub async fn connect(
        addr: MasterAddr,
        master: MasterConfig,
        layout: KeyLayout,
        config: LookupConfig,
    ) -> Result<Self, MasterError> {
        config.batch.validate()?;
        let master = MasterClient::connect_to(addr, master).await?;
        Ok(Self::new(master, layout, config))
    }

    /// The owner over a connected client (which may be shared; its rule-17 count is
    /// the client's). Settings are taken as given: check them with
    /// [`BatchConfig::validate`].
    #[must_use]
    pub fn new(master: MasterClient, layout: KeyLayout, config: LookupConfig) -> Self {
        let coalescer = Coalescer::new(
            master.clone(),
            config.batch.clone(),
            config.lease_ttl,
            config.answer_ttl,
        );
        Self {
            master,
            coalescer,
            layout,
            config,
        }
    }

    /// The same owner (client, batcher, cache, lease, rule-17 count) asking with
    /// another key layout: several models on one master share one connection and
    /// its batches.
    #[must_use]
    pub fn with_layout(&self, layout: KeyLayout) -> Self {
        Self {
            layout,
            ..self.clone()
        }
    }

    /// Keys per block ([`KeyLayout::namespaces`], at least 1).
    #[must_use]
    pub fn keys_per_block(&self) -> usize {
        self.layout.namespaces().len().max(1)
    }

    /// The keys of the first `blocks` blocks of a chain (see
    /// [`KeyLayout::chain_keys`]).
    #[must_use]
    pub fn chain_keys<'h, I>(&self, block_hashes: I, blocks: usize) -> Vec<String>
    where
        I: IntoIterator<Item = &'h [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        self.layout.chain_keys(block_hashes, blocks)
    }

    /// Queues one chain's keys (block-major, `keys_per_block` per block) for the next
    /// [`flush`](Self::flush) ([`Coalescer::submit`]).
    pub fn submit(&self, keys: Vec<String>, keys_per_block: usize) -> Pending {
        self.coalescer.submit(keys, keys_per_block)
    }

    /// Starts a batch of what is queued ([`Coalescer::flush`]). Inside a tokio
    /// runtime.
    pub fn flush(&self) {
        self.coalescer.flush();
    }

    /// One chain's answer, batched with whatever else is queued.
    pub async fn leading_keys(&self, keys: Vec<String>, keys_per_block: usize) -> ChainAnswer {
        let result = self
            .coalescer
            .leading_blocks_flat(keys, keys_per_block)
            .await;
        ChainAnswer::of(result, keys_per_block)
    }

    /// The answer for the first `blocks` blocks of a chain, keyed by this owner's
    /// layout; no key (no full block) is a run of 0 with nothing asked.
    pub async fn leading_chain<'h, I>(&self, block_hashes: I, blocks: usize) -> ChainAnswer
    where
        I: IntoIterator<Item = &'h [u8]>,
        I::IntoIter: ExactSizeIterator,
    {
        let keys = self.chain_keys(block_hashes, blocks);
        if keys.is_empty() {
            return ChainAnswer::Run {
                blocks: 0,
                key_error: None,
            };
        }
        self.leading_keys(keys, self.keys_per_block()).await
    }

    /// Drops the presence cache (a reset, a lookup timeout).
    pub fn clear_presence(&self) {
        self.coalescer.clear_presence();
    }

    /// Holds a result TTL (named by `setting` in the warning) below the read lease
    /// ([`Coalescer::check_ttl`]).
    pub fn check_ttl(&self, ttl: Duration, setting: &'static str) {
        self.coalescer.check_ttl(ttl, setting);
    }

    /// The read lease in use ([`Coalescer::lease`]).
    #[must_use]
    pub fn lease(&self) -> LeaseTtl {
        self.coalescer.lease()
    }

    /// The master client.
    #[must_use]
    pub const fn master(&self) -> &MasterClient {
        &self.master
    }

    /// The batcher (its counters, the lease's changes).
    #[must_use]
    pub const fn coalescer(&self) -> &Coalescer {
        &self.coalescer
    }

    /// The key layout.
    #[must_use]
    pub const fn layout(&self) -> &KeyLayout {
        &self.layout
    }

    /// The settings in use.
    #[must_use]
    pub const fn config(&self) -> &LookupConfig {
        &self.config
    }

    /// The batcher's counters.
    #[must_use]
    pub fn batch_stats(&self) -> BatchStats {
        self.coalescer.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FunctionId, StoreErrorCode};

    #[test]
    fn a_key_error_ends_the_run_and_a_failure_is_never_a_miss() {
        let store = MasterError::Store {
            code: StoreErrorCode::OBJECT_NOT_FOUND,
            key_index: Some(5),
        };
        assert!(matches!(
            ChainAnswer::of(Err(store), 2),
            ChainAnswer::Run {
                blocks: 2,
                key_error: Some(MasterError::Store { .. })
            }
        ));
        assert!(matches!(
            ChainAnswer::of(Ok(3), 2),
            ChainAnswer::Run {
                blocks: 3,
                key_error: None
            }
        ));
        let timeout = MasterError::Timeout {
            function: FunctionId::BATCH_EXIST_KEY,
            after: Duration::from_secs(1),
        };
        assert!(matches!(
            ChainAnswer::of(Err(timeout), 1),
            ChainAnswer::Failed {
                cause: Unanswered::TimedOut,
                ..
            }
        ));
        let count = MasterError::AnswerCount {
            expected: 2,
            got: 1,
        };
        assert!(matches!(
            ChainAnswer::of(Err(count), 1),
            ChainAnswer::Failed {
                cause: Unanswered::Malformed,
                ..
            }
        ));
        let down = MasterError::Unavailable {
            addr: "m".to_owned(),
            last_error: "refused".to_owned(),
        };
        assert!(matches!(
            ChainAnswer::of(Err(down), 1),
            ChainAnswer::Failed {
                cause: Unanswered::Unavailable,
                ..
            }
        ));
    }
}
