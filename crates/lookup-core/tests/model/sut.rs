//! The system under test: the real [`Lookups`] and [`Dispatcher`] driven the way
//! `lib.rs` documents (drain transmits into the dispatcher, drain events, send what
//! the dispatcher releases), with a virtual clock and a fake server whose wire holds
//! every RPC the dispatcher released until the test answers, fails or loses it.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lookup_core::{
    Command, Dispatcher, DispatcherStats, Event, Lookups, Outgoing, Probe, RequestId, RpcBody,
    RpcFailure, RpcId, Stats,
};
use proptest_state_machine::StateMachineTest;

use crate::reference::{Counters, Model, NEVER_ID, POOL, RefState};
use crate::server::{self, BLOCK_SIZE, Prompt, hit_cap};
use crate::transitions::{DeadTarget, Slot, Transition};

/// Who may be the subject of a `Command::Send` drained after an input.
#[derive(Clone, Copy, Debug)]
enum Asker {
    /// Nobody: the input was not an arrival, a probe or a reset.
    Nobody,
    /// The request in this slot, for its current prompt.
    Request(Slot),
    /// The reset RPC.
    Reset,
}

/// The harness: core, dispatcher, clock and wire.
pub(crate) struct Harness {
    lookups: Lookups,
    dispatcher: Dispatcher,
    base: Instant,
    now_ns: u64,
    wire: Vec<Outgoing>,
    prompts: Vec<Option<Prompt>>,
    /// Ids the core cancelled (rule 9): never to be released.
    cancelled: HashSet<RpcId>,
    /// Every id released to the wire: an id goes out at most once.
    released: HashSet<RpcId>,
    events: Vec<Event>,
}

fn request_id(slot: Slot) -> RequestId {
    RequestId(u64::try_from(slot).expect("small"))
}

