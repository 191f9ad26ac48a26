//! Rules 10, 13, 15, 16 and 17 of `spec/behaviour.md` one by one, configuration
//! checks, the backlog bound, the dispatcher's bounded queues and idle sweeps.

use super::*;

#[test]
fn r15_probe_promotes_its_queued_prefetch_ahead_of_others() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 8;
    c.max_in_flight = 1;
    let mut h = Harness::new(c);
    let reqs: Vec<Request> = (1..=4).map(|i| req(i, 32, &[i * 10, i * 10 + 1])).collect();
    for r in &reqs {
        h.arrive(r);
    }
    assert_eq!(h.wire_ids(), vec![RpcId(1)]);
    // The scheduler reaches request 4 first: its prefetch jumps the queue.
    assert_eq!(h.probe(&reqs[3], 0), Probe::Pending);
    assert_eq!(h.lookups.stats().promotions, 1);
    h.answer_hit(RpcId(1), 0);
    assert_eq!(h.wire_ids(), vec![RpcId(4)]);
    h.answer_hit(RpcId(4), 16);
    assert_eq!(h.wire_ids(), vec![RpcId(2)]);
    assert_eq!(h.probe(&reqs[3], 0), ready(16));
}

/// Regression (rule 15 inversion): an RPC's priority follows the probes that
/// currently wait for it. Request 2's probe made RPC 3 awaited; request 3 joined it at
/// arrival; request 2 finished, so nobody probing waits for RPC 3 any more, and the
/// promoted prefetch of request 1 (RPC 2) goes first.
#[test]
fn r15_priority_follows_the_probes_currently_waiting() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 8;
    c.max_in_flight = 1;
    let mut h = Harness::new(c);
    let r0 = req(10, 32, &[1, 2]);
    let r1 = req(11, 32, &[3, 4]);
    let r2 = req(12, 32, &[5, 6]);
    let r3 = req(13, 32, &[5, 6]);
    h.arrive(&r0);
    assert_eq!(h.wire_ids(), vec![RpcId(1)]);
    h.arrive(&r1);
    assert_eq!(h.probe(&r2, 0), Probe::Pending);
    h.arrive(&r3);
    assert_eq!(h.lookups.stats().rpcs_shared, 1);
    h.lookups.on_finished(r2.request_id);
    h.pump();
    assert_eq!(h.lookups.stats().demotions, 1);
    assert_eq!(h.probe(&r1, 0), Probe::Pending);
    assert_eq!(h.lookups.stats().promotions, 1);
    h.answer_hit(RpcId(1), 16);
    assert_eq!(h.wire_ids(), vec![RpcId(2)], "the awaited RPC goes first");
    h.answer_hit(RpcId(2), 16);
    assert_eq!(h.wire_ids(), vec![RpcId(3)]);
    h.answer_hit(RpcId(3), 32);
    assert_eq!(h.probe(&r3, 0), ready(16));
}

#[test]
fn r15_without_priority_the_queue_is_fifo() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 8;
    c.max_in_flight = 1;
    c.lookup_priority = false;
    c.lookup_share = false;
    let mut h = Harness::new(c);
    let reqs: Vec<Request> = (1..=3).map(|i| req(i, 32, &[i * 10, i * 10 + 1])).collect();
    for r in &reqs {
        h.arrive(r);
    }
    assert_eq!(h.probe(&reqs[2], 0), Probe::Pending);
    h.answer_hit(RpcId(1), 0);
    assert_eq!(h.wire_ids(), vec![RpcId(2)]);
    assert_eq!(h.lookups.stats().promotions, 0);
}

#[test]
fn r16_without_sharing_identical_prompts_send_one_rpc_each() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 8;
    c.max_in_flight = 8;
    c.lookup_share = false;
    let mut h = Harness::new(c);
    for i in 1..=3 {
        h.arrive(&req(i, 48, &[7, 8, 9]));
    }
    assert_eq!(h.sent.len(), 3);
}

#[test]
fn r16_shared_rpc_survives_one_asker_finishing() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 8;
    c.max_in_flight = 1;
    let mut h = Harness::new(c);
    h.arrive(&req(1, 32, &[1, 2])); // on the wire
    let (a, b) = (req(2, 48, &[3, 4, 5]), req(3, 48, &[3, 4, 5]));
    h.arrive(&a); // queued
    h.arrive(&b); // shares a's queued RPC
    assert_eq!(h.lookups.slots_in_use(), 3);
    h.lookups.on_finished(a.request_id);
    h.pump();
    assert_eq!(h.lookups.slots_in_use(), 2, "a's queued lookup ended");
    h.answer_hit(RpcId(1), 0);
    assert_eq!(h.wire_ids(), vec![RpcId(2)], "b still needs the shared RPC");
    h.answer_hit(RpcId(2), 32);
    assert_eq!(h.probe(&b, 0), ready(32));
    assert_eq!(h.lookups.slots_in_use(), 0);
}

