//! The batch tasks of a [`Coalescer`](super::Coalescer): when a batch starts, how its
//! rounds are asked, and when each lookup is answered.
//!
//! Per round: the epoch ([`Epoch`]) and the clock are read at the round's send time;
//! the presence cache answers only for that epoch and only for keys whose entry
//! outlasts that instant plus the margin; keys a round found present enter the cache
//! only when the epoch did not change while the round was asked and the epoch's lease
//! is known. Each lookup is answered as soon as its run is known (its own early
//! stop), never held for the batch's slowest lookup; an answer that rests on the
//! cache is given only while the cache's epoch is still the client's, and only while
//! every cached entry it rests on still outlasts the answer's own instant plus the
//! margin (a round that took long may have let an entry that was good at its send
//! time run out before the answer: `spec/mooncake-master-rpc.md`, "Connection epochs
//! and the presence cache").

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use super::{Answer, LeadingRuns, Shared, Waiting};
use crate::client::lock;
use crate::counters::bump;
use crate::{Epoch, MasterError};

/// How far past `at` an entry may last when `by` leaves the clock's range (~30 years:
/// never, for any process).
const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// `at + by`, saturating at [`FAR`] past `at` instead of overflowing.
pub(super) fn later(at: std::time::Instant, by: Duration) -> std::time::Instant {
    at.checked_add(by.min(FAR))
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// Reads the master's lease for `key` (just answered present in `epoch`), then
/// shortens the presence cache's entries when the lease is shorter than the one they
/// were kept for.
async fn read_lease(shared: Arc<Shared>, key: String, epoch: (u64, u64)) {
    let result = shared.master.read_lease(&key).await;
    let mut state = lock(&shared.state);
    let keep_before = state.keep(&shared.config);
    state.lease.finish_read(epoch, result, shared.master.addr());
    let shorter = keep_before.saturating_sub(state.keep(&shared.config));
    if !shorter.is_zero() {
        state.cache.shorten(shorter);
    }
}

pub(super) fn stopped(shared: &Shared) -> MasterError {
    MasterError::Unavailable {
        addr: shared.master.addr().to_owned(),
        last_error: "the batch answering this lookup stopped (runtime shut down)".to_owned(),
    }
}

/// Why an answer resting on the presence cache is refused.
fn epoch_ended(shared: &Shared) -> MasterError {
    MasterError::Unavailable {
        addr: shared.master.addr().to_owned(),
        last_error: "the connection whose presence cache answered this lookup ended \
                     (reconnect, leader change or RemoveAll)"
            .to_owned(),
    }
}

/// Starts a batch task if something waits and the in-flight bound allows it, or,
/// with `overdue`, if the oldest lookup waited `max_wait` already.
pub(super) fn start_driver(shared: &Arc<Shared>, overdue: bool) {
    {
        let mut state = lock(&shared.state);
        let Some(oldest) = state.queue.front() else {
            return;
        };
        let late = overdue
            && oldest
                .since
                .checked_add(shared.config.max_wait)
                .is_some_and(|at| at <= Instant::now());
        if state.drivers >= shared.config.max_batches_in_flight && !late {
            return;
        }
        state.drivers += 1;
    }
    tokio::spawn(drive(shared.clone()));
}

/// One batch task: batches of what is queued until the queue is empty.
async fn drive(shared: Arc<Shared>) {
    loop {
        let batch: Vec<Waiting> = {
            let mut state = lock(&shared.state);
            let mut batch = Vec::new();
            while batch.len() < shared.config.max_lookups {
                let Some(waiting) = state.queue.pop_front() else {
                    break;
                };
                if waiting.answer.is_closed() {
                    bump(&shared.counters.lookups_dropped, 1);
                } else {
                    batch.push(waiting);
                }
            }
            if batch.is_empty() {
                state.drivers -= 1;
                return;
            }
            batch
        };
        let span = tracing::debug_span!("batch_exist", lookups = batch.len());
        run_batch(&shared, batch).instrument(span).await;
    }
}

/// Why an answer resting on a cached key whose entry ends too soon is refused.
fn lease_too_short(shared: &Shared) -> MasterError {
    MasterError::Unavailable {
        addr: shared.master.addr().to_owned(),
        last_error: "a cached key this lookup rests on may lose its read lease within \
                     the answer's TTL (the lookup's calls took long)"
            .to_owned(),
    }
}

/// Where the batch's answers rest on the cache: the epoch it was used in, whether it
/// was used in more than one, and when each key taken from it ends.
#[derive(Default)]
struct CacheUse {
    epoch: Option<Epoch>,
    mixed: bool,
    until: HashMap<String, std::time::Instant>,
}

impl CacheUse {
    /// Whether every key of `keys` (taken from the cache) stays valid past `now` plus
    /// `margin`.
    fn outlasts<'k>(
        &self,
        mut keys: impl Iterator<Item = &'k str>,
        now: std::time::Instant,
        margin: Duration,
    ) -> bool {
        let Some(need) = now.checked_add(margin) else {
            return false;
        };
        keys.all(|key| self.until.get(key).is_some_and(|until| need < *until))
    }

    fn used_in(&mut self, epoch: Option<Epoch>) {
        match self.epoch {
            None => self.epoch = epoch,
            Some(e) if Some(e) != epoch => self.mixed = true,
            Some(_) => {}
        }
    }

    /// Whether an answer resting on the cache may be given now, in `now`.
    fn holds(&self, now: Option<Epoch>) -> bool {
        !self.mixed && self.epoch.is_some() && self.epoch == now
    }
}

