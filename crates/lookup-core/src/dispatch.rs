//! The wire side of the protocol: the send queue, the RPCs on the wire, their
//! deadlines and the replies that arrive for them. A sans-IO machine of its own,
//! run by the driver's I/O task beside its socket, while [`Lookups`](crate::Lookups)
//! runs on the scheduler's thread (DESIGN.md, "Who owns what").

use std::collections::{BTreeSet, VecDeque};

use crate::lookups::Table;
use std::time::{Duration, Instant};

use crate::timer::{Timers, deadline_after};
use crate::{Command, Config, Origin, Reply, RpcBody, RpcFailure, RpcId, Ticket, WireEvent};

/// An RPC released for sending by [`Dispatcher::poll_transmit`]: its ticket is
/// claimed and its deadline runs, so it must go on the wire now.
#[must_use]
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// The RPC's id (envelope frame on the wire).
    pub rpc_id: RpcId,
    /// What to send.
    pub body: RpcBody,
}

/// Send class of a queued RPC (rule 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A probe is waiting for it: goes first, in the order probes started waiting
    /// (the sequence number of its entry in the awaited queue).
    Awaited(u64),
    /// No probe waits for it: sent after the awaited ones, in submission order.
    Prefetch,
}

/// Where an RPC the dispatcher knows is (CONTRIBUTING.md rule 6).
#[derive(Debug)]
enum Entry<T> {
    /// Waiting for the wire.
    Queued {
        class: Class,
        body: RpcBody,
        ticket: Ticket,
        tag: T,
    },
    /// Written to the wire at `sent_at`; fails at `deadline` (rule 17).
    OnWire {
        sent_at: Instant,
        deadline: Instant,
        is_reset: bool,
        tag: T,
    },
}

/// Counters of a [`Dispatcher`] since construction. All counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatcherStats {
    /// RPCs released to the wire (lookups and resets).
    pub rpcs_sent: u64,
    /// Replies for RPC ids not on the wire (late after a timeout or a reopen,
    /// duplicated, never sent by this client): dropped, never applied (rule 17).
    pub late_replies: u64,
    /// RPCs that timed out on the wire (rule 17).
    pub rpcs_timed_out: u64,
    /// RPCs that failed on the transport (send error, no socket, socket dropped).
    pub rpcs_failed_transport: u64,
    /// Lookups that waited `max_pending_age` in the queue and ended unsent
    /// ([`Dispatcher::set_max_pending_age`], rule 17).
    pub lookups_expired: u64,
}

