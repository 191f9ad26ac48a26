//! The send queue a driver keeps beside its socket.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::{Command, Config, Priority, RpcBody, RpcId, Ticket};

/// An RPC released for sending by [`Dispatcher::next_send`]: its ticket is already
/// claimed, so it must go on the wire now.
#[must_use]
#[derive(Clone, Debug)]
pub struct Outgoing {
    /// The RPC's id (envelope frame on the wire).
    pub rpc_id: RpcId,
    /// What to send.
    pub body: RpcBody,
}

#[derive(Debug)]
struct Queued {
    priority: Priority,
    body: RpcBody,
    ticket: Ticket,
}

/// Orders [`Command`]s for the wire: resets first, then lookups a probe awaits, then
/// prefetches, FIFO within each class (rule 15; with `lookup_priority = false` one
/// FIFO, vLLM's single worker). At most `max_in_flight` lookups are released until
/// [`on_done`](Self::on_done) reports their end; resets bypass that limit so that a
/// reset is never stuck behind a hung lookup.
///
/// Sans-IO like [`Lookups`](crate::Lookups). Cancelled RPCs are skipped at the latest
/// when their turn comes (their [`Ticket`] decides), so a dead request's lookup never
/// occupies the wire (rule 8).
#[derive(Debug)]
pub struct Dispatcher {
    priority: bool,
    max_in_flight: usize,
    resets: VecDeque<RpcId>,
    awaited: VecDeque<RpcId>,
    prefetch: VecDeque<RpcId>,
    queued: HashMap<RpcId, Queued>,
    in_flight: HashSet<RpcId>,
}

impl Dispatcher {
    /// A dispatcher with `config.max_in_flight` and `config.lookup_priority`.
    #[must_use]
    pub fn new(config: &Config) -> Self {
        Self {
            priority: config.lookup_priority,
            max_in_flight: config.max_in_flight.max(1) as usize,
            resets: VecDeque::new(),
            awaited: VecDeque::new(),
            prefetch: VecDeque::new(),
            queued: HashMap::new(),
            in_flight: HashSet::new(),
        }
    }

    /// Takes one command from [`Lookups::poll_transmit`](crate::Lookups::poll_transmit).
    pub fn push(&mut self, command: Command) {
        match command {
            Command::Send {
                rpc_id,
                priority,
                body,
                ticket,
            } => {
                let queue = match (&body, priority) {
                    (RpcBody::Reset, _) => &mut self.resets,
                    (_, Priority::Awaited) if self.priority => &mut self.awaited,
                    _ => &mut self.prefetch,
                };
                queue.push_back(rpc_id);
                self.queued.insert(
                    rpc_id,
                    Queued {
                        priority,
                        body,
                        ticket,
                    },
                );
            }
            Command::Promote { rpc_id } => {
                if !self.priority {
                    return;
                }
                if let Some(q) = self.queued.get_mut(&rpc_id) {
                    if q.priority == Priority::Prefetch {
                        q.priority = Priority::Awaited;
                        // The old entry in `prefetch` is skipped when reached.
                        self.awaited.push_back(rpc_id);
                    }
                }
            }
            Command::Cancel { rpc_id } => {
                self.queued.remove(&rpc_id);
                // Cancelled ids stay in the queues until reached; compact once they
                // outnumber live entries, so a hung wire cannot grow them unbounded.
                let ids = self.resets.len() + self.awaited.len() + self.prefetch.len();
                if ids > 2 * self.queued.len() + 64 {
                    let queued = &self.queued;
                    for q in [&mut self.resets, &mut self.awaited, &mut self.prefetch] {
                        q.retain(|id| queued.contains_key(id));
                    }
                }
            }
        }
    }

    /// The next RPC to write to the socket, if one is queued and the wire has room.
    /// Its ticket is claimed: send it now, and call [`on_done`](Self::on_done) when it
    /// ends (reply, timeout, error).
    pub fn next_send(&mut self) -> Option<Outgoing> {
        if let Some(out) = Self::pop(&mut self.resets, &mut self.queued) {
            self.in_flight.insert(out.rpc_id);
            return Some(out);
        }
        if self.in_flight.len() >= self.max_in_flight {
            return None;
        }
        // A promoted RPC sits in both queues; `awaited` is drained first, and whichever
        // place is reached first sends it (the other finds it gone and skips it).
        let out = Self::pop(&mut self.awaited, &mut self.queued)
            .or_else(|| Self::pop(&mut self.prefetch, &mut self.queued))?;
        self.in_flight.insert(out.rpc_id);
        Some(out)
    }

    fn pop(queue: &mut VecDeque<RpcId>, queued: &mut HashMap<RpcId, Queued>) -> Option<Outgoing> {
        while let Some(rpc_id) = queue.pop_front() {
            let Some(q) = queued.remove(&rpc_id) else {
                continue;
            };
            if q.ticket.claim() {
                return Some(Outgoing {
                    rpc_id,
                    body: q.body,
                });
            }
        }
        None
    }

    /// A released RPC ended (reply, timeout, transport error): its wire slot is free.
    /// Unknown or repeated ids are ignored.
    pub fn on_done(&mut self, rpc_id: RpcId) {
        self.in_flight.remove(&rpc_id);
    }

    /// Forgets every RPC on the wire (the socket was reopened; their replies will not
    /// come) and returns their ids, so the driver can report them failed.
    pub fn reset_in_flight(&mut self) -> Vec<RpcId> {
        self.in_flight.drain().collect()
    }

    /// RPCs released and not yet done.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// RPCs waiting for the wire (including cancelled ones not skipped yet).
    #[must_use]
    pub fn queued(&self) -> usize {
        self.queued.len()
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
            || (self.in_flight.len() < self.max_in_flight && !self.queued.is_empty())
    }
}
