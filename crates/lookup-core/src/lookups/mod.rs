//! The lookup lifecycle of `spec/behaviour.md`: [`Lookups`], its inputs and outputs.
//! What it keeps per request and RPC is in `entry`, its RPC bookkeeping in `rpcs`,
//! and its read-only views in `queries`.

mod entry;
mod preemption;
mod queries;
mod rpcs;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::Unavailable;
use crate::timer::Backoff;
use crate::{
    Answer, Command, Config, Error, Event, LookupOutcome, Observe, Origin, Probe, Reply, Request,
    RequestId, ResetOutcome, RpcBody, RpcFailure, RpcId, Stats, Ticket, WireEvent,
};
use entry::{FirstProbe, LookupState, Preemption, RequestEntry, Rpc, RpcKind, ShareKey};

/// The hash table of the core and its driver, keyed by ids (a [`RequestId`], an
/// [`RpcId`]) or the core's share key: foldhash, because SipHash was a third of a
/// pending probe's cost (DESIGN.md, "caller cost"); griddle, so that growing never
/// rehashes every entry in one input (the std map's doubling at 57,344 tracked
/// requests took one arrival 4.7-8.4 ms; griddle moves a few entries per insert
/// instead). `Table::default()` is empty and allocates nothing.
pub type Table<K, V> = griddle::HashMap<K, V, foldhash::fast::RandomState>;

/// First wait before a failed request is looked up again (rule 11); doubles per failed
/// lookup up to [`RETRY_BACKOFF_MAX`], back to this after a lookup succeeds.
pub const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait before a failed request is looked up again (rule 11).
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The scheduler-side lookup lifecycle (`spec/behaviour.md` rules 1-17), sans-IO.
///
/// # Call-order contract
///
/// Every input takes `now`, the caller's clock; the type never reads a clock.
/// After every input (`on_new_request`, `probe`, `on_allocated`, `on_finished`,
/// `on_preempted`, `reset`, `close`, `handle_wire_event`):
///
/// 1. drain [`poll_transmit`](Self::poll_transmit) into the driver's
///    [`Dispatcher`](crate::Dispatcher) (the wire's half of the protocol: send queue,
///    RPCs on the wire, their deadlines);
/// 2. drain [`poll_event`](Self::poll_event).
///
/// Each [`WireEvent`] the dispatcher reports is given back with
/// [`handle_wire_event`](Self::handle_wire_event). `Lookups` keeps no deadline of its
/// own: an RPC's timeout (rule 17) is the dispatcher's, and reaches this type as a
/// wire event like a reply. A probe that finds its result cached does not allocate.
#[derive(Debug)]
pub struct Lookups<O: Observe = ()> {
    config: Config,
    ttl: Duration,
    closed: bool,
    next_rpc: u64,
    requests: Table<RequestId, RequestEntry>,
    rpcs: Table<RpcId, Rpc>,
    shared: Table<ShareKey, RpcId>,
    slots_in_use: u32,
    /// RPCs handed to the driver whose ticket is still queued (`max_queued` backlog),
    /// kept by the tickets themselves.
    backlog: Arc<AtomicUsize>,
    /// Rule 11: after a failed lookup, a failed request is looked up again only once
    /// `retry_at` passed, one at a time (`retrying`), so a dead server sees no storm.
    retry_backoff: Backoff,
    retry_at: Option<Instant>,
    retrying: Option<RpcId>,
    transmits: VecDeque<Command>,
    events: VecDeque<Event>,
    event_capacity: usize,
    observer: O,
    stats: Stats,
}

impl Lookups {
    /// A lookup state machine with `config` and no observer.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] as [`Config::validate`].
    pub fn new(config: Config) -> Result<Self, Error> {
        Self::with_observer(config, ())
    }
}

