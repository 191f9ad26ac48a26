//! The acceptance scenarios s1-s14 of `spec/behaviour.md`, and the cases around them
//! (TTL 0, repeated arrivals, failure backoff, saturating durations).

use super::*;

#[test]
fn s1_prefetch_then_two_probes_one_rpc_and_allocation_discards() {
    let mut h = Harness::prefetch(2);
    let r = req(1, 64, &[1, 2, 3, 4]);
    h.arrive(&r);
    assert_eq!(h.wire_ids(), vec![RpcId(1)]);
    assert_eq!(h.lookups.slots_in_use(), 1);
    assert_eq!(h.lookups.ready_at_first_probe(r.request_id), None);
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.lookups.ready_at_first_probe(r.request_id), Some(false));
    assert_eq!(h.sent.len(), 1, "the probe reuses the prefetch");
    h.answer_hit(RpcId(1), 48);
    assert_eq!(h.lookups.slots_in_use(), 0);
    assert_eq!(h.probe(&r, 0), ready(48));
    assert_eq!(h.probe(&r, 16), ready(32));
    assert_eq!(h.sent.len(), 1);
    h.lookups.on_allocated(r.request_id);
    assert_eq!(h.lookups.waiting_requests(), 0);
    // A reschedule after a failed load looks up again.
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.sent.len(), 2);
    let s = h.lookups.stats();
    assert_eq!((s.lookups_arrival, s.lookups_probe), (1, 1));
    assert_eq!((s.first_probes_pending, s.first_probes_ready), (1, 0));
    assert_eq!((s.probes_pending, s.probes_ready), (2, 2));
}

#[test]
fn s2_cap_two_third_arrival_looked_up_at_probe_and_slot_reused() {
    let mut h = Harness::prefetch(2);
    let (a, b, c, d) = (
        req(1, 32, &[1, 2]),
        req(2, 32, &[3, 4]),
        req(3, 32, &[5, 6]),
        req(4, 32, &[7, 8]),
    );
    h.arrive(&a);
    h.arrive(&b);
    h.arrive(&c);
    assert_eq!(h.wire_ids(), vec![RpcId(1), RpcId(2)]);
    assert_eq!(h.lookups.slots_in_use(), 2);
    assert_eq!(h.lookups.stats().prefetch_cap_full, 1);
    // The third is looked up at its first probe, uncapped.
    assert_eq!(h.probe(&c, 0), Probe::Pending);
    assert_eq!(h.wire_ids(), vec![RpcId(1), RpcId(2), RpcId(3)]);
    assert_eq!(h.lookups.slots_in_use(), 2);
    // A completed prefetch frees its slot for the next arrival.
    h.answer_hit(RpcId(1), 16);
    assert_eq!(h.lookups.slots_in_use(), 1);
    h.arrive(&d);
    assert_eq!(h.wire_ids(), vec![RpcId(2), RpcId(3), RpcId(4)]);
    assert_eq!(h.lookups.slots_in_use(), 2);
}

#[test]
fn s3_probe_lookup_submitted_while_cap_full() {
    let mut h = Harness::prefetch(1);
    h.arrive(&req(1, 32, &[1, 2]));
    assert_eq!(h.lookups.slots_in_use(), 1);
    let other = req(2, 32, &[3, 4]);
    assert_eq!(h.probe(&other, 0), Probe::Pending);
    assert_eq!(h.wire_ids(), vec![RpcId(1), RpcId(2)]);
    assert_eq!(h.lookups.slots_in_use(), 1);
    h.answer_hit(RpcId(2), 16);
    assert_eq!(h.probe(&other, 0), ready(16));
    // Request 1's prefetch completed before its first probe.
    h.answer_hit(RpcId(1), 16);
    assert_eq!(h.probe(&req(1, 32, &[1, 2]), 0), ready(16));
    assert_eq!(h.lookups.ready_at_first_probe(RequestId(1)), Some(true));
    assert_eq!(h.lookups.ready_at_first_probe(RequestId(2)), Some(false));
    assert_eq!(h.lookups.stats().first_probes_ready, 1);
}