#[test]
fn r10_sync_mode_never_prefetches() {
    let mut c = Config::new(16);
    c.lookup_prefetch_limit = 8; // ignored: lookup_async is false
    let mut h = Harness::new(c);
    let r = req(1, 32, &[1, 2]);
    h.arrive(&r);
    assert!(h.sent.is_empty());
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.sent.len(), 1);
}

#[test]
fn r13_reset_timeout_is_reported() {
    let mut h = Harness::prefetch(4);
    let reset = h.lookups.reset(h.now).unwrap();
    h.pump();
    h.advance(Duration::from_secs(5));
    assert!(h.events.contains(&Event::ResetDone {
        rpc_id: reset,
        outcome: ResetOutcome::TimedOut
    }));
    assert_eq!(h.lookups.open_rpcs(), 0);
}

#[test]
fn r17_transport_failure_is_a_miss() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 32, &[1, 2]);
    h.arrive(&r);
    assert_eq!(h.dispatcher.fail_on_wire(None, h.now), 1);
    h.pump();
    assert_eq!(h.probe(&r, 0), ready(0));
    assert_eq!(h.lookups.stats().failed_transport, 1);
    assert_eq!(h.lookups.slots_in_use(), 0);
}

#[test]
fn config_rejects_nonsense() {
    let mut c = Config::new(0);
    assert!(
        Lookups::new(c.clone())
            .unwrap_err()
            .to_string()
            .contains("block_size")
    );
    c.block_size = 16;
    assert_eq!(
        lookup_core::duration_from_secs(f64::NAN).unwrap_err(),
        "NaN is not a finite number of seconds >= 0"
    );
    assert_eq!(
        lookup_core::duration_from_secs(-1.0).unwrap_err(),
        "-1 is not a finite number of seconds >= 0"
    );
    assert_eq!(
        lookup_core::duration_from_secs(f64::INFINITY).unwrap_err(),
        "inf is not a finite number of seconds >= 0"
    );
    assert_eq!(
        lookup_core::duration_from_secs(0.25),
        Ok(Duration::from_millis(250))
    );
    c.max_in_flight = 0;
    assert!(
        Lookups::new(c)
            .unwrap_err()
            .to_string()
            .contains("max_in_flight")
    );
}

#[test]
fn backlog_limit_refuses_prefetch_but_never_probes() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 100;
    c.max_in_flight = 1;
    c.max_queued = 2;
    let mut h = Harness::new(c);
    for i in 1..=4 {
        h.arrive(&req(i, 32, &[i * 10, i * 10 + 1]));
    }
    // RPC 1 on the wire, 2 and 3 queued, 4 refused.
    assert_eq!(h.lookups.stats().prefetch_backlog_full, 1);
    assert_eq!(h.lookups.stats().lookups_arrival, 3);
    assert_eq!(h.probe(&req(4, 32, &[40, 41]), 0), Probe::Pending);
    assert_eq!(h.lookups.stats().lookups_probe, 1);
}

#[test]
fn dispatcher_queues_stay_bounded_while_the_wire_is_hung() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.max_in_flight = 1;
    let mut h = Harness::new(c);
    h.arrive(&req(1, 32, &[1, 2])); // on the wire, never answered
    for i in 2..10_000 {
        let r = req(i, 32, &[i * 10, i * 10 + 1]);
        h.arrive(&r);
        h.lookups.on_finished(r.request_id);
        h.pump();
    }
    assert_eq!(h.dispatcher.queued(), 0);
    assert!(
        h.dispatcher.queued_ids() <= 64,
        "{}",
        h.dispatcher.queued_ids()
    );
    assert_eq!(h.lookups.stats().rpcs_cancelled, 9_998);
}

/// A request never finished does not stay tracked silently: `end_idle` ends those not
/// seen for longer than its bound, freeing their slots and cancelling queued lookups.
#[test]
fn end_idle_ends_requests_not_seen_for_longer_than_the_bound() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.max_in_flight = 1;
    c.lookup_timeout = Duration::from_secs(60);
    let mut h = Harness::new(c);
    let old = req(1, 32, &[1, 2]);
    let queued = req(2, 32, &[3, 4]);
    h.arrive(&old);
    h.arrive(&queued);
    h.answer_hit(RpcId(1), 16);
    h.advance(Duration::from_secs(30));
    let fresh = req(3, 32, &[5, 6]);
    h.arrive(&fresh);
    assert_eq!(h.lookups.tracked_requests(), 3);
    assert_eq!(h.lookups.end_idle(Duration::from_secs(10), h.now), 2);
    h.pump();
    assert_eq!(h.lookups.tracked_requests(), 1);
    assert_eq!(h.lookups.stats().requests_ended_idle, 2);
    // Request 2's lookup was on the wire: its slot is freed when it ends.
    assert_eq!(h.lookups.slots_in_use(), 2);
    h.answer_hit(RpcId(2), 16);
    assert_eq!(h.lookups.slots_in_use(), 1);
    assert_eq!(h.probe(&fresh, 0), Probe::Pending);
}
