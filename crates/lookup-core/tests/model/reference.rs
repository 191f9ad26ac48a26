//! The reference model: what `spec/behaviour.md` rules 1-17 say the lookup lifecycle
//! must do, written as plainly as possible. This file holds its state and the RPC
//! bookkeeping (submission, sharing, priority, discard, reset, close, the end of an
//! RPC); the scheduler's arrival and probe inputs are `model/probe.rs`, the wire half
//! (the driver's `Dispatcher`: send queue, deadlines, the wire) `model/dispatcher.rs`,
//! and the transitions are applied in `model/machine.rs`.
//!
//! The model keeps per live request its prompt and what the core records of it (its
//! lookup, waiting on an RPC or done with an answer and the time of its reply, its
//! first probe and its last answer), a list of open RPCs with the question each asks
//! and the requests waiting on it, and the RPCs released to the wire. After every
//! transition it knows the exact answer of a probe, the events, the RPC ids, the
//! prefetch slots in use, the requests tracked, the next deadline and every counter,
//! which the SUT must reproduce.
//!
//! Time is nanoseconds since the start of the test case ([`Clock`]).

use std::collections::{BTreeMap, BTreeSet};

use lookup_core::{
    Answer, Event, LookupOutcome, OnPreemption, Probe, Reply, RequestId, ResetOutcome, RpcBody,
    RpcFailure, RpcId, Unavailable,
};

use crate::counters::Counters;
use crate::dispatcher::WireRpc;
use crate::server::{Prompt, Question};
use crate::settings::{Clock, RETRY_MAX_NS, RETRY_MIN_NS, Settings, duration, seconds_ns};
use crate::transitions::Slot;

/// The id used for `DeadTarget::Never`: far beyond any id a test case creates.
pub(crate) const NEVER_ID: u64 = u64::MAX / 2;

/// A request's lookup.
#[derive(Clone, Debug)]
pub(crate) enum Lookup {
    /// Its RPC is queued or on the wire; an arrival-time lookup holds a slot (rule 3).
    Waiting {
        rpc: u64,
        question: Question,
        holds_slot: bool,
    },
    /// Answered: a hit, a miss, or unavailable (rule 11: never served from the cache).
    Done {
        question: Question,
        answer: Answer,
        replied_at: u128,
        /// This request probed while it waited and has not read the answer yet: the
        /// next probe reads it whatever its age (rules 6 and 10).
        owed: bool,
    },
}

impl Lookup {
    pub(crate) fn question(&self) -> Question {
        match self {
            Self::Waiting { question, .. } | Self::Done { question, .. } => *question,
        }
    }
}

/// What the core records of a request: made at its arrival when prefetch is on, or
/// at its first probe, while the core is open with lookup on; kept through
/// allocation, preemption and reset; dropped when it finishes and at close.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// Rule 1 on the prompt the request had when it was recorded: the first-probe
    /// counters count only such requests.
    pub(crate) eligible: bool,
    /// How its first probe was answered: `Ready` (true) or `Pending`.
    pub(crate) first_probe: Option<bool>,
    /// What its last `Ready` answer rested on (`Lookups::answer_of`).
    pub(crate) last_answer: Option<Answer>,
    pub(crate) lookup: Option<Lookup>,
    /// Rule 11: its last lookup failed and it was not allocated, preempted or reset
    /// since, so its next lookup, whatever its prompt, waits out the failure backoff.
    pub(crate) failed: bool,
    /// Rule 8's preemption policy.
    pub(crate) preemption: Preemption,
}

/// Where a request is in rule 8's preemption policy (`lookup_on_preemption`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Preemption {
    /// Not preempted since its last allocation.
    No,
    /// Allocated under `keep`/`keep_wait` with a usable result, kept for a
    /// preemption; its next probe or arrival without one consumes it.
    Retained,
    /// Preempted, not allocated since, under a value other than `discard`.
    Preempted,
}

/// A request the scheduler has and has not finished.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) prompt: Prompt,
    pub(crate) record: Option<Record>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Asks {
    Lookup(Question),
    Reset,
}