impl Harness {
    fn new(state: &RefState) -> Self {
        let config = state.settings.config();
        Self {
            lookups: Lookups::new(config.clone()).expect("valid configuration"),
            dispatcher: Dispatcher::new(&config),
            base: Instant::now(),
            now_ns: 0,
            wire: Vec::new(),
            prompts: vec![None; POOL],
            cancelled: HashSet::new(),
            released: HashSet::new(),
            events: Vec::new(),
        }
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.now_ns)
    }

    /// The driving loop of the crate docs, after one input. Checks that a `Send` is
    /// only ever for the request (and its current prompt) or the reset that caused it.
    fn settle(&mut self, asker: Asker) {
        // A driver checks its timer on every loop turn; every deadline at or before
        // `now` was handled when the clock moved, so this call must change nothing
        // (STYLE.md rule 3: early or repeated calls are harmless).
        self.dispatcher.handle_timeout(self.now());
        let mut sends = 0;
        loop {
            let mut progressed = false;
            while let Some(command) = self.lookups.poll_transmit() {
                progressed = true;
                match &command {
                    Command::Send { rpc_id, body, .. } => {
                        sends += 1;
                        assert_eq!(sends, 1, "one input created more than one RPC");
                        assert!(!self.lookups.is_closed(), "rule 14: a Send after close");
                        match (asker, body) {
                            (Asker::Request(slot), RpcBody::Lookup { .. }) => {
                                let prompt = self.prompts[slot].unwrap_or_else(|| {
                                    panic!("{rpc_id}: a Send for finished request {slot}")
                                });
                                assert_eq!(
                                    *body,
                                    prompt.question().body(),
                                    "{rpc_id} does not ask about request {slot}'s current prompt"
                                );
                            }
                            (Asker::Reset, RpcBody::Reset) => {}
                            _ => panic!("unexpected {command:?} after an input of {asker:?}"),
                        }
                    }
                    Command::Cancel { rpc_id } => {
                        self.cancelled.insert(*rpc_id);
                    }
                    Command::Promote { .. } | Command::Demote { .. } => {}
                }
                self.dispatcher.push(command, ());
            }
            while let Some((event, ())) = self.dispatcher.poll_event() {
                progressed = true;
                self.lookups.handle_wire_event(event);
            }
            while let Some(event) = self.lookups.poll_event() {
                progressed = true;
                self.events.push(event);
            }
            while let Some(out) = self.dispatcher.poll_transmit(self.now()) {
                progressed = true;
                assert!(
                    !self.lookups.is_closed(),
                    "rule 14: {} released after close",
                    out.rpc_id
                );
                assert!(
                    !self.cancelled.contains(&out.rpc_id),
                    "rule 9: cancelled {} released",
                    out.rpc_id
                );
                assert!(
                    self.released.insert(out.rpc_id),
                    "{} released twice",
                    out.rpc_id
                );
                self.wire.push(out);
            }
            if !progressed {
                break;
            }
        }
    }

    fn deliver_reply(&mut self, rpc_id: RpcId, reply: lookup_core::Reply) {
        let _applied = self.dispatcher.handle_reply(rpc_id, reply, self.now());
    }

    fn deliver_error(&mut self, rpc_id: RpcId) {
        self.dispatcher
            .handle_send_failed(rpc_id, RpcFailure::Transport, self.now());
    }

    fn dead_id(state: &RefState, target: DeadTarget) -> RpcId {
        match target {
            DeadTarget::Ended(i) => RpcId(state.ended[i]),
            DeadTarget::Never => RpcId(NEVER_ID),
        }
    }

    fn step(&mut self, state: &RefState, transition: Transition) {
        self.events.clear();
        let now = self.now();
        let asker = match transition {
            Transition::Arrive { slot, prompt } => {
                self.prompts[slot] = Some(prompt);
                self.lookups
                    .on_new_request(&prompt.request(request_id(slot)), now);
                Asker::Request(slot)
            }
            Transition::Probe {
                slot,
                change,
                local_blocks,
            } => {
                let prompt = change.apply(self.prompts[slot].expect("precondition: live"));
                self.prompts[slot] = Some(prompt);
                let cap = hit_cap(prompt.num_tokens);
                let num_computed_tokens = (local_blocks * BLOCK_SIZE).min(cap);
                let answer =
                    self.lookups
                        .probe(&prompt.request(request_id(slot)), num_computed_tokens, now);
                if let Probe::Ready {
                    external_tokens, ..
                } = answer
                {
                    assert!(
                        external_tokens + num_computed_tokens <= cap,
                        "rule 12: {external_tokens} external + {num_computed_tokens} local > cap {cap}"
                    );
                }
                assert_eq!(
                    Some(answer),
                    state.expected.probe,
                    "probe of request {slot} ({prompt:?}, local {num_computed_tokens})"
                );
                Asker::Request(slot)
            }
            Transition::Allocated { slot } => {
                self.lookups.on_allocated(request_id(slot));
                Asker::Nobody
            }
            Transition::Preempted { slot } => {
                self.lookups.on_preempted(request_id(slot));
                Asker::Nobody
            }
            Transition::Finished { slot } => {
                self.lookups.on_finished(request_id(slot));
                self.prompts[slot] = None;
                Asker::Nobody
            }
            Transition::Reset => {
                let got = self.lookups.reset(now);
                assert_eq!(Some(got), state.expected.reset, "reset's id");
                Asker::Reset
            }
            Transition::Close => {
                self.lookups.close();
                // The I/O task ends with the client (rule 14).
                self.dispatcher.close();
                Asker::Nobody
            }
            Transition::Advance { ms } => {
                self.now_ns += ms * 1_000_000;
                self.dispatcher.handle_timeout(self.now());
                Asker::Nobody
            }
            Transition::FireTimeout => {
                if let Some(deadline) = self.dispatcher.poll_timeout() {
                    let at = u64::try_from(deadline.duration_since(self.base).as_nanos())
                        .expect("short");
                    self.now_ns = self.now_ns.max(at);
                }
                self.dispatcher.handle_timeout(self.now());
                Asker::Nobody
            }
            Transition::Answer {
                wire_index,
                value,
                duplicate,
            } => {
                let out = if duplicate {
                    self.wire[wire_index].clone()
                } else {
                    self.wire.remove(wire_index)
                };
                let reply = server::reply(value, Some(&out.body));
                self.deliver_reply(out.rpc_id, reply);
                Asker::Nobody
            }
            Transition::TransportError { wire_index } => {
                let out = self.wire.remove(wire_index);
                self.deliver_error(out.rpc_id);
                Asker::Nobody
            }
            Transition::Lose { wire_index } => {
                let _lost = self.wire.remove(wire_index);
                Asker::Nobody
            }
            Transition::DeadReply { target, value } => {
                let rpc_id = Self::dead_id(state, target);
                match value {
                    Some(v) => self.deliver_reply(rpc_id, server::reply(v, None)),
                    None => self.deliver_error(rpc_id),
                }
                Asker::Nobody
            }
            Transition::Reopen => {
                self.wire.clear();
                let _failed = self.dispatcher.fail_on_wire(None, self.now());
                Asker::Nobody
            }
        };
        self.settle(asker);
        assert_eq!(self.events, state.expected.events, "events");
    }

    fn check(&self, state: &RefState) {
        let l = &self.lookups;
        assert_eq!(l.is_closed(), state.closed, "closed");
        assert_eq!(
            l.slots_in_use(),
            state.slots_in_use(),
            "rule 3: slots in use"
        );
        assert_eq!(l.open_rpcs(), state.open_rpcs(), "open RPCs");
        assert_eq!(
            l.waiting_requests(),
            state.waiting_requests(),
            "requests waiting on an RPC"
        );
        let live = state.live_requests();
        assert!(
            l.tracked_requests() <= live,
            "{} requests tracked, {live} alive",
            l.tracked_requests()
        );
        if live == 0 || state.closed {
            assert_eq!(l.tracked_requests(), 0, "state left with no request alive");
        }
        if (live == 0 && state.open_rpcs_sent() == 0) || state.closed {
            assert_eq!(
                l.slots_in_use(),
                0,
                "slots with no request and nothing on the wire"
            );
            assert_eq!(
                l.open_rpcs(),
                0,
                "RPCs with no request and nothing on the wire"
            );
        }
        let deadline = self
            .dispatcher
            .poll_timeout()
            .map(|t| u64::try_from(t.duration_since(self.base).as_nanos()).expect("short"));
        assert_eq!(
            deadline,
            state.next_deadline(),
            "poll_timeout (ns from start)"
        );
        let wire: Vec<(RpcId, &RpcBody)> = self.wire.iter().map(|o| (o.rpc_id, &o.body)).collect();
        let expected: Vec<(RpcId, &RpcBody)> =
            state.wire.iter().map(|w| (w.rpc_id, &w.body)).collect();
        assert_eq!(wire, expected, "RPCs on the wire");
        let stats = l.stats();
        assert!(
            stats.first_probes_ready <= state.counters.first_probes_ready_max,
            "first_probes_ready {} > first probes answered Ready {}",
            stats.first_probes_ready,
            state.counters.first_probes_ready_max
        );
        assert!(
            stats.first_probes_pending <= state.counters.first_probes_pending_max,
            "first_probes_pending {} > first probes answered Pending {}",
            stats.first_probes_pending,
            state.counters.first_probes_pending_max
        );
        let exact = Counters {
            first_probes_ready_max: state.counters.first_probes_ready_max,
            first_probes_pending_max: state.counters.first_probes_pending_max,
            ..counters(stats, self.dispatcher.stats())
        };
        assert_eq!(exact, state.counters, "counters");
        for (slot, live) in state.requests.iter().enumerate() {
            let core = l.ready_at_first_probe(request_id(slot));
            let model = live.as_ref().and_then(|r| r.first_probe);
            match (core, model) {
                (None, _) if state.closed => {}
                (Some(core), Some(model)) if !state.closed => {
                    assert_eq!(core, model.ready, "request {slot} ready at its first probe");
                }
                (None, None) => {}
                (None, Some(model)) if model.without_lookup => {}
                _ => panic!("request {slot}: ready at first probe {core:?}, model {model:?}"),
            }
        }
    }
}

