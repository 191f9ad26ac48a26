//! [`LookupServer`]: the bound ROUTER socket, its task, and the answer to each
//! message (`spec/wire.md`, "What the server computes"). The task bounds what it
//! holds: `max_concurrency` requests and `max_pending_bytes` of them, after which it
//! stops reading and ZeroMQ (`recv_hwm` messages per peer, `max_frame_bytes` a
//! frame) and then TCP hold the rest in the peers (RELIABILITY.md, "Security").

use std::fs;
use std::io;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, SinkExt, StreamExt};
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_core::wire::{self, LookupReply, ServerRequest};
use lookup_core::{BlockHashes, Endpoint};
use mooncake_master::KeyLayout;
use tmq::{Message, Multipart};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::bind::{
    IpcFile, bare_host, is_loopback_host, last_endpoint, prepare_ipc_path, tcp_host,
};
use crate::index::{BlockIndex, IndexError};
use crate::stats::{ServerCounters, bump, worth_a_warning};
use crate::{Error, ServerConfig, ServerStats};

/// A running lookup server: one tokio task owning a bound ROUTER socket.
///
/// Dropping the handle stops the task too (asynchronously);
/// [`shutdown`](Self::shutdown) stops it and waits, so that the socket is closed and
/// the ipc file is gone when it returns.
#[derive(Debug)]
pub struct LookupServer {
    local: Endpoint,
    counters: Arc<ServerCounters>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// What the socket task shares with the request futures.
struct Shared {
    block_size: u32,
    layout: KeyLayout,
    index: Arc<dyn BlockIndex>,
    counters: Arc<ServerCounters>,
    /// Handles of `crate::metrics` (no-ops without a recorder at bind).
    metrics: crate::metrics::ServerMetrics,
}

impl LookupServer {
    /// Binds `endpoint` and starts answering on a tokio task of the current runtime.
    ///
    /// - ipc: a missing parent directory is created with mode 0700; a stale socket
    ///   file at the path (nobody accepts connections on it) is removed (`spec/wire.md`,
    ///   "Transport"); a live one is refused unless [`ServerConfig::take_over`]; the
    ///   new socket file is set to mode 0600; it is unlinked when the server stops.
    /// - tcp: the host must be a loopback address unless
    ///   [`ServerConfig::allow_remote`]; `localhost` binds 127.0.0.1; port 0 picks a
    ///   free port, reported by [`local_endpoint`](Self::local_endpoint).
    ///
    /// # Errors
    /// - [`Error::InvalidServerConfig`] for invalid settings (see
    ///   [`ServerConfig::validate`]) or an ipc path that exists and is not a socket
    ///   (never deleted);
    /// - [`Error::RemoteBind`] for a non-loopback TCP host without `allow_remote`;
    /// - [`Error::EndpointInUse`] for an ipc path a running server listens on;
    /// - [`Error::Zmq`] when the socket cannot be created or bound (address in use);
    /// - [`Error::Io`] when called outside a tokio runtime, or a file-system step on
    ///   the ipc path fails.
    #[tracing::instrument(skip_all, fields(endpoint = %endpoint))]
    pub fn bind(
        endpoint: &Endpoint,
        config: ServerConfig,
        index: Arc<dyn BlockIndex>,
    ) -> Result<Self, Error> {
        config.validate()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::Io(io::Error::other(format!(
                "LookupServer::bind needs a tokio runtime: {e}"
            )))
        })?;
        let ipv6 = match endpoint {
            Endpoint::Tcp(addr) => {
                let host = tcp_host(addr);
                if !config.allow_remote && !is_loopback_host(host) {
                    return Err(Error::RemoteBind {
                        endpoint: endpoint.url(),
                    });
                }
                bare_host(host)
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| ip.is_ipv6())
            }
            Endpoint::Ipc(path) => {
                prepare_ipc_path(path, config.take_over)?;
                false
            }
        };
        // ZeroMQ binds interfaces and addresses, not host names.
        let bind_url = match endpoint {
            Endpoint::Tcp(addr) if tcp_host(addr).eq_ignore_ascii_case("localhost") => {
                let port = addr.rsplit_once(':').map_or("0", |(_, p)| p);
                format!("tcp://127.0.0.1:{port}")
            }
            _ => endpoint.url(),
        };

        let max_frame_bytes = i64::try_from(config.max_frame_bytes).unwrap_or(i64::MAX);
        let context = tmq::Context::new();
        // Created inside the runtime: tmq registers the socket's fd with its reactor.
        let socket = {
            let _guard = runtime.enter();
            tmq::router(&context)
                .set_linger(0)
                .set_maxmsgsize(max_frame_bytes)
                .set_rcvhwm(i32::try_from(config.recv_hwm).unwrap_or(i32::MAX))
                .set_ipv6(ipv6)
                .bind(&bind_url)?
        };
        drop(context);

        let (local, ipc_file) = match endpoint {
            Endpoint::Ipc(path) => match IpcFile::claim(path) {
                Ok(file) => (endpoint.clone(), Some(file)),
                Err(e) => {
                    // Never leave a socket file that is not owner-only behind.
                    drop(socket);
                    let _ = fs::remove_file(path);
                    return Err(e);
                }
            },
            Endpoint::Tcp(_) => (
                last_endpoint(&socket).unwrap_or_else(|| endpoint.clone()),
                None,
            ),
        };

        let counters = Arc::new(ServerCounters::default());
        let shared = Arc::new(Shared {
            block_size: config.block_size,
            layout: config.layout,
            index,
            counters: Arc::clone(&counters),
            metrics: crate::metrics::ServerMetrics::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let limits = Limits {
            max_concurrency: config.max_concurrency,
            max_pending_bytes: config.max_pending_bytes,
        };
        let task = runtime.spawn(serve(socket, shared, limits, stopped, ipc_file));
        tracing::info!(local = %local, block_size = config.block_size, "lookup server bound");
        Ok(Self {
            local,
            counters,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The endpoint clients connect to: the bound one, with the port the system chose
    /// when a TCP endpoint asked for port 0.
    #[must_use]
    pub fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }

    /// A snapshot of the counters. Still readable after [`shutdown`](Self::shutdown)
    /// began; values only grow.
    #[must_use]
    pub fn stats(&self) -> ServerStats {
        self.counters.snapshot()
    }

    /// Stops the server and waits for its task: requests not yet answered are dropped,
    /// the socket is closed, and the ipc file is unlinked before this returns.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The task may have ended already; then there is nobody to tell.
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "lookup server task ended abnormally");
            }
        }
    }
}

