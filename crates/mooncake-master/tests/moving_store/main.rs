//! The batcher and its presence cache against a store that moves (`fake.rs`: puts,
//! evictions after the lease, wipes by another client and by this one, restarts
//! behind the same address with a new lease, dropped and replaced connections), on
//! tokio's paused clock.
//!
//! The property (`no_answer_claims_a_block_lost_beyond_the_lease_bound`): no answer
//! claims a block the store no longer holds, except a block another client wiped
//! (the client cannot see that) within the cache's keep (the earlier of the lease and
//! `max_age`); and no block an answer claimed is evicted within the result's TTL
//! (the margin) after the answer, which the lease guarantees. The named tests pin
//! each fixed bug on its own.

mod fake;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fake::FakeMaster;
use mooncake_master::{BatchConfig, Coalescer, MasterClient, MasterConfig, MasterError};
use proptest::prelude::*;
use tokio::time::Instant;

/// Result TTL of the clients (the coalescer's margin).
const MARGIN: Duration = Duration::from_millis(500);
/// The presence cache's `max_age`.
const MAX_AGE: Duration = Duration::from_secs(8);

fn master_config() -> MasterConfig {
    let mut config = MasterConfig::default();
    config.call_timeout = Duration::from_millis(300);
    config.backoff_min = Duration::from_millis(1);
    config.backoff_max = Duration::from_millis(4);
    config
}

fn cached() -> BatchConfig {
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    batch.presence.max_age = MAX_AGE;
    batch
}

async fn setup(lease: Duration, batch: BatchConfig) -> (Arc<FakeMaster>, MasterClient, Coalescer) {
    tick();
    let fake = FakeMaster::start(lease).await;
    let client = MasterClient::connect(&fake.addr, master_config())
        .await
        .unwrap();
    let coalescer = Coalescer::new(client.clone(), batch, Duration::from_secs(10), MARGIN);
    (fake, client, coalescer)
}

/// Block `b` of chain `c`: blocks 0-1 are a prefix every chain shares.
fn key(c: u8, b: u8) -> String {
    if b < 2 {
        format!("sys{b}")
    } else {
        format!("c{c}b{b}")
    }
}

fn chain(c: u8, blocks: u8) -> Vec<String> {
    (0..blocks).map(|b| key(c, b)).collect()
}

/// Keeps tokio's paused clock from jumping past I/O: with every task waiting, the
/// clock auto-advances to the next timer, even with a reply already in a socket. A
/// timer every millisecond bounds each jump to 1 ms of virtual time.
fn tick() {
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
}

/// Lets the client's tasks see what the fake did (a closed connection, a reconnect).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// Until the client has a connection again.
async fn connected(client: &MasterClient) {
    for _ in 0..1000 {
        if client.is_connected() {
            return;
        }
        settle().await;
    }
    panic!("no reconnect");
}

/// Asks until the lease of the current connection is read, so the cache fills.
async fn warm(coalescer: &Coalescer, keys: &[String]) {
    for _ in 0..3 {
        coalescer
            .leading_blocks_flat(keys.to_vec(), 1)
            .await
            .unwrap();
        settle().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_restart_behind_the_same_address_ends_the_presence_cache() {
    let (fake, client, coalescer) = setup(Duration::from_secs(5), cached()).await;
    let keys = chain(0, 4);
    fake.put(&keys);
    warm(&coalescer, &keys).await;
    assert_eq!(coalescer.cached_keys(), 4);
    let calls = fake.exist_calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        coalescer
            .leading_blocks_flat(keys.clone(), 1)
            .await
            .unwrap(),
        4
    );
    assert_eq!(
        fake.exist_calls.load(std::sync::atomic::Ordering::SeqCst),
        calls,
        "a fully cached lookup makes no call"
    );
    // The master restarts empty at the same address; the client reconnects.
    fake.restart(Duration::from_secs(5));
    settle().await;
    connected(&client).await;
    assert_eq!(
        coalescer
            .leading_blocks_flat(keys.clone(), 1)
            .await
            .unwrap(),
        0
    );
    assert_eq!(coalescer.cached_keys(), 0);
}

/// A restarted master with a shorter lease: its lease is read on the new connection,
/// and nothing is cached for longer than it.
#[tokio::test(start_paused = true)]
async fn the_lease_is_read_again_on_a_new_connection() {
    let (fake, client, coalescer) = setup(Duration::from_secs(6), cached()).await;
    let keys = chain(0, 3);
    fake.put(&keys);
    warm(&coalescer, &keys).await;
    assert_eq!(coalescer.lease().ttl, Duration::from_secs(6));
    fake.restart(Duration::from_secs(1));
    settle().await;
    connected(&client).await;
    fake.put(&keys);
    warm(&coalescer, &keys).await;
    assert_eq!(coalescer.lease().ttl, Duration::from_secs(1));
    assert_eq!(coalescer.cached_keys(), 3);
    // Past the 1 s lease less the margin, every key is asked again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let calls = fake.exist_calls.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        coalescer
            .leading_blocks_flat(keys.clone(), 1)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        fake.exist_calls.load(std::sync::atomic::Ordering::SeqCst),
        calls + 1
    );
}

