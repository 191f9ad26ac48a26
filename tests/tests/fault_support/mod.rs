//! Shared pieces of the fault-injection, load and fuzz tests (RELIABILITY.md):
//!
//! - a workload in which every request's chain has its own known hit, so that an
//!   answer applied to the wrong (request, num_tokens, chain) shows;
//! - [`ChainIndex`], a `BlockIndex` that answers that workload from the hashes alone
//!   (no memory per key) and can hang on chosen chains;
//! - [`FaultServer`], an in-test ROUTER that answers the workload with scripted
//!   delays, duplicates, holds and drops;
//! - [`Harness`], a scheduler's view of a `LookupClient` that times every handle call
//!   and checks every answer against the outcome of the RPC that produced it;
//! - [`ChildServer`], a `LookupServer` in a child process (this test binary run again),
//!   to kill it for real or to keep its memory out of the client's;
//! - readers of this process's resident memory, threads and file descriptors.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::answer::{blocks_to_check, hit_tokens};
use lookup_core::wire::{self, LookupReply, ServerRequest};
use lookup_core::{
    BlockHashes, Event, LookupOutcome, Probe, Request, RequestId, ResetOutcome, RpcId,
};
use lookup_server::{BlockIndex, IndexFuture, LookupServer, ServerConfig};
use lookup_tokio::{ClientConfig, ClientStats, Endpoint, KeyLayout, LookupClient};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Block size of every fault and load test (tokens; vLLM's default).
pub const B: u32 = 16;
/// Hashes per chain.
pub const CHAIN_BLOCKS: u32 = 64;
/// Bytes per hash (sha256, as vLLM).
pub const HASH_LEN: usize = 32;
/// A handle call must not take longer than this (the budget).
pub const CALL_BUDGET: Duration = Duration::from_millis(1);
/// Slack allowed on top of `lookup_timeout_s` for a lookup's time on the wire and
/// for the scheduler loop to see its end (a loaded 2-core machine, debug build).
pub const PENDING_SLACK: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------

/// splitmix64.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Hash `j` of request `id`'s chain: `id` (u64 BE) ‖ `j` (u32 BE) ‖ 20 filler bytes.
fn push_hash(out: &mut Vec<u8>, id: u64, j: u32) {
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&j.to_be_bytes());
    let mut f = mix(id ^ (u64::from(j) << 40));
    let mut filler = [0u8; 20];
    for chunk in filler.chunks_mut(8) {
        chunk.copy_from_slice(&f.to_be_bytes()[..chunk.len()]);
        f = mix(f);
    }
    out.extend_from_slice(&filler);
}

/// The chain of request `id`: [`CHAIN_BLOCKS`] hashes of [`HASH_LEN`] bytes (2,048
/// bytes), its own allocation.
pub fn chain(id: u64) -> BlockHashes {
    let mut data = Vec::with_capacity(CHAIN_BLOCKS as usize * HASH_LEN);
    for j in 0..CHAIN_BLOCKS {
        push_hash(&mut data, id, j);
    }
    BlockHashes::new(HASH_LEN as u16, Bytes::from(data)).expect("whole hashes")
}

/// Leading blocks of request `id`'s chain that are stored: 1 to 63, so requests
/// within 63 ids of each other all have different hits.
pub fn present_blocks(id: u64) -> u32 {
    1 + u32::try_from(id % 63).expect("small")
}

/// Prompt length of request `id`: 64 whole blocks and 1 to 15 more tokens, so that
/// every stored block can be loaded (the cap of rule 12 is 1,024).
pub fn num_tokens(id: u64) -> u32 {
    CHAIN_BLOCKS * B + 1 + u32::try_from(id % 15).expect("small")
}

/// The hit the server answers for request `id` (tokens).
pub fn expected_hit(id: u64) -> u32 {
    B * present_blocks(id)
}

/// A hit that is valid for request `id`'s prompt (a block multiple below its
/// `num_tokens`) but is another request's: what a misapplied or forged reply carries.
pub fn poisoned_hit(id: u64) -> u32 {
    expected_hit(id + 1)
}

/// Request `id` of the workload.
pub fn request(id: u64) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens: num_tokens(id),
        block_hashes: chain(id),
        skip_reading_external_kv: false,
    }
}