/// An RPC the core still tracks: queued in the dispatcher, or on the wire.
#[derive(Clone, Debug)]
pub(crate) struct Rpc {
    pub(crate) asks: Asks,
    pub(crate) submitted_at: u128,
    /// Released by the dispatcher at this time, failing at `deadline` (rule 17).
    pub(crate) sent: Option<(u128, u128)>,
    /// Live requests whose lookup waits on this RPC.
    pub(crate) subscribers: Vec<Slot>,
    /// Slots of arrival-time lookups discarded while this RPC was on the wire: held
    /// until it ends (rule 3; acceptance scenario 7).
    orphan_slots: u32,
    /// Rule 15: while a probe waits for it, its place in the "awaited" class.
    pub(crate) awaited: Option<u64>,
    /// Rule 15: the subscribers that probed it (or created it by a probe). When the
    /// last of them is discarded while it is queued, it leaves the awaited class.
    awaiting: Vec<Slot>,
    /// Rule 16: a later lookup of the same question may join it. Not after a reset
    /// (rule 13: replies to RPCs from before it are ignored) and not with sharing off.
    shareable: bool,
}

/// How an RPC ended.
#[derive(Clone, Debug)]
pub(crate) enum End {
    Reply(Reply),
    Failure(RpcFailure),
}

/// What the last transition must have produced.
#[derive(Clone, Debug, Default)]
pub(crate) struct Expected {
    /// A probe's answer.
    pub(crate) probe: Option<Probe>,
    /// `reset`'s return value, after a reset.
    pub(crate) reset: Option<Option<RpcId>>,
    /// Events, in order.
    pub(crate) events: Vec<Event>,
}

/// The reference state. Its `Debug` shows the configuration only, which is what a
/// failing case's initial state needs to show.
#[derive(Clone)]
pub(crate) struct RefState {
    pub(crate) settings: Settings,
    pub(crate) clock: Clock,
    pub(crate) ttl_ns: u128,
    pub(crate) timeout_ns: u128,
    pub(crate) now_ns: u128,
    pub(crate) closed: bool,
    next_rpc: u64,
    pub(crate) next_awaited: u64,
    /// Rule 11: failed requests are looked up again no sooner than this, one at a
    /// time (`retrying`); the wait doubles per failure from 10 ms up to 1 s.
    pub(crate) retry_at_ns: Option<u128>,
    retry_delay_ns: u128,
    pub(crate) retrying: Option<u64>,
    pub(crate) requests: Vec<Option<Live>>,
    pub(crate) rpcs: BTreeMap<u64, Rpc>,
    /// Ids no longer open (ended or cancelled), oldest first.
    pub(crate) ended: Vec<u64>,
    /// RPCs the dispatcher released and was not told are done.
    pub(crate) dispatcher_in_flight: BTreeSet<u64>,
    /// Released RPCs the driver has written: the server's view.
    pub(crate) wire: Vec<WireRpc>,
    /// Released RPCs the driver has not written yet (deferred writes).
    pub(crate) unwritten: Vec<WireRpc>,
    pub(crate) counters: Counters,
    pub(crate) expected: Expected,
}

impl std::fmt::Debug for RefState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.settings)
    }
}

pub(crate) fn ready(external_tokens: u32, load_async: bool) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: load_async && external_tokens > 0,
    }
}

impl RefState {
    /// A fresh model with `settings`, its clock starting now.
    pub(crate) fn new(settings: Settings) -> Self {
        Self {
            ttl_ns: seconds_ns(settings.ttl_s),
            timeout_ns: seconds_ns(settings.timeout_s),
            clock: Clock {
                base: std::time::Instant::now(),
            },
            requests: vec![None; settings.pool],
            settings,
            now_ns: 0,
            closed: false,
            next_rpc: 1,
            next_awaited: 0,
            retry_at_ns: None,
            retry_delay_ns: RETRY_MIN_NS,
            retrying: None,
            rpcs: BTreeMap::new(),
            ended: Vec::new(),
            dispatcher_in_flight: BTreeSet::new(),
            wire: Vec::new(),
            unwritten: Vec::new(),
            counters: Counters::default(),
            expected: Expected::default(),
        }
    }