/// Orders [`Command`]s for the wire and keeps every RPC on it until it ends.
///
/// Send order: resets first, then lookups a probe awaits (in the order probes started
/// waiting), then the others in submission order (rule 15; with
/// `lookup_priority = false` one FIFO, vLLM's single worker). A lookup's class follows
/// the probes currently waiting for it: [`Command::Promote`] and [`Command::Demote`].
/// At most `max_in_flight` RPCs are on the wire; a reset bypasses that limit so that it
/// is never stuck behind a hung lookup. A reset is a barrier (rule 13): while one is on
/// the wire no lookup is released, whatever `max_in_flight` is, so that every lookup
/// submitted after [`Lookups::reset`](crate::Lookups::reset) reaches the server after
/// the reset was served (the lookups submitted before it were cancelled, or are on the
/// wire with their replies ignored); the barrier lifts when the reset ends (reply,
/// timeout or transport failure). Cancelled RPCs are skipped at the latest
/// when their turn comes (their [`Ticket`] decides), so a dead request's lookup never
/// occupies the wire (rule 8).
///
/// It is the one owner of the wire's state: each RPC's deadline (`lookup_timeout_s`
/// from its send, rule 17), the in-flight records, the late-reply count and the count
/// of timeouts in a row that asks for a reopen. Every end becomes one [`WireEvent`],
/// which the driver carries to [`Lookups::handle_wire_event`](crate::Lookups::handle_wire_event).
/// `T` is the driver's own data per RPC (for example its tracing span), handed back
/// with the event.
///
/// # Call-order contract
///
/// Every input takes `now`. After every input (`push`, `handle_reply`,
/// `handle_send_failed`, `fail_on_wire`, `handle_timeout`):
///
/// 1. drain [`poll_transmit`](Self::poll_transmit) and write each RPC (report a write
///    that failed with [`handle_send_failed`](Self::handle_send_failed));
/// 2. drain [`poll_event`](Self::poll_event) and carry each event to the lifecycle;
/// 3. if [`poll_reopen`](Self::poll_reopen) says so, drop the connection and call
///    [`fail_on_wire`](Self::fail_on_wire);
/// 4. re-arm the timer for [`poll_timeout`](Self::poll_timeout). Calling
///    [`handle_timeout`](Self::handle_timeout) early or twice is harmless.
///
/// With [`set_max_pending_age`](Self::set_max_pending_age), a lookup queued that long
/// ends unsent at [`handle_timeout`](Self::handle_timeout) (rule 17), and
/// [`poll_timeout`](Self::poll_timeout) includes the oldest one's expiry.
#[derive(Debug)]
pub struct Dispatcher<T = ()> {
    priority: bool,
    max_in_flight: usize,
    timeout: Duration,
    reopen_after_timeouts: u32,
    consecutive_timeouts: u32,
    reopen: bool,
    resets: VecDeque<RpcId>,
    /// Awaited entries with their sequence number; stale ones (demoted, cancelled,
    /// sent) are skipped when reached.
    awaited: VecDeque<(u64, RpcId)>,
    next_seq: u64,
    /// Queued RPCs of the prefetch class, by id (ids follow submission order).
    prefetch: BTreeSet<RpcId>,
    entries: Table<RpcId, Entry<T>>,
    queued: usize,
    lookups_on_wire: usize,
    deadlines: Timers<RpcId>,
    /// `max_pending_age` (`None`: lookups wait for the wire without bound).
    max_pending_age: Option<Duration>,
    /// The queued lookups in the order they were queued, with when (only with a
    /// `max_pending_age`). Its front is always still queued; ids that left the queue
    /// elsewhere (sent ahead of older ones, cancelled) stay until they reach the front.
    ages: VecDeque<(Instant, RpcId)>,
    /// How many ids in `ages` left the queue: while 0, the next front is known to be
    /// queued without a table lookup.
    ages_stale: usize,
    events: VecDeque<(WireEvent, T)>,
    stats: DispatcherStats,
}

impl<T> Dispatcher<T> {
    /// A dispatcher with `config.max_in_flight`, `config.lookup_priority` and
    /// `config.lookup_timeout_s` (validated by [`Config::validate`]). It never asks
    /// for a reopen unless [`set_reopen_after_timeouts`](Self::set_reopen_after_timeouts).
    #[must_use]
    pub fn new(config: &Config) -> Self {
        Self {
            priority: config.lookup_priority,
            max_in_flight: config.max_in_flight.max(1) as usize,
            timeout: config.timeout(),
            reopen_after_timeouts: 0,
            consecutive_timeouts: 0,
            reopen: false,
            resets: VecDeque::new(),
            awaited: VecDeque::new(),
            next_seq: 0,
            prefetch: BTreeSet::new(),
            entries: Table::default(),
            queued: 0,
            lookups_on_wire: 0,
            deadlines: Timers::new(),
            max_pending_age: None,
            ages: VecDeque::new(),
            ages_stale: 0,
            events: VecDeque::new(),
            stats: DispatcherStats::default(),
        }
    }

    /// Ask for a reopen ([`poll_reopen`](Self::poll_reopen)) after `k` timeouts in a
    /// row with no reply between them, so that a serial server stuck on one request is
    /// not fed the backlog behind it (rule 17). 0 never asks.
    pub fn set_reopen_after_timeouts(&mut self, k: u32) {
        self.reopen_after_timeouts = k;
    }

