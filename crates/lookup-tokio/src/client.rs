//! [`LookupClient`]: the handle a scheduler keeps (DESIGN.md, "lookup-tokio").

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lookup_core::wire::Format;
use lookup_core::{
    Command, Config, Dispatcher, Event, LookupOutcome, Lookups, Origin, Priority, Probe, Request,
    RequestId, ResetOutcome, RpcBody, RpcFailure, RpcId, Stats,
};
use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Span;
use tracing::field::Empty;

use mooncake_master::{MasterClient, MasterStats};

use crate::actor::{
    Actor, ActorConfig, Completion, ToActor, TransportCounters, WarnLimiter, open_dealer,
};
use crate::direct::{DirectActor, DirectConfig, DirectSettings, Transport};
use crate::metrics::{ClientMetrics, LookupEnd};
use crate::{Endpoint, Error};

/// Answer of a probe that can know nothing: no external tokens to load.
const READY_ZERO: Probe = Probe::Ready {
    external_tokens: 0,
    load_async: false,
};

/// Configuration of a [`LookupClient`].
///
/// Build with [`ClientConfig::new`] (a lookup server over ZeroMQ) or
/// [`ClientConfig::direct`] (the Mooncake master itself) and adjust fields. `core`
/// carries vLLM's keys (`spec/behaviour.md`, "Configuration"); its `max_in_flight` is
/// the number of lookup RPCs the client keeps on the wire at once (1, the default, is
/// vLLM's REQ socket; with the direct transport, queries pipelined on the master
/// connection).
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// The lookup lifecycle's configuration (validated by [`LookupClient::connect`]).
    pub core: Config,
    /// How lookups reach the store: [`Transport::Zmq`] (the default) or
    /// [`Transport::Direct`].
    pub transport: Transport,
    /// Where the lookup server listens (`spec/wire.md`, "Transport"). Used by
    /// [`Transport::Zmq`] only; [`ClientConfig::direct`] sets it to the master's
    /// address, which logs then show.
    pub endpoint: Endpoint,
    /// Wire format of requests and replies; default `tagged-blob` (vLLM 0.33).
    /// `msgpack-hex` has no reset message: a reset then ends as
    /// [`ResetOutcome::TimedOut`] without being sent. [`Transport::Zmq`] only.
    pub format: Format,
    /// Drop and reopen the socket after this many lookup timeouts in a row, so a
    /// serial server stuck on one request is not fed the backlog behind it (rule 17).
    /// 0 never reopens on timeouts. Default 3. [`Transport::Zmq`] only: the master
    /// answers pipelined calls concurrently, and its client reconnects by itself
    /// when the connection breaks.
    pub reopen_after_timeouts: u32,
    /// First wait before trying again when opening a socket (with the direct
    /// transport: connecting to the master) fails; it doubles per failure up to 1 s.
    /// Default 10 ms.
    pub reopen_backoff: Duration,
    /// Most events kept for [`LookupClient::poll_event`]; beyond it the oldest are
    /// dropped and counted in [`ClientStats::events_dropped`]. Default 1,024.
    pub event_capacity: usize,
    /// Slack added to `lookup_timeout_s` when a sync-mode probe waits
    /// ([`LookupClient::probe_wait`]), so the I/O task's own timeout report arrives
    /// first. Default 100 ms.
    pub wait_margin: Duration,
}

impl ClientConfig {
    /// Defaults (`spec/behaviour.md`) for `endpoint` with a block size of
    /// `block_size` tokens.
    #[must_use]
    pub fn new(endpoint: Endpoint, block_size: u32) -> Self {
        Self {
            core: Config::new(block_size),
            transport: Transport::Zmq,
            endpoint,
            format: Format::TaggedBlob,
            reopen_after_timeouts: 3,
            reopen_backoff: Duration::from_millis(10),
            event_capacity: 1024,
            wait_margin: Duration::from_millis(100),
        }
    }

    /// Defaults (`spec/behaviour.md`) with a block size of `block_size` tokens, asking
    /// the Mooncake master of `direct` from this process ([`Transport::Direct`]; see
    /// its docs for the lease side effect and resets). The default
    /// `lookup_prefetch_ttl_s` (2 s) is below the master's default lease (10 s).
    #[must_use]
    pub fn direct(direct: DirectConfig, block_size: u32) -> Self {
        let endpoint = Endpoint::Tcp(direct.master.clone());
        Self {
            transport: Transport::Direct(Box::new(direct)),
            ..Self::new(endpoint, block_size)
        }
    }
}

