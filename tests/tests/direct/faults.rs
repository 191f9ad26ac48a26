//! One script of master faults through the three users of the store's answer (the
//! direct transport's `LookupClient`, the router's `StoreCheck`, lookup-server's
//! `MooncakeIndex`), which are adapters over one owner (`mooncake_master::MasterLookup`):
//! the same faults give the same answers, timeouts and reopens on each path
//! (`spec/behaviour.md` rule 17).
//!
//! The faults come from a TCP proxy between the client and the fake master that can
//! stop forwarding: on every connection (a silent master), on the connections open now
//! while new ones pass (a half-open connection: a proxy or NAT that lost its state), or
//! close them all (a restart). Call timeout 200 ms, a reopen after 2 call timeouts in a
//! row, every other setting the default (lookup timeout 5 s, batching and the presence
//! cache on); every lookup asks a chain not asked before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lookup_core::{BlockHashes, LookupOutcome, Probe, RpcFailure};
use lookup_server::{BlockIndex, IndexError, MooncakeIndex};
use lookup_tests::direct::{Behaviour, FakeMaster, eventually, lookup_outcomes, request};
use lookup_tokio::mooncake_master::{MasterConfig, MasterStats};
use lookup_tokio::{
    ClientConfig, Deadline, DirectConfig, KeyLayout, LookupClient, StoreCheck, Unavailable,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Block size in tokens.
const B: u32 = 16;
/// Blocks per chain.
const BLOCKS: usize = 4;
const CALL_TIMEOUT: Duration = Duration::from_millis(200);
const REOPEN_AFTER: u32 = 2;

/// A TCP proxy to `backend` that can stop forwarding (see the module docs).
struct Proxy {
    addr: String,
    next_id: AtomicU64,
    /// Connections with a lower id forward nothing (0: none).
    frozen_below: AtomicU64,
    /// No connection forwards anything.
    all_frozen: AtomicBool,
    /// Cancelled to close every connection open now.
    close: std::sync::Mutex<CancellationToken>,
}

impl Proxy {
    async fn start(backend: String) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = Arc::new(Self {
            addr: listener.local_addr().expect("addr").to_string(),
            next_id: AtomicU64::new(1),
            frozen_below: AtomicU64::new(0),
            all_frozen: AtomicBool::new(false),
            close: std::sync::Mutex::new(CancellationToken::new()),
        });
        let served = Arc::clone(&proxy);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = served.next_id.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&backend).await else {
                    continue;
                };
                let close = served.close.lock().unwrap().clone();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (from, to) in [(cr, sw), (sr, cw)] {
                    let proxy = Arc::clone(&served);
                    let close = close.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            () = close.cancelled() => {}
                            () = proxy.pump(id, from, to) => {}
                        }
                    });
                }
            }
        });
        proxy
    }

    fn frozen(&self, id: u64) -> bool {
        self.all_frozen.load(Ordering::SeqCst) || id < self.frozen_below.load(Ordering::SeqCst)
    }

    async fn hold(&self, id: u64) {
        while self.frozen(id) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn pump(
        &self,
        id: u64,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
    ) {
        let mut buf = vec![0; 64 << 10];
        loop {
            self.hold(id).await;
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Bytes read just before a freeze are held too.
            self.hold(id).await;
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// A silent master: no connection, open or new, forwards anything.
    fn silence(&self) {
        self.all_frozen.store(true, Ordering::SeqCst);
    }

    /// Half-open: the connections open now forward nothing; new ones pass.
    fn half_open(&self) {
        let next = self.next_id.load(Ordering::SeqCst);
        self.frozen_below.store(next, Ordering::SeqCst);
    }

    /// Every connection forwards again (held bytes included).
    fn thaw(&self) {
        self.all_frozen.store(false, Ordering::SeqCst);
        self.frozen_below.store(0, Ordering::SeqCst);
    }

    /// A restart: every connection open now is closed.
    fn restart(&self) {
        let mut close = self.close.lock().unwrap();
        close.cancel();
        *close = CancellationToken::new();
    }
}

/// What one lookup came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Got {
    /// Leading blocks stored.
    Hit(usize),
    /// No answer within the master call timeout.
    TimedOut,
    /// No answer for another reason.
    Unavailable,
}

/// The chain asked `n`-th, and its keys.
fn chain(n: u64) -> BlockHashes {
    BlockHashes::from_u64s(
        &(0..BLOCKS as u64)
            .map(|b| 1000 + n * 10 + b)
            .collect::<Vec<_>>(),
    )
}

fn layout() -> KeyLayout {
    KeyLayout::new("m")
}

fn direct_config(addr: &str) -> DirectConfig {
    let mut direct = DirectConfig::parse(addr, layout()).expect("address");
    direct.master_config.call_timeout = CALL_TIMEOUT;
    direct.reopen_after_timeouts = REOPEN_AFTER;
    direct
}

/// One of the three users.
enum User {
    Direct(Box<LookupClient>),
    Check(StoreCheck),
    Index(Box<MooncakeIndex>),
}

impl User {
    async fn start(kind: usize, addr: &str) -> Self {
        match kind {
            0 => {
                let mut config = ClientConfig::new(direct_config(addr), B);
                config.core.lookup_async = true;
                config.core.max_in_flight = 16;
                Self::Direct(Box::new(
                    LookupClient::connect_lazy(config).expect("connect"),
                ))
            }
            1 => Self::Check(
                StoreCheck::connect_direct(direct_config(addr), B)
                    .await
                    .expect("connect"),
            ),
            _ => {
                let mut config = MasterConfig::default();
                config.call_timeout = CALL_TIMEOUT;
                config.reopen_after_timeouts = REOPEN_AFTER;
                Self::Index(Box::new(
                    MooncakeIndex::connect(addr, config).await.expect("connect"),
                ))
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Direct(_) => "direct transport",
            Self::Check(_) => "StoreCheck",
            Self::Index(_) => "lookup-server's index",
        }
    }

    fn master(&mut self) -> MasterStats {
        match self {
            Self::Direct(client) => client.stats().master.unwrap_or_default(),
            Self::Check(check) => check.master().stats(),
            Self::Index(index) => index.stats().master,
        }
    }

    /// Lookups of chains `ns`, all at once.
    async fn lookups(&mut self, ns: &[u64]) -> Vec<Got> {
        match self {
            Self::Direct(client) => {
                let reqs: Vec<_> = ns
                    .iter()
                    .map(|&n| request(n, BLOCKS as u32 * B + 1, &chain_ids(n)))
                    .collect();
                for req in &reqs {
                    assert_eq!(client.probe(req, 0), Probe::Pending);
                }
                let mut got = Vec::new();
                for req in &reqs {
                    let _ = client.probe_until(req, 0, Deadline::Answer).await;
                    got.extend(lookup_outcomes(client).into_iter().map(|o| match o {
                        LookupOutcome::Hit { hit_tokens } => Got::Hit((hit_tokens / B) as usize),
                        LookupOutcome::Miss => Got::Hit(0),
                        LookupOutcome::Failed(RpcFailure::TimedOut) => Got::TimedOut,
                        _ => Got::Unavailable,
                    }));
                }
                got
            }
            Self::Check(check) => {
                let checks = ns.iter().map(|&n| {
                    let check = check.clone();
                    tokio::spawn(async move { check.check(&chain(n)).await })
                });
                let checks: Vec<_> = checks.collect();
                let mut got = Vec::new();
                for c in checks {
                    got.push(match c.await.expect("check") {
                        Ok(stored) => Got::Hit(stored.hit_blocks),
                        Err(Unavailable::TimedOut) => Got::TimedOut,
                        Err(_) => Got::Unavailable,
                    });
                }
                got
            }
            Self::Index(index) => {
                let keyed: Vec<Vec<String>> = ns
                    .iter()
                    .map(|&n| layout().chain_keys(&chain(n), BLOCKS))
                    .collect();
                let index = &**index;
                let answers = futures::future::join_all(
                    keyed.iter().map(|keys| index.leading_blocks(1, keys)),
                )
                .await;
                answers
                    .into_iter()
                    .map(|a| match a {
                        Ok(run) => Got::Hit(run.blocks),
                        Err(IndexError::Unavailable(why)) if why.contains("got no reply") => {
                            Got::TimedOut
                        }
                        Err(_) => Got::Unavailable,
                    })
                    .collect()
            }
        }
    }

    async fn lookup(&mut self, n: u64) -> Got {
        self.lookups(&[n]).await[0]
    }

    /// Until the master client has made `n` connections and one is up.
    async fn connected(&mut self, n: u64) {
        let what = format!("{}: connection {n} up", self.name());
        eventually(&what, || {
            let m = self.master();
            m.connects >= n && m.connects > m.connections_lost
        })
        .await;
    }

    async fn shutdown(self) {
        if let Self::Direct(client) = self {
            client.shutdown().await;
        }
    }
}

fn chain_ids(n: u64) -> Vec<u64> {
    (0..BLOCKS as u64).map(|b| 1000 + n * 10 + b).collect()
}

/// What one path came to over the script.
#[derive(Debug, PartialEq, Eq)]
struct Tally {
    answers: Vec<Got>,
    timed_out: usize,
    timeout_reopens: u64,
    connects: u64,
}

async fn run_script(kind: usize) -> Tally {
    let fake = FakeMaster::start(Behaviour::Answer).await;
    for n in 0..32 {
        fake.store(&layout().chain_keys(&chain(n), BLOCKS));
    }
    let proxy = Proxy::start(fake.addr.clone()).await;
    let mut user = User::start(kind, &proxy.addr).await;
    user.connected(1).await;
    let mut answers = Vec::new();
    // Warm.
    answers.push(user.lookup(0).await);
    // A silent master: two call timeouts in a row replace the connection; the new one
    // is silent too (one timeout), until the master speaks again.
    proxy.silence();
    answers.push(user.lookup(1).await);
    answers.push(user.lookup(2).await);
    user.connected(2).await;
    answers.push(user.lookup(3).await);
    proxy.thaw();
    answers.push(user.lookup(4).await);
    // A half-open connection: replaced after two timeouts; the new one passes.
    proxy.half_open();
    answers.push(user.lookup(5).await);
    answers.push(user.lookup(6).await);
    user.connected(3).await;
    answers.push(user.lookup(7).await);
    // A stall shared by many lookups: one timeout, no reopen.
    proxy.half_open();
    answers.extend(user.lookups(&(8..16).collect::<Vec<_>>()).await);
    proxy.thaw();
    answers.push(user.lookup(16).await);
    // A restart: the connection closes, the client connects again.
    proxy.restart();
    user.connected(4).await;
    answers.push(user.lookup(17).await);
    let master = user.master();
    user.shutdown().await;
    Tally {
        timed_out: answers.iter().filter(|a| **a == Got::TimedOut).count(),
        answers,
        timeout_reopens: master.timeout_reopens,
        connects: master.connects,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fault_script_gives_the_same_counts_on_the_three_paths() {
    let hit = Got::Hit(BLOCKS);
    let t = Got::TimedOut;
    let mut expected = vec![hit, t, t, t, hit, t, t, hit];
    expected.extend([t; 8]);
    expected.extend([hit, hit]);
    let expected = Tally {
        answers: expected,
        timed_out: 13,
        timeout_reopens: 2,
        connects: 4,
    };
    let mut table = Vec::new();
    for kind in 0..3 {
        let tally = run_script(kind).await;
        table.push((kind, tally));
    }
    for (kind, tally) in &table {
        eprintln!(
            "path {kind}: {} answers, {} hits, {} timed out, {} timeout reopens, {} connects",
            tally.answers.len(),
            tally
                .answers
                .iter()
                .filter(|a| matches!(a, Got::Hit(_)))
                .count(),
            tally.timed_out,
            tally.timeout_reopens,
            tally.connects
        );
    }
    for (kind, tally) in table {
        assert_eq!(tally, expected, "path {kind}");
    }
}