impl<O: Observe> Lookups<O> {
    /// A lookup state machine with `config`, telling `observer` what it does.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] as [`Config::validate`].
    pub fn with_observer(config: Config, observer: O) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            ttl: config.ttl(),
            config,
            closed: false,
            next_rpc: 1,
            requests: Table::default(),
            rpcs: Table::default(),
            shared: Table::default(),
            slots_in_use: 0,
            backlog: Arc::default(),
            retry_backoff: Backoff::new(RETRY_BACKOFF_MIN, RETRY_BACKOFF_MAX),
            retry_at: None,
            retrying: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            event_capacity: usize::MAX,
            observer,
            stats: Stats::default(),
        })
    }

    fn emit(&mut self, event: Event) {
        self.observer.event(&event);
        if self.event_capacity == 0 {
            self.stats.events_dropped += 1;
            return;
        }
        if self.events.len() >= self.event_capacity {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(event);
    }

    /// A request arrived (vLLM's `on_new_request`): prefetch its lookup when prefetch
    /// is on, it is eligible (rule 1), a slot is free (rules 2-3) and the backlog has
    /// room (`max_queued`). Otherwise nothing happens and the request is looked up at
    /// its first probe. A request whose lookup is queued, in flight or done keeps it,
    /// whatever prompt it arrives with this time; one without a lookup (refused a slot
    /// at an earlier arrival, or after [`on_allocated`](Self::on_allocated) consumed
    /// it) is prefetched as at a first arrival (rule 2).
    pub fn on_new_request(&mut self, req: &Request, now: Instant) {
        if self.closed || !self.config.prefetch_enabled() {
            return;
        }
        self.consume_retained(req.request_id);
        let eligible = self.is_eligible(req);
        let entry = self.requests.entry(req.request_id).or_insert(RequestEntry {
            eligible,
            first_probe: FirstProbe::NotYet,
            lookup: None,
            last_answer: None,
            last_seen: now,
            failed: false,
            preemption: Preemption::None,
        });
        // A failed request is looked up again by a probe, under the backoff (rule 11).
        if entry.lookup.is_some() || entry.failed {
            return;
        }
        if !eligible {
            self.stats.prefetch_ineligible += 1;
            return;
        }
        if self.slots_in_use >= self.config.lookup_prefetch_limit {
            self.stats.prefetch_cap_full += 1;
            return;
        }
        if self.backlog.load(Ordering::Relaxed) >= self.config.max_queued as usize {
            self.stats.prefetch_backlog_full += 1;
            return;
        }
        self.submit(
            req.request_id,
            req.num_tokens,
            &req.block_hashes,
            Origin::Arrival,
            now,
        );
    }

    /// The scheduler asks how many external tokens it can load for `req`, whose local
    /// (GPU) hit is `num_computed_tokens` (vLLM's `get_num_new_matched_tokens`).
    ///
    /// Answers `Ready(0)` at once, sending nothing, when lookup is off (rule 11's
    /// config), after close (rule 14), when the request skips external KV or has no
    /// hashes, or when the local hit already reaches the cap of rule 12. Otherwise
    /// reuses the lookup queued or in flight (rule 4, promoting it: rule 15), answers
    /// a cached result (rule 5) unless it outlived the TTL (rule 6) or asked about
    /// another token count or chain (rule 7), and else submits a lookup and answers
    /// `Pending`. In sync mode the driver keeps calling until `Ready` (rule 10).
    pub fn probe(&mut self, req: &Request, num_computed_tokens: u32, now: Instant) -> Probe {
        let cap = self.hit_cap(req.num_tokens);
        let (probe, basis) = self.probe_inner(req, num_computed_tokens, cap, now);
        let entry = self.requests.get_mut(&req.request_id);
        match probe {
            Probe::Pending => {
                self.stats.probes_pending += 1;
                if let Some(entry) = entry {
                    entry.last_seen = now;
                }
            }
            Probe::Ready { .. } => {
                self.stats.probes_ready += 1;
                match basis {
                    Answer::Hit { .. } => self.stats.answers_hit += 1,
                    Answer::Miss => self.stats.answers_miss += 1,
                    Answer::NotNeeded => self.stats.answers_not_needed += 1,
                    Answer::Unavailable(_) => self.stats.answers_unavailable += 1,
                }
                if let Some(entry) = entry {
                    entry.last_answer = Some(basis);
                    entry.last_seen = now;
                }
            }
        }
        probe
    }

    fn probe_inner(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        cap: u32,
        now: Instant,
    ) -> (Probe, Answer) {
        let ready = |external_tokens: u32, load_async: bool| Probe::Ready {
            external_tokens,
            load_async: load_async && external_tokens > 0,
        };
        let pending = (Probe::Pending, Answer::NotNeeded);
        if self.closed {
            self.consume_retained(req.request_id);
            return (ready(0, false), Answer::Unavailable(Unavailable::Closed));
        }
        if !self.config.enable_lookup {
            self.consume_retained(req.request_id);
            return (ready(0, false), Answer::Unavailable(Unavailable::Disabled));
        }
        let eligible = self.is_eligible(req);
        let keep = self.config.lookup_on_preemption.keeps();
        if req.skip_reading_external_kv || req.block_hashes.is_empty() || cap <= num_computed_tokens
        {
            // Nothing to load whatever the store holds: no RPC. A lookup of another
            // prompt is dropped all the same (rule 7).
            if let Some(entry) = self.requests.get_mut(&req.request_id) {
                entry.consume_retained();
                Self::note_first_probe(&mut self.stats, entry, true);
                let kept = keep && entry.preemption == Preemption::Preempted;
                if entry
                    .lookup
                    .as_ref()
                    .is_some_and(|l| !preemption::answers(l, kept, req))
                {
                    self.stats.chain_refreshes += 1;
                    self.discard_lookup(req.request_id);
                }
            } else {
                if eligible {
                    self.stats.first_probes_ready += 1;
                }
                self.requests.insert(
                    req.request_id,
                    RequestEntry {
                        eligible,
                        first_probe: FirstProbe::Ready,
                        lookup: None,
                        last_answer: Some(Answer::NotNeeded),
                        last_seen: now,
                        failed: false,
                        preemption: Preemption::None,
                    },
                );
            }
            return (ready(0, false), Answer::NotNeeded);
        }
        let entry = self.requests.entry(req.request_id).or_insert(RequestEntry {
            eligible,
            first_probe: FirstProbe::NotYet,
            lookup: None,
            last_answer: None,
            last_seen: now,
            failed: false,
            preemption: Preemption::None,
        });
        entry.consume_retained();
        let failed = entry.failed;
        let kept = keep && entry.preemption == Preemption::Preempted;
        let mut refresh = None;
        let mut retry = false;
        match &mut entry.lookup {
            Some(state) if !preemption::answers(state, kept, req) => {
                refresh = Some(false);
            }
            Some(LookupState::Done {
                answer: answer @ Answer::Unavailable(_),
                owed,
                ..
            }) => {
                // Rule 11: a failure is never served as a cached result. The probe that
                // waited for it reads it once; later ones look up again, one failed
                // request at a time and only once the failure backoff passed.
                let answer = *answer;
                if std::mem::take(owed) {
                    Self::note_first_probe(&mut self.stats, entry, true);
                    return (ready(0, false), answer);
                }
                if self.retrying.is_some() || self.retry_at.is_some_and(|t| now < t) {
                    Self::note_first_probe(&mut self.stats, entry, true);
                    return (ready(0, false), Answer::Unavailable(Unavailable::Retrying));
                }
                retry = true;
            }
            Some(LookupState::Done {
                answer,
                replied_at,
                owed,
                ..
            }) => {
                if !*owed && now.saturating_duration_since(*replied_at) > self.ttl {
                    refresh = Some(true);
                } else {
                    *owed = false;
                    let answer = *answer;
                    let external = answer
                        .hit_tokens()
                        .min(cap)
                        .saturating_sub(num_computed_tokens);
                    Self::note_first_probe(&mut self.stats, entry, true);
                    return (ready(external, self.config.load_async), answer);
                }
            }
            Some(LookupState::Waiting {
                rpc_id, awaited, ..
            }) => {
                let rpc_id = *rpc_id;
                let newly = !std::mem::replace(awaited, true);
                Self::note_first_probe(&mut self.stats, entry, false);
                if newly {
                    self.await_rpc(rpc_id);
                }
                return pending;
            }
            None => {}
        }
        if failed && !retry {
            // Rule 11 whatever the prompt is now: the stale lookup goes (rule 7), and a
            // new one is a retry, under the backoff like any other.
            if refresh == Some(false) {
                refresh = None;
                self.stats.chain_refreshes += 1;
                self.discard_lookup(req.request_id);
            }
            if self.retrying.is_some() || self.retry_at.is_some_and(|t| now < t) {
                if let Some(entry) = self.requests.get_mut(&req.request_id) {
                    Self::note_first_probe(&mut self.stats, entry, true);
                }
                return (ready(0, false), Answer::Unavailable(Unavailable::Retrying));
            }
            retry = true;
        }
        let Some(entry) = self.requests.get_mut(&req.request_id) else {
            unreachable!("inserted above; discarding a lookup keeps the request");
        };
        Self::note_first_probe(&mut self.stats, entry, false);
        match refresh {
            Some(true) => self.stats.ttl_refreshes += 1,
            Some(false) => self.stats.chain_refreshes += 1,
            None => {}
        }
        if retry {
            self.stats.retries_after_failure += 1;
        }
        self.discard_lookup(req.request_id);
        let rpc_id = self.submit(
            req.request_id,
            req.num_tokens,
            &req.block_hashes,
            Origin::Probe,
            now,
        );
        if retry {
            self.retrying = Some(rpc_id);
        }
        pending
    }

    fn note_first_probe(stats: &mut Stats, entry: &mut RequestEntry, ready: bool) {
        if entry.first_probe == FirstProbe::NotYet {
            entry.first_probe = if ready {
                FirstProbe::Ready
            } else {
                FirstProbe::Pending
            };
            if entry.eligible {
                if ready {
                    stats.first_probes_ready += 1;
                } else {
                    stats.first_probes_pending += 1;
                }
            }
        }
    }

    /// Rule 8: the request got its blocks (vLLM's `update_state_after_alloc`): its
    /// lookup is consumed; a later probe (a reschedule after a failed load) looks up
    /// again. Under `lookup_on_preemption` = `keep` or `keep_wait` a usable result
    /// (not a failure) is kept for a preemption instead, and dropped by the next probe
    /// or arrival if none came. Unknown requests: no-op.
    pub fn on_allocated(&mut self, request_id: RequestId) {
        if !self.retain_on_allocation(request_id) {
            self.discard_lookup(request_id);
        }
        self.forget_failure(request_id);
    }

    /// A discard point (rule 8) ends a failed request's retry: its next lookup is a
    /// first one.
    fn forget_failure(&mut self, request_id: RequestId) {
        if let Some(entry) = self.requests.get_mut(&request_id) {
            entry.failed = false;
        }
    }

    /// Rule 8: the request finished or was aborted: everything about it is dropped at
    /// once; a queued lookup is cancelled and its slot freed (rule 9). Unknown: no-op.
    pub fn on_finished(&mut self, request_id: RequestId) {
        self.discard_lookup(request_id);
        self.requests.remove(&request_id);
    }

    /// Ends every request not seen (no arrival, no probe) for longer than
    /// `older_than`, as [`on_finished`](Self::on_finished) would: a scheduler that
    /// loses requests without finishing them (a crashed front end, a dropped
    /// connection) calls it now and then so that they do not stay tracked. Returns how
    /// many it ended, also counted in [`Stats::requests_ended_idle`].
    pub fn end_idle(&mut self, older_than: Duration, now: Instant) -> usize {
        let idle: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, e)| now.saturating_duration_since(e.last_seen) > older_than)
            .map(|(id, _)| *id)
            .collect();
        for id in &idle {
            self.on_finished(*id);
        }
        self.stats.requests_ended_idle += idle.len() as u64;
        idle.len()
    }

    /// Rule 13: drops every request's lookup (queued ones cancelled, in-flight replies
    /// ignored), then queues one reset RPC; its outcome comes as
    /// [`Event::ResetDone`]. Returns the reset's id, or `None` after close or with
    /// `enable_lookup = false` (no RPC ever: then only the lookups are dropped).
    ///
    /// RPCs already on the wire keep their slots until they end, but no later lookup
    /// joins them (rule 16): they were asked before the wipe.
    pub fn reset(&mut self, now: Instant) -> Option<RpcId> {
        if self.closed {
            return None;
        }
        let ids: Vec<RequestId> = self.requests.keys().copied().collect();
        for id in ids {
            // Every lookup goes: no demotion is worth sending (rule 13).
            self.detach(id, false);
            self.forget_failure(id);
        }
        self.shared.clear();
        if !self.config.enable_lookup {
            return None;
        }
        let rpc_id = self.new_rpc_id();
        let ticket = Ticket::counted(&self.backlog);
        self.rpcs.insert(
            rpc_id,
            Rpc {
                kind: RpcKind::Reset,
                ticket: ticket.clone(),
                awaited: true,
                awaiting: 0,
                subscribers: Vec::new(),
                slots: 0,
                submitted_at: now,
            },
        );
        self.stats.resets += 1;
        self.transmits.push_back(Command::Send {
            rpc_id,
            origin: Origin::Probe,
            body: RpcBody::Reset,
            ticket,
        });
        Some(rpc_id)
    }

    /// Rule 14: cancels everything and forgets all state; afterwards nothing is ever
    /// transmitted, probes answer `Ready(0)` and other inputs are no-ops. Pending
    /// commands not yet pulled are dropped; queued RPCs' tickets are cancelled so a
    /// driver still holding them never sends them.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        for rpc in self.rpcs.values() {
            if rpc.ticket.cancel() {
                self.stats.rpcs_cancelled += 1;
            }
        }
        self.rpcs.clear();
        self.shared.clear();
        self.requests.clear();
        self.transmits.clear();
        self.slots_in_use = 0;
        self.retry_at = None;
        self.retrying = None;
    }

    /// An RPC ended on the wire (a reply, a timeout, a transport failure), as the
    /// driver's [`Dispatcher`](crate::Dispatcher) reported it. Its time is the
    /// event's own ([`WireEvent::at`]): a result's TTL runs from its reply (rule 6).
    ///
    /// Lookup replies are validated (rule 11: above `num_tokens` or not a block
    /// multiple is malformed) and applied only to the requests still waiting on
    /// exactly this question (rule 7); failures answer 0 hits (rule 11); a reset's
    /// reply or failure becomes [`Event::ResetDone`] (rule 13). Events for RPCs this
    /// type no longer has (after close) are ignored.
    pub fn handle_wire_event(&mut self, event: WireEvent) {
        let WireEvent {
            rpc_id,
            result,
            sent_at,
            at,
        } = event;
        let Some(rpc) = self.take_rpc(rpc_id) else {
            return;
        };
        match (&rpc.kind, result) {
            (RpcKind::Reset, result) => {
                let outcome = match result {
                    Ok(Reply::Reset { ok: true }) => ResetOutcome::Ok,
                    Ok(_) => ResetOutcome::Failed,
                    Err(_) => ResetOutcome::TimedOut,
                };
                self.emit(Event::ResetDone { rpc_id, outcome });
            }
            (RpcKind::Lookup { key }, result) => {
                let outcome = match result {
                    Ok(Reply::Lookup { hit_tokens })
                        if hit_tokens <= key.num_tokens
                            && hit_tokens % self.config.block_size == 0 =>
                    {
                        if hit_tokens == 0 {
                            LookupOutcome::Miss
                        } else {
                            LookupOutcome::Hit { hit_tokens }
                        }
                    }
                    Ok(Reply::Lookup { hit_tokens }) => {
                        // Rule 11's guards: above the prompt, or not whole blocks.
                        self.observer
                            .reply_rejected(rpc_id, key.num_tokens, hit_tokens);
                        LookupOutcome::Malformed
                    }
                    // The server is up, its store is not: a failure (rule 11), with
                    // the backoff and retry of any other.
                    Ok(Reply::StoreUnavailable) => {
                        LookupOutcome::Failed(RpcFailure::StoreUnavailable)
                    }
                    Ok(_) => LookupOutcome::Malformed,
                    Err(failure) => LookupOutcome::Failed(failure),
                };
                self.finish_lookup(rpc_id, rpc, outcome, sent_at, at);
            }
        }
    }

    /// The next RPC command for the driver (CONTRIBUTING.md rule 2).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Command> {
        self.transmits.pop_front()
    }

    /// Takes the [`Event::ResetDone`] of `rpc_id` out of the event queue, leaving
    /// the others queued (for a driver's wait on one reset).
    pub fn take_reset_done(&mut self, rpc_id: RpcId) -> Option<ResetOutcome> {
        let index = self
            .events
            .iter()
            .position(|e| matches!(e, Event::ResetDone { rpc_id: id, .. } if *id == rpc_id))?;
        match self.events.remove(index) {
            Some(Event::ResetDone { outcome, .. }) => Some(outcome),
            _ => None,
        }
    }

    /// The next event for the caller.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