/// This client's own `RemoveAll` ends the cache: nothing answered before it is
/// claimed after it.
#[tokio::test(start_paused = true)]
async fn this_clients_remove_all_ends_the_presence_cache() {
    let (fake, client, coalescer) = setup(Duration::from_secs(5), cached()).await;
    let keys = chain(0, 4);
    fake.put(&keys);
    warm(&coalescer, &keys).await;
    assert_eq!(client.remove_all(true).await.unwrap(), 4);
    assert_eq!(coalescer.leading_blocks_flat(keys, 1).await.unwrap(), 0);
}

/// An answer resting on the cache is given only while its connection is up.
#[tokio::test(start_paused = true)]
async fn a_cached_answer_needs_its_connection_up() {
    let (fake, client, coalescer) = setup(Duration::from_secs(5), cached()).await;
    let keys = chain(0, 2);
    fake.put(&keys);
    warm(&coalescer, &keys).await;
    // The connection breaks and the reconnect is refused for a while: the lookup is
    // unavailable, not answered from the cache.
    client.reconnect("test");
    let answer = coalescer.leading_blocks_flat(keys, 1).await;
    assert!(
        matches!(&answer, Err(e) if e.is_unavailable()),
        "{answer:?}"
    );
}

/// Every round checks the cache against its own send time: a key whose entry ends
/// between the batch's start and a later round is asked again in that round.
#[tokio::test(start_paused = true)]
async fn cached_keys_are_checked_at_each_rounds_send_time() {
    let mut config = master_config();
    config.chunk_keys = 1;
    config.call_timeout = Duration::from_secs(5);
    tick();
    let fake = FakeMaster::start(Duration::from_secs(2)).await;
    let client = MasterClient::connect(&fake.addr, config).await.unwrap();
    let coalescer = Coalescer::new(client.clone(), cached(), Duration::from_secs(10), MARGIN);
    let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    fake.put(&keys);
    // k4 cached first, alone (the second time, once the lease is read): its entry
    // ends 2 s after that, so with the 0.5 s margin it serves rounds sent before 1.5 s.
    coalescer
        .leading_blocks_flat(keys[4..].to_vec(), 1)
        .await
        .unwrap();
    settle().await;
    coalescer
        .leading_blocks_flat(keys[4..].to_vec(), 1)
        .await
        .unwrap();
    assert_eq!(coalescer.cached_keys(), 1);
    // Each call now takes 500 ms: one key per round, k4 is first looked at in the
    // round sent at 1.5 s (the window reaches one block past the asked one), past
    // its entry. It must be asked, not taken from the cache.
    fake.set_delay(Duration::from_millis(500));
    let before = coalescer.stats().keys_from_cache;
    assert_eq!(
        coalescer
            .leading_blocks_flat(keys.clone(), 1)
            .await
            .unwrap(),
        5
    );
    assert_eq!(coalescer.stats().keys_from_cache, before, "k4 was asked");
    assert_eq!(coalescer.stats().keys_asked, 1 + 1 + 5);
}