#[test]
fn s4_changed_token_count_or_chain_refreshes_and_stale_reply_is_ignored() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 32, &[1, 2]);
    h.arrive(&r);
    // The prompt grew: new RPC.
    let grown = req(1, 48, &[1, 2, 3]);
    assert_eq!(h.probe(&grown, 0), Probe::Pending);
    assert_eq!(h.wire_ids(), vec![RpcId(1), RpcId(2)]);
    // Same length, other chain: new RPC again.
    let other = req(1, 48, &[1, 2, 9]);
    assert_eq!(h.probe(&other, 0), Probe::Pending);
    assert_eq!(h.wire_ids(), vec![RpcId(1), RpcId(2), RpcId(3)]);
    assert_eq!(h.lookups.stats().chain_refreshes, 2);
    // Stale replies, arriving later, are not applied.
    h.answer_hit(RpcId(1), 32);
    h.answer_hit(RpcId(2), 32);
    assert_eq!(h.probe(&other, 0), Probe::Pending);
    h.answer_hit(RpcId(3), 16);
    assert_eq!(h.probe(&other, 0), ready(16));
    assert_eq!(h.lookups.stats().replies_stale, 2);
    // The arrival slot was held by RPC 1 until it completed.
    assert_eq!(h.lookups.slots_in_use(), 0);
}

#[test]
fn s5_ttl_expiry_looks_up_again_but_in_flight_never_expires() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 48, &[1, 2, 3]);
    h.arrive(&r);
    h.answer_hit(RpcId(1), 32);
    h.advance(Duration::from_millis(2_500));
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.wire_ids(), vec![RpcId(2)]);
    assert_eq!(h.lookups.stats().ttl_refreshes, 1);
    // In flight for 10 s (timeout raised above that): no new RPC.
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.lookup_timeout = Duration::from_secs(60);
    let mut h = Harness::new(c);
    h.arrive(&r);
    h.advance(Duration::from_secs(10));
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.sent.len(), 1);
    assert_eq!(h.lookups.stats().ttl_refreshes, 0);
}

#[test]
fn s6_ineligible_requests_are_not_prefetched() {
    let mut h = Harness::prefetch(4);
    let mut skip = req(1, 32, &[1, 2]);
    skip.skip_reading_external_kv = true;
    h.arrive(&skip);
    h.arrive(&req(2, 15, &[1]));
    h.arrive(&req(3, 32, &[]));
    assert!(h.sent.is_empty());
    assert_eq!(h.lookups.stats().prefetch_ineligible, 3);
    // The probe still works for them, and none of them can have external tokens.
    assert_eq!(h.probe(&skip, 0), ready(0));
    assert_eq!(h.probe(&req(3, 32, &[]), 0), ready(0));
    assert!(h.sent.is_empty());
}

#[test]
fn s7_finish_while_queued_never_sent_and_while_in_flight_slot_freed_on_completion() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.max_in_flight = 1;
    let mut h = Harness::new(c);
    let (a, b) = (req(1, 32, &[1, 2]), req(2, 32, &[3, 4]));
    h.arrive(&a); // on the wire
    h.arrive(&b); // queued behind it
    assert_eq!(h.wire_ids(), vec![RpcId(1)]);
    assert_eq!(h.lookups.slots_in_use(), 2);
    h.lookups.on_finished(b.request_id);
    h.pump();
    assert_eq!(h.lookups.slots_in_use(), 1, "queued: slot freed at once");
    assert_eq!(h.lookups.stats().rpcs_cancelled, 1);
    h.lookups.on_finished(a.request_id);
    h.pump();
    assert_eq!(
        h.lookups.slots_in_use(),
        1,
        "in flight: slot held until it completes"
    );
    h.answer_hit(RpcId(1), 32);
    assert_eq!(h.lookups.slots_in_use(), 0);
    assert_eq!(h.lookups.stats().replies_stale, 1);
    assert_eq!(h.sent.len(), 1, "the cancelled lookup never went out");
    assert_eq!(h.lookups.tracked_requests(), 0);
    assert_eq!(h.lookups.open_rpcs(), 0);
}

