//! The reference model: what `spec/behaviour.md` rules 1-17 say the lookup must do,
//! written as plainly as possible, with the driver's send queue (`Dispatcher`) and
//! the wire beside it.
//!
//! The model keeps per live request its prompt and its lookup (waiting on an RPC, or
//! done with a hit and the time of its reply), a list of open RPCs with the question
//! each asks and the requests waiting on it, and the RPCs on the wire. After every
//! transition it knows the exact answer of a probe, the events, the RPC ids, the
//! prefetch slots in use and the next deadline, which the SUT must reproduce.
//!
//! Time is nanoseconds since the start of the test case.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lookup_core::{
    Config, Event, LookupOutcome, Probe, Reply, RequestId, ResetOutcome, RpcBody, RpcFailure, RpcId,
};
use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

use crate::server::{self, BLOCK_SIZE, Prompt, Question, hit_cap};

/// `lookup_core::RETRY_BACKOFF_MIN` and `_MAX`, in nanoseconds (rule 11).
const RETRY_MIN_NS: u64 = 10_000_000;
const RETRY_MAX_NS: u64 = 1_000_000_000;
use crate::strategies;
use crate::transitions::{DeadTarget, PromptChange, Slot, Transition};

/// Requests in the pool.
pub(crate) const POOL: usize = 6;
/// The id used for [`DeadTarget::Never`]: far beyond any id a test case creates.
pub(crate) const NEVER_ID: u64 = u64::MAX / 2;

/// The configuration of one test case: the [`Config`] keys that vary (block size is
/// always [`BLOCK_SIZE`]).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// `enable_lookup`.
    pub(crate) enable_lookup: bool,
    /// `lookup_async`.
    pub(crate) lookup_async: bool,
    /// `load_async`.
    pub(crate) load_async: bool,
    /// `lookup_prefetch_limit` (arrival-time lookups in flight).
    pub(crate) prefetch_limit: u32,
    /// `lookup_prefetch_ttl_s` (seconds).
    pub(crate) ttl_s: f64,
    /// `lookup_timeout_s` (seconds).
    pub(crate) timeout_s: f64,
    /// `lookup_share`.
    pub(crate) share: bool,
    /// `lookup_priority`.
    pub(crate) priority: bool,
    /// `max_in_flight` (RPCs on the wire).
    pub(crate) max_in_flight: u32,
    /// `max_queued` (RPCs waiting for the wire).
    pub(crate) max_queued: u32,
}

impl Settings {
    /// The core's configuration.
    pub(crate) fn config(&self) -> Config {
        let mut config = Config::new(BLOCK_SIZE);
        config.enable_lookup = self.enable_lookup;
        config.lookup_async = self.lookup_async;
        config.load_async = self.load_async;
        config.lookup_prefetch_limit = self.prefetch_limit;
        config.lookup_prefetch_ttl_s = self.ttl_s;
        config.lookup_timeout_s = self.timeout_s;
        config.lookup_share = self.share;
        config.lookup_priority = self.priority;
        config.max_in_flight = self.max_in_flight;
        config.max_queued = self.max_queued;
        config
    }

    /// Configuration table: prefetch needs lookup on, async mode and a positive limit.
    fn prefetch(&self) -> bool {
        self.enable_lookup && self.lookup_async && self.prefetch_limit > 0
    }
}

/// A request's lookup.
#[derive(Clone, Debug)]
enum Lookup {
    /// Its RPC is queued or on the wire; an arrival-time lookup holds a slot (rule 3).
    Waiting {
        rpc: u64,
        question: Question,
        holds_slot: bool,
    },
    /// Answered: a hit or a miss, or a failure (rule 11: never served from the cache).
    Done {
        question: Question,
        hit_tokens: u32,
        failed: bool,
        replied_at: u64,
        /// This request probed while it waited and has not read the answer yet: the
        /// next probe reads it whatever its age (rules 6 and 10).
        owed: bool,
    },
}

impl Lookup {
    fn question(&self) -> Question {
        match self {
            Self::Waiting { question, .. } | Self::Done { question, .. } => *question,
        }
    }
}

/// A request the scheduler has added and not finished.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) prompt: Prompt,
    lookup: Option<Lookup>,
    /// Its first probe with lookup on and the core open.
    pub(crate) first_probe: Option<FirstProbe>,
}

