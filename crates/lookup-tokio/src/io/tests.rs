//! The I/O task and the client on virtual time: tokio's paused clock and the seeded
//! [`FakeWire`]. Timeouts, backoff, reopen and sync-mode waits are checked to the
//! exact instant, with no real sleep (the real-socket tests in `tests/` prove the
//! wire itself).

use crate::Deadline;
use std::time::Duration;

use lookup_core::{
    BlockHashes, Event, LookupOutcome, Probe, Request, RequestId, ResetOutcome, RpcFailure,
};
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::fake::{FakeWire, Knobs};
use crate::{ClientConfig, Endpoint, LookupClient};

const MS: Duration = Duration::from_millis(1);

/// Clients move the process-wide first-probe ratio: one test at a time touches it.
async fn process_wide() -> tokio::sync::MutexGuard<'static, ()> {
    crate::metrics::PROCESS_WIDE.lock().await
}

fn config(timeout_ms: u64) -> ClientConfig {
    let endpoint: Endpoint = "ipc:///tmp/unused-fake-wire".parse().expect("endpoint");
    let mut config = ClientConfig::zmq(endpoint, 16);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 64;
    config.core.max_in_flight = 8;
    config.core.lookup_timeout = Duration::from_millis(timeout_ms);
    config
}

fn req(id: u64, blocks: u64) -> Request {
    let hashes: Vec<u64> = (0..blocks).map(|b| id * 1000 + b).collect();
    Request {
        request_id: RequestId(id),
        num_tokens: u32::try_from(blocks * 16 + 1).expect("small"),
        block_hashes: BlockHashes::from_u64s(&hashes),
        skip_reading_external_kv: false,
    }
}

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

fn events(client: &mut LookupClient) -> Vec<Event> {
    std::iter::from_fn(|| client.poll_event()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_silent_server_fails_the_lookup_exactly_at_its_timeout() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        ..Knobs::default()
    };
    let (wire, _, record) = FakeWire::new(1, knobs);
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    let r = req(1, 4);
    let t0 = Instant::now();
    client.on_new_request(&r);
    tokio::time::sleep(199 * MS).await;
    assert_eq!(client.probe(&r, 0), Probe::Pending);
    client.wait_progress(Duration::from_millis(50)).await;
    assert_eq!(client.probe(&r, 0), ready(0));
    assert_eq!(Instant::now() - t0, 200 * MS);
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.rpcs_sent, 1);
    assert_eq!(stats.slots_in_use, 0);
    let done: Vec<Event> = events(&mut client);
    assert_eq!(done.len(), 1);
    match done[0] {
        Event::LookupDone {
            outcome, on_wire, ..
        } => {
            assert_eq!(outcome, LookupOutcome::Failed(RpcFailure::TimedOut));
            assert_eq!(on_wire, 200 * MS);
        }
        ref other => panic!("unexpected {other:?}"),
    }
    assert_eq!(record.lock().unwrap().sent.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_reply_after_the_timeout_is_dropped_and_counted_once() {
    let _only = process_wide().await;
    let knobs = Knobs {
        latency: (300 * MS, 300 * MS),
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let (wire, _, _) = FakeWire::new(2, knobs);
    let mut cfg = config(200);
    cfg.transport.zmq_mut().expect("zmq").reopen_after_timeouts = 0;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    let r = req(1, 4);
    client.on_new_request(&r);
    tokio::time::sleep(100 * MS).await;
    assert_eq!(client.probe(&r, 0), Probe::Pending);
    tokio::time::sleep(150 * MS).await;
    // The probe that waited reads the failure (rule 11).
    assert_eq!(client.probe(&r, 0), ready(0));
    tokio::time::sleep(100 * MS).await;
    client.drive();
    let stats = client.stats();
    assert_eq!(stats.late_replies, 1);
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.core.hits, 0);
    assert_eq!(stats.open_rpcs, 0);
}

#[tokio::test(start_paused = true)]
async fn three_timeouts_in_a_row_reopen_the_connection_once() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        ..Knobs::default()
    };
    let (wire, _, record) = FakeWire::new(3, knobs);
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    for id in 1..=3 {
        client.on_new_request(&req(id, 2));
    }
    tokio::time::sleep(201 * MS).await;
    client.drive();
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 3);
    assert_eq!(stats.socket_reopens, 1);
    assert_eq!(record.lock().unwrap().opens, 1);
}

