//! [`LookupClient`]: the handle a scheduler keeps (DESIGN.md, "lookup-tokio").

mod builder;
mod config;
mod connect;
mod extra_config;
mod handle;
mod observer;
mod step;
#[cfg(test)]
mod tests;
mod wait;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lookup_core::{Command, Event, Lookups, Probe, Request, RequestId, RpcId, WireEvent};
use mooncake_master::batch::LeaseTtl;
use mooncake_master::{BatchStats, Coalescer, MasterClient};
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use builder::ClientBuilder;
pub use config::{ClientConfig, ClientStats};
pub use extra_config::{KvConnectorExtraConfig, VLLM_STORE_KEYS};
pub use handle::LookupHandle;
pub use step::Step;
pub use wait::Deadline;

use crate::clock;
use crate::io::{Link, ToIoBatch, TransportStats};
use crate::warn::WarnLimiter;
use handle::Announce;
use observer::ClientObserver;

/// Answer of a probe that can know nothing: no external tokens to load.
const READY_ZERO: Probe = Probe::Ready {
    external_tokens: 0,
    load_async: false,
};

/// The scheduler's handle on the asynchronous prefix-cache lookup.
///
/// It owns the lifecycle state machine ([`Lookups`]) on the caller's thread, with no
/// lock; one tokio task (the I/O task) owns the DEALER socket, or with
/// [`Transport::Direct`](crate::Transport::Direct) the Mooncake master connection (the server's rules are then
/// computed in this process; [`Transport`](crate::Transport) documents the lease side effect and why a
/// reset ends as failed). Every method is
/// non-blocking except the explicit waits ([`probe_until`](Self::probe_until),
/// [`probe_until_blocking`](Self::probe_until_blocking),
/// [`reset_and_wait`](Self::reset_and_wait)): it applies what the I/O task reported
/// (the core's [`WireEvent`]s), applies the call, and hands new RPCs to the I/O task.
/// The clock is read once per call (and once per wake-up while waiting). Deadlines
/// are the I/O task's: a timed-out RPC reaches the client as a wire event like a
/// reply.
///
/// Probes (`spec/behaviour.md`, rules 4-12): three forms, each with its latency at
/// the call site. [`probe`](Self::probe) never waits (`Pending` means "try again
/// next step"); [`probe_until`](Self::probe_until) waits up to a [`Deadline`]
/// (`Answer` is sync mode, rule 10: never `Pending`; `Within(budget)` or
/// `At(instant)` is prefetch plus a bounded wait); and
/// [`probe_until_blocking`](Self::probe_until_blocking) is its twin for thread
/// schedulers. [`step_deadline`](Self::step_deadline) gives the deadline the
/// configuration's `lookup_async` stands for. Arrivals prefetch when `lookup_async`
/// and `lookup_prefetch_limit > 0`.
///
/// Dropping the client closes it.
///
/// # Observability
///
/// Each lookup RPC gets a `lookup` span at debug level with `request_id` (of the
/// request whose call created it), `caller_request_id` (the caller's own id, given
/// to [`on_new_request_with_id`](Self::on_new_request_with_id)), `rpc_id`, `origin`, `num_tokens`, `blocks`, and
/// when it ends `outcome`, `hit_tokens`, `requests` (live requests it answered),
/// `queue_wait_us` and `latency_us`; the I/O task's `rpc` span is its child. Failures
/// are warned about at most once per 10 s per kind. Metrics go to the [`metrics`]
/// recorder installed when the client connects (see [`crate::metrics`]).
///
/// ```
/// use std::sync::Arc;
/// use lookup_core::{BlockHashes, Probe, Request, RequestId};
/// use lookup_server::{InMemoryIndex, LookupServer, ServerConfig};
/// use lookup_tokio::{ClientConfig, Deadline, KeyLayout, LookupClient};
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
/// let mut client = LookupClient::connect_lazy(ClientConfig::zmq(server.local_endpoint().clone(), 16))?;
/// let req = Request::new(RequestId(7), 50, block_hashes);
/// let probe = client.probe_until(&req, 0, Deadline::Answer).await;
/// assert_eq!(probe, Probe::Ready { external_tokens: 32, load_async: true });
/// client.on_allocated(req.request_id);
/// client.shutdown().await;
/// server.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LookupClient {
    core: Lookups<ClientObserver>,
    commands: UnboundedSender<ToIoBatch>,
    /// What the I/O task reports: one core [`WireEvent`] per RPC that ended.
    wire_events: UnboundedReceiver<WireEvent>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    runtime: Handle,
    transport: Arc<TransportStats>,
    /// Set when a wire event was applied (an answer may have changed), so that a
    /// waiting probe asks the core again only then.
    progressed: bool,
    /// How long a sync-mode wait lasts at most: `lookup_timeout_s` plus
    /// [`ClientConfig::wait_margin`].
    wait_limit: Duration,
    /// [`ClientConfig::probe_budget`].
    probe_budget: Duration,
    waits_gave_up: u64,
    warn: WarnLimiter,
    /// [`Transport::Direct`](crate::Transport::Direct): the I/O task's master client, once connected.
    master: Option<Arc<OnceLock<MasterClient>>>,
    /// [`Transport::Direct`](crate::Transport::Direct): the I/O task's batcher, once connected.
    batch: Arc<OnceLock<Coalescer>>,
    /// What [`LookupHandle`]s announce.
    announced: UnboundedReceiver<Announce>,
    /// Kept so that [`handle`](Self::handle) can make more.
    announce: UnboundedSender<Announce>,
    /// Set by the first [`handle`](Self::handle): before it nothing can be announced,
    /// so a call does not read the empty channel (cold cache lines after a step).
    handles_made: AtomicBool,
    /// What the I/O task knows of its connection (the strict connect waits on it).
    link: watch::Receiver<Link>,
}