/// Counters of a [`LookupClient`]: the core's, plus the transport's. All counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// The lifecycle counters of [`Lookups`].
    pub core: Stats,
    /// Prefetch slots in use now (rule 3).
    pub slots_in_use: u32,
    /// RPCs queued or in flight now.
    pub open_rpcs: usize,
    /// Replies dropped because their RPC had already ended (timed out, or the socket
    /// was reopened) or was never sent by this client (rule 17).
    pub late_replies: u64,
    /// Messages dropped because they lacked the `[rpc id, ""]` envelope.
    pub bad_envelopes: u64,
    /// Sockets dropped and opened again (after timeouts, on reset, on errors).
    pub socket_reopens: u64,
    /// Sends that failed.
    pub send_errors: u64,
    /// Receive errors on the socket.
    pub recv_errors: u64,
    /// Failed attempts to open a socket.
    pub open_errors: u64,
    /// Events dropped because nobody polled them ([`ClientConfig::event_capacity`]).
    pub events_dropped: u64,
    /// Sync-mode waits that gave up (`lookup_timeout_s` plus the margin passed with
    /// the lookup still queued) and answered 0 external tokens (rules 10-11).
    pub waits_gave_up: u64,
    /// [`Transport::Direct`] only, once connected: the master client's counters
    /// (`BatchExistKey` calls, keys asked, timeouts, reconnects, late replies). With
    /// the direct transport `send_errors` counts master queries that failed (not
    /// connected, connection lost, refused), `open_errors` failed connect attempts
    /// before the first success, and `socket_reopens`, `recv_errors` and
    /// `bad_envelopes` stay 0.
    pub master: Option<MasterStats>,
}

/// The scheduler's handle on the asynchronous prefix-cache lookup.
///
/// It owns the lifecycle state machine ([`Lookups`]) on the caller's thread, with no
/// lock; one tokio task (the I/O actor) owns the DEALER socket, or with
/// [`Transport::Direct`] the Mooncake master connection (the server's rules are then
/// computed in this process; [`Transport`] documents the lease side effect and why a
/// reset ends as failed). Every method is
/// non-blocking except the explicit waits ([`probe_wait`](Self::probe_wait),
/// [`probe_blocking`](Self::probe_blocking), [`reset_and_wait`](Self::reset_and_wait)):
/// it drains what the actor reported, applies due timeouts, applies the call, hands
/// new RPCs to the actor and queues events. The clock is read once per call (and once
/// per wake-up while waiting).
///
/// Modes (`spec/behaviour.md`, configuration): with `lookup_async = true`,
/// [`probe`](Self::probe) answers [`Probe::Pending`] until the reply is in, and
/// arrivals prefetch when `lookup_prefetch_limit > 0`; with `lookup_async = false`
/// (vLLM's default) use [`probe_wait`](Self::probe_wait) or
/// [`probe_blocking`](Self::probe_blocking), which never answer `Pending` (rule 10).
///
/// Dropping the client closes it.
///
/// # Observability
///
/// Each lookup RPC gets a `lookup` span at debug level with `request_id` (of the
/// request whose call created it), `rpc_id`, `origin`, `num_tokens`, `blocks`, and
/// when it ends `outcome`, `hit_tokens`, `requests` (live requests it answered),
/// `queue_wait_us` and `latency_us`; the I/O task's `rpc` span is its child. Failures
/// are warned about at most once per 10 s per kind. Metrics go to the [`metrics`]
/// recorder installed when the client connects (see [`crate::metrics`]).
///
/// ```
/// use std::sync::Arc;
/// use lookup_core::{BlockHashes, Probe, Request, RequestId};
/// use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
/// use lookup_tokio::{ClientConfig, KeyLayout, LookupClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A reference server on a free TCP port, storing the first two 16-token blocks.
/// let layout = KeyLayout::default();
/// let index = Arc::new(InMemoryIndex::new());
/// let block_hashes = BlockHashes::from_u64s(&[1, 2, 3]);
/// index.insert_chain(&layout, &block_hashes, 2);
/// let server = LookupServer::bind(&"tcp://127.0.0.1:0".parse()?, ServerConfig::new(16, layout), index)?;
///
/// // Sync mode (vLLM's default): the probe waits for the answer.
/// let mut client = LookupClient::connect(ClientConfig::new(server.local_endpoint().clone(), 16))?;
/// let req = Request {
///     request_id: RequestId(7),
///     num_tokens: 50,
///     block_hashes,
///     skip_reading_external_kv: false,
/// };
/// let probe = client.probe_wait(&req, 0).await;
/// assert_eq!(probe, Probe::Ready { external_tokens: 32, load_async: true });
/// client.on_allocated(req.request_id);
/// client.shutdown().await;
/// server.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LookupClient {
    core: Lookups,
    commands: UnboundedSender<ToActor>,
    /// Replies and failures: what a waiting probe waits for.
    completions: UnboundedReceiver<Completion>,
    /// Sends only (`Completion::Sent`): drained, never waited on.
    sends: UnboundedReceiver<Completion>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    runtime: Handle,
    counters: Arc<TransportCounters>,
    events: VecDeque<Event>,
    /// RPCs the core timed out on its own clock before the actor reported them: the
    /// actor's report for them still comes and must not count as unknown.
    expired: HashSet<RpcId>,
    /// Set when a report or an expiry may have changed an answer (not by a mere
    /// send), so that a waiting probe asks the core again only then.
    progressed: bool,
    timeout: Duration,
    wait_margin: Duration,
    event_capacity: usize,
    late_replies: u64,
    events_dropped: u64,
    waits_gave_up: u64,
    /// The clock read of the current call.
    clock: Instant,
    /// Lookup RPCs queued or in flight: when each was submitted, and its span.
    /// Bounded by the core's open RPCs; emptied on close.
    open: HashMap<RpcId, OpenLookup>,
    metrics: ClientMetrics,
    warn: WarnLimiter,
    /// [`Transport::Direct`]: the actor's master client, once connected.
    master: Option<Arc<OnceLock<MasterClient>>>,
}