/// A cached key is checked again when the answer is handed out: lease 2 s, margin
/// 0.5 s, one key per call; c0 cached at t0; at t0 + 1.4 s a lookup of [c0, u0] takes
/// c0 from the cache (it holds past 1.9 s), and u0's call takes 0.7 s. At the answer
/// (t0 + 2.1 s) c0's entry no longer outlasts the margin: the master may evict c0
/// before the client stops trusting the answer (t0 + 2.6 s), so the lookup is
/// unavailable, not a 2-block hit.
#[tokio::test(start_paused = true)]
async fn a_cached_key_is_checked_again_at_answer_time() {
    let mut config = master_config();
    config.chunk_keys = 1;
    config.call_timeout = Duration::from_secs(5);
    tick();
    let fake = FakeMaster::start(Duration::from_secs(2)).await;
    let client = MasterClient::connect(&fake.addr, config).await.unwrap();
    let coalescer = Coalescer::new(client.clone(), cached(), Duration::from_secs(10), MARGIN);
    let keys = vec!["c0".to_owned(), "u0".to_owned()];
    fake.put(&keys);
    // The lease is read at the first hit; the second caches c0.
    coalescer
        .leading_blocks_flat(keys[..1].to_vec(), 1)
        .await
        .unwrap();
    settle().await;
    let t0 = Instant::now();
    coalescer
        .leading_blocks_flat(keys[..1].to_vec(), 1)
        .await
        .unwrap();
    assert_eq!(coalescer.cached_keys(), 1);
    tokio::time::sleep_until(t0 + Duration::from_millis(1_400)).await;
    fake.set_delay(Duration::from_millis(700));
    let answer = coalescer.leading_blocks_flat(keys.clone(), 1).await;
    let at = Instant::now() - t0;
    assert!(at >= Duration::from_millis(2_100), "answered at {at:?}");
    assert_eq!(
        coalescer.stats().keys_from_cache,
        1,
        "c0 came from the cache"
    );
    assert!(
        matches!(&answer, Err(MasterError::Unavailable { last_error, .. }) if last_error.contains("read lease")),
        "{answer:?}"
    );
    // Asked afresh, both are there.
    fake.set_delay(Duration::ZERO);
    assert_eq!(coalescer.leading_blocks_flat(keys, 1).await.unwrap(), 2);
}

/// This client's `RemoveAll` starts while a lookup whose prefix came from the cache
/// waits for its tail call: the answer, handed out after the wipe began, must not
/// claim the cached prefix (the answer-time epoch check).
#[tokio::test(start_paused = true)]
async fn remove_all_during_a_cached_prefix_lookup_ends_its_answer() {
    let mut config = master_config();
    config.chunk_keys = 1;
    config.call_timeout = Duration::from_secs(3600); // virtual time: no call may time out while replies cross real sockets
    tick();
    let fake = FakeMaster::start(Duration::from_secs(5)).await;
    let client = MasterClient::connect(&fake.addr, config).await.unwrap();
    let coalescer = Coalescer::new(client.clone(), cached(), Duration::from_secs(10), MARGIN);
    let keys = vec!["p0".to_owned(), "t0".to_owned()];
    fake.put(&keys);
    warm(&coalescer, &keys[..1]).await;
    assert_eq!(coalescer.cached_keys(), 1);
    fake.set_delay(Duration::from_millis(300));
    let from_cache = coalescer.stats().keys_from_cache;
    let lookup = coalescer.submit(keys.clone(), 1);
    coalescer.flush();
    let answer = tokio::spawn(lookup.wait());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let wipe = tokio::spawn({
        let client = client.clone();
        async move { client.remove_all(true).await }
    });
    let answer = answer.await.unwrap();
    assert!(
        matches!(&answer, Err(MasterError::Unavailable { last_error, .. }) if last_error.contains("RemoveAll")),
        "{answer:?}"
    );
    assert_eq!(
        coalescer.stats().keys_from_cache,
        from_cache + 1,
        "p0 came from the cache"
    );
    assert_eq!(wipe.await.unwrap().unwrap(), 2);
}

/// A lookup in a batch is answered at its own early stop: a 1-key miss known after
/// the first round does not wait for the long lookup's last round.
#[tokio::test(start_paused = true)]
async fn a_short_lookup_is_answered_before_the_batchs_last_round() {
    let mut config = master_config();
    config.chunk_keys = 1;
    config.call_timeout = Duration::from_secs(3600); // virtual time: no call may time out while replies cross real sockets
    tick();
    let fake = FakeMaster::start(Duration::from_secs(10)).await;
    let client = MasterClient::connect(&fake.addr, config).await.unwrap();
    let coalescer = Coalescer::new(
        client,
        BatchConfig::default(),
        Duration::from_secs(10),
        MARGIN,
    );
    let long: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    fake.put(&long);
    fake.set_delay(Duration::from_millis(100));
    let start = Instant::now();
    let slow = coalescer.submit(long, 1);
    let short = coalescer.submit(vec!["absent".to_owned()], 1);
    coalescer.flush();
    let short_at = tokio::spawn(async move {
        let run = short.wait().await.unwrap();
        (run, Instant::now())
    });
    assert_eq!(slow.wait().await.unwrap(), 5);
    let slow_took = start.elapsed();
    let (run, at) = short_at.await.unwrap();
    assert_eq!(run, 0);
    // Round 1 is two calls of one key, answered one after the other (100 ms each);
    // rounds 2-5 one call each (and the lease read, 100 ms, queued among them). The
    // miss is answered with round 1, before round 2's answer at 300 ms.
    let short_took = at - start;
    assert!(
        short_took >= Duration::from_millis(200) && short_took < Duration::from_millis(300),
        "the miss took {short_took:?}"
    );
    assert!(slow_took >= Duration::from_millis(600), "{slow_took:?}");
}

