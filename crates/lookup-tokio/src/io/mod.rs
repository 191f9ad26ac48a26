//! The client's I/O task: one tokio task owns the transport (a ZeroMQ DEALER socket,
//! or the Mooncake master connection) and runs the wire's half of the protocol, the
//! core's [`Dispatcher`] (DESIGN.md, "Who owns what"; CONTRIBUTING.md rule 10).
//!
//! Both transports share this loop: the send queue, every RPC deadline, the late-reply
//! count, reopening with one [`Backoff`], the tracing and the reports. A transport is a
//! [`Wire`]: it writes one RPC, yields what it receives, and opens or drops its
//! connection. What goes back to the scheduler's thread is the core's own
//! [`WireEvent`], one per RPC that ended.

pub(crate) mod direct;
pub(crate) mod peer;
mod wire;
pub(crate) mod zmq;

use wire::bump;
pub(crate) use wire::{Payload, SendError, TransportStats, Wire, WireInput};

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lookup_core::timer::Backoff;
use lookup_core::{Command, Dispatcher, Outgoing, Reply, RpcBody, RpcFailure, RpcId, WireEvent};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::Span;
use tracing::field::Empty;

use crate::clock;
use crate::metrics::{ActorMetrics, ReopenReason};
use crate::warn::WarnLimiter;

/// A command of the core for the I/O task, and the span of the lookup it belongs to
/// ([`Span::none`] for others, or when debug tracing is off).
pub(crate) type ToIo = (Command, Span);

/// What the handle sends the I/O task: every command one call produced, in order, as
/// one message. One message wakes the task once: sent one by one, each command could
/// wake it again (the task, on another core, takes the first and waits again while
/// the next is sent). On the project's 2-core VM, handing over a scheduler step's 8
/// lookups took the scheduler's thread 0.3-0.5 ms of its own CPU that way, and
/// 0.07-0.1 ms as one message (`scripts/vllm/step_bench.py --breakdown`, the
/// drop-in's `flush`; docs/performance.md).
pub(crate) type ToIoBatch = Vec<ToIo>;

/// The I/O task's settings.
#[derive(Clone, Debug)]
pub(crate) struct IoConfig {
    /// First wait before trying again to open a connection; doubles up to 1 s.
    pub(crate) backoff: Duration,
    /// Reopen after this many timeouts in a row; 0 never (rule 17).
    pub(crate) reopen_after_timeouts: u32,
    /// `lookup_timeout_s` (the dispatcher's; here for warnings).
    pub(crate) timeout: Duration,
    /// The transport's own per-call deadline, when it has one (the direct transport:
    /// the master client's `call_timeout`), for warnings naming what fired.
    pub(crate) call_timeout: Option<Duration>,
    /// `max_pending_age`: a lookup queued longer ends unsent (`spec/behaviour.md`
    /// rule 17).
    pub(crate) max_pending_age: Duration,
    /// The `client` label of the task's metric series.
    pub(crate) label: String,
}

/// The task's ends of what links it to the handle.
pub(crate) struct IoLinks {
    /// Commands of the core, with their lookups' spans.
    pub(crate) commands: UnboundedReceiver<ToIoBatch>,
    /// One event per RPC that ended.
    pub(crate) events: UnboundedSender<WireEvent>,
    /// Cancelled on close.
    pub(crate) cancel: CancellationToken,
    /// Counters the handle reads.
    pub(crate) stats: Arc<TransportStats>,
    /// What the task knows of its connection, for the strict connect.
    pub(crate) link: watch::Sender<Link>,
}

/// What the I/O task knows of its connection: published for `LookupClient::connect`
/// (strict), which waits for [`Link::Up`] and fails with [`Link::Down`]'s reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// Nothing known yet: a connection attempt is under way.
    Unknown,
    /// The server (the master) answered: the ZeroMQ handshake completed, or the
    /// direct transport connected.
    Up,
    /// The server is gone or the connect failed, for this reason.
    Down(String),
}