/// What the handle keeps about one lookup RPC until it ends.
#[derive(Debug)]
struct OpenLookup {
    submitted_at: Instant,
    span: Span,
}

impl LookupClient {
    /// Connects to `config.endpoint` (or, with [`Transport::Direct`], to the master)
    /// and spawns the I/O actor on the current tokio runtime. The socket connects in
    /// the background: a server that is not up yet is not an error (lookups sent
    /// before it comes up wait in the socket, or time out). The direct transport
    /// connects to the master in the background too: lookups wait for the first
    /// attempt, and fail open while the master cannot be reached.
    ///
    /// With the direct transport, a `lookup_prefetch_ttl_s` that is not below
    /// [`DirectConfig::lease_ttl`] is logged as a warning: a cached result could then
    /// outlive the read lease that keeps its blocks in the store.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime (use
    /// [`connect_with_handle`](Self::connect_with_handle));
    /// [`Error::Core`] for an invalid `config.core`; [`Error::Zmq`] when the socket
    /// cannot be created or the endpoint is refused by ZeroMQ;
    /// [`Error::InvalidClientConfig`] for a direct transport setting that cannot work
    /// ([`DirectConfig::validate`]).
    pub fn connect(config: ClientConfig) -> Result<Self, Error> {
        let handle = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Self::connect_with_handle(config, &handle)
    }

