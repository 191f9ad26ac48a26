//! The client's waits: probes that wait for their answer up to a [`Deadline`]
//! (rule 10 for sync mode), a reset that waits for its outcome (rule 13), and a wait
//! for progress. Each sleeps on the I/O task's reports, bounded by `lookup_timeout_s`
//! plus [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin).

use std::time::{Duration, Instant};

use lookup_core::timer::deadline_after;
use lookup_core::{Probe, Request, ResetOutcome, WireEvent};
use tokio::runtime::{Handle, RuntimeFlavor};

use super::{LookupClient, READY_ZERO};
use crate::{Error, clock};

/// How long a probe may wait for its answer: the latency of
/// [`LookupClient::probe_until`] and [`LookupClient::probe_until_blocking`], written
/// at the call site. Every form is bounded by `lookup_timeout_s` plus
/// [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin) (the wait limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// Until the answer is in (sync mode, vLLM's default: rule 10): never `Pending`.
    /// A lookup on the wire fails open at `lookup_timeout_s` (rule 11); an answer
    /// still pending at the wait limit (its RPC queued behind a hung one) is
    /// `Ready(0)`, counted in
    /// [`ClientStats::waits_gave_up`](super::ClientStats::waits_gave_up), and the
    /// lookup goes on for a later probe.
    Answer,
    /// At most this long after the call (prefetch plus a bounded wait; zero answers
    /// at once).
    Within(Duration),
    /// At most until this instant (a scheduler step's own deadline).
    At(Instant),
}

impl LookupClient {
    /// The deadline of a scheduler step in the mode the configuration sets
    /// (`spec/behaviour.md`, configuration): [`Deadline::Answer`] when
    /// `lookup_async = false` (sync mode), [`Deadline::Within`] of
    /// [`ClientConfig::probe_budget`](super::ClientConfig::probe_budget) (zero by
    /// default: answer at once) when `lookup_async = true`. For a scheduler whose mode
    /// comes from vLLM's JSON: `client.probe_until(&req, n, client.step_deadline())`.
    #[must_use]
    pub fn step_deadline(&self) -> Deadline {
        if self.core.config().lookup_async {
            Deadline::Within(self.probe_budget)
        } else {
            Deadline::Answer
        }
    }

