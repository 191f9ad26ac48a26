//! Properties the harness checks from what the driver and the fake server saw, beside
//! the reference model (so that a model that agreed with the core on a wrong answer
//! would still be caught):
//!
//! - **Reset is a barrier** (rule 13): the store is versioned by the resets the server
//!   served (a reset answered `ok`, or a replaced server, whose store starts empty). A
//!   reply computed before a reset was served is never applied, as a hit or a miss, to a
//!   lookup submitted after that `reset()`, unless the reset's failure had been reported
//!   (`ResetDone` not `Ok`) before the lookup went on the wire: then the store's state
//!   is the caller's to judge.
//! - **No RPC outlives its timeout** (rule 17): once the driver's loop settled, no RPC
//!   released to the wire is still open at or past `lookup_timeout_s` after its
//!   release, whether its connection dropped, was replaced or its server stays silent,
//!   so no probe waits on one longer.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use lookup_core::timer::deadline_after;
use lookup_core::{Event, LookupOutcome, Reply, ResetOutcome, RpcBody, RpcId, WireEvent};

/// What the harness learns of each lookup RPC for the reset property.
#[derive(Debug)]
struct LookupSeen {
    /// Resets created before it (a prefix of [`Watch::resets`]).
    after_resets: usize,
    /// Those of them whose failure was reported before it was released.
    excused: HashSet<RpcId>,
    /// Resets served when the reply applied to it was computed.
    computed_after: Option<HashSet<RpcId>>,
}

/// The harness's own record of resets, lookups and deadlines.
#[derive(Debug)]
pub(crate) struct Watch {
    timeout: Duration,
    /// Every reset RPC created, in order.
    resets: Vec<RpcId>,
    /// Resets the store has been through (served `ok`, or wiped by a replaced server).
    served: HashSet<RpcId>,
    /// Resets that ended with a failure (`Failed` or `TimedOut`).
    failed: HashSet<RpcId>,
    lookups: HashMap<RpcId, LookupSeen>,
    /// RPCs released and not ended: their deadline, and whether each is a reset.
    open: BTreeMap<RpcId, (Instant, bool)>,
}

impl Watch {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            resets: Vec::new(),
            served: HashSet::new(),
            failed: HashSet::new(),
            lookups: HashMap::new(),
            open: BTreeMap::new(),
        }
    }

    /// The core created `rpc_id` asking `body`.
    pub(crate) fn created(&mut self, rpc_id: RpcId, body: &RpcBody) {
        match body {
            RpcBody::Reset => self.resets.push(rpc_id),
            RpcBody::Lookup { .. } => {
                let seen = LookupSeen {
                    after_resets: self.resets.len(),
                    excused: HashSet::new(),
                    computed_after: None,
                };
                self.lookups.insert(rpc_id, seen);
            }
        }
    }

    /// The dispatcher released `rpc_id` at `now`.
    pub(crate) fn released(&mut self, rpc_id: RpcId, body: &RpcBody, now: Instant) {
        let is_reset = matches!(body, RpcBody::Reset);
        self.open
            .insert(rpc_id, (deadline_after(now, self.timeout), is_reset));
        if let Some(seen) = self.lookups.get_mut(&rpc_id) {
            seen.excused = self.resets[..seen.after_resets]
                .iter()
                .filter(|r| self.failed.contains(r))
                .copied()
                .collect();
        }
    }

    /// The server answered `rpc_id` (asked `body`) with `reply`; `applied` when the
    /// dispatcher took it.
    pub(crate) fn answered(&mut self, rpc_id: RpcId, body: &RpcBody, reply: &Reply, applied: bool) {
        match (body, reply) {
            (RpcBody::Reset, Reply::Reset { ok: true }) => {
                self.served.insert(rpc_id);
            }
            (RpcBody::Lookup { .. }, _) if applied => {
                if let Some(seen) = self.lookups.get_mut(&rpc_id) {
                    seen.computed_after = Some(self.served.clone());
                }
            }
            _ => {}
        }
    }

    /// The server was replaced: its store starts empty, after every reset so far.
    pub(crate) fn server_replaced(&mut self) {
        self.served.extend(self.resets.iter().copied());
    }

    /// The oldest reset released and not ended.
    pub(crate) fn oldest_open_reset(&self) -> Option<RpcId> {
        self.open
            .iter()
            .find(|(_, (_, is_reset))| *is_reset)
            .map(|(id, _)| *id)
    }

    /// The dispatcher ended an RPC. A reset that ended any other way than `ok` failed
    /// (its `ResetDone` says so in the same pass of the driver's loop, before anything
    /// else is released).
    pub(crate) fn ended(&mut self, event: &WireEvent) {
        let rpc_id = event.rpc_id();
        if let Some((_, true)) = self.open.remove(&rpc_id) {
            if !matches!(event.result(), Ok(Reply::Reset { ok: true })) {
                self.failed.insert(rpc_id);
            }
        }
    }

    /// The driver's I/O task ended (close): nothing it held is open any more.
    pub(crate) fn closed(&mut self) {
        self.open.clear();
    }

    /// The core's events of one step: resets that failed are noted; every lookup
    /// answered from the store is checked against the resets before it.
    pub(crate) fn events(&mut self, events: &[Event]) {
        for event in events {
            match event {
                Event::ResetDone { rpc_id, outcome } => {
                    assert_eq!(
                        self.failed.contains(rpc_id),
                        *outcome != ResetOutcome::Ok,
                        "{rpc_id}: {outcome:?}"
                    );
                }
                Event::LookupDone {
                    rpc_id,
                    outcome: LookupOutcome::Hit { .. } | LookupOutcome::Miss,
                    requests,
                    ..
                } if *requests > 0 => self.check_barrier(*rpc_id),
                _ => {}
            }
        }
    }

    fn check_barrier(&self, rpc_id: RpcId) {
        let seen = &self.lookups[&rpc_id];
        let computed = seen
            .computed_after
            .as_ref()
            .unwrap_or_else(|| panic!("{rpc_id} answered without a server reply"));
        for reset in &self.resets[..seen.after_resets] {
            assert!(
                computed.contains(reset) || seen.excused.contains(reset),
                "rule 13: {rpc_id}, submitted after reset {reset}, was answered from the \
                 store before that reset was served"
            );
        }
    }

    /// Rule 17, after the driver's loop settled at `now`.
    pub(crate) fn check_deadlines(&self, now: Instant) {
        let late: BTreeSet<RpcId> = self
            .open
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            late.is_empty(),
            "rule 17: {late:?} still open at or past their timeout"
        );
    }
}
