//! [`MooncakeIndex`] against a scripted fake master on loopback (the real one runs in the
//! workspace's `mooncake_index_*` tests): keys `err:*` get `OBJECT_NOT_FOUND`, a
//! list holding `refuse` gets coro_rpc's "function not registered", `die` closes
//! the connection, `hang` is never answered.

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
    /// The `RemoveAll` calls received, in order.
    removes: Mutex<Vec<codec::RemoveAllArgs>>,
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
            if header.function_id == FunctionId::REMOVE_ALL {
                let args = codec::decode_remove_all_args(&body).unwrap();
                self.removes.lock().unwrap().push(args);
                let removed = {
                    let mut keys = self.keys.lock().unwrap();
                    let n = keys.len();
                    keys.clear();
                    n
                };
                codec::encode_remove_all_reply(&mut out, seq, removed as i64, lit);
                stream.write_all(&out).await.unwrap();
                continue;
            }
            if header.function_id == FunctionId::GET_REPLICA_LIST {
                // As a master without the call: the index keeps its configured lease.
                codec::encode_error_reply(
                    &mut out,
                    seq,
                    11,
                    "the rpc function not registered",
                    lit,
                );
                stream.write_all(&out).await.unwrap();
                continue;
            }
            assert_eq!(header.function_id, FunctionId::BATCH_EXIST_KEY);
            let keys = codec::decode_batch_exist_key_args(&body).unwrap().keys;
            self.calls.lock().unwrap().push(keys.len());
            if keys.iter().any(|k| k == "die") {
                return;
            }
            if keys.iter().any(|k| k == "hang") {
                continue;
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

/// An index that asks the master every key (no presence cache: these tests count the
/// master's calls).
async fn index(addr: &str, chunk_keys: usize) -> MooncakeIndex {
    let mut config = MasterConfig::default();
    config.chunk_keys = chunk_keys;
    MooncakeIndex::connect(addr, config)
        .await
        .unwrap()
        .with_batching(BatchConfig::uncached())
        .unwrap()
}

#[tokio::test]
async fn leading_blocks_need_every_namespace_and_stop_after_the_run_ends() {
    let (fake, addr) = Fake::start(&["a0", "a1", "b0", "b1", "c0", "d0", "d1"]).await;
    let index = index(&addr, 4).await;
    // Blocks a, b, c, d with 2 keys each; c1 is missing.
    let chain = keys(&["a0", "a1", "b0", "b1", "c0", "c1", "d0", "d1", "e0", "e1"]);
    assert_eq!(
        index.leading_blocks(2, &chain).await.unwrap(),
        LeadingRun {
            blocks: 2,
            keys_asked: 8
        }
    );
    // Chunks of 4 keys (2 whole blocks): the second call ends the run, the third
    // is never sent, and its keys are not counted as asked (bug e).
    assert_eq!(fake.calls(), [4, 4]);
    assert_eq!(
        index.leading_blocks(2, &chain[..4]).await.unwrap().blocks,
        2
    );
    // A trailing partial block never counts, and is never asked about.
    assert_eq!(
        index.leading_blocks(2, &chain[..5]).await.unwrap().blocks,
        2
    );
    assert_eq!(index.leading_blocks(0, &chain).await.unwrap().blocks, 0);
    let stats = index.stats();
    assert_eq!(stats.lookups, 4);
    assert_eq!(stats.blocks_found, 6);
    assert_eq!((stats.errors, stats.key_errors), (0, 0));
    assert_eq!(stats.master.batch_exist_calls, 4);
    assert_eq!(stats.master.keys_asked, 16);
}

/// Four lookups at once, sharing a 2-block prefix: one `BatchExistKey` call with each
/// key once (6 keys), each lookup its own answer; unbatched, four calls of 3 keys.
#[tokio::test]
async fn concurrent_lookups_share_one_call_with_each_key_once() {
    let (fake, addr) = Fake::start(&["s0", "s1", "x0", "x1"]).await;
    let chains: Vec<Vec<String>> = (0..4)
        .map(|i| keys(&["s0", "s1", &format!("x{i}")]))
        .collect();
    let batched = index(&addr, 1024).await;
    let runs = futures::future::join_all(chains.iter().map(|c| batched.leading_blocks(1, c))).await;
    let runs: Vec<usize> = runs.into_iter().map(|r| r.unwrap().blocks).collect();
    assert_eq!(runs, [3, 3, 2, 2]);
    assert_eq!(fake.calls(), [6]);
    let stats = batched.stats();
    assert_eq!((stats.lookups, stats.blocks_found), (4, 10));
    assert_eq!((stats.batch.batches, stats.batch.lookups), (1, 4));
    assert_eq!((stats.batch.keys_wanted, stats.batch.keys_asked), (12, 6));

    let (fake, addr) = Fake::start(&["s0", "s1", "x0", "x1"]).await;
    let alone = index(&addr, 1024)
        .await
        .with_batching(BatchConfig::unbatched())
        .unwrap();
    let runs = futures::future::join_all(chains.iter().map(|c| alone.leading_blocks(1, c))).await;
    let runs: Vec<usize> = runs.into_iter().map(|r| r.unwrap().blocks).collect();
    assert_eq!(runs, [3, 3, 2, 2]);
    assert_eq!(fake.calls(), [3, 3, 3, 3]);
    assert!(matches!(
        alone.with_batching({
            let mut b = BatchConfig::default();
            b.max_lookups = 0;
            b
        }),
        Err(MasterError::InvalidConfig {
            what: "batch.max_lookups",
            ..
        })
    ));
}

#[tokio::test]
async fn a_key_answered_with_an_error_code_ends_the_run_there() {
    let (_fake, addr) = Fake::start(&["a0", "a1", "b0", "c0", "c1"]).await;
    let index = index(&addr, 1024).await;
    // Block b: one key present, the other answered OBJECT_NOT_FOUND.
    let chain = keys(&["a0", "a1", "b0", "err:b1", "c0", "c1"]);
    assert_eq!(index.leading_blocks(2, &chain).await.unwrap().blocks, 1);
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
    assert_eq!(
        answered,
        Some(LeadingRun {
            blocks: 1,
            keys_asked: 2
        })
    );
    assert_eq!(index.stats().master.connects, 2);
}

/// Rule 17: the third lookup in a row failed by the call timeout replaces the master
/// connection (an answered lookup between two timeouts starts the count again); the
/// lookups after it are answered on the new connection.
#[tokio::test]
async fn lookups_timed_out_in_a_row_replace_the_master_connection() {
    let (_fake, addr) = Fake::start(&["a0"]).await;
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_millis(100);
    let index = MooncakeIndex::connect(&addr, config).await.unwrap();
    let hang = keys(&["hang"]);
    let timed_out = |err: &IndexError| matches!(err, IndexError::Unavailable(m) if m.contains("timed out") || m.contains("no reply"));
    for _ in 0..2 {
        let err = index.leading_blocks(1, &hang).await.unwrap_err();
        assert!(timed_out(&err), "{err}");
    }
    let answered = index.leading_blocks(1, &keys(&["a0"])).await.unwrap();
    assert_eq!(answered.blocks, 1);
    for _ in 0..2 {
        let err = index.leading_blocks(1, &hang).await.unwrap_err();
        assert!(timed_out(&err), "{err}");
    }
    let stats = index.stats();
    assert_eq!((stats.reopens, stats.master.reconnects_asked), (0, 0));
    let err = index.exists(&hang).await.unwrap_err();
    assert!(timed_out(&err), "{err}");
    let stats = index.stats();
    assert_eq!((stats.reopens, stats.master.reconnects_asked), (1, 1));
    assert_eq!(stats.errors, 5);
    // The client connects again in the background; the next lookups are answered.
    let mut answered = None;
    for _ in 0..200 {
        if let Ok(run) = index.leading_blocks(1, &keys(&["a0", "b0"])).await {
            answered = Some(run.blocks);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(answered, Some(1));
    assert_eq!(index.stats().master.connects, 2);
    assert_eq!(index.stats().reopens, 1);
}

/// With `with_reopen_after_timeouts(0)` timeouts never replace the connection.
#[tokio::test]
async fn reopen_after_timeouts_zero_keeps_the_connection() {
    let (_fake, addr) = Fake::start(&["a0"]).await;
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_millis(50);
    let index = MooncakeIndex::connect(&addr, config)
        .await
        .unwrap()
        .with_reopen_after_timeouts(0);
    for _ in 0..4 {
        index.leading_blocks(1, &keys(&["hang"])).await.unwrap_err();
    }
    let stats = index.stats();
    assert_eq!(
        (stats.errors, stats.reopens, stats.master.reconnects_asked),
        (4, 0, 0)
    );
    assert_eq!(
        index
            .leading_blocks(1, &keys(&["a0"]))
            .await
            .unwrap()
            .blocks,
        1
    );
    assert_eq!(index.stats().master.connects, 1);
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
            why: "the Mooncake master's RemoveAll is tenant-wide (every engine sharing the \
                  store loses its blocks) and this index was not given \
                  ResetPolicy::RemoveAll; keys stay stored",
        }
    );
    assert_eq!(index.reset_policy(), ResetPolicy::Refuse);
    assert_eq!(index.stats().resets_refused, 1);
    // Nothing was sent to the master for the reset.
    assert!(fake.calls().is_empty());
    assert!(fake.removes.lock().unwrap().is_empty());
    assert_eq!(index.exists(&keys(&["a0"])).await.unwrap(), [true]);
}

#[tokio::test]
async fn reset_with_remove_all_removes_every_key_with_force() {
    let (fake, addr) = Fake::start(&["a0", "a1", "b0"]).await;
    let index = index(&addr, 1024).await.with_reset(ResetPolicy::RemoveAll);
    index.clear().await.unwrap();
    assert_eq!(
        *fake.removes.lock().unwrap(),
        [codec::RemoveAllArgs {
            force: true,
            tenant_id: Some("default".to_owned())
        }]
    );
    assert_eq!(
        index.exists(&keys(&["a0", "a1", "b0"])).await.unwrap(),
        [false; 3]
    );
    let stats = index.stats();
    assert_eq!(
        (
            stats.resets_done,
            stats.objects_removed,
            stats.resets_refused,
            stats.reset_errors
        ),
        (1, 3, 0, 0)
    );
}

fn cached() -> BatchConfig {
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    batch
}

/// Asks `keys` until the presence cache serves them (once the lease is known).
async fn warm(index: &MooncakeIndex, keys: &[String]) {
    for _ in 0..3 {
        assert_eq!(
            index.leading_blocks(1, keys).await.unwrap().blocks,
            keys.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(index.stats().batch.keys_from_cache > 0);
}

/// The index's own reset (`RemoveAll(force)`) ends its presence cache: right after
/// removing everything, no lookup claims a block.
#[tokio::test]
async fn the_index_own_remove_all_ends_its_presence_cache() {
    let (_fake, addr) = Fake::start(&["a0", "a1"]).await;
    let index = index(&addr, 1024)
        .await
        .with_reset(ResetPolicy::RemoveAll)
        .with_batching(cached())
        .unwrap();
    let chain = keys(&["a0", "a1"]);
    warm(&index, &chain).await;
    index.clear().await.unwrap();
    assert_eq!(index.leading_blocks(1, &chain).await.unwrap().blocks, 0);
}

/// The cache's margin is the clients' result TTL: with a 10 s lease and clients that
/// keep results 9.5 s, a cached key is never used (it would not outlast their use).
#[tokio::test]
async fn the_cache_margin_is_the_clients_ttl() {
    let (fake, addr) = Fake::start(&["a0"]).await;
    let index = index(&addr, 1024)
        .await
        .with_batching(cached())
        .unwrap()
        .check_client_ttl(Duration::from_millis(9_500));
    let chain = keys(&["a0"]);
    for _ in 0..3 {
        assert_eq!(index.leading_blocks(1, &chain).await.unwrap().blocks, 1);
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(index.stats().batch.keys_from_cache, 0);
    assert_eq!(fake.calls(), [1, 1, 1]);
}

#[tokio::test]
async fn a_failed_remove_all_fails_the_reset() {
    let (fake, addr) = Fake::start(&["a0"]).await;
    let index = index(&addr, 1024).await.with_reset(ResetPolicy::RemoveAll);
    // The connection breaks; the reset fails fast instead of removing anything.
    let _ = index.exists(&keys(&["die"])).await.unwrap_err();
    let err = index.clear().await.unwrap_err();
    assert!(matches!(err, IndexError::Unavailable(_)), "{err}");
    assert_eq!(index.stats().reset_errors, 1);
    assert!(fake.removes.lock().unwrap().is_empty());
}

#[tokio::test]
async fn leader_changes_are_added_to_the_counter() {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let counter = metrics::with_local_recorder(&recorder, crate::metrics::mooncake_leader_changes);
    let (views, rx) = watch::channel(LeaderState::default());
    let task = tokio::spawn(count_leader_changes(rx, counter));
    let total = || {
        handle
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("lookup_server_mooncake_leader_changes_total "))
            .map(|v| v.parse::<f64>().unwrap())
    };
    // Two changes before the task wakes count as two.
    views.send_modify(|s| s.changes = 1);
    views.send_modify(|s| s.changes = 2);
    for _ in 0..100 {
        if total() == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(total(), Some(2.0));
    views.send_modify(|s| s.changes = 3);
    drop(views);
    // The client is gone: the task ends after counting the last change.
    task.await.unwrap();
    assert_eq!(total(), Some(3.0));
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
        IndexError::Store("the Mooncake master answered 2 existence results for 3 keys".to_owned())
    );
}

/// A lookup's own key count: whole chunks up to the one holding the first absent
/// block (40 blocks x 2 keys, chunks of 8 keys = 4 blocks).
#[test]
fn keys_needed_counts_chunks_through_the_first_absent_block() {
    use super::keys_needed;
    assert_eq!(keys_needed(40, 2, 8, 9), 24);
    assert_eq!(keys_needed(40, 2, 8, 0), 8);
    assert_eq!(keys_needed(40, 2, 8, 40), 80);
    assert_eq!(keys_needed(41, 2, 8, 40), 82);
    // A block wider than a chunk is asked alone.
    assert_eq!(keys_needed(5, 16, 8, 2), 48);
    assert_eq!(keys_needed(5, 0, 8, 0), 0);
}

/// Lookups that share one timed-out call are one timeout (rule 17 counts calls, not
/// lookups): six lookups of one stalled call at k = 2 keep the connection; the next
/// call, sent after that timeout and timing out too, is the second in a row and
/// replaces it, once.
#[tokio::test]
async fn lookups_of_one_timed_out_call_count_one_timeout() {
    let (_fake, addr) = Fake::start(&["a0"]).await;
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_millis(100);
    let index = Arc::new(
        MooncakeIndex::connect(&addr, config)
            .await
            .unwrap()
            .with_reopen_after_timeouts(2),
    );
    let stall = |from: usize| {
        let lookups: Vec<_> = (from..from + 6)
            .map(|i| {
                let index = Arc::clone(&index);
                let hang = keys(&["hang", &format!("k{i}")]);
                tokio::spawn(async move { index.leading_blocks(1, &hang).await })
            })
            .collect();
        async move {
            for lookup in lookups {
                lookup.await.unwrap().unwrap_err();
            }
        }
    };
    stall(0).await;
    let stats = index.stats();
    assert_eq!(
        (
            stats.errors,
            stats.master.batch_exist_calls,
            stats.reopens,
            stats.master.reconnects_asked
        ),
        (6, 1, 0, 0)
    );
    assert_eq!(index.master().timeouts_in_a_row(), 1);
    stall(6).await;
    let stats = index.stats();
    assert_eq!(
        (stats.errors, stats.reopens, stats.master.reconnects_asked),
        (12, 1, 1)
    );
}
