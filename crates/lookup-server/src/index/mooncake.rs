//! [`MooncakeIndex`]: the lookup server's Mooncake Store backend, a [`BlockIndex`] that
//! asks a real Mooncake master which block keys exist, over the master's own
//! existence RPC ([`mooncake_master::MasterClient`], `spec/mooncake-master-rpc.md`).
//!
//! It answers the way vLLM's MooncakeStoreConnector worker does (`spec/wire.md`, "What
//! the server computes"): the server builds every rank-namespace key of the blocks in
//! question with its [`KeyLayout`](mooncake_master::KeyLayout), and the index asks the master
//! about them in one logical `BatchExistKey` query per lookup.

use std::sync::atomic::{AtomicU64, Ordering};

use mooncake_master::{MasterClient, MasterConfig, MasterError, MasterStats};
use tracing::Instrument;

use super::{BlockIndex, IndexError, IndexFuture};

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
///   once the master is back on the same address.
/// - A key the master answers with an application `ErrorCode` (inside an otherwise
///   good reply) is not present: vLLM's worker counts only answers equal to 1 (the C++
///   client turns such a key into `-1`), so the leading run ends at that key's block
///   (`spec/wire.md`, step 2). Counted in [`IndexStats::key_errors`].
///
/// # Reset
///
/// The existence RPC has no remove-all: `spec/mooncake-master-rpc.md` specifies only
/// `BatchExistKey`, `ExistKey`, `ServiceReady` and `Ping`, and a reset through the
/// master would also need to drain the writers' pending puts, which only the worker
/// that owns the store client can do. So [`clear`](BlockIndex::clear) removes nothing
/// and fails with [`IndexError::Unsupported`]: the server answers a reset request with
/// `0x00` (failed) and counts it in `ServerStats::reset_failures` and
/// [`IndexStats::resets_refused`]; every key stays in the store.
#[derive(Debug)]
pub struct MooncakeIndex {
    master: MasterClient,
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
    /// Reset requests refused (the master's existence RPC has no remove-all).
    pub resets_refused: u64,
    /// The master client's own counters: `BatchExistKey` calls, keys sent, timeouts,
    /// reconnects.
    pub master: MasterStats,
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
}

/// Adds `n` and returns the new value.
fn bump(counter: &AtomicU64, n: u64) -> u64 {
    counter.fetch_add(n, Ordering::Relaxed) + n
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Whether a failure means the master could not be reached, rather than a master that
/// answered wrongly.
fn is_unavailable(e: &MasterError) -> bool {
    matches!(
        e,
        MasterError::Connect { .. }
            | MasterError::Unavailable { .. }
            | MasterError::ConnectionLost { .. }
            | MasterError::Timeout { .. }
    )
}

/// The server-side view of a master failure: unreachable, or a store-side error.
fn index_error(e: &MasterError) -> IndexError {
    if is_unavailable(e) {
        IndexError::Unavailable(e.to_string())
    } else {
        IndexError::Store(e.to_string())
    }
}

impl MooncakeIndex {
    /// Connects to the Mooncake master at `addr` (`host:port`, default port 50051)
    /// with `config` (chunk size, call timeout, `tenant_id`). Must run inside a tokio
    /// runtime, which then hosts the connection's tasks.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] for an unusable `config` (for example
    /// `chunk_keys` 0); [`MasterError::Connect`] when the first connect fails. Later
    /// failures are not errors here: lookups fail open while the client reconnects.
    pub async fn connect(addr: &str, config: MasterConfig) -> Result<Self, MasterError> {
        Ok(Self::new(MasterClient::connect(addr, config).await?))
    }

    /// An index over an existing client (which may be shared with other users; its
    /// counters then count their calls too).
    #[must_use]
    pub fn new(master: MasterClient) -> Self {
        Self {
            master,
            counters: IndexCounters::default(),
        }
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
            master: self.master.stats(),
        }
    }

    /// Counts a failed query and turns it into the server's error.
    fn failed(&self, e: &MasterError) -> IndexError {
        let n = bump(&self.counters.errors, 1);
        if is_unavailable(e) {
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
    ) -> Result<usize, IndexError> {
        bump(&self.counters.lookups, 1);
        if keys_per_block == 0 {
            return Ok(0);
        }
        let run = match self.master.leading_blocks_flat(keys, keys_per_block).await {
            Ok(run) => run,
            // The key that would end the run carries an ErrorCode: every key before it
            // was answered `true`, so the run ends at its block (vLLM counts only 1s).
            Err(
                e @ MasterError::Store {
                    key_index: Some(i), ..
                },
            ) => {
                self.key_error(&e);
                i / keys_per_block
            }
            Err(e) => return Err(self.failed(&e)),
        };
        bump(&self.counters.blocks_found, count(run));
        Ok(run)
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
    ) -> IndexFuture<'a, usize> {
        let span = tracing::debug_span!("mooncake_lookup", keys = keys.len(), keys_per_block);
        Box::pin(
            self.query_leading_blocks(keys_per_block, keys)
                .instrument(span),
        )
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        let n = bump(&self.counters.resets_refused, 1);
        if n.is_power_of_two() {
            tracing::warn!(
                count = n,
                "reset refused: the Mooncake master's existence RPC has no remove-all; no key was removed"
            );
        }
        Box::pin(std::future::ready(Err(IndexError::Unsupported {
            operation: "reset",
            why: "the Mooncake master's existence RPC has no remove-all; keys stay stored",
        })))
    }
}

