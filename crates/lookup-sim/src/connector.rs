//! The connector: the real `lookup_core::Lookups` and `Dispatcher`, driven on the
//! virtual clock against the modelled lookup server, following the core's call-order
//! contract (after every input: drain `poll_transmit` into the dispatcher, send what
//! it releases, drain `poll_event`, re-read `poll_timeout`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::time::{Duration, Instant};

use lookup_core::{
    Command, Config, Dispatcher, Event, Lookups, Probe, Reply, Request, RequestId, RpcBody, RpcId,
    Stats,
};

use super::budget::RecentLatency;
use super::engine::LookupFigures;
use super::server::LookupServer;
use super::store::ExternalStore;

/// Counters the core does not keep.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConnectorCounts {
    /// Sent lookup RPCs whose answer nobody used: every asker was gone when it ended
    /// (`Event::LookupDone { requests: 0 }`), or it was a request's own prefetch and
    /// that request's local hit already reached the cap at its first probe.
    pub(crate) rpcs_wasted: u64,
    /// RPCs the dispatcher released to the modelled server.
    pub(crate) rpcs_sent: u64,
}

/// `Lookups` + `Dispatcher` + the modelled server, on virtual nanoseconds.
#[derive(Debug)]
pub(crate) struct Connector {
    lookups: Lookups,
    dispatcher: Dispatcher,
    server: LookupServer,
    /// Origin of the virtual clock: the core takes `Instant`s, so virtual nanoseconds
    /// are offsets from this one reading (the simulator's only clock read).
    base: Instant,
    /// Replies the server will deliver: (time, rpc, hit tokens).
    replies: BinaryHeap<Reverse<(u64, RpcId, u32)>>,
    /// Prefetches found useless at their request's first probe, still open.
    useless: HashSet<RpcId>,
    /// Prefetch RPCs whose request has not been probed yet.
    unprobed: HashSet<RpcId>,
    /// Of `unprobed`, those that ended with at least one live asker.
    answered: HashSet<RpcId>,
    counts: ConnectorCounts,
    /// Latencies and keys of the lookups.
    figures: LookupFigures,
    /// The last answered lookups' on-wire times (`prefetch+wait`'s adaptive budget).
    recent: RecentLatency,
}

impl Connector {
    /// # Errors
    /// The core's [`lookup_core::Error::InvalidConfig`].
    pub(crate) fn new(config: Config, server: LookupServer) -> Result<Self, lookup_core::Error> {
        let dispatcher = Dispatcher::new(&config);
        Ok(Self {
            lookups: Lookups::new(config)?,
            dispatcher,
            server,
            base: Instant::now(),
            replies: BinaryHeap::new(),
            useless: HashSet::new(),
            unprobed: HashSet::new(),
            answered: HashSet::new(),
            counts: ConnectorCounts::default(),
            figures: LookupFigures::default(),
            recent: RecentLatency::default(),
        })
    }

    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    pub(crate) fn stats(&self) -> &Stats {
        self.lookups.stats()
    }

    pub(crate) fn counts(&self) -> &ConnectorCounts {
        &self.counts
    }

    pub(crate) fn lookups(&self) -> &LookupFigures {
        &self.figures
    }

    pub(crate) fn recent_on_wire(&self) -> &RecentLatency {
        &self.recent
    }

    /// A request arrived (vLLM `on_new_request`). Returns the RPC its prefetch created,
    /// if it created one (not when it joined another request's RPC).
    pub(crate) fn on_new_request(
        &mut self,
        req: &Request,
        now: u64,
        store: &ExternalStore,
    ) -> Option<RpcId> {
        self.lookups.on_new_request(req, self.at(now));
        let created = self.pump(now, store);
        if let Some(rpc) = created {
            self.unprobed.insert(rpc);
        }
        created
    }

    /// The scheduler reached `req` in the waiting queue with a local hit of
    /// `num_computed_tokens` (vLLM `get_num_new_matched_tokens`).
    pub(crate) fn probe(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        now: u64,
        store: &ExternalStore,
    ) -> Probe {
        let answer = self.lookups.probe(req, num_computed_tokens, self.at(now));
        self.pump(now, store);
        answer
    }

    /// Sync mode (rule 10): the engine thread waits for the answer. Delivers replies in
    /// time order until `req`'s probe is ready; returns it and the time it became ready.
    ///
    /// # Errors
    /// When nothing is left that could answer (a driver bug, never expected: every
    /// pending lookup has an RPC queued, in flight or a deadline).
    pub(crate) fn wait_ready(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        mut now: u64,
        store: &ExternalStore,
    ) -> anyhow::Result<(Probe, u64)> {
        loop {
            let Some(t) = self.next_event() else {
                anyhow::bail!(
                    "sync probe of {} at {now} ns has nothing to wait for",
                    req.request_id
                );
            };
            now = now.max(t);
            self.advance_to(now, store);
            let answer = self.probe(req, num_computed_tokens, now, store);
            if let Probe::Ready { .. } = answer {
                return Ok((answer, now));
            }
        }
    }

