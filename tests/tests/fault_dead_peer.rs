//! Fault injection: a lookup server that dies (SIGKILL) or stops (SIGSTOP) under a
//! scheduler with vLLM's defaults (`lookup_timeout_s` 5 s, `max_in_flight` 1), over
//! tcp and ipc (RELIABILITY.md, "Dead and hung servers"). The server runs in a child
//! process: this test binary, run again on its `child_server` test.
//!
//! The bounds are asserted by counting events, not by wall time: no lookup of a killed
//! server times out (each would cost 5 s), none is answered while it is dead, the
//! first lookups after the restart are answered exactly; a stopped server costs one
//! timeout, and the lookups behind it fail as unavailable. The wall-time figures of
//! the same scenario are printed by the ignored `measure_*` tests:
//! `cargo test -p lookup-tests --test fault_dead_peer -- --ignored measure --nocapture`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lookup_core::{Event, LookupOutcome, RpcFailure};
use lookup_tests::client::{free_tcp, refused_tcp};
use lookup_tests::fault::{ChildServer, TempDir, async_config, expected_hit, request};
use lookup_tokio::{ClientConfig, Endpoint, Error, LookupClient};

/// Generous real-time limit of a wait: a test that reaches it failed; nothing is
/// asserted from how long a wait took.
const LIMIT: Duration = Duration::from_secs(30);
/// vLLM's default `lookup_timeout_s`.
const VLLM_TIMEOUT_S: f64 = 5.0;

#[test]
#[ignore = "the server process of the tests of this file; serves only when spawned by them"]
fn child_server() {
    lookup_tests::fault::child_server_main();
}

fn spawn(endpoint: &Endpoint) -> ChildServer {
    let server = ChildServer::spawn("child_server", endpoint);
    assert!(server.wait_ready(LIMIT), "the server never came up");
    server
}

/// vLLM's defaults for an async scheduler: 5 s timeout, prefetch 16, one RPC on the
/// wire.
fn vllm_config(endpoint: &Endpoint) -> ClientConfig {
    async_config(endpoint, 16, 1, VLLM_TIMEOUT_S)
}

/// How lookups ended, by request id.
#[derive(Default)]
struct Ends {
    ended: HashMap<u64, LookupOutcome>,
}

impl Ends {
    fn drain(&mut self, client: &mut LookupClient) {
        while let Some(event) = client.poll_event() {
            if let Event::LookupDone {
                outcome,
                request_ids,
                ..
            } = event
            {
                for id in request_ids {
                    self.ended.insert(id.0, outcome);
                }
            }
        }
    }

    /// Waits until every one of `ids` ended.
    async fn wait_all(&mut self, client: &mut LookupClient, ids: std::ops::Range<u64>) {
        let deadline = Instant::now() + LIMIT;
        while !ids.clone().all(|id| self.ended.contains_key(&id)) {
            assert!(Instant::now() < deadline, "lookups {ids:?} never ended");
            client.wait_progress(Duration::from_millis(5)).await;
            self.drain(client);
        }
    }

    fn exact(&self, id: u64) -> bool {
        self.ended.get(&id)
            == Some(&LookupOutcome::Hit {
                hit_tokens: expected_hit(id),
            })
    }

    fn count(&self, ids: std::ops::Range<u64>, outcome: LookupOutcome) -> usize {
        ids.filter(|id| self.ended.get(id) == Some(&outcome))
            .count()
    }
}

/// Announces `ids` (at most the prefetch limit, 16, at once: each is prefetched).
fn start(client: &mut LookupClient, ids: std::ops::Range<u64>) {
    assert!(ids.end - ids.start <= 16, "beyond the prefetch limit");
    for id in ids {
        client.on_new_request(&request(id));
    }
}

const TRANSPORT: LookupOutcome = LookupOutcome::Failed(RpcFailure::Transport);

