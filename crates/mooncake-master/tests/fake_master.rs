//! The client against a scripted fake master on loopback (the real one is exercised
//! in the workspace's e2e tests): pipelining and sequence matching, timeouts and late
//! replies, the `tenant_id` fall-back, typed RPC and store errors, chunking with early
//! stop, broken connections and reconnects.
//!
//! The fake answers with this crate's own server-side codec, whose bytes the unit
//! tests pin to captures of the real master. Special keys script its behaviour:
//! `hold:*` (answer only when the next request arrives, after it in reverse order
//! when `reverse` is set), `die` (close the connection), `garbage` (an undecodable
//! body), `short` (one answer too few), `badmagic` (an unframeable reply),
//! `err:*` (an `OBJECT_NOT_FOUND` answer), `silent:*` (never answered).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooncake_master::codec::{self, ExistResult, FunctionId, REQUEST_HEADER_LEN, RequestHeader};
use mooncake_master::{MasterClient, MasterConfig, MasterError, StoreErrorCode, TypeLiteral};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Fake {
    keys: Mutex<HashSet<String>>,
    /// Refuse the `tenant_id` signatures, as a pre-0.3.12 master would.
    legacy_only: AtomicBool,
    /// Send a held reply after the next one instead of before it.
    reverse: AtomicBool,
    requests: AtomicUsize,
    connections: AtomicUsize,
}

