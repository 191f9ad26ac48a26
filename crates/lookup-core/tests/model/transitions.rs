//! The inputs the model-based test drives: scheduler lifecycle calls, clock jumps,
//! what the driver does with the RPCs its dispatcher released, and what the fake
//! server does with the RPCs on the wire.

use lookup_core::RpcFailure;

use crate::server::{CHAINS, MAX_BLOCKS, Prompt, Shape};

/// Index of a request in the test's small pool (ids reused after a finish so that
/// stale state of an earlier request with the same id would show).
pub(crate) type Slot = usize;

/// One step of a test case. Indices into the wire or into the list of ended RPCs are
/// drawn from the reference state; `preconditions` drops the ones a shrink made stale.
#[derive(Clone, Debug)]
pub(crate) enum Transition {
    /// `on_new_request` of a request not alive in the pool slot.
    Arrive { slot: Slot, prompt: Prompt },
    /// `on_new_request` again for a live request (twice, or after its allocation),
    /// with its prompt after `change`.
    Rearrive { slot: Slot, change: PromptChange },
    /// `probe` of a live request, after its prompt changed (or not), with a local hit
    /// of `local`.
    Probe {
        slot: Slot,
        change: PromptChange,
        local: LocalHit,
    },
    /// `probe` of a request that never arrived (no `on_new_request`): the scheduler
    /// has it from now on.
    ProbeUnarrived {
        slot: Slot,
        prompt: Prompt,
        local: LocalHit,
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
    /// The driver writes the released RPC at `index` of its unwritten ones (cases with
    /// deferred writes): the server sees it from now on.
    Write { index: usize },
    /// Writing the released RPC at `index` of the unwritten ones failed:
    /// `handle_send_failed` with `failure` (transport, or not sent at all).
    WriteFailed { index: usize, failure: WriteFailure },
    /// A reply arrives for the released RPC at `index` of the unwritten ones, before
    /// the driver wrote it (the dispatcher cannot tell: it is on the wire to it). The
    /// RPC stays unwritten: written later, its reply is late.
    EarlyReply { index: usize, value: ReplyValue },
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
    /// of their replies will come (rule 17); unwritten ones are dropped with it.
    Reopen,
    /// The connection drops without the driver seeing it (the peer vanished and
    /// ZeroMQ reconnects on its own): every RPC written on it is lost, and only its
    /// timeout ends it (rule 17); RPCs released and not yet written go out on the new
    /// connection.
    DropConnection,
    /// The server behind the address was replaced by a fresh one (a restart), and the
    /// driver replaced its connection: every RPC on the old one fails (transport), as
    /// at [`Reopen`](Self::Reopen), except, with `keep_reset`, the oldest reset on it,
    /// which goes on the new connection (the I/O task's reopen for a reset,
    /// `fail_on_wire(Some(reset))`). The new server's store starts empty.
    ReplaceConnection { keep_reset: bool },
}

/// How a probe's (or a repeated arrival's) prompt relates to the request's current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PromptChange {
    /// The same prompt.
    Same,
    /// The prompt grew by `tokens`, up to [`MAX_BLOCKS`] blocks (the chain is
    /// extended, its prefix kept).
    Grow { tokens: u32 },
    /// The prompt shrank by `tokens` (at least to 0; the chain is cut).
    Shrink { tokens: u32 },
    /// Another chain at the same token count (`shift` picks it among the others).
    Rechain { shift: u8 },
}

impl PromptChange {
    /// The prompt after this change.
    pub(crate) fn apply(self, prompt: Prompt, shape: Shape) -> Prompt {
        match self {
            Self::Same => prompt,
            Self::Grow { tokens } => Prompt {
                num_tokens: (prompt.num_tokens + tokens)
                    .min(MAX_BLOCKS * shape.block_size)
                    .max(prompt.num_tokens),
                ..prompt
            },
            Self::Shrink { tokens } => Prompt {
                num_tokens: prompt.num_tokens.saturating_sub(tokens),
                ..prompt
            },
            Self::Rechain { shift } => Prompt {
                chain: (prompt.chain + shift) % CHAINS,
                ..prompt
            },
        }
    }
}

/// The local (GPU) hit a probe passes as `num_computed_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalHit {
    /// `blocks` whole blocks, at most rule 12's cap: what a scheduler passes.
    Blocks { blocks: u32 },
    /// `blocks` whole blocks and `tokens` more: not block-aligned, not capped.
    Unaligned { blocks: u32, tokens: u32 },
    /// `tokens` above rule 12's cap (saturating at `u32::MAX`).
    AboveCap { tokens: u32 },
}

impl LocalHit {
    /// `num_computed_tokens` for a prompt of `num_tokens` tokens.
    pub(crate) fn tokens(self, shape: Shape, num_tokens: u32) -> u32 {
        let b = shape.block_size;
        let cap = shape.hit_cap(num_tokens);
        match self {
            Self::Blocks { blocks } => (blocks * b).min(cap),
            Self::Unaligned { blocks, tokens } => blocks * b + tokens,
            Self::AboveCap { tokens } => cap.saturating_add(tokens),
        }
    }
}

/// How a write of a released RPC failed (`Dispatcher::handle_send_failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteFailure {
    /// The socket failed.
    Transport,
    /// The driver could not write it at all (for example no encoding for it).
    NotSent,
}

impl WriteFailure {
    /// The core's name for it.
    pub(crate) fn rpc_failure(self) -> RpcFailure {
        match self {
            Self::Transport => RpcFailure::Transport,
            Self::NotSent => RpcFailure::NotSent,
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
    /// Not a multiple of the block size (when it is above 1), at most `num_tokens`
    /// (rule 11).
    NotMultiple { blocks: u32 },
    /// Bytes that did not decode.
    Malformed,
    /// The server's error reply: it could not ask its store (`spec/wire.md`, "Store
    /// unavailable").
    StoreUnavailable,
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