/// `(request id, block index)` of a workload hash.
pub fn parse_hash(hash: &[u8]) -> Option<(u64, u32)> {
    let id = u64::from_be_bytes(hash.get(..8)?.try_into().ok()?);
    let j = u32::from_be_bytes(hash.get(8..12)?.try_into().ok()?);
    Some((id, j))
}

/// Whether a workload hash is stored.
pub fn hash_present(hash: &[u8]) -> bool {
    hash.len() == HASH_LEN && parse_hash(hash).is_some_and(|(id, j)| j < present_blocks(id))
}

/// The reference server's answer (`spec/wire.md`, "What the server computes") for a
/// lookup of `num_tokens` over `hashes`.
pub fn chain_hit(num_tokens: u32, hashes: &BlockHashes) -> u32 {
    let blocks = blocks_to_check(num_tokens, B, hashes.len());
    let run = hashes
        .iter()
        .take(blocks)
        .take_while(|h| hash_present(h))
        .count();
    hit_tokens(num_tokens, B, run)
}

/// The request id a chain belongs to (from its first hash).
pub fn chain_owner(hashes: &BlockHashes) -> Option<u64> {
    hashes.get(0).and_then(parse_hash).map(|(id, _)| id)
}

fn unhex(hex: &str) -> Option<Vec<u8>> {
    if hex.len() % 2 != 0 {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The key layout of every server here: one namespace, model `m`.
pub fn layout() -> KeyLayout {
    KeyLayout::new("m")
}

// ---------------------------------------------------------------------------------
// ChainIndex
// ---------------------------------------------------------------------------------

/// A `BlockIndex` that answers the workload from the keys alone: a key exists when
/// its hash is one of the stored leading blocks of its chain. Calls about the chains
/// of requests in the hang set wait until [`release`](Self::release).
pub struct ChainIndex {
    calls: AtomicU64,
    hung_calls: AtomicU64,
    hang: Mutex<HashSet<u64>>,
    released: watch::Sender<bool>,
}

impl Default for ChainIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainIndex {
    pub fn new() -> Self {
        Self {
            calls: AtomicU64::new(0),
            hung_calls: AtomicU64::new(0),
            hang: Mutex::new(HashSet::new()),
            released: watch::channel(false).0,
        }
    }

    /// Calls about request `id`'s chain hang until [`release`](Self::release).
    pub fn hang_on(&self, id: u64) {
        self.hang.lock().expect("lock").insert(id);
    }

    /// Lets every hung call (and later ones) answer.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Existence calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls that hit the hang set so far.
    pub fn hung_calls(&self) -> u64 {
        self.hung_calls.load(Ordering::SeqCst)
    }
}

impl BlockIndex for ChainIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hashes: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|k| k.rsplit_once('@').and_then(|(_, hex)| unhex(hex)))
            .collect();
        let hangs = {
            let hang = self.hang.lock().expect("lock");
            !hang.is_empty()
                && hashes
                    .iter()
                    .flatten()
                    .filter_map(|h| parse_hash(h))
                    .any(|(id, _)| hang.contains(&id))
        };
        let mut released = self.released.subscribe();
        Box::pin(async move {
            if hangs {
                self.hung_calls.fetch_add(1, Ordering::SeqCst);
                while !*released.borrow_and_update() {
                    if released.changed().await.is_err() {
                        break;
                    }
                }
            }
            Ok(hashes
                .iter()
                .map(|h| h.as_deref().is_some_and(hash_present))
                .collect())
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// Binds a reference `LookupServer` over the workload at `endpoint`.
pub fn chain_server(endpoint: &Endpoint, index: Arc<ChainIndex>) -> LookupServer {
    LookupServer::bind(endpoint, ServerConfig::new(B, layout()), index).expect("bind the server")
}

// ---------------------------------------------------------------------------------
// FaultServer
// ---------------------------------------------------------------------------------

/// One lookup as the fault server received it.
#[derive(Clone, Debug)]
pub struct SeenLookup {
    /// The client's RPC id (the 8-byte envelope), if there was one.
    pub rpc_id: Option<u64>,
    pub num_tokens: u32,
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
    pub fn now(hit_tokens: u32) -> Self {
        Self {
            delay: Some(Duration::ZERO),
            hit_tokens,
        }
    }

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
    endpoint: Endpoint,
    state: Arc<FaultState>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl FaultServer {
    /// Binds `endpoint` (inside a tokio runtime).
    pub fn start(
        endpoint: &Endpoint,
        planner: impl Fn(&SeenLookup) -> Vec<Copy> + Send + Sync + 'static,
    ) -> Self {
        if let Some(path) = endpoint.ipc_path() {
            let _ = std::fs::remove_file(path);
        }
        let socket = tmq::router(&tmq::Context::new())
            .set_linger(0)
            .bind(&endpoint.url())
            .expect("bind the fault server");
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
        let cancel = CancellationToken::new();
        let task = tokio::spawn(fault_serve(socket, Arc::clone(&state), cancel.clone()));
        Self {
            endpoint: endpoint.clone(),
            state,
            cancel,
            task: Some(task),
        }
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

    pub fn lookups(&self) -> u64 {
        self.state.lookups.load(Ordering::SeqCst)
    }

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

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Stops serving, closes the socket and removes the ipc file.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await.expect("fault server task");
        }
        if let Some(path) = self.endpoint.ipc_path() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.cancel.cancel();
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

// ---------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------

/// How one lookup RPC ended, from its `Event::LookupDone`.
#[derive(Clone, Copy, Debug)]
pub struct Ended {
    pub outcome: LookupOutcome,
    /// Submission to end.
    pub total: Duration,
    /// Send to end; `None` if it never went on the wire.
    pub on_wire: Option<Duration>,
}

impl Ended {
    /// Submission to send: the time it waited behind other lookups.
    pub fn queue_wait(&self) -> Duration {
        self.total.saturating_sub(self.on_wire.unwrap_or_default())
    }
}

/// A probe answered `Ready`.
#[derive(Clone, Copy, Debug)]
pub struct Answered {
    pub request_id: RequestId,
    pub external_tokens: u32,
    /// The lookup RPC whose end made it ready, if the request had one.
    pub rpc: Option<RpcId>,
    /// From the start of the call that created that RPC to the end of this probe.
    pub pending: Option<Duration>,
}

/// Caller-time figures of the handle calls (each measured with `Instant`).
#[derive(Clone, Copy, Debug, Default)]
pub struct CallTimes {
    pub calls: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
    /// The slowest call other than the very first (which pays one-time set-up).
    pub max_after_first: Duration,
    pub over_budget: usize,
}

impl CallTimes {
    pub fn of(samples: &[Duration]) -> Self {
        let nanos: Vec<u32> = samples
            .iter()
            .map(|d| u32::try_from(d.as_nanos()).unwrap_or(u32::MAX))
            .collect();
        Self::of_nanos(&nanos)
    }

    /// From caller times in nanoseconds.
    pub fn of_nanos(samples: &[u32]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let ns = |n: u32| Duration::from_nanos(u64::from(n));
        let at = |q: f64| {
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            ns(sorted[rank - 1])
        };
        let budget = u32::try_from(CALL_BUDGET.as_nanos()).expect("1 ms fits");
        Self {
            calls: samples.len(),
            p50: at(0.5),
            p99: at(0.99),
            p999: at(0.999),
            max: ns(sorted[sorted.len() - 1]),
            max_after_first: ns(samples[1..].iter().copied().max().unwrap_or_default()),
            over_budget: samples.iter().filter(|n| **n > budget).count(),
        }
    }

    /// The assertion of RELIABILITY.md: the 99.9th percentile of caller time is within
    /// [`CALL_BUDGET`] (the maximum is reported, not asserted: one preemption of the
    /// test thread by the OS on a shared 2-core machine would exceed it).
    pub fn assert_budget(&self, what: &str) {
        assert!(
            self.p999 <= CALL_BUDGET,
            "{what}: p99.9 caller time {:?} exceeds {CALL_BUDGET:?}: {self:?}",
            self.p999
        );
    }
}

/// What a fault test reports and asserts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Report {
    pub times: CallTimes,
    pub answers: usize,
    pub exact: usize,
    pub zero: usize,
    pub worst_pending: Duration,
    pub worst_queue_wait: Duration,
    pub worst_on_wire: Duration,
    /// Largest pending time minus its own queue wait: bounded by `lookup_timeout_s`
    /// plus [`PENDING_SLACK`].
    pub worst_beyond_queue: Duration,
}

impl Report {
    pub fn print(&self, name: &str) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "[{name}] calls {} p50 {:.3} ms p99 {:.3} ms p99.9 {:.3} ms max {:.3} ms \
             max-after-first {:.3} ms over-1ms {} | answers {} exact {} zero {} | \
             worst pending {:.1} ms, worst queue wait {:.1} ms, worst on wire {:.1} ms, \
             worst pending beyond queue wait {:.1} ms",
            self.times.calls,
            ms(self.times.p50),
            ms(self.times.p99),
            ms(self.times.p999),
            ms(self.times.max),
            ms(self.times.max_after_first),
            self.times.over_budget,
            self.answers,
            self.exact,
            self.zero,
            ms(self.worst_pending),
            ms(self.worst_queue_wait),
            ms(self.worst_on_wire),
            ms(self.worst_beyond_queue),
        );
    }
}

/// A scheduler driving a `LookupClient`: every handle call is timed; every lookup
/// RPC is tied to the request whose call created it (RPC ids are the core's creation
/// count), so each answer can be checked against its RPC's outcome and its pending
/// time against its queue wait.
pub struct Harness {
    pub client: LookupClient,
    timeout: Duration,
    /// Caller time of every call (ns, saturating).
    times: Vec<u32>,
    /// Per kind of call: (calls, slowest, calls over [`CALL_BUDGET`]).
    kinds: std::collections::BTreeMap<&'static str, (usize, Duration, usize)>,
    rpcs_seen: u64,
    /// With `FAULT_DIAG` set: each call's thread CPU and run-queue wait times are
    /// read from `/proc/thread-self/schedstat`, and the calls over budget kept as
    /// (kind, wall, on CPU, waiting for a CPU), to tell slow code from preemption.
    diag: bool,
    pub slow_calls: Vec<(&'static str, Duration, Duration, Duration)>,
    current: HashMap<RequestId, (RpcId, Instant)>,
    ended: HashMap<RpcId, Ended>,
    answers: Vec<Answered>,
    pub resets: Vec<(RpcId, ResetOutcome)>,
    /// Largest `open_rpcs` seen after a call.
    pub peak_open_rpcs: usize,
}

impl Harness {
    pub fn connect(config: ClientConfig) -> Self {
        let timeout = config.core.timeout();
        let client = LookupClient::connect(config).expect("connect");
        Self {
            client,
            timeout,
            times: Vec::new(),
            kinds: std::collections::BTreeMap::new(),
            rpcs_seen: 0,
            diag: std::env::var_os("FAULT_DIAG").is_some(),
            slow_calls: Vec::new(),
            current: HashMap::new(),
            ended: HashMap::new(),
            answers: Vec::new(),
            resets: Vec::new(),
            peak_open_rpcs: 0,
        }
    }

    /// Runs one handle call, timing it, then notes an RPC it created for `owner`.
    fn timed<T>(
        &mut self,
        kind: &'static str,
        owner: Option<RequestId>,
        call: impl FnOnce(&mut LookupClient) -> T,
    ) -> T {
        let sched = self.diag.then(schedstat);
        let started = Instant::now();
        let out = call(&mut self.client);
        let took = started.elapsed();
        if let Some((cpu, wait)) = sched {
            if took > CALL_BUDGET {
                let (cpu_after, wait_after) = schedstat();
                self.slow_calls.push((
                    kind,
                    took,
                    cpu_after.saturating_sub(cpu),
                    wait_after.saturating_sub(wait),
                ));
            }
        }
        self.times
            .push(u32::try_from(took.as_nanos()).unwrap_or(u32::MAX));
        let entry = self.kinds.entry(kind).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(took);
        entry.2 += usize::from(took > CALL_BUDGET);
        let core = self.client.core();
        let created = core.stats().rpcs_created;
        for id in self.rpcs_seen + 1..=created {
            if let Some(owner) = owner {
                self.current.insert(owner, (RpcId(id), started));
            }
        }
        self.rpcs_seen = created;
        self.peak_open_rpcs = self.peak_open_rpcs.max(core.open_rpcs());
        out
    }

    /// Takes note of RPCs created by calls made on `client` directly, without
    /// tying them to a request (their answers are then checked by value only).
    pub fn skip_untracked_rpcs(&mut self) {
        self.rpcs_seen = self.client.core().stats().rpcs_created;
    }

    /// Forgets the peak of `open_rpcs`.
    pub fn reset_peaks(&mut self) {
        self.peak_open_rpcs = 0;
    }

    pub fn arrive(&mut self, req: &Request) {
        self.timed("on_new_request", Some(req.request_id), |c| {
            c.on_new_request(req)
        });
    }

    pub fn probe(&mut self, req: &Request, num_computed_tokens: u32) -> Probe {
        let answer = self.timed("probe", Some(req.request_id), |c| {
            c.probe(req, num_computed_tokens)
        });
        if let Probe::Ready {
            external_tokens, ..
        } = answer
        {
            let lookup = self.current.remove(&req.request_id);
            self.answers.push(Answered {
                request_id: req.request_id,
                external_tokens,
                rpc: lookup.map(|(rpc, _)| rpc),
                pending: lookup.map(|(_, at)| at.elapsed()),
            });
        }
        answer
    }

    pub fn allocated(&mut self, id: RequestId) {
        self.current.remove(&id);
        self.timed("on_allocated", None, |c| c.on_allocated(id));
    }

    pub fn finished(&mut self, id: RequestId) {
        self.current.remove(&id);
        self.timed("on_finished", None, |c| c.on_finished(id));
    }

    pub fn preempted(&mut self, id: RequestId) {
        self.current.remove(&id);
        self.timed("on_preempted", None, |c| c.on_preempted(id));
    }

    pub fn reset(&mut self) -> Option<RpcId> {
        self.current.clear();
        self.timed("reset", None, LookupClient::reset)
    }

    pub fn close(&mut self) {
        self.current.clear();
        self.timed("close", None, LookupClient::close);
    }

    pub fn drive(&mut self) {
        self.timed("drive", None, LookupClient::drive);
    }

    pub fn stats(&mut self) -> ClientStats {
        self.timed("stats", None, LookupClient::stats)
    }

    /// Takes every queued event (each `poll_event` call timed).
    pub fn drain_events(&mut self) {
        while let Some(event) = self.timed("poll_event", None, LookupClient::poll_event) {
            match event {
                Event::LookupDone {
                    rpc_id,
                    outcome,
                    total,
                    on_wire,
                    ..
                } => {
                    self.ended.insert(
                        rpc_id,
                        Ended {
                            outcome,
                            total,
                            on_wire: Some(on_wire),
                        },
                    );
                }
                Event::ResetDone { rpc_id, outcome } => self.resets.push((rpc_id, outcome)),
            }
        }
    }

    /// Waits (untimed: a wait, not a handle call) for the I/O task's next report.
    pub async fn wait(&mut self, max_wait: Duration) {
        self.client.wait_progress(max_wait).await;
    }

    /// The scheduler loop: requests arrive `window` at a time; each step probes every
    /// waiting request of the window once, allocates and finishes those that are
    /// ready, and sleeps on the client's reports until the next step.
    pub async fn run(&mut self, reqs: &[Request], window: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        for batch in reqs.chunks(window) {
            for req in batch {
                self.arrive(req);
            }
            self.probe_until_ready(batch, deadline).await;
        }
    }

    /// Probes each of `reqs` (already arrived) once a step until all are ready, then
    /// allocates and finishes them.
    pub async fn probe_until_ready(&mut self, reqs: &[Request], deadline: Instant) {
        let mut waiting: Vec<&Request> = reqs.iter().collect();
        while !waiting.is_empty() {
            let mut still = Vec::with_capacity(waiting.len());
            for req in waiting {
                if self.probe(req, 0) == Probe::Pending {
                    still.push(req);
                } else {
                    self.allocated(req.request_id);
                    self.finished(req.request_id);
                }
            }
            waiting = still;
            self.drain_events();
            if !waiting.is_empty() {
                assert!(
                    Instant::now() < deadline,
                    "{} requests never became ready",
                    waiting.len()
                );
                self.wait(Duration::from_millis(2)).await;
            }
        }
    }

    /// Prints, per kind of handle call, the number of calls, the slowest and how many
    /// exceeded [`CALL_BUDGET`].
    pub fn print_call_kinds(&self, name: &str) {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(kind, (n, max, over))| {
                format!(
                    "{kind} {n} max {:.3} ms over {over}",
                    max.as_secs_f64() * 1e3
                )
            })
            .collect();
        eprintln!("[{name}] per call: {}", kinds.join("; "));
    }

    /// With `FAULT_DIAG` set, prints the calls over budget.
    pub fn print_slow_calls(&self, name: &str) {
        if self.diag {
            eprintln!(
                "[{name}] calls over {CALL_BUDGET:?} as (kind, wall, on CPU, waiting for a CPU): {:?}",
                self.slow_calls
            );
        }
    }

    /// Drives the client until no RPC is open, then drains events.
    pub async fn settle(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            self.drain_events();
            if self.client.core().open_rpcs() == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "RPCs never ended");
            self.wait(Duration::from_millis(5)).await;
        }
    }

    /// Every answer is the request's own hit or 0; a hit only from an RPC that ended
    /// with exactly that hit, a 0 only from one that failed; each answered lookup's
    /// pending time minus its queue wait is within `lookup_timeout_s` plus
    /// [`PENDING_SLACK`]. Returns the figures.
    pub fn check(&self) -> Report {
        let bound = self.timeout + PENDING_SLACK;
        let mut report = Report {
            times: CallTimes::of_nanos(&self.times),
            answers: self.answers.len(),
            ..Report::default()
        };
        for a in &self.answers {
            let expected = expected_hit(a.request_id.0);
            let got = a.external_tokens;
            assert!(
                got == expected || got == 0,
                "{}: answered {got} tokens, neither its hit {expected} nor 0",
                a.request_id
            );
            if got == expected {
                report.exact += 1;
            } else {
                report.zero += 1;
            }
            let (Some(rpc), Some(pending)) = (a.rpc, a.pending) else {
                continue;
            };
            let ended = self
                .ended
                .get(&rpc)
                .unwrap_or_else(|| panic!("{}: {rpc} ended without an event", a.request_id));
            match ended.outcome {
                LookupOutcome::Hit { hit_tokens } => {
                    assert_eq!(hit_tokens, expected, "{}: {rpc} hit", a.request_id);
                    assert_eq!(got, expected, "{}: answer of {rpc}", a.request_id);
                }
                LookupOutcome::Miss => {
                    panic!("{}: {rpc} answered 0 hits for a stored chain", a.request_id)
                }
                LookupOutcome::Malformed | LookupOutcome::Failed(_) => {
                    assert_eq!(got, 0, "{}: {rpc} failed but answered", a.request_id);
                }
            }
            let queue = ended.queue_wait();
            let beyond = pending.saturating_sub(queue);
            assert!(
                beyond <= bound,
                "{}: pending {pending:?}, {queue:?} of it queued: {beyond:?} beyond the queue \
                 exceeds the timeout {:?} + slack",
                a.request_id,
                self.timeout
            );
            if let Some(on_wire) = ended.on_wire {
                assert!(
                    on_wire <= bound,
                    "{rpc}: {on_wire:?} on the wire exceeds {bound:?}"
                );
                report.worst_on_wire = report.worst_on_wire.max(on_wire);
            }
            report.worst_pending = report.worst_pending.max(pending);
            report.worst_queue_wait = report.worst_queue_wait.max(queue);
            report.worst_beyond_queue = report.worst_beyond_queue.max(beyond);
        }
        report
    }

    /// The books balance: no slot, RPC or request left, every RPC created ended once
    /// (reply, failure or cancellation), and no event was dropped.
    pub fn assert_books_closed(&mut self) {
        let stats = self.stats();
        let core = &stats.core;
        assert_eq!(stats.slots_in_use, 0, "slots leaked: {stats:?}");
        assert_eq!(stats.open_rpcs, 0, "RPCs left open: {stats:?}");
        assert_eq!(self.client.core().tracked_requests(), 0, "{stats:?}");
        assert_eq!(stats.events_dropped, 0);
        assert_eq!(
            core.hits
                + core.misses
                + core.failed_malformed
                + core.failed_timed_out
                + core.failed_transport
                + core.rpcs_cancelled
                + core.resets,
            core.rpcs_created,
            "{core:?}"
        );
    }
}

