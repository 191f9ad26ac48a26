//! The reference lookup server: answers vLLM's lookup channel from a [`BlockIndex`].
//!
//! A ROUTER socket (ZeroMQ, `tmq`) bound over ipc or tcp serves unmodified vLLM REQ
//! clients and DEALER clients that put an envelope (an RPC id) before the empty
//! delimiter, in both wire formats (`spec/wire.md`). Each lookup asks the index once,
//! for every key of the blocks in question, and answers per "What the server computes".
//! Lookups are answered concurrently, up to [`ServerConfig::max_concurrency`] at
//! once, so a slow index call does not hold up other clients; replies go out in
//! completion order. The server never dies on input: malformed lookups get hit 0,
//! unknown tags `0x00`, and messages without a delimiter are dropped; all are counted
//! in [`ServerStats`].
//!
//! # Security
//!
//! ZeroMQ has no authentication and no encryption here: anyone who can reach the
//! socket can ask which blocks are stored and wipe the store with a reset. So a TCP
//! bind to a non-loopback address is refused unless [`ServerConfig::allow_remote`] is
//! set, an ipc socket file is made owner-only (mode 0600) right after bind, and a
//! missing parent directory is created owner-only (0700). Keep the channel on ipc or
//! loopback; put anything wider behind a tunnel that authenticates.

use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, SinkExt, StreamExt};
use lookup_core::BlockHashes;
use lookup_core::wire::{self, LookupReply, ServerRequest};
use tmq::{AsZmqSocket, Message, Multipart};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::index::{BlockIndex, IndexError, KeyLayout};
use crate::{Endpoint, Error};

/// Default of [`ServerConfig::max_concurrency`]: requests answered at once.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// Default of [`ServerConfig::max_frame_bytes`]: the largest well-formed request
/// frame, a `msgpack-hex` array of [`wire::MAX_HASHES`] hashes of
/// [`wire::MAX_HASH_LEN`] bytes (5-byte headers, two hex digits a byte), rounded up.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 5 + wire::MAX_HASHES * (5 + 2 * wire::MAX_HASH_LEN);

/// Settings of a [`LookupServer`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Block size `B` in tokens: the lookup alignment (`spec/wire.md`, "What the
    /// server computes"; vLLM default 16, the Mooncake traces 512). Must be positive.
    pub block_size: u32,
    /// How block hashes become store keys.
    pub layout: KeyLayout,
    /// Requests answered at once (at least 1). At the limit the server stops reading
    /// its socket until one finishes; ZeroMQ queues the rest.
    pub max_concurrency: usize,
    /// Allow a TCP bind to an address that is not loopback (`127.0.0.0/8`, `::1`,
    /// `localhost`). Off by default: the channel has no authentication.
    pub allow_remote: bool,
    /// Largest frame accepted, in bytes (ZeroMQ `ZMQ_MAXMSGSIZE`): a peer sending a
    /// bigger one is disconnected before the frame is buffered.
    pub max_frame_bytes: usize,
    /// Take over an ipc path that a running server still listens on (what vLLM's
    /// worker does when it binds). Off by default: binding then fails with
    /// [`Error::EndpointInUse`] instead of silently cutting the running server off.
    pub take_over: bool,
}

