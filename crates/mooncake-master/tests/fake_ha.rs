//! Following the leader against a scripted fake etcd gateway and fake masters on
//! loopback (the real etcd and masters are exercised in the workspace's e2e tests):
//! moving to a newer leader, never to an older one, failing fast while no leader is
//! elected, keeping the leader while etcd fails, the errors of `connect`, and
//! `RemoveAll` with its pre-0.3.12 fall-back, and the presence cache dropped on a
//! leader change.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use mooncake_master::codec::{self, FunctionId, REQUEST_HEADER_LEN, RequestHeader};
use mooncake_master::{
    BatchConfig, Coalescer, MasterClient, MasterConfig, MasterError, TypeLiteral,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A master that answers `BatchExistKey` and `RemoveAll` from a key set.
struct Master {
    addr: String,
    keys: Mutex<HashSet<String>>,
    /// Refuse the `tenant_id` signatures, as a pre-0.3.12 master would.
    legacy_only: AtomicBool,
    removed_with: Mutex<Vec<codec::RemoveAllArgs>>,
    stop: CancellationToken,
}

impl Master {
    async fn start(keys: &[&str]) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let master = Arc::new(Self {
            addr: listener.local_addr().unwrap().to_string(),
            keys: Mutex::new(keys.iter().map(|k| (*k).to_owned()).collect()),
            legacy_only: AtomicBool::new(false),
            removed_with: Mutex::default(),
            stop: CancellationToken::new(),
        });
        let served = master.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = served.stop.cancelled() => return,
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { return };
                        let master = served.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                () = master.stop.cancelled() => {}
                                () = master.clone().serve(stream) => {}
                            }
                        });
                    }
                }
            }
        });
        master
    }

    /// Closes the listener and every connection, as a killed master's kernel does.
    fn kill(&self) {
        self.stop.cancel();
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        loop {
            let mut head = [0u8; REQUEST_HEADER_LEN];
            if stream.read_exact(&mut head).await.is_err() {
                return;
            }
            let header = RequestHeader::decode(&head).unwrap();
            let mut body = vec![0; header.body_length as usize];
            stream.read_exact(&mut body).await.unwrap();
            let (seq, lit) = (header.seq_num, TypeLiteral::Include);
            let legacy_only = self.legacy_only.load(Ordering::SeqCst);
            let mut out = Vec::new();
            match header.function_id {
                FunctionId::BATCH_EXIST_KEY => match codec::decode_batch_exist_key_args(&body) {
                    Ok(args) if args.tenant_id.is_some() != legacy_only => {
                        let keys = self.keys.lock().unwrap();
                        let answers: Vec<_> =
                            args.keys.iter().map(|k| Ok(keys.contains(k))).collect();
                        codec::encode_batch_exist_key_reply(&mut out, seq, &answers, lit);
                    }
                    _ => codec::encode_error_reply(&mut out, seq, 4, "invalid rpc arg", lit),
                },
                FunctionId::REMOVE_ALL => match codec::decode_remove_all_args(&body) {
                    Ok(args) if args.tenant_id.is_some() != legacy_only => {
                        let removed = {
                            let mut keys = self.keys.lock().unwrap();
                            let n = keys.len() as i64;
                            keys.clear();
                            n
                        };
                        self.removed_with.lock().unwrap().push(args);
                        codec::encode_remove_all_reply(&mut out, seq, removed, lit);
                    }
                    _ => codec::encode_error_reply(&mut out, seq, 4, "invalid rpc arg", lit),
                },
                FunctionId::GET_REPLICA_LIST => codec::encode_error_reply(
                    &mut out,
                    seq,
                    11,
                    "the rpc function not registered",
                    lit,
                ),
                other => panic!("unexpected function {other}"),
            }
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

/// What the fake gateway answers for the view key.
#[derive(Clone)]
enum View {
    Leader(String, i64),
    Absent,
    /// An HTTP 503 with etcd's error JSON.
    Broken,
}

/// etcd's v3 JSON gateway, reduced to `POST /v3/kv/range` of one key.
struct Etcd {
    addr: String,
    view: Mutex<View>,
    reads: AtomicUsize,
}

impl Etcd {
    async fn start(view: View) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let etcd = Arc::new(Self {
            addr: listener.local_addr().unwrap().to_string(),
            view: Mutex::new(view),
            reads: AtomicUsize::new(0),
        });
        let served = etcd.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(served.clone().answer(stream));
            }
        });
        etcd
    }

    fn set(&self, view: View) {
        *self.view.lock().unwrap() = view;
    }

    async fn answer(self: Arc<Self>, mut stream: TcpStream) {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        let body_start = loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "request cut short");
            request.extend_from_slice(&buf[..n]);
            if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
        };
        let head = String::from_utf8_lossy(&request[..body_start]).to_lowercase();
        assert!(head.starts_with("post /v3/kv/range http/1.1\r\n"), "{head}");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        while request.len() < body_start + length {
            let n = stream.read(&mut buf).await.unwrap();
            request.extend_from_slice(&buf[..n]);
        }
        let key = BASE64.encode("mooncake-store/ha/master_view");
        assert_eq!(
            &request[body_start..],
            format!(r#"{{"key":"{key}"}}"#).as_bytes()
        );
        self.reads.fetch_add(1, Ordering::SeqCst);
        let view = self.view.lock().unwrap().clone();
        let (status, json) = match view {
            View::Leader(addr, version) => (
                "200 OK",
                format!(
                    r#"{{"header":{{"revision":"9"}},"kvs":[{{"key":"{key}","create_revision":"{version}","mod_revision":"{version}","version":"1","value":"{}","lease":"7"}}],"count":"1"}}"#,
                    BASE64.encode(addr)
                ),
            ),
            View::Absent => ("200 OK", r#"{"header":{"revision":"9"}}"#.to_owned()),
            View::Broken => (
                "503 Service Unavailable",
                r#"{"error":"etcdserver: request timed out","code":14}"#.to_owned(),
            ),
        };
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json}",
            json.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }
}

