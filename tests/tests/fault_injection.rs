//! Fault injection over real ZeroMQ sockets (RELIABILITY.md): a server absent at
//! start, a server hanging on one request, replies delayed past the timeout and
//! delivered late, duplicated and reordered replies, and a reset with 100 lookups
//! queued and 4 on the wire.
//!
//! Every test drives a `LookupClient` through [`Harness`], which asserts what
//! `spec/behaviour.md` rules 3, 7, 11 and 17 promise whatever the server does: the
//! 99.9th percentile of caller time per handle call is within 1 ms, no answered
//! lookup stayed pending longer than `lookup_timeout_s` plus its own queue wait (plus
//! 100 ms of slack for the scheduler loop to notice), every arrival slot returns, and
//! every answer is the request's own hit (each chain has a different one) or 0 from
//! a lookup that failed. The tests run one at a time (their caller times would
//! otherwise measure each other on a 2-core machine) and print their figures.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lookup_core::{Probe, Request, ResetOutcome};
use lookup_tests::fault::{
    ChainIndex, Copy, FaultServer, Harness, TempDir, async_config, chain_server, free_tcp,
    inversions, poisoned_hit, request, serial,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `lookup_timeout_s` of the fault tests: short, so that a run of timeouts is short.
const TIMEOUT_S: f64 = 0.2;
/// Overall bound of each phase: a hang fails the test instead of blocking CI.
const LIMIT: Duration = Duration::from_secs(60);

fn requests(ids: std::ops::Range<u64>) -> Vec<Request> {
    ids.map(request).collect()
}

/// Server absent when the client connects (no ipc file; a refused tcp port): every
/// lookup fails open with 0 hits after its timeout, never blocking the scheduler;
/// once the server is bound, every later lookup gets its exact hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_absent_at_start_then_appears() {
    let _serial = serial().await;
    let dir = TempDir::new("absent");
    for (name, endpoint) in [("ipc", dir.ipc("lookup.sock")), ("tcp", free_tcp())] {
        let mut h = Harness::connect(async_config(&endpoint, 16, 4, TIMEOUT_S));
        let before = requests(0..32);
        h.run(&before, 16, LIMIT).await;
        let absent = h.check();
        assert_eq!((absent.exact, absent.zero), (0, 32), "{name}");

        let server = chain_server(&endpoint, Arc::new(ChainIndex::new()));
        let after = requests(1_000..1_200);
        h.run(&after, 16, LIMIT).await;
        h.settle(LIMIT).await;
        let report = h.check();
        report.print(&format!("server_absent_at_start_then_appears/{name}"));
        assert_eq!((report.exact, report.zero), (200, 32), "{name}");
        report.times.assert_budget(name);
        h.assert_books_closed();
        let stats = h.stats();
        assert_eq!(
            stats.core.failed_timed_out + stats.core.failed_transport,
            32,
            "{name}: {stats:?}"
        );
        assert_eq!(stats.core.hits, 200);
        assert_eq!(server.stats().lookups, 200 + stats.late_replies);
        h.close();
        server.shutdown().await;
    }
}

/// The server's index hangs on one request's chain, with one RPC on the wire at a
/// time (vLLM's REQ socket): that lookup fails open after its timeout, the seven
/// queued behind it wait for the timeout and are then answered exactly, nothing
/// else is lost, the socket is kept (one timeout is not a run of them), and the reply
/// that finally comes once the index is released is dropped as late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_hangs_on_one_request() {
    const HUNG: u64 = 10;
    let _serial = serial().await;
    let dir = TempDir::new("hang");
    let endpoint = dir.ipc("lookup.sock");
    let index = Arc::new(ChainIndex::new());
    index.hang_on(HUNG);
    let server = chain_server(&endpoint, Arc::clone(&index));
    let mut h = Harness::connect(async_config(&endpoint, 8, 1, TIMEOUT_S));
    h.run(&requests(0..100), 8, LIMIT).await;
    h.settle(LIMIT).await;
    let report = h.check();
    report.print("server_hangs_on_one_request");
    assert_eq!((report.exact, report.zero), (99, 1));
    report.times.assert_budget("hang");
    // The request queued longest waited behind the hung one for its whole timeout.
    assert!(report.worst_queue_wait >= Duration::from_secs_f64(TIMEOUT_S));
    assert_eq!(index.hung_calls(), 1);
    let stats = h.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.core.hits, 99);
    assert_eq!(stats.socket_reopens, 0);
    assert_eq!(stats.late_replies, 0);

    index.release();
    let deadline = Instant::now() + LIMIT;
    while h.stats().late_replies != 1 {
        assert!(Instant::now() < deadline, "the hung reply never came");
        h.wait(Duration::from_millis(5)).await;
    }
    h.assert_books_closed();
    let stats = h.stats();
    assert_eq!(stats.core.hits, 99);
    h.close();
    server.shutdown().await;
}