    /// Lookups queued longer than `age` end unsent with [`RpcFailure::NotSent`] at
    /// [`handle_timeout`](Self::handle_timeout), counted in
    /// [`DispatcherStats::lookups_expired`] (`max_pending_age_s`, rule 17), so that none
    /// waits behind a slow server without bound. Set it before the first push; `None`
    /// (the default) never ends a queued lookup.
    pub fn set_max_pending_age(&mut self, age: Option<Duration>) {
        self.max_pending_age = age;
    }

    /// Takes one command from [`Lookups::poll_transmit`](crate::Lookups::poll_transmit)
    /// at `now`, with the driver's data for it (used by `Send`; dropped for the others).
    pub fn push(&mut self, command: Command, tag: T, now: Instant) {
        match command {
            Command::Send {
                rpc_id,
                origin,
                body,
                ticket,
            } => {
                let class = if matches!(body, RpcBody::Reset) {
                    self.resets.push_back(rpc_id);
                    Class::Prefetch
                } else if self.priority && origin == Origin::Probe {
                    self.await_class(rpc_id)
                } else {
                    self.prefetch.insert(rpc_id);
                    Class::Prefetch
                };
                self.queued += 1;
                if self.max_pending_age.is_some() && !matches!(body, RpcBody::Reset) {
                    self.ages.push_back((now, rpc_id));
                }
                self.entries.insert(
                    rpc_id,
                    Entry::Queued {
                        class,
                        body,
                        ticket,
                        tag,
                    },
                );
            }
            Command::Promote { rpc_id } => {
                if !self.priority {
                    return;
                }
                if let Some(Entry::Queued {
                    class: Class::Prefetch,
                    ..
                }) = self.entries.get(&rpc_id)
                {
                    self.prefetch.remove(&rpc_id);
                    let class = self.await_class(rpc_id);
                    if let Some(Entry::Queued { class: c, .. }) = self.entries.get_mut(&rpc_id) {
                        *c = class;
                    }
                }
            }
            Command::Demote { rpc_id } => {
                if !self.priority {
                    return;
                }
                if let Some(Entry::Queued { class, .. }) = self.entries.get_mut(&rpc_id) {
                    if matches!(class, Class::Awaited(_)) {
                        // Its entry in `awaited` goes stale and is skipped when reached.
                        *class = Class::Prefetch;
                        self.prefetch.insert(rpc_id);
                        self.compact();
                    }
                }
            }
            Command::Cancel { rpc_id } => {
                if let Some(Entry::Queued { body, .. }) = self.entries.get(&rpc_id) {
                    let is_reset = matches!(body, RpcBody::Reset);
                    self.entries.remove(&rpc_id);
                    self.prefetch.remove(&rpc_id);
                    self.queued -= 1;
                    self.left_queue(rpc_id, is_reset);
                }
                self.compact();
            }
        }
    }

    /// Queues `rpc_id` at the back of the awaited class; returns its class.
    fn await_class(&mut self, rpc_id: RpcId) -> Class {
        self.next_seq += 1;
        self.awaited.push_back((self.next_seq, rpc_id));
        Class::Awaited(self.next_seq)
    }

    /// Stale ids stay in the reset and awaited queues until reached; compact once they
    /// outnumber live entries, so a hung wire cannot grow them unbounded.
    fn compact(&mut self) {
        let ids = self.queued_ids();
        if ids > 2 * self.queued + 64 {
            let entries = &self.entries;
            self.resets
                .retain(|id| matches!(entries.get(id), Some(Entry::Queued { .. })));
            self.awaited.retain(|(seq, id)| {
                matches!(entries.get(id), Some(Entry::Queued { class: Class::Awaited(s), .. }) if s == seq)
            });
        }
    }

    /// `rpc_id` left the queue (sent, cancelled, failed): off the front of `ages` if it
    /// is there, else counted stale until it reaches the front.
    fn left_queue(&mut self, rpc_id: RpcId, is_reset: bool) {
        if is_reset || self.max_pending_age.is_none() {
            return;
        }
        if self.ages.front().is_some_and(|&(_, id)| id == rpc_id) {
            self.ages.pop_front();
            self.settle_ages();
        } else {
            self.ages_stale += 1;
        }
    }

