//! `LookupClient` with the direct transport (`Transport::Direct`) against a scripted
//! fake Mooncake master on loopback: the server's rules computed in the client (key
//! layout, every rank namespace, leading run, full hit, chunks with an early stop), the
//! refused reset, timeouts, malformed replies, pipelining up to `max_in_flight`, and a
//! master that is not up when the client connects. The real master is in
//! `direct_mooncake_master.rs`.

use lookup_tokio::Deadline;
use std::time::Duration;

use lookup_core::{BlockHashes, Event, LookupOutcome, Probe, ResetOutcome, RpcFailure};
use lookup_tests::direct::{Behaviour, FakeMaster, LIMIT, eventually, lookup_outcomes, request};
use lookup_tokio::{
    BatchConfig, ClientConfig, DirectConfig, Error, KeyLayout, LookupClient, RankNamespace,
};

/// Block size in tokens.
const B: u32 = 16;

fn ready(external_tokens: u32) -> Probe {
    Probe::Ready {
        external_tokens,
        load_async: external_tokens > 0,
    }
}

/// Two tensor-parallel namespaces and a cache prefix.
fn layout() -> KeyLayout {
    KeyLayout::new("m")
        .with_cache_prefix(Some("p".to_owned()))
        .with_namespaces(RankNamespace::grid(2, 1))
        .expect("namespaces")
}

/// Sync mode (vLLM's default) over the direct transport, `chunk_keys` keys per call,
/// without the presence cache (these tests count the master's calls).
fn config(master: &str, chunk_keys: usize) -> ClientConfig {
    let mut direct = DirectConfig::parse(master, layout()).expect("master address");
    direct.master_config.chunk_keys = chunk_keys;
    direct.batch = BatchConfig::uncached();
    ClientConfig::new(direct, B)
}

/// The keys of blocks `ids` in both namespaces, block-major.
fn keys(ids: &[u64]) -> Vec<String> {
    layout().chain_keys(&BlockHashes::from_u64s(ids), ids.len())
}

#[tokio::test]
async fn direct_lookups_apply_the_server_rules() {
    let fake = FakeMaster::start(Behaviour::Answer).await;
    let ids = [11, 12, 13, 14, 15];
    let all = keys(&ids);
    assert_eq!(
        all[0],
        "p@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@000000000000000b"
    );
    assert_eq!(
        all[1],
        "p@m@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@000000000000000b"
    );
    // Blocks 0-2 in both namespaces, block 3 in rank 0 only, block 4 in both.
    fake.store(&all[..7]);
    fake.store(&all[8..]);
    // Four keys per call: two whole blocks.
    let mut client = LookupClient::connect_lazy(config(&fake.addr, 4)).expect("connect");

    // 83 tokens: five blocks asked; block 3 misses a rank, so the run is 3 blocks.
    let req = request(1, 5 * B + 3, &ids);
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(3 * B)
    );
    // The second call ended the run: the third (block 4) was never asked.
    assert_eq!(fake.calls(), [4, 4]);
    // The result is kept (rule 5): a local hit of one block loads two more, no call.
    assert_eq!(
        client.probe_until(&req, B, Deadline::Answer).await,
        ready(2 * B)
    );
    assert_eq!(fake.calls().len(), 2);
    client.on_allocated(req.request_id);

    // Full hit: 48 tokens, all three blocks stored (calls of 4 and 2 keys): the last
    // block is recomputed.
    let full = request(2, 3 * B, &ids[..3]);
    assert_eq!(
        client.probe_until(&full, 0, Deadline::Answer).await,
        ready(2 * B)
    );
    // 40 tokens: two full blocks asked (one call), both present.
    let short = request(3, 2 * B + 8, &ids);
    assert_eq!(
        client.probe_until(&short, 0, Deadline::Answer).await,
        ready(2 * B)
    );
    assert_eq!(fake.calls(), [4, 4, 4, 2, 4]);

    // A key answered with an application ErrorCode counts as absent: block 1's rank-1
    // key ends the run after block 0.
    fake.fail(&all[3..4]);
    let failing = request(4, 5 * B + 3, &ids);
    assert_eq!(
        client.probe_until(&failing, 0, Deadline::Answer).await,
        ready(B)
    );

    let outcomes = lookup_outcomes(&mut client);
    assert_eq!(
        outcomes,
        [
            LookupOutcome::Hit { hit_tokens: 48 },
            LookupOutcome::Hit { hit_tokens: 32 },
            LookupOutcome::Hit { hit_tokens: 32 },
            LookupOutcome::Hit { hit_tokens: 16 },
        ]
    );
    let stats = client.stats();
    assert_eq!(stats.rpcs_sent, 4);
    assert_eq!(stats.core.hits, 4);
    let master = stats.master.expect("master counters once connected");
    // The failing lookup's first call holds the error and ends the query.
    assert_eq!(fake.calls(), [4, 4, 4, 2, 4, 4]);
    assert_eq!(master.batch_exist_calls, 6);
    assert_eq!(master.keys_asked, 22);
    assert_eq!(master.connects, 1);
    client.shutdown().await;
}

