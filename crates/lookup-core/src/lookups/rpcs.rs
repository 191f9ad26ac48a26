//! The RPC bookkeeping of [`Lookups`]: a lookup is submitted or joins an identical
//! one (rule 16), is promoted and demoted (rule 15), detached from its request
//! (rules 8-9), and finished with its outcome (rules 7 and 11).

use std::time::Instant;

use super::Lookups;
use super::entry::{LookupState, Rpc, RpcKind, ShareKey};
use crate::timer::deadline_after;
use crate::{
    Answer, BlockHashes, Command, Event, LookupOutcome, Observe, Origin, RequestId, RpcBody,
    RpcFailure, RpcId, Ticket, TicketState,
};

impl<O: Observe> Lookups<O> {
    pub(super) fn new_rpc_id(&mut self) -> RpcId {
        let id = RpcId(self.next_rpc);
        self.next_rpc += 1;
        self.stats.rpcs_created += 1;
        id
    }

    pub(super) fn submit(
        &mut self,
        request_id: RequestId,
        num_tokens: u32,
        hashes: &BlockHashes,
        origin: Origin,
        now: Instant,
    ) -> RpcId {
        let key = ShareKey::new(num_tokens, hashes);
        let holds_slot = origin == Origin::Arrival;
        match origin {
            Origin::Arrival => self.stats.lookups_arrival += 1,
            Origin::Probe => self.stats.lookups_probe += 1,
        }
        if holds_slot {
            self.slots_in_use += 1;
        }
        let existing = if self.config.lookup_share {
            self.shared.get(&key).copied()
        } else {
            None
        };
        let rpc_id = if let Some(rpc_id) = existing {
            let rpc = self
                .rpcs
                .get_mut(&rpc_id)
                .expect("shared map only names open RPCs");
            rpc.subscribers.push(request_id);
            if holds_slot {
                rpc.slots += 1;
            }
            self.stats.rpcs_shared += 1;
            self.observer.lookup_shared(rpc_id, request_id);
            if origin == Origin::Probe {
                self.await_rpc(rpc_id);
            }
            rpc_id
        } else {
            let rpc_id = self.new_rpc_id();
            let ticket = Ticket::counted(&self.backlog);
            self.rpcs.insert(
                rpc_id,
                Rpc {
                    kind: RpcKind::Lookup { key: key.clone() },
                    ticket: ticket.clone(),
                    awaited: origin == Origin::Probe,
                    awaiting: u32::from(origin == Origin::Probe),
                    subscribers: vec![request_id],
                    slots: u32::from(holds_slot),
                    submitted_at: now,
                },
            );
            if self.config.lookup_share {
                self.shared.insert(key, rpc_id);
            }
            self.observer
                .lookup_submitted(rpc_id, request_id, origin, num_tokens, hashes.len());
            self.transmits.push_back(Command::Send {
                rpc_id,
                origin,
                body: RpcBody::Lookup {
                    num_tokens,
                    block_hashes: hashes.clone(),
                },
                ticket,
            });
            rpc_id
        };
        if let Some(entry) = self.requests.get_mut(&request_id) {
            entry.lookup = Some(LookupState::Waiting {
                rpc_id,
                num_tokens,
                block_hashes: hashes.clone(),
                holds_slot,
                awaited: origin == Origin::Probe,
            });
        }
        rpc_id
    }

    /// Rule 15: one more subscriber of `rpc_id` probed it.
    pub(super) fn await_rpc(&mut self, rpc_id: RpcId) {
        if let Some(rpc) = self.rpcs.get_mut(&rpc_id) {
            rpc.awaiting += 1;
        }
        self.promote(rpc_id);
    }

    /// Rule 15: a probe waits for `rpc_id`; if it is queued and not awaited, send it
    /// before the prefetches.
    pub(super) fn promote(&mut self, rpc_id: RpcId) {
        if !self.config.lookup_priority {
            return;
        }
        if let Some(rpc) = self.rpcs.get_mut(&rpc_id) {
            if !rpc.awaited && rpc.ticket.state() == TicketState::Queued {
                rpc.awaited = true;
                self.stats.promotions += 1;
                self.transmits.push_back(Command::Promote { rpc_id });
            }
        }
    }

    /// Rules 8-9: detaches the request from its lookup. A slot of a lookup not yet
    /// sent is freed now; of one on the wire, when its RPC ends (rule 3). An RPC
    /// nobody waits for any more is cancelled if it was not sent.
    pub(super) fn discard_lookup(&mut self, request_id: RequestId) {
        self.detach(request_id, true);
    }