/// What the task keeps per RPC beside the dispatcher's record: its tracing span (the
/// lookup's while queued, the `rpc` span once written), whether it is a reset, and
/// whether it was written (so that only those leave the `lookup_in_flight` gauge).
#[derive(Debug)]
pub(crate) struct Tag {
    span: Span,
    is_reset: bool,
    written: bool,
}

/// What woke the task.
enum Wake<P> {
    Cancelled,
    Command(Option<ToIoBatch>),
    Input(WireInput<P>),
    Timer,
}

/// The task. Build with [`IoTask::new`] and spawn [`IoTask::run`].
pub(crate) struct IoTask<W: Wire> {
    wire: W,
    dispatcher: Dispatcher<Tag>,
    commands: UnboundedReceiver<ToIoBatch>,
    events: UnboundedSender<WireEvent>,
    cancel: CancellationToken,
    stats: Arc<TransportStats>,
    backoff: Backoff,
    /// Set while there is no connection: when to try opening one again.
    reopen_at: Option<Instant>,
    sleep: Pin<Box<Sleep>>,
    /// The instant `sleep` is armed for; `None` when disarmed or after it fired.
    armed: Option<Instant>,
    timeout: Duration,
    call_timeout: Option<Duration>,
    max_pending_age: Duration,
    /// The dispatcher's `lookups_expired` as of the last turn.
    expired_seen: u64,
    timeouts_in_a_row: u32,
    /// The dispatcher's `rpcs_timed_out` as of the last turn: the `lookup_timeout_s`
    /// deadlines that fired since (the transport's own call timeouts are not among
    /// them).
    timed_out_seen: u64,
    link: watch::Sender<Link>,
    warn: WarnLimiter,
    metrics: ActorMetrics,
}

impl<W: Wire> IoTask<W> {
    /// A task driving `wire` (already opened or opening, so that a bad endpoint is an
    /// error of `connect`, not of the task).
    pub(crate) fn new(
        wire: W,
        mut dispatcher: Dispatcher<Tag>,
        config: &IoConfig,
        links: IoLinks,
    ) -> Self {
        dispatcher.set_reopen_after_timeouts(config.reopen_after_timeouts);
        dispatcher.set_max_pending_age(Some(config.max_pending_age));
        let initial = config.backoff.max(Duration::from_millis(1));
        let IoLinks {
            commands,
            events,
            cancel,
            stats,
            link,
        } = links;
        Self {
            wire,
            dispatcher,
            commands,
            events,
            cancel,
            stats,
            backoff: Backoff::new(initial, Backoff::MAX),
            reopen_at: None,
            sleep: Box::pin(clock::sleep_until(clock::now())),
            armed: None,
            timeout: config.timeout,
            call_timeout: config.call_timeout,
            max_pending_age: config.max_pending_age,
            expired_seen: 0,
            timeouts_in_a_row: 0,
            timed_out_seen: 0,
            link,
            warn: WarnLimiter::labelled(&config.label),
            metrics: ActorMetrics::new(&config.label),
        }
    }

    /// Runs until the root token is cancelled or the handle is dropped. On exit the
    /// connection is dropped (ZeroMQ: linger 0), so nothing is left behind.
    pub(crate) async fn run(mut self) {
        tracing::debug!(wire = self.wire.name(), "lookup I/O task started");
        loop {
            let wake = tokio::select! {
                biased;
                () = self.cancel.cancelled() => Wake::Cancelled,
                input = self.wire.next() => Wake::Input(input),
                cmd = self.commands.recv() => Wake::Command(cmd),
                () = &mut self.sleep, if self.armed.is_some() => Wake::Timer,
            };
            // The one clock read of this turn (CONTRIBUTING.md rule 10).
            let now = clock::now();
            match wake {
                Wake::Cancelled | Wake::Command(None) => break,
                Wake::Command(Some(batch)) => {
                    for command in batch {
                        self.take(command, now);
                    }
                    // Take everything already queued, so one turn sends a whole batch.
                    while let Ok(batch) = self.commands.try_recv() {
                        for command in batch {
                            self.take(command, now);
                        }
                    }
                }
                Wake::Input(input) => self.on_input(input, now),
                Wake::Timer => self.armed = None,
            }
            // Checked here rather than trusting the Sleep (CONTRIBUTING.md rule 10).
            self.dispatcher.handle_timeout(now);
            self.expired(now);
            if self.dispatcher.poll_reopen() {
                self.reopen(now, None, ReopenReason::Timeouts);
            }
            if self.reopen_at.is_some_and(|at| at <= now) {
                self.reopen_at = None;
                self.open(now);
            }
            if !self.pump(now).await {
                break;
            }
            self.forward(now);
            self.arm();
        }
        let on_wire = self.dispatcher.in_flight();
        self.dispatcher.close();
        self.wire.close();
        tracing::debug!(on_wire, "lookup I/O task stopped");
    }