    /// As [`connect`](Self::connect), spawning the actor on `runtime`, for schedulers
    /// that do not run inside tokio. Keep the runtime alive as long as the client
    /// (a current-thread runtime must be driven by another thread).
    ///
    /// # Errors
    /// As [`connect`](Self::connect), except [`Error::NoRuntime`].
    #[tracing::instrument(level = "debug", skip_all, fields(endpoint = %config.endpoint))]
    pub fn connect_with_handle(config: ClientConfig, runtime: &Handle) -> Result<Self, Error> {
        // The socket registers with the runtime's reactor, and the actor's timer with
        // its clock: enter it first.
        let _entered = runtime.enter();
        let core = Lookups::new(config.core.clone())?;
        let dispatcher = Dispatcher::new(&config.core);
        let (commands, command_rx) = tokio::sync::mpsc::unbounded_channel();
        let (completion_tx, completions) = tokio::sync::mpsc::unbounded_channel();
        let (sent_tx, sends) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let counters = Arc::new(TransportCounters::default());
        let timeout = config.core.timeout();
        let (task, master) = match &config.transport {
            Transport::Zmq => {
                let url = config.endpoint.url();
                let context = tmq::Context::new();
                let socket = open_dealer(&context, &url)?;
                let actor = Actor::new(
                    ActorConfig {
                        url,
                        format: config.format,
                        block_size: config.core.block_size,
                        timeout,
                        reopen_after_timeouts: config.reopen_after_timeouts,
                        reopen_backoff: config.reopen_backoff,
                    },
                    dispatcher,
                    context,
                    socket,
                    command_rx,
                    completion_tx,
                    sent_tx,
                    cancel.clone(),
                    Arc::clone(&counters),
                );
                (runtime.spawn(actor.run()), None)
            }
            Transport::Direct(direct) => {
                direct.validate()?;
                if direct.ttl_outlives_lease(config.core.lookup_prefetch_ttl_s) {
                    tracing::warn!(
                        lookup_prefetch_ttl_s = config.core.lookup_prefetch_ttl_s,
                        lease_ttl_s = direct.lease_ttl.as_secs_f64(),
                        "lookup_prefetch_ttl_s is not below the Mooncake master's read lease: \
                         a cached result may name blocks evicted since"
                    );
                }
                let master = Arc::new(OnceLock::new());
                let actor = DirectActor::new(
                    DirectSettings {
                        direct: DirectConfig::clone(direct),
                        block_size: config.core.block_size,
                        timeout,
                        reconnect_backoff: config.reopen_backoff,
                    },
                    dispatcher,
                    Arc::clone(&master),
                    command_rx,
                    completion_tx,
                    sent_tx,
                    cancel.clone(),
                    Arc::clone(&counters),
                );
                (runtime.spawn(actor.run()), Some(master))
            }
        };
        Ok(Self {
            core,
            commands,
            completions,
            sends,
            cancel,
            task,
            runtime: runtime.clone(),
            counters,
            events: VecDeque::new(),
            expired: HashSet::new(),
            progressed: false,
            timeout,
            wait_margin: config.wait_margin,
            event_capacity: config.event_capacity,
            late_replies: 0,
            events_dropped: 0,
            waits_gave_up: 0,
            clock: Instant::now(),
            open: HashMap::new(),
            metrics: ClientMetrics::new(),
            warn: WarnLimiter::default(),
            master,
        })
    }

    /// A request arrived (vLLM's `on_new_request`): prefetch its lookup when prefetch
    /// is on and the request is eligible (rules 1-3). Never blocks.
    pub fn on_new_request(&mut self, req: &Request) {
        let now = self.begin();
        self.core.on_new_request(req, now);
        self.end_for(Some(req.request_id));
    }

    /// How many external tokens the scheduler can load for `req`, whose local (GPU)
    /// hit is `num_computed_tokens` tokens (vLLM's `get_num_new_matched_tokens`).
    /// Never blocks: answers [`Probe::Pending`] while the lookup is queued or in
    /// flight (rules 4-7, 11-12; see [`Lookups::probe`]). After close: `Ready(0)`.
    pub fn probe(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let now = self.begin();
        let answer = self.core.probe(req, num_computed_tokens, now);
        self.end_for(Some(req.request_id));
        answer
    }

