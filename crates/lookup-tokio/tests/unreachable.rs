//! A misconfigured endpoint shows at once (real ZeroMQ sockets): a missing ipc socket
//! file or a refused tcp port fails lookups fast as unavailable, names the endpoint,
//! and never reads as a miss or costs `lookup_timeout_s` per probe; a prefetch ends as
//! a transport failure naming its request, with no probe needed to see it.

use lookup_tokio::Deadline;
use std::time::{Duration, Instant};

use lookup_core::{
    Answer, BlockHashes, Event, LookupOutcome, Probe, Request, RequestId, RpcFailure, Unavailable,
};
use lookup_tokio::{ClientConfig, Endpoint, LookupClient};

fn req(id: u64) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens: 50,
        block_hashes: BlockHashes::from_u64s(&[id, id + 1, id + 2]),
        skip_reading_external_kv: false,
    }
}

const READY_ZERO: Probe = Probe::Ready {
    external_tokens: 0,
    load_async: false,
};

/// Sync probes against `endpoint`: each answers an unavailable 0 long before the
/// 30 s `lookup_timeout_s`. Returns the two probes' latencies.
async fn probes_fail_fast(endpoint: Endpoint) -> (Duration, Duration, u64) {
    let mut config = ClientConfig::zmq(endpoint, 16);
    config.core.lookup_timeout = Duration::from_secs(30);
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let t0 = Instant::now();
    assert_eq!(
        client.probe_until(&req(1), 0, Deadline::Answer).await,
        READY_ZERO
    );
    let first = t0.elapsed();
    assert_eq!(
        client.answer_of(RequestId(1)),
        Some(Answer::Unavailable(Unavailable::Transport))
    );
    let t1 = Instant::now();
    assert_eq!(
        client.probe_until(&req(2), 0, Deadline::Answer).await,
        READY_ZERO
    );
    let second = t1.elapsed();
    assert_eq!(
        client.answer_of(RequestId(2)),
        Some(Answer::Unavailable(Unavailable::Transport))
    );
    let stats = client.stats();
    assert_eq!(stats.core.failed_timed_out, 0);
    assert_eq!(stats.core.failed_transport, 2);
    assert_eq!(stats.core.misses, 0, "a failure never reads as a miss");
    assert!(first < Duration::from_secs(5), "first probe took {first:?}");
    assert!(
        second < Duration::from_secs(5),
        "second probe took {second:?}"
    );
    client.shutdown().await;
    (first, second, stats.endpoint_unreachable)
}

/// Async mode with prefetch: a lookup started at arrival against `endpoint` ends as a
/// transport failure naming its request, without any probe; returns the time from
/// the arrival to that event (the first error the scheduler can see).
async fn first_visible_error(endpoint: Endpoint) -> Duration {
    let mut config = ClientConfig::zmq(endpoint, 16);
    config.core.lookup_timeout = Duration::from_secs(30);
    config.core.lookup_async = true;
    config.core.lookup_prefetch_limit = 4;
    let mut client = LookupClient::connect_lazy(config).expect("connect");
    let t0 = Instant::now();
    client.on_new_request(&req(7));
    let deadline = t0 + Duration::from_secs(30);
    let event = loop {
        if let Some(event) = client.poll_event() {
            break event;
        }
        let now = Instant::now();
        assert!(now < deadline, "no event within the 30 s timeout");
        client.wait_progress(deadline - now).await;
    };
    let took = t0.elapsed();
    match event {
        Event::LookupDone {
            outcome,
            request_ids,
            ..
        } => {
            assert_eq!(outcome, LookupOutcome::Failed(RpcFailure::Transport));
            assert_eq!(request_ids, [RequestId(7)]);
        }
        other => panic!("expected the lookup's end, got {other:?}"),
    }
    client.shutdown().await;
    took
}

#[tokio::test]
async fn a_prefetch_against_a_missing_ipc_file_ends_as_a_transport_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let took = first_visible_error(Endpoint::Ipc(dir.path().join("none.sock"))).await;
    eprintln!("[unreachable ipc] first lookup to its failure event {took:?}");
}

#[tokio::test]
async fn a_prefetch_against_a_refused_tcp_port_ends_as_a_transport_failure() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let took = first_visible_error(Endpoint::Tcp(format!("127.0.0.1:{port}"))).await;
    eprintln!("[refused tcp] first lookup to its failure event {took:?}");
}

#[tokio::test]
async fn a_missing_ipc_socket_file_fails_lookups_fast_as_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("no-server-here.sock");
    let (first, second, unreachable) = probes_fail_fast(Endpoint::Ipc(path)).await;
    assert_eq!(unreachable, 1);
    eprintln!("[unreachable ipc] first sync probe {first:?}, next {second:?}");
}

#[tokio::test]
async fn a_refused_tcp_port_fails_lookups_fast_as_unavailable() {
    // A port that was free a moment ago: nothing listens on it now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let (first, second, unreachable) =
        probes_fail_fast(Endpoint::Tcp(format!("127.0.0.1:{port}"))).await;
    assert_eq!(unreachable, 1);
    eprintln!("[refused tcp] first sync probe {first:?}, next {second:?}");
}