    /// [`discard_lookup`](Self::discard_lookup); `demote` false when every lookup is
    /// being dropped at once (reset), so that no demotion is sent for an RPC about to
    /// be cancelled.
    pub(super) fn detach(&mut self, request_id: RequestId, demote: bool) {
        let Some(entry) = self.requests.get_mut(&request_id) else {
            return;
        };
        let Some(LookupState::Waiting {
            rpc_id,
            holds_slot,
            awaited,
            ..
        }) = entry.lookup.take()
        else {
            return;
        };
        let Some(rpc) = self.rpcs.get_mut(&rpc_id) else {
            return;
        };
        if let Some(i) = rpc.subscribers.iter().position(|r| *r == request_id) {
            rpc.subscribers.swap_remove(i);
        }
        if awaited {
            rpc.awaiting -= 1;
        }
        if rpc.subscribers.is_empty() && rpc.ticket.cancel() {
            let rpc = self.take_rpc(rpc_id).expect("present");
            debug_assert!(rpc.slots >= u32::from(holds_slot));
            self.stats.rpcs_cancelled += 1;
            self.observer.lookup_cancelled(rpc_id, rpc.submitted_at);
            self.transmits.push_back(Command::Cancel { rpc_id });
            return;
        }
        let queued = rpc.ticket.state() == TicketState::Queued;
        if holds_slot && queued {
            rpc.slots -= 1;
            self.slots_in_use -= 1;
        }
        // Rule 15: the last probe waiting for it is gone; those left only arrived.
        if demote && queued && rpc.awaited && rpc.awaiting == 0 && self.config.lookup_priority {
            rpc.awaited = false;
            self.stats.demotions += 1;
            self.transmits.push_back(Command::Demote { rpc_id });
        }
    }

    /// Removes an RPC and everything pointing at it except its subscribers' states;
    /// frees its slots.
    pub(super) fn take_rpc(&mut self, rpc_id: RpcId) -> Option<Rpc> {
        let rpc = self.rpcs.remove(&rpc_id)?;
        self.slots_in_use -= rpc.slots;
        if self.retrying == Some(rpc_id) {
            self.retrying = None;
        }
        if let RpcKind::Lookup { key } = &rpc.kind {
            if self.shared.get(key) == Some(&rpc_id) {
                self.shared.remove(key);
            }
        }
        Some(rpc)
    }

    pub(super) fn finish_lookup(
        &mut self,
        rpc_id: RpcId,
        rpc: Rpc,
        outcome: LookupOutcome,
        sent_at: Instant,
        now: Instant,
    ) {
        match outcome {
            LookupOutcome::Hit { .. } => self.stats.hits += 1,
            LookupOutcome::Miss => self.stats.misses += 1,
            LookupOutcome::Malformed => self.stats.failed_malformed += 1,
            LookupOutcome::Failed(RpcFailure::TimedOut) => self.stats.failed_timed_out += 1,
            LookupOutcome::Failed(RpcFailure::StoreUnavailable) => {
                self.stats.failed_store_unavailable += 1;
            }
            LookupOutcome::Failed(RpcFailure::Transport | RpcFailure::NotSent) => {
                self.stats.failed_transport += 1;
            }
        }
        let answer = Answer::of(outcome);
        if answer.is_unavailable() {
            // Rule 11: failed requests retry no sooner than this.
            self.retry_at = Some(deadline_after(now, self.retry_backoff.next_delay()));
        } else {
            self.retry_backoff.reset();
            self.retry_at = None;
        }
        let mut answered = 0;
        let mut request_ids = Vec::new();
        for request_id in &rpc.subscribers {
            let Some(entry) = self.requests.get_mut(request_id) else {
                continue;
            };
            // Subscribers always wait on this RPC (discard and refresh detach them),
            // so the reply answers exactly the question each one asked (rule 7).
            let Some(LookupState::Waiting {
                rpc_id: waiting_on,
                num_tokens,
                block_hashes,
                awaited,
                ..
            }) = entry.lookup.take()
            else {
                continue;
            };
            debug_assert_eq!(waiting_on, rpc_id);
            entry.failed = answer.is_unavailable();
            entry.lookup = Some(LookupState::Done {
                num_tokens,
                block_hashes,
                answer,
                replied_at: now,
                owed: awaited,
            });
            answered += 1;
            request_ids.push(*request_id);
        }
        request_ids.sort_unstable();
        if answered == 0 {
            self.stats.replies_stale += 1;
        }
        self.emit(Event::LookupDone {
            rpc_id,
            outcome,
            requests: answered,
            request_ids,
            total: now.saturating_duration_since(rpc.submitted_at),
            queue_wait: sent_at.saturating_duration_since(rpc.submitted_at),
            on_wire: now.saturating_duration_since(sent_at),
        });
    }
}