impl Drop for LookupServer {
    fn drop(&mut self) {
        // Dropping the sender wakes the task, which closes the socket and unlinks the
        // ipc file on its way out.
        self.stop.take();
    }
}

/// What the socket task holds at most before it stops reading
/// ([`ServerConfig::max_concurrency`], [`ServerConfig::max_pending_bytes`]).
struct Limits {
    max_concurrency: usize,
    max_pending_bytes: usize,
}

/// A request's reply, once computed, with the bytes its request held meanwhile.
type Pending = BoxFuture<'static, (Multipart, usize)>;

/// The socket task: reads requests, answers cheap ones at once, keeps index calls in
/// flight up to `max_concurrency` and `max_pending_bytes`, and writes replies as they
/// complete.
async fn serve(
    mut socket: tmq::router::Router,
    shared: Arc<Shared>,
    limits: Limits,
    mut stopped: oneshot::Receiver<()>,
    ipc_file: Option<IpcFile>,
) {
    let mut pending: FuturesUnordered<Pending> = FuturesUnordered::new();
    let mut held = 0usize;
    loop {
        let room = pending.len() < limits.max_concurrency && held < limits.max_pending_bytes;
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            Some((reply, bytes)) = pending.next(), if !pending.is_empty() => {
                held -= bytes;
                send(&mut socket, &shared.counters, reply).await;
            }
            received = socket.next(), if room => match received {
                Some(Ok(message)) => {
                    if let Some((mut answer, bytes)) = handle(&shared, message) {
                        // An index that answers without waiting (the in-memory one)
                        // is answered on the spot, without a trip through the queue.
                        match (&mut answer).now_or_never() {
                            Some(reply) => send(&mut socket, &shared.counters, reply).await,
                            None => {
                                held += bytes;
                                let peak = &shared.counters.pending_bytes_peak;
                                peak.fetch_max(held as u64, Ordering::Relaxed);
                                if held >= limits.max_pending_bytes {
                                    bump(&shared.counters.input_pauses, 1);
                                }
                                pending.push(answer.map(move |reply| (reply, bytes)).boxed());
                            }
                        }
                    }
                }
                Some(Err(e)) => {
                    let n = bump(&shared.counters.socket_errors, 1);
                    if worth_a_warning(n) {
                        tracing::warn!(error = %e, count = n, "lookup server receive error");
                    }
                    // A persistent socket error must not turn into a busy loop.
                    tokio::task::yield_now().await;
                }
                None => break,
            },
        }
    }
    drop(pending);
    // Closes the socket and then, as the last holder of its context, waits for
    // ZeroMQ to release the endpoint (linger 0: no waiting for peers).
    drop(socket);
    drop(ipc_file);
    tracing::info!("lookup server stopped");
}

