//! The direct transport: the scheduler process asks the Mooncake master itself,
//! skipping the lookup server (DESIGN.md, "Mooncake master client"; the idea behind
//! vllm-ascend #15243).
//!
//! vLLM's scheduler asks a worker over ZeroMQ, and the worker asks the master: two
//! hops. With [`Transport::Direct`] the [`LookupClient`](crate::LookupClient) keeps the
//! same `lookup-core` state machine, handle API, timeouts, fail-open rule, metrics,
//! events and tracing, but its I/O task serves each lookup command itself: it builds
//! the store keys of the blocks in question with the server's [`KeyLayout`], asks the
//! master in one logical `BatchExistKey` query (chunked, stopping at the chunk that ends
//! the leading run: [`MasterClient::leading_blocks_flat`]) and computes the hit with the
//! server's own rules ([`blocks_to_check`], [`hit_tokens`]: `spec/wire.md`, "What the
//! server computes"). Up to `max_in_flight` lookups are pipelined on the master
//! client's one TCP connection.
//!
//! # Lease side effect
//!
//! Every key the master answers `true` gets a read lease for the master's
//! `default_kv_lease_ttl` (10 s by default): the block cannot be evicted or removed
//! until it expires (`spec/mooncake-master-rpc.md`, "The call"). vLLM's worker has the
//! same effect through the C++ client's `batch_is_exist`, so a direct lookup pins the
//! store exactly as a lookup through the worker does, and no more: keys past the
//! chunk that ended the run are never asked about. A result the client keeps for
//! `lookup_prefetch_ttl_s` (2 s by default) is therefore backed by the lease for its
//! whole life as long as the TTL stays below the lease; [`LookupClient::connect`]
//! warns when it does not ([`DirectConfig::lease_ttl`]).
//!
//! # Reset
//!
//! The master's only reset, `RemoveAll` (`spec/mooncake-master-rpc.md`, "Removing
//! everything"), is tenant-wide: it removes every engine's blocks, not only this
//! scheduler's; and a wipe would also have to drain the writers' pending puts, which
//! only the worker that owns the store client can do. A reset (rule 13) is therefore
//! never sent: it ends at once as
//! [`ResetOutcome::Failed`](lookup_core::ResetOutcome::Failed) and every key stays
//! stored, as `lookup_server::MooncakeIndex` answers it through the server.
//!
//! [`LookupClient::connect`]: crate::LookupClient::connect

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_core::{BlockHashes, Dispatcher, Outgoing, Reply, RpcBody, RpcFailure, RpcId};
use mooncake_master::{KeyLayout, MasterAddr, MasterClient, MasterConfig, MasterError};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use crate::Error;
use crate::actor::{Completion, SendQueue, ToActor, TransportCounters, WarnLimiter};
use crate::metrics::ActorMetrics;