/// The counters the model predicts, read from the core's [`Stats`].
fn counters(s: &Stats, d: &DispatcherStats) -> Counters {
    Counters {
        lookups_arrival: s.lookups_arrival,
        lookups_probe: s.lookups_probe,
        prefetch_ineligible: s.prefetch_ineligible,
        prefetch_cap_full: s.prefetch_cap_full,
        prefetch_backlog_full: s.prefetch_backlog_full,
        rpcs_created: s.rpcs_created,
        rpcs_sent: d.rpcs_sent,
        rpcs_shared: s.rpcs_shared,
        rpcs_cancelled: s.rpcs_cancelled,
        replies_stale: s.replies_stale,
        late_replies: d.late_replies,
        hits: s.hits,
        misses: s.misses,
        failed_timed_out: s.failed_timed_out,
        failed_malformed: s.failed_malformed,
        failed_transport: s.failed_transport,
        ttl_refreshes: s.ttl_refreshes,
        chain_refreshes: s.chain_refreshes,
        promotions: s.promotions,
        demotions: s.demotions,
        retries_after_failure: s.retries_after_failure,
        probes_pending: s.probes_pending,
        probes_ready: s.probes_ready,
        resets: s.resets,
        first_probes_ready_max: 0,
        first_probes_pending_max: 0,
    }
}