/// A stopped server (SIGSTOP: the connection stays, nothing answers) costs one
/// timeout, not `reopen_after_timeouts` of them: the liveness check run after the
/// first finds it silent, the nine lookups behind it fail at once as unavailable
/// (one written while the check ran, eight never), and a new lookup fails fast too.
#[tokio::test(start_paused = true)]
async fn a_stopped_server_costs_one_timeout_then_the_queue_fails_fast() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        alive: false,
        ..Knobs::default()
    };
    let (wire, _, record) = FakeWire::new(11, knobs);
    let mut cfg = config(200);
    cfg.core.max_in_flight = 1;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    for id in 1..=10 {
        client.on_new_request(&req(id, 2));
    }
    tokio::time::sleep(201 * MS).await;
    client.drive();
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.core.failed_transport, 9);
    assert_eq!(stats.endpoint_unreachable, 1);
    assert_eq!(stats.socket_reopens, 0);
    // The next lookup went out while the check ran (a live server answers it), and
    // failed with the queue when the check found the server stopped.
    assert_eq!(record.lock().unwrap().sent.len(), 2);
    // A lookup started now fails at once, unwritten.
    let late = req(11, 2);
    client.on_new_request(&late);
    client.wait_progress(Duration::from_millis(1)).await;
    assert_eq!(client.probe(&late, 0), ready(0));
    let stats = client.stats();
    assert_eq!(
        (stats.core.failed_timed_out, stats.core.failed_transport),
        (1, 10)
    );
    assert_eq!(record.lock().unwrap().sent.len(), 2);
}

/// `max_pending_age`: behind one hung RPC (`max_in_flight` 1, a 10 s timeout), the
/// two lookups queued end unsent as unavailable once they waited 300 ms, and never
/// take the wire; the hung one still ends at its own timeout.
#[tokio::test(start_paused = true)]
async fn lookups_queued_longer_than_max_pending_age_end_unsent() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        ..Knobs::default()
    };
    let (wire, _, record) = FakeWire::new(12, knobs);
    let mut cfg = config(10_000);
    cfg.core.max_in_flight = 1;
    cfg.core.max_pending_age = 300 * MS;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    let t0 = Instant::now();
    for id in 1..=3 {
        client.on_new_request(&req(id, 2));
    }
    tokio::time::sleep(299 * MS).await;
    client.drive();
    assert_eq!(client.stats().lookups_expired, 0);
    client.wait_progress(Duration::from_millis(10)).await;
    assert_eq!(Instant::now() - t0, 300 * MS);
    let stats = client.stats();
    assert_eq!(stats.lookups_expired, 2);
    let outcomes: Vec<(Vec<RequestId>, LookupOutcome)> = events(&mut client)
        .into_iter()
        .filter_map(|e| match e {
            Event::LookupDone {
                request_ids,
                outcome,
                ..
            } => Some((request_ids, outcome)),
            _ => None,
        })
        .collect();
    let not_sent = LookupOutcome::Failed(RpcFailure::NotSent);
    assert_eq!(
        outcomes,
        vec![
            (vec![RequestId(2)], not_sent),
            (vec![RequestId(3)], not_sent)
        ]
    );
    assert_eq!(record.lock().unwrap().sent.len(), 1);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(record.lock().unwrap().sent.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn failed_opens_retry_after_a_doubling_backoff_capped_at_one_second() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        open_failures: 9,
        ..Knobs::default()
    };
    let (wire, _, record) = FakeWire::new(4, knobs);
    let mut cfg = config(100);
    cfg.transport.zmq_mut().expect("zmq").reopen_after_timeouts = 1;
    cfg.transport.zmq_mut().expect("zmq").reopen_backoff = 10 * MS;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    client.on_new_request(&req(1, 2));
    tokio::time::sleep(Duration::from_secs(5)).await;
    client.drive();
    let record = record.lock().unwrap().clone();
    let gaps: Vec<u128> = record
        .open_failures_at
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert_eq!(gaps, vec![10, 20, 40, 80, 160, 320, 640, 1000]);
    assert_eq!(record.opens, 1);
    assert_eq!(client.stats().open_errors, 9);
}