    /// Drops the stale ids at the front of `ages`, so that its front is queued.
    fn settle_ages(&mut self) {
        while self.ages_stale > 0 {
            let Some(&(_, rpc_id)) = self.ages.front() else {
                break;
            };
            if self.is_queued(rpc_id) {
                break;
            }
            self.ages.pop_front();
            self.ages_stale -= 1;
        }
        if self.ages.is_empty() {
            self.ages_stale = 0;
        }
    }

    /// The next RPC to write to the wire at `now`, if one is queued and the wire has
    /// room. Its ticket is claimed and its deadline starts: write it now, and report a
    /// write that failed with [`handle_send_failed`](Self::handle_send_failed).
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Outgoing> {
        let rpc_id = if let Some(id) = self.pop(Queue::Resets) {
            id
        } else if self.resets_on_wire() > 0 || self.in_flight() >= self.max_in_flight {
            // Rule 13's barrier, then `max_in_flight`.
            return None;
        } else {
            self.pop(Queue::Awaited)
                .or_else(|| self.pop(Queue::Prefetch))?
        };
        let Some(Entry::Queued { body, tag, .. }) = self.entries.remove(&rpc_id) else {
            unreachable!("pop only returns queued entries");
        };
        self.queued -= 1;
        self.prefetch.remove(&rpc_id);
        let is_reset = matches!(body, RpcBody::Reset);
        self.left_queue(rpc_id, is_reset);
        if !is_reset {
            self.lookups_on_wire += 1;
        }
        let deadline = deadline_after(now, self.timeout);
        self.deadlines.insert(deadline, rpc_id);
        self.entries.insert(
            rpc_id,
            Entry::OnWire {
                sent_at: now,
                deadline,
                is_reset,
                tag,
            },
        );
        self.stats.rpcs_sent += 1;
        Some(Outgoing { rpc_id, body })
    }

    /// Pops the first live queued id of `queue` whose ticket the driver could claim.
    fn pop(&mut self, queue: Queue) -> Option<RpcId> {
        loop {
            let rpc_id = match queue {
                Queue::Resets => self.resets.pop_front()?,
                Queue::Awaited => {
                    let (seq, rpc_id) = self.awaited.pop_front()?;
                    match self.entries.get(&rpc_id) {
                        Some(Entry::Queued {
                            class: Class::Awaited(s),
                            ..
                        }) if *s == seq => rpc_id,
                        // Demoted, re-queued later, cancelled or sent: stale.
                        _ => continue,
                    }
                }
                Queue::Prefetch => self.prefetch.pop_first()?,
            };
            let Some(Entry::Queued { ticket, .. }) = self.entries.get(&rpc_id) else {
                continue;
            };
            if ticket.claim() {
                return Some(rpc_id);
            }
            // Cancelled by the lifecycle (rule 9), its Cancel command not here yet.
            let is_reset = matches!(queue, Queue::Resets);
            self.entries.remove(&rpc_id);
            self.prefetch.remove(&rpc_id);
            self.queued -= 1;
            self.left_queue(rpc_id, is_reset);
        }
    }

    /// A reply for `rpc_id` arrived at `now`, decoded by the driver
    /// ([`Reply::Malformed`] when its bytes break `spec/wire.md`). Applied when the RPC
    /// is on the wire; otherwise (late after a timeout or a reopen, duplicated, never
    /// sent) dropped and counted in [`DispatcherStats::late_replies`] (rule 17).
    /// Returns whether it was applied.
    pub fn handle_reply(&mut self, rpc_id: RpcId, reply: Reply, now: Instant) -> bool {
        if !matches!(self.entries.get(&rpc_id), Some(Entry::OnWire { .. })) {
            self.stats.late_replies += 1;
            return false;
        }
        self.consecutive_timeouts = 0;
        self.end(rpc_id, Ok(reply), now);
        true
    }