#[test]
fn s8_preempt_reset_close_drop_state_and_reset_sends_one_rpc() {
    // `keep_wait`: the answered result survives the preemption, and the preempted
    // request's probes are given the wait budget.
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.max_in_flight = 64;
    c.lookup_on_preemption = lookup_core::OnPreemption::KeepWait;
    let mut kept = Harness::new(c);
    let a = req(1, 32, &[1, 2]);
    kept.arrive(&a);
    kept.answer_hit(RpcId(1), 16);
    kept.lookups.on_preempted(a.request_id);
    assert_eq!(
        kept.lookups.wait_budget(a.request_id),
        Duration::from_secs(5)
    );
    assert_eq!(
        kept.probe(&a, 0),
        Probe::Ready {
            external_tokens: 16,
            load_async: true
        },
        "keep_wait kept the result"
    );
    assert!(kept.wire_ids().is_empty());

    // vLLM's `discard`: preemption drops it.
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.max_in_flight = 64;
    c.lookup_on_preemption = lookup_core::OnPreemption::Discard;
    let mut h = Harness::new(c);
    let (a, b) = (req(1, 32, &[1, 2]), req(2, 32, &[3, 4]));
    h.arrive(&a);
    h.answer_hit(RpcId(1), 16);
    h.lookups.on_preempted(a.request_id);
    assert_eq!(
        h.probe(&a, 0),
        Probe::Pending,
        "preemption dropped the result"
    );
    assert_eq!(h.wire_ids(), vec![RpcId(2)]);

    h.arrive(&b);
    let reset = h.lookups.reset(h.now).unwrap();
    h.pump();
    let resets: Vec<_> = h
        .sent
        .iter()
        .filter(|(_, b)| *b == RpcBody::Reset)
        .collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(h.lookups.waiting_requests(), 0);
    h.answer(reset, Reply::Reset { ok: true });
    assert!(h.events.contains(&Event::ResetDone {
        rpc_id: reset,
        outcome: ResetOutcome::Ok
    }));
    // In-flight replies after the reset are ignored.
    h.answer_hit(RpcId(2), 16);
    assert_eq!(h.lookups.waiting_requests(), 0);

    h.arrive(&req(3, 32, &[5, 6]));
    h.lookups.close();
    assert_eq!(h.lookups.slots_in_use(), 0);
    assert_eq!(h.lookups.tracked_requests(), 0);
    assert_eq!(h.lookups.open_rpcs(), 0);
    let sent_before = h.sent.len();
    h.arrive(&req(4, 32, &[7, 8]));
    assert_eq!(h.probe(&req(4, 32, &[7, 8]), 0), ready(0));
    assert_eq!(h.lookups.reset(h.now), None);
    h.pump();
    assert_eq!(h.sent.len(), sent_before, "nothing is sent after close");
}

#[test]
fn s9_full_prompt_hit_keeps_the_last_block_for_recompute() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 32, &[1, 2]);
    h.arrive(&r);
    h.answer_hit(RpcId(1), 32);
    assert_eq!(h.probe(&r, 0), ready(16));
}

#[test]
fn s10_local_hit_is_subtracted() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 48, &[1, 2, 3]);
    h.arrive(&r);
    h.answer_hit(RpcId(1), 32);
    assert_eq!(h.probe(&r, 32), ready(0));
    let r = req(2, 64, &[4, 5, 6, 7]);
    h.arrive(&r);
    h.answer_hit(RpcId(2), 48);
    assert_eq!(h.probe(&r, 16), ready(32));
}

#[test]
fn s11_lookup_disabled_answers_zero_without_rpc() {
    let mut c = Config::new(16);
    c.enable_lookup = false;
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    let mut h = Harness::new(c);
    let r = req(1, 64, &[1, 2, 3, 4]);
    h.arrive(&r);
    assert_eq!(h.probe(&r, 0), ready(0));
    assert!(h.sent.is_empty());
    assert_eq!(h.lookups.stats().rpcs_created, 0);
}

#[test]
fn s12_silent_server_times_out_then_next_lookup_succeeds_and_late_reply_is_stale() {
    let mut h = Harness::prefetch(4);
    let a = req(1, 32, &[1, 2]);
    h.arrive(&a);
    assert_eq!(
        h.dispatcher.poll_timeout(),
        Some(h.now + Duration::from_secs(5))
    );
    h.advance(Duration::from_millis(4_999));
    assert_eq!(h.probe(&a, 0), Probe::Pending);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.lookups.slots_in_use(), 0);
    assert_eq!(h.probe(&a, 0), ready(0));
    assert_eq!(h.lookups.stats().failed_timed_out, 1);
    assert!(h.events.iter().any(|e| matches!(
        e,
        Event::LookupDone {
            rpc_id: RpcId(1),
            outcome: LookupOutcome::Failed(RpcFailure::TimedOut),
            requests: 1,
            ..
        }
    )));
    // The server answers again.
    let b = req(2, 32, &[3, 4]);
    h.arrive(&b);
    h.answer_hit(RpcId(2), 16);
    assert_eq!(h.probe(&b, 0), ready(16));
    // The late reply to the timed-out RPC is recognised and dropped.
    assert!(
        !h.dispatcher
            .handle_reply(RpcId(1), Reply::Lookup { hit_tokens: 16 }, h.now)
    );
    h.pump();
    assert_eq!(h.dispatcher.stats().late_replies, 1);
    // Rule 11: the failure is not served from the cache. Request 2's success reset
    // the failure backoff, so request 1 is looked up again at once.
    assert_eq!(h.probe(&a, 0), Probe::Pending);
    assert_eq!(h.lookups.stats().retries_after_failure, 1);
    h.answer_hit(RpcId(3), 16);
    assert_eq!(h.probe(&a, 0), ready(16));
}