#[tokio::test(start_paused = true)]
async fn a_sync_probe_queued_behind_a_hung_rpc_gives_up_at_timeout_plus_margin() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        ..Knobs::default()
    };
    let (wire, _, _) = FakeWire::new(5, knobs);
    let mut cfg = config(200);
    cfg.core.max_in_flight = 1;
    cfg.transport.zmq_mut().expect("zmq").reopen_after_timeouts = 0;
    cfg.wait_margin = 100 * MS;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    client.on_new_request(&req(1, 2));
    // Request 1's prefetch goes on the wire first (else the probe's lookup, sent
    // first by rule 15, would be the hung one).
    tokio::time::sleep(MS).await;
    let t0 = Instant::now();
    // Queued behind the prefetch until it times out at 200 ms, then due at 400 ms.
    assert_eq!(
        client.probe_until(&req(2, 2), 0, Deadline::Answer).await,
        ready(0)
    );
    assert_eq!(Instant::now() - t0, 300 * MS);
    assert_eq!(client.stats().waits_gave_up, 1);
}

#[tokio::test(start_paused = true)]
async fn a_reset_goes_on_a_fresh_connection_and_fails_the_lookups_on_the_old_one() {
    let _only = process_wide().await;
    let knobs = Knobs {
        stalled: true,
        ..Knobs::default()
    };
    let (wire, knobs, record) = FakeWire::new(6, knobs);
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    client.on_new_request(&req(1, 2));
    client.drive();
    tokio::time::sleep(MS).await;
    knobs.lock().unwrap().stalled = false;
    assert_eq!(client.reset_and_wait().await.unwrap(), ResetOutcome::Ok);
    assert_eq!(record.lock().unwrap().opens, 1);
    let stats = client.stats();
    assert_eq!(stats.socket_reopens, 1);
    assert_eq!(stats.core.failed_transport, 1);
    assert_eq!(stats.open_rpcs, 0);
}

