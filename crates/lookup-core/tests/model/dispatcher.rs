//! The wire half of the reference model: the driver's `Dispatcher` (send order,
//! `max_in_flight`, deadlines, late replies, reopen) and the driver's writes, as
//! plainly as possible. Each RPC's end reaches the lifecycle half (`reference.rs`)
//! through [`RefState::end_rpc`].

use lookup_core::{RpcBody, RpcFailure, RpcId};

use crate::reference::{Asks, End, RefState};
use crate::server;
use crate::transitions::{ReplyValue, WriteFailure};

/// An RPC released by the dispatcher, as the driver and the fake server see it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WireRpc {
    pub(crate) rpc_id: RpcId,
    pub(crate) body: RpcBody,
}

impl RefState {
    /// Rule 17: the earliest deadline of an RPC on the wire (released and not ended).
    pub(crate) fn next_deadline(&self) -> Option<u128> {
        self.rpcs
            .values()
            .filter_map(|r| r.sent.map(|(_, deadline)| deadline))
            .min()
    }

    /// What the driver's loop does after an input: release what the dispatcher may,
    /// and fail at once what is due (a deadline at or before now, which a timeout that
    /// rounds to 0 ns gives the RPC it just released), until nothing changes.
    pub(crate) fn settle(&mut self) {
        self.expire();
        loop {
            self.pump();
            if !self.expire() {
                break;
            }
        }
    }

    /// Rule 17: every RPC whose deadline has passed fails, in deadline order (then id
    /// order). True when any did.
    fn expire(&mut self) -> bool {
        let mut due: Vec<(u128, u64)> = self
            .rpcs
            .iter()
            .filter_map(|(id, r)| r.sent.map(|(_, deadline)| (deadline, *id)))
            .filter(|(deadline, _)| *deadline <= self.now_ns)
            .collect();
        due.sort_unstable();
        for &(_, id) in &due {
            self.dispatcher_in_flight.remove(&id);
            self.counters.rpcs_timed_out += 1;
            self.end_rpc(id, End::Failure(RpcFailure::TimedOut));
        }
        !due.is_empty()
    }

    /// The driver's dispatcher releases what it may: resets at once, then lookups a
    /// probe awaits, then prefetches (rule 15; one FIFO without priority), while fewer
    /// than `max_in_flight` RPCs are on the wire and no reset is (rule 13's barrier).
    /// Each deadline runs from its release.
    fn pump(&mut self) {
        if self.closed {
            return;
        }
        loop {
            let queued = || self.rpcs.iter().filter(|(_, r)| r.sent.is_none());
            let reset = queued()
                .find(|(_, r)| r.asks == Asks::Reset)
                .map(|(id, _)| *id);
            // Rule 13: no lookup goes on the wire beside a reset, whatever
            // `max_in_flight` is.
            let barrier = self
                .rpcs
                .values()
                .any(|r| r.asks == Asks::Reset && r.sent.is_some());
            let room =
                !barrier && self.dispatcher_in_flight.len() < self.settings.max_in_flight as usize;
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
            let deadline = self.clock.deadline(self.now_ns, self.timeout_ns);
            let shape = self.settings.shape;
            let r = self.rpcs.get_mut(&next).expect("open");
            debug_assert!(r.asks == Asks::Reset || !r.subscribers.is_empty());
            r.sent = Some((self.now_ns, deadline));
            self.dispatcher_in_flight.insert(next);
            self.counters.rpcs_sent += 1;
            let released = WireRpc {
                rpc_id: RpcId(next),
                body: r.asks.body(shape),
            };
            if self.settings.deferred_writes {
                self.unwritten.push(released);
            } else {
                self.wire.push(released);
            }
        }
    }

    /// A reply for `rpc` reaches the driver's dispatcher: applied when the RPC is on
    /// the wire (released and not ended), else dropped and counted as late.
    pub(crate) fn deliver(&mut self, rpc: u64, value: ReplyValue, body: Option<&RpcBody>) {
        let reply = server::reply(self.settings.shape, value, body);
        if self.dispatcher_in_flight.remove(&rpc) {
            self.end_rpc(rpc, End::Reply(reply));
        } else {
            self.counters.late_replies += 1;
        }
    }

    /// `handle_send_failed`: an RPC on the wire ends with `failure`; any other id is
    /// ignored.
    pub(crate) fn send_failed(&mut self, rpc: u64, failure: RpcFailure) {
        if self.dispatcher_in_flight.remove(&rpc) {
            if failure == RpcFailure::Transport {
                self.counters.rpcs_failed_transport += 1;
            }
            self.end_rpc(rpc, End::Failure(failure));
        }
    }

    /// The driver writes the unwritten RPC at `index`: the server sees it.
    pub(crate) fn write(&mut self, index: usize) {
        let rpc = self.unwritten.remove(index);
        self.wire.push(rpc);
    }

    /// The write of the unwritten RPC at `index` failed.
    pub(crate) fn write_failed(&mut self, index: usize, failure: WriteFailure) {
        let rpc = self.unwritten.remove(index);
        self.send_failed(rpc.rpc_id.0, failure.rpc_failure());
    }

    /// A reply for the unwritten RPC at `index` arrives before its write.
    pub(crate) fn early_reply(&mut self, index: usize, value: ReplyValue) {
        let rpc = self.unwritten[index].clone();
        self.deliver(rpc.rpc_id.0, value, Some(&rpc.body));
    }

    /// The driver reopens its socket (`fail_on_wire(keep)`): every RPC on the wire but
    /// `keep` fails (transport), in id order; what it had not written goes with the old
    /// socket. `keep` (a reset) stays where it was, written or not: the driver writes it
    /// to the new connection.
    pub(crate) fn reopen(&mut self, keep: Option<u64>) {
        let kept = |v: &mut Vec<WireRpc>| v.retain(|w| Some(w.rpc_id.0) == keep);
        kept(&mut self.wire);
        kept(&mut self.unwritten);
        for id in std::mem::take(&mut self.dispatcher_in_flight) {
            if Some(id) == keep {
                self.dispatcher_in_flight.insert(id);
                continue;
            }
            self.counters.rpcs_failed_transport += 1;
            self.end_rpc(id, End::Failure(RpcFailure::Transport));
        }
    }

    /// The oldest reset released to the wire and not ended.
    pub(crate) fn oldest_reset_released(&self) -> Option<u64> {
        self.dispatcher_in_flight
            .iter()
            .copied()
            .find(|id| self.rpcs.get(id).is_some_and(|r| r.asks == Asks::Reset))
    }
}