/// Writes one reply, counting it or the error.
async fn send(socket: &mut tmq::router::Router, counters: &ServerCounters, reply: Multipart) {
    match socket.send(reply).await {
        Ok(()) => {
            bump(&counters.replies, 1);
        }
        Err(e) => {
            let n = bump(&counters.socket_errors, 1);
            if worth_a_warning(n) {
                tracing::warn!(error = %e, count = n, "lookup server send error");
            }
        }
    }
}

/// A frame of a received message, shared as [`Bytes`] without copying.
struct Frame(Message);

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Classifies one received message; returns the future of its reply with the bytes
/// it holds until answered (its frames, and for a lookup the store keys it builds),
/// or `None` when it is dropped.
fn handle(
    shared: &Arc<Shared>,
    message: Multipart,
) -> Option<(BoxFuture<'static, Multipart>, usize)> {
    let counters = &shared.counters;
    bump(&counters.requests, 1);
    let mut frames = message.0;
    let frame_bytes: usize = frames.iter().map(|f| f.len()).sum();
    // [identity, envelope..., "", body...]: the delimiter is the first empty frame
    // after the identity ROUTER prepends. Envelope frames are never empty.
    let Some(delimiter) = frames
        .iter()
        .skip(1)
        .position(|f| f.is_empty())
        .map(|i| i + 1)
    else {
        let n = bump(&counters.no_delimiter, 1);
        shared.metrics.no_delimiter();
        if worth_a_warning(n) {
            tracing::warn!(
                frames = frames.len(),
                count = n,
                "dropped a message without an empty delimiter frame"
            );
        }
        return None;
    };
    let body: Vec<Bytes> = frames
        .drain(delimiter + 1..)
        .map(|m| Bytes::from_owner(Frame(m)))
        .collect();
    let mut routing = Multipart(frames);

    let request = wire::decode_request(&body);
    shared.metrics.request(&request);
    match request {
        ServerRequest::Lookup {
            format,
            num_tokens,
            block_hashes,
        } => {
            bump(&counters.lookups, 1);
            let held = frame_bytes + key_bytes(shared, num_tokens, &block_hashes);
            let shared = Arc::clone(shared);
            Some((
                async move {
                    let reply = match answer_lookup(&shared, num_tokens, &block_hashes).await {
                        Ok(hit) => wire::encode_lookup_reply(
                            format,
                            &LookupReply {
                                hit_tokens: hit,
                                boundaries: Vec::new(),
                            },
                        ),
                        // `spec/wire.md`, "Store unavailable": never a miss.
                        Err(StoreFailed) => wire::encode_store_unavailable(format),
                    };
                    routing.push_back(Message::from(reply.as_ref()));
                    routing
                }
                .boxed(),
                held,
            ))
        }
        ServerRequest::Reset => {
            bump(&counters.resets, 1);
            let shared = Arc::clone(shared);
            Some((
                async move {
                    let ok = match AssertUnwindSafe(async { shared.index.clear().await })
                        .catch_unwind()
                        .await
                    {
                        Ok(Ok(())) => true,
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "reset: the index could not be cleared");
                            false
                        }
                        Err(_) => {
                            tracing::warn!("reset: the index panicked while clearing");
                            false
                        }
                    };
                    if !ok {
                        bump(&shared.counters.reset_failures, 1);
                    }
                    tracing::info!(ok, "reset");
                    routing.push_back(Message::from(wire::encode_reset_reply(ok).as_ref()));
                    routing
                }
                .boxed(),
                frame_bytes,
            ))
        }
        ServerRequest::Malformed { format, error } => {
            let n = bump(&counters.decode_errors, 1);
            if worth_a_warning(n) {
                tracing::warn!(%format, %error, count = n, "malformed lookup answered with hit 0");
            }
            let reply = wire::encode_lookup_reply(format, &LookupReply::default());
            routing.push_back(Message::from(reply.as_ref()));
            Some((std::future::ready(routing).boxed(), frame_bytes))
        }
        ServerRequest::Unknown => {
            let n = bump(&counters.unknown_tags, 1);
            if worth_a_warning(n) {
                tracing::warn!(
                    frames = body.len(),
                    count = n,
                    "unknown request answered with 0x00"
                );
            }
            routing.push_back(Message::from(wire::unknown_tag_reply().as_ref()));
            Some((std::future::ready(routing).boxed(), frame_bytes))
        }
    }
}