/// An async-mode client configuration for the workload: prefetch limit `prefetch`,
/// `max_in_flight` RPCs on the wire, `timeout_s` seconds of `lookup_timeout_s`.
pub fn async_config(
    endpoint: &Endpoint,
    prefetch: u32,
    max_in_flight: u32,
    timeout_s: f64,
) -> ClientConfig {
    let mut config = ClientConfig::new(endpoint.clone(), B);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = prefetch;
    config.core.max_in_flight = max_in_flight;
    config.core.lookup_timeout_s = timeout_s;
    config.event_capacity = 1 << 20;
    config
}

// ---------------------------------------------------------------------------------
// A server in a child process
// ---------------------------------------------------------------------------------

/// Environment variable that turns this test binary's `child_server` test into a
/// lookup server on the URL it holds.
pub const CHILD_ENV: &str = "LOOKUP_FAULT_CHILD_SERVER";
/// Line the child prints once bound.
pub const CHILD_READY: &str = "LOOKUP_FAULT_CHILD_READY";

/// Body of the `#[ignore]`d `child_server` test of a binary that spawns
/// [`ChildServer`]s: without [`CHILD_ENV`] it returns at once (so `--ignored` runs
/// are harmless); with it, it serves the workload ([`ChainIndex`]) until its stdin
/// closes, which also happens when the parent dies.
pub fn child_server_main() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let endpoint: Endpoint = url.parse().expect("child endpoint");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = chain_server(&endpoint, Arc::new(ChainIndex::new()));
        let mut out = std::io::stdout();
        writeln!(out, "{CHILD_READY}").expect("stdout");
        out.flush().expect("stdout");
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await;
        server.shutdown().await;
    });
}