    fn take(&mut self, (command, span): ToIo, now: Instant) {
        let is_reset = matches!(
            &command,
            Command::Send {
                body: RpcBody::Reset,
                ..
            }
        );
        self.dispatcher.push(
            command,
            Tag {
                span,
                is_reset,
                written: false,
            },
            now,
        );
    }

    /// Counts and warns about the lookups the dispatcher ended unsent this turn for
    /// waiting `max_pending_age` in the queue (`spec/behaviour.md` rule 17): none waits
    /// behind a slow server without bound, nor takes the wire when it is stale.
    fn expired(&mut self, now: Instant) {
        let total = self.dispatcher.stats().lookups_expired;
        let expired = total - self.expired_seen;
        self.expired_seen = total;
        if expired > 0 {
            self.stats.expired.fetch_add(expired, Ordering::Relaxed);
            self.warn.warn(
                "queued_too_long",
                now,
                format_args!(
                    "{expired} lookup(s) to {} waited max_pending_age = {:?} in the queue \
                     unsent; they answer 0 hits as unavailable",
                    self.wire.name(),
                    self.max_pending_age
                ),
            );
        }
    }

    fn on_input(&mut self, input: WireInput<W::Payload>, now: Instant) {
        match input {
            WireInput::Reply { rpc_id, payload } => {
                let Some(tag) = self.dispatcher.tag_mut(rpc_id) else {
                    // Late (after its timeout or a reopen) or duplicated: counted by the
                    // dispatcher, never applied (rule 17).
                    let _late = self.dispatcher.handle_reply(rpc_id, Reply::Malformed, now);
                    self.metrics.late_reply();
                    tracing::debug!(rpc_id = rpc_id.0, "late reply dropped");
                    return;
                };
                let (is_reset, span) = (tag.is_reset, tag.span.clone());
                let reply = self
                    .wire
                    .decode(payload, is_reset, &span, &mut self.warn, now);
                if self.dispatcher.handle_reply(rpc_id, reply, now) {
                    self.timeouts_in_a_row = 0;
                    self.backoff.reset();
                }
            }
            WireInput::Failed { rpc_id, failure } => {
                if let (RpcFailure::TimedOut, Some(call_timeout)) = (failure, self.call_timeout) {
                    self.warn.warn(
                        "call_timeout",
                        now,
                        format_args!(
                            "a query to {} was unanswered within the master client's \
                             call_timeout = {call_timeout:?} (MasterConfig::call_timeout); \
                             the lookup answers 0 hits as unavailable",
                            self.wire.name()
                        ),
                    );
                }
                if failure == RpcFailure::TimedOut {
                    self.wire.lookups_timed_out();
                }
                self.dispatcher.handle_send_failed(rpc_id, failure, now);
            }
            WireInput::Broken(error) => {
                bump(&self.stats.recv_errors);
                self.warn.warn(
                    "recv_error",
                    now,
                    format_args!("lookup connection to {} failed: {error}", self.wire.name()),
                );
                self.reopen_after_error(now);
            }
            WireInput::Connected => {
                tracing::debug!(wire = self.wire.name(), "connected");
                self.backoff.reset();
                self.link.send_replace(Link::Up);
            }
            WireInput::ConnectFailed(error) => {
                bump(&self.stats.open_errors);
                self.warn.warn(
                    "open_error",
                    now,
                    format_args!(
                        "cannot connect to {}: {error}; lookups fail open",
                        self.wire.name()
                    ),
                );
                self.reopen_at = Some(now + self.backoff.next_delay());
                self.link.send_replace(Link::Down(error));
            }
            WireInput::Unreachable(why) => {
                bump(&self.stats.unreachable);
                let failed = self.dispatcher.fail_on_wire(None, now);
                self.warn.warn(
                    why.kind(),
                    now,
                    format_args!(
                        "lookup server {} is down: {why}; {failed} lookup(s) on the wire \
                         failed, and lookups fail at once as unavailable until it is back",
                        self.wire.name()
                    ),
                );
                self.link.send_replace(Link::Down(why.to_string()));
            }
            WireInput::Reachable => {
                tracing::info!(
                    wire = self.wire.name(),
                    "lookup server is back; lookups go out again"
                );
                self.backoff.reset();
                self.link.send_replace(Link::Up);
            }
            WireInput::BadEnvelope => {
                bump(&self.stats.bad_envelopes);
                self.warn.warn(
                    "bad_envelope",
                    now,
                    format_args!("dropped a message without an [rpc id, \"\"] envelope"),
                );
            }
        }
    }

