//! Shared pieces of the `server_*` end-to-end tests: endpoints in a private temp dir,
//! REQ and DEALER clients written with tmq directly (not our client), the request
//! frames of both wire formats, and test indexes that fail, gate or wait for each
//! other.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::BlockHashes;
use lookup_core::wire::{self, Format};
use lookup_server::{
    BlockIndex, Endpoint, InMemoryIndex, IndexError, IndexFuture, KeyLayout, LookupServer,
    ServerConfig,
};
use tempfile::TempDir;
use tmq::{Message, Multipart};
use tokio::sync::{Barrier, Notify};

/// Longest wait for any one reply: far above any healthy round trip, so that a bug
/// fails the test instead of hanging it.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(10);

/// The two transports every wire test runs over.
#[derive(Clone, Copy, Debug)]
pub enum Transport {
    /// A socket file in a fresh temp dir.
    Ipc,
    /// 127.0.0.1 with a port chosen at bind.
    Tcp,
}

/// A bound server with its in-memory index, and the temp dir of its ipc file.
pub struct Running {
    /// The server.
    pub server: LookupServer,
    /// Its in-memory index.
    pub index: Arc<InMemoryIndex>,
    /// Its key layout.
    pub layout: KeyLayout,
    /// A ZeroMQ context for the clients of the test.
    pub ctx: tmq::Context,
    /// Kept so that the directory outlives the server.
    pub dir: TempDir,
}

impl Running {
    /// Where the server listens.
    pub fn endpoint(&self) -> Endpoint {
        self.server.local_endpoint().clone()
    }

    /// A REQ client connected to the server.
    pub fn req(&self) -> Req {
        Req::connect(&self.ctx, self.server.local_endpoint())
    }

    /// A DEALER client connected to the server.
    pub fn dealer(&self) -> DealerClient {
        DealerClient::connect(&self.ctx, self.server.local_endpoint())
    }
}

/// The endpoint to bind for `transport`: `dir/lookup.sock` or `tcp://127.0.0.1:0`.
pub fn endpoint_for(transport: Transport, dir: &TempDir) -> Endpoint {
    match transport {
        Transport::Ipc => Endpoint::Ipc(dir.path().join("lookup.sock")),
        Transport::Tcp => "tcp://127.0.0.1:0".parse().expect("tcp endpoint"),
    }
}

/// Binds a server over `transport` with block size `block_size` and `layout`, backed
/// by an empty in-memory index.
pub fn start(transport: Transport, block_size: u32, layout: KeyLayout) -> Running {
    let index = Arc::new(InMemoryIndex::new());
    let dir = TempDir::new().expect("temp dir");
    let config = ServerConfig::new(block_size, layout.clone());
    let server =
        LookupServer::bind(&endpoint_for(transport, &dir), config, index.clone()).expect("bind");
    Running {
        server,
        index,
        layout,
        ctx: tmq::Context::new(),
        dir,
    }
}

/// Binds a server over `transport` with `config` and any index.
pub fn start_with(
    transport: Transport,
    config: ServerConfig,
    index: Arc<dyn BlockIndex>,
) -> (LookupServer, TempDir) {
    let dir = TempDir::new().expect("temp dir");
    let server = LookupServer::bind(&endpoint_for(transport, &dir), config, index).expect("bind");
    (server, dir)
}

/// `frames` as a tmq message.
pub fn to_multipart(frames: &[Bytes]) -> Multipart {
    frames.iter().map(|f| Message::from(f.as_ref())).collect()
}

/// The frames of a tmq message.
pub fn to_frames(message: Multipart) -> Vec<Bytes> {
    message
        .into_iter()
        .map(|m| Bytes::copy_from_slice(&m))
        .collect()
}

/// A lookup request of `num_tokens` tokens over the chain of 8-byte block ids `ids`.
pub fn lookup(format: Format, num_tokens: u32, block_size: u32, ids: &[u64]) -> Vec<Bytes> {
    wire::encode_lookup(format, num_tokens, block_size, &BlockHashes::from_u64s(ids))
}