impl Fake {
    async fn start() -> (Arc<Self>, String, tokio::task::JoinHandle<()>) {
        let fake = Arc::new(Self::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let served = fake.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                served.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(served.clone().serve(stream));
            }
        });
        (fake, addr, task)
    }

    fn put(&self, keys: impl IntoIterator<Item = String>) {
        self.keys.lock().unwrap().extend(keys);
    }

    fn answer(&self, key: &str) -> ExistResult {
        if key.starts_with("err:") {
            Err(StoreErrorCode::OBJECT_NOT_FOUND)
        } else {
            Ok(key.starts_with("hold:") || self.keys.lock().unwrap().contains(key))
        }
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        let mut held: Option<Vec<u8>> = None;
        loop {
            let mut head = [0u8; REQUEST_HEADER_LEN];
            if stream.read_exact(&mut head).await.is_err() {
                return;
            }
            let header = RequestHeader::decode(&head).unwrap();
            let mut body = vec![0; header.body_length as usize];
            stream.read_exact(&mut body).await.unwrap();
            self.requests.fetch_add(1, Ordering::SeqCst);
            let seq = header.seq_num;
            let lit = TypeLiteral::Include;
            let mut out = Vec::new();
            let mut hold = false;
            let legacy_only = self.legacy_only.load(Ordering::SeqCst);
            match header.function_id {
                FunctionId::BATCH_EXIST_KEY => match codec::decode_batch_exist_key_args(&body) {
                    Ok(args) if args.tenant_id.is_some() != legacy_only => {
                        let keys = args.keys;
                        if keys.iter().any(|k| k == "die") {
                            return;
                        }
                        if keys.iter().any(|k| k.starts_with("silent:")) {
                            continue;
                        }
                        if keys.iter().any(|k| k == "badmagic") {
                            let _ = stream.write_all(&[0x16; 16]).await;
                            continue;
                        }
                        if keys.iter().any(|k| k == "garbage") {
                            out.extend_from_slice(
                                &codec::ReplyHeader {
                                    err_code: 0,
                                    msg_type: 0,
                                    seq_num: seq,
                                    body_length: 3,
                                    attach_length: 0,
                                }
                                .encode(),
                            );
                            out.extend_from_slice(&[1, 2, 3]);
                        } else {
                            let mut answers: Vec<ExistResult> =
                                keys.iter().map(|k| self.answer(k)).collect();
                            if keys.iter().any(|k| k == "short") {
                                answers.pop();
                            }
                            hold = keys.iter().any(|k| k.starts_with("hold:"));
                            codec::encode_batch_exist_key_reply(&mut out, seq, &answers, lit);
                        }
                    }
                    _ => codec::encode_error_reply(&mut out, seq, 4, "invalid rpc arg", lit),
                },
                FunctionId::EXIST_KEY => match codec::decode_exist_key_args(&body) {
                    Ok(args) if args.tenant_id.is_some() != legacy_only => {
                        let answer = self.answer(&args.keys);
                        codec::encode_exist_key_reply(&mut out, seq, answer, lit);
                    }
                    _ => codec::encode_error_reply(&mut out, seq, 4, "invalid rpc arg", lit),
                },
                FunctionId::SERVICE_READY => {
                    codec::encode_service_ready_reply(&mut out, seq, Ok("2.0.0"), lit);
                }
                _ => codec::encode_error_reply(
                    &mut out,
                    seq,
                    11,
                    "the rpc function not registered",
                    lit,
                ),
            }
            if hold {
                held = Some(out);
                continue;
            }
            if let Some(earlier) = held.take() {
                if self.reverse.load(Ordering::SeqCst) {
                    out.extend_from_slice(&earlier);
                } else {
                    out.splice(0..0, earlier);
                }
            }
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

fn config(chunk_keys: usize) -> MasterConfig {
    let mut config = MasterConfig::default();
    config.chunk_keys = chunk_keys;
    config.call_timeout = Duration::from_secs(2);
    config
}

fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{i:04x}"))
        .collect()
}

#[tokio::test]
async fn leading_run_chunks_and_stops_at_the_first_chunk_with_a_miss() {
    let (fake, addr, _task) = Fake::start().await;
    let chain = keys(2000);
    fake.put(chain[..1000].iter().cloned());
    let master = MasterClient::connect(&addr, config(256)).await.unwrap();

    assert_eq!(master.leading_run(&chain).await.unwrap(), 1000);
    // Chunks 0..=3 cover keys 0..1024: the fourth holds the miss at 1000.
    assert_eq!(master.stats().batch_exist_calls, 4);
    assert_eq!(master.stats().keys_asked, 1024);

    fake.put(chain[1000..].iter().cloned());
    assert_eq!(master.leading_run(&chain).await.unwrap(), 2000);
    assert_eq!(master.stats().batch_exist_calls, 4 + 8);

    // Every key, all chunks pipelined: the answers stay in order.
    let mut mixed = chain.clone();
    mixed[1500] = "absent".to_owned();
    let found = master.batch_exist(&mixed).await.unwrap();
    assert_eq!(found.len(), 2000);
    assert_eq!(found.iter().filter(|&&f| !f).count(), 1);
    assert!(!found[1500]);
    assert_eq!(master.stats().batch_exist_calls, 12 + 8);
    assert_eq!(master.leading_run(&mixed).await.unwrap(), 1500);
    assert_eq!(master.leading_run::<String>(&[]).await.unwrap(), 0);
    assert_eq!(master.stats().connects, 1);
}

#[tokio::test]
async fn leading_blocks_needs_every_namespace_key() {
    let (fake, addr, _task) = Fake::start().await;
    let blocks: Vec<Vec<String>> = (0..10)
        .map(|b| (0..4).map(|ns| format!("ns{ns}-b{b}")).collect())
        .collect();
    fake.put(blocks.iter().flatten().cloned());
    // Block 6 lacks namespace 2's key.
    fake.keys.lock().unwrap().remove("ns2-b6");
    // 10 keys per call: two whole 4-key blocks per chunk.
    let master = MasterClient::connect(&addr, config(10)).await.unwrap();
    assert_eq!(master.leading_blocks(&blocks).await.unwrap(), 6);
    assert_eq!(master.stats().batch_exist_calls, 4);
    assert_eq!(master.stats().keys_asked, 32);

    let flat: Vec<String> = blocks.iter().flatten().cloned().collect();
    assert_eq!(master.leading_blocks_flat(&flat, 4).await.unwrap(), 6);
    assert_eq!(master.leading_blocks_flat(&flat[..10], 4).await.unwrap(), 2);
    assert!(matches!(
        master.leading_blocks_flat(&flat, 0).await,
        Err(MasterError::InvalidConfig {
            what: "keys_per_block",
            ..
        })
    ));
    // A block wider than a chunk goes alone; a block without keys ends the run.
    let wide = vec![blocks[..3].concat(), Vec::new(), blocks[0].clone()];
    assert_eq!(master.leading_blocks(&wide).await.unwrap(), 1);
}

#[tokio::test]
async fn replies_are_matched_by_sequence_number() {
    let (fake, addr, _task) = Fake::start().await;
    fake.reverse.store(true, Ordering::SeqCst);
    fake.put(["b".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    let first = master.clone();
    let held = tokio::spawn(async move { first.batch_exist(&["hold:a", "x"]).await });
    // Let the held request reach the fake before the next one.
    while fake.requests.load(Ordering::SeqCst) < 1 {
        tokio::task::yield_now().await;
    }
    let second = master.batch_exist(&["b", "c", "d"]).await.unwrap();
    assert_eq!(second, [true, false, false]);
    assert_eq!(held.await.unwrap().unwrap(), [true, false]);
    assert_eq!(master.stats().replies, 2);
}

#[tokio::test]
async fn a_timed_out_call_leaves_the_connection_usable_and_its_reply_is_dropped() {
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["b".to_owned()]);
    // Short enough to wait out, long enough for the next call on a busy machine.
    let mut config = config(1024);
    config.call_timeout = Duration::from_millis(500);
    let master = MasterClient::connect(&addr, config).await.unwrap();
    let err = master.batch_exist(&["hold:a"]).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::Timeout {
                function: FunctionId::BATCH_EXIST_KEY,
                ..
            }
        ),
        "{err}"
    );
    // The fake now sends the held reply, then this one.
    assert!(master.exist("b").await.unwrap());
    let stats = master.stats();
    assert_eq!(
        (stats.timeouts, stats.late_replies, stats.replies),
        (1, 1, 1)
    );
    assert_eq!((stats.connects, stats.connections_lost), (1, 0));
}