    /// Sync mode (rule 10): probes and, while the answer is pending, waits for the
    /// I/O actor's reports, until the answer is `Ready`. Never answers `Pending`.
    ///
    /// Bounded: a lookup on the wire fails open when its `lookup_timeout_s` passes
    /// (rule 11); if the answer is still pending `lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`] after the call (its RPC queued behind a hung one),
    /// it answers `Ready(0)`, counts [`ClientStats::waits_gave_up`] and leaves the
    /// lookup running for a later probe.
    #[tracing::instrument(level = "trace", skip_all, fields(request_id = req.request_id.0))]
    pub async fn probe_wait(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let mut now = self.begin();
        let give_up = now + self.timeout + self.wait_margin;
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end_for(Some(req.request_id));
            if answer != Probe::Pending {
                return answer;
            }
            self.progressed = false;
            while !self.progressed {
                if now >= give_up {
                    self.gave_up(now);
                    return READY_ZERO;
                }
                let until = self.wake_at(give_up);
                let got = tokio::time::timeout_at(until.into(), self.completions.recv()).await;
                self.after_wait(got.ok());
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
    /// it from a current-thread runtime's thread: the actor could not run.
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
        let give_up = now + self.timeout + self.wait_margin;
        loop {
            let answer = self.core.probe(req, num_computed_tokens, now);
            self.end_for(Some(req.request_id));
            if answer != Probe::Pending {
                return Ok(answer);
            }
            self.progressed = false;
            while !self.progressed {
                if now >= give_up {
                    self.gave_up(now);
                    return Ok(READY_ZERO);
                }
                let until = self.wake_at(give_up);
                let got = self.block_until(until, in_worker);
                self.after_wait(got);
                now = self.begin();
            }
        }
    }

    /// Rule 8: the request got its blocks; its lookup is consumed. Never blocks.
    pub fn on_allocated(&mut self, request_id: RequestId) {
        self.begin();
        self.core.on_allocated(request_id);
        self.end();
    }

    /// Rule 8: the request finished or was aborted; its queued lookup is never sent
    /// (rule 9). Never blocks.
    pub fn on_finished(&mut self, request_id: RequestId) {
        self.begin();
        self.core.on_finished(request_id);
        self.end();
    }

    /// Rule 8: the request was preempted; its lookup is dropped. Never blocks.
    pub fn on_preempted(&mut self, request_id: RequestId) {
        self.begin();
        self.core.on_preempted(request_id);
        self.end();
    }

    /// Rule 13: drops every lookup and sends one reset RPC (on a fresh socket, so a
    /// serial server does not answer discarded lookups first). Returns its id; the
    /// outcome comes as [`Event::ResetDone`] from [`poll_event`](Self::poll_event).
    /// `None` after close. Never blocks.
    #[tracing::instrument(level = "debug", skip_all)]
    pub fn reset(&mut self) -> Option<RpcId> {
        let now = self.begin();
        let rpc_id = self.core.reset(now);
        self.end();
        rpc_id
    }

    /// [`reset`](Self::reset) and wait for its outcome, at most `lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`] (then [`ResetOutcome::TimedOut`]). Other events
    /// stay queued for [`poll_event`](Self::poll_event).
    ///
    /// # Errors
    /// [`Error::Closed`] after close.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn reset_and_wait(&mut self) -> Result<ResetOutcome, Error> {
        let rpc_id = self.reset().ok_or(Error::Closed)?;
        let mut now = Instant::now();
        let give_up = now + self.timeout + self.wait_margin;
        loop {
            if let Some(outcome) = self.take_reset_event(rpc_id) {
                return Ok(outcome);
            }
            if now >= give_up || self.core.is_closed() {
                return Ok(ResetOutcome::TimedOut);
            }
            let until = self.wake_at(give_up);
            let got = tokio::time::timeout_at(until.into(), self.completions.recv()).await;
            self.after_wait(got.ok());
            now = self.begin();
            self.end();
        }
    }

    /// Waits until the I/O actor reports something (a send, a reply, a failure) or
    /// `max_wait` passes, and applies it. For async schedulers that want to sleep
    /// until a pending probe may have become ready instead of polling.
    pub async fn wait_progress(&mut self, max_wait: Duration) {
        let now = self.begin();
        self.end();
        let until = self.wake_at(now + max_wait);
        let got = tokio::time::timeout_at(until.into(), self.completions.recv()).await;
        self.after_wait(got.ok());
        self.begin();
        self.end();
    }

    /// Applies whatever the actor reported and any due timeout, with no other input.
    /// Never blocks. Every other call does this first; call it when idle to keep
    /// [`stats`](Self::stats) and [`poll_event`](Self::poll_event) current.
    pub fn drive(&mut self) {
        self.begin();
        self.end();
    }

    /// Rule 14: cancels everything and stops the I/O actor, which drops its socket
    /// (linger 0: nothing is sent afterwards, nothing hangs). Later calls never panic;
    /// probes answer `Ready(0)`. Idempotent.
    #[tracing::instrument(level = "debug", skip_all)]
    pub fn close(&mut self) {
        self.close_core();
        self.events.clear();
        self.expired.clear();
    }

    /// True after [`close`](Self::close), or once the I/O actor ended.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// True once the I/O actor's task has ended (after close, or if it died).
    #[must_use]
    pub fn is_actor_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// [`close`](Self::close), then waits until the I/O actor has ended and dropped
    /// its socket.
    pub async fn shutdown(mut self) {
        self.close();
        if let Err(error) = (&mut self.task).await {
            tracing::warn!(%error, "lookup I/O task ended abnormally");
        }
    }