impl LookupClient {
    /// [`Transport::Direct`](crate::Transport::Direct) only, once connected: how lookups shared master calls
    /// (batches, lookups, keys wanted and asked, keys taken from the presence cache,
    /// cache drops; [`mooncake_master::batch`]). `None` for ZeroMQ or before the
    /// first connect.
    #[must_use]
    pub fn batch_stats(&self) -> Option<BatchStats> {
        self.batch.get().map(Coalescer::stats)
    }

    /// [`Transport::Direct`](crate::Transport::Direct) only, once connected: the Mooncake master's read lease
    /// in use, the master's own once read (one `GetReplicaList` at the first hit per
    /// leader), [`DirectConfig::lease_ttl`](crate::DirectConfig::lease_ttl) before
    /// that or when the master cannot report it (`spec/mooncake-master-rpc.md`, "Where
    /// the lease can be read"). `None` for ZeroMQ or before the first connect.
    #[must_use]
    pub fn master_lease(&self) -> Option<LeaseTtl> {
        self.batch.get().map(Coalescer::lease)
    }

    /// A request arrived (vLLM's `on_new_request`): prefetch its lookup when prefetch
    /// is on and the request is eligible (rules 1-3). Never blocks. Its arrival starts
    /// the clock of `lookup_request_lookup_seconds` (arrival to first `Ready`
    /// answer, [`crate::metrics`]).
    pub fn on_new_request(&mut self, req: &Request) {
        let now = self.begin();
        self.arrive_at(req, None, now);
        self.end();
    }

    /// As [`on_new_request`](Self::on_new_request), naming the request by the
    /// caller's own id (vLLM's `request.request_id` string): the `lookup` spans of
    /// its lookups carry it as `caller_request_id`, beside the numeric `request_id`.
    /// Kept until [`on_finished`](Self::on_finished) (or the
    /// [`end_idle`](Self::end_idle) sweep).
    pub fn on_new_request_with_id(&mut self, req: &Request, caller_id: &str) {
        let now = self.begin();
        self.arrive_at(req, Some(caller_id), now);
        self.end();
    }

    /// How many external tokens the scheduler can load for `req`, whose local (GPU)
    /// hit is `num_computed_tokens` tokens (vLLM's `get_num_new_matched_tokens`).
    /// Never blocks: answers [`Probe::Pending`] while the lookup is queued or in
    /// flight (rules 4-7, 11-12; see [`Lookups::probe`]). After close: `Ready(0)`.
    pub fn probe(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let now = self.begin();
        let answer = self.probe_core(req, num_computed_tokens, now);
        self.end();
        answer
    }

