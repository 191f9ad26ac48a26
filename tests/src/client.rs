//! Shared pieces of the `client_*` end-to-end tests: unique endpoints, a scriptable
//! in-test lookup server (a tmq ROUTER speaking `lookup_core::wire`), the reference
//! hit computation of `spec/wire.md`, and polling helpers with an overall deadline.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::wire::{self, Format, LookupReply, ServerRequest};
use lookup_core::{BlockHashes, Request, RequestId};
use lookup_tokio::Endpoint;

use crate::served::Served;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A directory of its own under the temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory for test `tag` (the process id and a counter make it unique).
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lk-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// An ipc endpoint for a socket file `name` in the directory.
    pub fn ipc(&self, name: &str) -> Endpoint {
        Endpoint::Ipc(self.0.join(name))
    }

    /// Names of the entries in the directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TCP endpoint on 127.0.0.1 with a port that was free a moment ago (fixed, so a
/// second server can bind the same endpoint after the first one stops).
pub fn free_tcp() -> Endpoint {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local addr").port();
    Endpoint::Tcp(format!("127.0.0.1:{port}"))
}

/// A TCP endpoint on 127.0.0.1 that refuses every connection for as long as the
/// returned socket lives: its port is bound (without `SO_REUSEADDR`, so no other test
/// can bind it meanwhile, as one could a port found free) and never listened on.
///
/// # Panics
/// When the socket cannot be created or bound.
pub fn refused_tcp() -> (Endpoint, tokio::net::TcpSocket) {
    let socket = tokio::net::TcpSocket::new_v4().expect("create a tcp socket");
    socket
        .bind(([127, 0, 0, 1], 0).into())
        .expect("bind a free port");
    let port = socket.local_addr().expect("local addr").port();
    (Endpoint::Tcp(format!("127.0.0.1:{port}")), socket)
}

/// A request with `num_tokens` tokens and 8-byte hashes from `ids`.
pub fn request(id: u64, num_tokens: u32, ids: &[u64]) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens,
        block_hashes: BlockHashes::from_u64s(ids),
        skip_reading_external_kv: false,
    }
}

/// The hit the reference server computes (`spec/wire.md`, "What the server
/// computes"): aligned tokens, leading run of present blocks, full-hit rule.
pub fn reference_hit(
    num_tokens: u32,
    block_size: u32,
    hashes: &BlockHashes,
    present: &dyn Fn(&[u8]) -> bool,
) -> u32 {
    let run_hit = |limit: u32| {
        let blocks = (limit / block_size) as usize;
        let run = hashes
            .iter()
            .take(blocks)
            .take_while(|h| present(h))
            .count();
        block_size * u32::try_from(run).expect("run fits u32")
    };
    if hashes.is_empty() || num_tokens / block_size == 0 {
        return 0;
    }
    let hit = run_hit(num_tokens);
    if hit >= num_tokens {
        run_hit(num_tokens - 1)
    } else {
        hit
    }
}

/// What the fake server does with one lookup.
pub type LookupHandler = dyn Fn(Format, u32, &BlockHashes) -> Answer + Send + Sync;

/// The fake server's answer to one lookup.
#[derive(Clone, Debug)]
pub enum Answer {
    /// This hit, encoded in the request's format.
    Hit(u32),
    /// These raw reply frames (to send malformed replies).
    Raw(Vec<Bytes>),
    /// No reply ever.
    Silent,
    /// These whole messages after the routing identity, envelope included (to send
    /// replies with a wrong or missing envelope).
    Messages(Vec<Vec<Bytes>>),
}

/// One request as the fake server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A well-formed lookup.
    Lookup {
        /// Its wire format.
        format: Format,
        /// Prompt tokens as sent.
        num_tokens: u32,
        /// The block hashes as sent.
        block_hashes: BlockHashes,
    },
    /// A `tagged-blob` reset.
    Reset,
    /// Anything else (malformed or unknown).
    Other,
}

struct State {
    handler: Box<LookupHandler>,
    seen: Mutex<Vec<Seen>>,
    lookups: AtomicU64,
    resets: AtomicU64,
    /// While true, lookup replies are held until `release` (resets are never held).
    paused: AtomicBool,
    reverse: AtomicBool,
    release: Notify,
    /// While true, reset replies are held until `release_resets`.
    resets_paused: AtomicBool,
    release_resets: Notify,
    /// Lookups received while a reset's reply was held (rule 13: none).
    lookups_beside_reset: AtomicU64,
}

/// A scriptable lookup server: a ROUTER bound to an endpoint, answering each lookup
/// as its handler says, optionally holding replies and releasing them in reverse.
pub struct FakeServer {
    served: Served,
    state: Arc<State>,
}

impl FakeServer {
    /// Binds `endpoint` (inside a tokio runtime) and serves with `handler`.
    pub fn start(
        endpoint: &Endpoint,
        handler: impl Fn(Format, u32, &BlockHashes) -> Answer + Send + Sync + 'static,
    ) -> Self {
        let state = Arc::new(State {
            handler: Box::new(handler),
            seen: Mutex::new(Vec::new()),
            lookups: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            reverse: AtomicBool::new(false),
            release: Notify::new(),
            resets_paused: AtomicBool::new(false),
            release_resets: Notify::new(),
            lookups_beside_reset: AtomicU64::new(0),
        });
        let serving = Arc::clone(&state);
        let served = Served::bind(endpoint, "fake server", move |socket, cancel| {
            serve(socket, serving, cancel)
        });
        Self { served, state }
    }

