//! Fault injection: `close` while lookups are on the wire and queued
//! (`spec/behaviour.md` rule 14; RELIABILITY.md). The I/O task ends, nothing is sent
//! afterwards, later calls answer 0 without blocking, and the client leaves nothing
//! behind: no file, no socket, no file descriptor, no thread. Alone in its binary, so
//! that this process's descriptors and threads are the client's and the server's only.

use std::time::{Duration, Instant};

use lookup_core::{Probe, Request};
use lookup_tests::fault::{
    FaultServer, Harness, TempDir, async_config, open_fds, open_sockets, request, status_field,
};

const LIMIT: Duration = Duration::from_secs(10);

/// Descriptors, socket descriptors and threads of this process.
fn footprint() -> (usize, usize, u64) {
    (open_fds(), open_sockets(), status_field(None, "Threads"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_lookups_in_flight_leaves_nothing() {
    let dir = TempDir::new("close");
    let endpoint = dir.ipc("lookup.sock");
    let server = FaultServer::reference(&endpoint);
    server.hold_all();
    // Both runtime workers and the server's socket exist before the baseline.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = footprint();

    let mut h = Harness::connect(async_config(&endpoint, 32, 4, 5.0));
    let reqs: Vec<Request> = (0..20).map(request).collect();
    for req in &reqs {
        h.arrive(req);
    }
    let deadline = Instant::now() + LIMIT;
    while server.lookups() < 4 {
        assert!(
            Instant::now() < deadline,
            "4 lookups never reached the wire"
        );
        h.wait(Duration::from_millis(2)).await;
    }
    let stats = h.stats();
    assert_eq!((stats.open_rpcs, stats.slots_in_use), (20, 20));
    let open = footprint();
    assert!(
        open.0 > before.0 && open.2 > before.2,
        "the client opened no descriptor or thread: {before:?} -> {open:?}"
    );

    let closing = Instant::now();
    h.close();
    while !h.client.is_actor_finished() {
        assert!(Instant::now() < deadline, "the I/O task never ended");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let task_ended = closing.elapsed();
    assert!(h.client.is_closed());
    assert_eq!(h.stats().slots_in_use, 0);

    // Replies released now have no socket to reach; nothing queued was sent.
    server.release();
    for req in &reqs {
        assert_eq!(
            h.probe(req, 0),
            Probe::Ready {
                external_tokens: 0,
                load_async: false
            }
        );
        h.arrive(req);
        h.allocated(req.request_id);
        h.finished(req.request_id);
    }
    assert_eq!(h.reset(), None);
    h.drain_events();
    assert_eq!(server.lookups(), 4);

    let report = h.check();
    report.print("close_with_lookups_in_flight_leaves_nothing");
    h.print_call_kinds("close_with_lookups_in_flight_leaves_nothing");
    eprintln!(
        "the I/O task ended {task_ended:?} after close; (fds, sockets, threads) before the \
         client {before:?}, with it {open:?}"
    );
    report.times.assert_budget("close");
    drop(h);

    // The server's end of the connection closes once it sees the client gone.
    let mut after = footprint();
    while after != before {
        assert!(
            Instant::now() < deadline,
            "the client left descriptors or threads: {before:?} -> {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        after = footprint();
    }
    assert_eq!(server.lookups(), 4, "a lookup was sent after close");
    // The client never creates a file; the server's is the only one, until it stops.
    assert_eq!(dir.entries(), vec!["lookup.sock".to_owned()]);
    server.stop().await;
    assert_eq!(dir.entries(), Vec::<String>::new());
}