/// SIGKILL with one lookup on the wire and nine queued (the server is stopped first,
/// so that they are still there at the kill): all ten fail as `Transport` at once,
/// none by its 5 s timeout; lookups started while the server is dead fail as well
/// (none is answered, none times out); after a restart at the same address the
/// lookups are answered exactly again, still without one timeout.
async fn killed_then_restarted(endpoint: Endpoint) {
    let mut server = spawn(&endpoint);
    let mut client = LookupClient::connect(vllm_config(&endpoint))
        .await
        .expect("strict connect to a live server");
    let mut ends = Ends::default();
    start(&mut client, 0..5);
    ends.wait_all(&mut client, 0..5).await;
    assert!((0..5).all(|id| ends.exact(id)), "answered before the kill");

    server.signal("STOP");
    start(&mut client, 5..15);
    // Let the first go on the wire (it cannot be answered).
    let deadline = Instant::now() + LIMIT;
    while client.stats().rpcs_sent < 6 {
        assert!(Instant::now() < deadline, "the lookup never went out");
        client.wait_progress(Duration::from_millis(1)).await;
    }
    server.kill();
    ends.wait_all(&mut client, 5..15).await;
    let outcomes: Vec<_> = (5..15).map(|id| ends.ended[&id]).collect();
    assert_eq!(ends.count(5..15, TRANSPORT), 10, "{outcomes:?}");

    // Dead: every lookup fails, none is answered, none waits for its timeout.
    start(&mut client, 15..31);
    ends.wait_all(&mut client, 15..31).await;
    assert_eq!(ends.count(15..31, TRANSPORT), 16);
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 0);
    assert_eq!(stats.core.hits, 5);
    assert_eq!(stats.endpoint_unreachable, 1);

    // Restarted at the same address (for ipc over the dead server's stale file).
    let server = spawn(&endpoint);
    let deadline = Instant::now() + LIMIT;
    let mut id = 31;
    loop {
        start(&mut client, id..id + 1);
        ends.wait_all(&mut client, id..id + 1).await;
        if ends.exact(id) {
            break;
        }
        assert_eq!(
            ends.ended[&id], TRANSPORT,
            "lookup {id} before the reconnect"
        );
        assert!(
            Instant::now() < deadline,
            "never answered after the restart"
        );
        id += 1;
        client.wait_progress(Duration::from_millis(2)).await;
    }
    start(&mut client, id + 1..id + 17);
    ends.wait_all(&mut client, id + 1..id + 17).await;
    assert!(
        (id + 1..id + 17).all(|i| ends.exact(i)),
        "answered after the restart"
    );
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 0);
    assert_eq!(stats.endpoint_unreachable, 1);
    assert_eq!(stats.late_replies, 0);
    client.shutdown().await;
    server.stop(LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_tcp_server_fails_lookups_at_once_and_is_used_again_on_restart() {
    killed_then_restarted(free_tcp()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_ipc_server_fails_lookups_at_once_and_is_used_again_on_restart() {
    let dir = TempDir::new("dead-ipc");
    killed_then_restarted(dir.ipc("lookup.sock")).await;
}

/// SIGSTOP with ten lookups submitted (one on the wire): the first times out, the
/// liveness check after it finds no ZeroMQ greeting, and the nine behind it fail as
/// `Transport` without their own timeouts; new lookups fail at once; after SIGCONT
/// they are answered exactly again.
async fn stopped_then_continued(endpoint: Endpoint) {
    let server = spawn(&endpoint);
    // A 1 s timeout keeps the test short: the count is what is asserted.
    let mut client = LookupClient::connect(async_config(&endpoint, 16, 1, 1.0))
        .await
        .expect("strict connect to a live server");
    let mut ends = Ends::default();
    start(&mut client, 0..3);
    ends.wait_all(&mut client, 0..3).await;
    assert!((0..3).all(|id| ends.exact(id)));

    server.signal("STOP");
    start(&mut client, 3..13);
    ends.wait_all(&mut client, 3..13).await;
    let timed_out = LookupOutcome::Failed(RpcFailure::TimedOut);
    let outcomes: Vec<_> = (3..13).map(|id| ends.ended[&id]).collect();
    assert_eq!(ends.count(3..13, timed_out), 1, "{outcomes:?}");
    assert_eq!(ends.count(3..13, TRANSPORT), 9, "{outcomes:?}");
    start(&mut client, 13..23);
    ends.wait_all(&mut client, 13..23).await;
    assert_eq!(ends.count(13..23, TRANSPORT), 10);
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.endpoint_unreachable, 1);

    server.signal("CONT");
    let deadline = Instant::now() + LIMIT;
    let mut id = 23;
    loop {
        start(&mut client, id..id + 1);
        ends.wait_all(&mut client, id..id + 1).await;
        if ends.exact(id) {
            break;
        }
        assert_eq!(ends.ended[&id], TRANSPORT, "lookup {id} before the check");
        assert!(Instant::now() < deadline, "never answered after SIGCONT");
        id += 1;
        client.wait_progress(Duration::from_millis(20)).await;
    }
    assert_eq!(client.stats().core.failed_timed_out, 1);
    client.shutdown().await;
    server.stop(LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_tcp_server_costs_one_timeout_then_the_queue_fails_fast() {
    stopped_then_continued(free_tcp()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_ipc_server_costs_one_timeout_then_the_queue_fails_fast() {
    let dir = TempDir::new("stop-ipc");
    stopped_then_continued(dir.ipc("lookup.sock")).await;
}

/// The strict `connect` fails with the reason, naming the cause, for a missing ipc
/// socket file, a stale one (a killed server's), a refused tcp port and a stopped
/// server; `connect_lazy` returns a client for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_connect_names_why_the_server_does_not_answer() {
    let why = |result: Result<LookupClient, Error>| match result {
        Err(Error::Unreachable { why, .. }) => why,
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("connected to nothing"),
    };
    let dir = TempDir::new("strict");
    let missing = dir.ipc("missing.sock");
    let path = dir.path().join("missing.sock");
    assert_eq!(
        why(LookupClient::connect(vllm_config(&missing)).await),
        format!("no socket file at {}", path.display())
    );

    let stale = dir.ipc("stale.sock");
    let mut killed = spawn(&stale);
    killed.kill();
    assert_eq!(
        why(LookupClient::connect(vllm_config(&stale)).await),
        format!(
            "nothing listens on {} (a stale socket file: the server is dead)",
            dir.path().join("stale.sock").display()
        )
    );

    let (refused, _held) = refused_tcp();
    let Endpoint::Tcp(addr) = &refused else {
        unreachable!()
    };
    assert_eq!(
        why(LookupClient::connect(vllm_config(&refused)).await),
        format!("connection refused at tcp port {addr} (nothing listens: the server is dead)")
    );

    let stopped_at = free_tcp();
    let stopped = spawn(&stopped_at);
    stopped.signal("STOP");
    let Endpoint::Tcp(addr) = &stopped_at else {
        unreachable!()
    };
    assert_eq!(
        why(LookupClient::connect(vllm_config(&stopped_at)).await),
        format!(
            "the server at tcp://{addr} accepted a connection but sent no ZeroMQ greeting \
             within 500ms (the process is stopped or hung)"
        )
    );
    stopped.signal("CONT");
    let client = LookupClient::connect(vllm_config(&stopped_at))
        .await
        .expect("connect once it runs again");
    client.shutdown().await;

    for endpoint in [missing, stale, refused] {
        let client = LookupClient::connect_lazy(vllm_config(&endpoint)).expect("lazy");
        client.shutdown().await;
    }
    stopped.stop(LIMIT);
}

/// Wall-time figures of [`killed_then_restarted`]'s scenario with vLLM's defaults, for
/// the record: a lookup started every 10 ms, the server SIGKILLed, restarted 1 s
/// later at the same address. Prints: the first `Unavailable` after the kill, the
/// longest lookup started after the kill, the first exact hit after the restart.
async fn measure(endpoint: Endpoint, transport: &str) {
    let mut server = spawn(&endpoint);
    let mut client = LookupClient::connect(vllm_config(&endpoint))
        .await
        .expect("connect");
    let mut started: HashMap<u64, Instant> = HashMap::new();
    let mut ends = Ends::default();
    let mut ended_at: HashMap<u64, Instant> = HashMap::new();
    let t0 = Instant::now();
    let (kill_at, restart_at, stop_at) = (
        Duration::from_millis(1000),
        Duration::from_millis(2000),
        Duration::from_millis(3500),
    );
    let (mut killed, mut restarted) = (None, None);
    let mut id = 0_u64;
    while t0.elapsed() < stop_at {
        if killed.is_none() && t0.elapsed() >= kill_at {
            server.kill();
            killed = Some(Instant::now());
        }
        if restarted.is_none() && t0.elapsed() >= restart_at {
            server = ChildServer::spawn("child_server", &endpoint);
            restarted = Some(Instant::now());
        }
        started.insert(id, Instant::now());
        client.on_new_request(&request(id));
        id += 1;
        let next = Instant::now() + Duration::from_millis(10);
        while Instant::now() < next {
            client.wait_progress(Duration::from_millis(1)).await;
            let before: Vec<u64> = ends.ended.keys().copied().collect();
            ends.drain(&mut client);
            let now = Instant::now();
            for k in ends.ended.keys() {
                if !before.contains(k) {
                    ended_at.entry(*k).or_insert(now);
                }
            }
        }
    }
    let (killed, restarted) = (killed.expect("killed"), restarted.expect("restarted"));
    let first_unavailable = ends
        .ended
        .iter()
        .filter(|(_, o)| matches!(o, LookupOutcome::Failed(_)))
        .filter_map(|(k, _)| ended_at.get(k))
        .filter(|&&at| at >= killed)
        .min()
        .map(|at| at.duration_since(killed));
    let worst_after_kill = started
        .iter()
        .filter(|(_, at)| **at >= killed)
        .filter_map(|(k, at)| ended_at.get(k).map(|end| end.duration_since(*at)))
        .max();
    let first_hit = ends
        .ended
        .keys()
        .filter(|k| ends.exact(**k))
        .filter_map(|k| ended_at.get(k))
        .filter(|&&at| at >= restarted)
        .min()
        .map(|at| at.duration_since(restarted));
    let stats = client.stats();
    println!(
        "{transport}: {id} lookups; first Unavailable {first_unavailable:?} after the kill; \
         longest lookup started after the kill {worst_after_kill:?}; first exact hit \
         {first_hit:?} after the restart; timed out {}, transport failures {}, hits {}",
        stats.core.failed_timed_out, stats.core.failed_transport, stats.core.hits
    );
    client.shutdown().await;
    server.stop(LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints wall-time figures; run with --ignored measure --nocapture"]
async fn measure_kill_restart_tcp() {
    measure(free_tcp(), "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints wall-time figures; run with --ignored measure --nocapture"]
async fn measure_kill_restart_ipc() {
    let dir = TempDir::new("measure-ipc");
    measure(dir.ipc("lookup.sock"), "ipc").await;
}
