//! Our master client against the real `mooncake_master` (PyPI 0.3.13.post1), with
//! blocks written by the real Python client (`mooncake_peers::writer_script`), whose own
//! `batch_is_exist` is the reference answer. Needs `scripts/mooncake/install.sh`.

use std::time::{Duration, Instant};

use lookup_tests::mooncake::{Master, Writer};
use mooncake_master::codec::{self, FunctionId, REQUEST_HEADER_LEN, TypeLiteral};
use mooncake_master::key::{KeyFormat, RankNamespace};
use mooncake_master::{MasterClient, MasterConfig, MasterError};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MODEL: &str = "Qwen/Qwen3-8B";

fn namespaces(n: u32) -> Vec<RankNamespace> {
    (0..n).map(RankNamespace::tp).collect()
}

/// Block hashes `0..n` offset by `salt`, as 8 big-endian bytes each.
fn hashes(salt: u64, n: usize) -> Vec<[u8; 8]> {
    (0..n as u64)
        .map(|i| (salt << 32 | i).to_be_bytes())
        .collect()
}

/// Keys of each block, one per namespace.
fn block_keys(format: &KeyFormat, hashes: &[[u8; 8]]) -> Vec<Vec<String>> {
    hashes.iter().map(|h| format.block_keys(h)).collect()
}

fn config() -> MasterConfig {
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_secs(5);
    config
}

/// The Python client's answer as a leading run of 1s.
fn python_run(answers: &[i64]) -> usize {
    answers.iter().take_while(|&&a| a == 1).count()
}

#[tokio::test]
async fn mooncake_master_chain_with_blocks_1_to_3_of_5_stored_answers_3() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let format = KeyFormat::new(None, MODEL, &namespaces(1));
    let chain: Vec<String> = block_keys(&format, &hashes(1, 5)).concat();
    // Blocks 1-3 and 5: the run still ends at the missing fourth.
    writer.put(&chain[..3]);
    writer.put(&chain[4..]);

    for literal in [TypeLiteral::Omit, TypeLiteral::Include] {
        let mut config = config();
        config.type_literal = literal;
        let client = MasterClient::connect(master.addr(), config).await.unwrap();
        assert_eq!(client.leading_run(&chain).await.unwrap(), 3, "{literal:?}");
        assert_eq!(
            client.batch_exist(&chain).await.unwrap(),
            [true, true, true, false, true]
        );
        assert!(client.exist(&chain[2]).await.unwrap());
        assert!(!client.exist(&chain[3]).await.unwrap());
        assert_eq!(client.stats().signature_fallbacks, 0);
    }
    assert_eq!(writer.exist(&chain), [1, 1, 1, 0, 1]);
}

#[tokio::test]
async fn mooncake_master_one_namespace_missing_key_breaks_the_run() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let format = KeyFormat::new(Some("cache"), MODEL, &namespaces(2));
    let blocks = block_keys(&format, &hashes(2, 6));
    // Every key but tp_rank 1's of block 2 (0-based).
    let stored: Vec<&String> = blocks
        .iter()
        .flatten()
        .filter(|k| *k != &blocks[2][1])
        .collect();
    writer.put(&stored);

    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap();
    assert_eq!(client.leading_blocks(&blocks).await.unwrap(), 2);
    assert_eq!(client.stats().batch_exist_calls, 1, "one batched call");
    let flat = blocks.concat();
    assert_eq!(client.leading_blocks_flat(&flat, 2).await.unwrap(), 2);
    // Key by key, only namespace 0 would run to the end of block 2.
    assert_eq!(client.leading_run(&flat).await.unwrap(), 5);
    let python = writer.exist(&flat);
    assert_eq!(python_run(&python), 5);
    assert_eq!(python[5], 0);
}

