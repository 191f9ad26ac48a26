//! [`FaultServer`]: an in-test ROUTER that answers the workload with scripted delays,
//! duplicates, holds and drops.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::BlockHashes;
use lookup_core::wire::{self, LookupReply, ServerRequest};
use lookup_tokio::Endpoint;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::served::Served;

/// One lookup as the fault server received it.
#[derive(Clone, Debug)]
pub struct SeenLookup {
    /// The client's RPC id (the 8-byte envelope), if there was one.
    pub rpc_id: Option<u64>,
    /// Prompt tokens as sent.
    pub num_tokens: u32,
    /// The block hashes as sent.
    pub block_hashes: BlockHashes,
    /// How many earlier lookups of the same chain this server received.
    pub occurrence: u32,
}

impl SeenLookup {
    /// The owner of the chain (its request id).
    pub fn owner(&self) -> u64 {
        chain_owner(&self.block_hashes).unwrap_or(u64::MAX)
    }

    /// What the reference server answers.
    pub fn hit(&self) -> u32 {
        chain_hit(self.num_tokens, &self.block_hashes)
    }
}

/// One reply copy the fault server sends for a lookup.
#[derive(Clone, Copy, Debug)]
pub struct Copy {
    /// `Some(d)`: sent `d` after the request arrived; `None`: held until
    /// [`FaultServer::release`].
    pub delay: Option<Duration>,
    /// The hit it carries (tokens).
    pub hit_tokens: u32,
}

impl Copy {
    /// A copy sent at once, carrying `hit_tokens`.
    pub fn now(hit_tokens: u32) -> Self {
        Self {
            delay: Some(Duration::ZERO),
            hit_tokens,
        }
    }

    /// A copy sent `delay` after the lookup arrived, carrying `hit_tokens`.
    pub fn after(delay: Duration, hit_tokens: u32) -> Self {
        Self {
            delay: Some(delay),
            hit_tokens,
        }
    }
}

/// Decides the reply copies of each lookup (none: dropped).
pub type Planner = dyn Fn(&SeenLookup) -> Vec<Copy> + Send + Sync;

struct FaultState {
    planner: Box<Planner>,
    hold_all: AtomicBool,
    release: Notify,
    lookups: AtomicU64,
    resets: AtomicU64,
    occurrences: Mutex<HashMap<u64, u32>>,
    /// RPC ids in the order their lookups arrived.
    received: Mutex<Vec<u64>>,
    /// RPC ids in the order reply copies were written.
    replied: Mutex<Vec<u64>>,
}

/// A ROUTER that answers workload lookups as its planner says: at once, late,
/// several times, never, or held until released. Resets are answered at once (ok).
pub struct FaultServer {
    served: Served,
    state: Arc<FaultState>,
}

impl FaultServer {
    /// Binds `endpoint` (inside a tokio runtime).
    pub fn start(
        endpoint: &Endpoint,
        planner: impl Fn(&SeenLookup) -> Vec<Copy> + Send + Sync + 'static,
    ) -> Self {
        let state = Arc::new(FaultState {
            planner: Box::new(planner),
            hold_all: AtomicBool::new(false),
            release: Notify::new(),
            lookups: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            occurrences: Mutex::new(HashMap::new()),
            received: Mutex::new(Vec::new()),
            replied: Mutex::new(Vec::new()),
        });
        let serving = Arc::clone(&state);
        let served = Served::bind(endpoint, "fault server", move |socket, cancel| {
            fault_serve(socket, serving, cancel)
        });
        Self { served, state }
    }

    /// Answers every lookup at once with the reference hit.
    pub fn reference(endpoint: &Endpoint) -> Self {
        Self::start(endpoint, |seen| vec![Copy::now(seen.hit())])
    }

    /// Holds every lookup reply from now on, until [`release`](Self::release).
    pub fn hold_all(&self) {
        self.state.hold_all.store(true, Ordering::SeqCst);
    }

    /// Sends every held reply in arrival order and stops holding.
    pub fn release(&self) {
        self.state.hold_all.store(false, Ordering::SeqCst);
        self.state.release.notify_one();
    }

    /// Lookups received so far.
    pub fn lookups(&self) -> u64 {
        self.state.lookups.load(Ordering::SeqCst)
    }

    /// Resets received so far.
    pub fn resets(&self) -> u64 {
        self.state.resets.load(Ordering::SeqCst)
    }

    /// RPC ids of the lookups, in arrival order.
    pub fn received(&self) -> Vec<u64> {
        self.state.received.lock().expect("lock").clone()
    }

    /// RPC ids of the reply copies, in the order they were written.
    pub fn replied(&self) -> Vec<u64> {
        self.state.replied.lock().expect("lock").clone()
    }

