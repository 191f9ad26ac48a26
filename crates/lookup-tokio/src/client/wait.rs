//! The client's waits: sync-mode probes (rule 10), a reset that waits for its outcome
//! (rule 13), and a wait for progress. Each sleeps on the I/O task's reports, bounded
//! by `lookup_timeout_s` plus [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin).

use std::time::{Duration, Instant};

use lookup_core::timer::deadline_after;
use lookup_core::{Probe, Request, ResetOutcome, WireEvent};
use tokio::runtime::{Handle, RuntimeFlavor};

use super::{LookupClient, READY_ZERO};
use crate::{Error, clock};

impl LookupClient {
    /// Sync mode (rule 10): probes and, while the answer is pending, waits for the
    /// I/O task's reports, until the answer is `Ready`. Never answers `Pending`.
    ///
    /// Bounded: a lookup on the wire fails open when its `lookup_timeout_s` passes
    /// (rule 11); if the answer is still pending `lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`](super::ClientConfig::wait_margin) after the call
    /// (its RPC queued behind a hung one), it answers `Ready(0)`, counts
    /// [`ClientStats::waits_gave_up`](super::ClientStats::waits_gave_up) and leaves
    /// the lookup running for a later probe.
    #[tracing::instrument(level = "trace", skip_all, fields(request_id = req.request_id.0))]
    pub async fn probe_wait(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let mut now = self.begin();
        let give_up = deadline_after(now, self.wait_limit);
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending {
                return answer;
            }
            self.progressed = false;
            while !self.progressed {
                if now >= give_up {
                    self.gave_up(now);
                    return READY_ZERO;
                }
                let got = recv_until(&mut self.wire_events, give_up).await;
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// Prefetch plus a bounded wait, in one call: probes and, while the answer is
    /// pending, waits for the I/O task's reports at most `budget`, then answers what
    /// is known. `Pending` when the budget passed (defer the request to the next step,
    /// as vLLM's skip-and-continue does); `Ready` as soon as the reply is in. A
    /// `budget` of zero is [`probe`](Self::probe). Use it with `lookup_async = true`
    /// and prefetch on, so that most lookups are answered before their first probe.
    #[tracing::instrument(level = "trace", skip_all, fields(request_id = req.request_id.0))]
    pub async fn probe_within(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        budget: Duration,
    ) -> Probe {
        let mut now = self.begin();
        let until = deadline_after(now, budget);
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending || now >= until {
                return answer;
            }
            self.progressed = false;
            while !self.progressed {
                if now >= until {
                    return Probe::Pending;
                }
                let got = recv_until(&mut self.wire_events, until).await;
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// As [`probe_within`](Self::probe_within), blocking the calling thread (a
    /// thread-based scheduler); the same placement rules as
    /// [`probe_blocking`](Self::probe_blocking).
    ///
    /// # Errors
    /// [`Error::BlockingInRuntime`] on a thread of a current-thread runtime.
    pub fn probe_within_blocking(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
        budget: Duration,
    ) -> Result<Probe, Error> {
        let in_worker = match Handle::try_current() {
            Err(_) => false,
            Ok(current) if current.runtime_flavor() == RuntimeFlavor::MultiThread => true,
            Ok(_) => return Err(Error::BlockingInRuntime),
        };
        let mut now = self.begin();
        let until = deadline_after(now, budget);
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending || now >= until {
                return Ok(answer);
            }
            self.progressed = false;
            while !self.progressed {
                if now >= until {
                    return Ok(Probe::Pending);
                }
                let got = self.block_until(until, in_worker);
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// As [`probe_wait`](Self::probe_wait), blocking the calling thread, for
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
    pub fn probe_blocking(
        &mut self,
        req: &Request,
        num_computed_tokens: u32,
    ) -> Result<Probe, Error> {
        let in_worker = match Handle::try_current() {
            Err(_) => false,
            Ok(current) if current.runtime_flavor() == RuntimeFlavor::MultiThread => true,
            Ok(_) => return Err(Error::BlockingInRuntime),
        };
        let mut now = self.begin();
        let give_up = deadline_after(now, self.wait_limit);
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end();
            if answer != Probe::Pending {
                return Ok(answer);
            }
            self.progressed = false;
            while !self.progressed {
                if now >= give_up {
                    self.gave_up(now);
                    return Ok(READY_ZERO);
                }
                let got = self.block_until(give_up, in_worker);
                self.after_wait(got);
                now = self.begin();
            }
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