/// Every counter of [`Stats`], in declaration order, for the never-backwards check.
fn all_counters(s: &Stats, d: &DispatcherStats) -> [(&'static str, u64); 26] {
    [
        ("lookups_arrival", s.lookups_arrival),
        ("lookups_probe", s.lookups_probe),
        ("prefetch_ineligible", s.prefetch_ineligible),
        ("prefetch_cap_full", s.prefetch_cap_full),
        ("prefetch_backlog_full", s.prefetch_backlog_full),
        ("rpcs_created", s.rpcs_created),
        ("rpcs_sent", d.rpcs_sent),
        ("rpcs_shared", s.rpcs_shared),
        ("rpcs_cancelled", s.rpcs_cancelled),
        ("replies_stale", s.replies_stale),
        ("late_replies", d.late_replies),
        ("hits", s.hits),
        ("misses", s.misses),
        ("failed_timed_out", s.failed_timed_out),
        ("failed_malformed", s.failed_malformed),
        ("failed_transport", s.failed_transport),
        ("ttl_refreshes", s.ttl_refreshes),
        ("chain_refreshes", s.chain_refreshes),
        ("promotions", s.promotions),
        ("demotions", s.demotions),
        ("retries_after_failure", s.retries_after_failure),
        ("probes_pending", s.probes_pending),
        ("probes_ready", s.probes_ready),
        ("first_probes_ready", s.first_probes_ready),
        ("first_probes_pending", s.first_probes_pending),
        ("resets", s.resets),
    ]
}

/// The [`StateMachineTest`] binding the harness to the [`Model`].
pub(crate) struct LookupTest;

impl StateMachineTest for LookupTest {
    type SystemUnderTest = Harness;
    type Reference = Model;

    fn init_test(state: &RefState) -> Harness {
        Harness::new(state)
    }

    fn apply(mut harness: Harness, state: &RefState, transition: Transition) -> Harness {
        let before = (
            harness.lookups.stats().clone(),
            harness.dispatcher.stats().clone(),
        );
        if std::env::var_os("MODEL_TRACE").is_some() {
            eprintln!("STEP {transition:?}");
        }
        harness.step(state, transition);
        for ((name, old), (_, new)) in
            all_counters(&before.0, &before.1)
                .into_iter()
                .zip(all_counters(
                    harness.lookups.stats(),
                    harness.dispatcher.stats(),
                ))
        {
            assert!(new >= old, "counter {name} went back from {old} to {new}");
        }
        harness
    }

    fn check_invariants(harness: &Harness, state: &RefState) {
        harness.check(state);
    }

    /// With `LOOKUP_MODEL_COVERAGE` set, prints each case's counters, to see what the
    /// generators reach (for example how many RPCs were shared or promoted).
    fn teardown(harness: Harness, _state: RefState) {
        if std::env::var_os("LOOKUP_MODEL_COVERAGE").is_some() {
            eprintln!("coverage {:?}", harness.lookups.stats());
        }
    }
}