    /// Where the server listens.
    pub fn endpoint(&self) -> &Endpoint {
        self.served.endpoint()
    }

    /// Stops serving, closes the socket and removes the ipc file.
    pub async fn stop(self) {
        self.served.stop().await;
    }
}

async fn fault_serve(
    mut socket: tmq::router::Router,
    state: Arc<FaultState>,
    cancel: CancellationToken,
) {
    let (later_tx, mut later_rx) = mpsc::unbounded_channel::<Vec<Bytes>>();
    let mut held: Vec<Vec<Bytes>> = Vec::new();
    let mut timers: Vec<JoinHandle<()>> = Vec::new();
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            () = state.release.notified() => {
                for reply in held.drain(..) {
                    write(&mut socket, &state, reply).await;
                }
            }
            Some(reply) = later_rx.recv() => {
                if state.hold_all.load(Ordering::SeqCst) {
                    held.push(reply);
                } else {
                    write(&mut socket, &state, reply).await;
                }
            }
            message = socket.next() => {
                let Some(Ok(message)) = message else { continue };
                let frames: Vec<Bytes> =
                    message.into_iter().map(|m| Bytes::copy_from_slice(&m)).collect();
                // [identity, envelope..., "", body...]
                let Some(split) = frames.iter().skip(1).position(|f| f.is_empty()).map(|i| i + 1)
                else {
                    continue;
                };
                let (envelope, body) = (&frames[..=split], &frames[split + 1..]);
                let rpc_id = envelope
                    .get(1)
                    .and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok())
                    .map(u64::from_be_bytes);
                match wire::decode_request(body) {
                    ServerRequest::Lookup { format, num_tokens, block_hashes } => {
                        state.lookups.fetch_add(1, Ordering::SeqCst);
                        if let Some(id) = rpc_id {
                            state.received.lock().expect("lock").push(id);
                        }
                        let owner = chain_owner(&block_hashes).unwrap_or(u64::MAX);
                        let occurrence = {
                            let mut seen = state.occurrences.lock().expect("lock");
                            let n = seen.entry(owner).or_insert(0);
                            *n += 1;
                            *n - 1
                        };
                        let seen = SeenLookup { rpc_id, num_tokens, block_hashes, occurrence };
                        for copy in (state.planner)(&seen) {
                            let reply: Vec<Bytes> = envelope
                                .iter()
                                .cloned()
                                .chain([wire::encode_lookup_reply(
                                    format,
                                    &LookupReply { hit_tokens: copy.hit_tokens, boundaries: vec![] },
                                )])
                                .collect();
                            match copy.delay {
                                None => held.push(reply),
                                Some(d) if d.is_zero() => {
                                    if state.hold_all.load(Ordering::SeqCst) {
                                        held.push(reply);
                                    } else {
                                        write(&mut socket, &state, reply).await;
                                    }
                                }
                                Some(d) => {
                                    let tx = later_tx.clone();
                                    timers.retain(|t| !t.is_finished());
                                    timers.push(tokio::spawn(async move {
                                        tokio::time::sleep(d).await;
                                        let _ = tx.send(reply);
                                    }));
                                }
                            }
                        }
                    }
                    ServerRequest::Reset => {
                        state.resets.fetch_add(1, Ordering::SeqCst);
                        let reply = envelope.iter().cloned().chain([wire::encode_reset_reply(true)]).collect();
                        write(&mut socket, &state, reply).await;
                    }
                    _ => {
                        let reply = envelope.iter().cloned().chain([wire::unknown_tag_reply()]).collect();
                        write(&mut socket, &state, reply).await;
                    }
                }
            }
        }
    }
    for timer in timers {
        timer.abort();
    }
}

async fn write(socket: &mut tmq::router::Router, state: &FaultState, frames: Vec<Bytes>) {
    if let Some(id) = frames
        .get(1)
        .and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok())
    {
        state
            .replied
            .lock()
            .expect("lock")
            .push(u64::from_be_bytes(id));
    }
    let message: Vec<tmq::Message> = frames.iter().map(|f| tmq::Message::from(&f[..])).collect();
    let _ = socket.send(message).await;
}

/// Pairs `(i, j)` with `i < j` whose order in `replied` differs from their order in
/// `received` (each id's first reply counts): 0 when replies came in request order.
pub fn inversions(received: &[u64], replied: &[u64]) -> usize {
    let rank: HashMap<u64, usize> = received
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, i))
        .collect();
    let mut first = HashSet::new();
    let order: Vec<usize> = replied
        .iter()
        .filter(|id| first.insert(**id))
        .filter_map(|id| rank.get(id).copied())
        .collect();
    let mut n = 0;
    for (i, a) in order.iter().enumerate() {
        n += order[i + 1..].iter().filter(|b| *b < a).count();
    }
    n
}
