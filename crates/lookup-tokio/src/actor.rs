//! The client's I/O actor: one tokio task that owns the DEALER socket (DESIGN.md,
//! "lookup-tokio"; STYLE.md rule 10).
//!
//! It takes the core's [`Command`]s from an unbounded channel into a [`Dispatcher`]
//! (priority, `max_in_flight`, cancellation by [`Ticket`](lookup_core::Ticket)),
//! writes each released RPC as `[rpc_id u64 BE, "", frames...]` (`spec/wire.md`,
//! "Transport"), keeps one deadline per RPC on the wire in one ordered set with one
//! re-armed [`Sleep`], and reports every outcome back as a [`Completion`]. It never
//! touches the lifecycle state: that lives with the handle.
//!
//! Each command comes with the handle's tracing span of its lookup, so that the
//! actor's `rpc` span and its warnings sit under the lookup's request id. It keeps
//! the wire gauge and the reopen counters of [`crate::metrics`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::wire::{self, Format};
use lookup_core::{Command, Dispatcher, Outgoing, Reply, RpcBody, RpcFailure, RpcId};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::Span;
use tracing::field::Empty;

use crate::metrics::{ActorMetrics, ReopenReason};

/// Bytes of the RPC-id envelope frame: the core's `RpcId`, u64 big-endian.
const RPC_ID_BYTES: usize = 8;
/// A rate-limited warning of one kind is logged at most once per this interval.
const WARN_EVERY: Duration = Duration::from_secs(10);
/// Longest wait between two attempts to open a socket after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What the handle sends the actor: a command of the core, and the span of the lookup
/// it belongs to ([`Span::none`] for others, or when debug tracing is off).
pub(crate) type ToActor = (Command, Span);

/// What the actor reports to the handle, in the order it happened.
#[derive(Debug)]
pub(crate) enum Completion {
    /// The RPC went on the wire at `at`: the core starts its `lookup_timeout_s`.
    Sent {
        /// The RPC.
        rpc_id: RpcId,
        /// When the send completed (the actor's clock).
        at: Instant,
    },
    /// A reply for an RPC the actor had on the wire, decoded (`Reply::Malformed` when
    /// the bytes break `spec/wire.md`).
    Reply {
        /// The RPC.
        rpc_id: RpcId,
        /// The decoded reply.
        reply: Reply,
        /// When it was received.
        at: Instant,
    },
    /// The RPC ended without a reply.
    Failed {
        /// The RPC.
        rpc_id: RpcId,
        /// Why.
        failure: RpcFailure,
        /// When the actor gave up on it.
        at: Instant,
    },
}

/// Transport counters the actor keeps and the handle reads (all counts).
#[derive(Debug, Default)]
pub(crate) struct TransportCounters {
    /// Replies whose RPC id the actor no longer had on the wire (late after a
    /// timeout, duplicated): dropped (rule 17).
    pub(crate) late_replies: AtomicU64,
    /// Messages without a valid `[8-byte rpc id, ""]` envelope: dropped.
    pub(crate) bad_envelopes: AtomicU64,
    /// Sockets dropped and opened again (after timeouts, on reset, on errors).
    pub(crate) reopens: AtomicU64,
    /// Sends that failed or did not complete within the timeout.
    pub(crate) send_errors: AtomicU64,
    /// Receive errors on the socket.
    pub(crate) recv_errors: AtomicU64,
    /// Attempts to open a socket that failed.
    pub(crate) open_errors: AtomicU64,
}

impl TransportCounters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The actor's share of the client configuration.
#[derive(Clone, Debug)]
pub(crate) struct ActorConfig {
    /// ZeroMQ URL to connect to.
    pub(crate) url: String,
    /// Wire format of every request.
    pub(crate) format: Format,
    /// Block size (tokens): `msgpack-hex` floors `num_tokens` to it.
    pub(crate) block_size: u32,
    /// `lookup_timeout_s`.
    pub(crate) timeout: Duration,
    /// Reopen the socket after this many timeouts in a row; 0 never.
    pub(crate) reopen_after_timeouts: u32,
    /// First wait before opening a socket again after a failed open.
    pub(crate) reopen_backoff: Duration,
}