/// The master's default read lease (`default_kv_lease_ttl`, 10 s), granted to every key
/// an existence query answers `true` (`spec/mooncake-master-rpc.md`, "The call").
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Longest wait between two connect attempts after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How a [`LookupClient`](crate::LookupClient) reaches the store (DESIGN.md,
/// "Mooncake master client": both paths sit behind the same state machine).
///
/// With [`Direct`](Self::Direct) the client computes the server's answer itself:
/// the store keys of the blocks in question with the server's [`KeyLayout`], one
/// logical `BatchExistKey` query per lookup (chunks of
/// [`MasterConfig::chunk_keys`], stopping at the chunk that ends the leading run),
/// the leading run over every rank namespace and the full-hit rule (`spec/wire.md`,
/// "What the server computes"). Two things differ from a server:
///
/// - **Lease side effect.** Every key the master answers `true` gets a read lease for
///   its `default_kv_lease_ttl` (10 s by default), exactly as through vLLM's worker.
///   Keep `lookup_prefetch_ttl_s` (2 s by default) below it, so that a cached result
///   is backed by the lease for its whole life ([`DirectConfig::lease_ttl`]).
/// - **Reset.** The master's only reset (`RemoveAll`) is tenant-wide: a reset is
///   never sent and ends as
///   [`ResetOutcome::Failed`](lookup_core::ResetOutcome::Failed); every key stays.
///
/// # Failures
///
/// Every failure answers 0 hits (rule 11), as a
/// [`LookupOutcome`](lookup_core::LookupOutcome) in its `Event::LookupDone`:
///
/// | what happened | outcome |
/// |---|---|
/// | the master answered; a key with an application `ErrorCode` ends the run at its block (vLLM counts only `1`s) | `Hit` / `Miss` |
/// | no answer within `lookup_timeout_s` of the send, or the master client's own `call_timeout` | `Failed(TimedOut)` |
/// | a reply that does not decode, or with a wrong number of answers | `Malformed` |
/// | not connected yet after a failed connect, connection down or lost, the call refused | `Failed(Transport)` |
///
/// Until the first connect succeeds, lookups wait while an attempt is under way (at
/// most the master client's `connect_timeout`, 1 s by default) and fail fast during
/// the backoff between attempts, which starts at `ClientConfig::reopen_backoff` and
/// doubles up to 1 s. Once connected, the master client reconnects on its own after a
/// lost connection, and calls fail fast while it is down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// A lookup server over ZeroMQ (a vLLM MooncakeStoreConnector worker, or our
    /// `lookup_server::LookupServer`) at
    /// [`ClientConfig::endpoint`](crate::ClientConfig::endpoint), in
    /// [`ClientConfig::format`](crate::ClientConfig::format). The default.
    #[default]
    Zmq,
    /// The Mooncake master itself, from the scheduler's process (see above). Boxed:
    /// the settings are large and read once, at connect.
    Direct(Box<DirectConfig>),
}

/// Settings of the direct transport ([`Transport::Direct`]). Build with
/// [`DirectConfig::new`] and adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectConfig {
    /// The master's RPC address, `host:port` (`--rpc_address:--rpc_port`; port 50051
    /// by default), or `etcd://h1:p1;h2:p2` for a high-availability cluster whose
    /// leader the master client finds and follows (cluster id:
    /// `master_config.cluster_id`, else `$MC_STORE_CLUSTER_ID`, else
    /// `mooncake_cluster`; `spec/mooncake-master-rpc.md`, "High availability").
    pub master: String,
    /// How block hashes become store keys: the same cache prefix, model and rank
    /// namespaces as the workers that write the blocks (`spec/wire.md`, "What the
    /// server computes", step 2). A block counts only when every namespace key exists.
    pub layout: KeyLayout,
    /// The master client's settings: `chunk_keys` (keys per `BatchExistKey` call,
    /// default 1,024), `call_timeout`, `connect_timeout`, `tenant_id`, backoff.
    pub master_config: MasterConfig,
    /// The master's `default_kv_lease_ttl` (seconds of read lease per positive
    /// answer). Default 10 s, the master's default. Only checked against
    /// `lookup_prefetch_ttl_s`: a cached result older than the lease may name blocks
    /// evicted since, so [`LookupClient::connect`](crate::LookupClient::connect) warns
    /// when the TTL is not below it.
    pub lease_ttl: Duration,
}

impl DirectConfig {
    /// The master at `master` (`host:port` or `etcd://...`), keys laid out by `layout`, the master
    /// client's defaults and the master's default lease of 10 s.
    #[must_use]
    pub fn new(master: impl Into<String>, layout: KeyLayout) -> Self {
        Self {
            master: master.into(),
            layout,
            master_config: MasterConfig::default(),
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// Checks the settings the master client would refuse only once connecting, so
    /// that the mistake is an error of `connect`, not a stream of failed lookups.
    ///
    /// # Errors
    /// [`Error::InvalidClientConfig`] naming the field: an empty or malformed
    /// `master`; a `master_config` with `chunk_keys` 0, a zero `call_timeout` or
    /// `connect_timeout`, or a `backoff_min` that is zero or above `backoff_max`.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key: &'static str, why: &str| {
            Err(Error::InvalidClientConfig {
                key,
                why: why.to_owned(),
            })
        };
        let m = &self.master_config;
        if self.master.trim().is_empty() {
            return bad("master", "the master's host:port is empty");
        }
        if let Err(e) = MasterAddr::parse(&self.master, m.cluster_id.as_deref()) {
            return bad("master", &e.to_string());
        }
        if m.chunk_keys == 0 {
            return bad("master_config.chunk_keys", "must be at least 1");
        }
        if m.call_timeout.is_zero() {
            return bad("master_config.call_timeout", "must be positive");
        }
        if m.connect_timeout.is_zero() {
            return bad("master_config.connect_timeout", "must be positive");
        }
        if m.backoff_min.is_zero() || m.backoff_min > m.backoff_max {
            return bad(
                "master_config.backoff_min",
                "must be positive and at most backoff_max",
            );
        }
        Ok(())
    }