    /// The core's probe, observed: external tokens counted, the request's first
    /// `Ready` answer timed.
    fn probe_core(&mut self, req: &Request, num_computed_tokens: u32, now: Instant) -> Probe {
        let answer = self.core.probe(req, num_computed_tokens, now);
        self.core.observer_mut().probed(req.request_id, answer);
        answer
    }

    /// What `request_id`'s last `Ready` answer rested on: a hit, a miss, nothing to
    /// ask, or an unavailable store, so that a fail-open 0 never reads as a miss
    /// (`spec/behaviour.md` rule 11; [`Lookups::answer_of`]). As of the last call.
    #[must_use]
    pub fn answer_of(&self, request_id: RequestId) -> Option<lookup_core::Answer> {
        self.core.answer_of(request_id)
    }

    /// A cloneable, `Send` handle that other tasks use to announce arrivals and
    /// finishes into this client (applied at its next call).
    #[must_use]
    pub fn handle(&self) -> LookupHandle {
        // Relaxed: read back by this client's own calls, after this one returns.
        self.handles_made.store(true, Ordering::Relaxed);
        LookupHandle {
            tx: self.announce.clone(),
        }
    }

    /// Ends every request not seen (no arrival, no probe) for longer than
    /// `older_than`, as [`on_finished`](Self::on_finished) would, and returns how
    /// many: the sweep for schedulers that may lose requests without finishing them
    /// ([`Lookups::end_idle`]; [`ClientStats::tracked_requests`] shows what is held).
    pub fn end_idle(&mut self, older_than: Duration) -> usize {
        let now = self.begin();
        self.core.observer_mut().sweep(older_than);
        let ended = self.core.end_idle(older_than, now);
        self.end();
        ended
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
        self.core.observer_mut().finished(request_id);
        self.core.on_finished(request_id);
        self.end();
    }

    /// Rule 8: the request was preempted; `lookup_on_preemption` says what happens to its lookup. Never blocks.
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

    /// Applies whatever the I/O task reported, with no other input. Never blocks.
    /// Every other call does this first; call it when idle to keep
    /// [`stats`](Self::stats) and [`poll_event`](Self::poll_event) current.
    pub fn drive(&mut self) {
        self.begin();
        self.end();
    }

    /// Rule 14: cancels everything and stops the I/O task, which drops its socket
    /// (linger 0: nothing is sent afterwards, nothing hangs). Later calls never panic;
    /// probes answer `Ready(0)`. Idempotent.
    #[tracing::instrument(level = "debug", skip_all)]
    pub fn close(&mut self) {
        self.close_core();
        while self.core.poll_event().is_some() {}
    }

    /// True after [`close`](Self::close), or once the I/O task ended.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// True once the I/O task has ended (after close, or if it died).
    #[must_use]
    pub fn is_actor_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// [`close`](Self::close), then waits until the I/O task has ended and dropped
    /// its socket.
    pub async fn shutdown(mut self) {
        self.close();
        if let Err(error) = (&mut self.task).await {
            tracing::warn!(%error, "lookup I/O task ended abnormally");
        }
    }