/// Regression (TTL 0 storms the server): the probe that waited for a lookup
/// reads its reply whatever the TTL; with TTL 0 each result is read once.
#[test]
fn ttl_zero_serves_the_waiting_probe_its_reply_and_reads_each_result_once() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.lookup_prefetch_ttl = Duration::ZERO;
    let mut h = Harness::new(c);
    let r = req(1, 48, &[1, 2, 3]);
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    h.answer_hit(RpcId(1), 32);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.probe(&r, 0), ready(32));
    assert_eq!(
        h.sent.len(),
        1,
        "the waited-for reply is answered, not looked up again"
    );
    // Read once: the next probe looks up again.
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.sent.len(), 2);
    assert_eq!(h.lookups.stats().ttl_refreshes, 1);
}

/// Rule 2 for an `on_new_request` of a request already tracked: one whose lookup is in
/// flight or done keeps it; one whose lookup its allocation consumed (rule 8) is
/// prefetched again, holding a slot.
#[test]
fn a_repeated_arrival_keeps_its_lookup_and_after_allocation_prefetches_again() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 48, &[1, 2, 3]);
    h.arrive(&r);
    h.arrive(&r);
    assert_eq!(h.wire_ids(), vec![RpcId(1)], "an in-flight lookup is kept");
    h.answer_hit(RpcId(1), 32);
    h.arrive(&r);
    assert_eq!(h.sent.len(), 1, "a done lookup is kept");
    assert_eq!(h.probe(&r, 16), ready(16));
    h.lookups.on_allocated(r.request_id);
    h.arrive(&r);
    assert_eq!(h.wire_ids(), vec![RpcId(2)]);
    assert_eq!(h.lookups.stats().lookups_arrival, 2);
    assert_eq!(h.lookups.slots_in_use(), 1);
    assert_eq!(h.lookups.tracked_requests(), 1);
}

/// Regression (a failure is served from the cache): a failed lookup answers the
/// probe that waited for it with an unavailable 0, then is looked up again only after
/// the failure backoff (10 ms, doubling), one failed request at a time.
#[test]
fn a_failed_lookup_is_not_cached_and_retries_after_the_backoff() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 48, &[1, 2, 3]);
    let s = req(2, 48, &[4, 5, 6]);
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.probe(&s, 0), Probe::Pending);
    assert_eq!(h.dispatcher.fail_on_wire(None, h.now), 2);
    h.pump();
    assert_eq!(h.probe(&r, 0), ready(0));
    assert_eq!(
        h.lookups.answer_of(r.request_id),
        Some(Answer::Unavailable(Unavailable::Transport))
    );
    assert_eq!(h.probe(&s, 0), ready(0));
    // Within the backoff (two failures at once: 10 ms, then 20 ms from now): no RPC.
    h.advance(Duration::from_millis(19));
    assert_eq!(h.probe(&r, 0), ready(0));
    assert_eq!(
        h.lookups.answer_of(r.request_id),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
    assert_eq!(h.sent.len(), 2);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    // One retry at a time: request 2 waits for request 1's.
    assert_eq!(h.probe(&s, 0), ready(0));
    assert_eq!(h.sent.len(), 3);
    h.answer_hit(RpcId(3), 32);
    assert_eq!(h.probe(&r, 0), ready(32));
    assert_eq!(
        h.lookups.answer_of(r.request_id),
        Some(Answer::Hit { hit_tokens: 32 })
    );
    // The success ended the backoff: request 2 retries at its next probe.
    assert_eq!(h.probe(&s, 0), Probe::Pending);
    assert_eq!(h.lookups.stats().retries_after_failure, 2);
}