/// The bytes of the store keys [`answer_lookup`] builds for a lookup: one `String`
/// per block in question and namespace.
fn key_bytes(shared: &Shared, num_tokens: u32, block_hashes: &BlockHashes) -> usize {
    let blocks = blocks_to_check(
        num_tokens,
        shared.block_size,
        shared.layout.blocks_of(block_hashes.len()),
    );
    let Some(hash) = block_hashes.iter().next() else {
        return 0;
    };
    let per_block: usize = shared
        .layout
        .block_keys(hash)
        .iter()
        .map(|k| k.len() + size_of::<String>())
        .sum();
    blocks.saturating_mul(per_block)
}

/// A lookup the index could not answer (its error is counted and logged where it
/// happened): the reply is [`wire::encode_store_unavailable`].
struct StoreFailed;

/// Hit tokens of one well-formed lookup (`spec/wire.md`, "What the server computes"):
/// one [`BlockIndex::leading_blocks`] call over every namespace key of the blocks in
/// question (by default one batched existence call).
///
/// # Errors
/// [`StoreFailed`] when the index fails (master down, timed out, no leader, a store
/// error, a panic): counted in `index_errors` and answered with the error reply of
/// `spec/wire.md`, "Store unavailable", never as a miss.
async fn answer_lookup(
    shared: &Shared,
    num_tokens: u32,
    block_hashes: &BlockHashes,
) -> Result<u32, StoreFailed> {
    let blocks = blocks_to_check(
        num_tokens,
        shared.block_size,
        shared.layout.blocks_of(block_hashes.len()),
    );
    if blocks == 0 {
        tracing::debug!(
            num_tokens,
            blocks = block_hashes.len(),
            hit_tokens = 0,
            "lookup"
        );
        return Ok(0);
    }
    let keys = shared.layout.chain_keys(block_hashes, blocks);
    let namespaces = shared.layout.namespaces().len();
    let started = std::time::Instant::now();
    let answer =
        match AssertUnwindSafe(async { shared.index.leading_blocks(namespaces, &keys).await })
            .catch_unwind()
            .await
        {
            Ok(answer) => answer,
            Err(_) => Err(IndexError::Store("the index panicked".to_owned())),
        };
    // The keys the index actually asked (bug e: an early stop asks fewer than the
    // chain has); a failed call counts none, `index_errors` counts it.
    let keys_asked = answer.as_ref().map_or(0, |run| run.keys_asked);
    bump(
        &shared.counters.keys_checked,
        u64::try_from(keys_asked).unwrap_or(u64::MAX),
    );
    shared.metrics.index_call(keys_asked, started.elapsed());
    let hit = match answer {
        // An index never finds more blocks than it was asked about; capping keeps a
        // faulty one from reaching past the chain.
        Ok(run) => hit_tokens(num_tokens, shared.block_size, run.blocks.min(blocks)),
        Err(e) => {
            let n = bump(&shared.counters.index_errors, 1);
            if worth_a_warning(n) {
                tracing::warn!(
                    error = %e,
                    count = n,
                    "index call failed; answering the store-unavailable error reply"
                );
            }
            tracing::debug!(
                num_tokens,
                blocks = block_hashes.len(),
                "lookup: store unavailable"
            );
            return Err(StoreFailed);
        }
    };
    bump(&shared.counters.hit_tokens, u64::from(hit));
    tracing::debug!(
        num_tokens,
        blocks = block_hashes.len(),
        hit_tokens = hit,
        "lookup"
    );
    Ok(hit)
}