#[tokio::test]
async fn direct_reset_is_refused_without_a_call() {
    let fake = FakeMaster::start(Behaviour::Answer).await;
    let ids = [21, 22];
    fake.store(&keys(&ids));
    let mut client = LookupClient::connect_lazy(config(&fake.addr, 1024)).expect("connect");
    assert_eq!(
        client.reset_and_wait().await.expect("reset"),
        ResetOutcome::Failed
    );
    assert!(fake.calls().is_empty(), "a reset never reaches the master");
    // Nothing was removed.
    let req = request(1, 3 * B, &ids);
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(2 * B)
    );
    client.shutdown().await;
}

#[tokio::test]
async fn direct_silent_master_times_out_and_fails_open() {
    let fake = FakeMaster::start(Behaviour::Silent).await;
    let mut config = config(&fake.addr, 1024);
    config.core.lookup_timeout = Duration::from_millis(200);
    // The master client's own call timeout is longer: the lookup's timeout decides.
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let req = request(1, 3 * B, &[31, 32, 33]);
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(0)
    );
    let mut ended = Vec::new();
    while let Some(event) = client.poll_event() {
        if let Event::LookupDone {
            outcome, on_wire, ..
        } = event
        {
            // On the wire for the whole timeout.
            ended.push((outcome, on_wire >= Duration::from_millis(200)));
        }
    }
    assert_eq!(ended, [(LookupOutcome::Failed(RpcFailure::TimedOut), true)]);
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 1);
    assert_eq!(stats.rpcs_sent, 1);
    // Three blocks in two namespaces.
    assert_eq!(fake.calls(), [6]);
    client.shutdown().await;
}

/// Rule 17 for the direct transport, counted by the master client per call: after
/// `reopen_after_timeouts` (3) call timeouts in a row the master connection is
/// dropped and opened again, rather than kept until the kernel drops it. Here the
/// lookup timeout (100 ms) fires before the call timeout (200 ms): each call still
/// counts once it times out.
#[tokio::test]
async fn direct_timeouts_in_a_row_replace_the_master_connection() {
    let fake = FakeMaster::start(Behaviour::Silent).await;
    let mut config = config(&fake.addr, 1024);
    config.core.lookup_timeout = Duration::from_millis(100);
    if let lookup_tokio::Transport::Direct(direct) = &mut config.transport {
        direct.master_config.call_timeout = Duration::from_millis(200);
    }
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    for i in 0..3u64 {
        let req = request(i, 3 * B, &[61 + i, 62 + i]);
        assert_eq!(
            client.probe_until(&req, 0, Deadline::Answer).await,
            ready(0)
        );
        let calls = i + 1;
        eventually("the call timed out", || {
            client.stats().master.is_some_and(|m| m.timeouts == calls)
        })
        .await;
    }
    eventually("a second connection", || {
        client.stats().master.is_some_and(|m| m.connects == 2)
    })
    .await;
    let stats = client.stats();
    let master = stats.master.expect("connected");
    assert_eq!(stats.core.failed_timed_out, 3);
    assert_eq!(
        stats.socket_reopens, 0,
        "the dispatcher reopens nothing itself"
    );
    assert_eq!(
        (
            master.timeout_reopens,
            master.reconnects_asked,
            master.connections_lost
        ),
        (1, 1, 1)
    );
    client.shutdown().await;
}