    fn lookups(&self) -> impl Iterator<Item = &Lookup> {
        self.requests
            .iter()
            .flatten()
            .filter_map(|r| r.record.as_ref()?.lookup.as_ref())
    }

    /// Rule 3: arrival-time lookups not ended: those live requests wait on, plus those
    /// of discarded requests whose RPC is still on the wire.
    pub(crate) fn slots_in_use(&self) -> u32 {
        let live = self
            .lookups()
            .filter(|l| {
                matches!(
                    l,
                    Lookup::Waiting {
                        holds_slot: true,
                        ..
                    }
                )
            })
            .count();
        let orphans: u32 = self.rpcs.values().map(|r| r.orphan_slots).sum();
        u32::try_from(live).expect("small") + orphans
    }

    /// Live requests whose lookup waits on an RPC.
    pub(crate) fn waiting_requests(&self) -> usize {
        self.lookups()
            .filter(|l| matches!(l, Lookup::Waiting { .. }))
            .count()
    }

    /// Requests the core keeps a record of.
    pub(crate) fn tracked_requests(&self) -> usize {
        self.requests
            .iter()
            .flatten()
            .filter(|r| r.record.is_some())
            .count()
    }

    /// The record of the request in `slot`, if the core keeps one.
    pub(crate) fn record(&self, slot: Slot) -> Option<&Record> {
        self.requests[slot].as_ref()?.record.as_ref()
    }

    pub(crate) fn record_mut(&mut self, slot: Slot) -> Option<&mut Record> {
        self.requests[slot].as_mut()?.record.as_mut()
    }

    /// `Lookups::answer_of`: every answer is unavailable after close and with lookup
    /// off; else the request's last `Ready` answer.
    pub(crate) fn answer_of(&self, slot: Slot) -> Option<Answer> {
        if self.closed {
            return Some(Answer::Unavailable(Unavailable::Closed));
        }
        if !self.settings.enable_lookup {
            return Some(Answer::Unavailable(Unavailable::Disabled));
        }
        self.record(slot)?.last_answer
    }

    pub(crate) fn new_rpc_id(&mut self) -> u64 {
        let id = self.next_rpc;
        self.next_rpc += 1;
        self.counters.rpcs_created += 1;
        id
    }

    /// Starts a lookup of `question` for `slot`, joining an open RPC that asks the
    /// same (rule 16). Returns the RPC.
    pub(crate) fn submit(&mut self, slot: Slot, question: Question, arrival: bool) -> u64 {
        if arrival {
            self.counters.lookups_arrival += 1;
        } else {
            self.counters.lookups_probe += 1;
        }
        let asks = Asks::Lookup(question);
        let existing = self
            .rpcs
            .iter()
            .find(|(_, r)| r.shareable && r.asks == asks)
            .map(|(id, _)| *id);
        let rpc = if let Some(id) = existing {
            self.rpcs.get_mut(&id).expect("open").subscribers.push(slot);
            self.counters.rpcs_shared += 1;
            if !arrival {
                self.promote(id, slot);
            }
            id
        } else {
            let id = self.new_rpc_id();
            let awaited = (!arrival).then(|| self.take_awaited_seq());
            self.rpcs.insert(
                id,
                Rpc {
                    asks,
                    submitted_at: self.now_ns,
                    sent: None,
                    subscribers: vec![slot],
                    orphan_slots: 0,
                    awaited,
                    awaiting: if arrival { Vec::new() } else { vec![slot] },
                    shareable: self.settings.share,
                },
            );
            id
        };
        let record = self
            .record_mut(slot)
            .expect("a lookup's request is recorded");
        record.lookup = Some(Lookup::Waiting {
            rpc,
            question,
            holds_slot: arrival,
        });
        rpc
    }

    fn take_awaited_seq(&mut self) -> u64 {
        self.next_awaited += 1;
        self.next_awaited
    }