    /// Whether a result TTL of `ttl_s` seconds outlives the read lease (see
    /// [`lease_ttl`](Self::lease_ttl)).
    #[must_use]
    pub fn ttl_outlives_lease(&self, ttl_s: f64) -> bool {
        ttl_s >= self.lease_ttl.as_secs_f64()
    }
}

/// The direct actor's share of the client configuration.
#[derive(Debug)]
pub(crate) struct DirectSettings {
    /// The transport's settings.
    pub(crate) direct: DirectConfig,
    /// Block size `B` (tokens).
    pub(crate) block_size: u32,
    /// `lookup_timeout_s`: the longest a lookup may take from its send.
    pub(crate) timeout: Duration,
    /// First wait before another connect attempt after a failed one.
    pub(crate) reconnect_backoff: Duration,
}

type Connecting = Pin<Box<dyn Future<Output = Result<MasterClient, MasterError>> + Send>>;
type Query = Pin<Box<dyn Future<Output = Ended> + Send>>;

/// Where the actor stands with the master.
enum Link {
    /// A connect attempt runs; lookups wait in the dispatcher.
    Connecting(Connecting),
    /// The last attempt failed; the next one starts when the sleep ends. Lookups fail
    /// fast meanwhile.
    Down(Pin<Box<Sleep>>),
    /// Connected (the client reconnects by itself from now on).
    Up(MasterClient),
}

/// A lookup query that ended (or ran out of time).
struct Ended {
    rpc_id: RpcId,
    num_tokens: u32,
    /// Blocks asked about ([`blocks_to_check`]).
    blocks: usize,
    sent_at: Instant,
    span: Span,
    result: Result<Result<usize, MasterError>, tokio::time::error::Elapsed>,
}

/// What a query's result means for its lookup.
enum Answer {
    /// Leading blocks present.
    Run(usize),
    /// The master's reply broke the protocol.
    Malformed,
    /// No usable reply.
    Failed(RpcFailure),
}

/// What woke the actor.
enum Wake {
    Cancelled,
    Command(Option<ToActor>),
    Ended(Ended),
    Connected(Result<MasterClient, MasterError>),
    Retry,
}

/// The I/O task of the direct transport: the [`Dispatcher`] (priority,
/// `max_in_flight`, cancellation), the master client, and the queries in flight.
/// Reports [`Completion`]s exactly like the ZeroMQ actor.
pub(crate) struct DirectActor {
    settings: DirectSettings,
    keys_per_block: usize,
    queue: SendQueue,
    link: Link,
    backoff: Duration,
    /// Shared with the handle, for [`MasterStats`](mooncake_master::MasterStats).
    master: Arc<OnceLock<MasterClient>>,
    in_flight: FuturesUnordered<Query>,
    commands: UnboundedReceiver<ToActor>,
    completions: UnboundedSender<Completion>,
    sends: UnboundedSender<Completion>,
    cancel: CancellationToken,
    counters: Arc<TransportCounters>,
    warn: WarnLimiter,
    metrics: ActorMetrics,
}