/// `max_wait` and `presence.max_age` near `Duration::MAX` never overflow an `Instant`.
#[tokio::test(start_paused = true)]
async fn durations_near_max_never_overflow() {
    let mut batch = cached();
    batch.max_wait = Duration::MAX;
    batch.presence.max_age = Duration::MAX;
    // The configured lease (`Duration::MAX`) is the one in use from the start.
    batch.read_lease = false;
    tick();
    let fake = FakeMaster::start(Duration::from_secs(3)).await;
    let client = MasterClient::connect(&fake.addr, master_config())
        .await
        .unwrap();
    let coalescer = Coalescer::new(
        client,
        batch,
        Duration::MAX,
        Duration::MAX - Duration::from_secs(1),
    );
    let keys = chain(1, 3);
    fake.put(&keys);
    for _ in 0..3 {
        assert_eq!(
            coalescer
                .leading_blocks_flat(keys.clone(), 1)
                .await
                .unwrap(),
            3
        );
        settle().await;
    }
    // A margin past the clock's range never trusts the cache.
    assert_eq!(coalescer.stats().keys_from_cache, 0);
}

/// A stuck master connection: the writer's queue holds only frames of calls still
/// waiting, and a full queue fails fast as unavailable.
#[tokio::test(start_paused = true)]
async fn a_stuck_connection_holds_only_the_frames_of_waiting_calls() {
    tick();
    let fake = FakeMaster::start(Duration::from_secs(5)).await;
    let mut config = master_config();
    config.call_timeout = Duration::from_millis(50);
    config.max_queued_bytes = 1 << 20;
    // The queue is under test, not rule 17's replacement of the connection.
    config.reopen_after_timeouts = 0;
    let client = MasterClient::connect(&fake.addr, config).await.unwrap();
    fake.stuck.store(true, std::sync::atomic::Ordering::SeqCst);
    // 1,024 keys of 100 bytes: ~100 KiB per call; the socket buffers fill first.
    let keys: Vec<String> = (0..1024).map(|i| format!("{i:0>100}")).collect();
    let rss_before = rss_kib();
    let mut timed_out = 0;
    let mut full = 0;
    let mut peak = 0;
    // 50 rounds of 20 calls at once: 2 MiB offered to a queue of 1 MiB.
    for _ in 0..50 {
        let calls = futures::future::join_all((0..20).map(|_| client.batch_exist(&keys)));
        tokio::pin!(calls);
        let results = loop {
            tokio::select! {
                r = &mut calls => break r,
                () = tokio::time::sleep(Duration::from_millis(5)) => {
                    peak = peak.max(client.queued_bytes());
                }
            }
        };
        for result in results {
            match result {
                Err(MasterError::Timeout { .. }) => timed_out += 1,
                Err(MasterError::Unavailable { .. }) => full += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    let rss_after = rss_kib();
    assert_eq!(timed_out + full, 1000);
    assert!(
        timed_out > 0 && full > 0,
        "{timed_out} timed out, {full} full"
    );
    // Every call ended: nothing stays queued, and the queue never held more than
    // its limit plus the one call allowed past it.
    assert_eq!(client.queued_bytes(), 0);
    assert!(peak <= (1 << 20) + 110 * 1024, "peak {peak}");
    eprintln!(
        "stuck connection, 1,000 calls of ~100 KiB: {timed_out} timed out, {full} failed \
         fast (queue full), peak queued {peak} bytes, {} left; VmRSS {rss_before} -> \
         {rss_after} kB",
        client.queued_bytes()
    );
}

/// This process's resident memory (`VmRSS`), in kB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// What the reference checks keep per key.
#[derive(Default)]
struct History {
    /// When another client wiped it (the client cannot see that), if it is gone.
    wiped_at: HashMap<String, Instant>,
    /// The latest answer claiming it, per key.
    claimed_at: HashMap<String, Instant>,
}

#[derive(Clone, Debug)]
enum Op {
    Put(u8, u8),
    Evict(u8, u8),
    Wipe,
    WipeOwn,
    Restart(u8),
    DropConnections,
    Reconnect,
    Advance(u16),
    /// Every answer of the fake takes this long from now on (ms).
    Delay(u16),
    Lookups(Vec<(u8, u8)>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3u8, 1..6u8).prop_map(|(c, n)| Op::Put(c, n)),
        2 => (0..3u8, 0..6u8).prop_map(|(c, b)| Op::Evict(c, b)),
        1 => Just(Op::Wipe),
        1 => Just(Op::WipeOwn),
        1 => (0..3u8).prop_map(Op::Restart),
        1 => Just(Op::DropConnections),
        1 => Just(Op::Reconnect),
        3 => (1..3000u16).prop_map(Op::Advance),
        2 => prop_oneof![Just(0u16), Just(120), Just(250), Just(700)].prop_map(Op::Delay),
        6 => prop::collection::vec((0..3u8, 1..6u8), 1..4).prop_map(Op::Lookups),
    ]
}

const LEASES: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(3),
    Duration::from_secs(6),
];

async fn run(ops: Vec<Op>) -> Result<(), String> {
    let (fake, client, coalescer) = setup(LEASES[2], cached()).await;
    let mut history = History::default();
    for op in ops {
        match op {
            Op::Put(c, n) => {
                // A wipe's grace stays: a presence-cache entry made before another
                // client's wipe may still claim the key after it is put again and
                // evicted, for at most MAX_AGE after the wipe (the client cannot see
                // another's RemoveAll; spec/mooncake-master-rpc.md).
                fake.put(&chain(c, n));
            }
            Op::Evict(c, b) => {
                let k = key(c, b);
                if fake.evict(&k) {
                    let now = Instant::now();
                    if let Some(at) = history.claimed_at.get(&k) {
                        if now < *at + MARGIN {
                            return Err(format!(
                                "{k} evicted {:?} after an answer claimed it, within the TTL",
                                now - *at
                            ));
                        }
                    }
                }
            }
            Op::Wipe => {
                let now = Instant::now();
                for k in fake.wipe() {
                    // The TTL guarantee is against evictions; a wipe ends it.
                    history.claimed_at.remove(&k);
                    history.wiped_at.insert(k, now);
                }
            }
            Op::WipeOwn => {
                // Whether or not it reached the master, the client's own attempt
                // ends what it knew: no grace for any key it no longer finds.
                let _ = client.remove_all(true).await;
                history.wiped_at.clear();
                history.claimed_at.clear();
            }
            Op::Restart(lease) => {
                fake.restart(LEASES[usize::from(lease)]);
                history.wiped_at.clear();
                history.claimed_at.clear();
                settle().await;
            }
            Op::DropConnections => {
                fake.drop_connections();
                settle().await;
            }
            Op::Reconnect => {
                client.reconnect("test");
                settle().await;
            }
            Op::Advance(ms) => tokio::time::sleep(Duration::from_millis(u64::from(ms))).await,
            Op::Delay(ms) => fake.set_delay(Duration::from_millis(u64::from(ms))),
            Op::Lookups(lookups) => {
                let pending: Vec<_> = lookups
                    .iter()
                    .map(|&(c, n)| (chain(c, n), coalescer.submit(chain(c, n), 1)))
                    .collect();
                coalescer.flush();
                for (keys, pending) in pending {
                    let Ok(run) = pending.wait().await else {
                        continue;
                    };
                    let now = Instant::now();
                    let store = &fake.store.lock().unwrap().keys;
                    for k in &keys[..run] {
                        let in_wipe_grace = history
                            .wiped_at
                            .get(k)
                            .is_some_and(|at| now < *at + MAX_AGE.min(LEASES[2]));
                        if store.contains_key(k) {
                            // Within a wipe's grace the claim may rest on a cache entry
                            // made before another client's wipe, not on a lease of the
                            // object put since: it binds no eviction.
                            if !in_wipe_grace {
                                history.claimed_at.insert(k.clone(), now);
                            }
                            continue;
                        }
                        match history.wiped_at.get(k) {
                            Some(at) if now < *at + MAX_AGE.min(LEASES[2]) => {}
                            Some(at) => {
                                return Err(format!(
                                    "{k} claimed {:?} after another client wiped it",
                                    now - *at
                                ));
                            }
                            None => return Err(format!("{k} claimed, but the store lost it")),
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn no_answer_claims_a_block_lost_beyond_the_lease_bound(ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = runtime.block_on(run(ops));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}
