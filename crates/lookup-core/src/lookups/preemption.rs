//! Rule 8's preemption policy (`lookup_on_preemption`): what a preemption does to a
//! request's lookup, which lookup answers a preempted request's probe, and how long
//! the driver waits for that probe.
//!
//! Why it exists: vLLM's connector drops the lookup of a preempted request. Its next
//! probe then needs a new RPC and answers `Pending`, and the scheduler's
//! skip-and-continue lets younger requests take the blocks it just freed, so it is
//! readmitted last and preempted again (the livelock `cargo xtask simulate` traced).

use std::time::Duration;

use super::Lookups;
use super::entry::{LookupState, Preemption, RequestEntry};
use crate::{Answer, Observe, Request, RequestId};

/// Whether the lookup `state` answers a probe of `req`: it asks exactly that question
/// (rule 7), or `kept` (the request was preempted under `keep` or `keep_wait`) and
/// `req`'s prompt extends the one looked up (rule 8: the prompt grew by the tokens
/// generated before the preemption, and the stored prefix reported is still a hit).
pub(super) fn answers(state: &LookupState, kept: bool, req: &Request) -> bool {
    state.asks(req.num_tokens, &req.block_hashes)
        || (kept && state.extended_by(req.num_tokens, &req.block_hashes))
}

impl<O: Observe> Lookups<O> {
    /// Rule 8: the request was preempted (vLLM's `preempted_req_ids`). With
    /// `lookup_on_preemption`:
    ///
    /// - `discard` (vLLM's, the default): its lookup is dropped as at allocation (a
    ///   queued one cancelled, an in-flight reply ignored) and a failed request's retry
    ///   ends (rule 11); it is looked up again when probed.
    /// - `keep`: its lookup stays, queued, in flight or done (a result answered before
    ///   its last allocation was kept then: [`on_allocated`](Self::on_allocated)), and
    ///   so does a failure's backoff; until it is allocated again a probe whose prompt
    ///   extends the kept one reads it (within the TTL, rule 6) instead of looking up
    ///   again (rule 7).
    ///   Counted in [`Stats::lookups_kept_on_preemption`](crate::Stats::lookups_kept_on_preemption)
    ///   when there was a lookup to keep.
    /// - `wait`: dropped as with `discard`, and until it is allocated again
    ///   [`wait_budget`](Self::wait_budget) gives its probes `lookup_preempted_wait_s`.
    /// - `keep_wait`: both.
    ///
    /// Unknown requests: no-op.
    pub fn on_preempted(&mut self, request_id: RequestId) {
        let policy = self.config.lookup_on_preemption;
        if !policy.keeps() {
            self.discard_lookup(request_id);
            self.forget_failure(request_id);
        }
        if policy == crate::OnPreemption::Discard {
            return;
        }
        if let Some(entry) = self.requests.get_mut(&request_id) {
            entry.preemption = Preemption::Preempted;
            if policy.keeps() && entry.lookup.is_some() {
                self.stats.lookups_kept_on_preemption += 1;
            }
        }
    }

    /// At allocation under `keep` or `keep_wait`: keeps a done, usable result for a
    /// preemption (true), or marks the request not preempted and lets the caller
    /// consume its lookup (false).
    pub(super) fn retain_on_allocation(&mut self, request_id: RequestId) -> bool {
        let keeps = self.config.lookup_on_preemption.keeps();
        let Some(entry) = self.requests.get_mut(&request_id) else {
            return false;
        };
        let usable = matches!(
            entry.lookup,
            Some(LookupState::Done { answer, .. }) if !matches!(answer, Answer::Unavailable(_))
        );
        let retain = keeps && usable;
        entry.preemption = if retain {
            Preemption::Retained
        } else {
            Preemption::None
        };
        retain
    }

    /// A probe or arrival of a request whose result was retained at allocation and
    /// no preemption came: the result is consumed now, as `discard` would have at
    /// allocation (rule 8).
    pub(super) fn consume_retained(&mut self, request_id: RequestId) {
        if let Some(entry) = self.requests.get_mut(&request_id) {
            entry.consume_retained();
        }
    }

    /// How long the driver should wait for this probe of `request_id` before it answers
    /// `Pending` (rule 8, `lookup_on_preemption` = `wait` or `keep_wait`):
    /// `lookup_preempted_wait_s` for a request preempted and not allocated since, in
    /// async mode with lookup on and the core open; zero otherwise (sync mode waits for
    /// every probe anyway, rule 10). So a preempted request whose lookup is out is not
    /// overtaken by younger requests: the scheduler waits for it instead of skipping
    /// it. A driver calls it before each probe and waits at most the larger of this
    /// and its own per-probe budget; the core itself never waits.
    #[must_use]
    pub fn wait_budget(&self, request_id: RequestId) -> Duration {
        let c = &self.config;
        let waits = c.lookup_on_preemption.waits() && c.lookup_async && c.enable_lookup;
        if !waits || self.closed {
            return Duration::ZERO;
        }
        match self.requests.get(&request_id) {
            Some(entry) if entry.preemption == Preemption::Preempted => c.lookup_preempted_wait,
            _ => Duration::ZERO,
        }
    }
}

impl RequestEntry {
    /// [`Lookups::consume_retained`] on an entry already at hand (the probe's hot
    /// path looks the request up once). A retained lookup is always done
    /// ([`Lookups::retain_on_allocation`]; only a probe or an arrival, which consume it
    /// first, can start another), so dropping it cancels no RPC and frees no slot.
    pub(super) fn consume_retained(&mut self) {
        if self.preemption == Preemption::Retained {
            debug_assert!(
                matches!(self.lookup, None | Some(LookupState::Done { .. })),
                "a retained lookup is done"
            );
            self.lookup = None;
            self.preemption = Preemption::None;
        }
    }
}