#[tokio::test]
async fn falls_back_to_the_one_argument_signature_once_per_connection() {
    let (fake, addr, _task) = Fake::start().await;
    fake.legacy_only.store(true, Ordering::SeqCst);
    fake.put(["a".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    assert_eq!(
        master.batch_exist(&["a", "b"]).await.unwrap(),
        [true, false]
    );
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        2,
        "refused, then retried"
    );
    assert_eq!(master.leading_run(&["a", "b"]).await.unwrap(), 1);
    assert!(master.exist("a").await.unwrap());
    assert_eq!(
        fake.requests.load(Ordering::SeqCst),
        4,
        "remembered afterwards"
    );
    assert_eq!(master.stats().signature_fallbacks, 1);
}

#[tokio::test]
async fn unknown_functions_and_wrong_arguments_are_typed_and_not_fatal() {
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["a".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    let err = master
        .call_raw(FunctionId(0x1234_5678), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MasterError::FunctionNotRegistered { function: FunctionId(0x1234_5678), message }
            if message == "the rpc function not registered"),
        "{err}"
    );
    let err = master
        .call_raw(FunctionId::EXIST_KEY, &[1, 2, 3])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MasterError::InvalidArguments { function: FunctionId::EXIST_KEY, message }
            if message == "invalid rpc arg"),
        "{err}"
    );
    assert_eq!(master.service_ready().await.unwrap(), "2.0.0");
    assert_eq!(master.batch_exist(&["a"]).await.unwrap(), [true]);
    assert_eq!(master.stats().connects, 1);
    assert_eq!(fake.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn store_error_codes_are_typed_with_the_key_index() {
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["a".to_owned(), "b".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    let keys = ["a", "err:x", "b"];
    assert_eq!(
        master.batch_exist_results(&keys).await.unwrap(),
        [Ok(true), Err(StoreErrorCode::OBJECT_NOT_FOUND), Ok(true)]
    );
    let err = master.batch_exist(&keys).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::Store {
                code: StoreErrorCode::OBJECT_NOT_FOUND,
                key_index: Some(1)
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the Mooncake master answered OBJECT_NOT_FOUND (-704) for key #1"
    );
    // The run ends at the error: unknown, so an error carrying the known-present count.
    let err = master.leading_run(&keys).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::Store {
                key_index: Some(1),
                ..
            }
        ),
        "{err}"
    );
    // An error after a miss does not matter.
    assert_eq!(master.leading_run(&["a", "c", "err:x"]).await.unwrap(), 1);
    // In a block, a missing key decides even next to an error.
    let blocks = [vec!["a", "b"], vec!["err:y", "c"]];
    assert_eq!(master.leading_blocks(&blocks).await.unwrap(), 1);
    let err = master.exist("err:z").await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::Store {
                code: StoreErrorCode(-704),
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn malformed_and_miscounted_replies_are_peer_errors() {
    let (_fake, addr, _task) = Fake::start().await;
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    let err = master.batch_exist(&["garbage"]).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::MalformedReply {
                function: FunctionId::BATCH_EXIST_KEY,
                ..
            }
        ),
        "{err}"
    );
    let err = master.batch_exist(&["x", "short"]).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::AnswerCount {
                expected: 2,
                got: 1
            }
        ),
        "{err}"
    );
    assert_eq!(master.batch_exist(&["x"]).await.unwrap(), [false]);
    assert_eq!(master.stats().connects, 1);
}

