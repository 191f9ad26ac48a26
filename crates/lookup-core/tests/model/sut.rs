//! The system under test: the real [`Lookups`] and [`Dispatcher`] driven the way
//! `lib.rs` documents (drain transmits into the dispatcher, drain events, write what
//! the dispatcher releases, fire what is due), with a virtual clock and a fake server
//! whose wire holds every RPC the driver wrote until the test answers, fails or loses
//! it. With deferred writes the driver holds released RPCs until a transition writes
//! or fails them.

use std::collections::HashSet;
use std::time::Instant;

use lookup_core::{
    Command, Dispatcher, Event, Lookups, Outgoing, Probe, Reply, RequestId, RpcBody, RpcFailure,
    RpcId,
};
use proptest_state_machine::StateMachineTest;

use crate::counters::Counters;
use crate::machine::Model;
use crate::reference::{NEVER_ID, RefState};
use crate::server::{self, Prompt, Shape};
use crate::settings::Clock;
use crate::transitions::{DeadTarget, LocalHit, Slot, Transition};
use crate::watch::Watch;

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

/// The harness: core, dispatcher, clock, the driver's unwritten RPCs and the wire.
pub(crate) struct Harness {
    lookups: Lookups,
    dispatcher: Dispatcher,
    clock: Clock,
    shape: Shape,
    deferred_writes: bool,
    now_ns: u128,
    wire: Vec<Outgoing>,
    unwritten: Vec<Outgoing>,
    prompts: Vec<Option<Prompt>>,
    /// Ids the core cancelled (rule 9): never to be released.
    cancelled: HashSet<RpcId>,
    /// Every id released to the wire: an id goes out at most once.
    released: HashSet<RpcId>,
    events: Vec<Event>,
    /// The reset barrier and the deadlines, checked from what was seen.
    watch: Watch,
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
            clock: state.clock,
            shape: state.settings.shape,
            deferred_writes: state.settings.deferred_writes,
            now_ns: 0,
            wire: Vec::new(),
            unwritten: Vec::new(),
            prompts: vec![None; state.settings.pool],
            cancelled: HashSet::new(),
            released: HashSet::new(),
            events: Vec::new(),
            watch: Watch::new(config.timeout()),
        }
    }

    fn now(&self) -> Instant {
        self.clock
            .instant(self.now_ns)
            .expect("the test's clock stays representable")
    }

    fn ns(&self, at: Instant) -> u128 {
        at.duration_since(self.clock.base).as_nanos()
    }

    /// The driving loop of the crate docs, after one input. Checks that a `Send` is
    /// only ever for the request (and its current prompt) or the reset that caused it.
    fn settle(&mut self, asker: Asker) {
        // A driver checks its timer on every loop turn; a deadline at or before `now`
        // fires at once (CONTRIBUTING.md rule 3: early or repeated calls are harmless).
        self.dispatcher.handle_timeout(self.now());
        let mut sends = 0;
        loop {
            let mut progressed = false;
            while let Some(command) = self.lookups.poll_transmit() {
                progressed = true;
                match &command {
                    Command::Send { rpc_id, body, .. } => {
                        sends += 1;
                        self.watch.created(*rpc_id, body);
                        assert_eq!(sends, 1, "one input created more than one RPC");
                        assert!(!self.lookups.is_closed(), "rule 14: a Send after close");
                        match (asker, body) {
                            (Asker::Request(slot), RpcBody::Lookup { .. }) => {
                                let prompt = self.prompts[slot].unwrap_or_else(|| {
                                    panic!("{rpc_id}: a Send for finished request {slot}")
                                });
                                assert_eq!(
                                    *body,
                                    prompt.question(self.shape).body(self.shape),
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
                let now = self.now();
                self.dispatcher.push(command, (), now);
            }
            while let Some((event, ())) = self.dispatcher.poll_event() {
                progressed = true;
                self.watch.ended(&event);
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
                self.watch.released(out.rpc_id, &out.body, self.now());
                if self.deferred_writes {
                    self.unwritten.push(out);
                } else {
                    self.wire.push(out);
                }
            }
            if self
                .dispatcher
                .poll_timeout()
                .is_some_and(|t| t <= self.now())
            {
                progressed = true;
                self.dispatcher.handle_timeout(self.now());
            }
            if !progressed {
                break;
            }
        }
    }

    /// A reply reaches the dispatcher; `body` is what the server was asked (`None`
    /// for a reply to an id it was never sent).
    fn deliver_reply(&mut self, rpc_id: RpcId, body: Option<&RpcBody>, reply: Reply) {
        let applied = self
            .dispatcher
            .handle_reply(rpc_id, reply.clone(), self.now());
        if let Some(body) = body {
            self.watch.answered(rpc_id, body, &reply, applied);
        }
    }

    fn send_failed(&mut self, rpc_id: RpcId, failure: RpcFailure) {
        self.dispatcher
            .handle_send_failed(rpc_id, failure, self.now());
    }

    fn dead_id(state: &RefState, target: DeadTarget) -> RpcId {
        match target {
            DeadTarget::Ended(i) => RpcId(state.ended[i]),
            DeadTarget::Never => RpcId(NEVER_ID),
        }
    }

    fn probe(&mut self, state: &RefState, slot: Slot, prompt: Prompt, local: LocalHit) {
        self.prompts[slot] = Some(prompt);
        let cap = self.shape.hit_cap(prompt.num_tokens);
        let num_computed_tokens = local.tokens(self.shape, prompt.num_tokens);
        let request = prompt.request(self.shape, request_id(slot));
        let answer = self
            .lookups
            .probe(&request, num_computed_tokens, self.now());
        if let Probe::Ready {
            external_tokens, ..
        } = answer
        {
            assert!(
                external_tokens == 0
                    || u64::from(external_tokens) + u64::from(num_computed_tokens)
                        <= u64::from(cap),
                "rule 12: {external_tokens} external + {num_computed_tokens} local > cap {cap}"
            );
        }
        assert_eq!(
            Some(answer),
            state.expected.probe,
            "probe of request {slot} ({prompt:?}, local {num_computed_tokens})"
        );
    }

    fn step(&mut self, state: &RefState, transition: Transition) {
        self.events.clear();
        let now = self.now();
        let shape = self.shape;
        let asker = match transition {
            Transition::Arrive { slot, prompt } => {
                self.prompts[slot] = Some(prompt);
                self.lookups
                    .on_new_request(&prompt.request(shape, request_id(slot)), now);
                Asker::Request(slot)
            }
            Transition::Rearrive { slot, change } => {
                let prompt = change.apply(self.prompts[slot].expect("live"), shape);
                self.prompts[slot] = Some(prompt);
                self.lookups
                    .on_new_request(&prompt.request(shape, request_id(slot)), now);
                Asker::Request(slot)
            }
            Transition::Probe {
                slot,
                change,
                local,
            } => {
                let prompt = change.apply(self.prompts[slot].expect("live"), shape);
                self.probe(state, slot, prompt, local);
                Asker::Request(slot)
            }
            Transition::ProbeUnarrived {
                slot,
                prompt,
                local,
            } => {
                self.probe(state, slot, prompt, local);
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
                // The I/O task ends with the client (rule 14), and its unwritten RPCs.
                self.dispatcher.close();
                self.watch.closed();
                self.unwritten.clear();
                Asker::Nobody
            }
            Transition::Advance { ms } => {
                self.now_ns += u128::from(ms) * 1_000_000;
                self.dispatcher.handle_timeout(self.now());
                Asker::Nobody
            }
            Transition::FireTimeout => {
                if let Some(deadline) = self.dispatcher.poll_timeout() {
                    self.now_ns = self.now_ns.max(self.ns(deadline));
                }
                self.dispatcher.handle_timeout(self.now());
                Asker::Nobody
            }
            Transition::Write { index } => {
                let out = self.unwritten.remove(index);
                self.wire.push(out);
                Asker::Nobody
            }
            Transition::WriteFailed { index, failure } => {
                let out = self.unwritten.remove(index);
                self.send_failed(out.rpc_id, failure.rpc_failure());
                Asker::Nobody
            }
            Transition::EarlyReply { index, value } => {
                let out = self.unwritten[index].clone();
                let reply = server::reply(shape, value, Some(&out.body));
                self.deliver_reply(out.rpc_id, Some(&out.body), reply);
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
                let reply = server::reply(shape, value, Some(&out.body));
                self.deliver_reply(out.rpc_id, Some(&out.body), reply);
                Asker::Nobody
            }
            Transition::TransportError { wire_index } => {
                let out = self.wire.remove(wire_index);
                self.send_failed(out.rpc_id, RpcFailure::Transport);
                Asker::Nobody
            }
            Transition::Lose { wire_index } => {
                let _lost = self.wire.remove(wire_index);
                Asker::Nobody
            }
            Transition::DeadReply { target, value } => {
                let rpc_id = Self::dead_id(state, target);
                match value {
                    Some(v) => self.deliver_reply(rpc_id, None, server::reply(shape, v, None)),
                    None => self.send_failed(rpc_id, RpcFailure::Transport),
                }
                Asker::Nobody
            }
            Transition::Reopen => {
                self.replace_connection(None);
                Asker::Nobody
            }
            Transition::DropConnection => {
                self.wire.clear();
                Asker::Nobody
            }
            Transition::ReplaceConnection { keep_reset } => {
                self.watch.server_replaced();
                let keep = if keep_reset {
                    self.watch.oldest_open_reset()
                } else {
                    None
                };
                self.replace_connection(keep);
                Asker::Nobody
            }
        };
        self.settle(asker);
        assert_eq!(self.events, state.expected.events, "events");
        self.watch.events(&self.events);
        self.watch.check_deadlines(self.now());
    }

    /// The driver drops its connection and opens a new one: what it wrote and had not
    /// written goes with the old one, except `keep` (a reset it writes again).
    fn replace_connection(&mut self, keep: Option<RpcId>) {
        self.wire.retain(|o| Some(o.rpc_id) == keep);
        self.unwritten.retain(|o| Some(o.rpc_id) == keep);
        let _failed = self.dispatcher.fail_on_wire(keep, self.now());
    }

    fn check(&self, state: &RefState) {
        let l = &self.lookups;
        assert_eq!(l.is_closed(), state.closed, "closed");
        assert_eq!(
            l.slots_in_use(),
            state.slots_in_use(),
            "rule 3: slots in use"
        );
        assert_eq!(l.open_rpcs(), state.rpcs.len(), "open RPCs");
        assert_eq!(
            l.waiting_requests(),
            state.waiting_requests(),
            "requests waiting on an RPC"
        );
        assert_eq!(
            l.tracked_requests(),
            state.tracked_requests(),
            "requests tracked"
        );
        // The model's own sanity: nothing left once no request and no RPC on the wire is.
        let sent = state.rpcs.values().filter(|r| r.sent.is_some()).count();
        if (state.requests.iter().flatten().count() == 0 && sent == 0) || state.closed {
            assert_eq!(
                l.slots_in_use(),
                0,
                "slots with no request, nothing on the wire"
            );
            assert_eq!(
                l.open_rpcs(),
                0,
                "RPCs with no request, nothing on the wire"
            );
        }
        let deadline = self.dispatcher.poll_timeout().map(|t| self.ns(t));
        assert_eq!(
            deadline,
            state.next_deadline(),
            "poll_timeout (ns from start)"
        );
        let ids = |v: &[Outgoing]| -> Vec<(RpcId, RpcBody)> {
            v.iter().map(|o| (o.rpc_id, o.body.clone())).collect()
        };
        let model = |v: &[crate::dispatcher::WireRpc]| -> Vec<(RpcId, RpcBody)> {
            v.iter().map(|w| (w.rpc_id, w.body.clone())).collect()
        };
        assert_eq!(ids(&self.wire), model(&state.wire), "RPCs on the wire");
        assert_eq!(
            ids(&self.unwritten),
            model(&state.unwritten),
            "RPCs released and not written"
        );
        assert_eq!(
            Counters::of(l.stats(), self.dispatcher.stats()),
            state.counters,
            "counters"
        );
        for slot in 0..state.settings.pool {
            let id = request_id(slot);
            let first = state.record(slot).and_then(|r| r.first_probe);
            assert_eq!(
                l.ready_at_first_probe(id),
                first,
                "request {slot}: ready at its first probe"
            );
            assert_eq!(
                l.answer_of(id),
                state.answer_of(slot),
                "request {slot}: what its last answer rests on"
            );
            assert_eq!(
                l.wait_budget(id).as_nanos(),
                state.wait_budget_ns(slot),
                "request {slot}: rule 8's wait budget"
            );
        }
    }
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
        let before = Counters::of(harness.lookups.stats(), harness.dispatcher.stats());
        if std::env::var_os("MODEL_TRACE").is_some() {
            eprintln!("STEP {transition:?}");
        }
        harness.step(state, transition);
        let after = Counters::of(harness.lookups.stats(), harness.dispatcher.stats());
        for ((name, old), (_, new)) in before.named().into_iter().zip(after.named()) {
            assert!(new >= old, "counter {name} went back from {old} to {new}");
        }
        harness
    }

    fn check_invariants(harness: &Harness, state: &RefState) {
        harness.check(state);
    }

    /// With `LOOKUP_MODEL_COVERAGE` set, prints each case's settings and counters, to
    /// see what the generators reach (for example how many RPCs were shared or
    /// promoted).
    fn teardown(harness: Harness, state: RefState) {
        if std::env::var_os("LOOKUP_MODEL_COVERAGE").is_some() {
            eprintln!(
                "coverage {:?} {:?} {:?}",
                state.settings,
                harness.lookups.stats(),
                harness.dispatcher.stats()
            );
        }
    }
}
