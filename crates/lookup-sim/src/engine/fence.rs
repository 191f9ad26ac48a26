//! vLLM 0.33's deferred block frees under overlapping batches: with async scheduling
//! (`max_concurrent_batches` 2) and a connector that is a KV consumer (the Mooncake
//! store connector runs as `kv_both`), a request's blocks are not returned to the
//! pool while a step that may still write them is on the GPU
//! (vllm/v1/core/sched/scheduler.py: `defer_block_free` set in `Scheduler.__init__`,
//! `_request_blocks_can_be_freed`, `_free_request_blocks`, `_drain_deferred_frees`,
//! the fence counters `sched_step_seq` / `processed_step_seq`). The same fence keeps
//! the running loop from preempting a request scheduled in the step in flight: its
//! free would not make room now, so the loop stops instead (`if not
//! self._request_blocks_can_be_freed(preempted_req): break`).

use std::collections::VecDeque;

use crate::store::{Held, LocalCache};

/// The fence between steps scheduled and steps whose output was processed, and the
/// block frees waiting behind it.
#[derive(Debug, Default)]
pub(super) struct Fence {
    /// vLLM's `defer_block_free`: off, every free is immediate.
    on: bool,
    /// Non-empty steps scheduled (`sched_step_seq`).
    scheduled: u64,
    /// Non-empty steps whose output was processed (`processed_step_seq`).
    processed: u64,
    /// Blocks freed while a step that may write them was in flight, with the step
    /// count they wait for (`deferred_frees`), in the order they were freed.
    deferred: VecDeque<(u64, Held)>,
}

impl Fence {
    /// A fence that defers frees when `on` (vLLM: `max_concurrent_batches > 1` and
    /// `kv_transfer_config.is_kv_consumer`).
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    /// A non-empty step was scheduled: the stamp its requests carry
    /// (`request.last_sched_seq`, set in `_update_after_schedule` after
    /// `sched_step_seq += 1`).
    pub(super) fn step_scheduled(&mut self) -> u64 {
        if self.on {
            self.scheduled += 1;
        }
        self.scheduled
    }

    /// A non-empty step's output is processed (the start of `update_from_output`):
    /// every step up to it has run, so the frees waiting for it return to the pool,
    /// oldest first, stopping at the first still fenced (`_drain_deferred_frees`).
    pub(super) fn step_processed(&mut self, local: &mut LocalCache) {
        if !self.on {
            return;
        }
        self.processed += 1;
        while self
            .deferred
            .front()
            .is_some_and(|(fence, _)| *fence <= self.processed)
        {
            let (_, mut held) = self.deferred.pop_front().expect("checked");
            held.release(local);
        }
    }

    /// True when a request last scheduled in step `last_sched_seq` can give its
    /// blocks back now (`_request_blocks_can_be_freed`).
    pub(super) fn can_free(&self, last_sched_seq: u64) -> bool {
        !self.on || last_sched_seq <= self.processed
    }

    /// Frees `held` (a request finished or preempted, last scheduled in step
    /// `last_sched_seq`): at once, or once the steps scheduled so far have run
    /// (`_free_request_blocks`: `deferred_frees.append((sched_step_seq, blocks))`).
    /// Deferred blocks stay in use, and a cached one can still be hit meanwhile.
    pub(super) fn free(&mut self, local: &mut LocalCache, last_sched_seq: u64, held: &mut Held) {
        if self.can_free(last_sched_seq) {
            held.release(local);
        } else {
            self.deferred
                .push_back((self.scheduled, std::mem::take(held)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free during a step in flight waits for that step's output; the pool's
    /// occupancy shows it.
    #[test]
    fn a_free_behind_a_step_in_flight_waits_for_its_output() {
        let mut local = LocalCache::with_hash_tokens(10, 16);
        let mut held = Held::default();
        assert!(held.allocate(&mut local, &[], 48));
        let mut fence = Fence::new(true);
        let stamp = fence.step_scheduled();
        assert_eq!(stamp, 1);
        assert!(!fence.can_free(stamp));
        fence.free(&mut local, stamp, &mut held);
        assert_eq!((local.held(), held.anonymous), (3, 0));
        fence.step_processed(&mut local);
        assert_eq!(local.held(), 0);
        assert!(fence.can_free(stamp));
    }

    /// Off (one batch at a time), every free is immediate.
    #[test]
    fn without_overlapping_batches_a_free_is_immediate() {
        let mut local = LocalCache::with_hash_tokens(10, 16);
        let mut held = Held::default();
        assert!(held.allocate(&mut local, &[], 20));
        let mut fence = Fence::new(false);
        let stamp = fence.step_scheduled();
        assert!(fence.can_free(stamp));
        fence.free(&mut local, stamp, &mut held);
        assert_eq!(local.held(), 0);
    }
}