/// The send queue of an I/O task, ZeroMQ or direct: the core's [`Dispatcher`] plus the
/// spans of the lookups queued in it (only those with tracing on), so that each RPC's
/// span is a child of its lookup's.
#[derive(Debug)]
pub(crate) struct SendQueue {
    dispatcher: Dispatcher,
    spans: HashMap<RpcId, Span>,
}

impl SendQueue {
    pub(crate) fn new(dispatcher: Dispatcher) -> Self {
        Self {
            dispatcher,
            spans: HashMap::new(),
        }
    }

    /// Queues one command of the handle, keeping its span until the RPC is released.
    pub(crate) fn take(&mut self, (command, span): ToActor) {
        match &command {
            Command::Send { rpc_id, .. } if !span.is_disabled() => {
                self.spans.insert(*rpc_id, span);
            }
            Command::Cancel { rpc_id } => {
                self.spans.remove(rpc_id);
            }
            _ => {}
        }
        self.dispatcher.push(command);
    }

    /// The next RPC to start, with its lookup's span (`Span::none()` for a reset or
    /// with tracing off): see [`Dispatcher::next_send`].
    pub(crate) fn next_send(&mut self) -> Option<(Outgoing, Span)> {
        let out = self.dispatcher.next_send()?;
        let parent = self.spans.remove(&out.rpc_id).unwrap_or_else(Span::none);
        Some((out, parent))
    }

    /// A released RPC ended: see [`Dispatcher::on_done`].
    pub(crate) fn on_done(&mut self, rpc_id: RpcId) {
        self.dispatcher.on_done(rpc_id);
    }

    /// See [`Dispatcher::reset_in_flight`].
    pub(crate) fn reset_in_flight(&mut self) -> Vec<RpcId> {
        self.dispatcher.reset_in_flight()
    }
}

/// Largest reply frame the client accepts (bytes): a lookup reply is 4 + 8k bytes,
/// so 64 KiB leaves room for 8,191 tail-key boundaries. ZeroMQ hangs up on a peer
/// that announces more, before reserving any memory for it.
pub(crate) const MAX_REPLY_BYTES: i64 = 64 * 1024;

/// Opens a DEALER socket connected to `url`, with linger 0 so that dropping it with
/// unanswered requests never blocks (NOTES.md, STYLE.md rule 10), and
/// [`MAX_REPLY_BYTES`] so that a hostile peer's length claim is never allocated.
pub(crate) fn open_dealer(context: &tmq::Context, url: &str) -> tmq::Result<tmq::dealer::Dealer> {
    tmq::dealer(context)
        .set_linger(0)
        .set_maxmsgsize(MAX_REPLY_BYTES)
        .connect(url)
}

/// What one RPC on the wire carries until it ends.
struct OnWire {
    deadline: Instant,
    sent_at: Instant,
    is_reset: bool,
    span: Span,
}

/// Logs a warning of each kind at most once per [`WARN_EVERY`] (the first at once),
/// with the number of warnings of that kind suppressed since, so that a dead server
/// or a hostile peer cannot flood the log (STYLE.md rule 11; `spec/behaviour.md`
/// rule 11: failures are logged once per kind).
#[derive(Debug, Default)]
pub(crate) struct WarnLimiter {
    last: HashMap<&'static str, (Instant, u64)>,
}

impl WarnLimiter {
    /// Whether a warning of `kind` is due at `now`: `Some(suppressed since the last
    /// one)` when it is, `None` (and one more suppressed) when not.
    fn admit(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        match self.last.get_mut(kind) {
            Some((at, suppressed)) if now.saturating_duration_since(*at) < WARN_EVERY => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                *at = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                self.last.insert(kind, (now, 0));
                Some(0)
            }
        }
    }

    /// Logs `message` as a warning of `kind` if one is due at `now`.
    pub(crate) fn warn(&mut self, kind: &'static str, now: Instant, message: fmt::Arguments<'_>) {
        match self.admit(kind, now) {
            Some(0) => tracing::warn!(kind, "{message}"),
            Some(suppressed) => tracing::warn!(kind, suppressed, "{message}"),
            None => {}
        }
    }
}

/// What woke the actor.
enum Wake {
    Cancelled,
    Command(Option<ToActor>),
    Message(Option<tmq::Result<tmq::Multipart>>),
    Timer,
}

