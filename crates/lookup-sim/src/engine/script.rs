//! What a step-driven run ([`super::stepped`]) and the engine share: the stand-in
//! connector's scripted answers ([`ConnectorAnswer`], [`Script`]) and the decisions
//! the engine records in a step ([`Decisions`]). In a file of their own so the
//! engine holds them without depending on the step driver, which depends on it.

use serde::{Deserialize, Serialize};

/// What the stand-in connector's `get_num_new_matched_tokens` answers for a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConnectorAnswer {
    /// Nothing stored: `(0, False)`.
    Missing,
    /// `hit_tokens` stored (a multiple of the block size), known at every probe.
    Ready {
        /// Tokens of the prompt's prefix in the store.
        hit_tokens: u32,
        /// Loaded asynchronously (`load_kv_async` True) when set: the load ends in
        /// the output of the `load_steps`-th step run from the one that allocated
        /// its blocks (that one included); unset, loaded synchronously.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        load_steps: Option<u32>,
    },
    /// `None` for the first `steps` probes, then as `Ready`.
    Pending {
        /// Probes answered `None`.
        steps: u32,
        /// Tokens of the prompt's prefix in the store.
        hit_tokens: u32,
        /// As `Ready`'s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        load_steps: Option<u32>,
    },
}

impl ConnectorAnswer {
    /// Steps an asynchronous load of this answer takes (`None`: synchronous).
    #[must_use]
    pub fn load_steps(&self) -> Option<u32> {
        match *self {
            Self::Missing => None,
            Self::Ready { load_steps, .. } | Self::Pending { load_steps, .. } => load_steps,
        }
    }
}

/// One step's decisions, recorded by the engine as it takes them (request `seq`s).
#[derive(Debug, Default)]
pub(super) struct Decisions {
    pub(super) admitted: Vec<u64>,
    pub(super) preempted: Vec<u64>,
    pub(super) finished: Vec<u64>,
    pub(super) skipped_pending: Vec<u64>,
    pub(super) local_hits: Vec<(u64, u32)>,
    pub(super) external_hits: Vec<(u64, u32)>,
}

/// The stand-in connector of a step-driven run: each request's scripted answer and
/// the probes it has had (counted across preemptions, as the harness does).
#[derive(Debug)]
pub(super) struct Script {
    pub(super) answers: Vec<ConnectorAnswer>,
    pub(super) probes: Vec<u32>,
    pub(super) block_size: u32,
    /// Steps between a step's scheduling and its output's processing: 0 without
    /// async scheduling, 1 with it (the batch queue's second place).
    pub(super) output_lag: u64,
}

impl Script {
    /// The answer to request `seq`'s probe with `local_tokens` computed locally and
    /// `num_tokens` in its prompt: `None` (pending) or the external tokens beyond the
    /// local hit. The hit is capped at the largest multiple of the block size below
    /// `num_tokens` (`spec/behaviour.md` rule 12, vLLM #55113: the last token is
    /// always computed).
    pub(super) fn probe(&mut self, seq: u64, local_tokens: u32, num_tokens: u32) -> Option<u32> {
        let i = seq as usize;
        if num_tokens < self.block_size {
            // vLLM's Mooncake connector answers (0, False) without a lookup for a
            // prompt shorter than one block (mooncake/store/scheduler.py).
            return Some(0);
        }
        self.probes[i] += 1;
        let hit = match self.answers[i] {
            ConnectorAnswer::Missing => 0,
            ConnectorAnswer::Ready { hit_tokens, .. } => hit_tokens,
            ConnectorAnswer::Pending {
                steps, hit_tokens, ..
            } => {
                if self.probes[i] <= steps {
                    return None;
                }
                hit_tokens
            }
        };
        let cap = (num_tokens.saturating_sub(1) / self.block_size) * self.block_size;
        Some(hit.min(cap).saturating_sub(local_tokens))
    }

    /// True when request `seq`'s external tokens load asynchronously.
    pub(super) fn loads_async(&self, seq: u64) -> bool {
        self.answers[seq as usize].load_steps().is_some()
    }

    /// When request `seq`'s asynchronous load, started by a `schedule` at step time
    /// `now` (ns, a step per 10^6), is seen done: the load ends in the output of
    /// the `load_steps`-th step from this one, and a `schedule` sees it once that
    /// output is processed (`_update_from_kv_xfer_finished` adds it to
    /// `finished_recving_kv_req_ids`; `_handle_blocked_waiting_request` reads them):
    /// `load_steps` steps later, one more with async scheduling.
    pub(super) fn load_done_at(&self, seq: u64, now: u64) -> u64 {
        let k = self.answers[seq as usize].load_steps().unwrap_or(1);
        now + (u64::from(k) + self.output_lag) * 1_000_000
    }
}
