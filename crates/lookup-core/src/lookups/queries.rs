//! Read-only views of [`Lookups`], its configuration and its observer, and the
//! rules that need no state (rule 1's eligibility, rule 12's cap).

use std::sync::atomic::Ordering;

use super::Lookups;
use super::entry::{FirstProbe, LookupState};
use crate::{Answer, Config, Observe, Request, RequestId, Stats, Unavailable};

impl<O: Observe> Lookups<O> {
    /// Reserves room for `additional` more tracked requests (and as many open RPCs),
    /// so that no later input pays for growing the tables: the input that makes a
    /// hash table double rehashes every entry (measured: one 4.7-8.4 ms arrival at
    /// 57,344 tracked requests). Call it at start-up with the most requests the
    /// scheduler holds at once.
    pub fn reserve(&mut self, additional: usize) {
        self.requests.reserve(additional);
        self.rpcs.reserve(additional);
        if self.config.lookup_share {
            self.shared.reserve(additional);
        }
    }

    /// Keeps at most `capacity` events for [`poll_event`](Self::poll_event); beyond it
    /// the oldest is dropped and counted in [`Stats::events_dropped`] (the observer
    /// still sees every event). Unbounded by default.
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.event_capacity = capacity;
    }

    /// The observer.
    #[must_use]
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The observer, mutably.
    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Rule 1 (eligibility for prefetch): does not skip external KV, at least one
    /// block of tokens, at least one hash.
    #[must_use]
    pub fn is_eligible(&self, req: &Request) -> bool {
        !req.skip_reading_external_kv
            && req.num_tokens >= self.config.block_size
            && !req.block_hashes.is_empty()
    }

    /// Rule 12: the most tokens the scheduler may be told are stored, local plus
    /// external: the largest multiple of the block size strictly below `num_tokens`
    /// (vLLM #55113).
    #[must_use]
    pub fn hit_cap(&self, num_tokens: u32) -> u32 {
        let b = self.config.block_size;
        (num_tokens.saturating_sub(1) / b) * b
    }

    /// What `request_id`'s last `Ready` answer rested on: a hit, a miss, nothing to
    /// ask, or an unavailable store (a 0 that is not a miss: rule 11). Every answer is
    /// unavailable after close and with `enable_lookup = false`. `None` for a request
    /// not tracked or not answered yet.
    #[must_use]
    pub fn answer_of(&self, request_id: RequestId) -> Option<Answer> {
        if self.closed {
            return Some(Answer::Unavailable(Unavailable::Closed));
        }
        if !self.config.enable_lookup {
            return Some(Answer::Unavailable(Unavailable::Disabled));
        }
        self.requests.get(&request_id)?.last_answer
    }

    /// The counters, the prefetch slots in use and the observer, at once: a driver
    /// that publishes the counters through its observer after every call reads them
    /// in place instead of copying [`Stats`] (the caller-cost path).
    pub fn stats_and_observer(&mut self) -> (&Stats, u32, &mut O) {
        (&self.stats, self.slots_in_use, &mut self.observer)
    }

    /// Counters since construction.
    #[must_use]
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Prefetch slots in use: arrival-time lookups not ended yet (rule 3).
    #[must_use]
    pub fn slots_in_use(&self) -> u32 {
        self.slots_in_use
    }

    /// RPCs queued or in flight (lookups and resets).
    #[must_use]
    pub fn open_rpcs(&self) -> usize {
        self.rpcs.len()
    }

    /// RPCs handed to the driver whose ticket is still queued: the backlog that
    /// `max_queued` bounds (rule 2), exact wherever the driver runs.
    #[must_use]
    pub fn queued_rpcs(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }

    /// Requests with any state (a lookup, or a first-probe mark).
    #[must_use]
    pub fn tracked_requests(&self) -> usize {
        self.requests.len()
    }

    /// Requests whose lookup is queued or in flight.
    #[must_use]
    pub fn waiting_requests(&self) -> usize {
        self.requests
            .values()
            .filter(|e| matches!(e.lookup, Some(LookupState::Waiting { .. })))
            .count()
    }

    /// Whether the request's first probe was answered `Ready` (its lookup, if any, had
    /// completed in time): `None` for a request not tracked or not probed yet. Kept
    /// until the request finishes (allocation and preemption keep it).
    #[must_use]
    pub fn ready_at_first_probe(&self, request_id: RequestId) -> Option<bool> {
        match self.requests.get(&request_id)?.first_probe {
            FirstProbe::NotYet => None,
            FirstProbe::Ready => Some(true),
            FirstProbe::Pending => Some(false),
        }
    }

    /// True after [`close`](Self::close).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}