impl DirectActor {
    /// An actor that starts connecting to the master when first polled.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        settings: DirectSettings,
        dispatcher: Dispatcher,
        master: Arc<OnceLock<MasterClient>>,
        commands: UnboundedReceiver<ToActor>,
        completions: UnboundedSender<Completion>,
        sends: UnboundedSender<Completion>,
        cancel: CancellationToken,
        counters: Arc<TransportCounters>,
    ) -> Self {
        let keys_per_block = settings.direct.layout.namespaces().len();
        let backoff = settings.reconnect_backoff.max(Duration::from_millis(1));
        let link = Link::Connecting(connect(&settings.direct));
        Self {
            settings,
            keys_per_block,
            queue: SendQueue::new(dispatcher),
            link,
            backoff,
            master,
            in_flight: FuturesUnordered::new(),
            commands,
            completions,
            sends,
            cancel,
            counters,
            warn: WarnLimiter::default(),
            metrics: ActorMetrics::new(),
        }
    }

    /// Runs until the root token is cancelled or the handle is dropped. Queries still
    /// in flight are dropped on exit (their replies, if any, are the master client's
    /// late replies); dropping the last master client handle closes the connection.
    pub(crate) async fn run(mut self) {
        tracing::debug!(master = %self.settings.direct.master, "direct lookup actor started");
        loop {
            let wake = tokio::select! {
                biased;
                () = self.cancel.cancelled() => Wake::Cancelled,
                Some(ended) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    Wake::Ended(ended)
                }
                wake = link_change(&mut self.link) => wake,
                cmd = self.commands.recv() => Wake::Command(cmd),
            };
            // The one clock read of this turn (STYLE.md rule 10).
            let now = Instant::now();
            match wake {
                Wake::Cancelled | Wake::Command(None) => break,
                Wake::Command(Some(command)) => {
                    self.queue.take(command);
                    // Take everything already queued, so one turn starts a whole batch.
                    while let Ok(command) = self.commands.try_recv() {
                        self.queue.take(command);
                    }
                }
                Wake::Ended(ended) => {
                    self.on_ended(ended, now);
                    // Reap whatever else is already done without another turn.
                    while let Some(Some(ended)) = self.in_flight.next().now_or_never() {
                        self.on_ended(ended, now);
                    }
                }
                Wake::Connected(Ok(master)) => {
                    tracing::debug!(master = %master.addr(), "connected to the Mooncake master");
                    self.backoff = self
                        .settings
                        .reconnect_backoff
                        .max(Duration::from_millis(1));
                    let _ = self.master.set(master.clone());
                    self.link = Link::Up(master);
                }
                Wake::Connected(Err(error)) => {
                    self.counters.open_errors.fetch_add(1, Ordering::Relaxed);
                    self.warn.warn(
                        "open_error",
                        now,
                        format_args!(
                            "cannot connect to the Mooncake master at {}: {error}; lookups fail open",
                            self.settings.direct.master
                        ),
                    );
                    // Configuration errors were refused by `connect`; anything else may
                    // heal, so try again after the backoff.
                    self.link = Link::Down(Box::pin(tokio::time::sleep(self.backoff)));
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
                Wake::Retry => self.link = Link::Connecting(connect(&self.settings.direct)),
            }
            self.pump(now);
        }
        let open = self.in_flight.len();
        drop(std::mem::take(&mut self.in_flight));
        tracing::debug!(in_flight = open, "direct lookup actor stopped");
    }

    /// Starts everything the dispatcher releases, unless a connect attempt is under
    /// way (lookups then wait for it, as they would in a ZeroMQ socket's queue).
    fn pump(&mut self, now: Instant) {
        if matches!(self.link, Link::Connecting(_)) {
            return;
        }
        while let Some((out, parent)) = self.queue.next_send() {
            self.start(out, parent, now);
        }
    }

    /// Serves one released RPC.
    fn start(&mut self, out: Outgoing, parent: Span, now: Instant) {
        let Outgoing { rpc_id, body } = out;
        let (num_tokens, block_hashes) = match body {
            RpcBody::Lookup {
                num_tokens,
                block_hashes,
            } => (num_tokens, block_hashes),
            RpcBody::Reset => {
                self.refuse_reset(rpc_id, &parent, now);
                return;
            }
        };
        let blocks = blocks_to_check(num_tokens, self.settings.block_size, block_hashes.len());
        let span = tracing::debug_span!(
            parent: &parent,
            "rpc",
            rpc_id = rpc_id.0,
            num_tokens,
            blocks,
            keys = blocks * self.keys_per_block,
            hit_tokens = Empty,
            outcome = Empty,
            latency_us = Empty,
        );
        let master = match &self.link {
            Link::Up(master) => master.clone(),
            _ => {
                // No connection (a connect failed and waits for its backoff): fail
                // fast rather than hold the lookup (rule 17).
                self.queue.on_done(rpc_id);
                self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                span.record("outcome", "not_connected");
                self.report(Completion::Failed {
                    rpc_id,
                    failure: RpcFailure::Transport,
                    at: now,
                });
                return;
            }
        };
        // Before the report, so a handle that sees the send sees the gauge.
        self.metrics.lookup_on_wire();
        self.report(Completion::Sent { rpc_id, at: now });
        let query = query(
            master,
            &self.settings.direct.layout,
            &block_hashes,
            blocks,
            now + self.settings.timeout,
        );
        let ended_span = span.clone();
        self.in_flight.push(Box::pin(
            async move {
                let result = query.await;
                Ended {
                    rpc_id,
                    num_tokens,
                    blocks,
                    sent_at: now,
                    span: ended_span,
                    result,
                }
            }
            .instrument(span),
        ));
    }

    /// Rule 13 without the tenant-wide `RemoveAll`: the reset ends as failed at once.
    fn refuse_reset(&mut self, rpc_id: RpcId, parent: &Span, now: Instant) {
        self.queue.on_done(rpc_id);
        self.warn.warn(
            "no_reset",
            now,
            format_args!(
                "reset refused: the Mooncake master's RemoveAll is tenant-wide; no key was removed"
            ),
        );
        tracing::debug!(parent: parent, rpc_id = rpc_id.0, "reset refused by the direct transport");
        self.report(Completion::Reply {
            rpc_id,
            reply: Reply::Reset { ok: false },
            at: now,
        });
    }

    /// One query ended: the hit per `spec/wire.md`, or a failure.
    fn on_ended(&mut self, ended: Ended, now: Instant) {
        let Ended {
            rpc_id,
            num_tokens,
            blocks,
            sent_at,
            span,
            result,
        } = ended;
        self.metrics.lookup_off_wire();
        self.queue.on_done(rpc_id);
        let latency = now.saturating_duration_since(sent_at);
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        span.record("latency_us", latency_us);
        let (completion, outcome) = match self.answer(result, now) {
            Answer::Run(run) => {
                // A client never finds more blocks than it asked about; the cap keeps
                // the answer within the prompt whatever the master says.
                let hit = hit_tokens(num_tokens, self.settings.block_size, run.min(blocks));
                span.record("hit_tokens", hit);
                let reply = Reply::Lookup { hit_tokens: hit };
                (
                    Completion::Reply {
                        rpc_id,
                        reply,
                        at: now,
                    },
                    "replied",
                )
            }
            Answer::Malformed => {
                let reply = Reply::Malformed;
                (
                    Completion::Reply {
                        rpc_id,
                        reply,
                        at: now,
                    },
                    "malformed",
                )
            }
            Answer::Failed(failure) => {
                let outcome = if failure == RpcFailure::TimedOut {
                    self.warn.warn(
                        "timeout",
                        now,
                        format_args!("Mooncake master query unanswered after {latency:?}"),
                    );
                    "timed_out"
                } else {
                    "failed"
                };
                (
                    Completion::Failed {
                        rpc_id,
                        failure,
                        at: now,
                    },
                    outcome,
                )
            }
        };
        span.record("outcome", outcome);
        tracing::debug!(parent: &span, rpc_id = rpc_id.0, outcome, latency_us, "rpc ended");
        self.report(completion);
    }

    /// What a query's result means for the lookup (the table of the module docs).
    fn answer(
        &mut self,
        result: Result<Result<usize, MasterError>, tokio::time::error::Elapsed>,
        now: Instant,
    ) -> Answer {
        let error = match result {
            Ok(Ok(run)) => return Answer::Run(run),
            Err(_elapsed) => return Answer::Failed(RpcFailure::TimedOut),
            Ok(Err(error)) => error,
        };
        match error {
            // The key that would end the run carries an ErrorCode: every key before it
            // was answered `true`, so the run ends at its block (vLLM counts only 1s).
            MasterError::Store {
                key_index: Some(i), ..
            } => {
                self.warn.warn(
                    "key_error",
                    now,
                    format_args!(
                        "the Mooncake master answered a key with an error ({error}); counted as absent"
                    ),
                );
                Answer::Run(i / self.keys_per_block.max(1))
            }
            MasterError::Timeout { .. } => Answer::Failed(RpcFailure::TimedOut),
            MasterError::MalformedReply { .. } | MasterError::AnswerCount { .. } => {
                self.warn.warn(
                    "malformed",
                    now,
                    format_args!("malformed reply from the Mooncake master: {error}"),
                );
                Answer::Malformed
            }
            _ => {
                self.counters.send_errors.fetch_add(1, Ordering::Relaxed);
                self.warn.warn(
                    "master_error",
                    now,
                    format_args!(
                        "Mooncake master query failed: {error}; the lookup answers 0 hits"
                    ),
                );
                Answer::Failed(RpcFailure::Transport)
            }
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

/// A connect attempt to the master.
fn connect(direct: &DirectConfig) -> Connecting {
    Box::pin(MasterClient::connect(
        direct.master.clone(),
        direct.master_config.clone(),
    ))
}

/// The leading run of present blocks among the first `blocks` of `block_hashes`: one
/// logical `BatchExistKey` query, chunked with an early stop, bounded by `deadline`.
fn query(
    master: MasterClient,
    layout: &KeyLayout,
    block_hashes: &BlockHashes,
    blocks: usize,
    deadline: Instant,
) -> impl Future<Output = Result<Result<usize, MasterError>, tokio::time::error::Elapsed>> + Send + 'static
{
    let keys = layout.chain_keys(block_hashes, blocks);
    let keys_per_block = layout.namespaces().len();
    async move {
        if keys.is_empty() {
            // No full block: nothing to ask (`spec/wire.md`, step 1).
            return Ok(Ok(0));
        }
        tokio::time::timeout_at(
            deadline.into(),
            master.leading_blocks_flat(&keys, keys_per_block),
        )
        .await
    }
}

/// The end of a connect attempt or of the backoff after a failed one; never while
/// connected.
async fn link_change(link: &mut Link) -> Wake {
    match link {
        Link::Connecting(attempt) => Wake::Connected(attempt.await),
        Link::Down(sleep) => {
            sleep.await;
            Wake::Retry
        }
        Link::Up(_) => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_bad_field() {
        let layout = KeyLayout::default();
        assert!(
            DirectConfig::new("127.0.0.1:50051", layout.clone())
                .validate()
                .is_ok()
        );
        let key_of = |config: DirectConfig| match config.validate() {
            Err(Error::InvalidClientConfig { key, .. }) => key,
            other => panic!("expected InvalidClientConfig, got {other:?}"),
        };
        assert_eq!(key_of(DirectConfig::new(" ", layout.clone())), "master");
        for bad in ["127.0.0.1", "etcd://", "redis://h:1"] {
            assert_eq!(
                key_of(DirectConfig::new(bad, layout.clone())),
                "master",
                "{bad}"
            );
        }
        assert!(
            DirectConfig::new("etcd://127.0.0.1:2379;h:2380", layout.clone())
                .validate()
                .is_ok()
        );
        let mut config = DirectConfig::new("127.0.0.1:50051", layout.clone());
        config.master_config.chunk_keys = 0;
        assert_eq!(key_of(config), "master_config.chunk_keys");
        let mut config = DirectConfig::new("127.0.0.1:50051", layout.clone());
        config.master_config.call_timeout = Duration::ZERO;
        assert_eq!(key_of(config), "master_config.call_timeout");
        let mut config = DirectConfig::new("127.0.0.1:50051", layout.clone());
        config.master_config.connect_timeout = Duration::ZERO;
        assert_eq!(key_of(config), "master_config.connect_timeout");
        let mut config = DirectConfig::new("127.0.0.1:50051", layout);
        config.master_config.backoff_min = config.master_config.backoff_max * 2;
        assert_eq!(key_of(config), "master_config.backoff_min");
    }

    #[test]
    fn the_default_ttl_stays_below_the_default_lease() {
        let config = DirectConfig::new("127.0.0.1:50051", KeyLayout::default());
        assert_eq!(config.lease_ttl, Duration::from_secs(10));
        assert!(!config.ttl_outlives_lease(lookup_core::Config::new(16).lookup_prefetch_ttl_s));
        assert!(!config.ttl_outlives_lease(9.999));
        assert!(config.ttl_outlives_lease(10.0));
        assert!(config.ttl_outlives_lease(30.0));
    }
}