    /// The next event (lookup and reset outcomes), oldest first. Drains reports first.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.drive();
        self.events.pop_front()
    }

    /// Counters since [`connect`](Self::connect). Drains reports first.
    pub fn stats(&mut self) -> ClientStats {
        self.drive();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        ClientStats {
            core: self.core.stats().clone(),
            slots_in_use: self.core.slots_in_use(),
            open_rpcs: self.core.open_rpcs(),
            late_replies: load(&self.counters.late_replies) + self.late_replies,
            bad_envelopes: load(&self.counters.bad_envelopes),
            socket_reopens: load(&self.counters.reopens),
            send_errors: load(&self.counters.send_errors),
            recv_errors: load(&self.counters.recv_errors),
            open_errors: load(&self.counters.open_errors),
            events_dropped: self.events_dropped,
            waits_gave_up: self.waits_gave_up,
            master: self
                .master
                .as_ref()
                .and_then(|m| m.get())
                .map(MasterClient::stats),
        }
    }

    /// The lifecycle state machine, read-only (as of the last call; see
    /// [`drive`](Self::drive)).
    #[must_use]
    pub fn core(&self) -> &Lookups {
        &self.core
    }

    /// Start of every call: the call's one clock read, then the actor's reports, then
    /// due timeouts (call-order contract of [`Lookups`]).
    fn begin(&mut self) -> Instant {
        let now = Instant::now();
        self.clock = now;
        loop {
            match self.completions.try_recv() {
                // After close the core forgets every RPC: late reports are moot.
                Ok(_) if self.core.is_closed() => {}
                Ok(completion) => {
                    self.drain_sends();
                    self.apply(completion);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.actor_gone();
                    break;
                }
            }
        }
        self.drain_sends();
        if self.core.poll_timeout().is_some_and(|t| t <= now) {
            // Events so far came from the actor's reports; those after this call are
            // the core's own expiries, whose actor reports are still to come.
            self.collect_events(false);
            self.core.handle_timeout(now);
            self.collect_events(true);
            self.progressed = true;
        }
        now
    }

    /// End of every call: new RPCs to the actor, events to the queue.
    fn end(&mut self) {
        self.end_for(None);
    }

    /// As [`end`](Self::end) after a call about `request_id`: a lookup RPC created
    /// now is that request's, so its span carries the request id (the core's command
    /// does not; STYLE.md rule 11). Then the metrics follow the core's counters.
    fn end_for(&mut self, request_id: Option<RequestId>) {
        while let Some(command) = self.core.poll_transmit() {
            let span = match &command {
                Command::Send {
                    rpc_id,
                    priority,
                    body:
                        RpcBody::Lookup {
                            num_tokens,
                            block_hashes,
                        },
                    ..
                } => {
                    // The core gives probe lookups the awaited priority, prefetches
                    // the other; a promotion comes later as its own command.
                    let origin = match priority {
                        Priority::Awaited => Origin::Probe,
                        Priority::Prefetch => Origin::Arrival,
                    };
                    let span = tracing::debug_span!(
                        "lookup",
                        request_id = request_id.map(|r| r.0),
                        rpc_id = rpc_id.0,
                        origin = origin_label(origin),
                        num_tokens,
                        blocks = block_hashes.len(),
                        outcome = Empty,
                        hit_tokens = Empty,
                        requests = Empty,
                        queue_wait_us = Empty,
                        latency_us = Empty,
                    );
                    tracing::debug!(parent: &span, "lookup submitted");
                    self.open.insert(
                        *rpc_id,
                        OpenLookup {
                            submitted_at: self.clock,
                            span: span.clone(),
                        },
                    );
                    span
                }
                Command::Cancel { rpc_id } => {
                    self.lookup_cancelled(*rpc_id, self.clock);
                    Span::none()
                }
                _ => Span::none(),
            };
            if self.commands.send((command, span)).is_err() {
                self.actor_gone();
                break;
            }
        }
        self.collect_events(false);
        let joined = self
            .metrics
            .sync(self.core.stats(), self.core.slots_in_use());
        if let (Some(request_id), 1..) = (request_id, joined) {
            tracing::debug!(
                request_id = request_id.0,
                "lookup joined an identical RPC already queued or in flight"
            );
        }
    }

    /// A lookup RPC was cancelled before it was sent (rule 9).
    fn lookup_cancelled(&mut self, rpc_id: RpcId, now: Instant) {
        if let Some(open) = self.open.remove(&rpc_id) {
            let latency = now.saturating_duration_since(open.submitted_at);
            self.metrics.lookup_ended(LookupEnd::Cancelled, latency);
            record_end(&open.span, LookupEnd::Cancelled, None, 0, latency);
        }
    }

    /// A lookup RPC ended (the core's [`Event::LookupDone`]).
    fn lookup_done(
        &mut self,
        rpc_id: RpcId,
        outcome: LookupOutcome,
        requests: u32,
        total: Duration,
    ) {
        let end = LookupEnd::of(outcome, requests);
        self.metrics.lookup_ended(end, total);
        if let Some(open) = self.open.remove(&rpc_id) {
            let hit_tokens = match outcome {
                LookupOutcome::Hit { hit_tokens } => Some(hit_tokens),
                _ => None,
            };
            record_end(&open.span, end, hit_tokens, requests, total);
        }
    }

    /// Rules 10-11: a sync-mode wait gave up and answers 0 external tokens.
    fn gave_up(&mut self, now: Instant) {
        self.waits_gave_up += 1;
        self.warn.warn(
            "wait_gave_up",
            now,
            format_args!(
                "a sync-mode probe waited {:?} without an answer and loads nothing",
                self.timeout + self.wait_margin
            ),
        );
    }

    fn apply(&mut self, completion: Completion) {
        match completion {
            Completion::Sent { rpc_id, at } => {
                if let Some(open) = self.open.get(&rpc_id) {
                    let wait = at.saturating_duration_since(open.submitted_at);
                    self.metrics.lookup_sent(wait);
                    open.span.record("queue_wait_us", micros(wait));
                }
                self.core.handle_sent(rpc_id, at);
            }
            Completion::Reply { rpc_id, reply, at } => {
                self.progressed = true;
                if self.expired.remove(&rpc_id) {
                    self.late_replies += 1;
                    self.metrics.late_reply();
                } else {
                    self.core.handle_reply(rpc_id, reply, at);
                }
            }
            Completion::Failed {
                rpc_id,
                failure,
                at,
            } => {
                self.progressed = true;
                if !self.expired.remove(&rpc_id) {
                    self.core.handle_rpc_error(rpc_id, failure, at);
                }
            }
        }
    }

    /// Applies every send reported so far. Called before each reply or failure, so
    /// an RPC's send is applied before its end: the actor reports the send first, and
    /// receiving the end makes the earlier send visible.
    fn drain_sends(&mut self) {
        while let Ok(completion) = self.sends.try_recv() {
            if !self.core.is_closed() {
                self.apply(completion);
            }
        }
    }

    fn after_wait(&mut self, got: Option<Option<Completion>>) {
        match got {
            Some(Some(_)) if self.core.is_closed() => {}
            Some(Some(completion)) => {
                self.drain_sends();
                self.apply(completion);
            }
            Some(None) => self.actor_gone(),
            None => {}
        }
    }

    /// When a wait must end: the core's next deadline or `give_up`, whichever first.
    fn wake_at(&self, give_up: Instant) -> Instant {
        self.core.poll_timeout().map_or(give_up, |t| t.min(give_up))
    }

    fn block_until(&mut self, until: Instant, in_worker: bool) -> Option<Option<Completion>> {
        let runtime = self.runtime.clone();
        let completions = &mut self.completions;
        let wait = async move {
            tokio::time::timeout_at(until.into(), completions.recv())
                .await
                .ok()
        };
        if in_worker {
            tokio::task::block_in_place(|| runtime.block_on(wait))
        } else {
            runtime.block_on(wait)
        }
    }

    fn collect_events(&mut self, core_expiries: bool) {
        while let Some(event) = self.core.poll_event() {
            match event {
                Event::LookupDone {
                    rpc_id,
                    outcome,
                    requests,
                    total,
                    ..
                } => self.lookup_done(rpc_id, outcome, requests, total),
                Event::ResetDone { outcome, .. } => self.metrics.reset_ended(outcome),
            }
            if core_expiries {
                match event {
                    Event::LookupDone {
                        rpc_id,
                        outcome: LookupOutcome::Failed(RpcFailure::TimedOut),
                        ..
                    }
                    | Event::ResetDone {
                        rpc_id,
                        outcome: ResetOutcome::TimedOut,
                    } => {
                        self.expired.insert(rpc_id);
                    }
                    _ => {}
                }
            }
            if self.event_capacity == 0 {
                self.events_dropped += 1;
                continue;
            }
            if self.events.len() >= self.event_capacity {
                self.events.pop_front();
                self.events_dropped += 1;
            }
            self.events.push_back(event);
        }
    }

    fn take_reset_event(&mut self, rpc_id: RpcId) -> Option<ResetOutcome> {
        let index = self
            .events
            .iter()
            .position(|e| matches!(e, Event::ResetDone { rpc_id: id, .. } if *id == rpc_id))?;
        match self.events.remove(index) {
            Some(Event::ResetDone { outcome, .. }) => Some(outcome),
            _ => None,
        }
    }

    /// The actor ended without close (it cannot panic by design, but a runtime shut
    /// down under it ends it): fail open from now on, as after close (rule 14).
    fn actor_gone(&mut self) {
        self.progressed = true;
        if !self.core.is_closed() {
            tracing::error!("lookup I/O task ended; the client answers 0 hits from now on");
            self.close_core();
        }
    }

    /// Closes the core and stops the actor; lookup RPCs still open end as cancelled
    /// (rule 14) and the gauges drop this client's share.
    fn close_core(&mut self) {
        self.core.close();
        self.cancel.cancel();
        if !self.open.is_empty() {
            let now = Instant::now();
            let ids: Vec<RpcId> = self.open.keys().copied().collect();
            for rpc_id in ids {
                self.lookup_cancelled(rpc_id, now);
            }
        }
        self.metrics
            .sync(self.core.stats(), self.core.slots_in_use());
    }
}