    /// Rule 15: `slot`'s probe waits for `rpc`; a queued RPC no probe waited for moves
    /// to the awaited class.
    pub(crate) fn promote(&mut self, rpc: u64, slot: Slot) {
        if let Some(r) = self.rpcs.get_mut(&rpc) {
            if !r.awaiting.contains(&slot) {
                r.awaiting.push(slot);
            }
        }
        if !self.settings.priority {
            return;
        }
        let queued_prefetch = self
            .rpcs
            .get(&rpc)
            .is_some_and(|r| r.sent.is_none() && r.awaited.is_none());
        if queued_prefetch {
            let seq = self.take_awaited_seq();
            self.rpcs.get_mut(&rpc).expect("open").awaited = Some(seq);
            self.counters.promotions += 1;
        }
    }

    /// Rules 8-9: the request's lookup is dropped. A queued RPC nobody waits for is
    /// cancelled; an arrival lookup's slot is freed now if its RPC was not sent, else
    /// when the RPC ends (rule 3).
    pub(crate) fn discard(&mut self, slot: Slot) {
        self.detach(slot, true);
    }

    fn detach(&mut self, slot: Slot, demote: bool) {
        let Some(record) = self.record_mut(slot) else {
            return;
        };
        let Some(Lookup::Waiting {
            rpc, holds_slot, ..
        }) = record.lookup.take()
        else {
            return;
        };
        let r = self
            .rpcs
            .get_mut(&rpc)
            .expect("a waiting lookup's RPC is open");
        r.subscribers.retain(|s| *s != slot);
        r.awaiting.retain(|s| *s != slot);
        if r.sent.is_none() {
            if r.subscribers.is_empty() {
                self.rpcs.remove(&rpc);
                if self.retrying == Some(rpc) {
                    self.retrying = None;
                }
                self.ended.push(rpc);
                self.counters.rpcs_cancelled += 1;
            } else if demote
                && r.awaiting.is_empty()
                && r.awaited.is_some()
                && self.settings.priority
            {
                // Only requests that arrived wait for it now: back among the
                // prefetches, in submission order.
                r.awaited = None;
                self.counters.demotions += 1;
            }
        } else if holds_slot {
            r.orphan_slots += 1;
        }
    }

    /// `on_allocated` (rule 8): a discard point, and the request is no longer one
    /// preempted; under `keep` and `keep_wait` a done result that is not a failure
    /// is retained for a preemption instead of consumed (its failure mark goes all
    /// the same).
    pub(crate) fn allocated(&mut self, slot: Slot) {
        let keeps = matches!(
            self.settings.on_preemption,
            OnPreemption::Keep | OnPreemption::KeepWait
        );
        let usable = self.record(slot).is_some_and(|r| {
            matches!(&r.lookup, Some(Lookup::Done { answer, .. })
                if !matches!(answer, Answer::Unavailable(_)))
        });
        let retain = keeps && usable;
        if retain {
            self.forget_failure(slot);
        } else {
            self.discard_point(slot);
        }
        if let Some(record) = self.record_mut(slot) {
            record.preemption = if retain {
                Preemption::Retained
            } else {
                Preemption::No
            };
        }
    }

    /// A probe or arrival of a request whose result was retained at allocation, with
    /// no preemption since: the result is consumed now (rule 8).
    pub(crate) fn consume_retained(&mut self, slot: Slot) {
        if self
            .record(slot)
            .is_some_and(|r| r.preemption == Preemption::Retained)
        {
            self.discard(slot);
            if let Some(record) = self.record_mut(slot) {
                record.preemption = Preemption::No;
            }
        }
    }