fn config() -> MasterConfig {
    let mut config = MasterConfig::default();
    config.cluster_id = Some("ha".to_owned());
    config.call_timeout = Duration::from_millis(500);
    config.backoff_min = Duration::from_millis(10);
    config.backoff_max = Duration::from_millis(50);
    config.view_refresh = Duration::from_millis(300);
    config.view_retry = Duration::from_millis(300);
    config
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

/// Calls until one answers, for at most `within`; returns the answer and every error
/// seen on the way, each of which must be an unavailable master, answered fast.
async fn first_answer(client: &MasterClient, within: Duration) -> (usize, Vec<MasterError>) {
    let deadline = Instant::now() + within;
    let mut errors = Vec::new();
    loop {
        let started = Instant::now();
        match client.leading_run(&keys(4)).await {
            Ok(run) => return (run, errors),
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                assert!(
                    started.elapsed() < Duration::from_millis(600),
                    "{e} took {:?}",
                    started.elapsed()
                );
                errors.push(e);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no answer within {within:?}: {errors:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn follows_a_newer_leader_and_never_an_older_one() {
    let a = Master::start(&["k0", "k1", "k2", "k3"]).await;
    let b = Master::start(&["k0", "k1"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 5)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    assert_eq!(client.addr(), format!("etcd://{}", etcd.addr));
    let leader = client.leader().unwrap();
    assert_eq!(
        (leader.leader.to_string(), leader.version),
        (a.addr.clone(), 5)
    );
    let mut changes = client.subscribe_leader();
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 4);

    // Failover: A dies, etcd names B.
    etcd.set(View::Leader(b.addr.clone(), 7));
    a.kill();
    let (run, errors) = first_answer(&client, Duration::from_secs(3)).await;
    assert_eq!(
        run,
        2,
        "B's answer after {} unavailable calls",
        errors.len()
    );
    assert!(changes.has_changed().unwrap());
    let state = changes.borrow_and_update().clone();
    assert_eq!(state.changes, 1);
    let leader = state.view.unwrap();
    assert_eq!(
        (leader.leader.to_string(), leader.version),
        (b.addr.clone(), 7)
    );
    let stats = client.stats();
    assert_eq!((stats.leader_changes, stats.stale_views), (1, 0));

    // An older view (a lagging etcd member, a restored backup) is never followed,
    // even with its master alive.
    let old = Master::start(&["k0", "k1", "k2", "k3"]).await;
    etcd.set(View::Leader(old.addr.clone(), 6));
    let reads = etcd.reads.load(Ordering::SeqCst);
    while etcd.reads.load(Ordering::SeqCst) < reads + 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 2);
    let stats = client.stats();
    assert_eq!(stats.leader_changes, 1);
    assert!(stats.stale_views >= 2, "{stats:?}");
    assert_eq!(client.leader().unwrap().version, 7);
    assert!(!changes.has_changed().unwrap());
}

/// A key the old leader answered present is not trusted on the new one: the
/// presence cache is dropped at the leader change, with no failed call in between.
#[tokio::test]
async fn a_leader_change_drops_the_presence_cache() {
    let a = Master::start(&["k0", "k1", "k2", "k3"]).await;
    let b = Master::start(&["k0", "k1"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 5)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    let coalescer = Coalescer::new(
        client.clone(),
        batch,
        Duration::from_secs(10),
        Duration::ZERO,
    );
    // Nothing is cached before this connection's lease is known (here: A cannot
    // report it, so the configured one applies once the read failed).
    assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 4);
    assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 4);
    let s = coalescer.stats();
    assert_eq!((s.keys_asked, s.keys_from_cache, s.cache_drops), (8, 4, 0));

    // B is elected while A still runs: the client moves on its next view read.
    etcd.set(View::Leader(b.addr.clone(), 7));
    let deadline = Instant::now() + Duration::from_secs(3);
    while client.leader_changes() == 0 {
        assert!(Instant::now() < deadline, "the client did not follow B");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 2);
    let s = coalescer.stats();
    assert_eq!((s.keys_asked, s.keys_from_cache, s.cache_drops), (12, 4, 1));
    // B's lease is read on its connection first: its answers are cached after that.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 2);
    assert_eq!(coalescer.cached_keys(), 2);
}

#[tokio::test]
async fn no_leader_fails_fast_until_one_is_elected() {
    let a = Master::start(&["k0"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 3)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 1);
    // The leader dies and its lease expires: no key at all.
    etcd.set(View::Absent);
    a.kill();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let started = Instant::now();
        let err = client.leading_run(&keys(4)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_millis(100), "{err}");
        if let MasterError::Unavailable { addr, last_error } = &err {
            if last_error.contains("no leader elected") {
                assert_eq!(addr, &format!("etcd://{}", etcd.addr));
                assert_eq!(
                    last_error,
                    "no leader elected (mooncake-store/ha/master_view absent in etcd)"
                );
                break;
            }
        }
        assert!(err.is_unavailable(), "{err}");
        assert!(Instant::now() < deadline, "still {err}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // With no leader there is nothing to connect to: attempts stop.
    let attempts = client.stats().connect_failures;
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..20 {
        assert!(
            client
                .leading_run(&keys(4))
                .await
                .unwrap_err()
                .is_unavailable()
        );
    }
    assert_eq!(client.stats().connect_failures, attempts);
    // While calls fail, the view is re-read at the retry pace (300 ms here).
    let reads = etcd.reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(etcd.reads.load(Ordering::SeqCst) >= reads + 3);

    let b = Master::start(&["k0", "k1", "k2"]).await;
    etcd.set(View::Leader(b.addr.clone(), 4));
    let (run, _) = first_answer(&client, Duration::from_secs(3)).await;
    assert_eq!(run, 3);
    assert_eq!(client.stats().leader_changes, 1);
}

/// etcd replaced or restored: the live leader's view has a lower version than the
/// dead one's. Once the leader in use is unreachable, the view etcd holds now is
/// followed, whatever its version.
#[tokio::test]
async fn an_older_view_is_followed_once_the_leader_is_unreachable() {
    let a = Master::start(&["k0", "k1", "k2", "k3"]).await;
    let b = Master::start(&["k0"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 9)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 4);
    etcd.set(View::Leader(b.addr.clone(), 2));
    a.kill();
    let (run, _) = first_answer(&client, Duration::from_secs(3)).await;
    assert_eq!(run, 1, "B answers");
    let leader = client.leader().unwrap();
    assert_eq!(
        (leader.leader.to_string(), leader.version),
        (b.addr.clone(), 2)
    );
    assert_eq!(client.stats().leader_changes, 1);
}

/// A leader whose key is gone from etcd is no longer trusted: its live connection is
/// dropped at the next view read (its presence cache with it), calls fail fast as
/// unavailable, and the same leader is used again once etcd names it.
#[tokio::test]
async fn a_leader_whose_key_is_gone_is_dropped() {
    let a = Master::start(&["k0", "k1", "k2", "k3"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 4)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    let mut batch = BatchConfig::default();
    batch.presence.enabled = true;
    let coalescer = Coalescer::new(
        client.clone(),
        batch,
        Duration::from_secs(10),
        Duration::ZERO,
    );
    for _ in 0..3 {
        assert_eq!(coalescer.leading_blocks_flat(keys(4), 1).await.unwrap(), 4);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(coalescer.cached_keys(), 4);
    // A still runs and answers, but etcd no longer names it.
    etcd.set(View::Absent);
    let deadline = Instant::now() + Duration::from_secs(3);
    while client.is_connected() {
        assert!(
            Instant::now() < deadline,
            "still trusting the deposed leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = coalescer.leading_blocks_flat(keys(4), 1).await;
    assert!(
        matches!(&answer, Err(MasterError::Unavailable { last_error, .. }) if last_error.contains("no leader elected")),
        "{answer:?}"
    );
    assert_eq!(coalescer.cached_keys(), 0);
    etcd.set(View::Leader(a.addr.clone(), 4));
    let (run, _) = first_answer(&client, Duration::from_secs(3)).await;
    assert_eq!(run, 4);
    assert_eq!(client.stats().leader_changes, 0);
}

#[tokio::test]
async fn a_failing_etcd_keeps_the_leader() {
    let a = Master::start(&["k0", "k1"]).await;
    let etcd = Etcd::start(View::Leader(a.addr.clone(), 2)).await;
    let client = MasterClient::connect(format!("etcd://{}", etcd.addr), config())
        .await
        .unwrap();
    etcd.set(View::Broken);
    let reads = etcd.reads.load(Ordering::SeqCst);
    while etcd.reads.load(Ordering::SeqCst) < reads + 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 2);
    let stats = client.stats();
    assert!(stats.view_read_failures >= 1, "{stats:?}");
    assert_eq!((stats.leader_changes, stats.view_reads), (0, 1));
    assert_eq!(client.leader().unwrap().leader.to_string(), a.addr);
}

#[tokio::test]
async fn connect_reports_what_is_wrong() {
    let etcd = Etcd::start(View::Absent).await;
    let addr = format!("etcd://{}", etcd.addr);
    match MasterClient::connect(&addr, config()).await.unwrap_err() {
        MasterError::Unavailable {
            addr: a,
            last_error,
        } => {
            assert_eq!(a, addr);
            assert_eq!(
                last_error,
                "no leader elected (mooncake-store/ha/master_view absent in etcd)"
            );
        }
        other => panic!("{other}"),
    }
    etcd.set(View::Broken);
    match MasterClient::connect(&addr, config()).await.unwrap_err() {
        MasterError::Discovery { addr: a, reason } => {
            assert_eq!(a, addr);
            assert_eq!(
                reason,
                format!(
                    "etcd {}: HTTP 503 Service Unavailable: \
                     {{\"error\":\"etcdserver: request timed out\",\"code\":14}}",
                    etcd.addr
                )
            );
        }
        other => panic!("{other}"),
    }
    // A dead endpoint first: the next one answers.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let a = Master::start(&["k0"]).await;
    etcd.set(View::Leader(a.addr.clone(), 1));
    let client = MasterClient::connect(format!("etcd://{dead_addr};{}", etcd.addr), config())
        .await
        .unwrap();
    assert_eq!(client.leading_run(&keys(2)).await.unwrap(), 1);
    // Addresses are checked before anything is tried.
    for bad in ["etcd://", "127.0.0.1", "redis://h:1"] {
        let err = MasterClient::connect(bad, config()).await.unwrap_err();
        assert!(
            matches!(err, MasterError::InvalidAddress { .. }),
            "{bad}: {err}"
        );
    }
}

#[tokio::test]
async fn remove_all_sends_force_and_the_tenant_or_falls_back() {
    let master = Master::start(&["k0", "k1", "k2"]).await;
    let client = MasterClient::connect(&master.addr, config()).await.unwrap();
    assert_eq!(client.leader(), None);
    assert_eq!(client.remove_all(true).await.unwrap(), 3);
    assert_eq!(client.leading_run(&keys(3)).await.unwrap(), 0);
    master.keys.lock().unwrap().insert("k0".to_owned());
    master.legacy_only.store(true, Ordering::SeqCst);
    assert_eq!(client.remove_all(false).await.unwrap(), 1);
    assert_eq!(
        *master.removed_with.lock().unwrap(),
        [
            codec::RemoveAllArgs {
                force: true,
                tenant_id: Some("default".to_owned())
            },
            codec::RemoveAllArgs {
                force: false,
                tenant_id: None
            },
        ]
    );
    assert_eq!(client.stats().signature_fallbacks, 1);
    // An existence call on the same connection goes out in the old form at once, and
    // its keys are counted once.
    let before = client.stats();
    master
        .keys
        .lock()
        .unwrap()
        .extend(["k0", "k1"].map(str::to_owned));
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 2);
    let after = client.stats();
    assert_eq!(after.keys_asked - before.keys_asked, 4);
    assert_eq!(after.requests - before.requests, 1);
    // A new connection starts where the last one settled.
    client.reconnect("test");
    tokio::time::timeout(Duration::from_secs(5), async {
        while !client.is_connected() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 2);
    assert_eq!(client.stats().requests - after.requests, 1);
    // The master upgraded: one refused call, then the tenant form again.
    master.legacy_only.store(false, Ordering::SeqCst);
    let before = client.stats();
    assert_eq!(client.leading_run(&keys(4)).await.unwrap(), 2);
    let after = client.stats();
    assert_eq!(
        (
            after.requests - before.requests,
            after.keys_asked - before.keys_asked,
            after.signature_fallbacks
        ),
        (2, 4, 2)
    );
}