/// A `LookupServer` in a child process: this test binary, run again on its
/// `child_server` test. Killed (SIGKILL) and reaped on drop.
pub struct ChildServer {
    child: Child,
    ready: std::sync::mpsc::Receiver<()>,
}

impl ChildServer {
    /// Starts the child serving `endpoint`; `test` is the name of the binary's test
    /// that calls [`child_server_main`].
    pub fn spawn(test: &str, endpoint: &Endpoint) -> Self {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args([
                test,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, endpoint.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child server");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The test harness prints "test child_server ... " first, without a newline.
                if line.trim_end().ends_with(CHILD_READY) {
                    let _ = tx.send(());
                }
            }
        });
        Self { child, ready }
    }

    /// Waits until the child has bound its endpoint; false after `limit`.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        self.ready.recv_timeout(limit).is_ok()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, then reap: the server gets no chance to close its socket or unlink
    /// its ipc file.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes the child's stdin, so it shuts its server down cleanly, and reaps it
    /// (killed if it has not exited after `limit`).
    pub fn stop(mut self, limit: Duration) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------
// The process
// ---------------------------------------------------------------------------------

/// This thread's time on a CPU and time runnable but waiting for one
/// (`/proc/thread-self/schedstat`).
pub fn schedstat() -> (Duration, Duration) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|f| Duration::from_nanos(f.parse().unwrap_or(0)));
    (
        fields.next().unwrap_or_default(),
        fields.next().unwrap_or_default(),
    )
}

/// A `kB` field of `/proc/<pid>/status` (for example `VmRSS`, `VmHWM`), or `Threads`.
pub fn status_field(pid: Option<u32>, field: &str) -> u64 {
    let path = pid.map_or_else(
        || "/proc/self/status".to_owned(),
        |p| format!("/proc/{p}/status"),
    );
    let status = std::fs::read_to_string(path).expect("read /proc status");
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc status"))
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .count()
}

/// Open socket descriptors of this process.
pub fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// A directory of its own under the temp dir, removed on drop.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lkf-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    pub fn ipc(&self, name: &str) -> Endpoint {
        Endpoint::Ipc(self.0.join(name))
    }

    /// Names of the entries in the directory, sorted.
    pub fn entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.filter_map(Result::ok)
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

/// A TCP endpoint on 127.0.0.1 with a port that was free a moment ago.
pub fn free_tcp() -> Endpoint {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local addr").port();
    Endpoint::Tcp(format!("127.0.0.1:{port}"))
}

/// Serialises the tests of one binary: caller-time figures of tests that share two
/// cores with each other would measure each other. Async, as it is held across awaits.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}