impl Drop for LookupClient {
    fn drop(&mut self) {
        self.close_core();
    }
}

/// The `origin` label and span field of a lookup.
fn origin_label(origin: Origin) -> &'static str {
    match origin {
        Origin::Arrival => "arrival",
        Origin::Probe => "probe",
    }
}

/// Microseconds, saturating (for span fields).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Records how a lookup RPC ended on its span, and logs it there.
fn record_end(
    span: &Span,
    end: LookupEnd,
    hit_tokens: Option<u32>,
    requests: u32,
    latency: Duration,
) {
    if span.is_disabled() {
        return;
    }
    let latency_us = micros(latency);
    span.record("outcome", end.as_str());
    if let Some(hit_tokens) = hit_tokens {
        span.record("hit_tokens", hit_tokens);
    }
    span.record("requests", requests);
    span.record("latency_us", latency_us);
    tracing::debug!(parent: span, outcome = end.as_str(), latency_us, "lookup ended");
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use lookup_core::BlockHashes;
    use tracing_subscriber::fmt::format::FmtSpan;

    use super::*;
    use lookup_server::{InMemoryIndex, KeyLayout, LookupServer, ServerConfig};

    /// A log sink the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().expect("log lock").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// STYLE.md rule 11: the lookup's span names the request, its origin and prompt,
    /// and when it ends the outcome and hit; the I/O task's `rpc` span is its child.
    #[tokio::test(flavor = "current_thread")]
    async fn lookup_span_carries_request_and_outcome() {
        let logs = Captured::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_span_events(FmtSpan::CLOSE)
            .with_writer(move || sink.clone())
            .finish();
        // This thread runs the test, the server and the I/O task.
        let _default = tracing::subscriber::set_default(subscriber);

        let layout = KeyLayout::default();
        let index = Arc::new(InMemoryIndex::new());
        let block_hashes = BlockHashes::from_u64s(&[1, 2, 3]);
        index.insert_chain(&layout, &block_hashes, 2);
        let server = LookupServer::bind(
            &"tcp://127.0.0.1:0".parse().expect("endpoint"),
            ServerConfig::new(16, layout),
            index,
        )
        .expect("bind");
        let mut config = ClientConfig::new(server.local_endpoint().clone(), 16);
        config.core.lookup_async = true;
        config.core.lookup_prefetch_limit = 4;
        let mut client = LookupClient::connect(config).expect("connect");
        let req = Request {
            request_id: RequestId(7),
            num_tokens: 50,
            block_hashes,
            skip_reading_external_kv: false,
        };
        client.on_new_request(&req);
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer = loop {
            match client.probe(&req, 0) {
                Probe::Pending => {
                    assert!(Instant::now() < deadline, "no answer");
                    client.wait_progress(Duration::from_millis(20)).await;
                }
                answer => break answer,
            }
        };
        assert_eq!(
            answer,
            Probe::Ready {
                external_tokens: 32,
                load_async: true
            }
        );
        client.on_finished(req.request_id);
        client.shutdown().await;
        server.shutdown().await;

        let text = String::from_utf8(logs.0.lock().expect("log lock").clone()).expect("utf-8");
        let closed = text
            .lines()
            .find(|l| l.contains(" lookup{") && l.contains("}: lookup_tokio::client: close "))
            .unwrap_or_else(|| panic!("no closed lookup span in:\n{text}"));
        for field in [
            "request_id=7",
            "rpc_id=1",
            "origin=\"arrival\"",
            "num_tokens=50",
            "blocks=3",
            "outcome=\"hit\"",
            "hit_tokens=32",
            "requests=1",
            "queue_wait_us=",
            "latency_us=",
        ] {
            assert!(closed.contains(field), "{field} missing from: {closed}");
        }
        assert!(
            text.lines()
                .any(|l| l.contains("lookup{request_id=7") && l.contains("}:rpc{rpc_id=1")),
            "no rpc span under the lookup span in:\n{text}"
        );
    }
}
