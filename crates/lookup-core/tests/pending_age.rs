//! `max_pending_age` (spec/behaviour.md rule 17) in the dispatcher: a lookup queued
//! that long ends unsent as `NotSent`, in queue order, whatever left the queue ahead
//! of it (sent first for an awaiting probe, cancelled), and the timer the driver arms
//! includes the oldest queued lookup's expiry.

use std::time::{Duration, Instant};

use lookup_core::{
    BlockHashes, Config, Dispatcher, Lookups, Reply, Request, RequestId, RpcFailure, RpcId,
};

const MS: Duration = Duration::from_millis(1);

fn request(id: u64) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens: 33,
        block_hashes: BlockHashes::from_u64s(&[id, id + 100]),
        skip_reading_external_kv: false,
    }
}

/// Carries the lifecycle's commands to the dispatcher at `now`; returns the lookups sent.
fn pump(lookups: &mut Lookups, dispatcher: &mut Dispatcher, now: Instant) -> Vec<RpcId> {
    while let Some(cmd) = lookups.poll_transmit() {
        dispatcher.push(cmd, (), now);
    }
    let mut sent = Vec::new();
    while let Some(out) = dispatcher.poll_transmit(now) {
        sent.push(out.rpc_id);
    }
    sent
}

#[test]
fn the_oldest_queued_lookup_ends_unsent_after_max_pending_age() {
    let mut config = Config::new(16);
    config.lookup_async = true;
    config.lookup_prefetch_limit = 8;
    config.max_in_flight = 1;
    config.lookup_timeout = 10_000 * MS;
    let mut lookups = Lookups::new(config.clone()).unwrap();
    let mut dispatcher: Dispatcher = Dispatcher::new(&config);
    dispatcher.set_max_pending_age(Some(300 * MS));
    let t0 = Instant::now();

    // Request 1 goes out at once; 2 is queued at 100 ms, 3 and 4 at 200 ms.
    lookups.on_new_request(&request(1), t0);
    let first = pump(&mut lookups, &mut dispatcher, t0);
    assert_eq!(first.len(), 1);
    assert_eq!(dispatcher.poll_timeout(), Some(t0 + 10_000 * MS));
    lookups.on_new_request(&request(2), t0 + 100 * MS);
    assert!(pump(&mut lookups, &mut dispatcher, t0 + 100 * MS).is_empty());
    assert_eq!(dispatcher.poll_timeout(), Some(t0 + 400 * MS));
    for id in [3, 4] {
        lookups.on_new_request(&request(id), t0 + 200 * MS);
    }
    assert!(pump(&mut lookups, &mut dispatcher, t0 + 200 * MS).is_empty());
    assert_eq!(dispatcher.queued(), 3);

    // A probe awaits 4: it is sent ahead of 2 and 3 when 1 is answered; 3 finishes.
    let _ = lookups.probe(&request(4), 0, t0 + 250 * MS);
    assert!(pump(&mut lookups, &mut dispatcher, t0 + 250 * MS).is_empty());
    assert!(dispatcher.handle_reply(first[0], Reply::Lookup { hit_tokens: 32 }, t0 + 250 * MS));
    let fourth = pump(&mut lookups, &mut dispatcher, t0 + 250 * MS);
    assert_eq!(fourth.len(), 1);
    lookups.on_finished(RequestId(3));
    assert!(pump(&mut lookups, &mut dispatcher, t0 + 260 * MS).is_empty());
    assert_eq!(dispatcher.queued(), 1);
    // 2 is the oldest still queued: its expiry comes before 4's deadline.
    assert_eq!(dispatcher.poll_timeout(), Some(t0 + 400 * MS));

    dispatcher.handle_timeout(t0 + 399 * MS);
    assert_eq!(dispatcher.stats().lookups_expired, 0);
    while dispatcher.poll_event().is_some() {}
    dispatcher.handle_timeout(t0 + 400 * MS);
    assert_eq!(dispatcher.stats().lookups_expired, 1);
    assert_eq!(dispatcher.queued(), 0);
    let (event, ()) = dispatcher.poll_event().expect("2 ended");
    assert_eq!(event.result(), Err(RpcFailure::NotSent));
    assert_eq!(event.at(), t0 + 400 * MS);
    assert!(dispatcher.poll_event().is_none());
    // Nothing queued is left to expire: the timer is 4's deadline on the wire.
    assert_eq!(dispatcher.poll_timeout(), Some(t0 + 10_250 * MS));
    // An expired lookup is never released afterwards.
    assert!(dispatcher.poll_transmit(t0 + 401 * MS).is_none());
}

#[test]
fn without_max_pending_age_a_queued_lookup_waits() {
    let mut config = Config::new(16);
    config.lookup_async = true;
    config.lookup_prefetch_limit = 8;
    config.max_in_flight = 1;
    let mut lookups = Lookups::new(config.clone()).unwrap();
    let mut dispatcher: Dispatcher = Dispatcher::new(&config);
    let t0 = Instant::now();
    for id in [1, 2] {
        lookups.on_new_request(&request(id), t0);
    }
    assert_eq!(pump(&mut lookups, &mut dispatcher, t0).len(), 1);
    dispatcher.handle_timeout(t0 + 60_000 * MS);
    assert_eq!(dispatcher.stats().lookups_expired, 0);
    assert_eq!(dispatcher.queued(), 1);
}