    /// Writes everything the dispatcher releases. False when cancelled mid-write.
    async fn pump(&mut self, now: Instant) -> bool {
        if self.wire.connecting() {
            return true;
        }
        while let Some(out) = self.dispatcher.poll_transmit(now) {
            let rpc_id = out.rpc_id;
            let span = self.start_span(&out);
            if matches!(out.body, RpcBody::Reset) && self.wire.reopens_for_reset() {
                // Lookups on the wire were all discarded by the reset; a fresh
                // connection keeps a serial server from answering them first.
                self.reopen(now, Some(rpc_id), ReopenReason::Reset);
            }
            let is_lookup = matches!(out.body, RpcBody::Lookup { .. });
            let result = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return false,
                r = self.wire.send(out, &span) => r,
            };
            match result {
                Ok(()) => {
                    if is_lookup {
                        self.metrics.lookup_on_wire();
                        if let Some(tag) = self.dispatcher.tag_mut(rpc_id) {
                            tag.written = true;
                        }
                    }
                }
                Err(SendError::NotConnected) => {
                    span.record("outcome", "not_connected");
                    self.dispatcher
                        .handle_send_failed(rpc_id, RpcFailure::Transport, now);
                }
                Err(SendError::NotSent(why)) => {
                    self.warn
                        .warn("not_sent", now, format_args!("RPC not sent: {why}"));
                    self.dispatcher
                        .handle_send_failed(rpc_id, RpcFailure::NotSent, now);
                }
                Err(SendError::Failed(error)) => {
                    bump(&self.stats.send_errors);
                    self.warn.warn(
                        "send_error",
                        now,
                        format_args!("lookup send to {} failed: {error}", self.wire.name()),
                    );
                    self.dispatcher
                        .handle_send_failed(rpc_id, RpcFailure::Transport, now);
                    self.reopen_after_error(now);
                }
            }
        }
        self.wire.flush();
        true
    }

    /// The `rpc` span of a released RPC, a child of its lookup's span (a root for a
    /// reset, or with tracing off), kept as the RPC's tag until it ends.
    fn start_span(&mut self, out: &Outgoing) -> Span {
        let Some(tag) = self.dispatcher.tag_mut(out.rpc_id) else {
            return Span::none();
        };
        let span = match &out.body {
            RpcBody::Lookup {
                num_tokens,
                block_hashes,
            } => tracing::debug_span!(
                parent: &tag.span,
                "rpc",
                rpc_id = out.rpc_id.0,
                num_tokens,
                blocks = block_hashes.len(),
                hit_tokens = Empty,
                outcome = Empty,
                latency_us = Empty,
            ),
            RpcBody::Reset => tracing::debug_span!(
                parent: &tag.span,
                "reset",
                rpc_id = out.rpc_id.0,
                outcome = Empty,
                latency_us = Empty
            ),
        };
        tag.span = span.clone();
        span
    }

    /// Carries every ended RPC to the handle, closing its span and its gauge share.
    fn forward(&mut self, now: Instant) {
        while let Some((event, tag)) = self.dispatcher.poll_event() {
            if tag.written {
                self.metrics.lookup_off_wire();
            }
            let outcome = match event.result() {
                Ok(Reply::Malformed) => "malformed",
                Ok(Reply::StoreUnavailable) | Err(RpcFailure::StoreUnavailable) => {
                    "store_unavailable"
                }
                Ok(Reply::Reset { ok: true }) => "ok",
                Ok(Reply::Reset { ok: false }) => "failed",
                Ok(Reply::Lookup { .. }) => "replied",
                Err(RpcFailure::TimedOut) => "timed_out",
                Err(RpcFailure::Transport) => "failed",
                Err(RpcFailure::NotSent) => "not_sent",
            };
            if !tag.span.is_disabled() {
                let latency = event.at().saturating_duration_since(event.sent_at());
                let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                tag.span.record("outcome", outcome);
                tag.span.record("latency_us", latency_us);
                tracing::debug!(parent: &tag.span, rpc_id = event.rpc_id().0, outcome, latency_us, "rpc ended");
            }
            // The handle is gone only when the client was dropped; the token ends us.
            let _ = self.events.send(event);
        }
        let fired = self.dispatcher.stats().rpcs_timed_out - self.timed_out_seen;
        if fired > 0 {
            self.timed_out_seen += fired;
            self.wire.lookups_timed_out();
            self.timeouts_in_a_row = self
                .timeouts_in_a_row
                .saturating_add(u32::try_from(fired).unwrap_or(u32::MAX));
            self.warn.warn(
                "timeout",
                now,
                format_args!(
                    "lookup RPC to {} unanswered within lookup_timeout_s = {:?} ({} in a \
                     row); it answers 0 hits as unavailable, and the client checks that \
                     the server is alive",
                    self.wire.name(),
                    self.timeout,
                    self.timeouts_in_a_row
                ),
            );
        }
        let d = self.dispatcher.stats();
        self.stats.rpcs_sent.store(d.rpcs_sent, Ordering::Relaxed);
        self.stats
            .late_replies
            .store(d.late_replies, Ordering::Relaxed);
    }

    /// Drops the connection and opens a new one at once; every RPC on the old one
    /// except `keep` fails with [`RpcFailure::Transport`]; queued ones stay queued.
    fn reopen(&mut self, now: Instant, keep: Option<RpcId>, reason: ReopenReason) {
        self.drop_connection(now, keep, reason);
        self.open(now);
    }

    /// After a connection error: drops it and opens a new one after the backoff, which
    /// doubles per error until a reply arrives, so a connection that keeps failing
    /// costs a retry per backoff, never a busy loop.
    fn reopen_after_error(&mut self, now: Instant) {
        self.drop_connection(now, None, ReopenReason::Error);
        self.reopen_at = Some(now + self.backoff.next_delay());
    }

    fn drop_connection(&mut self, now: Instant, keep: Option<RpcId>, reason: ReopenReason) {
        // The metric first: a reader who sees the count sees the metric too.
        self.metrics.reopened(reason);
        bump(&self.stats.reopens);
        self.timeouts_in_a_row = 0;
        self.wire.close();
        self.dispatcher.fail_on_wire(keep, now);
        self.reopen_at = None;
    }

    fn open(&mut self, now: Instant) {
        if let Err(error) = self.wire.open() {
            bump(&self.stats.open_errors);
            self.warn.warn(
                "open_error",
                now,
                format_args!(
                    "cannot open a lookup connection to {}: {error}",
                    self.wire.name()
                ),
            );
            self.reopen_at = Some(now + self.backoff.next_delay());
        }
    }

    /// Arms the one Sleep for the earliest deadline or reopen attempt.
    fn arm(&mut self) {
        // The dispatcher's includes the oldest queued lookup's `max_pending_age`.
        let next = [self.dispatcher.poll_timeout(), self.reopen_at]
            .into_iter()
            .flatten()
            .min();
        if next != self.armed {
            if let Some(at) = next {
                self.sleep.as_mut().reset(at.into());
            }
            self.armed = next;
        }
    }
}