#[cfg(test)]
mod tests {
    //! Against a scripted fake master on loopback (the real one runs in the
    //! workspace's `mooncake_index_*` tests): keys `err:*` get `OBJECT_NOT_FOUND`, a
    //! list holding `refuse` gets coro_rpc's "function not registered", `die` closes
    //! the connection.

    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use mooncake_master::codec::{self, ExistResult, FunctionId, REQUEST_HEADER_LEN};
    use mooncake_master::{StoreErrorCode, TypeLiteral};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    #[derive(Default)]
    struct Fake {
        keys: Mutex<HashSet<String>>,
        /// Key counts of the `BatchExistKey` calls received, in order.
        calls: Mutex<Vec<usize>>,
    }

    impl Fake {
        async fn start(keys: &[&str]) -> (Arc<Self>, String) {
            let fake = Arc::new(Self::default());
            fake.keys
                .lock()
                .unwrap()
                .extend(keys.iter().map(|k| (*k).to_owned()));
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let served = Arc::clone(&fake);
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(Arc::clone(&served).serve(stream));
                }
            });
            (fake, addr)
        }

        fn answer(&self, key: &str) -> ExistResult {
            if key.starts_with("err:") {
                Err(StoreErrorCode::OBJECT_NOT_FOUND)
            } else {
                Ok(self.keys.lock().unwrap().contains(key))
            }
        }

        async fn serve(self: Arc<Self>, mut stream: TcpStream) {
            loop {
                let mut head = [0u8; REQUEST_HEADER_LEN];
                if stream.read_exact(&mut head).await.is_err() {
                    return;
                }
                let header = codec::RequestHeader::decode(&head).unwrap();
                let mut body = vec![0; header.body_length as usize];
                stream.read_exact(&mut body).await.unwrap();
                let seq = header.seq_num;
                let lit = TypeLiteral::Include;
                let mut out = Vec::new();
                assert_eq!(header.function_id, FunctionId::BATCH_EXIST_KEY);
                let keys = codec::decode_batch_exist_key_args(&body).unwrap().keys;
                self.calls.lock().unwrap().push(keys.len());
                if keys.iter().any(|k| k == "die") {
                    return;
                }
                if keys.iter().any(|k| k == "refuse") {
                    codec::encode_error_reply(
                        &mut out,
                        seq,
                        11,
                        "the rpc function not registered",
                        lit,
                    );
                } else {
                    let answers: Vec<ExistResult> = keys.iter().map(|k| self.answer(k)).collect();
                    codec::encode_batch_exist_key_reply(&mut out, seq, &answers, lit);
                }
                stream.write_all(&out).await.unwrap();
            }
        }

        fn calls(&self) -> Vec<usize> {
            self.calls.lock().unwrap().clone()
        }
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| (*k).to_owned()).collect()
    }

    async fn index(addr: &str, chunk_keys: usize) -> MooncakeIndex {
        let mut config = MasterConfig::default();
        config.chunk_keys = chunk_keys;
        MooncakeIndex::connect(addr, config).await.unwrap()
    }

    #[tokio::test]
    async fn leading_blocks_need_every_namespace_and_stop_after_the_run_ends() {
        let (fake, addr) = Fake::start(&["a0", "a1", "b0", "b1", "c0", "d0", "d1"]).await;
        let index = index(&addr, 4).await;
        // Blocks a, b, c, d with 2 keys each; c1 is missing.
        let chain = keys(&["a0", "a1", "b0", "b1", "c0", "c1", "d0", "d1", "e0", "e1"]);
        assert_eq!(index.leading_blocks(2, &chain).await.unwrap(), 2);
        // Chunks of 4 keys (2 whole blocks): the second call ends the run, the third
        // is never sent.
        assert_eq!(fake.calls(), [4, 4]);
        assert_eq!(index.leading_blocks(2, &chain[..4]).await.unwrap(), 2);
        // A trailing partial block never counts, and is never asked about.
        assert_eq!(index.leading_blocks(2, &chain[..5]).await.unwrap(), 2);
        assert_eq!(index.leading_blocks(0, &chain).await.unwrap(), 0);
        let stats = index.stats();
        assert_eq!(stats.lookups, 4);
        assert_eq!(stats.blocks_found, 6);
        assert_eq!((stats.errors, stats.key_errors), (0, 0));
        assert_eq!(stats.master.batch_exist_calls, 4);
        assert_eq!(stats.master.keys_asked, 16);
    }

    #[tokio::test]
    async fn a_key_answered_with_an_error_code_ends_the_run_there() {
        let (_fake, addr) = Fake::start(&["a0", "a1", "b0", "c0", "c1"]).await;
        let index = index(&addr, 1024).await;
        // Block b: one key present, the other answered OBJECT_NOT_FOUND.
        let chain = keys(&["a0", "a1", "b0", "err:b1", "c0", "c1"]);
        assert_eq!(index.leading_blocks(2, &chain).await.unwrap(), 1);
        assert_eq!(
            index.exists(&chain).await.unwrap(),
            [true, true, true, false, true, true]
        );
        let stats = index.stats();
        assert_eq!(stats.key_errors, 2);
        assert_eq!(stats.errors, 0);
        assert_eq!(stats.blocks_found, 1);
        assert_eq!(stats.exists_calls, 1);
    }

    #[tokio::test]
    async fn failed_calls_are_counted_errors() {
        let (_fake, addr) = Fake::start(&["a0"]).await;
        let index = index(&addr, 1024).await;
        let err = index
            .leading_blocks(1, &keys(&["a0", "refuse"]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, IndexError::Store(m) if m.contains("does not register")),
            "{err}"
        );
        let err = index.exists(&keys(&["die"])).await.unwrap_err();
        assert!(matches!(err, IndexError::Unavailable(_)), "{err}");
        let stats = index.stats();
        assert_eq!((stats.errors, stats.unavailable), (2, 1));
        // The client reconnects in the background; the next calls succeed.
        let mut answered = None;
        for _ in 0..200 {
            if let Ok(run) = index.leading_blocks(1, &keys(&["a0", "b0"])).await {
                answered = Some(run);
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(answered, Some(1));
        assert_eq!(index.stats().master.connects, 2);
    }

    #[tokio::test]
    async fn reset_is_refused_and_removes_nothing() {
        let (fake, addr) = Fake::start(&["a0"]).await;
        let index = index(&addr, 1024).await;
        let err = index.clear().await.unwrap_err();
        assert_eq!(
            err,
            IndexError::Unsupported {
                operation: "reset",
                why: "the Mooncake master's existence RPC has no remove-all; keys stay stored",
            }
        );
        assert_eq!(index.stats().resets_refused, 1);
        // Nothing was sent to the master for the reset.
        assert!(fake.calls().is_empty());
        assert_eq!(index.exists(&keys(&["a0"])).await.unwrap(), [true]);
    }

    #[test]
    fn master_failures_map_to_index_errors() {
        let lost = MasterError::ConnectionLost {
            addr: "127.0.0.1:1".to_owned(),
            reason: "closed by the master".to_owned(),
        };
        assert!(
            matches!(index_error(&lost), IndexError::Unavailable(m) if m.contains("closed by the master"))
        );
        let count = MasterError::AnswerCount {
            expected: 3,
            got: 2,
        };
        assert_eq!(
            index_error(&count),
            IndexError::Store(
                "the Mooncake master answered 2 existence results for 3 keys".to_owned()
            )
        );
    }
}
