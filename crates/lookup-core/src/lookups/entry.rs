//! What `Lookups` keeps per request and per RPC: the question an RPC asks
//! ([`ShareKey`]), where a request's lookup is ([`LookupState`]), and the request and
//! RPC records.

use std::time::Instant;

use bytes::Bytes;

use crate::{Answer, BlockHashes, RequestId, RpcId, Ticket};

/// What identifies the question an RPC asks: equal keys get equal answers, so they
/// may share one RPC (rule 16), and a reply is applied only to requests whose
/// current key is this one (rule 7).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ShareKey {
    pub(super) num_tokens: u32,
    pub(super) hash_len: u16,
    pub(super) num_hashes: usize,
    pub(super) last_hash: Bytes,
}

impl ShareKey {
    pub(super) fn new(num_tokens: u32, hashes: &BlockHashes) -> Self {
        let n = usize::from(hashes.hash_len());
        let len = hashes.as_bytes().len();
        Self {
            num_tokens,
            hash_len: hashes.hash_len(),
            num_hashes: hashes.len(),
            last_hash: hashes.as_bytes().slice(len.saturating_sub(n)..),
        }
    }
}

/// Where a request's lookup is (CONTRIBUTING.md rule 6: each phase carries its own data).
#[derive(Debug)]
pub(super) enum LookupState {
    /// Its RPC is queued or in flight.
    Waiting {
        rpc_id: RpcId,
        num_tokens: u32,
        block_hashes: BlockHashes,
        /// An arrival-time lookup holds one prefetch slot (rule 3).
        holds_slot: bool,
        /// This request probed while waiting: a probe waits for the RPC (rule 15).
        awaited: bool,
    },
    /// The answer is in (already validated: rule 11).
    Done {
        num_tokens: u32,
        block_hashes: BlockHashes,
        answer: Answer,
        replied_at: Instant,
        /// A probe of this request waited for it and has not read it yet: the next
        /// probe reads it whatever its age (rules 6 and 10: a probe answers with the
        /// reply it waited for; the TTL only ages results already read or never
        /// waited for).
        owed: bool,
    },
}

impl LookupState {
    /// The question this lookup asks: the prompt's token count and block hashes.
    fn asked(&self) -> (u32, &BlockHashes) {
        match self {
            Self::Waiting {
                num_tokens,
                block_hashes,
                ..
            }
            | Self::Done {
                num_tokens,
                block_hashes,
                ..
            } => (*num_tokens, block_hashes),
        }
    }

    /// True when this lookup asks exactly about the prompt `(num_tokens, hashes)`
    /// (rule 7).
    pub(super) fn asks(&self, num_tokens: u32, hashes: &BlockHashes) -> bool {
        let (n, h) = self.asked();
        n == num_tokens && h.same_chain(hashes)
    }

    /// True when the prompt `(num_tokens, hashes)` extends the one this lookup asks
    /// about: at least as many tokens, and a chain whose first hashes are this
    /// lookup's (chained hashes: equal at the last one asked means equal before it).
    /// So the stored prefix this lookup reports is a hit of that prompt too (rule 8,
    /// `keep`).
    pub(super) fn extended_by(&self, num_tokens: u32, hashes: &BlockHashes) -> bool {
        let (n, h) = self.asked();
        n <= num_tokens
            && h.hash_len() == hashes.hash_len()
            && !h.is_empty()
            && hashes.len() >= h.len()
            && hashes.get(h.len() - 1) == h.last()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FirstProbe {
    NotYet,
    Ready,
    Pending,
}

#[derive(Debug)]
pub(super) struct RequestEntry {
    pub(super) eligible: bool,
    pub(super) first_probe: FirstProbe,
    pub(super) lookup: Option<LookupState>,
    /// What the last `Ready` answer rested on.
    pub(super) last_answer: Option<Answer>,
    /// The last arrival or probe of it ([`Lookups::end_idle`]).
    pub(super) last_seen: Instant,
    /// Its last lookup failed (rule 11), and it was not allocated, preempted or reset
    /// since: its next lookup is a retry, under the failure backoff, whatever its
    /// prompt is by then.
    pub(super) failed: bool,
    /// Where it is in rule 8's preemption policy (`lookup_on_preemption`).
    pub(super) preemption: Preemption,
}

/// Rule 8's preemption policy, per request (CONTRIBUTING.md rule 6: one enum, no parallel
/// booleans).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Preemption {
    /// Not preempted since its last allocation (or never allocated).
    #[default]
    None,
    /// Allocated under `keep` or `keep_wait` with a usable result, which is kept for
    /// a preemption; its next probe without one (a reschedule after a failed load)
    /// drops it and looks up again, as `discard` would have at allocation.
    Retained,
    /// Preempted and not allocated since, under a value other than `discard`: a probe
    /// may read a kept lookup of a shorter prompt (`keep`) and is waited for
    /// (`wait`, [`Lookups::wait_budget`](crate::Lookups::wait_budget)).
    Preempted,
}

#[derive(Debug)]
pub(super) enum RpcKind {
    Lookup { key: ShareKey },
    Reset,
}

#[derive(Debug)]
pub(super) struct Rpc {
    pub(super) kind: RpcKind,
    /// Whether it went on the wire is the ticket's to say (rule 9); the wire's own
    /// state (deadline, send time) is the driver's `Dispatcher`'s.
    pub(super) ticket: Ticket,
    /// In the awaited send class (rule 15).
    pub(super) awaited: bool,
    /// Subscribers that probed it (their `LookupState::Waiting::awaited`): while
    /// any is left, the RPC stays awaited; when the last is discarded, it is
    /// demoted (rule 15: priority follows the probes currently waiting).
    pub(super) awaiting: u32,
    /// Live requests waiting for this answer.
    pub(super) subscribers: Vec<RequestId>,
    /// Prefetch slots this RPC holds until it ends (rule 3), including those of
    /// requests discarded after it was sent.
    pub(super) slots: u32,
    pub(super) submitted_at: Instant,
}