    /// Serves the reference semantics with block size `block_size` over a set of
    /// present 8-byte block ids.
    pub fn reference(endpoint: &Endpoint, block_size: u32, present: &[u64]) -> Self {
        let present: HashSet<u64> = present.iter().copied().collect();
        Self::start(endpoint, move |_, num_tokens, hashes| {
            let is_present = |h: &[u8]| {
                <[u8; 8]>::try_from(h).is_ok_and(|b| present.contains(&u64::from_be_bytes(b)))
            };
            Answer::Hit(reference_hit(num_tokens, block_size, hashes, &is_present))
        })
    }

    /// Never answers a lookup (resets are still answered).
    pub fn silent(endpoint: &Endpoint) -> Self {
        Self::start(endpoint, |_, _, _| Answer::Silent)
    }

    /// Holds lookup replies from now on, until [`release`](Self::release).
    pub fn pause(&self) {
        self.state.paused.store(true, Ordering::SeqCst);
    }

    /// Sends the held replies (in reverse order of arrival if `reverse`) and stops
    /// holding.
    pub fn release(&self, reverse: bool) {
        self.state.reverse.store(reverse, Ordering::SeqCst);
        self.state.paused.store(false, Ordering::SeqCst);
        self.state.release.notify_one();
    }

    /// Holds reset replies from now on, until [`release_resets`](Self::release_resets).
    pub fn pause_resets(&self) {
        self.state.resets_paused.store(true, Ordering::SeqCst);
    }

    /// Sends the held reset replies and stops holding them.
    pub fn release_resets(&self) {
        self.state.resets_paused.store(false, Ordering::SeqCst);
        self.state.release_resets.notify_one();
    }

    /// Lookups received while a reset's reply was held: a client whose reset is a
    /// barrier (`spec/behaviour.md` rule 13) sends none.
    pub fn lookups_beside_reset(&self) -> u64 {
        self.state.lookups_beside_reset.load(Ordering::SeqCst)
    }

    /// Lookups received so far.
    pub fn lookups(&self) -> u64 {
        self.state.lookups.load(Ordering::SeqCst)
    }

    /// Resets received so far.
    pub fn resets(&self) -> u64 {
        self.state.resets.load(Ordering::SeqCst)
    }

    /// Every request received so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("lock").clone()
    }

    /// Where the fake server listens.
    pub fn endpoint(&self) -> &Endpoint {
        self.served.endpoint()
    }

    /// Stops serving, closes the socket and removes the ipc file.
    pub async fn stop(self) {
        self.served.stop().await;
    }
}

async fn serve(mut socket: tmq::router::Router, state: Arc<State>, cancel: CancellationToken) {
    let mut held: Vec<Vec<Bytes>> = Vec::new();
    let mut held_resets: Vec<Vec<Bytes>> = Vec::new();
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            () = state.release_resets.notified() => {
                for reply in held_resets.drain(..) {
                    send(&mut socket, reply).await;
                }
            }
            () = state.release.notified() => {
                if state.reverse.load(Ordering::SeqCst) {
                    held.reverse();
                }
                for reply in held.drain(..) {
                    send(&mut socket, reply).await;
                }
            }
            message = socket.next() => {
                let Some(Ok(message)) = message else { continue };
                let frames: Vec<Bytes> = message.into_iter().map(|m| Bytes::copy_from_slice(&m)).collect();
                // [identity, envelope..., "", body...]
                let Some(split) = frames.iter().position(|f| f.is_empty()) else { continue };
                let (envelope, body) = (&frames[..=split], &frames[split + 1..]);
                let answer = match wire::decode_request(body) {
                    ServerRequest::Lookup { format, num_tokens, block_hashes } => {
                        state.lookups.fetch_add(1, Ordering::SeqCst);
                        if !held_resets.is_empty() {
                            state.lookups_beside_reset.fetch_add(1, Ordering::SeqCst);
                        }
                        state.seen.lock().expect("lock").push(Seen::Lookup { format, num_tokens, block_hashes: block_hashes.clone() });
                        match (state.handler)(format, num_tokens, &block_hashes) {
                            Answer::Hit(hit_tokens) => Some(vec![wire::encode_lookup_reply(format, &LookupReply { hit_tokens, boundaries: vec![] })]),
                            Answer::Raw(frames) => Some(frames),
                            Answer::Silent => None,
                            Answer::Messages(messages) => {
                                for message in messages {
                                    let reply: Vec<Bytes> = envelope[..1].iter().cloned().chain(message).collect();
                                    send(&mut socket, reply).await;
                                }
                                None
                            }
                        }
                    }
                    ServerRequest::Reset => {
                        state.resets.fetch_add(1, Ordering::SeqCst);
                        state.seen.lock().expect("lock").push(Seen::Reset);
                        let reply: Vec<Bytes> = envelope.iter().cloned().chain([wire::encode_reset_reply(true)]).collect();
                        if state.resets_paused.load(Ordering::SeqCst) {
                            held_resets.push(reply);
                        } else {
                            send(&mut socket, reply).await;
                        }
                        continue;
                    }
                    _ => {
                        state.seen.lock().expect("lock").push(Seen::Other);
                        Some(vec![wire::unknown_tag_reply()])
                    }
                };
                let Some(answer) = answer else { continue };
                let reply: Vec<Bytes> = envelope.iter().cloned().chain(answer).collect();
                if state.paused.load(Ordering::SeqCst) {
                    held.push(reply);
                } else {
                    send(&mut socket, reply).await;
                }
            }
        }
    }
}

async fn send(socket: &mut tmq::router::Router, frames: Vec<Bytes>) {
    let message: Vec<tmq::Message> = frames.iter().map(|f| tmq::Message::from(&f[..])).collect();
    let _ = socket.send(message).await;
}

/// Polls `condition` every millisecond until it holds; panics with `what` after
/// `limit`.
pub async fn until(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