/// Every fourth request's first lookup is answered 300 ms late (after its 200 ms
/// timeout) with another chain's hit; its retry is answered in 150 ms, so the stale
/// reply arrives while the retry's RPC is on the wire. The stale reply is recognised
/// by its RPC id and dropped (never applied to the retry), the first lookup fails
/// open, the retry gets the exact hit. The socket is kept (`reopen_after_timeouts`
/// 0) so the late replies do reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_delayed_past_timeout_then_delivered_late() {
    const REQUESTS: u64 = 64;
    let delayed = |id: u64| id % 4 == 0;
    let _serial = serial().await;
    let dir = TempDir::new("late");
    let endpoint = dir.ipc("lookup.sock");
    let server = FaultServer::start(&endpoint, move |seen| {
        let id = seen.owner();
        match (delayed(id), seen.occurrence) {
            (true, 0) => vec![Copy::after(Duration::from_millis(300), poisoned_hit(id))],
            (true, _) => vec![Copy::after(Duration::from_millis(150), seen.hit())],
            (false, _) => vec![Copy::now(seen.hit())],
        }
    });
    let mut config = async_config(&endpoint, 8, 4, TIMEOUT_S);
    config.reopen_after_timeouts = 0;
    let mut h = Harness::connect(config);
    let reqs = requests(0..REQUESTS);
    let deadline = Instant::now() + LIMIT;
    for batch in reqs.chunks(8) {
        for req in batch {
            h.arrive(req);
        }
        let mut waiting: Vec<(&Request, bool)> = batch.iter().map(|r| (r, false)).collect();
        while !waiting.is_empty() {
            let mut still = Vec::new();
            for (req, retried) in waiting {
                let id = req.request_id;
                match h.probe(req, 0) {
                    Probe::Pending => still.push((req, retried)),
                    Probe::Ready {
                        external_tokens: 0, ..
                    } if delayed(id.0) && !retried => {
                        // The failed lookup is consumed; the next probe looks up again.
                        h.allocated(id);
                        still.push((req, true));
                    }
                    Probe::Ready { .. } => {
                        h.allocated(id);
                        h.finished(id);
                    }
                }
            }
            waiting = still;
            h.drain_events();
            if !waiting.is_empty() {
                assert!(Instant::now() < deadline, "requests never became ready");
                h.wait(Duration::from_millis(2)).await;
            }
        }
    }
    let late = REQUESTS / 4;
    while h.stats().late_replies < late {
        assert!(Instant::now() < deadline, "late replies never came");
        h.wait(Duration::from_millis(5)).await;
    }
    h.settle(LIMIT).await;
    let report = h.check();
    report.print("replies_delayed_past_timeout_then_delivered_late");
    let late = usize::try_from(late).expect("small");
    assert_eq!((report.exact, report.zero), (64, late));
    report.times.assert_budget("late");
    h.assert_books_closed();
    let stats = h.stats();
    assert_eq!(stats.late_replies, late as u64);
    assert_eq!(stats.core.failed_timed_out, late as u64);
    assert_eq!(stats.core.hits, REQUESTS);
    assert_eq!(stats.socket_reopens, 0);
    assert_eq!(server.lookups(), REQUESTS + late as u64);
    h.close();
    server.stop().await;
}