/// `spec/wire.md`, "Store unavailable": the server's error reply (its store could not
/// answer) is a failure, counted apart and never a miss, with the backoff and the
/// retry of rule 11 as any other failure.
#[test]
fn a_store_unavailable_reply_fails_the_lookup_and_retries_after_the_backoff() {
    let mut h = Harness::prefetch(4);
    let r = req(1, 48, &[1, 2, 3]);
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    h.answer(RpcId(1), Reply::StoreUnavailable);
    assert_eq!(h.probe(&r, 0), ready(0));
    assert_eq!(
        h.lookups.answer_of(r.request_id),
        Some(Answer::Unavailable(Unavailable::Store))
    );
    let stats = h.lookups.stats();
    assert_eq!(
        (
            stats.failed_store_unavailable,
            stats.misses,
            stats.failed_malformed,
            stats.failed_transport,
            stats.answers_unavailable,
            stats.answers_miss,
        ),
        (1, 0, 0, 0, 1, 0)
    );
    // Within the backoff (one failure: 10 ms): no RPC, the answer says a retry waits.
    h.advance(Duration::from_millis(9));
    assert_eq!(h.probe(&r, 0), ready(0));
    assert_eq!(
        h.lookups.answer_of(r.request_id),
        Some(Answer::Unavailable(Unavailable::Retrying))
    );
    assert_eq!(h.sent.len(), 1);
    h.advance(Duration::from_millis(1));
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    assert_eq!(h.sent.len(), 2);
    h.answer_hit(RpcId(2), 32);
    assert_eq!(h.probe(&r, 0), ready(32));
    assert_eq!(h.lookups.stats().retries_after_failure, 1);
}

/// Regression (huge durations panic): any finite TTL and timeout in seconds is
/// accepted and saturates; nothing panics when the deadline is built.
#[test]
fn huge_ttl_and_timeout_saturate_instead_of_panicking() {
    let mut c = Config::new(16);
    c.lookup_async = true;
    c.lookup_prefetch_limit = 4;
    c.lookup_prefetch_ttl = lookup_core::duration_from_secs(1e20).unwrap();
    c.lookup_timeout = lookup_core::duration_from_secs(1e19).unwrap();
    assert_eq!(c.lookup_prefetch_ttl, Duration::MAX);
    let mut h = Harness::new(c);
    let r = req(1, 48, &[1, 2, 3]);
    h.arrive(&r);
    assert_eq!(h.sent.len(), 1);
    assert!(h.dispatcher.poll_timeout().is_some_and(|t| t > h.now));
    h.advance(Duration::from_secs(3600));
    assert_eq!(h.probe(&r, 0), Probe::Pending);
    h.answer_hit(RpcId(1), 16);
    h.advance(Duration::from_secs(3600));
    assert_eq!(h.probe(&r, 0), ready(16));
}

#[test]
fn s13_reply_above_num_tokens_or_malformed_counts_as_failure() {
    let mut h = Harness::prefetch(4);
    let a = req(1, 40, &[1, 2]);
    h.arrive(&a);
    h.answer_hit(RpcId(1), 48);
    assert_eq!(h.probe(&a, 0), ready(0));
    let b = req(2, 40, &[3, 4]);
    h.arrive(&b);
    h.answer(RpcId(2), Reply::Malformed);
    assert_eq!(h.probe(&b, 0), ready(0));
    let c = req(3, 40, &[5, 6]);
    h.arrive(&c);
    h.answer_hit(RpcId(3), 17); // not a block multiple
    assert_eq!(h.probe(&c, 0), ready(0));
    assert_eq!(h.lookups.stats().failed_malformed, 3);
}

#[test]
fn s14_identical_prompts_arriving_together_share_one_rpc() {
    let mut h = Harness::prefetch(4);
    let reqs: Vec<Request> = (1..=3).map(|i| req(i, 48, &[7, 8, 9])).collect();
    for r in &reqs {
        h.arrive(r);
    }
    assert_eq!(h.sent.len(), 1);
    assert_eq!(h.lookups.stats().rpcs_shared, 2);
    assert_eq!(
        h.lookups.slots_in_use(),
        3,
        "each request keeps its own slot"
    );
    h.answer_hit(RpcId(1), 32);
    assert_eq!(h.lookups.slots_in_use(), 0);
    for r in &reqs {
        assert_eq!(h.probe(r, 0), ready(32));
    }
    assert!(h.events.iter().any(|e| matches!(
        e,
        Event::LookupDone {
            rpc_id: RpcId(1),
            requests: 3,
            ..
        }
    )));
}