#[tokio::test]
async fn mooncake_master_2000_key_chain_is_chunked_with_early_stop() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let format = KeyFormat::new(None, MODEL, &namespaces(1));
    let chain: Vec<String> = block_keys(&format, &hashes(3, 2000)).concat();
    writer.put(&chain);

    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap();
    assert_eq!(client.config().chunk_keys, 1024);
    assert_eq!(client.leading_run(&chain).await.unwrap(), 2000);
    assert_eq!(client.stats().batch_exist_calls, 2);

    writer.remove(&chain[1500..1501]);
    assert_eq!(client.leading_run(&chain).await.unwrap(), 1500);
    assert_eq!(client.stats().batch_exist_calls, 4);
    writer.remove(&chain[100..101]);
    assert_eq!(client.leading_run(&chain).await.unwrap(), 100);
    assert_eq!(
        client.stats().batch_exist_calls,
        5,
        "stopped after the first chunk"
    );

    // Smaller chunks: 8 calls of 256 keys for every key, pipelined; 1 call up to key 100.
    let mut small = config();
    small.chunk_keys = 256;
    let client = MasterClient::connect(master.addr(), small).await.unwrap();
    let found = client.batch_exist(&chain).await.unwrap();
    assert_eq!(client.stats().batch_exist_calls, 8);
    assert_eq!(client.stats().keys_asked, 2000);
    let absent: Vec<usize> = (0..2000).filter(|&i| !found[i]).collect();
    assert_eq!(absent, [100, 1500]);
    assert_eq!(client.leading_run(&chain).await.unwrap(), 100);
    assert_eq!(client.stats().batch_exist_calls, 9);

    let python = writer.exist(&chain);
    let ours: Vec<i64> = found.iter().map(|&f| i64::from(f)).collect();
    assert_eq!(ours, python);
}

#[tokio::test]
async fn mooncake_master_answers_equal_python_batch_is_exist_on_200_random_chains() {
    const SEED: u64 = 0x6d6f_6f6e;
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let master = Master::start();
    let mut writer = Writer::start(&master);

    // 300 keys in 1-4 namespaces with and without a prefix; some over 255 bytes long,
    // which widens every length prefix of a call to 2 bytes.
    let long_model = format!("org/{}", "m".repeat(260));
    let mut pool = Vec::new();
    for (i, hash) in hashes(4, 300).iter().enumerate() {
        let model = if i % 50 == 0 {
            long_model.as_str()
        } else {
            MODEL
        };
        let ns = RankNamespace::tp(rng.random_range(0..4u32));
        let prefix = (i % 3 == 0).then_some("pfx");
        pool.extend(KeyFormat::new(prefix, model, &[ns]).block_keys(hash));
    }
    let mut present = Vec::new();
    let mut absent = Vec::new();
    for key in &pool {
        if rng.random_bool(0.7) {
            present.push(key.clone());
        } else {
            absent.push(key.clone());
        }
    }
    writer.put(&present);

    let mut config = config();
    config.chunk_keys = 32;
    let client = MasterClient::connect(master.addr(), config).await.unwrap();
    for chain_no in 0..200 {
        // A run of present keys, then anything: leading runs of every length.
        let len = rng.random_range(1..=80usize);
        let run = rng.random_range(0..=len);
        let chain: Vec<String> = (0..len)
            .map(|i| {
                let from = if i < run || absent.is_empty() {
                    &present
                } else {
                    &pool
                };
                from[rng.random_range(0..from.len())].clone()
            })
            .collect();
        let python = writer.exist(&chain);
        let ours: Vec<i64> = client
            .batch_exist(&chain)
            .await
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        assert_eq!(ours, python, "chain {chain_no}, seed {SEED:#x}");
        assert_eq!(
            client.leading_run(&chain).await.unwrap(),
            python_run(&python),
            "chain {chain_no}, seed {SEED:#x}"
        );
    }
    assert_eq!(client.stats().connects, 1);
}