/// Retries `exist("a")` until it succeeds; every failure must be a connection error.
async fn until_reconnected(master: &MasterClient) {
    for _ in 0..500 {
        match master.exist("a").await {
            Ok(found) => {
                assert!(found);
                return;
            }
            Err(MasterError::Unavailable { .. } | MasterError::ConnectionLost { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("unexpected error while reconnecting: {e}"),
        }
    }
    panic!("no reconnect within 5 s");
}

#[tokio::test]
async fn a_broken_connection_fails_its_calls_and_is_replaced() {
    let (fake, addr, task) = Fake::start().await;
    fake.put(["a".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    let err = master.batch_exist(&["die"]).await.unwrap_err();
    assert!(
        matches!(&err, MasterError::ConnectionLost { reason, .. } if reason == "closed by the master"),
        "{err}"
    );
    until_reconnected(&master).await;
    assert_eq!(fake.connections.load(Ordering::SeqCst), 2);

    let err = master.batch_exist(&["badmagic"]).await.unwrap_err();
    assert!(
        matches!(&err, MasterError::ConnectionLost { reason, .. } if reason.starts_with("protocol violation")),
        "{err}"
    );
    until_reconnected(&master).await;
    let stats = master.stats();
    assert_eq!((stats.connects, stats.connections_lost), (3, 2));

    // No master at all: calls fail fast, and keep failing while attempts back off.
    task.abort();
    let _ = task.await;
    let err = master.batch_exist(&["die"]).await.unwrap_err();
    assert!(matches!(err, MasterError::ConnectionLost { .. }), "{err}");
    for _ in 0..5 {
        let err = master.exist("a").await.unwrap_err();
        assert!(matches!(err, MasterError::Unavailable { .. }), "{err}");
    }
    assert!(master.stats().failed_fast >= 5);
}

/// Rule 17, counted by the client per call: the k-th call timeout in a row of one
/// connection replaces it, once; calls in flight together are one stall (one count);
/// an answer in time starts the count again; a new connection starts at 0; 0 never.
#[tokio::test]
async fn call_timeouts_in_a_row_replace_the_connection_once() {
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["a".to_owned()]);
    let mut config = config(1024);
    config.call_timeout = Duration::from_millis(50);
    config.reopen_after_timeouts = 2;
    let master = MasterClient::connect(&addr, config).await.unwrap();
    assert_eq!(master.connection_id(), Some(1));
    // Eight calls stalled together: one timeout in a row, not eight.
    let stalled = (0..8).map(|i| master.exist_batch_silent(i));
    let failed = futures::future::join_all(stalled).await;
    assert!(
        failed
            .iter()
            .all(|e| matches!(e, MasterError::Timeout { .. }))
    );
    assert_eq!(master.timeouts_in_a_row(), 1);
    assert_eq!(master.stats().timeouts, 8);
    // An answer starts again.
    assert!(master.exist("a").await.unwrap());
    assert_eq!(master.timeouts_in_a_row(), 0);
    master.exist_batch_silent(10).await;
    assert_eq!(master.timeouts_in_a_row(), 1);
    assert_eq!(master.stats().timeout_reopens, 0);
    // The second in a row, sent after the first fired: replaced.
    master.exist_batch_silent(11).await;
    let stats = master.stats();
    assert_eq!((stats.timeout_reopens, stats.reconnects_asked), (1, 1));
    until_reconnected(&master).await;
    assert_eq!(master.connection_id(), Some(2));
    assert_eq!(master.timeouts_in_a_row(), 0);
    master.exist_batch_silent(12).await;
    assert_eq!(master.timeouts_in_a_row(), 1);
    // 0: never.
    master.set_reopen_after_timeouts(0);
    for i in 13..16 {
        master.exist_batch_silent(i).await;
    }
    assert_eq!(master.stats().timeout_reopens, 1);
    assert_eq!(master.connection_id(), Some(2));
    assert_eq!(fake.connections.load(Ordering::SeqCst), 2);
}

trait Silent {
    /// One call the fake never answers; its error.
    async fn exist_batch_silent(&self, i: u32) -> MasterError;
}

impl Silent for MasterClient {
    async fn exist_batch_silent(&self, i: u32) -> MasterError {
        self.batch_exist(&[format!("silent:{i}")])
            .await
            .unwrap_err()
    }
}

#[tokio::test]
async fn refused_connect_and_bad_config_are_reported() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let err = MasterClient::connect(&addr, MasterConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, MasterError::Connect { .. }), "{err}");
    let err = MasterClient::connect(&addr, config(0)).await.unwrap_err();
    assert!(
        matches!(
            err,
            MasterError::InvalidConfig {
                what: "chunk_keys",
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn debug_form_requests_are_understood() {
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["a".to_owned()]);
    let mut config = config(1024);
    config.type_literal = TypeLiteral::Include;
    let master = MasterClient::connect(&addr, config).await.unwrap();
    assert_eq!(
        master.batch_exist(&["a", "b"]).await.unwrap(),
        [true, false]
    );
    assert!(master.exist("a").await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handle_serves_many_tasks_at_once() {
    fn shareable<T: Send + Sync + Clone + 'static>(_: &T) {}
    let (fake, addr, _task) = Fake::start().await;
    fake.put(["a".to_owned()]);
    let master = MasterClient::connect(&addr, config(1024)).await.unwrap();
    shareable(&master);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let master = master.clone();
            tokio::spawn(async move {
                let blocks = vec![vec!["a".to_owned()], vec![format!("b{i}")]];
                (
                    master.leading_blocks(&blocks).await.unwrap(),
                    master.batch_exist(&blocks.concat()).await.unwrap(),
                    master.exist("a").await.unwrap(),
                    master.service_ready().await.unwrap(),
                )
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(
            task.await.unwrap(),
            (1, vec![true, false], true, "2.0.0".to_owned())
        );
    }
    let stats = master.stats();
    assert_eq!((stats.connects, stats.requests, stats.replies), (1, 64, 64));
}