    /// `on_preempted` (rule 8, `lookup_on_preemption`): `discard` and `wait` drop the
    /// lookup as at a discard point; `keep` and `keep_wait` keep it (and its
    /// failure's backoff); every value but `discard` marks the request preempted.
    pub(crate) fn preempted(&mut self, slot: Slot) {
        let policy = self.settings.on_preemption;
        let keeps = matches!(policy, OnPreemption::Keep | OnPreemption::KeepWait);
        if !keeps {
            self.discard_point(slot);
        }
        if policy == OnPreemption::Discard {
            return;
        }
        if let Some(record) = self.record_mut(slot) {
            record.preemption = Preemption::Preempted;
            let kept = keeps && record.lookup.is_some();
            if kept {
                self.counters.lookups_kept_on_preemption += 1;
            }
        }
    }

    /// `Lookups::wait_budget` (rule 8): the preempted wait for a request preempted
    /// and not allocated since, in async mode with lookup on and the core open.
    pub(crate) fn wait_budget_ns(&self, slot: Slot) -> u128 {
        let s = &self.settings;
        let waits = matches!(s.on_preemption, OnPreemption::Wait | OnPreemption::KeepWait);
        if !waits || !s.lookup_async || !s.enable_lookup || self.closed {
            return 0;
        }
        match self.record(slot) {
            Some(r) if r.preemption == Preemption::Preempted => seconds_ns(s.preempted_wait_s),
            _ => 0,
        }
    }

    /// `on_allocated` and `on_preempted` with `discard` (rule 8): the lookup goes, and
    /// with it a failed request's retry (its next lookup is a first one).
    pub(crate) fn discard_point(&mut self, slot: Slot) {
        self.discard(slot);
        self.forget_failure(slot);
    }

    fn forget_failure(&mut self, slot: Slot) {
        if let Some(record) = self.record_mut(slot) {
            record.failed = false;
        }
    }

    /// `on_finished`: the request and its record are gone.
    pub(crate) fn finish(&mut self, slot: Slot) {
        self.discard(slot);
        self.requests[slot] = None;
    }

    /// Rule 13; with `enable_lookup = false` (no RPC ever) only the lookups go.
    pub(crate) fn reset(&mut self) {
        if self.closed {
            self.expected.reset = Some(None);
            return;
        }
        for slot in 0..self.settings.pool {
            // Every lookup goes at once: nothing is demoted on the way.
            self.detach(slot, false);
            self.forget_failure(slot);
        }
        for r in self.rpcs.values_mut() {
            r.shareable = false;
        }
        if !self.settings.enable_lookup {
            self.expected.reset = Some(None);
            return;
        }
        let id = self.new_rpc_id();
        self.counters.resets += 1;
        self.rpcs.insert(
            id,
            Rpc {
                asks: Asks::Reset,
                submitted_at: self.now_ns,
                sent: None,
                subscribers: Vec::new(),
                orphan_slots: 0,
                awaited: None,
                awaiting: Vec::new(),
                shareable: false,
            },
        );
        self.expected.reset = Some(Some(RpcId(id)));
    }

