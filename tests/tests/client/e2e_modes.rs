//! The client's modes and limits over real sockets: sync-mode waits in both formats
//! and from plain threads, configuration errors, `max_in_flight` 4 answered out of
//! order, close with lookups in flight, and ineligible requests.

use super::*;
use lookup_tokio::Deadline;

/// Sync mode (rule 10) with `probe_wait`, in both formats, over tcp: never `Pending`;
/// `msgpack-hex` sends the token count floored to the block size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_probe_wait_both_formats() {
    for format in [Format::TaggedBlob, Format::MsgpackHex] {
        let endpoint = free_tcp();
        let server = FakeServer::reference(&endpoint, B, &[1, 2]);
        let mut config = ClientConfig::zmq(endpoint.clone(), B);
        config.transport.zmq_mut().expect("zmq").format = format;
        let mut client = LookupClient::connect_lazy(config).expect("connect");
        let req = request(1, 60, &[1, 2, 3]);
        assert_eq!(
            client.probe_until(&req, 0, Deadline::Answer).await,
            ready(32),
            "{format}"
        );
        assert_eq!(
            client.probe_until(&req, 16, Deadline::Answer).await,
            ready(16),
            "{format}"
        );
        let missing = request(2, 60, &[9, 2, 3]);
        assert_eq!(
            client.probe_until(&missing, 0, Deadline::Answer).await,
            ready(0),
            "{format}"
        );
        let floored = match format {
            Format::TaggedBlob => 60,
            Format::MsgpackHex => 48,
        };
        assert_eq!(
            server.seen()[0],
            Seen::Lookup {
                format,
                num_tokens: floored,
                block_hashes: BlockHashes::from_u64s(&[1, 2, 3])
            }
        );
        let stats = client.stats();
        assert_eq!(server.lookups(), 2);
        assert_eq!(
            (
                stats.core.probes_pending,
                stats.core.hits,
                stats.core.misses
            ),
            (2, 1, 1)
        );
        client.close();
        server.stop().await;
    }
}

/// `msgpack-hex` has no reset message: a reset is never sent and reports timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msgpack_reset_is_not_sent() {
    let dir = TempDir::new("mpreset");
    let endpoint = dir.ipc("lookup.sock");
    let server = FakeServer::reference(&endpoint, B, &[]);
    let mut config = ClientConfig::zmq(endpoint.clone(), B);
    config.transport.zmq_mut().expect("zmq").format = Format::MsgpackHex;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    assert_eq!(
        client.reset_and_wait().await.expect("open"),
        ResetOutcome::TimedOut
    );
    assert_eq!(server.resets(), 0);
    assert_eq!(server.seen(), vec![]);
    client.close();
    server.stop().await;
}

/// Sync mode with a silent server: `probe_wait` is bounded by the timeout and answers
/// 0 hits (rules 10-11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_probe_wait_is_bounded() {
    let dir = TempDir::new("syncto");
    let endpoint = dir.ipc("lookup.sock");
    let server = FakeServer::silent(&endpoint);
    let mut config = ClientConfig::zmq(endpoint.clone(), B);
    config.core.lookup_timeout = Duration::from_millis(200);
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let req = request(1, 32, &[1, 2]);
    let answer = tokio::time::timeout(LIMIT, client.probe_until(&req, 0, Deadline::Answer))
        .await
        .expect("bounded");
    assert_eq!(answer, ready(0));
    let stats = client.stats();
    assert_eq!((stats.core.failed_timed_out, stats.waits_gave_up), (1, 0));
    client.close();
    server.stop().await;
}

/// `probe_blocking` from a plain thread, with the actor on a runtime given by handle.
#[test]
fn probe_blocking_from_a_plain_thread() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = TempDir::new("blocking");
    let endpoint = dir.ipc("lookup.sock");
    let server = runtime.block_on(async { FakeServer::reference(&endpoint, B, &[1, 2]) });
    let mut client = LookupClient::connect_lazy_with_handle(
        ClientConfig::zmq(endpoint.clone(), B),
        runtime.handle(),
    )
    .expect("connect");
    let answers = std::thread::spawn(move || {
        let a = client
            .probe_until_blocking(&request(1, 48, &[1, 2, 3]), 0, Deadline::Answer)
            .expect("plain thread");
        let b = client
            .probe_until_blocking(&request(2, 48, &[3, 2, 1]), 0, Deadline::Answer)
            .expect("plain thread");
        client.close();
        (a, b)
    })
    .join()
    .expect("thread");
    assert_eq!(answers, (ready(32), ready(0)));
    assert_eq!(server.lookups(), 2);
    runtime.block_on(server.stop());
}

/// `probe_blocking` inside a multi-thread runtime task works (block_in_place); on a
/// current-thread runtime it refuses instead of stalling the actor.
#[test]
fn probe_blocking_inside_runtimes() {
    let dir = TempDir::new("blockrt");
    let endpoint = dir.ipc("lookup.sock");
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    multi.block_on(async {
        let server = FakeServer::reference(&endpoint, B, &[1, 2]);
        let mut client =
            LookupClient::connect_lazy(ClientConfig::zmq(endpoint.clone(), B)).expect("connect");
        let answer = tokio::spawn(async move {
            let answer =
                client.probe_until_blocking(&request(1, 48, &[1, 2, 3]), 0, Deadline::Answer);
            client.close();
            answer
        })
        .await
        .expect("task");
        assert_eq!(answer.expect("multi-thread runtime"), ready(32));
        server.stop().await;
    });
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    single.block_on(async {
        let mut client =
            LookupClient::connect_lazy(ClientConfig::zmq(endpoint.clone(), B)).expect("connect");
        let refused = client.probe_until_blocking(&request(1, 48, &[1, 2, 3]), 0, Deadline::Answer);
        assert!(
            matches!(refused, Err(Error::BlockingInRuntime)),
            "{refused:?}"
        );
        assert_eq!(client.stats().core.rpcs_created, 0);
        client.close();
    });
}