/// The plan's counts already added to the coalescer's counters.
#[derive(Default)]
struct Tally {
    wanted: u64,
    asked: u64,
    assumed: u64,
}

impl Tally {
    /// Adds what the plan counted since the last call, so that the counters are
    /// current before an answer is handed out.
    fn publish(&mut self, shared: &Shared, plan: &LeadingRuns) {
        let c = &shared.counters;
        let (wanted, asked, assumed) = (
            plan.keys_wanted() + plan.keys_assumed(),
            plan.keys_asked(),
            plan.keys_assumed(),
        );
        bump(&c.keys_wanted, wanted - self.wanted);
        bump(&c.keys_asked, asked - self.asked);
        bump(&c.keys_from_cache, assumed - self.assumed);
        (self.wanted, self.asked, self.assumed) = (wanted, asked, assumed);
    }
}

/// Hands out every answer the plan knows now.
fn answer_finished(
    shared: &Shared,
    plan: &mut LeadingRuns,
    answers: &mut [Option<oneshot::Sender<Answer>>],
    cache: &CacheUse,
    tally: &mut Tally,
) {
    tally.publish(shared, plan);
    let now = Instant::now().into_std();
    for (i, result, cached) in plan.take_finished() {
        let result = if !cached {
            result
        } else if !cache.holds(shared.master.epoch()) {
            Err(epoch_ended(shared))
        } else if !cache.outlasts(plan.assumed_keys(i), now, shared.margin) {
            Err(lease_too_short(shared))
        } else {
            result
        };
        if let Some(answer) = answers[i].take() {
            bump(&shared.counters.lookups, 1);
            // A receiver dropped meanwhile (its lookup cancelled or timed out): nobody
            // waits.
            let _ = answer.send(result);
        }
    }
}

/// Answers every lookup of `batch` from shared calls and the presence cache, each as
/// soon as its run is known.
pub(super) async fn run_batch(shared: &Arc<Shared>, batch: Vec<Waiting>) {
    let use_cache = shared.config.presence.enabled;
    let mut plan = LeadingRuns::new(shared.master.config().chunk_keys);
    let mut answers = Vec::with_capacity(batch.len());
    for waiting in batch {
        plan.add(waiting.keys, waiting.keys_per_block);
        answers.push(Some(waiting.answer));
    }
    let mut cache = CacheUse::default();
    let mut tally = Tally::default();
    bump(&shared.counters.batches, 1);
    loop {
        // This round's send time and epoch: the cache is checked against them.
        let sent = Instant::now().into_std();
        let epoch = shared.master.epoch();
        let calls = if use_cache {
            let mut state = lock(&shared.state);
            let current = state.enter(epoch);
            let mut used = false;
            let until = &mut cache.until;
            let calls = plan.next_round(&mut |key| {
                let Some(at) = current
                    .then(|| state.cache.valid_until(key, sent, shared.margin))
                    .flatten()
                else {
                    return false;
                };
                until.insert(key.to_owned(), at);
                used = true;
                true
            });
            drop(state);
            if used {
                cache.used_in(epoch);
            }
            calls
        } else {
            plan.next_round(&mut |_| false)
        };
        answer_finished(shared, &mut plan, &mut answers, &cache, &mut tally);
        let Some(calls) = calls else { break };
        let replies = futures::future::join_all(
            calls
                .iter()
                .map(|keys| shared.master.batch_exist_chunk(keys)),
        )
        .await;
        let mut failed = false;
        let mut present: Vec<&str> = Vec::new();
        for (keys, reply) in calls.iter().zip(replies) {
            match reply {
                Ok(reply) => {
                    if plan.record(keys, &reply).is_err() {
                        failed = true;
                    } else {
                        present.extend(
                            keys.iter()
                                .zip(&reply)
                                .filter(|(_, answer)| **answer == Ok(true))
                                .map(|(key, _)| key.as_str()),
                        );
                    }
                }
                Err(error) => {
                    failed = true;
                    plan.record_failure(keys, error);
                }
            }
        }
        if use_cache && failed {
            // Any failed call may mean a restarted or replaced master, whose store no
            // longer holds what the cache says.
            lock(&shared.state).cache.clear();
        }
        let Some(epoch) = epoch else { continue };
        if use_cache && !failed {
            let after = shared.master.epoch();
            let mut state = lock(&shared.state);
            if after == Some(epoch) && state.enter(after) && state.lease.settled(epoch.master()) {
                let until = later(sent, state.keep(&shared.config));
                for key in &present {
                    state.cache.insert(key, until, sent);
                }
            }
        }
        if let Some(key) = present.first() {
            if lock(&shared.state).lease.start_read(epoch.master()) {
                tokio::spawn(read_lease(
                    shared.clone(),
                    (*key).to_owned(),
                    epoch.master(),
                ));
            }
        }
    }
    tally.publish(shared, &plan);
    // Every lookup was answered in the loop; a plan left open answers unavailable.
    for (answer, result) in answers.into_iter().zip(plan.into_results()) {
        if let Some(answer) = answer {
            bump(&shared.counters.lookups, 1);
            let _ = answer.send(result);
        }
    }
}