/// How a request's first probe was answered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FirstProbe {
    /// `Ready` (else `Pending`).
    pub(crate) ready: bool,
    /// Answered `Ready(0)` without looking at any lookup (no hashes, skip, local hit
    /// at the cap): a core that keeps no state for such a request may leave it
    /// unrecorded, but must then not take a later probe for the first one.
    pub(crate) without_lookup: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Asks {
    Lookup(Question),
    Reset,
}

impl Asks {
    fn body(&self) -> RpcBody {
        match self {
            Self::Lookup(q) => q.body(),
            Self::Reset => RpcBody::Reset,
        }
    }
}

/// An RPC the core still tracks: queued in the dispatcher, or on the wire.
#[derive(Clone, Debug)]
struct Rpc {
    asks: Asks,
    submitted_at: u64,
    sent_at: Option<u64>,
    /// Live requests whose lookup waits on this RPC.
    subscribers: Vec<Slot>,
    /// Slots of arrival-time lookups discarded while this RPC was on the wire: held
    /// until it ends (rule 3; acceptance scenario 7).
    orphan_slots: u32,
    /// Rule 15: while a probe waits for it, its place in the "awaited" class.
    awaited: Option<u64>,
    /// Rule 15: the subscribers that probed it (or created it by a probe). When the
    /// last of them is discarded while it is queued, it leaves the awaited class.
    awaiting: Vec<Slot>,
    /// Rule 16: a later lookup of the same question may join it. Not after a reset
    /// (rule 13: replies to RPCs from before it are ignored) and not with sharing off.
    shareable: bool,
}

/// An RPC on the wire, as the fake server sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WireRpc {
    pub(crate) rpc_id: RpcId,
    pub(crate) body: RpcBody,
}

/// Counters the model predicts exactly (the names of [`lookup_core::Stats`] and, for
/// `rpcs_sent` and `late_replies`, of [`lookup_core::DispatcherStats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) lookups_arrival: u64,
    pub(crate) lookups_probe: u64,
    pub(crate) prefetch_ineligible: u64,
    pub(crate) prefetch_cap_full: u64,
    pub(crate) prefetch_backlog_full: u64,
    pub(crate) rpcs_created: u64,
    pub(crate) rpcs_sent: u64,
    pub(crate) rpcs_shared: u64,
    pub(crate) rpcs_cancelled: u64,
    pub(crate) replies_stale: u64,
    /// The dispatcher's: replies for RPCs not on the wire.
    pub(crate) late_replies: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    pub(crate) failed_timed_out: u64,
    pub(crate) failed_malformed: u64,
    pub(crate) failed_transport: u64,
    pub(crate) ttl_refreshes: u64,
    pub(crate) chain_refreshes: u64,
    pub(crate) promotions: u64,
    pub(crate) demotions: u64,
    pub(crate) retries_after_failure: u64,
    pub(crate) probes_pending: u64,
    pub(crate) probes_ready: u64,
    pub(crate) resets: u64,
    /// First probes answered `Ready` (the core counts only eligible requests': at most
    /// this many). Not compared for equality.
    pub(crate) first_probes_ready_max: u64,
    /// First probes answered `Pending` (likewise an upper bound).
    pub(crate) first_probes_pending_max: u64,
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

/// How an RPC ended.
#[derive(Clone, Debug)]
enum End {
    Reply(Reply),
    Failure(RpcFailure),
}

/// The reference state. Its `Debug` shows the configuration only, which is what a
/// failing case's initial state needs to show.
#[derive(Clone)]
pub(crate) struct RefState {
    pub(crate) settings: Settings,
    ttl_ns: u64,
    timeout_ns: u64,
    pub(crate) now_ns: u64,
    pub(crate) closed: bool,
    next_rpc: u64,
    next_awaited: u64,
    /// Rule 11: failed requests are looked up again no sooner than this, one at a
    /// time (`retrying`); the wait doubles per failure from 10 ms up to 1 s.
    retry_at_ns: Option<u64>,
    retry_delay_ns: u64,
    retrying: Option<u64>,
    pub(crate) requests: Vec<Option<Live>>,
    rpcs: BTreeMap<u64, Rpc>,
    /// Ids no longer open (ended or cancelled), oldest first.
    pub(crate) ended: Vec<u64>,
    /// RPCs the dispatcher released and was not told are done.
    dispatcher_in_flight: BTreeSet<u64>,
    pub(crate) wire: Vec<WireRpc>,
    pub(crate) counters: Counters,
    pub(crate) expected: Expected,
}