/// `connect` outside a runtime is a clear error, not a panic.
#[test]
fn connect_outside_a_runtime_is_an_error() {
    let endpoint: Endpoint = "tcp://127.0.0.1:1".parse().expect("endpoint");
    let err = LookupClient::connect_lazy(ClientConfig::zmq(endpoint, B)).expect_err("no runtime");
    assert!(matches!(err, Error::NoRuntime), "{err:?}");
}

/// An invalid configuration is refused at connect.
#[tokio::test]
async fn invalid_config_is_refused() {
    let endpoint: Endpoint = "tcp://127.0.0.1:1".parse().expect("endpoint");
    let err = LookupClient::connect_lazy(ClientConfig::zmq(endpoint, 0)).expect_err("block size 0");
    assert!(matches!(err, Error::Core(_)), "{err:?}");
}

/// `max_in_flight` 4: four lookups on the wire at once, answered in reverse order,
/// each matched to its own request by RPC id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_four_out_of_order() {
    let dir = TempDir::new("mif");
    let endpoint = dir.ipc("lookup.sock");
    let server = FakeServer::reference(&endpoint, B, &[1, 2, 3, 4]);
    server.pause();
    let mut client = LookupClient::connect_lazy(async_config(&endpoint, 0, 4)).expect("connect");
    // Request i has its first i blocks present: hit 16 * i (capped below 80 tokens).
    // Hashes are chained in vLLM, so the last one tells chains apart: keep it unique.
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| {
            let ids: Vec<u64> = (1..=5)
                .map(|b| if b <= i { b } else { 1000 * (i + 1) + b })
                .collect();
            request(i, 80, &ids)
        })
        .collect();
    for req in &reqs {
        assert_eq!(client.probe(req, 0), Probe::Pending);
    }
    until(LIMIT, "four on the wire", || server.lookups() == 4).await;
    client.drive();
    assert_eq!(client.stats().rpcs_sent, 4);
    server.release(true);
    for (i, req) in reqs.iter().enumerate() {
        let hit = 16 * u32::try_from(i).expect("small").min(4);
        assert_eq!(
            probe_ready(&mut client, req, 0).await,
            ready(hit),
            "request {i}"
        );
    }
    assert_eq!(server.lookups(), 6);
    client.close();
    server.stop().await;
}

/// Rule 14: close with lookups on the wire: the actor ends, later calls never panic
/// and answer 0, nothing more is sent, and the client leaves no file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_lookups_in_flight() {
    let dir = TempDir::new("close");
    let endpoint = dir.ipc("lookup.sock");
    let server = FakeServer::reference(&endpoint, B, &[1, 2]);
    server.pause();
    let mut client = LookupClient::connect_lazy(async_config(&endpoint, 8, 2)).expect("connect");
    let reqs: Vec<Request> = (0..5).map(|i| request(i, 48, &[1, 2, 10 + i])).collect();
    for req in &reqs {
        client.on_new_request(req);
    }
    until(LIMIT, "two on the wire", || server.lookups() == 2).await;
    client.close();
    until(LIMIT, "actor ended", || client.is_actor_finished()).await;
    assert!(client.is_closed());
    // The actor is gone, so nothing can be sent any more.
    assert_eq!(server.lookups(), 2);
    for req in &reqs {
        assert_eq!(client.probe(req, 0), ready(0));
        client.on_new_request(req);
        client.on_allocated(req.request_id);
        client.on_finished(req.request_id);
    }
    assert_eq!(client.reset(), None);
    assert!(matches!(client.reset_and_wait().await, Err(Error::Closed)));
    assert_eq!(
        client.probe_until(&reqs[0], 0, Deadline::Answer).await,
        ready(0)
    );
    assert_eq!(client.poll_event(), None);
    server.release(false);
    assert_eq!(dir.entries(), vec!["lookup.sock".to_owned()]);
    server.stop().await;
    assert_eq!(dir.entries(), Vec::<String>::new());
    assert_eq!(client.stats().slots_in_use, 0);
}

/// Requests that skip external KV, are shorter than a block or have no hashes are
/// answered without any RPC, and ids never collide with live ones (scenario 6 over
/// the wire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ineligible_requests_send_nothing() {
    let dir = TempDir::new("s6");
    let endpoint = dir.ipc("lookup.sock");
    let server = FakeServer::reference(&endpoint, B, &[1]);
    let mut client = LookupClient::connect_lazy(async_config(&endpoint, 8, 1)).expect("connect");
    let mut skip = request(1, 32, &[1, 2]);
    skip.skip_reading_external_kv = true;
    let short = request(2, 15, &[]);
    let no_hashes = request(3, 32, &[]);
    for req in [&skip, &short, &no_hashes] {
        client.on_new_request(req);
        assert_eq!(client.probe(req, 0), ready(0));
    }
    let stats = client.stats();
    assert_eq!(stats.core.prefetch_ineligible, 3);
    assert_eq!(stats.core.rpcs_created, 0);
    assert_eq!(server.lookups(), 0);
    client.close();
    server.stop().await;
}