    /// The probe of a scheduler step (vLLM's `get_num_new_matched_tokens`) that waits
    /// for the answer up to `deadline`: probes and, while the answer is pending,
    /// sleeps on the I/O task's reports; answers as soon as the reply is in.
    ///
    /// At the deadline, a still-pending answer is [`Probe::Pending`] ("defer to the
    /// next step", vLLM's skip-and-continue) with `lookup_async = true`; with
    /// `lookup_async = false` (sync mode, rule 10: never `Pending`) and with
    /// [`Deadline::Answer`] it is `Ready(0)`, counted in
    /// [`ClientStats::waits_gave_up`](super::ClientStats::waits_gave_up), the lookup
    /// left running for a later probe. No form waits past the wait limit
    /// (`lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin)). A deadline
    /// already past answers at once, as [`probe`](Self::probe) in async mode. A
    /// request preempted since its last allocation waits at least
    /// `lookup_preempted_wait_s` when `lookup_on_preemption` is `wait` or
    /// `keep_wait` (rule 8: it is not overtaken by younger requests).
    #[tracing::instrument(level = "trace", skip_all, fields(request_id = req.request_id.0))]
    pub async fn probe_until(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        deadline: Deadline,
    ) -> Probe {
        let mut now = self.begin();
        let (until, gives_up) = self.wait_bounds(now, deadline, req);
        loop {
            let answer = self.probe_core(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending {
                return answer;
            }
            self.progressed = false;
            while !self.progressed {
                if now >= until {
                    return self.deadline_passed(now, gives_up);
                }
                let got = recv_until(&mut self.wire_events, until).await;
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// As [`probe_until`](Self::probe_until), blocking the calling thread, for
    /// schedulers that are not async.
    ///
    /// Call it from a plain thread (the usual case with
    /// [`connect_with_handle`](Self::connect_with_handle)), or from a task of a
    /// multi-thread runtime (it then uses [`tokio::task::block_in_place`]). Never call
    /// it from a current-thread runtime's thread: the I/O task could not run.
    ///
    /// # Errors
    /// [`Error::BlockingInRuntime`] when called on a thread of a current-thread
    /// runtime (caller misuse); nothing is probed then.
    #[tracing::instrument(level = "trace", skip_all, fields(request_id = req.request_id.0))]
    pub fn probe_until_blocking(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        deadline: Deadline,
    ) -> Result<Probe, Error> {
        let in_worker = match Handle::try_current() {
            Err(_) => false,
            Ok(current) if current.runtime_flavor() == RuntimeFlavor::MultiThread => true,
            Ok(_) => return Err(Error::BlockingInRuntime),
        };
        let mut now = self.begin();
        let (until, gives_up) = self.wait_bounds(now, deadline, req);
        loop {
            let answer = self.probe_core(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending {
                return Ok(answer);
            }
            self.progressed = false;
            while !self.progressed {
                if now >= until {
                    return Ok(self.deadline_passed(now, gives_up));
                }
                let got = self.block_until(until, in_worker);
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// When a wait for `req` that started at `now` ends, and whether it then answers
    /// `Ready(0)` (sync mode, or [`Deadline::Answer`]) rather than `Pending`. A
    /// preempted request's wait is at least its `lookup_preempted_wait_s` with
    /// `lookup_on_preemption` = `wait` or `keep_wait` (rule 8, [`Lookups::wait_budget`](lookup_core::Lookups::wait_budget)),
    /// so it is not overtaken by younger requests.
    fn wait_bounds(&self, now: Instant, deadline: Deadline, req: &Request) -> (Instant, bool) {
        let limit = deadline_after(now, self.wait_limit);
        let sync = !self.core.config().lookup_async;
        let preempted = deadline_after(now, self.core.wait_budget(req.request_id));
        match deadline {
            Deadline::Answer => (limit, true),
            Deadline::Within(budget) => {
                (deadline_after(now, budget).max(preempted).min(limit), sync)
            }
            Deadline::At(at) => (at.max(preempted).min(limit), sync),
        }
    }

    /// The deadline passed with the answer pending: `Pending`, or a wait that gave up.
    fn deadline_passed(&mut self, now: Instant, gives_up: bool) -> Probe {
        if gives_up {
            self.gave_up(now);
            READY_ZERO
        } else {
            Probe::Pending
        }
    }

    /// [`reset`](Self::reset) and wait for its outcome, at most `lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin) (then
    /// [`ResetOutcome::TimedOut`]). Other events stay queued for
    /// [`poll_event`](Self::poll_event).
    ///
    /// # Errors
    /// [`Error::Closed`] after close.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn reset_and_wait(&mut self) -> Result<ResetOutcome, Error> {
        let rpc_id = self.reset().ok_or(Error::Closed)?;
        let mut now = clock::now();
        let give_up = deadline_after(now, self.wait_limit);
        loop {
            if let Some(outcome) = self.core.take_reset_done(rpc_id) {
                return Ok(outcome);
            }
            if now >= give_up || self.core.is_closed() {
                return Ok(ResetOutcome::TimedOut);
            }
            let got = recv_until(&mut self.wire_events, give_up).await;
            self.after_wait(got);
            now = self.begin();
            self.end();
        }
    }

    /// Waits until the I/O task reports something (a reply, a failure) or `max_wait`
    /// passes, and applies it. For async schedulers that want to sleep until a pending
    /// probe may have become ready instead of polling.
    pub async fn wait_progress(&mut self, max_wait: Duration) {
        let now = self.begin();
        self.end();
        let got = recv_until(&mut self.wire_events, deadline_after(now, max_wait)).await;
        self.after_wait(got);
        self.begin();
        self.end();
    }

    fn after_wait(&mut self, got: Option<Option<WireEvent>>) {
        match got {
            Some(Some(event)) => self.apply(event),
            Some(None) => self.actor_gone(),
            None => {}
        }
    }

    fn block_until(&mut self, until: Instant, in_worker: bool) -> Option<Option<WireEvent>> {
        let runtime = self.runtime.clone();
        let wait = recv_until(&mut self.wire_events, until);
        if in_worker {
            tokio::task::block_in_place(|| runtime.block_on(wait))
        } else {
            runtime.block_on(wait)
        }
    }
}

/// The next report, `Some(None)` when the I/O task is gone, `None` at `until`.
async fn recv_until(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<WireEvent>,
    until: Instant,
) -> Option<Option<WireEvent>> {
    tokio::time::timeout_at(until.into(), events.recv())
        .await
        .ok()
}