/// The hit tokens of a lookup reply, which must be well-formed with no boundaries.
pub fn hit(format: Format, reply: &[Bytes]) -> u32 {
    let reply = wire::decode_lookup_reply(format, reply).expect("well-formed lookup reply");
    assert!(
        reply.boundaries.is_empty(),
        "a plain model sends no tail-key boundaries"
    );
    reply.hit_tokens
}

/// Whether a lookup reply is the server's store-unavailable error reply
/// (`spec/wire.md`, "Store unavailable": the single byte `0x00`, in both formats).
pub fn store_unavailable(format: Format, reply: &[Bytes]) -> bool {
    wire::decode_lookup_reply(format, reply) == Err(wire::WireError::StoreUnavailable)
}

/// Inserts blocks `ids` in every namespace of `layout`.
pub fn store(index: &InMemoryIndex, layout: &KeyLayout, ids: &[u64]) {
    index.insert_chain(layout, &BlockHashes::from_u64s(ids), ids.len());
}

/// The key of block `id` in namespace `namespace`.
pub fn key(layout: &KeyLayout, namespace: usize, id: u64) -> String {
    layout
        .key(namespace, &id.to_be_bytes())
        .expect("namespace exists")
}

/// A REQ client, as vLLM's scheduler uses: one request in flight.
pub struct Req {
    sender: Option<tmq::request_reply::RequestSender>,
}

impl Req {
    /// Connects to `endpoint`.
    pub fn connect(ctx: &tmq::Context, endpoint: &Endpoint) -> Self {
        let sender = tmq::request(ctx)
            .set_linger(0)
            .set_ipv6(true)
            .connect(&endpoint.url())
            .expect("connect REQ");
        Self {
            sender: Some(sender),
        }
    }

    /// Sends `frames` and waits for the reply (panics after [`REPLY_DEADLINE`]).
    pub async fn call(&mut self, frames: &[Bytes]) -> Vec<Bytes> {
        let sender = self
            .sender
            .take()
            .expect("REQ socket lost by an earlier failure");
        let exchange = async move {
            let receiver = sender.send(to_multipart(frames)).await.expect("REQ send");
            receiver.recv().await.expect("REQ recv")
        };
        let (reply, sender) = tokio::time::timeout(REPLY_DEADLINE, exchange)
            .await
            .expect("no reply within the deadline");
        self.sender = Some(sender);
        to_frames(reply)
    }
}

/// A DEALER client: puts its own envelope before the empty delimiter, may have many
/// requests in flight, and sees the envelope echoed.
pub struct DealerClient {
    dealer: tmq::dealer::Dealer,
}

impl DealerClient {
    /// Connects to `endpoint`.
    pub fn connect(ctx: &tmq::Context, endpoint: &Endpoint) -> Self {
        let dealer = tmq::dealer(ctx)
            .set_linger(0)
            .set_ipv6(true)
            .connect(&endpoint.url())
            .expect("connect DEALER");
        Self { dealer }
    }

    /// Sends exactly `frames`, with no envelope or delimiter added.
    pub async fn send_raw(&mut self, frames: &[Bytes]) {
        self.dealer
            .send(to_multipart(frames))
            .await
            .expect("DEALER send");
    }

    /// Sends `[envelope..., "", frames...]`.
    pub async fn send(&mut self, envelope: &[&[u8]], frames: &[Bytes]) {
        let mut all: Vec<Bytes> = envelope.iter().map(|e| Bytes::copy_from_slice(e)).collect();
        all.push(Bytes::new());
        all.extend_from_slice(frames);
        self.send_raw(&all).await;
    }

    /// Sends a request with the 8-byte envelope `rpc_id`.
    pub async fn send_id(&mut self, rpc_id: u64, frames: &[Bytes]) {
        self.send(&[&rpc_id.to_be_bytes()], frames).await;
    }

    /// The next whole message (panics after [`REPLY_DEADLINE`]).
    pub async fn recv(&mut self) -> Vec<Bytes> {
        self.recv_within(REPLY_DEADLINE)
            .await
            .expect("no reply within the deadline")
    }