impl std::fmt::Debug for RefState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.settings)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("short durations")
}

fn ready(external_tokens: u32, load_async: bool) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: load_async && external_tokens > 0,
    }
}

impl RefState {
    /// A fresh model with `settings`.
    pub(crate) fn new(settings: Settings) -> Self {
        let config = settings.config();
        Self {
            ttl_ns: nanos(config.ttl()),
            timeout_ns: nanos(config.timeout()),
            settings,
            now_ns: 0,
            closed: false,
            next_rpc: 1,
            next_awaited: 0,
            retry_at_ns: None,
            retry_delay_ns: RETRY_MIN_NS,
            retrying: None,
            requests: vec![None; POOL],
            rpcs: BTreeMap::new(),
            ended: Vec::new(),
            dispatcher_in_flight: BTreeSet::new(),
            wire: Vec::new(),
            counters: Counters::default(),
            expected: Expected::default(),
        }
    }

    /// Rule 3: arrival-time lookups not ended: those live requests wait on, plus those
    /// of discarded requests whose RPC is still on the wire.
    pub(crate) fn slots_in_use(&self) -> u32 {
        let live = self
            .requests
            .iter()
            .flatten()
            .filter(|r| {
                matches!(
                    r.lookup,
                    Some(Lookup::Waiting {
                        holds_slot: true,
                        ..
                    })
                )
            })
            .count();
        let orphans: u32 = self.rpcs.values().map(|r| r.orphan_slots).sum();
        u32::try_from(live).expect("small") + orphans
    }

    /// RPCs the core still tracks.
    pub(crate) fn open_rpcs(&self) -> usize {
        self.rpcs.len()
    }

    /// Open RPCs that are on the wire.
    pub(crate) fn open_rpcs_sent(&self) -> usize {
        self.rpcs.values().filter(|r| r.sent_at.is_some()).count()
    }

    /// Live requests whose lookup waits on an RPC.
    pub(crate) fn waiting_requests(&self) -> usize {
        self.requests
            .iter()
            .flatten()
            .filter(|r| matches!(r.lookup, Some(Lookup::Waiting { .. })))
            .count()
    }

    /// Requests added and not finished.
    pub(crate) fn live_requests(&self) -> usize {
        self.requests.iter().flatten().count()
    }