/// The default order: vLLM's lookup timeout (5 s) is above the master client's call
/// timeout (100 ms here; 1 s by default), so every lookup ends by the call timeout.
/// Three of them in a row replace the connection (they were never counted when only
/// the dispatcher's own deadlines counted: 5 lookups, 1 connection, 0 reopens).
#[tokio::test]
async fn direct_default_order_call_timeouts_replace_the_connection() {
    let fake = FakeMaster::start(Behaviour::Silent).await;
    let mut config = config(&fake.addr, 1024);
    assert_eq!(config.core.lookup_timeout, Duration::from_secs(5));
    if let lookup_tokio::Transport::Direct(direct) = &mut config.transport {
        direct.master_config.call_timeout = Duration::from_millis(100);
    }
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    for i in 0..5u64 {
        eventually("connected", || {
            client.stats().master.is_some_and(|m| m.connects > i / 3)
        })
        .await;
        let req = request(i, 3 * B, &[71 + i, 72 + i]);
        assert_eq!(
            client.probe_until(&req, 0, Deadline::Answer).await,
            ready(0)
        );
        assert_eq!(
            lookup_outcomes(&mut client),
            [LookupOutcome::Failed(RpcFailure::TimedOut)]
        );
    }
    let stats = client.stats();
    let master = stats.master.expect("connected");
    assert_eq!(stats.core.failed_timed_out, 5);
    assert_eq!(
        (master.timeouts, master.timeout_reopens, master.connects),
        (5, 1, 2)
    );
    client.shutdown().await;
}

#[tokio::test]
async fn direct_malformed_master_reply_is_a_malformed_lookup() {
    let fake = FakeMaster::start(Behaviour::Garbage).await;
    let mut client = LookupClient::connect_lazy(config(&fake.addr, 1024)).expect("connect");
    let req = request(1, 3 * B, &[41, 42, 43]);
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(0)
    );
    assert_eq!(lookup_outcomes(&mut client), [LookupOutcome::Malformed]);
    assert_eq!(client.stats().core.failed_malformed, 1);
    client.shutdown().await;
}

/// Unbatched, `max_in_flight` 4: four lookups are on the master's connection at once,
/// pipelined. The gated fake answers none until the test has seen all four outstanding.
#[tokio::test]
async fn direct_pipelines_up_to_max_in_flight_lookups() {
    let fake = FakeMaster::start(Behaviour::Gated).await;
    let mut direct = DirectConfig::parse(&fake.addr, layout()).expect("master address");
    direct.batch = BatchConfig::unbatched();
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_async = true;
    config.core.max_in_flight = 4;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let reqs: Vec<_> = (0..5u64)
        .map(|i| request(i, 3 * B, &[100 + i, 200 + i]))
        .collect();
    for (i, req) in reqs.iter().enumerate() {
        fake.store(&keys(&[100 + i as u64]));
        assert_eq!(client.probe(req, 0), Probe::Pending);
    }
    eventually("four calls outstanding at the master", || {
        client.drive();
        fake.outstanding() == 4
    })
    .await;
    // The fifth waits for a free slot: never more than four on the wire.
    assert_eq!(client.stats().rpcs_sent, 4);
    fake.open_gate();
    let mut answers = Vec::new();
    for req in &reqs {
        let answer = loop {
            match client.probe(req, 0) {
                Probe::Pending => client.wait_progress(LIMIT).await,
                answer => break answer,
            }
        };
        answers.push(answer);
    }
    assert_eq!(answers, vec![ready(B); 5]);
    assert_eq!(fake.max_outstanding(), 4);
    assert_eq!(fake.calls(), [4, 4, 4, 4, 4]);
    client.shutdown().await;
}