    /// The next event (lookup and reset outcomes), oldest first. Applies reports first.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.drive();
        self.core.poll_event()
    }

    /// Counters since [`connect`](Self::connect). Applies reports first.
    pub fn stats(&mut self) -> ClientStats {
        self.drive();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let t = &self.transport;
        ClientStats {
            core: self.core.stats().clone(),
            slots_in_use: self.core.slots_in_use(),
            open_rpcs: self.core.open_rpcs(),
            rpcs_sent: load(&t.rpcs_sent),
            late_replies: load(&t.late_replies),
            bad_envelopes: load(&t.bad_envelopes),
            socket_reopens: load(&t.reopens),
            send_errors: load(&t.send_errors),
            recv_errors: load(&t.recv_errors),
            open_errors: load(&t.open_errors),
            endpoint_unreachable: load(&t.unreachable),
            lookups_expired: load(&t.expired),
            events_dropped: self.core.stats().events_dropped,
            waits_gave_up: self.waits_gave_up,
            prefetch_inactive: prefetch_inactive(self.core.config()).is_some(),
            tracked_requests: self.core.tracked_requests(),
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
    pub fn core(&self) -> &Lookups<impl lookup_core::Observe> {
        &self.core
    }

    /// Start of every call: the call's one clock read, then the I/O task's reports
    /// (call-order contract of [`Lookups`]).
    fn begin(&mut self) -> Instant {
        let now = clock::now();
        self.core.observer_mut().clock = now;
        while *self.handles_made.get_mut()
            && let Ok(announce) = self.announced.try_recv()
        {
            match announce {
                Announce::Arrival(req, caller_id) => {
                    self.core.observer_mut().arrived(req.request_id, caller_id);
                    self.core.on_new_request(&req, now);
                }
                Announce::Finished(request_id) => {
                    self.core.observer_mut().finished(request_id);
                    self.core.on_finished(request_id);
                }
            }
        }
        loop {
            match self.wire_events.try_recv() {
                Ok(event) => self.apply(event),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.actor_gone();
                    break;
                }
            }
        }
        now
    }

    /// End of every call: new RPCs to the I/O task, all in one message (one wake-up:
    /// [`ToIoBatch`]), then the metrics follow the core's counters.
    fn end(&mut self) {
        let mut batch = Vec::new();
        while let Some(command) = self.core.poll_transmit() {
            let span = match &command {
                Command::Send { rpc_id, .. } => self.core.observer().span(*rpc_id),
                _ => tracing::Span::none(),
            };
            batch.push((command, span));
        }
        if !batch.is_empty() && self.commands.send(batch).is_err() {
            self.actor_gone();
        }
        let (stats, slots, observer) = self.core.stats_and_observer();
        observer.metrics.sync(stats, slots);
    }

    /// One RPC ended on the wire. After close the core has forgotten every RPC, so a
    /// late report changes nothing.
    fn apply(&mut self, event: WireEvent) {
        self.progressed = true;
        self.core.handle_wire_event(event);
    }

    /// Rules 10-11: a sync-mode wait gave up and answers 0 external tokens.
    fn gave_up(&mut self, now: Instant) {
        self.waits_gave_up += 1;
        self.warn.warn(
            "wait_gave_up",
            now,
            format_args!(
                "a sync-mode probe waited {:?} without an answer and loads nothing",
                self.wait_limit
            ),
        );
    }

    /// The I/O task ended without close (it cannot panic by design, but a runtime shut
    /// down under it ends it): fail open from now on, as after close (rule 14).
    fn actor_gone(&mut self) {
        self.progressed = true;
        if !self.core.is_closed() {
            tracing::error!("lookup I/O task ended; the client answers 0 hits from now on");
            self.close_core();
        }
    }

    /// Closes the core and stops the I/O task; lookup RPCs still open end as
    /// cancelled (rule 14) and the gauges drop this client's share.
    fn close_core(&mut self) {
        self.core.close();
        self.cancel.cancel();
        self.core.observer_mut().close();
        let (stats, slots) = (self.core.stats().clone(), self.core.slots_in_use());
        self.core.observer_mut().metrics.sync(&stats, slots);
    }
}

/// Why prefetch is configured but does nothing, if it is (`spec/behaviour.md`,
/// configuration: prefetch needs `enable_lookup`, `lookup_async` and a positive
/// `lookup_prefetch_limit`).
pub(crate) fn prefetch_inactive(core: &lookup_core::Config) -> Option<&'static str> {
    if core.lookup_prefetch_limit == 0 {
        return None;
    }
    if !core.enable_lookup {
        Some("enable_lookup is false")
    } else if !core.lookup_async {
        Some("lookup_async is false (sync mode never prefetches)")
    } else {
        None
    }
}

/// Prefetch configured but inactive is a warning (a limit of 0 with async lookups on
/// is an info): a setting that silently turns prefetch off must not go unnoticed.
pub(crate) fn warn_if_prefetch_inactive(core: &lookup_core::Config) {
    if let Some(why) = prefetch_inactive(core) {
        tracing::warn!(
            lookup_prefetch_limit = core.lookup_prefetch_limit,
            "prefetch is configured but inactive: {why}; requests are looked up at their first probe"
        );
    } else if core.enable_lookup && core.lookup_async && core.lookup_prefetch_limit == 0 {
        tracing::info!(
            "async lookups without prefetch (lookup_prefetch_limit = 0): each request is looked up at its first probe"
        );
    }
}

impl Drop for LookupClient {
    fn drop(&mut self) {
        self.close_core();
    }
}