    /// `prefetch+wait`: the engine thread waits for `req`'s lookup until `deadline`
    /// (ns) at the latest. Returns the answer and the time the wait ended: `Ready` at
    /// the reply that made it ready, or `Pending` at `deadline` (a real driver cannot
    /// know the reply will be late, so the whole budget is spent).
    pub(crate) fn wait_ready_until(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        mut now: u64,
        deadline: u64,
        store: &ExternalStore,
    ) -> (Probe, u64) {
        while let Some(t) = self.next_event().filter(|&t| t <= deadline) {
            now = now.max(t);
            self.advance_to(now, store);
            let answer = self.probe(req, num_computed_tokens, now, store);
            if let Probe::Ready { .. } = answer {
                return (answer, now);
            }
        }
        (Probe::Pending, deadline.max(now))
    }

    /// The request whose own prefetch is `rpc_id` is probed for the first time;
    /// `useless` when its local hit already reaches the cap (the answer is of no use).
    pub(crate) fn prefetch_probed(&mut self, rpc_id: RpcId, useless: bool) {
        self.unprobed.remove(&rpc_id);
        let answered = self.answered.remove(&rpc_id);
        if useless {
            if answered {
                self.counts.rpcs_wasted += 1;
            } else {
                self.useless.insert(rpc_id);
            }
        }
    }

    pub(crate) fn on_allocated(&mut self, id: RequestId, now: u64, store: &ExternalStore) {
        self.lookups.on_allocated(id);
        self.pump(now, store);
    }

    pub(crate) fn on_finished(&mut self, id: RequestId, now: u64, store: &ExternalStore) {
        self.lookups.on_finished(id);
        self.pump(now, store);
    }

    /// Lookup RPCs queued or on the wire.
    pub(crate) fn open_rpcs(&self) -> usize {
        self.lookups.open_rpcs()
    }

    /// Rule 8's wait for a preempted request's probe (ns; 0: none).
    pub(crate) fn wait_budget(&self, id: RequestId) -> u64 {
        u64::try_from(self.lookups.wait_budget(id).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn on_preempted(&mut self, id: RequestId, now: u64, store: &ExternalStore) {
        self.lookups.on_preempted(id);
        self.pump(now, store);
    }

    /// The next time something happens on the lookup side: a reply or a deadline.
    pub(crate) fn next_event(&self) -> Option<u64> {
        let reply = self.replies.peek().map(|Reverse((t, _, _))| *t);
        let timeout = self
            .dispatcher
            .poll_timeout()
            .map(|d| d.saturating_duration_since(self.base).as_nanos() as u64);
        match (reply, timeout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Delivers every reply and deadline at or before `t`, each at its own time.
    pub(crate) fn advance_to(&mut self, t: u64, store: &ExternalStore) {
        while let Some(next) = self.next_event() {
            if next > t {
                break;
            }
            let reply_due = self
                .replies
                .peek()
                .is_some_and(|Reverse((rt, _, _))| *rt == next);
            if reply_due {
                let Reverse((rt, rpc_id, hit_tokens)) = self.replies.pop().expect("peeked");
                // A late reply (after its timeout) is dropped by the dispatcher.
                let _applied =
                    self.dispatcher
                        .handle_reply(rpc_id, Reply::Lookup { hit_tokens }, self.at(rt));
            } else {
                self.dispatcher.handle_timeout(self.at(next));
            }
            self.pump(next, store);
        }
    }

    /// The driving contract after each input: transmit, send what the dispatcher
    /// releases, read events. Returns the RPC created by this input, if any.
    fn pump(&mut self, now: u64, store: &ExternalStore) -> Option<RpcId> {
        let mut created = None;
        while let Some(cmd) = self.lookups.poll_transmit() {
            if let Command::Send {
                rpc_id,
                body: RpcBody::Lookup { .. },
                ..
            } = &cmd
            {
                created = Some(*rpc_id);
            }
            self.dispatcher.push(cmd, (), self.at(now));
        }
        while let Some(out) = self.dispatcher.poll_transmit(self.at(now)) {
            match &out.body {
                RpcBody::Lookup {
                    num_tokens,
                    block_hashes,
                } => {
                    let served = self.server.accept(*num_tokens, block_hashes, store, now);
                    self.figures.served(*num_tokens, &served.keys);
                    self.replies
                        .push(Reverse((served.done, out.rpc_id, served.hit_tokens)));
                }
                RpcBody::Reset => {
                    // The simulator never resets; answer at once as a server would.
                    let _applied = self.dispatcher.handle_reply(
                        out.rpc_id,
                        Reply::Reset { ok: true },
                        self.at(now),
                    );
                }
            }
        }
        self.counts.rpcs_sent = self.dispatcher.stats().rpcs_sent;
        while let Some((event, ())) = self.dispatcher.poll_event() {
            self.lookups.handle_wire_event(event);
        }
        while let Some(event) = self.lookups.poll_event() {
            if let Event::LookupDone {
                rpc_id,
                outcome,
                requests,
                total,
                on_wire,
                ..
            } = event
            {
                if let lookup_core::LookupOutcome::Failed(_) = outcome {
                    self.figures.failed += 1;
                } else {
                    self.figures.answered += 1;
                    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                    let _ = self.figures.total_us.record(us(total));
                    let w = on_wire;
                    let _ = self.figures.on_wire_us.record(us(w));
                    let _ = self
                        .figures
                        .server_queue_us
                        .record(us(total.saturating_sub(w)));
                    self.recent
                        .record(u64::try_from(w.as_nanos()).unwrap_or(u64::MAX));
                }
                if self.useless.remove(&rpc_id) || requests == 0 {
                    self.counts.rpcs_wasted += 1;
                } else if self.unprobed.contains(&rpc_id) {
                    self.answered.insert(rpc_id);
                }
            }
        }
        created
    }
}