/// A seeded run with drops, duplicates and latency on both sides of the timeout:
/// every probe ends `Ready` with the server's hit or 0 from a failed lookup, and
/// nothing is left once every request has ended.
#[tokio::test(start_paused = true)]
async fn a_lossy_wire_loses_lookups_never_answers_and_leaves_nothing_behind() {
    let _only = process_wide().await;
    for seed in 0..4 {
        let knobs = Knobs {
            latency: (MS / 10, 30 * MS),
            drop: 0.05,
            duplicate: 0.05,
            hit: |n| (n / 16).min(3) * 16,
            ..Knobs::default()
        };
        let (wire, _, _) = FakeWire::new(seed, knobs);
        let mut client = LookupClient::with_wire(config(20), wire, &Handle::current()).unwrap();
        let requests: Vec<Request> = (1..=300).map(|id| req(id, 1 + id % 5)).collect();
        for r in &requests {
            client.on_new_request(r);
        }
        for r in &requests {
            let expected = (r.num_tokens / 16).min(3) * 16;
            let answer = loop {
                match client.probe(r, 0) {
                    Probe::Pending => client.wait_progress(5 * MS).await,
                    answer => break answer,
                }
            };
            assert!(
                answer == ready(expected) || answer == ready(0),
                "seed {seed}: {} answered {answer:?}, the server holds {expected}",
                r.request_id
            );
            client.on_finished(r.request_id);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stats = client.stats();
        let core = &stats.core;
        assert_eq!(
            core.hits + core.misses + core.failed_timed_out + core.failed_transport,
            core.rpcs_created - core.rpcs_cancelled,
            "seed {seed}: every RPC ended once: {stats:?}"
        );
        assert_eq!(stats.slots_in_use, 0, "seed {seed}");
        assert_eq!(stats.open_rpcs, 0, "seed {seed}");
        assert_eq!(client.core().tracked_requests(), 0, "seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn prefetch_configured_in_sync_mode_is_reported_inactive() {
    let _only = process_wide().await;
    let (wire, _, _) = FakeWire::new(7, Knobs::default());
    let mut cfg = config(200);
    cfg.core.lookup_async = false;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    assert!(client.stats().prefetch_inactive);
    client.on_new_request(&req(1, 2));
    assert_eq!(client.stats().core.lookups_arrival, 0);
    let (wire, _, _) = FakeWire::new(8, Knobs::default());
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    assert!(!client.stats().prefetch_inactive);
}

/// Regression (huge durations panic): a timeout of 1e19 s and a TTL of 1e20 s
/// saturate in the I/O task and in sync-mode waits; nothing panics.
#[tokio::test(start_paused = true)]
async fn huge_timeouts_saturate_in_the_driver() {
    let _only = process_wide().await;
    let knobs = Knobs {
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let (wire, _, _) = FakeWire::new(9, knobs);
    let mut cfg = config(200);
    cfg.core.lookup_timeout = lookup_core::duration_from_secs(1e19).expect("seconds");
    cfg.core.lookup_prefetch_ttl = lookup_core::duration_from_secs(1e20).expect("seconds");
    cfg.core.lookup_async = false;
    cfg.core.lookup_prefetch_limit = 0;
    let mut client = LookupClient::with_wire(cfg, wire, &Handle::current()).unwrap();
    assert_eq!(
        client.probe_until(&req(1, 4), 0, Deadline::Answer).await,
        ready(64)
    );
    assert_eq!(
        client.probe_until(&req(1, 4), 0, Deadline::Answer).await,
        ready(64)
    );
    assert_eq!(client.stats().rpcs_sent, 1);
}

/// prefetch+wait as one call: a lookup answered within the budget is `Ready`; one
/// that is not is `Pending` when the budget passes, to the instant.
#[tokio::test(start_paused = true)]
async fn probe_within_waits_at_most_its_budget() {
    let _only = process_wide().await;
    let knobs = Knobs {
        latency: (3 * MS, 3 * MS),
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let (wire, knobs, _) = FakeWire::new(10, knobs);
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        client
            .probe_until(&req(1, 4), 0, Deadline::Within(5 * MS))
            .await,
        ready(64)
    );
    assert_eq!(Instant::now() - t0, 3 * MS);
    knobs.lock().unwrap().latency = (8 * MS, 8 * MS);
    let t1 = Instant::now();
    assert_eq!(
        client
            .probe_until(&req(2, 4), 0, Deadline::Within(5 * MS))
            .await,
        Probe::Pending
    );
    assert_eq!(Instant::now() - t1, 5 * MS);
    client.wait_progress(10 * MS).await;
    assert_eq!(Instant::now() - t1, 8 * MS);
    assert_eq!(client.probe(&req(2, 4), 0), ready(64));
}

/// Another task announces arrivals and finishes through a cloned handle; the client
/// applies them at its next call.
#[tokio::test(start_paused = true)]
async fn a_handle_announces_arrivals_and_finishes_from_another_task() {
    let _only = process_wide().await;
    let knobs = Knobs {
        hit: |n| n / 16 * 16,
        ..Knobs::default()
    };
    let (wire, _, _) = FakeWire::new(11, knobs);
    let mut client = LookupClient::with_wire(config(200), wire, &Handle::current()).unwrap();
    let handle = client.handle();
    let front = tokio::spawn(async move {
        for id in 1..=3 {
            handle.on_new_request(req(id, 4)).unwrap();
        }
        handle.on_finished(RequestId(3)).unwrap();
    });
    front.await.unwrap();
    client.drive();
    let stats = client.stats();
    assert_eq!(stats.core.lookups_arrival, 3);
    assert_eq!(stats.tracked_requests, 2);
    tokio::time::sleep(2 * MS).await;
    assert_eq!(client.probe(&req(1, 4), 0), ready(64));
    drop(client);
}