/// Batched, `max_in_flight` 4: the first lookup goes out alone at once (an idle link
/// adds no wait); the next three, released while its call is unanswered, wait for it
/// and then share one call (12 keys); the fifth, released when a slot frees, goes next.
#[tokio::test]
async fn direct_batches_what_is_released_while_a_call_is_in_flight() {
    let fake = FakeMaster::start(Behaviour::Gated).await;
    let mut direct = DirectConfig::parse(&fake.addr, layout()).expect("master address");
    // Long enough that no lookup gives up waiting while the gate is shut.
    direct.batch.max_wait = Duration::from_secs(10);
    let mut config = ClientConfig::new(direct, B);
    config.core.lookup_async = true;
    config.core.max_in_flight = 4;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let reqs: Vec<_> = (0..5u64)
        .map(|i| request(i, 3 * B, &[100 + i, 200 + i]))
        .collect();
    for (i, _) in reqs.iter().enumerate() {
        fake.store(&keys(&[100 + i as u64]));
    }
    assert_eq!(client.probe(&reqs[0], 0), Probe::Pending);
    eventually("the first lookup's call outstanding", || {
        client.drive();
        fake.outstanding() == 1
    })
    .await;
    for req in &reqs[1..] {
        assert_eq!(client.probe(req, 0), Probe::Pending);
    }
    eventually("four lookups released", || {
        client.drive();
        client.stats().rpcs_sent == 4
    })
    .await;
    // Released while the first call is unanswered: they wait for it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.calls(), [4]);
    fake.open_gate();
    let mut answers = Vec::new();
    for req in &reqs {
        let answer = loop {
            match client.probe(req, 0) {
                Probe::Pending => client.wait_progress(LIMIT).await,
                answer => break answer,
            }
        };
        answers.push(answer);
    }
    assert_eq!(answers, vec![ready(B); 5]);
    assert_eq!(fake.calls(), [4, 12, 4]);
    let batch = client.batch_stats().expect("connected");
    assert_eq!((batch.batches, batch.lookups, batch.keys_asked), (3, 5, 20));
    client.shutdown().await;
}

/// No master at connect: lookups fail open at once (no hang), counted; once a master
/// listens on the address, the client connects and lookups succeed.
#[tokio::test]
async fn direct_master_not_up_fails_fast_then_recovers() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").to_string()
    };
    let mut config = config(&addr, 1024);
    config
        .transport
        .direct_mut()
        .expect("direct")
        .connect_backoff = Duration::from_millis(5);
    let mut client = LookupClient::connect_lazy(config).expect("connect succeeds without a master");
    let ids = [51, 52];
    let req = request(1, 3 * B, &ids);
    assert_eq!(
        client.probe_until(&req, 0, Deadline::Answer).await,
        ready(0)
    );
    assert_eq!(
        lookup_outcomes(&mut client),
        [LookupOutcome::Failed(RpcFailure::Transport)]
    );
    let stats = client.stats();
    assert!(stats.open_errors >= 1, "{stats:?}");
    assert_eq!(stats.master, None);
    client.on_finished(req.request_id);

    let fake = FakeMaster::start_on(&addr, Behaviour::Answer).await;
    fake.store(&keys(&ids));
    let mut id = 2;
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let req = request(id, 3 * B, &ids);
        let answer = client.probe_until(&req, 0, Deadline::Answer).await;
        client.on_finished(req.request_id);
        if answer == ready(2 * B) {
            break;
        }
        assert_eq!(answer, ready(0));
        assert!(
            std::time::Instant::now() < deadline,
            "no recovery within {LIMIT:?}"
        );
        id += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.stats().master.map(|m| m.connects), Some(1));
    client.shutdown().await;
}

#[tokio::test]
async fn direct_bad_settings_are_refused_at_connect() {
    let mut direct = DirectConfig::parse("127.0.0.1:1", layout()).expect("master address");
    direct.master_config.chunk_keys = 0;
    let err = LookupClient::connect_lazy(ClientConfig::new(direct, B)).expect_err("chunk_keys 0");
    assert!(
        matches!(
            err,
            Error::InvalidClientConfig {
                key: "master_config.chunk_keys",
                ..
            }
        ),
        "{err}"
    );
    let err = DirectConfig::parse("", layout()).expect_err("no master");
    assert_eq!(
        err.to_string(),
        "invalid client configuration `master`: invalid Mooncake master address : expected host:port"
    );
}
