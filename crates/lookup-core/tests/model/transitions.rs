//! The inputs the model-based test drives: scheduler lifecycle calls, clock jumps and
//! what the fake server does with the RPCs on the wire.

use crate::server::{CHAINS, MAX_TOKENS, Prompt};

/// Index of a request in the test's small pool (`POOL` ids, reused after a finish so
/// that stale state of an earlier request with the same id would show).
pub(crate) type Slot = usize;

/// One step of a test case. Indices into the wire or into the list of ended RPCs are
/// drawn from the reference state; `preconditions` drops the ones a shrink made stale.
#[derive(Clone, Debug)]
pub(crate) enum Transition {
    /// `on_new_request` of a request not alive in the pool slot.
    Arrive { slot: Slot, prompt: Prompt },
    /// `probe` of a live request, after its prompt changed (or not), with a local hit
    /// of `local_blocks` blocks clamped to the rule 12 cap.
    Probe {
        slot: Slot,
        change: PromptChange,
        local_blocks: u32,
    },
    /// `on_allocated` (any slot: unknown requests are a no-op, rule 8).
    Allocated { slot: Slot },
    /// `on_preempted` (any slot).
    Preempted { slot: Slot },
    /// `on_finished` (any slot).
    Finished { slot: Slot },
    /// `reset` (rule 13).
    Reset,
    /// `close` (rule 14).
    Close,
    /// The clock moves forward `ms` milliseconds; expired deadlines are handled.
    Advance { ms: u64 },
    /// The clock jumps to the earliest RPC deadline (`poll_timeout`), if any.
    FireTimeout,
    /// The server answers the RPC at `wire_index`. With `duplicate` the RPC stays on the
    /// wire, so it can be answered again.
    Answer {
        wire_index: usize,
        value: ReplyValue,
        duplicate: bool,
    },
    /// The transport fails the RPC at `wire_index`.
    TransportError { wire_index: usize },
    /// The server drops the RPC at `wire_index` silently: only its timeout ends it.
    Lose { wire_index: usize },
    /// A reply (or a transport error when `value` is `None`) for an id that is no
    /// longer open: an ended or cancelled RPC, or one never created.
    DeadReply {
        target: DeadTarget,
        value: Option<ReplyValue>,
    },
    /// The driver reopens its socket: every RPC on the wire fails (transport) and none
    /// of their replies will come (rule 17).
    Reopen,
}

/// How a probe's prompt relates to the request's current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PromptChange {
    /// The same prompt.
    Same,
    /// The prompt grew by `tokens` (the chain is extended, its prefix kept).
    Grow { tokens: u32 },
    /// Another chain at the same token count (`shift` picks it among the others).
    Rechain { shift: u8 },
}

impl PromptChange {
    /// The prompt after this change.
    pub(crate) fn apply(self, prompt: Prompt) -> Prompt {
        match self {
            Self::Same => prompt,
            Self::Grow { tokens } => Prompt {
                num_tokens: (prompt.num_tokens + tokens).min(MAX_TOKENS),
                ..prompt
            },
            Self::Rechain { shift } => Prompt {
                chain: (prompt.chain + shift) % CHAINS,
                ..prompt
            },
        }
    }
}

/// What the fake server puts in a reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplyValue {
    /// What `spec/wire.md` says the server computes for the question.
    Right,
    /// `blocks` whole blocks, at most the aligned token count: valid, maybe wrong.
    Valid { blocks: u32 },
    /// The aligned token count itself, which may reach `num_tokens` (rule 12's guard).
    FullPrompt,
    /// One block more than the aligned token count: above `num_tokens` (rule 11).
    TooHigh,
    /// Not a multiple of the block size, at most `num_tokens` (rule 11).
    NotMultiple { blocks: u32 },
    /// Bytes that did not decode.
    Malformed,
    /// A reset reply (`0x01` when `ok`).
    ResetReply { ok: bool },
}

/// Which dead id a [`Transition::DeadReply`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadTarget {
    /// The `i`-th RPC that ended or was cancelled (oldest first).
    Ended(usize),
    /// An id the client has not created (and will not within a test).
    Never,
}