    /// Rule 17: the earliest `sent + lookup_timeout_s` of an open RPC on the wire.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.rpcs
            .values()
            .filter_map(|r| r.sent_at.map(|s| s + self.timeout_ns))
            .min()
    }

    fn new_rpc_id(&mut self) -> u64 {
        let id = self.next_rpc;
        self.next_rpc += 1;
        self.counters.rpcs_created += 1;
        id
    }

    /// Rule 1.
    fn eligible(prompt: &Prompt) -> bool {
        !prompt.skip && prompt.num_tokens >= BLOCK_SIZE && prompt.num_hashes() > 0
    }

    fn arrive(&mut self, slot: Slot, prompt: Prompt) {
        self.requests[slot] = Some(Live {
            prompt,
            lookup: None,
            first_probe: None,
        });
        // Rule 2 and the configuration table.
        if self.closed || !self.settings.prefetch() {
            return;
        }
        if !Self::eligible(&prompt) {
            self.counters.prefetch_ineligible += 1;
            return;
        }
        if self.slots_in_use() >= self.settings.prefetch_limit {
            self.counters.prefetch_cap_full += 1;
            return;
        }
        // Ours (`Config::max_queued`): a prefetch is not queued behind a full backlog.
        let queued = self.rpcs.values().filter(|r| r.sent_at.is_none()).count();
        if queued >= self.settings.max_queued as usize {
            self.counters.prefetch_backlog_full += 1;
            return;
        }
        self.submit(slot, prompt.question(), true);
    }

    fn probe(&mut self, slot: Slot, change: PromptChange, local_blocks: u32) {
        let live = self.requests[slot].as_mut().expect("precondition: live");
        live.prompt = change.apply(live.prompt);
        let prompt = live.prompt;
        let cap = hit_cap(prompt.num_tokens);
        let num_computed_tokens = (local_blocks * BLOCK_SIZE).min(cap);
        let answer = self.probe_answer(slot, prompt, num_computed_tokens, cap);
        if !self.closed && self.settings.enable_lookup {
            let without_lookup =
                prompt.skip || prompt.num_hashes() == 0 || cap <= num_computed_tokens;
            let live = self.requests[slot].as_mut().expect("live");
            if live.first_probe.is_none() {
                let ready = matches!(answer, Probe::Ready { .. });
                live.first_probe = Some(FirstProbe {
                    ready,
                    without_lookup,
                });
                if ready {
                    self.counters.first_probes_ready_max += 1;
                } else {
                    self.counters.first_probes_pending_max += 1;
                }
            }
        }
        match answer {
            Probe::Pending => self.counters.probes_pending += 1,
            Probe::Ready { .. } => self.counters.probes_ready += 1,
        }
        self.expected.probe = Some(answer);
    }

    fn probe_answer(
        &mut self,
        slot: Slot,
        prompt: Prompt,
        num_computed_tokens: u32,
        cap: u32,
    ) -> Probe {
        let load_async = self.settings.load_async;
        // `enable_lookup = false` and rule 14.
        if self.closed || !self.settings.enable_lookup {
            return ready(0, false);
        }
        let question = prompt.question();
        let lookup = self.requests[slot].as_ref().and_then(|r| r.lookup.clone());
        if prompt.skip || question.num_hashes == 0 || cap <= num_computed_tokens {
            // Nothing to load whatever the store holds: no RPC. Rule 7 still drops a
            // lookup of another question: its answer can never be used.
            if lookup.is_some_and(|l| l.question() != question) {
                self.counters.chain_refreshes += 1;
                self.discard(slot);
            }
            return ready(0, false);
        }
        match lookup {
            Some(l) if l.question() != question => {
                // Rule 7.
                self.counters.chain_refreshes += 1;
                self.discard(slot);
            }
            Some(Lookup::Done {
                failed: true, owed, ..
            }) => {
                // Rule 11: the probe that waited reads the failure once; then the
                // request is looked up again, one failed request at a time, once the
                // failure backoff has passed.
                if owed {
                    self.set_owed(slot, false);
                    return ready(0, false);
                }
                if self.retrying.is_some() || self.retry_at_ns.is_some_and(|t| self.now_ns < t) {
                    return ready(0, false);
                }
                self.counters.retries_after_failure += 1;
                self.discard(slot);
                self.submit(slot, question, false);
                self.retrying = match self.requests[slot].as_ref().and_then(|r| r.lookup.clone()) {
                    Some(Lookup::Waiting { rpc, .. }) => Some(rpc),
                    other => panic!("model bug: a retry left {other:?}"),
                };
                return Probe::Pending;
            }
            Some(Lookup::Done {
                hit_tokens,
                replied_at,
                owed,
                ..
            }) => {
                // Rules 5-6: a result is good until `ttl` after its reply, except that
                // the probe that waited for it reads it whatever its age.
                if !owed && self.now_ns - replied_at > self.ttl_ns {
                    self.counters.ttl_refreshes += 1;
                    self.discard(slot);
                } else {
                    self.set_owed(slot, false);
                    // Rule 12.
                    let external = hit_tokens.min(cap).saturating_sub(num_computed_tokens);
                    return ready(external, load_async);
                }
            }
            Some(Lookup::Waiting { rpc, .. }) => {
                // Rules 4 and 15.
                self.promote(rpc, slot);
                return Probe::Pending;
            }
            None => {}
        }
        self.submit(slot, question, false);
        Probe::Pending
    }

    fn set_owed(&mut self, slot: Slot, to: bool) {
        if let Some(Lookup::Done { owed, .. }) =
            self.requests[slot].as_mut().and_then(|r| r.lookup.as_mut())
        {
            *owed = to;
        }
    }

    /// Starts a lookup of `question` for `slot`, joining an open RPC that asks the
    /// same (rule 16).
    fn submit(&mut self, slot: Slot, question: Question, arrival: bool) {
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
                    sent_at: None,
                    subscribers: vec![slot],
                    orphan_slots: 0,
                    awaited,
                    awaiting: if arrival { Vec::new() } else { vec![slot] },
                    shareable: self.settings.share,
                },
            );
            id
        };
        let live = self.requests[slot].as_mut().expect("live");
        live.lookup = Some(Lookup::Waiting {
            rpc,
            question,
            holds_slot: arrival,
        });
    }

    fn take_awaited_seq(&mut self) -> u64 {
        self.next_awaited += 1;
        self.next_awaited
    }

    /// Rule 15: `slot`'s probe waits for `rpc`; a queued RPC no probe waited for moves
    /// to the awaited class.
    fn promote(&mut self, rpc: u64, slot: Slot) {
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
            .is_some_and(|r| r.sent_at.is_none() && r.awaited.is_none());
        if queued_prefetch {
            let seq = self.take_awaited_seq();
            self.rpcs.get_mut(&rpc).expect("open").awaited = Some(seq);
            self.counters.promotions += 1;
        }
    }

    /// Rules 8-9: the request's lookup is dropped. A queued RPC nobody waits for is
    /// cancelled; an arrival lookup's slot is freed now if its RPC was not sent, else
    /// when the RPC ends (rule 3).
    fn discard(&mut self, slot: Slot) {
        self.detach(slot, true);
    }

    /// Reset drops every lookup at once: nothing is demoted on the way.
    fn discard_all(&mut self, slot: Slot) {
        self.detach(slot, false);
    }

    fn detach(&mut self, slot: Slot, demote: bool) {
        let Some(live) = self.requests[slot].as_mut() else {
            return;
        };
        let Some(Lookup::Waiting {
            rpc, holds_slot, ..
        }) = live.lookup.take()
        else {
            return;
        };
        let r = self
            .rpcs
            .get_mut(&rpc)
            .expect("a waiting lookup's RPC is open");
        r.subscribers.retain(|s| *s != slot);
        r.awaiting.retain(|s| *s != slot);
        if r.sent_at.is_none() {
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

    fn reset(&mut self) {
        // Rule 14, and the configuration table: `enable_lookup = false` means no RPC
        // ever, so no reset RPC either.
        if self.closed || !self.settings.enable_lookup {
            self.expected.reset = Some(None);
            return;
        }
        for slot in 0..POOL {
            self.discard_all(slot);
        }
        for r in self.rpcs.values_mut() {
            r.shareable = false;
        }
        let id = self.new_rpc_id();
        self.counters.resets += 1;
        self.rpcs.insert(
            id,
            Rpc {
                asks: Asks::Reset,
                submitted_at: self.now_ns,
                sent_at: None,
                subscribers: Vec::new(),
                orphan_slots: 0,
                awaited: None,
                awaiting: Vec::new(),
                shareable: false,
            },
        );
        self.expected.reset = Some(Some(RpcId(id)));
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        self.retrying = None;
        self.retry_at_ns = None;
        for (id, r) in std::mem::take(&mut self.rpcs) {
            if r.sent_at.is_none() {
                self.counters.rpcs_cancelled += 1;
            }
            self.ended.push(id);
        }
        for live in self.requests.iter_mut().flatten() {
            live.lookup = None;
        }
        // The driver's I/O task ends with the client: its dispatcher forgets the wire.
        self.dispatcher_in_flight.clear();
    }

    /// A reply or failure for `rpc` reaches the driver's dispatcher. One for an RPC
    /// not on the wire is dropped there; a reply so dropped is counted as late.
    fn deliver(&mut self, rpc: u64, end: End) {
        if self.dispatcher_in_flight.remove(&rpc) {
            self.end_rpc(rpc, end);
        } else if matches!(end, End::Reply(_)) {
            self.counters.late_replies += 1;
        }
    }

    /// Ends an open RPC: rule 11 validates a lookup reply, every request waiting on it
    /// gets the answer, its slots are freed. False when `rpc` is not open.
    fn end_rpc(&mut self, rpc: u64, end: End) -> bool {
        let Some(r) = self.rpcs.remove(&rpc) else {
            return false;
        };
        self.ended.push(rpc);
        self.dispatcher_in_flight.remove(&rpc);
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
                return true;
            }
            Asks::Lookup(q) => q,
        };
        let outcome = match end {
            End::Reply(Reply::Lookup { hit_tokens })
                if hit_tokens <= question.num_tokens && hit_tokens % BLOCK_SIZE == 0 =>
            {
                if hit_tokens == 0 {
                    LookupOutcome::Miss
                } else {
                    LookupOutcome::Hit { hit_tokens }
                }
            }
            End::Reply(_) => LookupOutcome::Malformed,
            End::Failure(f) => LookupOutcome::Failed(f),
        };
        if self.retrying == Some(rpc) {
            self.retrying = None;
        }
        let failed = matches!(outcome, LookupOutcome::Malformed | LookupOutcome::Failed(_));
        if failed {
            self.retry_at_ns = Some(self.now_ns + self.retry_delay_ns);
            self.retry_delay_ns = (self.retry_delay_ns * 2).min(RETRY_MAX_NS);
        } else {
            self.retry_at_ns = None;
            self.retry_delay_ns = RETRY_MIN_NS;
        }
        let hit_tokens = match outcome {
            LookupOutcome::Hit { hit_tokens } => {
                self.counters.hits += 1;
                hit_tokens
            }
            LookupOutcome::Miss => {
                self.counters.misses += 1;
                0
            }
            LookupOutcome::Malformed => {
                self.counters.failed_malformed += 1;
                0
            }
            LookupOutcome::Failed(RpcFailure::TimedOut) => {
                self.counters.failed_timed_out += 1;
                0
            }
            LookupOutcome::Failed(_) => {
                self.counters.failed_transport += 1;
                0
            }
        };
        let mut answered = 0;
        let mut request_ids = Vec::new();
        for slot in &r.subscribers {
            let live = self.requests[*slot].as_mut().expect("subscribers are live");
            match live.lookup {
                Some(Lookup::Waiting {
                    rpc: on,
                    question: q,
                    ..
                }) if on == rpc && q == question => {}
                ref other => {
                    panic!("model bug: subscriber {slot} of rpc {rpc} has lookup {other:?}")
                }
            }
            live.lookup = Some(Lookup::Done {
                question,
                hit_tokens,
                failed,
                replied_at: self.now_ns,
                owed: r.awaiting.contains(slot),
            });
            answered += 1;
            request_ids.push(RequestId(u64::try_from(*slot).expect("small")));
        }
        request_ids.sort_unstable();
        if answered == 0 {
            self.counters.replies_stale += 1;
        }
        let sent_at = r.sent_at.expect("every lookup ends on the wire");
        self.expected.events.push(Event::LookupDone {
            rpc_id,
            outcome,
            requests: answered,
            request_ids,
            total: Duration::from_nanos(self.now_ns - r.submitted_at),
            queue_wait: Duration::from_nanos(sent_at - r.submitted_at),
            on_wire: Duration::from_nanos(self.now_ns - sent_at),
        });
        true
    }

    /// Rule 17: every RPC whose deadline has passed fails, in deadline order.
    fn expire(&mut self) {
        let mut due: Vec<(u64, u64)> = self
            .rpcs
            .iter()
            .filter_map(|(id, r)| r.sent_at.map(|s| (s + self.timeout_ns, *id)))
            .filter(|(deadline, _)| *deadline <= self.now_ns)
            .collect();
        due.sort_unstable();
        for (_, id) in due {
            self.end_rpc(id, End::Failure(RpcFailure::TimedOut));
        }
    }

    /// The driver's dispatcher releases what it may: resets at once, then lookups a
    /// probe awaits, then prefetches (rule 15; one FIFO without priority), while fewer
    /// than `max_in_flight` RPCs are on the wire.
    fn pump(&mut self) {
        if self.closed {
            return;
        }
        loop {
            let queued = || self.rpcs.iter().filter(|(_, r)| r.sent_at.is_none());
            let reset = queued()
                .find(|(_, r)| r.asks == Asks::Reset)
                .map(|(id, _)| *id);
            let room = self.dispatcher_in_flight.len() < self.settings.max_in_flight as usize;
            let lookup = || {
                let lookups = queued().filter(|(_, r)| r.asks != Asks::Reset);
                if self.settings.priority {
                    let awaited = lookups
                        .clone()
                        .filter_map(|(id, r)| r.awaited.map(|seq| (seq, *id)))
                        .min()
                        .map(|(_, id)| id);
                    awaited.or_else(|| lookups.map(|(id, _)| *id).next())
                } else {
                    lookups.map(|(id, _)| *id).next()
                }
            };
            let next = match reset {
                Some(id) => id,
                None if room => match lookup() {
                    Some(id) => id,
                    None => return,
                },
                None => return,
            };
            let r = self.rpcs.get_mut(&next).expect("open");
            debug_assert!(r.asks == Asks::Reset || !r.subscribers.is_empty());
            r.sent_at = Some(self.now_ns);
            self.dispatcher_in_flight.insert(next);
            self.counters.rpcs_sent += 1;
            let body = r.asks.body();
            self.wire.push(WireRpc {
                rpc_id: RpcId(next),
                body,
            });
        }
    }

    fn dead_id(&self, target: DeadTarget) -> u64 {
        match target {
            DeadTarget::Ended(i) => self.ended[i],
            DeadTarget::Never => NEVER_ID,
        }
    }

    fn step(&mut self, transition: &Transition) {
        self.expected = Expected::default();
        match *transition {
            Transition::Arrive { slot, prompt } => self.arrive(slot, prompt),
            Transition::Probe {
                slot,
                change,
                local_blocks,
            } => self.probe(slot, change, local_blocks),
            Transition::Allocated { slot } | Transition::Preempted { slot } => self.discard(slot),
            Transition::Finished { slot } => {
                self.discard(slot);
                self.requests[slot] = None;
            }
            Transition::Reset => self.reset(),
            Transition::Close => self.close(),
            Transition::Advance { ms } => {
                self.now_ns += ms * 1_000_000;
                self.expire();
            }
            Transition::FireTimeout => {
                if let Some(deadline) = self.next_deadline() {
                    self.now_ns = self.now_ns.max(deadline);
                }
                self.expire();
            }
            Transition::Answer {
                wire_index,
                value,
                duplicate,
            } => {
                let entry = if duplicate {
                    self.wire[wire_index].clone()
                } else {
                    self.wire.remove(wire_index)
                };
                let reply = server::reply(value, Some(&entry.body));
                self.deliver(entry.rpc_id.0, End::Reply(reply));
            }
            Transition::TransportError { wire_index } => {
                let entry = self.wire.remove(wire_index);
                self.deliver(entry.rpc_id.0, End::Failure(RpcFailure::Transport));
            }
            Transition::Lose { wire_index } => {
                self.wire.remove(wire_index);
            }
            Transition::DeadReply { target, value } => {
                let id = self.dead_id(target);
                let end = match value {
                    Some(v) => End::Reply(server::reply(v, None)),
                    None => End::Failure(RpcFailure::Transport),
                };
                self.deliver(id, end);
            }
            Transition::Reopen => {
                self.wire.clear();
                for id in std::mem::take(&mut self.dispatcher_in_flight) {
                    self.end_rpc(id, End::Failure(RpcFailure::Transport));
                }
            }
        }
        self.pump();
    }
}

/// The [`ReferenceStateMachine`] over [`RefState`].
pub(crate) struct Model;

impl ReferenceStateMachine for Model {
    type State = RefState;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<RefState> {
        strategies::settings().prop_map(RefState::new).boxed()
    }

    fn transitions(state: &RefState) -> BoxedStrategy<Transition> {
        strategies::transition(state)
    }

    fn apply(mut state: RefState, transition: &Transition) -> RefState {
        state.step(transition);
        state
    }

    fn preconditions(state: &RefState, transition: &Transition) -> bool {
        match *transition {
            Transition::Arrive { slot, .. } => state.requests[slot].is_none(),
            Transition::Probe { slot, .. } => state.requests[slot].is_some(),
            Transition::Answer { wire_index, .. }
            | Transition::TransportError { wire_index }
            | Transition::Lose { wire_index } => wire_index < state.wire.len(),
            Transition::DeadReply {
                target: DeadTarget::Ended(i),
                ..
            } => i < state.ended.len(),
            _ => true,
        }
    }
}