/// The task that owns the socket. Build with [`Actor::new`] and spawn [`Actor::run`].
pub(crate) struct Actor {
    config: ActorConfig,
    context: tmq::Context,
    socket: Option<tmq::dealer::Dealer>,
    queue: SendQueue,
    on_wire: HashMap<RpcId, OnWire>,
    deadlines: BTreeSet<(Instant, RpcId)>,
    consecutive_timeouts: u32,
    /// Set while there is no socket: when to try opening one again.
    reopen_at: Option<Instant>,
    backoff: Duration,
    commands: UnboundedReceiver<ToActor>,
    completions: UnboundedSender<Completion>,
    /// [`Completion::Sent`] only: the handle drains it without ever waiting on it, so
    /// a send does not wake a probe that waits for the reply.
    sends: UnboundedSender<Completion>,
    cancel: CancellationToken,
    counters: Arc<TransportCounters>,
    sleep: Pin<Box<Sleep>>,
    /// The instant `sleep` is armed for; `None` when disarmed or after it fired.
    armed: Option<Instant>,
    warn: WarnLimiter,
    metrics: ActorMetrics,
}

impl Actor {
    /// An actor owning `socket` (already connected by the caller, so that a bad
    /// endpoint is an error of `connect`, not of the task).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: ActorConfig,
        dispatcher: Dispatcher,
        context: tmq::Context,
        socket: tmq::dealer::Dealer,
        commands: UnboundedReceiver<ToActor>,
        completions: UnboundedSender<Completion>,
        sends: UnboundedSender<Completion>,
        cancel: CancellationToken,
        counters: Arc<TransportCounters>,
    ) -> Self {
        let backoff = config.reopen_backoff;
        Self {
            config,
            context,
            socket: Some(socket),
            queue: SendQueue::new(dispatcher),
            on_wire: HashMap::new(),
            deadlines: BTreeSet::new(),
            consecutive_timeouts: 0,
            reopen_at: None,
            backoff,
            commands,
            completions,
            sends,
            cancel,
            counters,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
            warn: WarnLimiter::default(),
            metrics: ActorMetrics::new(),
        }
    }

    /// Runs until the root token is cancelled or the handle is dropped. On exit the
    /// socket is dropped (linger 0) and then the context, so nothing is left behind.
    pub(crate) async fn run(mut self) {
        tracing::debug!(url = %self.config.url, "lookup actor started");
        loop {
            let wake = tokio::select! {
                biased;
                () = self.cancel.cancelled() => Wake::Cancelled,
                msg = next_message(&mut self.socket) => Wake::Message(msg),
                cmd = self.commands.recv() => Wake::Command(cmd),
                () = &mut self.sleep, if self.armed.is_some() => Wake::Timer,
            };
            // The one clock read of this turn (STYLE.md rule 10).
            let now = Instant::now();
            match wake {
                Wake::Cancelled | Wake::Command(None) => break,
                Wake::Command(Some(command)) => {
                    self.queue.take(command);
                    // Take everything already queued, so one turn sends a whole batch.
                    while let Ok(command) = self.commands.try_recv() {
                        self.queue.take(command);
                    }
                }
                Wake::Message(Some(Ok(message))) => self.on_message(message, now),
                Wake::Message(Some(Err(error))) => {
                    TransportCounters::bump(&self.counters.recv_errors);
                    self.warn.warn(
                        "recv_error",
                        now,
                        format_args!("lookup socket receive failed: {error}"),
                    );
                    self.reopen_after_error(now);
                }
                Wake::Message(None) => {
                    self.warn.warn(
                        "recv_error",
                        now,
                        format_args!("lookup socket stream ended"),
                    );
                    self.reopen_after_error(now);
                }
                Wake::Timer => self.armed = None,
            }
            self.expire(now);
            if !self.pump(now).await {
                break;
            }
            self.arm();
        }
        let open = self.on_wire.len();
        // Linger 0: dropping the socket discards unsent and unanswered messages at once.
        drop(self.socket.take());
        tracing::debug!(on_wire = open, "lookup actor stopped");
    }

    /// Fails every RPC whose deadline passed and retries a failed socket open.
    fn expire(&mut self, now: Instant) {
        let mut timed_out = 0;
        while let Some(&(deadline, rpc_id)) = self.deadlines.first() {
            // Checked here rather than trusting the Sleep (STYLE.md rule 10).
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(entry) = self.on_wire.remove(&rpc_id) else {
                continue;
            };
            self.queue.on_done(rpc_id);
            timed_out += 1;
            self.finish(rpc_id, &entry, "timed_out", now);
            self.report(Completion::Failed {
                rpc_id,
                failure: RpcFailure::TimedOut,
                at: now,
            });
        }
        if timed_out > 0 {
            self.consecutive_timeouts += timed_out;
            self.warn.warn(
                "timeout",
                now,
                format_args!(
                    "lookup RPC unanswered after {:?} ({} in a row)",
                    self.config.timeout, self.consecutive_timeouts
                ),
            );
            let k = self.config.reopen_after_timeouts;
            if k > 0 && self.consecutive_timeouts >= k {
                // A serial (REP) server stuck on one request would be fed the backlog
                // behind it; a fresh connection starts clean (rule 17).
                self.reopen_except(now, None, ReopenReason::Timeouts);
            }
        }
        if self.reopen_at.is_some_and(|at| at <= now) {
            self.reopen_at = None;
            self.open(now);
        }
    }

    /// Sends everything the dispatcher releases. False when cancelled mid-send.
    async fn pump(&mut self, now: Instant) -> bool {
        while let Some((out, parent)) = self.queue.next_send() {
            if !self.send(out, parent, now).await {
                return false;
            }
        }
        true
    }

    /// Writes one released RPC. False when cancelled mid-send.
    async fn send(&mut self, out: Outgoing, parent: Span, now: Instant) -> bool {
        let Outgoing { rpc_id, body } = out;
        // The lookup's span (request id, origin, prompt) is the parent; without one
        // (a reset, or tracing off) this span is a root.
        let (frames, span) = match &body {
            RpcBody::Lookup {
                num_tokens,
                block_hashes,
            } => {
                let span = tracing::debug_span!(
                    parent: &parent,
                    "rpc",
                    rpc_id = rpc_id.0,
                    num_tokens,
                    blocks = block_hashes.len(),
                    hit_tokens = Empty,
                    outcome = Empty,
                    latency_us = Empty,
                );
                let frames = wire::encode_lookup(
                    self.config.format,
                    *num_tokens,
                    self.config.block_size,
                    block_hashes,
                );
                (frames, span)
            }
            RpcBody::Reset => {
                let span = tracing::debug_span!(
                    parent: &parent,
                    "reset",
                    rpc_id = rpc_id.0,
                    outcome = Empty,
                    latency_us = Empty
                );
                match wire::encode_reset(self.config.format) {
                    Ok(frames) => {
                        // Lookups on the wire were all discarded by the reset; a fresh
                        // socket keeps a serial server from answering them first.
                        self.reopen_except(now, Some(rpc_id), ReopenReason::Reset);
                        (frames, span)
                    }
                    Err(error) => {
                        self.warn
                            .warn("no_reset", now, format_args!("reset not sent: {error}"));
                        self.queue.on_done(rpc_id);
                        self.report(Completion::Failed {
                            rpc_id,
                            failure: RpcFailure::NotSent,
                            at: now,
                        });
                        return true;
                    }
                }
            }
        };
        let is_reset = matches!(body, RpcBody::Reset);
        let Some(socket) = self.socket.as_mut() else {
            // No socket (a reopen failed and waits for its backoff): fail fast rather
            // than hold the lookup, so the scheduler is never kept waiting (rule 17).
            self.queue.on_done(rpc_id);
            span.record("outcome", "no_socket");
            self.report(Completion::Failed {
                rpc_id,
                failure: RpcFailure::Transport,
                at: now,
            });
            return true;
        };
        let mut message: Vec<tmq::Message> = Vec::with_capacity(frames.len() + 2);
        message.push(tmq::Message::from(&rpc_id.0.to_be_bytes()[..]));
        message.push(tmq::Message::new());
        message.extend(frames.iter().map(|f| tmq::Message::from(&f[..])));
        // A DEALER queues the message in its pipe even when no peer is connected, so
        // this completes at once unless the high-water mark is reached; bound it anyway.
        let result = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return false,
            r = tokio::time::timeout(self.config.timeout, socket.send(message)) => r,
        };
        match result {
            Ok(Ok(())) => {
                let deadline = now + self.config.timeout;
                self.deadlines.insert((deadline, rpc_id));
                self.on_wire.insert(
                    rpc_id,
                    OnWire {
                        deadline,
                        sent_at: now,
                        is_reset,
                        span,
                    },
                );
                if !is_reset {
                    // Before the report, so a handle that sees the send sees the gauge.
                    self.metrics.lookup_on_wire();
                }
                self.report(Completion::Sent { rpc_id, at: now });
            }
            Ok(Err(error)) => {
                TransportCounters::bump(&self.counters.send_errors);
                self.warn.warn(
                    "send_error",
                    now,
                    format_args!("lookup send failed: {error}"),
                );
                self.fail_unsent(rpc_id, &span, now);
                self.reopen_after_error(now);
            }
            Err(_elapsed) => {
                TransportCounters::bump(&self.counters.send_errors);
                self.warn.warn(
                    "send_error",
                    now,
                    format_args!("lookup send blocked for {:?}", self.config.timeout),
                );
                self.fail_unsent(rpc_id, &span, now);
                self.reopen_after_error(now);
            }
        }
        true
    }

    fn fail_unsent(&mut self, rpc_id: RpcId, span: &Span, now: Instant) {
        self.queue.on_done(rpc_id);
        span.record("outcome", "send_failed");
        self.report(Completion::Failed {
            rpc_id,
            failure: RpcFailure::Transport,
            at: now,
        });
    }

    /// One message from the socket: `[rpc_id, "", frames...]`.
    fn on_message(&mut self, message: tmq::Multipart, now: Instant) {
        let mut parts = message.into_iter();
        let (Some(id), Some(delimiter)) = (parts.next(), parts.next()) else {
            self.bad_envelope(now);
            return;
        };
        let (Ok(id), true) = (
            <[u8; RPC_ID_BYTES]>::try_from(&id[..]),
            delimiter.is_empty(),
        ) else {
            self.bad_envelope(now);
            return;
        };
        let rpc_id = RpcId(u64::from_be_bytes(id));
        let Some(entry) = self.on_wire.remove(&rpc_id) else {
            // Late (after its timeout or a reopen) or duplicated: never applied (rule 17).
            self.metrics.late_reply();
            TransportCounters::bump(&self.counters.late_replies);
            tracing::debug!(rpc_id = rpc_id.0, "late reply dropped");
            return;
        };
        self.deadlines.remove(&(entry.deadline, rpc_id));
        self.queue.on_done(rpc_id);
        self.consecutive_timeouts = 0;
        self.backoff = self.config.reopen_backoff;
        let frames: Vec<Bytes> = parts.map(|m| Bytes::copy_from_slice(&m)).collect();
        let (reply, outcome) = if entry.is_reset {
            match wire::decode_reset_reply(&frames) {
                Ok(ok) => (Reply::Reset { ok }, if ok { "ok" } else { "failed" }),
                Err(error) => {
                    self.warn.warn(
                        "malformed",
                        now,
                        format_args!("malformed reset reply: {error}"),
                    );
                    (Reply::Malformed, "malformed")
                }
            }
        } else {
            match wire::decode_lookup_reply(self.config.format, &frames) {
                Ok(decoded) => {
                    entry.span.record("hit_tokens", decoded.hit_tokens);
                    (
                        Reply::Lookup {
                            hit_tokens: decoded.hit_tokens,
                        },
                        "replied",
                    )
                }
                Err(error) => {
                    self.warn.warn(
                        "malformed",
                        now,
                        format_args!("malformed lookup reply: {error}"),
                    );
                    (Reply::Malformed, "malformed")
                }
            }
        };
        self.finish(rpc_id, &entry, outcome, now);
        self.report(Completion::Reply {
            rpc_id,
            reply,
            at: now,
        });
    }

    fn bad_envelope(&mut self, now: Instant) {
        TransportCounters::bump(&self.counters.bad_envelopes);
        self.warn.warn(
            "bad_envelope",
            now,
            format_args!("dropped a message without an [rpc id, \"\"] envelope"),
        );
    }

    /// Closes the span of an RPC that left the wire, and takes it off the gauge.
    fn finish(&mut self, rpc_id: RpcId, entry: &OnWire, outcome: &'static str, now: Instant) {
        if !entry.is_reset {
            self.metrics.lookup_off_wire();
        }
        let latency = now.saturating_duration_since(entry.sent_at);
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        entry.span.record("outcome", outcome);
        entry.span.record("latency_us", latency_us);
        tracing::debug!(parent: &entry.span, rpc_id = rpc_id.0, outcome, latency_us, "rpc ended");
    }

    /// Drops the socket and opens a new one at once; every RPC on the old one except
    /// `keep` (a reset about to be written to the new socket) fails with
    /// [`RpcFailure::Transport`] (their replies can no longer arrive); queued ones stay
    /// queued.
    fn reopen_except(&mut self, now: Instant, keep: Option<RpcId>, reason: ReopenReason) {
        self.drop_socket(now, keep, reason);
        self.open(now);
    }

    /// After a socket error: drops the socket and opens a new one after the backoff,
    /// which doubles per error until a reply arrives, so a socket that keeps failing
    /// costs a retry per backoff, never a busy loop.
    fn reopen_after_error(&mut self, now: Instant) {
        self.drop_socket(now, None, ReopenReason::Error);
        self.reopen_at = Some(now + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    fn drop_socket(&mut self, now: Instant, keep: Option<RpcId>, reason: ReopenReason) {
        // The metric first: a reader who sees the count sees the metric too.
        self.metrics.reopened(reason);
        TransportCounters::bump(&self.counters.reopens);
        self.consecutive_timeouts = 0;
        drop(self.socket.take());
        for rpc_id in self.queue.reset_in_flight() {
            if Some(rpc_id) == keep {
                continue;
            }
            let Some(entry) = self.on_wire.remove(&rpc_id) else {
                continue;
            };
            self.deadlines.remove(&(entry.deadline, rpc_id));
            self.finish(rpc_id, &entry, "socket_reopened", now);
            self.report(Completion::Failed {
                rpc_id,
                failure: RpcFailure::Transport,
                at: now,
            });
        }
        self.reopen_at = None;
    }

    fn open(&mut self, now: Instant) {
        match open_dealer(&self.context, &self.config.url) {
            Ok(socket) => self.socket = Some(socket),
            Err(error) => {
                TransportCounters::bump(&self.counters.open_errors);
                self.warn.warn(
                    "open_error",
                    now,
                    format_args!(
                        "cannot open a lookup socket to {}: {error}",
                        self.config.url
                    ),
                );
                self.reopen_at = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Arms the one Sleep for the earliest deadline or reopen attempt.
    fn arm(&mut self) {
        let next = self.deadlines.first().map(|(t, _)| *t);
        let next = match (next, self.reopen_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if next != self.armed {
            if let Some(at) = next {
                self.sleep.as_mut().reset(at.into());
            }
            self.armed = next;
        }
    }

    fn report(&self, completion: Completion) {
        let channel = match completion {
            Completion::Sent { .. } => &self.sends,
            _ => &self.completions,
        };
        // The handle is gone only when the client was dropped; the token then ends us.
        let _ = channel.send(completion);
    }
}

/// The next message of the socket, or never when there is none.
async fn next_message(
    socket: &mut Option<tmq::dealer::Dealer>,
) -> Option<tmq::Result<tmq::Multipart>> {
    match socket {
        Some(socket) => socket.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first warning of a kind goes out at once; the next ones within
    /// [`WARN_EVERY`] are counted and reported with the next one due.
    #[test]
    fn warnings_are_rate_limited_per_kind() {
        let mut limiter = WarnLimiter::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(limiter.admit("timeout", t0), Some(0));
        assert_eq!(limiter.admit("timeout", t0 + ms(1)), None);
        assert_eq!(limiter.admit("timeout", t0 + ms(9_999)), None);
        // Another kind has its own budget.
        assert_eq!(limiter.admit("malformed", t0 + ms(2)), Some(0));
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY), Some(2));
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY + ms(1)), None);
        assert_eq!(limiter.admit("timeout", t0 + WARN_EVERY * 3), Some(1));
        assert_eq!(limiter.admit("malformed", t0 + WARN_EVERY * 3), Some(0));
    }
}