    /// The next whole message, or `None` if none comes within `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Vec<Bytes>> {
        match tokio::time::timeout(wait, self.dealer.next()).await {
            Ok(Some(Ok(message))) => Some(to_frames(message)),
            Ok(Some(Err(e))) => panic!("DEALER recv: {e}"),
            Ok(None) => panic!("DEALER stream ended"),
            Err(_) => None,
        }
    }

    /// The next reply to [`send_id`](Self::send_id): `(rpc_id, reply frames)`.
    pub async fn recv_id(&mut self) -> (u64, Vec<Bytes>) {
        let frames = self.recv().await;
        assert!(frames.len() >= 2, "reply without envelope: {frames:?}");
        assert!(
            frames[1].is_empty(),
            "second frame must be the delimiter: {frames:?}"
        );
        let id = u64::from_be_bytes(frames[0].as_ref().try_into().expect("8-byte rpc id"));
        (id, frames[2..].to_vec())
    }
}

// ---------------------------------------------------------------------------------
// Test indexes
// ---------------------------------------------------------------------------------

/// An index whose calls always fail.
pub struct FailingIndex;

impl BlockIndex for FailingIndex {
    fn exists<'a>(&'a self, _keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(async { Err(IndexError::Unavailable("connection refused".to_owned())) })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async { Err(IndexError::Store("remove_all failed".to_owned())) })
    }
}

/// An index whose calls panic (a bug in a backend), synchronously for `exists` and
/// inside the future for `clear`.
pub struct PanickingIndex;

impl BlockIndex for PanickingIndex {
    fn exists<'a>(&'a self, _keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        panic!("index bug in exists")
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async { panic!("index bug in clear") })
    }
}

/// An index that answers one flag too few.
pub struct ShortAnswerIndex;

impl BlockIndex for ShortAnswerIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        let n = keys.len().saturating_sub(1);
        Box::pin(async move { Ok(vec![true; n]) })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// An in-memory index whose calls first wait until `parties` calls are waiting at
/// once: a server that asks one call at a time never gets past the first.
pub struct BarrierIndex {
    /// The store behind the barrier.
    pub inner: InMemoryIndex,
    barrier: Barrier,
}

impl BarrierIndex {
    /// An empty index whose calls wait for `parties` calls at once.
    pub fn new(parties: usize) -> Self {
        Self {
            inner: InMemoryIndex::new(),
            barrier: Barrier::new(parties),
        }
    }
}

impl BlockIndex for BarrierIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(async move {
            self.barrier.wait().await;
            Ok(self.inner.exists_now(keys))
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        self.inner.clear()
    }
}

/// An in-memory index that holds every call containing the `gated` key until
/// [`open`](Self::open), and records when such a call arrives.
pub struct GateIndex {
    /// The store behind the gate.
    pub inner: InMemoryIndex,
    gated: String,
    open: Mutex<bool>,
    opened: Notify,
    /// Calls that held the gated key.
    pub gated_calls: AtomicUsize,
    /// Notified when a call holding the gated key arrives.
    pub gated_arrived: Notify,
}

impl GateIndex {
    /// An empty index holding calls that ask about `gated`.
    pub fn new(gated: String) -> Self {
        Self {
            inner: InMemoryIndex::new(),
            gated,
            open: Mutex::new(false),
            opened: Notify::new(),
            gated_calls: AtomicUsize::new(0),
            gated_arrived: Notify::new(),
        }
    }

    /// Opens the gate: held calls and later ones go on.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_waiters();
    }

    fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }
}

impl BlockIndex for GateIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(async move {
            if keys.contains(&self.gated) {
                self.gated_calls.fetch_add(1, Ordering::SeqCst);
                self.gated_arrived.notify_one();
                loop {
                    let opened = self.opened.notified();
                    if self.is_open() {
                        break;
                    }
                    opened.await;
                }
            }
            Ok(self.inner.exists_now(keys))
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        self.inner.clear()
    }
}