#[tokio::test]
async fn mooncake_master_stopped_mid_run_fails_fast_and_recovers_after_restart() {
    let mut master = Master::start();
    let port = master.rpc_port();
    let keys: Vec<String> = (0..10).map(|i| format!("absent-{i}")).collect();
    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap();
    assert_eq!(client.batch_exist(&keys).await.unwrap(), [false; 10]);

    // Callers keep calling while the master dies.
    let caller = client.clone();
    let calls = keys.clone();
    let run = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for _ in 0..200 {
            outcomes.push(caller.batch_exist(&calls).await);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        outcomes
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    master.stop();
    let outcomes = run.await.unwrap();
    let failures: Vec<&MasterError> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(!failures.is_empty(), "no call saw the master gone");
    for failure in &failures {
        assert!(
            matches!(
                failure,
                MasterError::ConnectionLost { .. } | MasterError::Unavailable { .. }
            ),
            "not a fast connection failure: {failure}"
        );
    }
    // While it is down every call returns at once (no connect, no timeout).
    for _ in 0..20 {
        let started = Instant::now();
        let err = client.batch_exist(&keys).await.unwrap_err();
        assert!(matches!(err, MasterError::Unavailable { .. }), "{err}");
        assert!(
            started.elapsed() < client.config().call_timeout,
            "a call hung"
        );
    }
    assert!(!client.is_connected());

    let _restarted = Master::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match client.batch_exist(&keys).await {
            Ok(answer) => break answer,
            Err(MasterError::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("no recovery after the restart: {e}"),
        }
    };
    assert_eq!(answer, [false; 10]);
    let stats = client.stats();
    assert_eq!(stats.connections_lost, 1);
    assert_eq!(stats.connects, 2);
    assert_eq!(stats.timeouts, 0);
}

#[tokio::test]
async fn mooncake_master_unknown_function_and_wrong_arguments_are_typed_errors() {
    let master = Master::start();
    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap();
    // The pinned wheel's master reports this version.
    assert_eq!(client.service_ready().await.unwrap(), "2.0.0");

    let err = client
        .call_raw(FunctionId(0xdead_beef), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MasterError::FunctionNotRegistered { function: FunctionId(0xdead_beef), message }
            if message == "the rpc function not registered"),
        "{err}"
    );

    // BatchExistKey's arguments sent to ExistKey.
    let mut frame = Vec::new();
    codec::encode_batch_exist_key(
        &mut frame,
        0,
        &["k1", "k2"],
        Some("default"),
        TypeLiteral::Omit,
    )
    .unwrap();
    let err = client
        .call_raw(FunctionId::EXIST_KEY, &frame[REQUEST_HEADER_LEN..])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MasterError::InvalidArguments { function: FunctionId::EXIST_KEY, message }
            if message == "invalid rpc arg"),
        "{err}"
    );

    // The pre-0.3.12 signature: 0.3.13 refuses it with err_code 4.
    frame.clear();
    codec::encode_batch_exist_key(&mut frame, 0, &["k1"], None, TypeLiteral::Include).unwrap();
    let err = client
        .call_raw(FunctionId::BATCH_EXIST_KEY, &frame[REQUEST_HEADER_LEN..])
        .await
        .unwrap_err();
    assert!(matches!(err, MasterError::InvalidArguments { .. }), "{err}");

    // The raw answer to a well-formed call decodes as the typed one does.
    frame.clear();
    codec::encode_batch_exist_key(&mut frame, 0, &["k1"], Some("default"), TypeLiteral::Omit)
        .unwrap();
    let body = client
        .call_raw(FunctionId::BATCH_EXIST_KEY, &frame[REQUEST_HEADER_LEN..])
        .await
        .unwrap();
    assert_eq!(
        codec::decode_batch_exist_key_reply(&body).unwrap(),
        [Ok(false)]
    );

    // The connection survived all of it.
    assert_eq!(
        client.batch_exist(&["k1", "k2"]).await.unwrap(),
        [false, false]
    );
    let stats = client.stats();
    assert_eq!((stats.connects, stats.connections_lost), (1, 0));
    assert_eq!(stats.signature_fallbacks, 0);
}

#[tokio::test]
async fn mooncake_master_remove_all_removes_every_key_of_the_tenant() {
    let master = Master::start();
    let mut writer = Writer::start(&master);
    let format = KeyFormat::new(None, MODEL, &namespaces(2));
    let chain: Vec<String> = block_keys(&format, &hashes(9, 6)).concat();
    writer.put(&chain);
    let client = MasterClient::connect(master.addr(), config())
        .await
        .unwrap();
    // The probe grants every key a read lease (10 s): without force they stay.
    assert_eq!(client.leading_blocks_flat(&chain, 2).await.unwrap(), 6);
    assert_eq!(client.remove_all(false).await.unwrap(), 0);
    assert_eq!(writer.exist(&chain), vec![1; 12]);
    // Force, as vLLM's reset asks: every key goes, whoever wrote it.
    assert_eq!(client.remove_all(true).await.unwrap(), 12);
    assert_eq!(
        writer.exist(&chain),
        vec![0; 12],
        "the reference client sees them gone"
    );
    assert_eq!(client.leading_blocks_flat(&chain, 2).await.unwrap(), 0);
    assert_eq!(client.remove_all(true).await.unwrap(), 0);
    assert_eq!(client.stats().signature_fallbacks, 0);
}