    /// The write of a released RPC failed, or the driver could not write it (no
    /// connection, an encoding the format lacks): it ends with `failure` now.
    /// Unknown ids are ignored.
    pub fn handle_send_failed(&mut self, rpc_id: RpcId, failure: RpcFailure, now: Instant) {
        if matches!(self.entries.get(&rpc_id), Some(Entry::OnWire { .. })) {
            if failure == RpcFailure::Transport {
                self.stats.rpcs_failed_transport += 1;
            }
            self.end(rpc_id, Err(failure), now);
        }
    }

    /// A queued RPC that must not wait longer ends now with `failure`, unsent: its ticket is
    /// claimed as if released, and its event carries `sent_at == at == now`. Returns
    /// false, with no event, when `rpc_id` is not queued, or was cancelled (then it is
    /// dropped as [`poll_transmit`](Self::poll_transmit) would drop it).
    fn fail_queued(&mut self, rpc_id: RpcId, failure: RpcFailure, now: Instant) -> bool {
        let Some(Entry::Queued { ticket, .. }) = self.entries.get(&rpc_id) else {
            return false;
        };
        let claimed = ticket.claim();
        let Some(Entry::Queued { tag, body, .. }) = self.entries.remove(&rpc_id) else {
            unreachable!("checked queued above");
        };
        self.queued -= 1;
        self.left_queue(rpc_id, matches!(body, RpcBody::Reset));
        // Its id in the reset or awaited queue goes stale and is skipped when reached.
        self.prefetch.remove(&rpc_id);
        self.compact();
        if !claimed {
            return false;
        }
        if failure == RpcFailure::Transport {
            self.stats.rpcs_failed_transport += 1;
        }
        self.events.push_back((
            WireEvent {
                rpc_id,
                result: Err(failure),
                sent_at: now,
                at: now,
            },
            tag,
        ));
        true
    }

    /// True while `rpc_id` waits for the wire.
    fn is_queued(&self, rpc_id: RpcId) -> bool {
        matches!(self.entries.get(&rpc_id), Some(Entry::Queued { .. }))
    }

    /// The connection was dropped: every RPC on the wire except `keep` (a reset about
    /// to be written to the new connection) fails with [`RpcFailure::Transport`], as
    /// its reply can no longer arrive; queued ones stay queued. Returns how many failed.
    pub fn fail_on_wire(&mut self, keep: Option<RpcId>, now: Instant) -> usize {
        let mut ids: Vec<RpcId> = self
            .entries
            .iter()
            .filter(|(id, e)| Some(**id) != keep && matches!(e, Entry::OnWire { .. }))
            .map(|(id, _)| *id)
            .collect();
        // In id order (the send order), so that the events are deterministic.
        ids.sort_unstable();
        for &rpc_id in &ids {
            self.stats.rpcs_failed_transport += 1;
            self.end(rpc_id, Err(RpcFailure::Transport), now);
        }
        self.consecutive_timeouts = 0;
        ids.len()
    }