/// `max_in_flight` 4, every reply sent twice, each copy after a random 0-3 ms (one
/// second copy in eight after 20-40 ms, when later RPCs are on the wire): replies
/// arrive out of order and doubled. Each RPC's first copy is applied to its own
/// request, every second copy is dropped as late, every answer is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_reordered_replies_max_in_flight_4() {
    const REQUESTS: u64 = 500;
    const SEED: u64 = 0x5eed_d0b1;
    let _serial = serial().await;
    let dir = TempDir::new("dup");
    let endpoint = dir.ipc("lookup.sock");
    let rng = Mutex::new(ChaCha8Rng::seed_from_u64(SEED));
    let server = FaultServer::start(&endpoint, move |seen| {
        let mut rng = rng.lock().expect("lock");
        let first = Duration::from_micros(rng.random_range(0..3_000));
        let second = if rng.random_range(0..8) == 0 {
            Duration::from_millis(rng.random_range(20..40))
        } else {
            Duration::from_micros(rng.random_range(0..3_000))
        };
        vec![
            Copy::after(first, seen.hit()),
            Copy::after(second, seen.hit()),
        ]
    });
    let mut h = Harness::connect(async_config(&endpoint, 16, 4, TIMEOUT_S));
    h.run(&requests(0..REQUESTS), 16, LIMIT).await;
    let deadline = Instant::now() + LIMIT;
    while h.stats().late_replies < REQUESTS {
        assert!(
            Instant::now() < deadline,
            "duplicates never came (seed {SEED})"
        );
        h.wait(Duration::from_millis(5)).await;
    }
    h.settle(LIMIT).await;
    let report = h.check();
    report.print("duplicated_and_reordered_replies_max_in_flight_4");
    assert_eq!((report.exact, report.zero), (500, 0), "seed {SEED}");
    report.times.assert_budget("dup");
    h.assert_books_closed();
    let stats = h.stats();
    assert_eq!(stats.late_replies, REQUESTS, "seed {SEED}");
    assert_eq!(stats.core.hits, REQUESTS);
    assert_eq!(stats.bad_envelopes, 0);
    assert_eq!(server.lookups(), REQUESTS);
    let swapped = inversions(&server.received(), &server.replied());
    eprintln!("replies out of request order: {swapped} pairs");
    assert!(
        swapped > 0,
        "the replies were never reordered (seed {SEED})"
    );
    h.close();
    server.stop().await;
}

/// 104 prefetches with `max_in_flight` 4 against a server holding every reply: 4 on
/// the wire, 100 queued. A reset then cancels the 100 (never sent), fails the 4
/// (their socket is replaced so that their replies cannot come back), frees every
/// slot and sends exactly one reset, which succeeds. Probes afterwards look every
/// request up again and get exact answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_with_100_queued_and_4_in_flight() {
    let _serial = serial().await;
    let dir = TempDir::new("reset");
    let endpoint = dir.ipc("lookup.sock");
    let server = FaultServer::reference(&endpoint);
    server.hold_all();
    // A long timeout: nothing may end on its own before the reset.
    let mut h = Harness::connect(async_config(&endpoint, 128, 4, 5.0));
    let reqs = requests(0..104);
    for req in &reqs {
        h.arrive(req);
    }
    let deadline = Instant::now() + LIMIT;
    while server.lookups() < 4 || h.stats().rpcs_sent < 4 {
        assert!(
            Instant::now() < deadline,
            "4 lookups never reached the wire"
        );
        h.wait(Duration::from_millis(2)).await;
    }
    let stats = h.stats();
    assert_eq!(
        (stats.open_rpcs, stats.slots_in_use, stats.rpcs_sent),
        (104, 104, 4)
    );
    assert_eq!(server.lookups(), 4);

    let reset = h.reset().expect("reset sent");
    while h.resets.is_empty() {
        assert!(Instant::now() < deadline, "the reset never ended");
        h.wait(Duration::from_millis(2)).await;
        h.drain_events();
    }
    assert_eq!(h.resets, vec![(reset, ResetOutcome::Ok)]);
    h.settle(LIMIT).await;
    let stats = h.stats();
    assert_eq!((stats.open_rpcs, stats.slots_in_use), (0, 0), "{stats:?}");
    assert_eq!(stats.core.rpcs_cancelled, 100);
    assert_eq!(stats.core.failed_transport, 4);
    assert_eq!(stats.rpcs_sent, 5);
    // A queued lookup sent after all would reach the server within a few ms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((server.lookups(), server.resets()), (4, 1));

    server.release();
    h.probe_until_ready(&reqs, Instant::now() + LIMIT).await;
    h.settle(LIMIT).await;
    let report = h.check();
    report.print("reset_with_100_queued_and_4_in_flight");
    assert_eq!((report.exact, report.zero), (104, 0));
    report.times.assert_budget("reset");
    h.assert_books_closed();
    let stats = h.stats();
    assert_eq!(stats.core.hits, 104);
    assert_eq!(server.lookups(), 4 + 104);
    h.close();
    server.stop().await;
}
