//! The router's store check ([`StoreCheck`]) against the scripted fake master: checks
//! from many tasks share calls (exact call and key counts, with the first batch held
//! at the gate), each check keeps its own exact answer, and every failure is an
//! `Unavailable` error, never 0 blocks (`spec/behaviour.md` rule 11). A master that is
//! down: the router example (`crates/lookup-tokio/examples/router_check_blocks.rs`).

use std::time::Duration;

use lookup_core::BlockHashes;
use lookup_tests::direct::{Behaviour, FakeMaster, LIMIT, eventually};
use lookup_tests::logs::Logs;
use lookup_tokio::mooncake_master::{LookupConfig, MasterClient, MasterConfig, MasterLookup};
use lookup_tokio::{
    BatchConfig, DirectConfig, KeyLayout, RankNamespace, StoreCheck, StoreCheckLimits,
    StoredBlocks, Unavailable,
};

/// Block size in tokens.
const B: u32 = 16;

fn layout() -> KeyLayout {
    KeyLayout::new("m")
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

/// A direct configuration without the presence cache: these tests count the
/// master's calls and keys.
fn direct(fake: &FakeMaster, max_wait: Duration) -> DirectConfig {
    let mut direct = DirectConfig::parse(&fake.addr, layout()).expect("address");
    let mut batch = BatchConfig::uncached();
    batch.max_wait = max_wait;
    direct.batch = batch;
    direct
}

/// Prompt `p`: 4 blocks, ids `p * 10..p * 10 + 4`.
fn chain(p: u64) -> BlockHashes {
    BlockHashes::from_u64s(&(p * 10..p * 10 + 4).collect::<Vec<_>>())
}

fn stored(hit_blocks: usize) -> StoredBlocks {
    StoredBlocks {
        hit_blocks,
        hit_tokens: hit_blocks as u32 * B,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_from_many_tasks_share_the_masters_calls() {
    let fake = FakeMaster::start(Behaviour::Gated).await;
    // Prompt p stores p % 5 of its 4 blocks in both namespaces (4 stores all).
    for p in 0..17u64 {
        let n = (p % 5) as usize;
        fake.store(&layout().chain_keys(&chain(p), n));
    }
    // A batch waits for the one in flight however long it takes.
    let store = StoreCheck::connect_direct(direct(&fake, Duration::from_secs(60)), B)
        .await
        .expect("connect");
    let first = {
        let store = store.clone();
        tokio::spawn(async move { store.check(&chain(0)).await })
    };
    eventually("the first check's call reaches the master", || {
        fake.calls().len() == 1
    })
    .await;
    let rest: Vec<_> = (1..17u64)
        .map(|p| {
            let store = store.clone();
            tokio::spawn(async move { store.check(&chain(p)).await })
        })
        .collect();
    // Time for every task to queue its check behind the batch held at the gate.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        fake.calls(),
        [8],
        "nothing more goes out while a batch is held"
    );
    fake.open_gate();
    assert_eq!(first.await.unwrap(), Ok(stored(0)));
    for (p, task) in (1..17u64).zip(rest) {
        let want = (p % 5) as usize;
        assert_eq!(task.await.unwrap(), Ok(stored(want)), "prompt {p}");
    }
    // The 16 checks went out as one call of their 128 keys.
    assert_eq!(fake.calls(), [8, 128]);
    let stats = store.batch_stats();
    assert_eq!(
        (stats.lookups, stats.batches, stats.keys_asked),
        (17, 2, 136)
    );
    // No block hash: nothing asked.
    assert_eq!(store.check(&BlockHashes::default()).await, Ok(stored(0)));
    assert_eq!(fake.calls().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_unavailable_never_zero_blocks() {
    // A key the master answers with an error code ends the run at its block.
    let fake = FakeMaster::start(Behaviour::Answer).await;
    let keys = layout().chain_keys(&chain(1), 4);
    fake.store(&keys);
    fake.fail(&keys[5..6]);
    let store = StoreCheck::connect_direct(direct(&fake, Duration::from_millis(1)), B)
        .await
        .expect("connect");
    assert_eq!(store.check(&chain(1)).await, Ok(stored(2)));

    let garbage = FakeMaster::start(Behaviour::Garbage).await;
    let store = StoreCheck::connect_direct(direct(&garbage, Duration::from_millis(1)), B)
        .await
        .expect("connect");
    assert_eq!(store.check(&chain(1)).await, Err(Unavailable::Malformed));

    let silent = FakeMaster::start(Behaviour::Silent).await;
    let limits = StoreCheckLimits::default().with_timeout(Duration::from_millis(200));
    let store = StoreCheck::connect_with(direct(&silent, Duration::from_millis(1)), B, limits)
        .await
        .expect("connect");
    let started = std::time::Instant::now();
    assert_eq!(store.check(&chain(1)).await, Err(Unavailable::TimedOut));
    assert!(started.elapsed() < LIMIT);
}

/// Two models on one master: two checks over one master client and one coalescer
/// share the connection and its batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_two_layouts_share_one_batcher() {
    let fake = FakeMaster::start(Behaviour::Gated).await;
    let other = KeyLayout::new("other");
    fake.store(&layout().chain_keys(&chain(1), 3));
    fake.store(&other.chain_keys(&chain(1), 1));
    let master = MasterClient::connect(&fake.addr, MasterConfig::default())
        .await
        .expect("connect");
    let mut config = LookupConfig::default();
    config.batch = BatchConfig::uncached();
    config.batch.max_wait = Duration::from_secs(60);
    config.answer_ttl = Duration::ZERO;
    let lookup = MasterLookup::new(master, layout(), config);
    let limits = StoreCheckLimits::default();
    let make =
        |layout: KeyLayout| StoreCheck::from_parts(lookup.with_layout(layout), B, limits).unwrap();
    let (mine, theirs) = (make(layout()), make(other));
    // A check of a prompt with nothing stored holds the gate; the two models' checks
    // queue behind it and go out together.
    let held = {
        let mine = mine.clone();
        tokio::spawn(async move { mine.check(&chain(7)).await })
    };
    eventually("the first call reaches the master", || {
        fake.calls().len() == 1
    })
    .await;
    let a = {
        let mine = mine.clone();
        tokio::spawn(async move { mine.check(&chain(1)).await })
    };
    let b = tokio::spawn(async move { theirs.check(&chain(1)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    fake.open_gate();
    assert_eq!(held.await.unwrap(), Ok(stored(0)));
    assert_eq!(a.await.unwrap(), Ok(stored(3)));
    assert_eq!(b.await.unwrap(), Ok(stored(1)));
    // 8 keys, then both checks' 8 + 4 keys in one call.
    assert_eq!(fake.calls(), [8, 12]);
    assert_eq!(
        StoreCheck::from_parts(lookup, 0, limits)
            .unwrap_err()
            .to_string(),
        "invalid client configuration `block_size`: must be at least 1"
    );
}

/// Held by the tests that make the reopen WARN: tracing's per-callsite interest,
/// computed while another thread first hits the callsite, can hide a line from the
/// capture of a test running at the same time.
static REOPEN_WARN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A check of `fake` by `connect_direct`, with the `DirectConfig`'s
/// `reopen_after_timeouts` set to `k` and a call timeout of 100 ms.
async fn hung_check(fake: &FakeMaster, k: u32) -> StoreCheck {
    let mut config = direct(fake, Duration::from_millis(1));
    config.reopen_after_timeouts = k;
    config.master_config.call_timeout = Duration::from_millis(100);
    StoreCheck::connect_direct(config, B)
        .await
        .expect("connect")
}

/// Rule 17: the `reopen_after_timeouts`-th master call timeout in a row replaces the
/// master connection; the client connects again in the background. 0 never replaces
/// it; `connect_direct` takes the count from the `DirectConfig`, `connect_with` from
/// the limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_timed_out_in_a_row_replace_the_master_connection() {
    let _serial = REOPEN_WARN.lock().await;
    let silent = FakeMaster::start(Behaviour::Silent).await;
    let limits = StoreCheckLimits::default().with_reopen_after_timeouts(2);
    let mut config = direct(&silent, Duration::from_millis(1));
    config.master_config.call_timeout = Duration::from_millis(100);
    let store = StoreCheck::connect_with(config.clone(), B, limits)
        .await
        .expect("connect");
    let asked = |store: &StoreCheck| store.master().stats().reconnects_asked;
    assert_eq!(store.check(&chain(1)).await, Err(Unavailable::TimedOut));
    assert_eq!(asked(&store), 0);
    assert_eq!(store.check(&chain(2)).await, Err(Unavailable::TimedOut));
    assert_eq!(asked(&store), 1);
    eventually("the replacement connection is up", || {
        store.master().stats().connects == 2
    })
    .await;
    assert_eq!(store.check(&chain(3)).await, Err(Unavailable::TimedOut));
    assert_eq!(
        asked(&store),
        1,
        "the count started again on the new connection"
    );

    let never = limits.with_reopen_after_timeouts(0);
    let store = StoreCheck::connect_with(config, B, never)
        .await
        .expect("connect");
    for p in 0..3 {
        assert_eq!(store.check(&chain(p)).await, Err(Unavailable::TimedOut));
    }
    let stats = store.master().stats();
    assert_eq!((stats.reconnects_asked, stats.connects), (0, 1));

    // connect_direct: the DirectConfig's count.
    let store = hung_check(&silent, 1).await;
    assert_eq!(store.check(&chain(1)).await, Err(Unavailable::TimedOut));
    assert_eq!(asked(&store), 1);
}

/// A check's own bound shorter than the master call timeout: the check ends at its
/// bound, its call at the call timeout, and that call's timeout counts (rule 17 counts
/// calls, whoever gave up first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_outliving_their_checks_still_count() {
    let silent = FakeMaster::start(Behaviour::Silent).await;
    let mut config = direct(&silent, Duration::from_millis(1));
    config.master_config.call_timeout = Duration::from_millis(150);
    let limits = StoreCheckLimits::default()
        .with_timeout(Duration::from_millis(30))
        .with_reopen_after_timeouts(2);
    let store = StoreCheck::connect_with(config, B, limits)
        .await
        .expect("connect");
    for p in 1..=2 {
        assert_eq!(store.check(&chain(p)).await, Err(Unavailable::TimedOut));
        // The next check goes out once this one's call has timed out.
        eventually("the call timed out", || {
            store.master().stats().timeouts == p
        })
        .await;
    }
    assert_eq!(store.master().stats().timeout_reopens, 1);
}

/// Checks that share one timed-out call are one timeout: six checks of one stalled
/// call at k = 2 keep the connection; the next call timing out replaces it, with one
/// WARN.
#[tokio::test]
async fn checks_of_one_timed_out_call_count_one_timeout() {
    let _serial = REOPEN_WARN.lock().await;
    let logs = Logs::capture();
    let silent = FakeMaster::start(Behaviour::Silent).await;
    let store = hung_check(&silent, 2).await;
    let checks: Vec<_> = (0..6u64)
        .map(|p| {
            let store = store.clone();
            tokio::spawn(async move { store.check(&chain(p)).await })
        })
        .collect();
    for check in checks {
        assert_eq!(check.await.unwrap(), Err(Unavailable::TimedOut));
    }
    assert_eq!(store.master().stats().reconnects_asked, 0);
    assert_eq!(store.master().timeouts_in_a_row(), 1);
    assert_eq!(store.check(&chain(7)).await, Err(Unavailable::TimedOut));
    assert_eq!(store.master().stats().reconnects_asked, 1);
    let warned = logs.containing("calls in a row timed out on this connection");
    assert_eq!(warned.len(), 1, "{warned:?}");
}

/// The same on two worker threads, where the checks of one timed-out call end on
/// both and the client connects again within a millisecond: with k = 1 each burst of
/// 32 checks against the silent master replaces the connection exactly once, and
/// every check fails (`TimedOut`, or `Transport` for a call lost with the replaced
/// connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_on_many_threads_replace_the_connection_once_each() {
    let _serial = REOPEN_WARN.lock().await;
    let silent = FakeMaster::start(Behaviour::Silent).await;
    let store = hung_check(&silent, 1).await;
    for burst in 1..=5u64 {
        let checks: Vec<_> = (0..32u64)
            .map(|p| {
                let store = store.clone();
                tokio::spawn(async move { store.check(&chain(burst * 100 + p)).await })
            })
            .collect();
        for check in checks {
            let failed = check.await.unwrap().unwrap_err();
            assert!(
                matches!(failed, Unavailable::TimedOut | Unavailable::Transport),
                "{failed:?}"
            );
        }
        assert_eq!(store.master().stats().reconnects_asked, burst);
        eventually("the replacement connection is up", || {
            store.master().stats().connects == burst + 1
        })
        .await;
    }
}