    /// Fails every RPC whose deadline is at or before `now` with
    /// [`RpcFailure::TimedOut`], and every lookup queued for `max_pending_age` or longer
    /// with [`RpcFailure::NotSent`] (rule 17). Harmless when early or repeated.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(age) = self.max_pending_age {
            while let Some(&(queued_at, rpc_id)) = self.ages.front() {
                if now.saturating_duration_since(queued_at) < age {
                    break;
                }
                if !self.is_queued(rpc_id) {
                    // Not reached: `settle_ages` keeps the front queued.
                    self.ages.pop_front();
                    self.ages_stale = self.ages_stale.saturating_sub(1);
                } else if self.fail_queued(rpc_id, RpcFailure::NotSent, now) {
                    self.stats.lookups_expired += 1;
                }
            }
        }
        let mut timed_out = 0;
        while let Some((_, rpc_id)) = self.deadlines.pop_due(now) {
            self.stats.rpcs_timed_out += 1;
            timed_out += 1;
            self.end(rpc_id, Err(RpcFailure::TimedOut), now);
        }
        if timed_out > 0 {
            self.consecutive_timeouts += timed_out;
            let k = self.reopen_after_timeouts;
            if k > 0 && self.consecutive_timeouts >= k {
                self.reopen = true;
            }
        }
    }

    fn end(&mut self, rpc_id: RpcId, result: Result<Reply, RpcFailure>, now: Instant) {
        let Some(Entry::OnWire {
            sent_at,
            deadline,
            is_reset,
            tag,
        }) = self.entries.remove(&rpc_id)
        else {
            return;
        };
        self.deadlines.remove(deadline, rpc_id);
        if !is_reset {
            self.lookups_on_wire -= 1;
        }
        self.events.push_back((
            WireEvent {
                rpc_id,
                result,
                sent_at,
                at: now,
            },
            tag,
        ));
    }

    /// The client closed (rule 14): forgets every RPC, queued or on the wire, with no
    /// event; nothing is released afterwards, and replies that still arrive count as
    /// late. Counters are kept.
    pub fn close(&mut self) {
        self.resets.clear();
        self.awaited.clear();
        self.prefetch.clear();
        self.entries.clear();
        self.deadlines.clear();
        self.ages.clear();
        self.ages_stale = 0;
        self.events.clear();
        self.queued = 0;
        self.lookups_on_wire = 0;
        self.consecutive_timeouts = 0;
        self.reopen = false;
    }

    /// The next ended RPC, with the driver's data for it. Carry the event to
    /// [`Lookups::handle_wire_event`](crate::Lookups::handle_wire_event).
    pub fn poll_event(&mut self) -> Option<(WireEvent, T)> {
        self.events.pop_front()
    }

    /// True once after `reopen_after_timeouts` timeouts in a row: drop the connection,
    /// open a new one, and call [`fail_on_wire`](Self::fail_on_wire).
    #[must_use]
    pub fn poll_reopen(&mut self) -> bool {
        std::mem::take(&mut self.reopen)
    }

    /// The earliest deadline of an RPC on the wire, or the instant the oldest queued
    /// lookup reaches `max_pending_age`, whichever comes first.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let expiry = self
            .max_pending_age
            .zip(self.ages.front())
            .map(|(age, &(queued_at, _))| deadline_after(queued_at, age));
        [self.deadlines.next(), expiry].into_iter().flatten().min()
    }

    /// The driver's data of an RPC queued or on the wire.
    pub fn tag_mut(&mut self, rpc_id: RpcId) -> Option<&mut T> {
        match self.entries.get_mut(&rpc_id)? {
            Entry::Queued { tag, .. } | Entry::OnWire { tag, .. } => Some(tag),
        }
    }

    /// When `rpc_id` went on the wire, if it is on the wire now.
    #[must_use]
    pub fn sent_at(&self, rpc_id: RpcId) -> Option<Instant> {
        match self.entries.get(&rpc_id)? {
            Entry::OnWire { sent_at, .. } => Some(*sent_at),
            Entry::Queued { .. } => None,
        }
    }

    /// Counters since construction.
    #[must_use]
    pub fn stats(&self) -> &DispatcherStats {
        &self.stats
    }

    /// RPCs on the wire (lookups and resets).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.entries.len() - self.queued
    }

    /// Lookup RPCs on the wire (what `max_in_flight` bounds).
    #[must_use]
    pub fn lookups_in_flight(&self) -> usize {
        self.lookups_on_wire
    }

    /// Reset RPCs on the wire: while there is one, no lookup is released (rule 13).
    #[must_use]
    pub fn resets_on_wire(&self) -> usize {
        self.in_flight() - self.lookups_on_wire
    }

    /// RPCs waiting for the wire (including cancelled ones not skipped yet).
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Ids held in the send queues, cancelled ones not yet compacted included (bounded
    /// by twice the live entries plus 64).
    #[must_use]
    pub fn queued_ids(&self) -> usize {
        self.resets.len() + self.awaited.len() + self.prefetch.len()
    }

    /// True when an RPC is queued and the wire has room for it.
    #[must_use]
    pub fn can_send(&self) -> bool {
        !self.resets.is_empty()
            || (self.resets_on_wire() == 0
                && self.in_flight() < self.max_in_flight
                && self.queued > 0)
    }
}

#[derive(Clone, Copy)]
enum Queue {
    Resets,
    Awaited,
    Prefetch,
}