    /// Rule 14: everything is cancelled and forgotten; the driver's I/O task (its
    /// dispatcher and the writes it had not done) ends with the client.
    pub(crate) fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.retrying = None;
        self.retry_at_ns = None;
        for (id, r) in std::mem::take(&mut self.rpcs) {
            if r.sent.is_none() {
                self.counters.rpcs_cancelled += 1;
            }
            self.ended.push(id);
        }
        for live in self.requests.iter_mut().flatten() {
            live.record = None;
        }
        self.dispatcher_in_flight.clear();
        self.unwritten.clear();
    }

    /// The lifecycle takes the end of an open RPC (`handle_wire_event`): rule 11
    /// validates a lookup reply, every request waiting on it gets the answer, its
    /// slots are freed; a reset's end is reported (rule 13).
    pub(crate) fn end_rpc(&mut self, rpc: u64, end: End) {
        let r = self.rpcs.remove(&rpc).expect("only open RPCs end");
        self.ended.push(rpc);
        let rpc_id = RpcId(rpc);
        let question = match r.asks {
            Asks::Reset => {
                let outcome = match end {
                    End::Reply(Reply::Reset { ok: true }) => ResetOutcome::Ok,
                    End::Reply(_) => ResetOutcome::Failed,
                    End::Failure(_) => ResetOutcome::TimedOut,
                };
                self.expected
                    .events
                    .push(Event::ResetDone { rpc_id, outcome });
                return;
            }
            Asks::Lookup(q) => q,
        };
        let b = self.settings.shape.block_size;
        let (outcome, answer) = match end {
            End::Reply(Reply::Lookup { hit_tokens })
                if hit_tokens <= question.num_tokens && hit_tokens % b == 0 =>
            {
                if hit_tokens == 0 {
                    (LookupOutcome::Miss, Answer::Miss)
                } else {
                    (
                        LookupOutcome::Hit { hit_tokens },
                        Answer::Hit { hit_tokens },
                    )
                }
            }
            // `spec/wire.md`, "Store unavailable": a failure like any other (rule 11).
            End::Reply(Reply::StoreUnavailable) => (
                LookupOutcome::Failed(RpcFailure::StoreUnavailable),
                Answer::Unavailable(Unavailable::Store),
            ),
            End::Reply(_) => (
                LookupOutcome::Malformed,
                Answer::Unavailable(Unavailable::Malformed),
            ),
            End::Failure(f) => (
                LookupOutcome::Failed(f),
                Answer::Unavailable(match f {
                    RpcFailure::TimedOut => Unavailable::TimedOut,
                    RpcFailure::Transport => Unavailable::Transport,
                    RpcFailure::NotSent => Unavailable::NotSent,
                    RpcFailure::StoreUnavailable => Unavailable::Store,
                }),
            ),
        };
        if self.retrying == Some(rpc) {
            self.retrying = None;
        }
        if answer.is_unavailable() {
            self.retry_at_ns = Some(self.now_ns + self.retry_delay_ns);
            self.retry_delay_ns = (self.retry_delay_ns * 2).min(RETRY_MAX_NS);
        } else {
            self.retry_at_ns = None;
            self.retry_delay_ns = RETRY_MIN_NS;
        }
        let c = &mut self.counters;
        match outcome {
            LookupOutcome::Hit { .. } => c.hits += 1,
            LookupOutcome::Miss => c.misses += 1,
            LookupOutcome::Malformed => c.failed_malformed += 1,
            LookupOutcome::Failed(RpcFailure::TimedOut) => c.failed_timed_out += 1,
            LookupOutcome::Failed(RpcFailure::StoreUnavailable) => c.failed_store_unavailable += 1,
            LookupOutcome::Failed(_) => c.failed_transport += 1,
        }
        let mut request_ids = Vec::new();
        for slot in &r.subscribers {
            let record = self.requests[*slot]
                .as_mut()
                .and_then(|l| l.record.as_mut())
                .expect("subscribers are live and recorded");
            match record.lookup {
                Some(Lookup::Waiting {
                    rpc: on,
                    question: q,
                    ..
                }) if on == rpc && q == question => {}
                ref other => {
                    panic!("model bug: subscriber {slot} of rpc {rpc} has lookup {other:?}")
                }
            }
            record.failed = answer.is_unavailable();
            record.lookup = Some(Lookup::Done {
                question,
                answer,
                replied_at: self.now_ns,
                owed: r.awaiting.contains(slot),
            });
            request_ids.push(RequestId(u64::try_from(*slot).expect("small")));
        }
        request_ids.sort_unstable();
        if request_ids.is_empty() {
            self.counters.replies_stale += 1;
        }
        let (sent_at, _) = r.sent.expect("every lookup ends on the wire");
        self.expected.events.push(Event::LookupDone {
            rpc_id,
            outcome,
            requests: u32::try_from(request_ids.len()).expect("small"),
            request_ids,
            total: duration(self.now_ns - r.submitted_at),
            queue_wait: duration(sent_at - r.submitted_at),
            on_wire: duration(self.now_ns - sent_at),
        });
    }
}

impl Asks {
    pub(crate) fn body(&self, shape: crate::server::Shape) -> RpcBody {
        match self {
            Self::Lookup(q) => q.body(shape),
            Self::Reset => RpcBody::Reset,
        }
    }
}