impl ServerConfig {
    /// Block size `block_size` tokens, `layout`, and the defaults for the rest.
    #[must_use]
    pub fn new(block_size: u32, layout: KeyLayout) -> Self {
        Self {
            block_size,
            layout,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            allow_remote: false,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            take_over: false,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidServerConfig`] for a block size of 0, a `max_concurrency` of 0
    /// or a `max_frame_bytes` of 0.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key, why: &str| {
            Err(Error::InvalidServerConfig {
                key,
                why: why.to_owned(),
            })
        };
        if self.block_size == 0 {
            return bad("block_size", "must be at least 1 token");
        }
        if self.max_concurrency == 0 {
            return bad("max_concurrency", "must be at least 1");
        }
        if self.max_frame_bytes == 0 {
            return bad("max_frame_bytes", "must be at least 1 byte");
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    /// Block size 16 tokens (vLLM's default) and [`KeyLayout::default`].
    fn default() -> Self {
        Self::new(16, KeyLayout::default())
    }
}

// ---------------------------------------------------------------------------------
// What the server computes
// ---------------------------------------------------------------------------------

/// How many leading blocks a lookup asks the index about: `min(block_hashes,
/// floor(num_tokens / block_size))`; 0 when there are no hashes or fewer tokens than a
/// block (`spec/wire.md`, "What the server computes", steps 1-2). A `block_size` of 0
/// gives 0.
#[must_use]
pub fn blocks_to_check(num_tokens: u32, block_size: u32, num_hashes: usize) -> usize {
    let aligned_blocks = num_tokens.checked_div(block_size).unwrap_or(0);
    usize::try_from(aligned_blocks).map_or(num_hashes, |b| b.min(num_hashes))
}

/// Hit tokens for a leading run of `leading_run` present blocks: `block_size *
/// leading_run`, except that a hit covering the whole prompt is recomputed with
/// `num_tokens - 1` as the limit, so the last prompt token is always recomputed
/// (`spec/wire.md`, "What the server computes", steps 3-4; vLLM #55113). 32 tokens
/// with both 16-token blocks present: 16; 33 tokens: 32.
///
/// `leading_run` is at most [`blocks_to_check`], so the result never exceeds
/// `num_tokens`; larger values are capped there too. A `block_size` of 0 gives 0.
///
/// The rule applies to both formats, with the token count as sent. A `msgpack-hex`
/// client floors it to the block size first, so an unaligned prompt whose every block
/// is stored (33 tokens, 2 blocks of 16) arrives as 32 and gets 16, one block less
/// than the prompt allows; the answer stays safe for clients that trust it.
#[must_use]
pub fn hit_tokens(num_tokens: u32, block_size: u32, leading_run: usize) -> u32 {
    let run = u64::try_from(leading_run).unwrap_or(u64::MAX);
    let b = u64::from(block_size);
    let aligned_blocks = u64::from(num_tokens.checked_div(block_size).unwrap_or(0));
    let mut blocks = run.min(aligned_blocks);
    if blocks * b >= u64::from(num_tokens) && num_tokens > 0 {
        blocks = blocks.min(u64::from((num_tokens - 1) / block_size));
    }
    // blocks * b <= num_tokens, a u32.
    u32::try_from(blocks * b).unwrap_or(0)
}

/// The number of leading blocks all of whose keys exist, given the index's flags for
/// block-major keys, `namespaces` per block (`spec/wire.md`, "What the server
/// computes", steps 2-3: a block is present only when every namespace key exists; the
/// first missing block ends the run).
#[must_use]
pub fn leading_run(present: &[bool], namespaces: usize) -> usize {
    if namespaces == 0 {
        return 0;
    }
    present
        .chunks(namespaces)
        .take_while(|block| block.len() == namespaces && block.iter().all(|&p| p))
        .count()
}

// ---------------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------------

/// A snapshot of a server's counters since it was bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Messages received from the socket, whatever their content.
    pub requests: u64,
    /// Well-formed lookups, in either format.
    pub lookups: u64,
    /// Keys asked about in index calls (blocks × namespaces, summed). An index that
    /// stops once the leading run has ended may send fewer to its store.
    pub keys_checked: u64,
    /// Hit tokens answered, summed (tokens).
    pub hit_tokens: u64,
    /// Malformed lookups, answered with hit 0 (`spec/wire.md`, "What the server
    /// computes").
    pub decode_errors: u64,
    /// Requests of neither format, answered with `0x00`.
    pub unknown_tags: u64,
    /// Messages without the empty delimiter frame, dropped unanswered: they cannot
    /// come from a REQ or well-behaved DEALER client, and have no routing envelope.
    pub no_delimiter: u64,
    /// Index calls that failed (or panicked, or answered the wrong number of flags);
    /// each such lookup was answered with 0 hit tokens.
    pub index_errors: u64,
    /// Reset requests received.
    pub resets: u64,
    /// Resets whose wipe failed, answered with `0x00`.
    pub reset_failures: u64,
    /// Replies handed to the socket.
    pub replies: u64,
    /// Receive or send errors of the socket.
    pub socket_errors: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    lookups: AtomicU64,
    keys_checked: AtomicU64,
    hit_tokens: AtomicU64,
    decode_errors: AtomicU64,
    unknown_tags: AtomicU64,
    no_delimiter: AtomicU64,
    index_errors: AtomicU64,
    resets: AtomicU64,
    reset_failures: AtomicU64,
    replies: AtomicU64,
    socket_errors: AtomicU64,
}

/// Adds `n` and returns the new value.
fn bump(counter: &AtomicU64, n: u64) -> u64 {
    counter.fetch_add(n, Ordering::Relaxed) + n
}

/// Whether the `count`-th occurrence of a kind of bad input gets a warning: the 1st,
/// 2nd, 4th, 8th, ... so that hostile input cannot flood the log.
fn worth_a_warning(count: u64) -> bool {
    count.is_power_of_two()
}

impl Counters {
    fn snapshot(&self) -> ServerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerStats {
            requests: get(&self.requests),
            lookups: get(&self.lookups),
            keys_checked: get(&self.keys_checked),
            hit_tokens: get(&self.hit_tokens),
            decode_errors: get(&self.decode_errors),
            unknown_tags: get(&self.unknown_tags),
            no_delimiter: get(&self.no_delimiter),
            index_errors: get(&self.index_errors),
            resets: get(&self.resets),
            reset_failures: get(&self.reset_failures),
            replies: get(&self.replies),
            socket_errors: get(&self.socket_errors),
        }
    }
}

// ---------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------

/// A running lookup server: one tokio task owning a bound ROUTER socket.
///
/// Dropping the handle stops the task too (asynchronously);
/// [`shutdown`](Self::shutdown) stops it and waits, so that the socket is closed and
/// the ipc file is gone when it returns.
#[derive(Debug)]
pub struct LookupServer {
    local: Endpoint,
    counters: Arc<Counters>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// What the socket task shares with the request futures.
struct Shared {
    block_size: u32,
    layout: KeyLayout,
    index: Arc<dyn BlockIndex>,
    counters: Arc<Counters>,
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

        let counters = Arc::new(Counters::default());
        let shared = Arc::new(Shared {
            block_size: config.block_size,
            layout: config.layout,
            index,
            counters: Arc::clone(&counters),
            metrics: crate::metrics::ServerMetrics::new(),
        });
        let (stop, stopped) = oneshot::channel();
        let task = runtime.spawn(serve(
            socket,
            shared,
            config.max_concurrency,
            stopped,
            ipc_file,
        ));
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

/// The socket task: reads requests, answers cheap ones at once, keeps index calls in
/// flight up to `max_concurrency`, and writes replies as they complete.
async fn serve(
    mut socket: tmq::router::Router,
    shared: Arc<Shared>,
    max_concurrency: usize,
    mut stopped: oneshot::Receiver<()>,
    ipc_file: Option<IpcFile>,
) {
    let mut pending: FuturesUnordered<BoxFuture<'static, Multipart>> = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            Some(reply) = pending.next(), if !pending.is_empty() => {
                send(&mut socket, &shared.counters, reply).await;
            }
            received = socket.next(), if pending.len() < max_concurrency => match received {
                Some(Ok(message)) => {
                    if let Some(mut answer) = handle(&shared, message) {
                        // An index that answers without waiting (the in-memory one)
                        // is answered on the spot, without a trip through the queue.
                        match (&mut answer).now_or_never() {
                            Some(reply) => send(&mut socket, &shared.counters, reply).await,
                            None => pending.push(answer),
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
async fn send(socket: &mut tmq::router::Router, counters: &Counters, reply: Multipart) {
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

/// Classifies one received message; returns the future of its reply, or `None` when
/// it is dropped.
fn handle(shared: &Arc<Shared>, message: Multipart) -> Option<BoxFuture<'static, Multipart>> {
    let counters = &shared.counters;
    bump(&counters.requests, 1);
    let mut frames = message.0;
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
            let shared = Arc::clone(shared);
            Some(
                async move {
                    let hit = answer_lookup(&shared, num_tokens, &block_hashes).await;
                    let reply = LookupReply {
                        hit_tokens: hit,
                        boundaries: Vec::new(),
                    };
                    routing.push_back(Message::from(
                        wire::encode_lookup_reply(format, &reply).as_ref(),
                    ));
                    routing
                }
                .boxed(),
            )
        }
        ServerRequest::Reset => {
            bump(&counters.resets, 1);
            let shared = Arc::clone(shared);
            Some(
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
            )
        }
        ServerRequest::Malformed { format, error } => {
            let n = bump(&counters.decode_errors, 1);
            if worth_a_warning(n) {
                tracing::warn!(%format, %error, count = n, "malformed lookup answered with hit 0");
            }
            let reply = wire::encode_lookup_reply(format, &LookupReply::default());
            routing.push_back(Message::from(reply.as_ref()));
            Some(std::future::ready(routing).boxed())
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
            Some(std::future::ready(routing).boxed())
        }
    }
}

/// Hit tokens of one well-formed lookup (`spec/wire.md`, "What the server computes"):
/// one [`BlockIndex::leading_blocks`] call over every namespace key of the blocks in
/// question (by default one batched existence call); any index failure is a miss.
async fn answer_lookup(shared: &Shared, num_tokens: u32, block_hashes: &BlockHashes) -> u32 {
    let blocks = blocks_to_check(num_tokens, shared.block_size, block_hashes.len());
    if blocks == 0 {
        tracing::debug!(
            num_tokens,
            blocks = block_hashes.len(),
            hit_tokens = 0,
            "lookup"
        );
        return 0;
    }
    let keys = shared.layout.chain_keys(block_hashes, blocks);
    bump(
        &shared.counters.keys_checked,
        u64::try_from(keys.len()).unwrap_or(u64::MAX),
    );
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
    shared.metrics.index_call(keys.len(), started.elapsed());
    let hit = match answer {
        // An index never finds more blocks than it was asked about; capping keeps a
        // faulty one from reaching past the chain.
        Ok(run) => hit_tokens(num_tokens, shared.block_size, run.min(blocks)),
        Err(e) => {
            let n = bump(&shared.counters.index_errors, 1);
            if worth_a_warning(n) {
                tracing::warn!(error = %e, count = n, "index call failed; answering 0 hit tokens");
            }
            0
        }
    };
    bump(&shared.counters.hit_tokens, u64::from(hit));
    tracing::debug!(
        num_tokens,
        blocks = block_hashes.len(),
        hit_tokens = hit,
        "lookup"
    );
    hit
}

// ---------------------------------------------------------------------------------
// Endpoints and the ipc file
// ---------------------------------------------------------------------------------

/// The host part of a `host:port` TCP address.
fn tcp_host(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// `host` without the brackets of an IPv6 literal.
fn bare_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Whether a TCP host names the loopback interface: an IP literal in `127.0.0.0/8`
/// or `::1`, or `localhost`. Wildcards (`*`, `0.0.0.0`), interface names and other
/// host names are not.
fn is_loopback_host(host: &str) -> bool {
    let host = bare_host(host);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The endpoint the socket actually bound (the chosen port for port 0).
fn last_endpoint(socket: &tmq::router::Router) -> Option<Endpoint> {
    let url = socket.get_socket().get_last_endpoint().ok()?.ok()?;
    url.parse().ok()
}

/// Makes `path` ready for binding: creates a missing parent directory owner-only and
/// removes a stale socket file (one nobody accepts connections on, or any socket with
/// `take_over`). Anything else at the path is left alone and refused.
fn prepare_ipc_path(path: &Path, take_over: bool) -> Result<(), Error> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if !take_over && std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::EndpointInUse {
                    endpoint: format!("ipc://{}", path.display()),
                });
            }
            fs::remove_file(path)?;
            tracing::info!(path = %path.display(), "removed a stale ipc socket file");
            Ok(())
        }
        Ok(_) => Err(Error::InvalidServerConfig {
            key: "endpoint",
            why: format!("{} exists and is not a socket file", path.display()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The ipc socket file this server created, unlinked on drop only if it is still the
/// same file (same device and inode): a later server that took over the path keeps
/// its own.
#[derive(Debug)]
struct IpcFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl IpcFile {
    /// Records the file just bound and makes it owner-only.
    fn claim(path: &Path) -> Result<Self, Error> {
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
        let meta = fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }
}

impl Drop for IpcFile {
    fn drop(&mut self) {
        if let Ok(meta) = fs::symlink_metadata(&self.path) {
            if meta.dev() == self.dev && meta.ino() == self.ino {
                if let Err(e) = fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not unlink the ipc socket file");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_to_check_is_bounded_by_tokens_and_hashes() {
        assert_eq!(blocks_to_check(40, 16, 3), 2);
        assert_eq!(blocks_to_check(48, 16, 3), 3);
        assert_eq!(blocks_to_check(1000, 16, 3), 3);
        assert_eq!(blocks_to_check(15, 16, 3), 0);
        assert_eq!(blocks_to_check(48, 16, 0), 0);
        assert_eq!(blocks_to_check(48, 0, 3), 0);
    }

    #[test]
    fn hit_is_the_leading_run_in_tokens() {
        assert_eq!(hit_tokens(40, 16, 2), 32);
        assert_eq!(hit_tokens(40, 16, 1), 16);
        assert_eq!(hit_tokens(40, 16, 0), 0);
    }

    #[test]
    fn full_hit_recomputes_the_last_token() {
        // spec/wire.md step 4: 32 tokens, both 16-token blocks present → 16; 33 → 32.
        assert_eq!(hit_tokens(32, 16, 2), 16);
        assert_eq!(hit_tokens(33, 16, 2), 32);
        assert_eq!(hit_tokens(16, 16, 1), 0);
        assert_eq!(hit_tokens(1024, 512, 2), 512);
        // A run longer than the aligned prompt is capped, then the rule applies.
        assert_eq!(hit_tokens(32, 16, 9), 16);
        assert_eq!(hit_tokens(0, 16, 3), 0);
        assert_eq!(hit_tokens(32, 0, 2), 0);
        assert_eq!(hit_tokens(u32::MAX, 1, usize::MAX), u32::MAX - 1);
    }

    #[test]
    fn leading_run_needs_every_namespace() {
        assert_eq!(leading_run(&[true, true, false], 1), 2);
        assert_eq!(leading_run(&[true, false, true, true], 1), 1);
        assert_eq!(leading_run(&[true, true, true, false, true, true], 2), 1);
        assert_eq!(leading_run(&[true, true, true, true], 2), 2);
        // A trailing partial block (a short answer) never counts.
        assert_eq!(leading_run(&[true, true, true], 2), 1);
        assert_eq!(leading_run(&[], 2), 0);
        assert_eq!(leading_run(&[true], 0), 0);
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback_host("127.0.0.1"));
        assert!(is_loopback_host("127.1.2.3"));
        assert!(is_loopback_host("[::1]"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("0.0.0.0"));
        assert!(!is_loopback_host("*"));
        assert!(!is_loopback_host("10.0.0.1"));
        assert!(!is_loopback_host("eth0"));
        assert!(!is_loopback_host("[::]"));
        assert_eq!(tcp_host("127.0.0.1:5555"), "127.0.0.1");
        assert_eq!(tcp_host("[::1]:5555"), "[::1]");
    }

    #[test]
    fn invalid_settings_are_refused() {
        let mut config = ServerConfig::default();
        config.validate().unwrap();
        config.block_size = 0;
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidServerConfig {
                key: "block_size",
                ..
            })
        ));
        let config = ServerConfig {
            max_concurrency: 0,
            ..ServerConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidServerConfig {
                key: "max_concurrency",
                ..
            })
        ));
    }

    #[test]
    fn warnings_thin_out() {
        let warned: Vec<u64> = (1..=20).filter(|&n| worth_a_warning(n)).collect();
        assert_eq!(warned, vec![1, 2, 4, 8, 16]);
    }
}
